//! Every way the gateway refuses a call, as the JSON-RPC error the contract
//! fixes, each with `message` = "denied: <code>: <human message>" (the shared
//! contract, gateways/README.md): capgate's deny (-32001), an unknown tool (-32602), a secret that
//! cannot be resolved (-32002), an upstream that fails (-32003), capgate
//! unreachable or unreadable (-32001, fail closed). The SDK sends a thrown
//! error's `code`, `message` and `data` as they are.

import { CapgateError, type DecideAnswer } from "@capgate/client";

export const JSONRPC_DENIED = -32001;
export const JSONRPC_UNKNOWN_TOOL = -32602;
export const JSONRPC_CREDENTIAL_FAILED = -32002;
export const JSONRPC_UPSTREAM_FAILED = -32003;
export const JSONRPC_INVALID_REQUEST = -32600;
/** The call's own params cannot be asked about: arguments over what capgate reads. */
export const JSONRPC_INVALID_PARAMS = -32602;

/** The most capgate reads of a call's arguments (`DecideRequest.arguments_json`), as UTF-8 JSON. */
export const MAX_ARGUMENTS_BYTES = 64 * 1024;

export type RefusalData = Record<string, string | number | ReadonlyArray<Record<string, string>>>;

/** A JSON-RPC error the gateway answers with. Never carries a secret. */
export class Refusal extends Error {
  override readonly name = "Refusal";
  constructor(
    readonly code: number,
    message: string,
    readonly data: RefusalData,
  ) {
    super(message);
  }
}

function denied(data: RefusalData & { code: string; message: string }): Refusal {
  return new Refusal(JSONRPC_DENIED, `denied: ${data.code}: ${data.message}`, data);
}

/**
 * The refusal for a non-allow answer, `undefined` for an allow. `now` gives
 * `retry_after_seconds` for `limit_exhausted` (whole seconds, rounded up, so
 * a retry at that time is never early).
 */
export function refusalOf(answer: DecideAnswer, now: Date): Refusal | undefined {
  const { decisionId, result } = answer;
  switch (result.kind) {
    case "allow":
      return undefined;
    case "deny": {
      const { code, message, pointer } = result.reason;
      const data: RefusalData & { code: string; message: string } = {
        code,
        message,
        pointer,
        decision_id: decisionId,
      };
      if (code === "limit_exhausted" && result.resetsAt !== undefined) {
        data.retry_after_seconds = Math.max(0, Math.ceil((result.resetsAt.getTime() - now.getTime()) / 1000));
        data.resets_at = result.resetsAt.toISOString();
      }
      return denied(data);
    }
    case "unauthenticated":
      return denied({
        code: "unauthenticated",
        problem: result.problem,
        message: result.message,
        decision_id: decisionId,
      });
    case "unknown_tool":
      return new Refusal(JSONRPC_UNKNOWN_TOOL, `denied: unknown_tool: ${result.message}`, {
        code: "unknown_tool",
        message: result.message,
        decision_id: decisionId,
      });
  }
}

/** capgate could not be asked, or its answer could not be read: refuse (fail closed). */
export function capgateUnavailable(error: unknown): Refusal {
  let message: string;
  const data: RefusalData & { code: string; message: string } = { code: "capgate_unavailable", message: "" };
  if (error instanceof CapgateError) {
    message =
      error.code === "deadline_exceeded"
        ? "capgate did not answer in time"
        : `capgate: ${error.code}: ${error.detail}`;
    if (error.fieldViolations.length > 0) {
      data.field_violations = error.fieldViolations.map(({ field, description }) => ({ field, description }));
    }
  } else {
    message = `capgate's answer could not be read: ${error instanceof Error ? error.message : String(error)}`;
  }
  data.message = message;
  return denied(data);
}

/**
 * The call's arguments are more than capgate reads: refused here, before any
 * Decide, so no decision is made and none is audited.
 */
export function argumentsTooLarge(size: number): Refusal {
  const message = `the call's arguments are ${size} bytes as JSON, more than the ${MAX_ARGUMENTS_BYTES} capgate decides on`;
  return new Refusal(JSONRPC_INVALID_PARAMS, `denied: arguments_too_large: ${message}`, {
    code: "arguments_too_large",
    message,
  });
}

/** The allowed account's secret could not be resolved; nothing was executed. */
export function credentialFailed(decisionId: string, detail: string): Refusal {
  return new Refusal(JSONRPC_CREDENTIAL_FAILED, `denied: credential_failed: ${detail}`, {
    code: "credential_failed",
    message: detail,
    decision_id: decisionId,
  });
}

/** The upstream could not be reached or failed at transport level. */
export function upstreamFailed(decisionId: string, detail: string): Refusal {
  return new Refusal(JSONRPC_UPSTREAM_FAILED, `denied: upstream_failed: ${detail}`, {
    code: "upstream_failed",
    message: detail,
    decision_id: decisionId,
  });
}

/** A resource or prompt that no upstream the caller reaches serves, or that is not relayed. */
export function unknownTarget(kind: "resource" | "prompt", name: string, listingId: string): Refusal {
  const message = `no ${kind} \`${name}\` is relayed to this caller`;
  return new Refusal(JSONRPC_UNKNOWN_TOOL, `denied: unknown_${kind}: ${message}`, {
    code: `unknown_${kind}`,
    message,
    ...(listingId !== "" && { decision_id: listingId }),
  });
}

/** `tools/list` for a caller capgate could not identify. */
export function listingUnauthenticated(problem: string, message: string): Refusal {
  return denied({ code: "unauthenticated", problem, message });
}
