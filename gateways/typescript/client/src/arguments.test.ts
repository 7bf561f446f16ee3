//! What `decide` puts on the wire for a call's arguments, seen by an
//! in-process gRPC DecisionService (Connect's Node adapter over HTTP/2): the
//! JSON text as given, and nothing at all without it. capgate.test.ts checks
//! what a real `capgate serve` decides with them.

import { strict as assert } from "node:assert";
import { createServer } from "node:http2";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  DecideResponseSchema,
  DecisionService,
  Outcome,
  ReasonCode,
  type DecideRequest,
} from "./gen/capgate/v1/decisions_pb.js";
import { createCapgateClient } from "./index.js";

test("decide sends argumentsJson as given, and leaves the field unset without it", async () => {
  const seen: DecideRequest[] = [];
  const server = createServer(
    connectNodeAdapter({
      grpc: true,
      routes: (router) =>
        router.service(DecisionService, {
          decide: (request) => {
            seen.push(request);
            return create(DecideResponseSchema, {
              decisionId: "0193-d",
              result: {
                case: "decision",
                value: {
                  outcome: Outcome.DENY,
                  reason: { code: ReasonCode.CONDITION_FAILED, path: "/grants/0/when/0", subject: "amount", message: "over" },
                },
              },
            });
          },
        }),
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = createCapgateClient({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
  try {
    const caller = { credential: { bearerToken: "t" } } as const;
    const answer = await client.decide({ caller, tool: "payments__refund", argumentsJson: '{"amount":150}' });
    assert.equal(answer.result.kind, "deny");
    if (answer.result.kind === "deny") {
      assert.equal(answer.result.reason.code, "condition_failed");
      assert.equal(answer.result.reason.pointer, "/grants/0/when/0");
    }
    await client.decide({ caller, tool: "payments__refund" });
    assert.deepEqual(
      seen.map((r) => r.argumentsJson),
      ['{"amount":150}', undefined],
    );
  } finally {
    client.close();
    await new Promise((resolve) => server.close(resolve));
  }
});
