//! DNS-rebinding protection (`HostCheck`) and the request-depth bound: the
//! same rules as the Python gateway's tests/test_edge.py.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { HostCheck } from "./hosts.js";
import { MAX_DEPTH, depthOf } from "./http.js";

test("a loopback bind answers to loopback names on any port", () => {
  const check = HostCheck.forBind("127.0.0.1", [], []);
  assert.ok(check !== undefined);
  for (const host of ["localhost", "LOCALHOST:8080", "127.0.0.1:3000", "[::1]:9", "[::1]"]) assert.ok(check.hostAllowed(host), host);
  for (const host of ["evil.example.com", "evil.example.com:8080", "localhost.evil.example.com", "127.0.0.2", "", undefined]) {
    assert.ok(!check.hostAllowed(host), String(host));
  }
  assert.ok(check.originAllowed(undefined) && check.originAllowed("http://localhost:5173"));
  assert.ok(!check.originAllowed("http://evil.example.com") && !check.originAllowed("null"));
});

test("allowed hosts replace the defaults, and a routable bind has none", () => {
  const check = HostCheck.forBind("0.0.0.0", ["mcp.internal", "gw.example.com:8443"], ["https://console.example.com/"]);
  assert.ok(check !== undefined);
  assert.ok(check.hostAllowed("mcp.internal:1") && check.hostAllowed("gw.example.com:8443"));
  assert.ok(!check.hostAllowed("gw.example.com:80") && !check.hostAllowed("localhost"));
  assert.ok(check.originAllowed("https://console.example.com") && check.originAllowed("http://mcp.internal"));
  assert.ok(!check.originAllowed("https://evil.example.com"));
  assert.equal(HostCheck.forBind("0.0.0.0", [], []), undefined);
  assert.ok(HostCheck.forBind("::1", [], []) !== undefined && HostCheck.forBind("localhost", [], []) !== undefined);
});

test("depth is counted without recursion and stops past the bound", () => {
  assert.equal(depthOf(1), 0);
  assert.equal(depthOf({ a: [1, { b: 2 }] }), 3);
  let deep: unknown = 1;
  for (let i = 0; i < 100_000; i++) deep = [deep];
  assert.equal(depthOf(deep), MAX_DEPTH + 1);
});
