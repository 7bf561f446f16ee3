//! TLS with a CA file against a real `capgate serve --tls-cert`: the client
//! trusts the CA it is given, and refuses a server it cannot verify. The
//! certificates are made per run with the openssl CLI, so no key material is
//! checked in.

import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { createCapgateClient } from "./index.js";
import { startCapgate, type Capgate } from "./testing/capgate.js";

const KEY = "tls-test-key-0123456789abcdef";

function makeCertificates(dir: string): { ca: string; cert: string; key: string } {
  const at = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] });
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", at("ca.key"), "-out", at("ca.pem"),
    "-days", "1", "-subj", "/CN=capgate test CA");
  openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", at("server.key"), "-out", at("server.csr"),
    "-subj", "/CN=127.0.0.1");
  writeFileSync(at("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n");
  openssl("x509", "-req", "-in", at("server.csr"), "-CA", at("ca.pem"), "-CAkey", at("ca.key"), "-CAcreateserial",
    "-out", at("server.pem"), "-days", "1", "-extfile", at("ext.cnf"));
  return { ca: at("ca.pem"), cert: at("server.pem"), key: at("server.key") };
}

describe("TLS", () => {
  let capgate: Capgate;
  let ca: string;
  before(async () => {
    const files = makeCertificates(mkdtempSync(join(tmpdir(), "capgate-tls-")));
    ca = files.ca;
    capgate = await startCapgate({
      policy: `version: 1
capabilities: [{ id: notes.read }]
upstreams:
  - id: notes
    transport: { kind: mcp-http, url: "https://notes.example.net/mcp" }
    tools: [{ name: read, capability: notes.read }]
accounts: [{ id: reader, secret: { ref: "env://READER" } }]
principals:
  issuers: [{ id: keys, kind: static-key, subject: batch, secret: { ref: "env://TLS_TEST_KEY" } }]
grants: [{ to: { issuer: keys }, capabilities: [notes.read], using: reader }]
`,
      env: { TLS_TEST_KEY: KEY },
      tls: { cert: files.cert, key: files.key },
    });
  });
  after(() => capgate?.stop());

  test("with the CA file, calls go through", async () => {
    assert.match(capgate.url, /^https:/);
    const client = createCapgateClient({ url: capgate.url, gatewayToken: capgate.gatewayToken, caFile: ca });
    try {
      const answer = await client.decide({ caller: { credential: { apiKey: KEY } }, tool: "notes__read" });
      assert.equal(answer.result.kind, "allow");
    } finally {
      client.close();
    }
  });

  test("without it, the server cannot be verified and the call fails", async () => {
    const client = createCapgateClient({ url: capgate.url, gatewayToken: capgate.gatewayToken });
    try {
      // Connect reports a failed verification as `internal`; the gateway refuses
      // every capgate error alike (capgate_unavailable).
      await assert.rejects(client.decide({ caller: { credential: { apiKey: KEY } }, tool: "notes__read" }), {
        name: "CapgateError",
        detail: /certificate/,
      });
    } finally {
      client.close();
    }
  });
});
