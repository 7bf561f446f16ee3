//! Mcp-Method / Mcp-Name must agree with the body when present.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { headerDisagreement } from "./headers.js";

const call = { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "up__echo", arguments: {} } };

test("absent headers, or headers that agree, pass", () => {
  assert.equal(headerDisagreement({ method: undefined, name: undefined }, call), undefined);
  assert.equal(headerDisagreement({ method: "tools/call", name: "up__echo" }, call), undefined);
  assert.equal(headerDisagreement({ method: "tools/list", name: undefined }, { ...call, method: "tools/list" }), undefined);
  const unicode = { ...call, params: { name: "up__über" } };
  const encoded = `=?base64?${Buffer.from("up__über").toString("base64")}?=`;
  assert.equal(headerDisagreement({ method: "tools/call", name: encoded }, unicode), undefined);
  assert.match(headerDisagreement({ method: "tools/call", name: encoded }, call) ?? "", /Mcp-Name/);
  assert.equal(
    headerDisagreement({ method: "resources/read", name: "file:///a" }, { method: "resources/read", params: { uri: "file:///a" } }),
    undefined,
  );
});

test("a method or name that differs from the body is a disagreement", () => {
  assert.match(headerDisagreement({ method: "tools/list", name: undefined }, call) ?? "", /Mcp-Method/);
  assert.match(headerDisagreement({ method: "tools/call", name: "up__other" }, call) ?? "", /Mcp-Name/);
  assert.match(headerDisagreement({ method: undefined, name: "up__echo" }, { ...call, method: "tools/list" }) ?? "", /Mcp-Name/);
  assert.match(headerDisagreement({ method: "tools/call", name: undefined }, [call]) ?? "", /single JSON-RPC message/);
});
