//! capgate's closed enums as the lowercase strings its audit trail uses
//! (`REASON_CODE_NO_GRANT_MATCHES` → `no_grant_matches`), derived from the
//! generated descriptors so a value added to the proto needs no edit here.

import type { DescEnum } from "@bufbuild/protobuf";
import {
  AuthProblem,
  AuthProblemSchema,
  NoteKind,
  NoteKindSchema,
  ReasonCode,
  ReasonCodeSchema,
} from "./gen/capgate/v1/decisions_pb.js";

/**
 * Every reason code capgate decides with, as the audit writes it (the proto's
 * `ReasonCode` less its zero value). `condition_failed` and
 * `arguments_missing` come from a grant's `when:` conditions: the pointer is
 * the failing condition (`/grants/0/when/1`), the subject its argument path
 * or `time`.
 */
export const REASON_CODE_NAMES = [
  "granted",
  "capability_not_declared",
  "capability_not_realized",
  "no_grant_matches",
  "ambiguous_grant",
  "account_disabled",
  "usage_unknown",
  "limit_exhausted",
  "condition_failed",
  "arguments_missing",
] as const;

/** A decision's reason, as the audit writes it; "unspecified" for a number this build does not know. */
export type ReasonCodeName = (typeof REASON_CODE_NAMES)[number] | "unspecified";

/** Why a credential did not become a principal, as the audit writes it. */
export type AuthProblemName =
  | "credential_missing"
  | "credential_invalid"
  | "credential_expired"
  | "issuer_unknown"
  | "unspecified";

/** What a gateway notes about an allowed call. */
export type NoteKindName = "credential_failed" | "upstream_failed";

/**
 * The value's proto name without the enum's prefix, lowercased. A number the
 * descriptor does not know (a newer server) reads as "unspecified": callers
 * act on the known names only.
 */
function lowercaseName(desc: DescEnum, value: number): string {
  const known = desc.values.find((v) => v.number === value);
  return known === undefined ? "unspecified" : known.localName.toLowerCase();
}

export function reasonCodeName(code: ReasonCode): ReasonCodeName {
  return lowercaseName(ReasonCodeSchema, code) as ReasonCodeName;
}

export function authProblemName(problem: AuthProblem): AuthProblemName {
  return lowercaseName(AuthProblemSchema, problem) as AuthProblemName;
}

export function noteKindValue(kind: NoteKindName): NoteKind {
  const value = NoteKindSchema.values.find((v) => v.localName.toLowerCase() === kind);
  // INVARIANT: NoteKindName lists only names the proto declares.
  if (value === undefined) throw new TypeError(`unknown note kind \`${kind}\``);
  return value.number;
}
