//! The unary call (unary.ts) against a stand-in HTTP/2 server, for what a real capgate does not
//! show: the request's framing and headers, a call given up on (cancelled on the wire too), a
//! reset stream, an answer with one message too many or none, a compressed one, and a status
//! with details in the head of a trailers-only answer or beside a `grpc-status: 0` in the
//! trailers, a content type that is not gRPC. Against capgate itself, capgate.test.ts.

import { strict as assert } from "node:assert";
import { constants as h2, createServer, type Http2Server, type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { DecideRequestSchema, DecideResponseSchema, DecisionSchema, Outcome } from "./gen/capgate/v1/decisions_pb.js";
import { BadRequestSchema } from "./gen/google/rpc/error_details_pb.js";
import { createCapgateClient, type CapgateClient } from "./index.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";

type Handler = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, body: Buffer) => void;

const caller = { credential: { apiKey: "k" } } as const;

function envelope(bytes: Uint8Array, flags = 0): Buffer {
  const frame = Buffer.alloc(5 + bytes.length);
  frame[0] = flags;
  frame.writeUInt32BE(bytes.length, 1);
  frame.set(bytes, 5);
  return frame;
}

const denyBytes = () =>
  toBinary(
    DecideResponseSchema,
    create(DecideResponseSchema, {
      decisionId: "dec-1",
      result: { case: "decision", value: create(DecisionSchema, { outcome: Outcome.DENY, reason: { code: 1, message: "no" } }) },
    }),
  );

/** A gRPC answer: the message(s), then grpc-status 0 as a trailer. */
function answer(stream: ServerHttp2Stream, ...messages: Buffer[]): void {
  stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
  stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  stream.end(Buffer.concat(messages));
}

describe("a unary call, against a stand-in server", () => {
  let server: Http2Server;
  let handler: Handler;
  let client: CapgateClient;
  const resets: number[] = [];
  before(async () => {
    server = createServer();
    server.on("stream", (stream, headers) => {
      const chunks: Buffer[] = [];
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("close", () => resets.push(stream.rstCode));
      stream.on("error", () => undefined);
      stream.on("end", () => handler(stream, headers, Buffer.concat(chunks)));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    client = createCapgateClient({
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      gatewayToken: "gw-token",
      timeoutMs: 1500,
    });
  });
  after(() => {
    client.close();
    server.close();
  });

  test("the request is one gRPC message with the method's path, the token and the deadline", async () => {
    let seen: { headers: IncomingHttpHeaders; body: Buffer } | undefined;
    handler = (stream, headers, body) => {
      seen = { headers, body };
      answer(stream, envelope(denyBytes()));
    };
    const decided = await client.decide({ caller, tool: "a__b", requestId: "r-1", argumentsJson: "{}" }, { timeoutMs: 700 });
    assert.equal(decided.decisionId, "dec-1");
    assert.equal(decided.result.kind, "deny");
    assert.ok(seen !== undefined);
    assert.equal(seen.headers[":method"], "POST");
    assert.equal(seen.headers[":path"], "/capgate.v1.DecisionService/Decide");
    assert.equal(seen.headers["content-type"], "application/grpc+proto");
    assert.equal(seen.headers.te, "trailers");
    assert.equal(seen.headers.authorization, "Bearer gw-token");
    assert.equal(seen.headers["grpc-timeout"], "700m");
    assert.equal(seen.body[0], 0);
    assert.equal(seen.body.readUInt32BE(1), seen.body.length - 5);
    const sent = fromBinary(DecideRequestSchema, seen.body.subarray(5));
    assert.equal(sent.requestId, "r-1");
    assert.deepEqual(sent.target, { case: "tool", value: "a__b" });
    assert.equal(sent.argumentsJson, "{}");
  });

  test("an answer in several DATA frames is read whole", async () => {
    const bytes = envelope(denyBytes());
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.write(bytes.subarray(0, 3));
      setTimeout(() => stream.end(bytes.subarray(3)), 20);
    };
    assert.equal((await client.decide({ caller, tool: "a__b" })).decisionId, "dec-1");
  });

  test("a status in a trailers-only answer is the error, with its details", async () => {
    // The status as a gRPC server writes it (connect's own server-side encoder).
    const status = setTrailerStatus(
      new Headers(),
      new ConnectError("bad tool", Code.InvalidArgument, undefined, [
        { desc: BadRequestSchema, value: { fieldViolations: [{ field: "tool", description: "too long" }] } },
      ]),
    );
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto", ...Object.fromEntries(status) }, { endStream: true });
    };
    await assert.rejects(client.decide({ caller, tool: "a__b" }), {
      name: "CapgateError",
      code: "invalid_argument",
      detail: "bad tool",
      fieldViolations: [{ field: "tool", description: "too long", reason: "" }],
    });
  });

  test("no message, two messages or a compressed one is an error, not an answer", async () => {
    handler = (stream) => answer(stream);
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unimplemented" });
    handler = (stream) => answer(stream, envelope(denyBytes()), envelope(denyBytes()));
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unimplemented" });
    handler = (stream) => answer(stream, envelope(denyBytes(), 1));
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "internal" });
  });

  test("a status in the trailers, after a message, is the error", async () => {
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "14", "grpc-message": "going away" }));
      stream.end(envelope(denyBytes()));
    };
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unavailable", detail: "going away" });
  });

  test("a message under a content type that is not gRPC's is an error, whatever its status says", async () => {
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/json" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(envelope(denyBytes()));
    };
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unknown" });
  });

  test("status details in the trailers outweigh a grpc-status of 0 beside them", async () => {
    const status = setTrailerStatus(
      new Headers(),
      new ConnectError("going away", Code.Unavailable, undefined, [
        { desc: BadRequestSchema, value: { fieldViolations: [{ field: "tool", description: "x" }] } },
      ]),
    );
    status.set("grpc-status", "0");
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers(Object.fromEntries(status)));
      stream.end(envelope(denyBytes()));
    };
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unavailable", detail: "going away" });
  });

  test("an answer without any status is an error", async () => {
    handler = (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" });
      stream.end(envelope(denyBytes()));
    };
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "internal" });
  });

  test("a stream the server refuses is UNAVAILABLE", async () => {
    handler = (stream) => stream.close(h2.NGHTTP2_REFUSED_STREAM);
    await assert.rejects(client.decide({ caller, tool: "a__b" }), { name: "CapgateError", code: "unavailable" });
  });

  test("a call given up on is CANCELLED, and its stream reset on the wire", async () => {
    handler = () => undefined; // never answers
    const controller = new AbortController();
    const before = resets.length;
    setTimeout(() => controller.abort(), 50);
    await assert.rejects(client.decide({ caller, tool: "a__b" }, { signal: controller.signal }), { name: "CapgateError", code: "cancelled" });
    for (let i = 0; i < 50 && resets.length === before; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(resets.at(-1), h2.NGHTTP2_CANCEL);
  });

  test("past the deadline the call is DEADLINE_EXCEEDED and its stream reset", async () => {
    handler = () => undefined;
    const before = resets.length;
    const started = Date.now();
    await assert.rejects(client.decide({ caller, tool: "a__b" }, { timeoutMs: 100 }), {
      name: "CapgateError",
      code: "deadline_exceeded",
      detail: "the operation timed out",
    });
    assert.ok(Date.now() - started < 1000);
    for (let i = 0; i < 50 && resets.length === before; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(resets.at(-1), h2.NGHTTP2_CANCEL);
  });

  test("after all that the connection still serves calls", async () => {
    handler = (stream) => answer(stream, envelope(denyBytes()));
    assert.equal((await client.decide({ caller, tool: "a__b" })).result.kind, "deny");
  });
});
