//! Which POSTs the direct path answers (`directCall`): a 2025-era `tools/call` the SDK would
//! dispatch to the tools/call handler, and nothing else. callpath.test.ts checks against the
//! real gateway that what is left to the SDK gets the SDK's answer.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { directCall } from "./http.js";

const HEADERS = { "content-type": "application/json", accept: "application/json, text/event-stream" };
const CALL = { jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: "up__echo", arguments: { text: "hi" } } };

test("a tools/call with a string or integer id, a name, and arguments absent or an object is taken", () => {
  assert.deepEqual(directCall(HEADERS, CALL), { id: 7, name: "up__echo", arguments: { text: "hi" } });
  assert.deepEqual(directCall(HEADERS, { ...CALL, id: "a-1", params: { name: "up__echo" } }), {
    id: "a-1",
    name: "up__echo",
    arguments: undefined,
  });
  for (const progressToken of [3, "p-1"]) {
    const progress = { ...CALL, params: { ...CALL.params, _meta: { progressToken } } };
    assert.equal(directCall(HEADERS, progress)?.name, "up__echo");
  }
  assert.equal(directCall(HEADERS, { ...CALL, params: { ...CALL.params, _meta: {} } })?.name, "up__echo");
  for (const headers of [
    { ...HEADERS, "content-type": "application/json; charset=utf-8" },
    { ...HEADERS, accept: "text/event-stream, application/json;q=0.9" },
    { ...HEADERS, "mcp-protocol-version": "2025-06-18" },
    { ...HEADERS, "mcp-protocol-version": "2025-11-25" },
  ]) {
    assert.equal(directCall(headers, CALL)?.id, 7, JSON.stringify(headers));
  }
});

test("headers the SDK would refuse, or that name another revision, leave the request to it", () => {
  for (const headers of [
    { accept: HEADERS.accept },
    { ...HEADERS, "content-type": "text/plain" },
    { ...HEADERS, accept: "application/json" },
    { ...HEADERS, accept: "text/event-stream" },
    { ...HEADERS, accept: "*/*" },
    { "content-type": HEADERS["content-type"] },
    { ...HEADERS, "mcp-protocol-version": "2026-07-28" },
    { ...HEADERS, "mcp-protocol-version": "1999-01-01" },
  ]) {
    assert.equal(directCall(headers, CALL), undefined, JSON.stringify(headers));
  }
});

test("anything but one well-formed tools/call request is left to the SDK", () => {
  const bodies: unknown[] = [
    [CALL],
    null,
    "tools/call",
    { ...CALL, jsonrpc: "1.0" },
    { ...CALL, method: "tools/list" },
    { ...CALL, id: null },
    { ...CALL, id: undefined },
    { ...CALL, id: 1.5 },
    { ...CALL, id: { a: 1 } },
    { ...CALL, params: undefined },
    { ...CALL, params: [] },
    { ...CALL, params: { arguments: {} } },
    { ...CALL, params: { name: 7 } },
    { ...CALL, params: { name: "up__echo", arguments: [1] } },
    { ...CALL, params: { name: "up__echo", arguments: null } },
    { ...CALL, params: { name: "up__echo", arguments: "{}" } },
    { ...CALL, params: { name: "up__echo", task: { ttl: 1 } } },
    { ...CALL, params: { name: "up__echo", _meta: "x" } },
    { ...CALL, params: { name: "up__echo", _meta: { "io.modelcontextprotocol/protocolVersion": "2026-07-28" } } },
    { ...CALL, params: { name: "up__echo", _meta: { progressToken: [1] } } },
    { ...CALL, params: { name: "up__echo", _meta: { progressToken: 1.5 } } },
    { ...CALL, params: { name: "up__echo", _meta: { progressToken: null } } },
    { ...CALL, params: { name: "up__echo", _meta: { "io.modelcontextprotocol/related-task": { taskId: 1 } } } },
    { ...CALL, params: { name: "up__echo", _meta: { "com.example/trace": "t" } } },
  ];
  for (const body of bodies) assert.equal(directCall(HEADERS, body), undefined, JSON.stringify(body));
});
