//! gRPC errors become CapgateError with the google.rpc details they carried.
//! (The same decoding against a real capgate's INVALID_ARGUMENT is in
//! capgate.test.ts; ErrorInfo is checked here because capgate sends none yet.)

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { CapgateError, CapgateProtocolError, decodeError } from "./errors.js";

test("BadRequest field violations and ErrorInfo are decoded", () => {
  const error = new ConnectError("`tool`: over 512 bytes", Code.InvalidArgument, undefined, [
    {
      desc: BadRequestSchema,
      value: create(BadRequestSchema, { fieldViolations: [{ field: "tool", description: "over 512 bytes" }] }),
    },
    {
      desc: ErrorInfoSchema,
      value: create(ErrorInfoSchema, { reason: "TOO_LONG", domain: "capgate", metadata: { limit: "512" } }),
    },
  ]);
  const decoded = decodeError(error);
  assert.ok(decoded instanceof CapgateError);
  assert.equal(decoded.code, "invalid_argument");
  assert.equal(decoded.detail, "`tool`: over 512 bytes");
  assert.deepEqual(decoded.fieldViolations, [{ field: "tool", description: "over 512 bytes", reason: "" }]);
  assert.deepEqual(decoded.errorInfo, { reason: "TOO_LONG", domain: "capgate", metadata: { limit: "512" } });
});

test("an error without details has none, and a protocol error passes through", () => {
  const decoded = decodeError(new ConnectError("no policy", Code.Unavailable));
  assert.ok(decoded instanceof CapgateError);
  assert.equal(decoded.code, "unavailable");
  assert.deepEqual(decoded.fieldViolations, []);
  assert.equal(decoded.errorInfo, undefined);
  const protocol = new CapgateProtocolError("x");
  assert.equal(decodeError(protocol), protocol);
});
