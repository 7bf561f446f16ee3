//! The two ways a capgate call fails: the service answered with a gRPC error
//! (`CapgateError`, with the `google.rpc` details it carried in
//! `grpc-status-details-bin`), or it answered something this client cannot
//! read as the proto promises (`CapgateProtocolError`). A deny is neither: it
//! is a normal answer.

import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** gRPC status codes, lowercase as in the gRPC spec's names. */
export type GrpcCode =
  | "cancelled"
  | "unknown"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "aborted"
  | "out_of_range"
  | "unimplemented"
  | "internal"
  | "unavailable"
  | "data_loss"
  | "unauthenticated";

const GRPC_CODES: Record<Code, GrpcCode> = {
  [Code.Canceled]: "cancelled",
  [Code.Unknown]: "unknown",
  [Code.InvalidArgument]: "invalid_argument",
  [Code.DeadlineExceeded]: "deadline_exceeded",
  [Code.NotFound]: "not_found",
  [Code.AlreadyExists]: "already_exists",
  [Code.PermissionDenied]: "permission_denied",
  [Code.ResourceExhausted]: "resource_exhausted",
  [Code.FailedPrecondition]: "failed_precondition",
  [Code.Aborted]: "aborted",
  [Code.OutOfRange]: "out_of_range",
  [Code.Unimplemented]: "unimplemented",
  [Code.Internal]: "internal",
  [Code.Unavailable]: "unavailable",
  [Code.DataLoss]: "data_loss",
  [Code.Unauthenticated]: "unauthenticated",
};

/** One entry of a `google.rpc.BadRequest`: the request field and what is wrong with it. */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
  /** Empty when the server gives none. */
  readonly reason: string;
}

/** A `google.rpc.ErrorInfo`. */
export interface ErrorInfo {
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Readonly<Record<string, string>>;
}

/** capgate answered the call with a gRPC error (or the call never reached it). */
export class CapgateError extends Error {
  override readonly name = "CapgateError";

  constructor(
    /** The gRPC status. `unavailable` also covers "could not connect". */
    readonly code: GrpcCode,
    /** The status message as the server wrote it (or the transport's, for local failures). */
    readonly detail: string,
    /** From a `google.rpc.BadRequest` detail; empty when there was none. */
    readonly fieldViolations: readonly FieldViolation[],
    /** From a `google.rpc.ErrorInfo` detail, when there was one. */
    readonly errorInfo: ErrorInfo | undefined,
  ) {
    super(`${code}: ${detail}`);
  }
}

/** capgate's answer broke the proto's promise (e.g. a oneof that must be set was not). */
export class CapgateProtocolError extends Error {
  override readonly name = "CapgateProtocolError";
}

/** Turns whatever a generated client threw into a `CapgateError` (protocol errors pass through). */
export function decodeError(error: unknown): Error {
  if (error instanceof CapgateProtocolError || error instanceof CapgateError) return error;
  const connect = ConnectError.from(error);
  const violations = connect
    .findDetails(BadRequestSchema)
    .flatMap((bad) => bad.fieldViolations)
    .map(({ field, description, reason }) => ({ field, description, reason }));
  const [info] = connect.findDetails(ErrorInfoSchema);
  const errorInfo =
    info === undefined
      ? undefined
      : { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
  return new CapgateError(GRPC_CODES[connect.code], connect.rawMessage, violations, errorInfo);
}
