//! The direct path's outbound half against real upstreams (src/testing/session-upstream.ts, a
//! sessionful 2025-era server on the SDK, answering SSE or JSON): the same calls through a pool
//! on the direct path and one on the SDK path give the same results and errors, notifications
//! on a call's stream are delivered as the SDK session delivers them, an upstream that forgot
//! the session is handshaken with again, and what is not a JSON-RPC answer — an HTTP error, a
//! body that is not JSON, a stream without the response, an answer over the bound, no answer in
//! time — is an UpstreamFailure. The SSE decoder on its own first.

import { strict as assert } from "node:assert";
import type { ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";
import type { ToolRoute } from "@capgate/client";
import { MAX_UPSTREAM_ANSWER_BYTES, SseDecoder } from "./direct.js";
import { MemoryLogger } from "./log.js";
import { startAndWait, stop } from "./testing/processes.js";
import { UpstreamError, UpstreamFailure, UpstreamPool, type CallPath, type UpstreamNotification } from "./upstreams.js";

const FIXTURE = fileURLToPath(new URL("./testing/session-upstream.js", import.meta.url));
const CREDENTIAL = "direct-test-credential-5be1";

test("SSE: CRLF, LF and CR line ends, split anywhere; multi-line data; comments and other fields", () => {
  const stream = ": a comment\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\nid: 7\r\n\r\ndata: two\rdata: lines\r\rretry: 10\n\nevent: other\ndata: x\n\n";
  for (const cut of [1, 2, 3, 5, 7, stream.length]) {
    const sse = new SseDecoder();
    const events = [];
    for (let i = 0; i < stream.length; i += cut) events.push(...sse.push(stream.slice(i, i + cut)));
    assert.deepEqual(
      events,
      [
        { event: "message", data: '{"a":\n1}' },
        { event: "message", data: "two\nlines" },
        { event: "other", data: "x" },
      ],
      `read ${cut} characters at a time`,
    );
  }
  const sse = new SseDecoder();
  assert.deepEqual(sse.push("data: never finished\n"), [], "an event is dispatched at its blank line only");
});

const text = (result: unknown) =>
  ((result as { content?: Array<{ text?: string }> }).content ?? []).map((c) => c.text ?? "").join("");

describe("the direct path to a real upstream", () => {
  const upstreams: ChildProcess[] = [];
  const pools: UpstreamPool[] = [];
  let sseUrl: string;
  let jsonUrl: string;

  async function fixture(...flags: string[]): Promise<string> {
    const started = await startAndWait([FIXTURE, ...flags], { PATH: process.env.PATH }, (l) => l.url as string | undefined, []);
    upstreams.push(started.child);
    return started.value;
  }

  function pool(callPath: CallPath, timeoutMs = 10_000) {
    const heard: UpstreamNotification[] = [];
    const logger = new MemoryLogger();
    const made = new UpstreamPool(logger, { timeoutMs, callPath, onNotification: (_key, n) => heard.push(n) });
    pools.push(made);
    return { pool: made, heard, logger };
  }

  const route = (url: string, name: string): ToolRoute => ({ upstream: "fixture", name, transport: { kind: "http", url } }) as ToolRoute;
  const call = (p: UpstreamPool, url: string, name: string, args?: Record<string, unknown>) =>
    p.call(route(url, name), "acct", CREDENTIAL, args);

  async function failure(calling: Promise<unknown>): Promise<Error> {
    try {
      await calling;
    } catch (error) {
      assert.ok(error instanceof UpstreamFailure || error instanceof UpstreamError, `got ${String(error)}`);
      return error;
    }
    assert.fail("the call was expected to fail");
  }

  before(async () => {
    sseUrl = await fixture();
    jsonUrl = await fixture("--json");
  });

  after(async () => {
    await Promise.allSettled(pools.map((p) => p.closeAll()));
    await Promise.all(upstreams.map((u) => stop(u)));
  });

  for (const answering of ["sse", "json"] as const) {
    test(`${answering}: results and upstream errors are the SDK path's`, async () => {
      const url = answering === "sse" ? sseUrl : jsonUrl;
      const direct = pool("direct").pool;
      const sdk = pool("sdk").pool;
      // The upstream can ask its caller something only on a stream: a JSON answer has no room.
      const names = answering === "sse" ? (["echo", "whoami", "headers", "ask"] as const) : (["echo", "whoami", "headers"] as const);
      for (const name of names) {
        const args = name === "echo" ? { text: "über → 𝄞 \"quoted\"" } : undefined;
        assert.deepEqual(await call(direct, url, name, args), await call(sdk, url, name, args), name);
      }
      assert.equal(text(await call(direct, url, "whoami")), `credential-sha256: ${createHash("sha256").update(CREDENTIAL).digest("hex")}`);
      assert.deepEqual(JSON.parse(text(await call(direct, url, "headers"))), {
        accept: "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-11-25",
        "mcp-session-id": true,
      });
      if (answering === "sse") assert.equal(text(await call(direct, url, "ask")), "ping: answered; elicitation/create: error -32601; sampling/createMessage: error -32601");
      for (const name of ["fail", "raw-32002"]) {
        const viaDirect = await failure(call(direct, url, name));
        const viaSdk = await failure(call(sdk, url, name));
        assert.ok(viaDirect instanceof UpstreamError, `${name}: ${String(viaDirect)}`);
        assert.ok(viaSdk instanceof UpstreamError);
        assert.deepEqual([viaDirect.code, viaDirect.message, viaDirect.data], [viaSdk.code, viaSdk.message, viaSdk.data], name);
      }
    });
  }

  test("a notification sent before the answer is delivered as the SDK session delivers it", async () => {
    const direct = pool("direct");
    const sdk = pool("sdk");
    assert.equal(text(await call(direct.pool, sseUrl, "notify")), "notified");
    assert.equal(text(await call(sdk.pool, sseUrl, "notify")), "notified");
    assert.deepEqual(direct.heard, [{ method: "notifications/message", params: { level: "info", logger: "fixture", data: "before the answer" } }]);
    assert.deepEqual(direct.heard, sdk.heard.map(({ method, params }) => ({ method, params })));
  });

  test("an upstream that forgot the session (HTTP 404) is handshaken with again and the call made", async () => {
    const { pool: direct, logger } = pool("direct");
    const url = await fixture();
    assert.equal(text(await call(direct, url, "sessions")), "1");
    assert.equal(text(await call(direct, url, "forget")), "forgotten");
    assert.equal(text(await call(direct, url, "echo", { text: "still here" })), "still here");
    assert.equal(text(await call(direct, url, "sessions")), "2", "a second handshake");
    assert.equal(logger.lines.filter((l) => l.event === "upstream_session_lost").length, 1);
  });

  test("sequential calls share one kept connection", async () => {
    const url = await fixture();
    const direct = pool("direct").pool;
    const before = Number(text(await call(direct, url, "connections")));
    for (let i = 0; i < 20; i++) assert.equal(text(await call(direct, url, "echo", { text: `${i}` })), `${i}`);
    const after = Number(text(await call(direct, url, "connections")));
    assert.ok(after - before <= 1, `${after - before} new connections for 21 calls`);
  });

  test("an upstream that never answers is an UpstreamFailure at the deadline", async () => {
    const direct = pool("direct", 1000).pool;
    await call(direct, sseUrl, "echo", { text: "session open" });
    const started = Date.now();
    const failed = await failure(call(direct, sseUrl, "hang"));
    const took = Date.now() - started;
    assert.ok(failed instanceof UpstreamFailure);
    assert.equal(failed.message, "upstream `fixture` did not answer in 1s");
    assert.ok(took >= 900 && took < 3000, `failed after ${took} ms`);
  });

  test("what is not the call's JSON-RPC answer is an UpstreamFailure, and says what it was", async () => {
    const direct = pool("direct").pool;
    for (const [name, why] of [
      ["raw-500", /failed the call: the upstream answered HTTP 500$/],
      ["raw-garbage", /the upstream's answer is not JSON$/],
      ["raw-wrong-id", /the upstream's answer is not the call's JSON-RPC response$/],
      ["raw-no-answer", /the upstream's stream ended without the call's response$/],
      ["raw-html", /the upstream answered `text\/html`, not JSON or SSE$/],
    ] as const) {
      const failed = await failure(call(direct, sseUrl, name));
      assert.ok(failed instanceof UpstreamFailure, name);
      assert.match(failed.message, why, name);
      assert.ok(!failed.message.includes(CREDENTIAL));
    }
    // Each failure dropped the session; the next call opens another and succeeds.
    assert.equal(text(await call(direct, sseUrl, "echo", { text: "again" })), "again");
  });

  test(`an answer over ${MAX_UPSTREAM_ANSWER_BYTES} bytes is cut, not read`, async () => {
    const direct = pool("direct").pool;
    for (const url of [sseUrl, jsonUrl]) {
      assert.equal(text(await call(direct, url, "big", { bytes: 1024 * 1024 })).length, 1024 * 1024);
      const failed = await failure(call(direct, url, "big", { bytes: MAX_UPSTREAM_ANSWER_BYTES }));
      assert.match(failed.message, new RegExp(`the upstream's answer is over ${MAX_UPSTREAM_ANSWER_BYTES} bytes$`));
    }
  });
});
