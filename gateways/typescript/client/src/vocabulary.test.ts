//! The enum names are the audit's strings: checked against the proto's full names.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { AuthProblem, AuthProblemSchema, NoteKind, ReasonCode, ReasonCodeSchema } from "./gen/capgate/v1/decisions_pb.js";
import { REASON_CODE_NAMES, authProblemName, noteKindValue, reasonCodeName } from "./vocabulary.js";

test("every reason code is its proto name without the prefix, lowercased", () => {
  for (const value of ReasonCodeSchema.values) {
    assert.equal(reasonCodeName(value.number), value.name.replace(/^REASON_CODE_/, "").toLowerCase());
  }
  assert.equal(reasonCodeName(ReasonCode.NO_GRANT_MATCHES), "no_grant_matches");
  assert.equal(reasonCodeName(ReasonCode.LIMIT_EXHAUSTED), "limit_exhausted");
  assert.equal(reasonCodeName(ReasonCode.CONDITION_FAILED), "condition_failed");
  assert.equal(reasonCodeName(ReasonCode.ARGUMENTS_MISSING), "arguments_missing");
});

test("the named reason codes are exactly the proto's, less its zero value", () => {
  const proto = ReasonCodeSchema.values
    .filter((v) => v.number !== ReasonCode.UNSPECIFIED)
    .map((v) => v.name.replace(/^REASON_CODE_/, "").toLowerCase());
  assert.deepEqual([...REASON_CODE_NAMES], proto);
});

test("every auth problem is its proto name without the prefix, lowercased", () => {
  for (const value of AuthProblemSchema.values) {
    assert.equal(authProblemName(value.number), value.name.replace(/^AUTH_PROBLEM_/, "").toLowerCase());
  }
  assert.equal(authProblemName(AuthProblem.CREDENTIAL_INVALID), "credential_invalid");
});

test("a number the proto does not know reads as unspecified", () => {
  assert.equal(reasonCodeName(99 as ReasonCode), "unspecified");
  assert.equal(authProblemName(99 as AuthProblem), "unspecified");
});

test("note kinds map to the proto's values", () => {
  assert.equal(noteKindValue("credential_failed"), NoteKind.CREDENTIAL_FAILED);
  assert.equal(noteKindValue("upstream_failed"), NoteKind.UPSTREAM_FAILED);
});
