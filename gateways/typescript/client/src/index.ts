//! `@capgate/client`: a typed client for capgate's DecisionService and
//! PolicyService. Gateway authors import from here and write no protobuf.

export {
  createCapgateClient,
  type AssertedPrincipal,
  type CallSettings,
  type Caller,
  type CallerCredential,
  type CapgateClient,
  type ClientOptions,
  type DecideRequest,
  type ListVisibleRequest,
  type NoteDecisionRequest,
  type PublishRequest,
} from "./client.js";
export { CapgateError, CapgateProtocolError, type ErrorInfo, type FieldViolation, type GrpcCode } from "./errors.js";
export type {
  Account,
  ActivateResult,
  ActivePolicy,
  DecideAnswer,
  DecideResult,
  DecisionChange,
  DecisionSummary,
  Limits,
  ListVisibleAnswer,
  ListVisibleResult,
  PolicyDiagnostic,
  PolicyRevision,
  PolicyVersion,
  PublishResult,
  Reason,
  ToolRoute,
  Transport,
  VisibleCapability,
  VisibleTool,
} from "./results.js";
export { REASON_CODE_NAMES } from "./vocabulary.js";
export type { AuthProblemName, NoteKindName, ReasonCodeName } from "./vocabulary.js";
