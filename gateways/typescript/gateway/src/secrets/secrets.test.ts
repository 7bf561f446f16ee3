//! Secret resolution against real loopback endpoints: a Vault KV v2 API and
//! an OAuth token endpoint written here, as small as the contract needs.

import { strict as assert } from "node:assert";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { SecretResolver } from "./index.js";

const SECRET = "s3cr3t-value-never-shown";

async function listen(handler: (req: IncomingMessage, body: string, res: ServerResponse) => void): Promise<Server> {
  const server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => (body += c));
    req.on("end", () => handler(req, body, res));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

const base = (server: Server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

function assertFailed(result: { ok: boolean; detail?: string }, pattern: RegExp): void {
  assert.equal(result.ok, false, "expected a failure");
  assert.match(result.detail ?? "", pattern);
  assert.doesNotMatch(result.detail ?? "", new RegExp(SECRET));
}

describe("env:// and file://", () => {
  test("env reads the variable; missing or empty is a failure naming it", async () => {
    const secrets = new SecretResolver({ BOT: SECRET, EMPTY: "" });
    assert.deepEqual(await secrets.resolve("env://BOT"), { ok: true, credential: SECRET });
    assertFailed(await secrets.resolve("env://NOPE"), /`NOPE` is not set/);
    assertFailed(await secrets.resolve("env://EMPTY"), /`EMPTY` is empty/);
  });

  test("file reads the content with the trailing newline trimmed", async () => {
    const dir = mkdtempSync(join(tmpdir(), "capgate-secrets-"));
    writeFileSync(join(dir, "token"), `${SECRET}\n`);
    const secrets = new SecretResolver({});
    assert.deepEqual(await secrets.resolve(`file://${join(dir, "token")}`), { ok: true, credential: SECRET });
    assertFailed(await secrets.resolve(`file://${join(dir, "absent")}`), /ENOENT/);
    assertFailed(await secrets.resolve("file://relative/path"), /absolute/);
  });

  test("an unknown scheme has no resolver", async () => {
    const secrets = new SecretResolver({});
    assertFailed(
      await secrets.resolve("gcp-secrets://projects/p/secrets/s/versions/3"),
      /^no resolver for scheme `gcp-secrets`$/,
    );
    assertFailed(await secrets.resolve("no-scheme-here"), /no scheme/);
  });
});

describe("vault:// (KV v2)", () => {
  let vault: Server;
  const seen: string[] = [];
  before(async () => {
    vault = await listen((req, _body, res) => {
      seen.push(req.url ?? "");
      if (req.headers["x-vault-token"] !== "vault-root") {
        res.writeHead(403, { "Content-Type": "application/json" }).end('{"errors":["permission denied"]}');
        return;
      }
      if (req.method === "GET" && req.url === "/v1/secret/data/mcp/helpdesk") {
        res
          .writeHead(200, { "Content-Type": "application/json" })
          .end(JSON.stringify({ data: { data: { value: SECRET, token: `${SECRET}-token` }, metadata: { version: 3 } } }));
        return;
      }
      res.writeHead(404, { "Content-Type": "application/json" }).end('{"errors":[]}');
    });
  });
  after(() => vault.close());

  test("reads data.data.value, or the named field", async () => {
    const secrets = new SecretResolver({ VAULT_ADDR: `${base(vault)}/`, VAULT_TOKEN: "vault-root" });
    assert.deepEqual(await secrets.resolve("vault://secret/mcp/helpdesk"), { ok: true, credential: SECRET });
    assert.deepEqual(await secrets.resolve("vault://secret/mcp/helpdesk#token"), {
      ok: true,
      credential: `${SECRET}-token`,
    });
    assert.ok(seen.includes("/v1/secret/data/mcp/helpdesk"));
  });

  test("a missing field, a missing secret and a refused token are failures", async () => {
    const secrets = new SecretResolver({ VAULT_ADDR: base(vault), VAULT_TOKEN: "vault-root" });
    assertFailed(await secrets.resolve("vault://secret/mcp/helpdesk#nope"), /no string field `nope`/);
    assertFailed(await secrets.resolve("vault://secret/mcp/absent"), /HTTP 404/);
    const wrong = new SecretResolver({ VAULT_ADDR: base(vault), VAULT_TOKEN: "wrong" });
    assertFailed(await wrong.resolve("vault://secret/mcp/helpdesk"), /HTTP 403/);
  });

  test("VAULT_ADDR or VAULT_TOKEN unset, or Vault unreachable, says so", async () => {
    assertFailed(await new SecretResolver({ VAULT_TOKEN: "t" }).resolve("vault://secret/x"), /VAULT_ADDR is not set/);
    assertFailed(
      await new SecretResolver({ VAULT_ADDR: base(vault) }).resolve("vault://secret/x"),
      /VAULT_TOKEN is not set/,
    );
    const closed = await listen(() => undefined);
    const addr = base(closed);
    await new Promise((resolve) => closed.close(resolve));
    assertFailed(
      await new SecretResolver({ VAULT_ADDR: addr, VAULT_TOKEN: "t" }).resolve("vault://secret/x"),
      /cannot reach VAULT_ADDR \(ECONNREFUSED\)/,
    );
    assertFailed(await new SecretResolver({}).resolve("vault://onlymount"), /not vault:\/\/<mount>/);
  });
});

describe("oauth+https:// (client credentials)", () => {
  let endpoint: Server;
  const requests: Array<Record<string, string>> = [];
  let status = 200;
  before(async () => {
    endpoint = await listen((req, body, res) => {
      // Parsed as the form it is, so a '+' sent as %2B arrives as '+'.
      const form = Object.fromEntries(new URLSearchParams(body));
      requests.push({ path: req.url ?? "", type: req.headers["content-type"] ?? "", ...form });
      if (status !== 200) {
        res.writeHead(status, { "Content-Type": "application/json" }).end('{"error":"invalid_client"}');
        return;
      }
      res
        .writeHead(200, { "Content-Type": "application/json" })
        .end(JSON.stringify({ access_token: `minted-${requests.length}`, token_type: "Bearer", expires_in: 300 }));
    });
  });
  after(() => endpoint.close());

  const ref = (query: string) => `oauth+${base(endpoint)}/oauth2/token?${query}`;

  test("posts the grant with the nested secret, percent-decoded only, and caches the token", async () => {
    let now = 1_000_000;
    const secrets = new SecretResolver({ CLIENT_SECRET: SECRET }, () => now);
    const r = ref("client=mcp%2Fmetrics+x&secret=env://CLIENT_SECRET&scope=dashboards.read%20more");
    const first = await secrets.resolve(r);
    assert.deepEqual(first, { ok: true, credential: "minted-1" });
    assert.deepEqual(requests.at(-1), {
      path: "/oauth2/token",
      type: "application/x-www-form-urlencoded",
      grant_type: "client_credentials",
      client_id: "mcp/metrics+x",
      client_secret: SECRET,
      scope: "dashboards.read more",
    });
    // Cached until shortly before expires_in (300 s): 30 s early at most.
    now += 269_000;
    assert.deepEqual(await secrets.resolve(r), { ok: true, credential: "minted-1" });
    assert.equal(requests.length, 1);
    now += 2_000;
    assert.deepEqual(await secrets.resolve(r), { ok: true, credential: "minted-2" });
    assert.equal(requests.length, 2);
  });

  test("concurrent resolutions of one grant share one token request", async () => {
    const secrets = new SecretResolver({ CLIENT_SECRET: SECRET });
    const before = requests.length;
    const r = ref("client=c&secret=env://CLIENT_SECRET");
    const results = await Promise.all([secrets.resolve(r), secrets.resolve(r), secrets.resolve(r)]);
    assert.equal(requests.length, before + 1);
    const credentials = results.map((x) => (x.ok ? x.credential : x.detail));
    assert.deepEqual(credentials, [credentials[0], credentials[0], credentials[0]]);
    assert.match(credentials[0] ?? "", /^minted-/);
  });

  test("an endpoint error, a bad nested secret, or a bad reference is a failure without the secret", async () => {
    const secrets = new SecretResolver({ CLIENT_SECRET: SECRET });
    status = 401;
    try {
      assertFailed(await secrets.resolve(ref("client=c2&secret=env://CLIENT_SECRET")), /answered HTTP 401/);
    } finally {
      status = 200;
    }
    assertFailed(await secrets.resolve(ref("client=c&secret=env://ABSENT")), /client secret: env: variable `ABSENT`/);
    assertFailed(await secrets.resolve(ref("client=c&secret=oauth+https://x/t")), /cannot itself be an oauth\+/);
    assertFailed(await secrets.resolve(ref("secret=env://CLIENT_SECRET")), /no `client`/);
    assertFailed(
      await secrets.resolve("oauth+http://auth.example.net/token?client=c&secret=env://CLIENT_SECRET"),
      /only for loopback/,
    );
  });
});
