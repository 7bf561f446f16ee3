//! `--call-path direct` against `--call-path sdk`, all real: `capgate serve`, two built gateways
//! (`dist/cli.js`) side by side, sessionful 2025-era upstreams on the SDK
//! (src/testing/session-upstream.ts). The same calls — allowed, refused in every way the gateway
//! refuses, relayed upstream errors — get the same JSON-RPC answers and the same log events
//! from both; the direct gateway's come as `application/json` (its own answer), the SDK's as an
//! SSE stream. Sequential calls keep one upstream connection; what the direct path does not take
//! still gets the SDK's answer; the official SDK client, in both eras, works through it.

import { strict as assert } from "node:assert";
import type { ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";
import { Client, ProtocolError, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { startCapgate, type Capgate } from "@capgate/client/testing";
import { SseDecoder } from "./direct.js";
import { startProvider, type Provider } from "./testing/oidc.js";
import { closedPort, startAndWait, stop } from "./testing/processes.js";

const CLI = fileURLToPath(new URL("./cli.js", import.meta.url));
const FIXTURE = fileURLToPath(new URL("./testing/session-upstream.js", import.meta.url));
const SECRET_ENV = "callpath-secret-env-31c7";
const PATHS = ["direct", "sdk"] as const;
type CallPath = (typeof PATHS)[number];

function policyYaml(discovery: string, sseUrl: string, jsonUrl: string, downUrl: string): string {
  const http = (url: string) => `{ kind: mcp-http, url: ${JSON.stringify(url)} }`;
  const tools = (capability: string, names: string[]) => names.map((n) => `      - { name: ${n}, capability: ${capability} }\n`).join("");
  return `version: 2
capabilities:
  - { id: up.use }
  - { id: up.refund }
  - { id: up.metered }
  - { id: up.finance }
  - { id: up.disabled }
  - { id: up.gcp }
upstreams:
  - id: up
    transport: ${http(sseUrl)}
    tools:
${tools("up.use", ["echo", "whoami", "connections", "fail", "raw-32002", "hang"])}      - { name: refund, capability: up.refund }
  - id: upjson
    transport: ${http(jsonUrl)}
    tools:
${tools("up.use", ["echo", "fail"])}  - id: metered
    transport: ${http(sseUrl)}
    tools:
${tools("up.metered", ["echo"])}  - id: finance
    transport: ${http(sseUrl)}
    tools:
${tools("up.finance", ["echo"])}  - id: disabled
    transport: ${http(sseUrl)}
    tools:
${tools("up.disabled", ["echo"])}  - id: gcp
    transport: ${http(sseUrl)}
    tools:
${tools("up.gcp", ["echo"])}  - id: down
    transport: ${http(downUrl)}
    tools:
${tools("up.use", ["echo"])}accounts:
  - { id: acct-env, secret: { ref: "env://SECRET_ENV" } }
  - { id: acct-disabled, disabled: true, secret: { ref: "env://SECRET_ENV" } }
  - { id: acct-gcp, secret: { ref: "gcp-secrets://projects/p/secrets/s/versions/1" } }
principals:
  issuers:
    - id: idp
      kind: oidc
      discovery: ${JSON.stringify(discovery)}
      attributes: { dept: claim:department }
grants:
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [up.use], using: acct-env }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [up.metered], using: acct-env, limits: { calls: 1, per: 1h } }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [up.disabled], using: acct-disabled }
  - { to: { issuer: idp, attributes: { dept: support } }, capabilities: [up.gcp], using: acct-gcp }
  - { to: { issuer: idp, attributes: { dept: finance } }, capabilities: [up.finance], using: acct-env }
  - to: { issuer: idp, attributes: { dept: support } }
    capabilities: [up.refund]
    using: acct-env
    when:
      - { argument: amount, at_most: 100 }
`;
}

function catalogYaml(): string {
  const entries: Array<[string, string]> = [
    ...["echo", "whoami", "connections", "fail", "raw-32002", "hang", "refund"].map((n): [string, string] => ["up", n]),
    ["upjson", "echo"],
    ["upjson", "fail"],
    ...["metered", "finance", "disabled", "gcp", "down"].map((u): [string, string] => [u, "echo"]),
  ];
  return `version: 1\ntools:\n${entries.map(([upstream, name]) => `  - { upstream: ${upstream}, name: ${name} }\n`).join("")}`;
}

type Message = Record<string, unknown>;

/** An HTTP answer, its JSON-RPC messages read from JSON or SSE alike. */
interface Answer {
  readonly status: number;
  readonly contentType: string;
  readonly messages: Message[];
  /** The Content-Length header, and the body's length in bytes. */
  readonly contentLength: string | null;
  readonly bytes: number;
}

const ACCEPT = "application/json, text/event-stream";

/** A 2025-era session with a gateway, spoken to in raw JSON-RPC so that the bytes it answers are seen. */
class RawSession {
  #next = 1;
  private constructor(
    readonly url: string,
    readonly token: string,
    readonly id: string,
  ) {}

  static async open(url: string, token: string): Promise<RawSession> {
    const initialize = {
      jsonrpc: "2.0",
      id: 0,
      method: "initialize",
      params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "raw", version: "1" } },
    };
    const response = await fetch(url, {
      method: "POST",
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: ACCEPT },
      body: JSON.stringify(initialize),
    });
    const id = response.headers.get("mcp-session-id");
    await read(response);
    assert.ok(id !== null, "initialize answered with a session id");
    const session = new RawSession(url, token, id);
    await session.post({ jsonrpc: "2.0", method: "notifications/initialized" });
    return session;
  }

  /** `tools/call` of `name` (with `args`), the gateway's answer. */
  call(name: string, args?: unknown): Promise<Answer> {
    return this.post({ jsonrpc: "2.0", id: this.#next++, method: "tools/call", params: { name, ...(args !== undefined && { arguments: args }) } });
  }

  async post(body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
    const response = await fetch(this.url, {
      method: "POST",
      headers: {
        Authorization: `Bearer ${this.token}`,
        "Content-Type": "application/json",
        Accept: ACCEPT,
        "Mcp-Session-Id": this.id,
        "MCP-Protocol-Version": "2025-11-25",
        ...headers,
      },
      body: JSON.stringify(body),
    });
    return read(response);
  }
}

async function read(response: Response): Promise<Answer> {
  const contentType = (response.headers.get("content-type") ?? "").split(";")[0] ?? "";
  const text = await response.text();
  let messages: Message[] = [];
  if (contentType === "application/json" && text !== "") {
    const parsed = JSON.parse(text) as Message | Message[];
    messages = Array.isArray(parsed) ? parsed : [parsed];
  } else if (contentType === "text/event-stream") {
    messages = new SseDecoder().push(text).map((e) => JSON.parse(e.data) as Message);
  }
  return { status: response.status, contentType, messages, contentLength: response.headers.get("content-length"), bytes: Buffer.byteLength(text) };
}

/** An answer with what differs from call to call by nature (decision ids, seconds left) put aside. */
function comparable(answer: Answer): unknown {
  return {
    status: answer.status,
    messages: JSON.parse(JSON.stringify(answer.messages), (key, value: unknown) =>
      ["decision_id", "retry_after_seconds", "resets_at"].includes(key) ? `<${key}>` : value,
    ),
  };
}

const errorOf = (answer: Answer) => answer.messages[0]?.error as { code: number; message: string; data?: Message } | undefined;
const textOf = (answer: Answer) =>
  ((answer.messages[0]?.result as { content?: Array<{ text?: string }> } | undefined)?.content ?? []).map((c) => c.text ?? "").join("");

/** The log events of a call, with the names of their fields: what both paths must write alike. */
const CALL_EVENTS = new Set(["called", "call_refused", "credential_failed", "upstream_failed", "upstream_error_relayed", "note_failed"]);
function callEvents(lines: string[]): string[] {
  return lines
    .map((line) => {
      try {
        return JSON.parse(line) as Message;
      } catch {
        return {};
      }
    })
    .filter((l) => CALL_EVENTS.has(String(l.event)))
    .map(({ ts: _ts, ...rest }) => `${String(rest.event)}(${Object.keys(rest).sort().join(",")}) ${String(rest.code ?? "")}`);
}

describe("--call-path direct against --call-path sdk", () => {
  let provider: Provider;
  let capgate: Capgate;
  let ana: string;
  const children: ChildProcess[] = [];
  const urls = {} as Record<CallPath, string>;
  const logs: Record<CallPath, string[]> = { direct: [], sdk: [] };
  const clients: Client[] = [];

  async function gateway(callPath: CallPath, log: string[], extra: string[] = []): Promise<string> {
    const { child, value } = await startAndWait(
      [CLI, "--capgate", capgate.url, "--gateway-token-file", capgate.gatewayTokenFile, "--listen", "127.0.0.1:0", "--call-path", callPath, ...extra],
      { PATH: process.env.PATH, SECRET_ENV },
      (l) => (l.event === "listening" ? (l.url as string) : undefined),
      log,
    );
    children.push(child);
    return value;
  }

  before(async () => {
    provider = await startProvider();
    ana = provider.mint({ sub: "ana", department: "support" });
    const upstream = async (...flags: string[]) => {
      const { child, value } = await startAndWait([FIXTURE, ...flags], { PATH: process.env.PATH }, (l) => l.url as string | undefined, []);
      children.push(child);
      return value;
    };
    const [sseUrl, jsonUrl] = [await upstream(), await upstream("--json")];
    const downUrl = `http://127.0.0.1:${await closedPort()}/mcp`;
    capgate = await startCapgate({ policy: policyYaml(provider.discovery, sseUrl, jsonUrl, downUrl), catalog: catalogYaml() });
    for (const callPath of PATHS) urls[callPath] = await gateway(callPath, logs[callPath], ["--upstream-timeout", "1"]);
  });

  after(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
    await Promise.all(children.map((c) => stop(c)));
    await capgate?.stop();
    await provider?.close();
  });

  test("the same calls get the same answers and log events; the direct gateway answers them itself", async () => {
    const sessions = {
      direct: await RawSession.open(urls.direct, ana),
      sdk: await RawSession.open(urls.sdk, ana),
    };
    // The metered grant allows one call an hour: the first (on the direct path) is allowed, then
    // both paths are refused the same way. The SDK's session makes an allowed call of its own,
    // so that both sessions' ids and logs stay in step.
    assert.equal(textOf(await sessions.direct.call("metered__echo", { text: "once" })), "once");
    assert.equal(textOf(await sessions.sdk.call("up__echo", { text: "once" })), "once");
    const forged = provider.mint({ sub: "ana", department: "support" }, "foreign");
    const forgedSessions = { direct: await RawSession.open(urls.direct, forged), sdk: await RawSession.open(urls.sdk, forged) };

    const cases: Array<[string, (s: RawSession, path: CallPath) => Promise<Answer>, (a: Answer) => void]> = [
      ["allowed", (s) => s.call("up__echo", { text: "über → 𝄞" }), (a) => assert.equal(textOf(a), "über → 𝄞")],
      ["allowed, no arguments", (s) => s.call("up__whoami"), (a) => assert.match(textOf(a), /^credential-sha256: [0-9a-f]{64}$/)],
      ["allowed, JSON upstream", (s) => s.call("upjson__echo", { text: "j" }), (a) => assert.equal(textOf(a), "j")],
      ["no grant", (s) => s.call("finance__echo", {}), (a) => assert.equal(errorOf(a)?.data?.code, "no_grant_matches")],
      ["unknown tool", (s) => s.call("nowhere__nothing"), (a) => assert.deepEqual([errorOf(a)?.code, errorOf(a)?.data?.code], [-32602, "unknown_tool"])],
      ["condition", (s) => s.call("up__refund", { amount: 150 }), (a) => assert.equal(errorOf(a)?.data?.code, "condition_failed")],
      ["limit", (s) => s.call("metered__echo", { text: "again" }), (a) => assert.equal(errorOf(a)?.data?.code, "limit_exhausted")],
      ["account disabled", (s) => s.call("disabled__echo", {}), (a) => assert.equal(errorOf(a)?.data?.code, "account_disabled")],
      [
        "arguments too large",
        (s) => s.call("up__echo", { text: "x".repeat(64 * 1024) }),
        (a) => assert.deepEqual([errorOf(a)?.code, errorOf(a)?.data?.code], [-32602, "arguments_too_large"]),
      ],
      ["unauthenticated", (_s, path) => forgedSessions[path].call("up__echo", {}), (a) => assert.equal(errorOf(a)?.data?.code, "unauthenticated")],
      ["credential failed", (s) => s.call("gcp__echo", {}), (a) => assert.deepEqual([errorOf(a)?.code, errorOf(a)?.data?.code], [-32002, "credential_failed"])],
      ["upstream down", (s) => s.call("down__echo", {}), (a) => assert.deepEqual([errorOf(a)?.code, errorOf(a)?.data?.code], [-32003, "upstream_failed"])],
      ["upstream silent", (s) => s.call("up__hang", {}), (a) => assert.equal(errorOf(a)?.data?.message, "upstream `up` did not answer in 1s")],
      [
        "upstream error",
        (s) => s.call("up__fail", {}),
        (a) => assert.deepEqual(errorOf(a), { code: -32099, message: "the upstream refuses", data: { why: "asked to" } }),
      ],
      ["upstream error, JSON upstream", (s) => s.call("upjson__fail", {}), (a) => assert.equal(errorOf(a)?.code, -32099)],
      // MCP retired -32002; the SDK sends it as -32602, and so does the direct path.
      ["upstream error -32002", (s) => s.call("up__raw-32002", {}), (a) => assert.deepEqual([errorOf(a)?.code, errorOf(a)?.data], [-32602, { what: "thing" }])],
    ];
    for (const [name, send, check] of cases) {
      const direct = await send(sessions.direct, "direct");
      const sdk = await send(sessions.sdk, "sdk");
      check(direct);
      assert.deepEqual(comparable(direct), comparable(sdk), name);
      assert.equal(direct.contentType, "application/json", `${name}: the direct path answered`);
      // One write with its length, not a chunked body (issue 32: fewer writes per answer).
      assert.equal(direct.contentLength, String(direct.bytes), `${name}: the direct answer has its Content-Length`);
      assert.equal(sdk.contentType, "text/event-stream", `${name}: the SDK answered`);
    }
    assert.deepEqual(callEvents(logs.direct), callEvents(logs.sdk));
    assert.equal(callEvents(logs.direct).length, cases.length + 1);
  });

  test("20 sequential calls keep to at most 2 upstream connections", async () => {
    const session = await RawSession.open(urls.direct, ana);
    const connections = async () => Number(textOf(await session.call("up__connections", {})));
    const before = await connections();
    for (let i = 0; i < 20; i++) assert.equal(textOf(await session.call("up__echo", { text: `${i}` })), `${i}`);
    const opened = (await connections()) - before;
    assert.ok(opened <= 2, `${opened} upstream connections for 20 calls`);
  });

  test("what the direct path does not take gets the SDK's own answer", async () => {
    const direct = await RawSession.open(urls.direct, ana);
    const sdk = await RawSession.open(urls.sdk, ana);
    const call = { jsonrpc: "2.0", id: 9, method: "tools/call", params: { name: "up__echo", arguments: { text: "b" } } };
    const requests: Array<[string, unknown, Record<string, string>]> = [
      ["a batch", [call], {}],
      ["Accept without SSE", call, { Accept: "application/json" }],
      ["arguments that are not an object", { ...call, params: { name: "up__echo", arguments: [1] } }, {}],
      ["a null id", { ...call, id: null }, {}],
      ["a progress token of the wrong type", { ...call, params: { ...call.params, _meta: { progressToken: [1] } } }, {}],
      ["an unknown protocol version", call, { "MCP-Protocol-Version": "1999-01-01" }],
      ["a session the gateway does not hold", call, { "Mcp-Session-Id": "not-a-session" }],
    ];
    for (const [name, body, headers] of requests) {
      const viaDirect = await direct.post(body, headers);
      const viaSdk = await sdk.post(body, headers);
      assert.deepEqual(comparable(viaDirect), comparable(viaSdk), name);
      // The direct path answers 200 application/json; the SDK streams a 200.
      assert.equal(viaDirect.contentType, viaSdk.contentType, `${name}: answered by the SDK`);
    }
    const unknown = await direct.post(call, { "Mcp-Session-Id": "not-a-session" });
    assert.equal(unknown.status, 404);
    const batch = await direct.post([call], {});
    assert.equal(batch.status, 200);
    assert.equal(textOf(batch), "b", "a batch is still served (by the SDK)");
  });

  for (const era of ["legacy", "modern"] as const) {
    test(`the official SDK client, ${era}, calls and is refused through the direct gateway`, async () => {
      const client = new Client(
        { name: `callpath-${era}`, version: "1.0.0" },
        era === "modern" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
      );
      await client.connect(
        new StreamableHTTPClientTransport(new URL(urls.direct), { requestInit: { headers: { Authorization: `Bearer ${ana}` } } }),
      );
      clients.push(client);
      const result = await client.callTool({ name: "up__echo", arguments: { text: era } });
      assert.deepEqual(result.content, [{ type: "text", text: era }]);
      try {
        await client.callTool({ name: "finance__echo", arguments: {} });
        assert.fail("finance__echo was expected to be refused");
      } catch (error) {
        assert.ok(error instanceof ProtocolError, String(error));
        assert.equal(error.code, -32001);
        assert.equal((error.data as Message).code, "no_grant_matches");
      }
    });
  }
});
