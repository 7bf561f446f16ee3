//! The bound on an inbound request body (`MAX_BODY_BYTES` in src/http.ts, 4 MiB, the same as
//! the Python gateway's), against the real HTTP edge on a loopback port: a body over it is
//! HTTP 413 with a JSON-RPC error body, with a Content-Length or chunked alike, answered
//! without waiting for the rest of a larger body, and with `Connection: close` (the rest of the
//! body is left unread), so that a pooled client's next request goes on a new connection and is
//! answered; a body of exactly 4 MiB is read whole. The bound is enforced before capgate is
//! asked anything, so capgate and the upstreams are stubs that would throw if used.

import { strict as assert } from "node:assert";
import { Agent, request, type IncomingHttpHeaders } from "node:http";
import { after, before, describe, test } from "node:test";
import type { CapgateClient } from "@capgate/client";
import { Gateway } from "./gateway.js";
import { serveHttp, type HttpGateway } from "./http.js";
import { MemoryLogger } from "./log.js";
import type { SecretResolver } from "./secrets/index.js";
import type { UpstreamPool } from "./upstreams.js";

/** The contract: 4 MiB of body bytes (not characters) are taken, one more is refused. */
const BOUND = 4 * 1024 * 1024;
const HEADERS = {
  Authorization: "Bearer body-bound-token",
  "Content-Type": "application/json",
  Accept: "application/json, text/event-stream",
};
/** Each test takes well under a second; a gateway that waits for a body that never ends fails, not hangs. */
const LIMIT = { timeout: 10_000 };

interface Answer {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly text: string;
  /** Whether the request went on a connection an earlier request had used. */
  readonly reused: boolean;
}

type Framing = "content-length" | "chunked";

/**
 * POSTs `body` and reads the whole answer. With `chunked` there is no Content-Length: the body
 * goes as 64 KiB chunks. With `declared`, the Content-Length claims that many bytes, only `body`
 * is sent, and the request is left open: an answer can only come before the body is complete.
 */
function post(url: string, agent: Agent, body: Buffer, framing: Framing, declared?: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...HEADERS };
    if (framing === "content-length") headers["Content-Length"] = String(declared ?? body.length);
    const req = request(url, { method: "POST", headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("error", reject);
      res.on("end", () => {
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString("utf8"), reused: req.reusedSocket });
        if (declared !== undefined) req.destroy();
      });
    });
    req.on("error", reject);
    const piece = 64 * 1024;
    for (let at = 0; at < body.length; at += piece) req.write(body.subarray(at, at + piece));
    if (declared === undefined) req.end();
  });
}

/** A JSON-RPC error answer: jsonrpc 2.0, a null id, an error with a numeric code and a message. */
function jsonRpcError(answer: Answer): { code: number; message: string } {
  assert.match(String(answer.headers["content-type"]), /^application\/json/);
  const parsed = JSON.parse(answer.text) as { jsonrpc?: unknown; id?: unknown; error?: { code?: unknown; message?: unknown } };
  assert.equal(parsed.jsonrpc, "2.0", answer.text);
  assert.equal(parsed.id, null, answer.text);
  assert.equal(typeof parsed.error?.code, "number", answer.text);
  assert.equal(typeof parsed.error?.message, "string", answer.text);
  return parsed.error as { code: number; message: string };
}

function assertRefused(answer: Answer): void {
  assert.equal(answer.status, 413, `expected 413, got ${answer.status}: ${answer.text.slice(0, 200)}`);
  assert.deepEqual(jsonRpcError(answer), { code: -32600, message: "the request body is over 4 MiB" });
}

/** `{"jsonrpc":"2.0","id":1,"method":"tools/list"}` padded with JSON whitespace to `size` bytes. */
function paddedRequest(size: number): Buffer {
  const head = Buffer.from('{"jsonrpc":"2.0","id":1,"method":"tools/list"}');
  return Buffer.concat([head, Buffer.alloc(size - head.length, " ")]);
}

/** The small request each refusal is followed by: not JSON, so -32700 without capgate. */
const NOT_JSON = Buffer.from("{");

/**
 * The next request on `agent` (one connection at most) is answered. Where `previous` kept its
 * connection alive it must go on that connection, which must not be left mid-body; where it
 * said `Connection: close` it goes on a new one.
 */
async function assertAnswersNext(url: string, agent: Agent, previous?: Answer): Promise<void> {
  const next = await post(url, agent, NOT_JSON, "content-length");
  assert.equal(next.status, 400, next.text);
  assert.equal(jsonRpcError(next).code, -32700);
  if (previous !== undefined) {
    const keptAlive = previous.headers.connection !== "close";
    assert.equal(next.reused, keptAlive, `the answer before said Connection: ${previous.headers.connection ?? "(none)"}`);
  }
}

describe("the inbound body bound, over loopback HTTP", () => {
  let http: HttpGateway;
  const agents: Agent[] = [];
  /** One keep-alive connection, so that a following request goes on the same one. */
  const connection = () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    agents.push(agent);
    return agent;
  };

  before(async () => {
    const unused = new Proxy({}, {
      get: (_target, key) => {
        throw new Error(`the body bound test used ${String(key)}`);
      },
    });
    const logger = new MemoryLogger();
    const gateway = new Gateway({
      capgate: unused as CapgateClient,
      secrets: unused as SecretResolver,
      upstreams: unused as UpstreamPool,
      logger,
    });
    http = await serveHttp(gateway, logger, "127.0.0.1", 0);
  });

  after(async () => {
    for (const agent of agents) agent.destroy();
    await http?.close();
  });

  for (const framing of ["content-length", "chunked"] as const) {
    test(`${framing}: a body one byte over 4 MiB is 413 with a JSON-RPC error, and the connection answers the next request`, LIMIT, async () => {
      const agent = connection();
      const refused = await post(http.url, agent, paddedRequest(BOUND + 1), framing);
      assertRefused(refused);
      await assertAnswersNext(http.url, agent, refused);
    });

    test(`${framing}: a body of exactly 4 MiB is read whole and parsed, not refused`, LIMIT, async () => {
      const agent = connection();
      const answer = await post(http.url, agent, paddedRequest(BOUND), framing);
      assert.notEqual(answer.status, 413, answer.text);
      // Valid JSON, so past the parse: the SDK-free refusal of a 2025-era request with no session.
      assert.equal(answer.status, 400, answer.text);
      assert.deepEqual(jsonRpcError(answer), { code: -32000, message: "Bad Request: no Mcp-Session-Id, and not an initialize request" });
      await assertAnswersNext(http.url, agent, answer);
    });
  }

  for (const framing of ["content-length", "chunked"] as const) {
    test(`${framing}: a body 1 MiB over the bound, sent whole, is 413 and a pooled connection's next request is answered`, LIMIT, async () => {
      // The 413 comes before the rest of the body is read: a connection kept alive after it would
      // be left mid-body, and the client's next request on it reset or stalled.
      const agent = connection();
      const refused = await post(http.url, agent, paddedRequest(BOUND + 1024 * 1024), framing);
      assertRefused(refused);
      await assertAnswersNext(http.url, agent, refused);
    });
  }

  test("the bound counts bytes: 4 MiB + 2 bytes of UTF-8 in fewer characters is 413", LIMIT, async () => {
    const agent = connection();
    // "é" is 2 bytes of UTF-8: the body is BOUND + 2 bytes but about BOUND / 2 characters.
    const head = '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_":"';
    const tail = '"}}';
    const filler = (BOUND + 2 - head.length - tail.length) / 2;
    const body = Buffer.from(`${head}${"é".repeat(filler)}${tail}`);
    assert.equal(body.length, BOUND + 2);
    const refused = await post(http.url, agent, body, "content-length");
    assertRefused(refused);
    await assertAnswersNext(http.url, agent, refused);
  });

  test("a body declared far over the bound is refused once 4 MiB + 64 KiB have come, not at its end", LIMIT, async () => {
    // 64 MiB declared, a little over 4 MiB sent and the request left open: the 413 must come
    // without the rest (a gateway that read the whole body first would never answer).
    const agent = connection();
    assertRefused(await post(http.url, agent, paddedRequest(BOUND + 64 * 1024), "content-length", 64 * 1024 * 1024));
    // That connection is given up (its body will never end); the gateway answers on another.
    await assertAnswersNext(http.url, connection());
  });
});
