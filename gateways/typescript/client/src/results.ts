//! capgate's answers as plain typed values: enums as the audit's lowercase
//! strings, uint64 as number, timestamps as Date, and every oneof as a
//! discriminated union. A oneof the proto requires but the answer leaves
//! unset (or sets to a case this build does not know) is a
//! `CapgateProtocolError`, so a caller that switches on `kind` fails closed.

import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { Ceiling, Diagnostic, PolicyVersion as PolicyVersionPb } from "./gen/capgate/v1/common_pb.js";
import {
  Outcome,
  type Account as AccountPb,
  type DecideResponse,
  type Limits as LimitsPb,
  type ListVisibleResponse,
  type PolicyRevision as PolicyRevisionPb,
  type Reason as ReasonPb,
  type Tool as ToolPb,
  type Unauthenticated,
} from "./gen/capgate/v1/decisions_pb.js";
import type {
  ActivatePolicyResponse,
  DecisionChange as DecisionChangePb,
  GetActivePolicyResponse,
  PublishPolicyResponse,
} from "./gen/capgate/v1/policies_pb.js";
import { CapgateProtocolError } from "./errors.js";
import { authProblemName, reasonCodeName, type AuthProblemName, type ReasonCodeName } from "./vocabulary.js";

export interface Reason {
  readonly code: ReasonCodeName;
  /**
   * RFC 6901 pointer into the policy artifact: the place to change. The name the gateways'
   * refusals and AuthZEN use; on the gRPC wire it is `Reason.path`.
   */
  readonly pointer: string;
  readonly subject: string;
  readonly position?: { readonly line: number; readonly column: number };
  /** One line for a person. Act on `code`, show `message`. */
  readonly message: string;
}

export interface Account {
  readonly id: string;
  /** Where the gateway finds the account's secret, e.g. "vault://…". Never the secret. */
  readonly secretRef: string;
}

export interface Limits {
  readonly calls: number;
  readonly per: string;
  readonly windowMs: number;
  readonly remaining: number;
  readonly resetsAt?: Date;
}

export type Transport =
  | { readonly kind: "stdio"; readonly command: string; readonly args: readonly string[] }
  | { readonly kind: "http"; readonly url: string };

/** The tool an allow is for, and how to reach its upstream. */
export interface ToolRoute {
  readonly exposedName: string;
  readonly upstream: string;
  /** The tool's name at its upstream. */
  readonly name: string;
  readonly capability: string;
  readonly transport: Transport;
}

/** What `Decide` said. A deny is an answer like any other. */
export type DecideResult =
  | {
      readonly kind: "allow";
      readonly reason: Reason;
      readonly account: Account;
      readonly limits?: Limits;
      /** Set when the target was a tool. */
      readonly tool?: ToolRoute;
    }
  | {
      readonly kind: "deny";
      readonly reason: Reason;
      /** limit_exhausted only: the earliest instant a retry can be allowed. */
      readonly resetsAt?: Date;
    }
  | { readonly kind: "unauthenticated"; readonly problem: AuthProblemName; readonly message: string }
  | { readonly kind: "unknown_tool"; readonly name: string; readonly message: string };

export interface DecideAnswer {
  /** UUIDv7; the audit record's key. */
  readonly decisionId: string;
  readonly policyVersion: string;
  readonly policyRevision: number;
  readonly at?: Date;
  readonly result: DecideResult;
}

export interface VisibleTool {
  readonly exposedName: string;
  readonly upstream: string;
  readonly name: string;
  readonly capability: string;
  /** Empty when the catalog has none. */
  readonly description: string;
  /** JSON text, untouched; empty when the catalog has none. */
  readonly inputSchemaJson: string;
  /**
   * Every grant that shows the tool carries conditions: a call may still be
   * denied on its arguments or its time (`condition_failed`, `arguments_missing`).
   */
  readonly conditional: boolean;
}

export interface VisibleCapability {
  readonly capability: string;
  readonly account?: Account;
  readonly limits?: { readonly calls: number; readonly per: string; readonly windowMs: number };
  /** The winning grant's pointer (the wire's `path`). */
  readonly pointer: string;
  readonly decisionId: string;
  /** Every grant that gives it carries conditions (see `VisibleTool.conditional`). */
  readonly conditional: boolean;
}

export type ListVisibleResult =
  | {
      readonly kind: "visible";
      readonly capabilities: readonly VisibleCapability[];
      readonly tools: readonly VisibleTool[];
    }
  | { readonly kind: "unauthenticated"; readonly problem: AuthProblemName; readonly message: string };

export interface ListVisibleAnswer {
  readonly policyVersion: string;
  readonly policyRevision: number;
  readonly at?: Date;
  readonly result: ListVisibleResult;
}

/** A policy version a replica decides on, as `WatchPolicy` streams it. */
export interface PolicyRevision {
  readonly policyRevision: number;
  readonly policyVersion: string;
  readonly installedAt?: Date;
}

export interface PolicyVersion {
  readonly revision: number;
  readonly version: string;
  readonly author: string;
  readonly comment: string;
  readonly createdAt?: Date;
  readonly active: boolean;
}

export interface PolicyDiagnostic {
  readonly severity: string;
  readonly code: string;
  readonly message: string;
  /** RFC 6901 pointer into the artifact (the wire's `path`); empty for a YAML syntax error. */
  readonly pointer: string;
  readonly position?: { readonly line: number; readonly column: number };
}

export interface DecisionChange {
  readonly issuer: string;
  readonly attributes: Readonly<Record<string, string>>;
  readonly capability: string;
  /** "gained", "lost" or "changed". */
  readonly kind: string;
  readonly before?: DecisionSummary;
  readonly after?: DecisionSummary;
}

export interface DecisionSummary {
  readonly outcome: string;
  readonly code: string;
  readonly account: string;
  readonly limits?: { readonly calls: number; readonly per: string; readonly windowMs: number };
}

export interface PublishResult {
  readonly accepted: boolean;
  readonly revision: number;
  readonly version: string;
  readonly diagnostics: readonly PolicyDiagnostic[];
  readonly changes: readonly DecisionChange[];
  readonly unchanged: boolean;
}

export interface ActivePolicy {
  readonly version?: PolicyVersion;
  readonly artifact: string;
  readonly catalog?: string;
}

export interface ActivateResult {
  readonly version?: PolicyVersion;
  readonly changes: readonly DecisionChange[];
}

function date(timestamp: Timestamp | undefined): Date | undefined {
  return timestamp === undefined ? undefined : timestampDate(timestamp);
}

function reason(pb: ReasonPb | undefined): Reason {
  if (pb === undefined) throw new CapgateProtocolError("a decision without a reason");
  const { code, path, subject, position, message } = pb;
  return {
    code: reasonCodeName(code),
    pointer: path,
    subject,
    ...(position && { position: { line: position.line, column: position.column } }),
    message,
  };
}

function account(pb: AccountPb): Account {
  const { id, secretRef } = pb;
  return { id, secretRef };
}

function limits(pb: LimitsPb): Limits {
  const { calls, per, windowMs, remaining, resetsAt } = pb;
  const resets = date(resetsAt);
  return {
    calls: Number(calls),
    per,
    windowMs: Number(windowMs),
    remaining: Number(remaining),
    ...(resets && { resetsAt: resets }),
  };
}

function ceiling(pb: Ceiling) {
  const { calls, per, windowMs } = pb;
  return { calls: Number(calls), per, windowMs: Number(windowMs) };
}

function tool(pb: ToolPb): ToolRoute {
  const { exposedName, upstream, name, capability, transport } = pb;
  const kind = transport?.kind;
  let route: Transport;
  switch (kind?.case) {
    case "stdio":
      route = { kind: "stdio", command: kind.value.command, args: [...kind.value.args] };
      break;
    case "http":
      route = { kind: "http", url: kind.value.url };
      break;
    default:
      throw new CapgateProtocolError(`tool \`${exposedName}\` has no transport`);
  }
  return { exposedName, upstream, name, capability, transport: route };
}

function unauthenticated(pb: Unauthenticated) {
  return { kind: "unauthenticated", problem: authProblemName(pb.problem), message: pb.message } as const;
}

export function decideAnswer(pb: DecideResponse): DecideAnswer {
  const { decisionId, policyVersion, policyRevision, at, result } = pb;
  let typed: DecideResult;
  switch (result.case) {
    case "decision": {
      const d = result.value;
      if (d.outcome === Outcome.ALLOW) {
        if (d.account === undefined) throw new CapgateProtocolError("an allow without an account");
        typed = {
          kind: "allow",
          reason: reason(d.reason),
          account: account(d.account),
          ...(d.limits && { limits: limits(d.limits) }),
          ...(d.tool && { tool: tool(d.tool) }),
        };
      } else if (d.outcome === Outcome.DENY) {
        const resets = date(d.resetsAt);
        typed = { kind: "deny", reason: reason(d.reason), ...(resets && { resetsAt: resets }) };
      } else {
        throw new CapgateProtocolError(`a decision with outcome ${d.outcome}`);
      }
      break;
    }
    case "unauthenticated":
      typed = unauthenticated(result.value);
      break;
    case "unknownTool":
      typed = { kind: "unknown_tool", name: result.value.name, message: result.value.message };
      break;
    default:
      throw new CapgateProtocolError("a DecideResponse with no result");
  }
  const when = date(at);
  return {
    decisionId,
    policyVersion,
    policyRevision: Number(policyRevision),
    ...(when && { at: when }),
    result: typed,
  };
}

export function listVisibleAnswer(pb: ListVisibleResponse): ListVisibleAnswer {
  const { policyVersion, policyRevision, at, result } = pb;
  let typed: ListVisibleResult;
  switch (result.case) {
    case "visible":
      typed = {
        kind: "visible",
        capabilities: result.value.capabilities.map((c) => ({
          capability: c.capability,
          ...(c.account && { account: account(c.account) }),
          ...(c.limits && { limits: ceiling(c.limits) }),
          pointer: c.path,
          decisionId: c.decisionId,
          conditional: c.conditional,
        })),
        tools: result.value.tools.map(
          ({ exposedName, upstream, name, capability, description, inputSchemaJson, conditional }) => ({
            exposedName,
            upstream,
            name,
            capability,
            description,
            inputSchemaJson,
            conditional,
          }),
        ),
      };
      break;
    case "unauthenticated":
      typed = unauthenticated(result.value);
      break;
    default:
      throw new CapgateProtocolError("a ListVisibleResponse with no result");
  }
  const when = date(at);
  return { policyVersion, policyRevision: Number(policyRevision), ...(when && { at: when }), result: typed };
}

export function policyRevision(pb: PolicyRevisionPb): PolicyRevision {
  const installed = date(pb.installedAt);
  return {
    policyRevision: Number(pb.policyRevision),
    policyVersion: pb.policyVersion,
    ...(installed && { installedAt: installed }),
  };
}

function policyVersion(pb: PolicyVersionPb): PolicyVersion {
  const { revision, version, author, comment, createdAt, active } = pb;
  const created = date(createdAt);
  return { revision: Number(revision), version, author, comment, ...(created && { createdAt: created }), active };
}

function diagnostic(pb: Diagnostic): PolicyDiagnostic {
  const { severity, code, message, path, position } = pb;
  return {
    severity,
    code,
    message,
    pointer: path,
    ...(position && { position: { line: position.line, column: position.column } }),
  };
}

function change(pb: DecisionChangePb): DecisionChange {
  const summary = (s: NonNullable<DecisionChangePb["before"]>): DecisionSummary => ({
    outcome: s.outcome,
    code: s.code,
    account: s.account,
    ...(s.limits && { limits: ceiling(s.limits) }),
  });
  return {
    issuer: pb.issuer,
    attributes: { ...pb.attributes },
    capability: pb.capability,
    kind: pb.kind,
    ...(pb.before && { before: summary(pb.before) }),
    ...(pb.after && { after: summary(pb.after) }),
  };
}

export function publishResult(pb: PublishPolicyResponse): PublishResult {
  return {
    accepted: pb.accepted,
    revision: Number(pb.revision),
    version: pb.version,
    diagnostics: pb.diagnostics.map(diagnostic),
    changes: pb.changes.map(change),
    unchanged: pb.unchanged,
  };
}

export function activePolicy(pb: GetActivePolicyResponse): ActivePolicy {
  return {
    ...(pb.version && { version: policyVersion(pb.version) }),
    artifact: pb.artifact,
    ...(pb.catalog !== undefined && { catalog: pb.catalog }),
  };
}

export function policyVersions(versions: readonly PolicyVersionPb[]): PolicyVersion[] {
  return versions.map(policyVersion);
}

export function activateResult(pb: ActivatePolicyResponse): ActivateResult {
  return { ...(pb.version && { version: policyVersion(pb.version) }), changes: pb.changes.map(change) };
}
