//! The deny shape of the contract: code, message and data for every kind of refusal.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { CapgateError, CapgateProtocolError, type DecideAnswer } from "@capgate/client";
import { capgateUnavailable, credentialFailed, refusalOf, upstreamFailed } from "./refusals.js";

const answer = (result: DecideAnswer["result"]): DecideAnswer => ({
  decisionId: "0193-d",
  policyVersion: "sha256:ab",
  policyRevision: 3,
  result,
});

test("an allow is no refusal", () => {
  const allow = answer({
    kind: "allow",
    reason: { code: "granted", pointer: "/grants/0", subject: "x", message: "ok" },
    account: { id: "a", secretRef: "env://A" },
  });
  assert.equal(refusalOf(allow, new Date()), undefined);
});

test("a deny is -32001 with the reason code, pointer and decision id", () => {
  const refusal = refusalOf(
    answer({
      kind: "deny",
      reason: { code: "no_grant_matches", pointer: "/grants", subject: "x.y", message: "no grant gives `x.y`" },
    }),
    new Date(),
  );
  assert.equal(refusal?.code, -32001);
  assert.equal(refusal?.message, "denied: no_grant_matches: no grant gives `x.y`");
  assert.deepEqual(refusal?.data, {
    code: "no_grant_matches",
    message: "no grant gives `x.y`",
    pointer: "/grants",
    decision_id: "0193-d",
  });
});

test("limit_exhausted carries retry_after_seconds (rounded up) and resets_at", () => {
  const refusal = refusalOf(
    answer({
      kind: "deny",
      reason: { code: "limit_exhausted", pointer: "/grants/2", subject: "x.y", message: "used up" },
      resetsAt: new Date("2026-12-01T10:00:00.000Z"),
    }),
    new Date("2026-12-01T09:59:18.500Z"),
  );
  assert.equal(refusal?.data.retry_after_seconds, 42);
  assert.equal(refusal?.data.resets_at, "2026-12-01T10:00:00.000Z");
});

test("unauthenticated carries the problem; an unknown tool is -32602", () => {
  const unauth = refusalOf(answer({ kind: "unauthenticated", problem: "credential_invalid", message: "bad" }), new Date());
  assert.equal(unauth?.code, -32001);
  assert.equal(unauth?.message, "denied: unauthenticated: bad");
  assert.deepEqual(unauth?.data, { code: "unauthenticated", problem: "credential_invalid", message: "bad", decision_id: "0193-d" });
  const unknown = refusalOf(answer({ kind: "unknown_tool", name: "a__b", message: "no tool `a__b`" }), new Date());
  assert.equal(unknown?.code, -32602);
  assert.deepEqual(unknown?.data, { code: "unknown_tool", message: "no tool `a__b`", decision_id: "0193-d" });
});

test("capgate unreachable, late or unreadable is capgate_unavailable", () => {
  const late = capgateUnavailable(new CapgateError("deadline_exceeded", "the operation timed out", [], undefined));
  assert.equal(late.code, -32001);
  assert.equal(late.data.code, "capgate_unavailable");
  assert.match(late.message, /^denied: capgate_unavailable: capgate did not answer in time$/);
  const bad = capgateUnavailable(
    new CapgateError("invalid_argument", "`tool`: too long", [{ field: "tool", description: "too long", reason: "" }], undefined),
  );
  assert.deepEqual(bad.data.field_violations, [{ field: "tool", description: "too long" }]);
  assert.equal(capgateUnavailable(new CapgateProtocolError("no result")).data.code, "capgate_unavailable");
});

test("credential_failed is -32002 and upstream_failed -32003, both with the decision id", () => {
  const cred = credentialFailed("d1", "no resolver for scheme `gcp-secrets`");
  assert.equal(cred.code, -32002);
  assert.equal(cred.message, "denied: credential_failed: no resolver for scheme `gcp-secrets`");
  assert.deepEqual(cred.data, { code: "credential_failed", message: "no resolver for scheme `gcp-secrets`", decision_id: "d1" });
  const up = upstreamFailed("d2", "cannot open a session");
  assert.equal(up.code, -32003);
  assert.equal(up.message, "denied: upstream_failed: cannot open a session");
  assert.equal(up.data.code, "upstream_failed");
  assert.equal(up.data.decision_id, "d2");
});
