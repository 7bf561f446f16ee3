//! The `--relay` file: read as the policy writes transports, refused with the
//! reason otherwise (the same cases as the Python gateway's tests/test_edge.py),
//! and prompt names split like exposed tool names.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { RelayConfigError, parseRelayConfig, promptRoute, type Reach } from "./relay.js";

test("a relay file is read as the policy writes transports", () => {
  const upstreams = parseRelayConfig(
    JSON.stringify({
      upstreams: [
        { id: "docs", transport: { kind: "mcp-http", url: "https://docs.example.com/mcp" }, relay: ["resources"] },
        { id: "fs", transport: { kind: "mcp-stdio", command: "fs-server", args: ["/srv"] }, relay: ["prompts", "logging"] },
      ],
    }),
  );
  assert.deepEqual(
    upstreams.map((u) => u.id),
    ["docs", "fs"],
  );
  assert.deepEqual(upstreams[0]?.transport, { kind: "http", url: "https://docs.example.com/mcp" });
  assert.deepEqual(upstreams[1]?.transport, { kind: "stdio", command: "fs-server", args: ["/srv"] });
  assert.deepEqual([...(upstreams[1]?.features ?? [])].sort(), ["logging", "prompts"]);
});

test("a relay file that cannot be used says why", () => {
  const http = { kind: "mcp-http", url: "http://x" };
  const cases: Array<[unknown, RegExp]> = [
    [[], /the file must be an object/],
    [{ upstreams: {} }, /`upstreams` must be a list/],
    [{ upstream: [] }, /unknown field `upstream`/],
    [{ upstreams: [{ id: "a_b", transport: http, relay: [] }] }, /no `_`/],
    [{ upstreams: [{ id: "a", transport: http, relay: ["tools"] }] }, /relay must list some of/],
    [{ upstreams: [{ id: "a", transport: { kind: "mcp-sse", url: "http://x" }, relay: [] }] }, /kind must be/],
    [{ upstreams: [{ id: "a", transport: { kind: "mcp-http", url: "ftp://x" }, relay: [] }] }, /http\(s\) URL/],
    [{ upstreams: [{ id: "a", transport: { kind: "mcp-stdio", command: "" }, relay: [] }] }, /needs `command`/],
    [{ upstreams: [{ id: "a", transport: http, relay: [] }, { id: "a", transport: http, relay: [] }] }, /named twice/],
  ];
  for (const [document, message] of cases) {
    assert.throws(() => parseRelayConfig(JSON.stringify(document)), (error: unknown) => {
      assert.ok(error instanceof RelayConfigError);
      assert.match(error.message, message);
      return true;
    });
  }
});

test("a prompt name is `<upstream>__<prompt>`, of an upstream the caller reaches", () => {
  const reach = { upstream: { id: "everything" } } as Reach;
  assert.deepEqual(promptRoute([reach], "everything__args-prompt"), { reach, inner: "args-prompt" });
  assert.deepEqual(promptRoute([reach], "everything__a__b"), { reach, inner: "a__b" });
  for (const name of ["args-prompt", "other__args-prompt", "everything__", "__x"]) assert.equal(promptRoute([reach], name), undefined);
});
