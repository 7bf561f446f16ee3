//! Answers become typed values, and an answer the proto does not allow is refused.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  DecideResponseSchema,
  ListVisibleResponseSchema,
  Outcome,
  ReasonCode,
  AuthProblem,
} from "./gen/capgate/v1/decisions_pb.js";
import { CapgateProtocolError } from "./errors.js";
import { decideAnswer, listVisibleAnswer } from "./results.js";

const common = { decisionId: "0193-id", policyVersion: "sha256:ab", policyRevision: 7n, at: timestampFromMs(1_000) };

test("an allow carries the account, limits and the tool's route", () => {
  const answer = decideAnswer(
    create(DecideResponseSchema, {
      ...common,
      result: {
        case: "decision",
        value: {
          outcome: Outcome.ALLOW,
          reason: { code: ReasonCode.GRANTED, path: "/grants/0", message: "granted" },
          account: { id: "bot", secretRef: "env://BOT" },
          limits: { calls: 10n, per: "1h", windowMs: 3_600_000n, remaining: 9n, resetsAt: timestampFromMs(5_000) },
          tool: {
            exposedName: "up__echo",
            upstream: "up",
            name: "echo",
            capability: "x.y",
            transport: { kind: { case: "stdio", value: { command: "node", args: ["u.js"] } } },
          },
        },
      },
    }),
  );
  assert.equal(answer.policyRevision, 7);
  assert.deepEqual(answer.at, new Date(1_000));
  assert.equal(answer.result.kind, "allow");
  if (answer.result.kind !== "allow") return;
  assert.deepEqual(answer.result.account, { id: "bot", secretRef: "env://BOT" });
  assert.deepEqual(answer.result.limits, { calls: 10, per: "1h", windowMs: 3_600_000, remaining: 9, resetsAt: new Date(5_000) });
  assert.deepEqual(answer.result.tool?.transport, { kind: "stdio", command: "node", args: ["u.js"] });
  assert.equal(answer.result.reason.code, "granted");
});

test("a deny carries its reason and, for limit_exhausted, when the window ends", () => {
  const answer = decideAnswer(
    create(DecideResponseSchema, {
      ...common,
      result: {
        case: "decision",
        value: {
          outcome: Outcome.DENY,
          reason: { code: ReasonCode.LIMIT_EXHAUSTED, path: "/grants/3", subject: "a.b", message: "used up" },
          resetsAt: timestampFromMs(60_000),
        },
      },
    }),
  );
  assert.deepEqual(answer.result, {
    kind: "deny",
    reason: { code: "limit_exhausted", pointer: "/grants/3", subject: "a.b", message: "used up" },
    resetsAt: new Date(60_000),
  });
});

test("unauthenticated and unknown_tool are answers of their own", () => {
  const unauth = decideAnswer(
    create(DecideResponseSchema, {
      ...common,
      result: { case: "unauthenticated", value: { problem: AuthProblem.CREDENTIAL_EXPIRED, message: "expired" } },
    }),
  );
  assert.deepEqual(unauth.result, { kind: "unauthenticated", problem: "credential_expired", message: "expired" });
  const unknown = decideAnswer(
    create(DecideResponseSchema, { ...common, result: { case: "unknownTool", value: { name: "a__b", message: "no" } } }),
  );
  assert.deepEqual(unknown.result, { kind: "unknown_tool", name: "a__b", message: "no" });
});

test("an unset result, an unspecified outcome or an allow without account is a protocol error", () => {
  assert.throws(() => decideAnswer(create(DecideResponseSchema, common)), CapgateProtocolError);
  assert.throws(
    () =>
      decideAnswer(
        create(DecideResponseSchema, {
          ...common,
          result: { case: "decision", value: { outcome: Outcome.UNSPECIFIED, reason: {} } },
        }),
      ),
    CapgateProtocolError,
  );
  assert.throws(
    () =>
      decideAnswer(
        create(DecideResponseSchema, {
          ...common,
          result: { case: "decision", value: { outcome: Outcome.ALLOW, reason: { code: ReasonCode.GRANTED } } },
        }),
      ),
    CapgateProtocolError,
  );
  assert.throws(
    () =>
      decideAnswer(
        create(DecideResponseSchema, {
          ...common,
          result: {
            case: "decision",
            value: {
              outcome: Outcome.ALLOW,
              reason: { code: ReasonCode.GRANTED },
              account: { id: "a" },
              tool: { exposedName: "u__t" },
            },
          },
        }),
      ),
    /no transport/,
  );
  assert.throws(() => listVisibleAnswer(create(ListVisibleResponseSchema, {})), CapgateProtocolError);
});

test("a listing keeps the tools in order with their schema text untouched", () => {
  const answer = listVisibleAnswer(
    create(ListVisibleResponseSchema, {
      policyVersion: "sha256:ab",
      policyRevision: 2n,
      result: {
        case: "visible",
        value: {
          capabilities: [
            { capability: "x.y", account: { id: "a", secretRef: "env://A" }, path: "/grants/0", decisionId: "d", conditional: true },
          ],
          tools: [
            { exposedName: "u__b", upstream: "u", name: "b", capability: "x.y", description: "", inputSchemaJson: "" },
            {
              exposedName: "u__a",
              upstream: "u",
              name: "a",
              capability: "x.y",
              description: "A",
              inputSchemaJson: '{"type":"object"}',
              conditional: true,
            },
          ],
        },
      },
    }),
  );
  assert.equal(answer.result.kind, "visible");
  if (answer.result.kind !== "visible") return;
  assert.deepEqual(answer.result.tools.map((t) => t.exposedName), ["u__b", "u__a"]);
  assert.equal(answer.result.tools[1]?.inputSchemaJson, '{"type":"object"}');
  // Conditions' mark: the listing does not evaluate them, it says they exist.
  assert.deepEqual(answer.result.tools.map((t) => t.conditional), [false, true]);
  assert.equal(answer.result.capabilities[0]?.conditional, true);
  assert.deepEqual(answer.result.capabilities[0]?.account, { id: "a", secretRef: "env://A" });
  // The wire's `path` is the caller's `pointer`, the name refusals and AuthZEN use.
  assert.equal(answer.result.capabilities[0]?.pointer, "/grants/0");
});
