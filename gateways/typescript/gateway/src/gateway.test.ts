//! What the gateway sends capgate and shows agents, with capgate's answers
//! made up: every call's arguments go as `arguments_json` (`{}` when absent),
//! arguments over what capgate reads are refused before any Decide, condition
//! denials keep their pointer, and a conditional tool says so when listed.
//! e2e.test.ts does the same against a real `capgate serve`.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import type { CapgateClient, DecideAnswer, DecideRequest, ListVisibleAnswer, VisibleTool } from "@capgate/client";
import { CONDITIONAL_MARK, Gateway, argumentsJson, mcpTool } from "./gateway.js";
import { MemoryLogger } from "./log.js";
import { MAX_ARGUMENTS_BYTES, Refusal } from "./refusals.js";
import type { SecretResolver } from "./secrets/index.js";
import type { UpstreamPool } from "./upstreams.js";

const CALLER = { bearerToken: "t" } as const;

/** A capgate that records each Decide and denies it with `reason`. */
function recordingCapgate(code: "condition_failed" | "arguments_missing", pointer: string) {
  const decided: DecideRequest[] = [];
  const answer: DecideAnswer = {
    decisionId: "0193-d",
    policyVersion: "sha256:ab",
    policyRevision: 2,
    result: { kind: "deny", reason: { code, pointer, subject: "amount", message: `the condition at ${pointer} fails` } },
  };
  const capgate = {
    decide: async (request: DecideRequest) => {
      decided.push(request);
      return answer;
    },
  } as unknown as CapgateClient;
  return { capgate, decided };
}

function gatewayWith(capgate: CapgateClient): Gateway {
  return new Gateway({
    capgate,
    secrets: {} as SecretResolver,
    upstreams: {} as UpstreamPool,
    logger: new MemoryLogger(),
  });
}

async function refusal(call: Promise<unknown>): Promise<Refusal> {
  try {
    await call;
  } catch (error) {
    assert.ok(error instanceof Refusal, `expected a refusal, got ${String(error)}`);
    return error;
  }
  assert.fail("the call was expected to be refused");
}

test("every Decide carries the call's arguments as JSON text, {} when absent", async () => {
  const { capgate, decided } = recordingCapgate("condition_failed", "/grants/0/when/0");
  const gateway = gatewayWith(capgate);
  const args = { amount: 150, currency: "EUR", note: "über → 𝄞", nested: { a: [1, 2.5, null, true] } };
  await refusal(gateway.callTool(CALLER, "payments__refund", args));
  await refusal(gateway.callTool(CALLER, "payments__refund", undefined));
  await refusal(gateway.callTool(CALLER, "payments__refund", {}));
  assert.deepEqual(
    decided.map((d) => d.argumentsJson),
    [JSON.stringify(args), "{}", "{}"],
  );
  assert.deepEqual(JSON.parse(decided[0]?.argumentsJson ?? ""), args);
});

test("a condition's denial is -32001 naming the reason, with the condition's pointer", async () => {
  for (const [code, pointer] of [
    ["condition_failed", "/grants/0/when/0"],
    ["arguments_missing", "/grants/0/when/1"],
  ] as const) {
    const { capgate } = recordingCapgate(code, pointer);
    const refused = await refusal(gatewayWith(capgate).callTool(CALLER, "payments__refund", { amount: 1 }));
    assert.equal(refused.code, -32001);
    assert.equal(refused.message, `denied: ${code}: the condition at ${pointer} fails`);
    assert.deepEqual(refused.data, {
      code,
      message: `the condition at ${pointer} fails`,
      pointer,
      decision_id: "0193-d",
    });
  }
});

test("arguments over 64 KiB of JSON are refused -32602 by the gateway, and capgate is not asked", async () => {
  const { capgate, decided } = recordingCapgate("condition_failed", "/grants/0/when/0");
  const gateway = gatewayWith(capgate);
  // {"text":"…"} is 11 bytes around the text; "é" is 2 bytes of UTF-8.
  const atTheBound = { text: `${"é".repeat((MAX_ARGUMENTS_BYTES - 12) / 2)}x` };
  assert.equal(Buffer.byteLength(JSON.stringify(atTheBound)), MAX_ARGUMENTS_BYTES);
  await refusal(gateway.callTool(CALLER, "payments__refund", atTheBound));
  assert.equal(decided.length, 1, "arguments of exactly 64 KiB are asked about");

  const over = { text: `${atTheBound.text}x` };
  const refused = await refusal(gateway.callTool(CALLER, "payments__refund", over));
  assert.equal(decided.length, 1, "capgate was asked about arguments over the bound");
  assert.equal(refused.code, -32602);
  assert.match(refused.message, /^denied: arguments_too_large: the call's arguments are 65537 bytes/);
  assert.deepEqual(Object.keys(refused.data).sort(), ["code", "message"]);
  assert.equal(refused.data.code, "arguments_too_large");
  assert.throws(() => argumentsJson(over), Refusal);
});

test("a conditional tool says so in its description; others are listed as the catalog has them", async () => {
  const tool = (name: string, description: string, conditional: boolean): VisibleTool => ({
    exposedName: `payments__${name}`,
    upstream: "payments",
    name,
    capability: "billing.refund.create",
    description,
    inputSchemaJson: "",
    conditional,
  });
  const listing: ListVisibleAnswer = {
    policyVersion: "sha256:ab",
    policyRevision: 2,
    result: {
      kind: "visible",
      capabilities: [],
      tools: [tool("refund", "Issue a refund", true), tool("bare", "", true), tool("lookup", "Find a payment", false)],
    },
  };
  const capgate = { listVisible: async () => listing } as unknown as CapgateClient;
  const tools = await gatewayWith(capgate).listTools(CALLER);
  assert.deepEqual(
    tools.map((t) => t.description),
    [`Issue a refund (${CONDITIONAL_MARK})`, CONDITIONAL_MARK, "Find a payment"],
  );
  assert.equal(CONDITIONAL_MARK, "Calls may be refused depending on their arguments or time.");
  assert.equal(mcpTool(tool("x", "", false)).description, undefined);
});
