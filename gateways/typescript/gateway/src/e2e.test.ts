//! End to end, all real: `capgate serve`, the built gateway (`dist/cli.js`)
//! over Streamable HTTP and stdio, upstream MCP servers on the SDK (stdio and
//! HTTP), a loopback OpenID provider, and the official SDK client speaking
//! 2026-07-28 and the 2025 handshake. The shared scenario suite
//! (gateways/scenarios/) covers the full matrix; this is enough to test the
//! TypeScript side on its own.

import { strict as assert } from "node:assert";
import type { ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";
import { Client, ProtocolError, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { createCapgateClient } from "@capgate/client";
import { startCapgate, type Capgate } from "@capgate/client/testing";
import { startProvider, type Provider } from "./testing/oidc.js";
import { closedPort, startAndWait, stop } from "./testing/processes.js";

const CLI = fileURLToPath(new URL("./cli.js", import.meta.url));
const UPSTREAM = fileURLToPath(new URL("./testing/upstream.js", import.meta.url));
const SECRET_ENV = "e2e-secret-env-4f1d";
const SECRET_WEB = "e2e-secret-web-9a2c";
const SECRET_FILE = "e2e-secret-file-77b0";
const CALLER_KEY = "e2e-caller-key-0c3e-long-enough";
const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

const STDIO_UPSTREAMS = ["probe", "probe-file", "probe-gcp", "probe-metered", "probe-finance", "probe-disabled"];

function policyYaml(discovery: string, webUrl: string, downUrl: string, secretFile: string, extraGrants = ""): string {
  const stdio = `{ kind: mcp-stdio, command: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(UPSTREAM)}] }`;
  return `version: 2
capabilities:
  - { id: probe.env }
  - { id: probe.refund }
  - { id: probe.file }
  - { id: probe.gcp }
  - { id: probe.metered }
  - { id: probe.finance }
  - { id: probe.disabled }
  - { id: web.read }
upstreams:
  - id: probe
    transport: ${stdio}
    tools:
      - { name: whoami, capability: probe.env }
      - { name: pid, capability: probe.env }
      - { name: echo, capability: probe.env }
      - { name: refund, capability: probe.refund }
      - { name: fail, capability: probe.env }
${STDIO_UPSTREAMS.slice(1)
  .map((id) => `  - id: ${id}\n    transport: ${stdio}\n    tools:\n      - { name: whoami, capability: ${id.replace("probe-", "probe.")} }\n`)
  .join("")}  - id: web
    transport: { kind: mcp-http, url: ${JSON.stringify(webUrl)} }
    tools:
      - { name: whoami, capability: web.read }
  - id: down
    transport: { kind: mcp-http, url: ${JSON.stringify(downUrl)} }
    tools:
      - { name: whoami, capability: web.read }
accounts:
  - { id: acct-env, secret: { ref: "env://SECRET_ENV" } }
  - { id: acct-file, secret: { ref: "file://${secretFile}" } }
  - { id: acct-gcp, secret: { ref: "gcp-secrets://projects/p/secrets/s/versions/1" } }
  - { id: acct-disabled, disabled: true, secret: { ref: "env://SECRET_ENV" } }
  - { id: acct-web, secret: { ref: "env://SECRET_WEB" } }
principals:
  issuers:
    - id: idp
      kind: oidc
      discovery: ${JSON.stringify(discovery)}
      attributes: { dept: claim:department }
    - id: keys
      kind: static-key
      subject: batch-runner
      secret: { ref: "env://E2E_CALLER_KEY" }
grants:
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.env], using: acct-env }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.file], using: acct-file }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.gcp], using: acct-gcp }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.metered], using: acct-env, limits: { calls: 1, per: 1h } }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.disabled], using: acct-disabled }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [web.read], using: acct-web }
  - { to: { issuer: idp, attributes: { dept: finance } }, capabilities: [probe.finance], using: acct-env }
  - { to: { issuer: keys }, capabilities: [probe.env], using: acct-env }
  - to: { issuer: idp, attributes: { dept: support } }
    capabilities: [probe.refund]
    using: acct-env
    when:
      - { argument: amount, at_most: 100 }
      - { argument: currency, in: [EUR, USD] }
${extraGrants}`;
}

function catalogYaml(): string {
  const tools = [
    ...["whoami", "pid", "fail"].map((name) => ({ upstream: "probe", name })),
    {
      upstream: "probe",
      name: "echo",
      description: "Echo the text",
      schema: "{ type: object, properties: { text: { type: string } }, required: [text] }",
    },
    {
      upstream: "probe",
      name: "refund",
      description: "Refund an amount",
      schema: "{ type: object, properties: { amount: { type: number }, currency: { type: string } } }",
    },
    ...STDIO_UPSTREAMS.slice(1).map((upstream) => ({ upstream, name: "whoami" })),
    { upstream: "web", name: "whoami" },
    { upstream: "down", name: "whoami" },
  ];
  return `version: 1\ntools:\n${tools
    .map(
      (t) =>
        `  - upstream: ${t.upstream}\n    name: ${t.name}\n` +
        ("description" in t ? `    description: ${t.description}\n` : "") +
        ("schema" in t ? `    inputSchema: ${t.schema}\n` : ""),
    )
    .join("")}`;
}

function text(result: unknown): string {
  const content = (result as { content?: Array<{ type: string; text?: string }> }).content ?? [];
  return content.map((c) => c.text ?? "").join("");
}

async function rejection(call: Promise<unknown>): Promise<ProtocolError> {
  try {
    await call;
  } catch (error) {
    assert.ok(error instanceof ProtocolError, `expected a JSON-RPC error, got ${String(error)}`);
    return error;
  }
  assert.fail("the call was expected to be refused");
}

type Data = Record<string, unknown>;

describe("gateway end to end", () => {
  let provider: Provider;
  let capgate: Capgate;
  let web: ChildProcess | undefined;
  let gateway: ChildProcess | undefined;
  let mcpUrl: string;
  let policyArgs: [string, string, string, string];
  const gatewayLogs: string[] = [];
  const clients: Client[] = [];
  let ana: string;
  let bo: string;

  const gatewayEnv = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({
    PATH: process.env.PATH,
    SECRET_ENV,
    SECRET_WEB,
    ...extra,
  });

  async function connect(token: string, era: "modern" | "legacy"): Promise<Client> {
    const client = new Client(
      { name: `e2e-${era}`, version: "1.0.0" },
      era === "modern" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
    );
    await client.connect(
      new StreamableHTTPClientTransport(new URL(mcpUrl), { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
    );
    clients.push(client);
    return client;
  }

  before(async () => {
    provider = await startProvider();
    ana = provider.mint({ sub: "ana", department: "support" });
    bo = provider.mint({ sub: "bo", department: "finance" });
    const webLogs: string[] = [];
    const started = await startAndWait([UPSTREAM, "--http"], { PATH: process.env.PATH }, (l) => l.url as string | undefined, webLogs);
    web = started.child;
    const dir = mkdtempSync(join(tmpdir(), "capgate-e2e-"));
    const secretFile = join(dir, "secret");
    writeFileSync(secretFile, `${SECRET_FILE}\n`);
    policyArgs = [provider.discovery, started.value, `http://127.0.0.1:${await closedPort()}/mcp`, secretFile];
    capgate = await startCapgate({ policy: policyYaml(...policyArgs), catalog: catalogYaml(), env: { E2E_CALLER_KEY: CALLER_KEY } });
    const serving = await startAndWait(
      [CLI, "--capgate", capgate.url, "--gateway-token-file", capgate.gatewayTokenFile, "--listen", "127.0.0.1:0"],
      gatewayEnv(),
      (l) => (l.event === "listening" ? (l.url as string) : undefined),
      gatewayLogs,
    );
    gateway = serving.child;
    mcpUrl = serving.value;
  });

  after(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
    await stop(gateway);
    await stop(web);
    await capgate?.stop();
    await provider?.close();
  });

  test("a request without Authorization is 401 with WWW-Authenticate: Bearer", async () => {
    const response = await fetch(mcpUrl, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
    });
    assert.equal(response.status, 401);
    assert.equal(response.headers.get("www-authenticate"), "Bearer");
  });

  test("Mcp-Method disagreeing with the body is JSON-RPC -32600", async () => {
    const response = await fetch(mcpUrl, {
      method: "POST",
      headers: {
        Authorization: `Bearer ${ana}`,
        "Content-Type": "application/json",
        Accept: "application/json, text/event-stream",
        "Mcp-Method": "tools/list",
        "Mcp-Name": "probe__whoami",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: "probe__whoami" } }),
    });
    assert.equal(response.status, 400);
    const body = (await response.json()) as { id: unknown; error: { code: number } };
    assert.equal(body.error.code, -32600);
    assert.equal(body.id, 7);
  });

  for (const era of ["modern", "legacy"] as const) {
    test(`${era}: tools/list shows the caller's tools with the catalog's schema`, async () => {
      const client = await connect(ana, era);
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name);
      for (const name of ["probe__whoami", "probe__echo", "probe-file__whoami", "web__whoami", "down__whoami"]) {
        assert.ok(names.includes(name), `${name} in ${names.join(", ")}`);
      }
      assert.ok(!names.includes("probe-finance__whoami"));
      const echo = tools.find((t) => t.name === "probe__echo");
      assert.equal(echo?.description, "Echo the text");
      assert.deepEqual(echo?.inputSchema, { type: "object", properties: { text: { type: "string" } }, required: ["text"] });
      assert.deepEqual(tools.find((t) => t.name === "probe__whoami")?.inputSchema, { type: "object" });
    });

    test(`${era}: an allowed call reaches the upstream with the account's credential`, async () => {
      const client = await connect(ana, era);
      assert.equal(text(await client.callTool({ name: "probe__whoami" })), `credential-sha256: ${sha256(SECRET_ENV)}`);
      assert.equal(text(await client.callTool({ name: "web__whoami" })), `credential-sha256: ${sha256(SECRET_WEB)}`);
      assert.equal(text(await client.callTool({ name: "probe-file__whoami" })), `credential-sha256: ${sha256(SECRET_FILE)}`);
      const args = { text: "über → 𝄞 \"quoted\"" };
      assert.equal(text(await client.callTool({ name: "probe__echo", arguments: args })), args.text);
    });
  }

  test("one upstream session per (upstream, account), reused across calls and callers", async () => {
    const first = text(await (await connect(ana, "modern")).callTool({ name: "probe__pid" }));
    const second = text(await (await connect(ana, "legacy")).callTool({ name: "probe__pid" }));
    assert.match(first, /^\d+$/);
    assert.equal(second, first);
  });

  test("denials carry the contract's code, message and data", async () => {
    const client = await connect(ana, "modern");
    const noGrant = await rejection(client.callTool({ name: "probe-finance__whoami" }));
    assert.equal(noGrant.code, -32001);
    assert.match(noGrant.message, /^denied: no_grant_matches: /);
    const data = noGrant.data as Data;
    assert.equal(data.code, "no_grant_matches");
    assert.equal(data.pointer, "/grants");
    assert.match(String(data.decision_id), /^[0-9a-f-]{36}$/);

    const disabled = await rejection(client.callTool({ name: "probe-disabled__whoami" }));
    assert.equal((disabled.data as Data).code, "account_disabled");
    assert.equal((disabled.data as Data).pointer, "/grants/4");

    const unknown = await rejection(client.callTool({ name: "nowhere__nothing" }));
    assert.equal(unknown.code, -32602);
    assert.equal((unknown.data as Data).code, "unknown_tool");
    assert.match(unknown.message, /^denied: unknown_tool: /);

    assert.equal(text(await client.callTool({ name: "probe-metered__whoami" })), `credential-sha256: ${sha256(SECRET_ENV)}`);
    const exhausted = await rejection(client.callTool({ name: "probe-metered__whoami" }));
    const limits = exhausted.data as Data;
    assert.equal(limits.code, "limit_exhausted");
    assert.ok(Number.isInteger(limits.retry_after_seconds) && Number(limits.retry_after_seconds) > 0);
    assert.ok(!Number.isNaN(Date.parse(String(limits.resets_at))));
  });

  test("conditions: each call's arguments are decided on, and the listing says the tool is conditional", async () => {
    const client = await connect(ana, "modern");
    const { tools } = await client.listTools();
    assert.equal(
      tools.find((t) => t.name === "probe__refund")?.description,
      "Refund an amount (Calls may be refused depending on their arguments or time.)",
    );
    assert.equal(tools.find((t) => t.name === "probe__echo")?.description, "Echo the text");

    const refund = (args?: Record<string, unknown>) =>
      client.callTool({ name: "probe__refund", ...(args !== undefined && { arguments: args }) });
    assert.equal(text(await refund({ amount: 40, currency: "EUR" })), "refunded 40 EUR");
    const over = await rejection(refund({ amount: 150, currency: "EUR" }));
    assert.equal(over.code, -32001);
    assert.match(over.message, /^denied: condition_failed: /);
    assert.equal((over.data as Data).code, "condition_failed");
    assert.equal((over.data as Data).pointer, "/grants/8/when/0");
    const missing = await rejection(refund({ amount: 40 }));
    assert.match(missing.message, /^denied: arguments_missing: /);
    assert.equal((missing.data as Data).pointer, "/grants/8/when/1");
    // No `arguments` at all is `{}` to capgate: the first argument is missing, not the arguments.
    const none = await rejection(refund());
    assert.equal((none.data as Data).code, "arguments_missing");
    assert.equal((none.data as Data).pointer, "/grants/8/when/0");
  });

  test("arguments over 64 KiB are refused -32602 before capgate is asked; 64 KiB are decided", async () => {
    const client = await connect(ana, "legacy");
    // {"text":"…"} is 11 bytes around the text.
    const atTheBound = "x".repeat(64 * 1024 - 11);
    assert.equal(text(await client.callTool({ name: "probe__echo", arguments: { text: atTheBound } })), atTheBound);
    const before = (await capgate.audit()).length;
    const refused = await rejection(client.callTool({ name: "probe__echo", arguments: { text: `${atTheBound}x` } }));
    assert.equal(refused.code, -32602);
    assert.match(refused.message, /^denied: arguments_too_large: the call's arguments are 65537 bytes/);
    assert.deepEqual(Object.keys(refused.data as Data).sort(), ["code", "message"]);
    assert.equal((await capgate.audit()).length, before, "capgate was asked about arguments over the bound");
  });

  test("an unauthenticated caller is refused with the problem", async () => {
    const forged = provider.mint({ sub: "ana", department: "support" }, "foreign");
    const client = await connect(forged, "legacy");
    const refused = await rejection(client.callTool({ name: "probe__whoami" }));
    assert.equal(refused.code, -32001);
    assert.deepEqual([(refused.data as Data).code, (refused.data as Data).problem], ["unauthenticated", "credential_invalid"]);
    const listing = await rejection(client.listTools());
    assert.equal((listing.data as Data).problem, "credential_invalid");
  });

  test("credential_failed and upstream_failed are refused, noted, and nothing runs", async () => {
    const client = await connect(ana, "modern");
    const cred = await rejection(client.callTool({ name: "probe-gcp__whoami" }));
    assert.equal(cred.code, -32002);
    assert.equal((cred.data as Data).code, "credential_failed");
    assert.match(cred.message, /gcp-secrets/);
    const down = await rejection(client.callTool({ name: "down__whoami" }));
    assert.equal(down.code, -32003);
    assert.equal((down.data as Data).code, "upstream_failed");

    const relayed = await rejection(client.callTool({ name: "probe__fail" }));
    assert.deepEqual([relayed.code, relayed.message, relayed.data], [-32099, "the upstream refuses", { why: "asked to" }]);

    const records = await capgate.audit();
    const text = JSON.stringify(records);
    assert.ok(text.includes(String((cred.data as Data).decision_id)), "the credential_failed decision is audited");
    const noted = gatewayLogs.some((l) => l.includes('"note_failed"') && l.includes("unimplemented"));
    if (!noted) assert.match(text, /credential_failed/, "the note is in the audit trail");
  });

  test("a publish sends notifications/tools/list_changed to open sessions of both eras", async () => {
    const modern = await connect(ana, "modern");
    const legacy = await connect(ana, "legacy");
    let resolveModern!: () => void;
    let resolveLegacy!: () => void;
    const heardModern = new Promise<void>((r) => (resolveModern = r));
    const heardLegacy = new Promise<void>((r) => (resolveLegacy = r));
    modern.setNotificationHandler("notifications/tools/list_changed", async () => resolveModern());
    legacy.setNotificationHandler("notifications/tools/list_changed", async () => resolveLegacy());
    const subscription = await modern.listen({ toolsListChanged: true });
    assert.deepEqual(subscription.honoredFilter, { toolsListChanged: true });
    await legacy.listTools();

    const admin = createCapgateClient({ url: capgate.url, gatewayToken: capgate.adminToken });
    try {
      const published = await admin.policies.publish({
        artifact: policyYaml(
          ...policyArgs,
          "  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [probe.finance], using: acct-env }\n",
        ),
        catalog: catalogYaml(),
      });
      assert.equal(published.accepted, true, JSON.stringify(published.diagnostics));
    } finally {
      admin.close();
    }
    const within = (p: Promise<void>, what: string) =>
      Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: no list_changed in 5 s`)), 5000))]);
    await within(heardModern, "modern");
    await within(heardLegacy, "legacy");
    const { tools } = await modern.listTools();
    assert.ok(tools.some((t) => t.name === "probe-finance__whoami"));
    await subscription.close();
  });

  test("stdio: the caller's API key from the environment; a wrong one is unauthenticated", async () => {
    const over = async (key: string) => {
      const client = new Client({ name: "e2e-stdio", version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
      await client.connect(
        new StdioClientTransport({
          command: process.execPath,
          args: [CLI, "--capgate", capgate.url, "--gateway-token-file", capgate.gatewayTokenFile, "--stdio"],
          env: gatewayEnv({ CAPGATE_CALLER_API_KEY: key }) as Record<string, string>,
          stderr: "ignore",
        }),
      );
      clients.push(client);
      return client;
    };
    const batch = await over(CALLER_KEY);
    assert.equal(text(await batch.callTool({ name: "probe__whoami" })), `credential-sha256: ${sha256(SECRET_ENV)}`);
    const wrong = await over("not-the-caller-key");
    const refused = await rejection(wrong.callTool({ name: "probe__whoami" }));
    assert.equal((refused.data as Data).code, "unauthenticated");
  });

  test("capgate unreachable: the call is refused capgate_unavailable (fail closed)", async () => {
    const client = new Client({ name: "e2e-down", version: "1.0.0" });
    await client.connect(
      new StdioClientTransport({
        command: process.execPath,
        args: [CLI, "--capgate", `http://127.0.0.1:${await closedPort()}`, "--stdio", "--decide-timeout", "1"],
        env: gatewayEnv({ CAPGATE_CALLER_API_KEY: CALLER_KEY }) as Record<string, string>,
        stderr: "ignore",
      }),
    );
    clients.push(client);
    const refused = await rejection(client.callTool({ name: "probe__whoami" }));
    assert.equal(refused.code, -32001);
    assert.equal((refused.data as Data).code, "capgate_unavailable");
  });

  test("the gateway's log is JSON lines and holds no secret, token or key", () => {
    assert.ok(gatewayLogs.length > 5);
    for (const line of gatewayLogs) {
      assert.doesNotThrow(() => JSON.parse(line), line);
      for (const secret of [SECRET_ENV, SECRET_WEB, SECRET_FILE, CALLER_KEY, ana, bo, capgate.gatewayToken]) {
        assert.ok(!line.includes(secret), `a secret in the log: ${line}`);
      }
    }
  });
});
