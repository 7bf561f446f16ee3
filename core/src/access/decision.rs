//! The decision and its reason (docs/reference.md#reason-codes).

use super::Limits;
use crate::accounts::AccountRef;

/// The closed vocabulary of reasons: the eight codes of mcpizer's design, and two of
/// ours for conditions (docs/decisions/0034), which an artifact without conditions
/// never produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReasonCode {
    Granted,
    CapabilityNotDeclared,
    CapabilityNotRealized,
    NoGrantMatches,
    AmbiguousGrant,
    AccountDisabled,
    UsageUnknown,
    LimitExhausted,
    ConditionFailed,
    ArgumentsMissing,
}

impl ReasonCode {
    pub const ALL: [ReasonCode; 10] = [
        ReasonCode::Granted,
        ReasonCode::CapabilityNotDeclared,
        ReasonCode::CapabilityNotRealized,
        ReasonCode::NoGrantMatches,
        ReasonCode::AmbiguousGrant,
        ReasonCode::AccountDisabled,
        ReasonCode::UsageUnknown,
        ReasonCode::LimitExhausted,
        ReasonCode::ConditionFailed,
        ReasonCode::ArgumentsMissing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::Granted => "granted",
            ReasonCode::CapabilityNotDeclared => "capability_not_declared",
            ReasonCode::CapabilityNotRealized => "capability_not_realized",
            ReasonCode::NoGrantMatches => "no_grant_matches",
            ReasonCode::AmbiguousGrant => "ambiguous_grant",
            ReasonCode::AccountDisabled => "account_disabled",
            ReasonCode::UsageUnknown => "usage_unknown",
            ReasonCode::LimitExhausted => "limit_exhausted",
            ReasonCode::ConditionFailed => "condition_failed",
            ReasonCode::ArgumentsMissing => "arguments_missing",
        }
    }

    /// One line of prose for human output.
    pub fn describe(self) -> &'static str {
        match self {
            ReasonCode::Granted => "a grant matches the principal and names the capability",
            ReasonCode::CapabilityNotDeclared => "the capability is not declared in the policy",
            ReasonCode::CapabilityNotRealized => "no tool realises the capability",
            ReasonCode::NoGrantMatches => "no grant both matches the principal and names the capability",
            ReasonCode::AmbiguousGrant => "matching grants disagree on the execution account",
            ReasonCode::AccountDisabled => "the execution account is disabled",
            ReasonCode::UsageUnknown => {
                "the usage counter could not be read and a ceiling applies (fail closed)"
            }
            ReasonCode::LimitExhausted => "the ceiling of the winning grant is exhausted",
            ReasonCode::ConditionFailed => {
                "the matching grants' conditions do not hold for this call's arguments or time"
            }
            ReasonCode::ArgumentsMissing => "the call lacks an argument that a grant's condition needs",
        }
    }
}

/// Why: a code, where in the artifact (an RFC 6901 pointer), and about what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason<'a> {
    pub code: ReasonCode,
    pub path: &'a str,
    pub subject: &'a str,
}

impl Reason<'_> {
    /// One line for a person: the code's prose and what it is about, e.g. "the execution
    /// account is disabled (`release-robot`)". The code is the contract; this is for showing.
    pub fn message(&self) -> String {
        format!("{} (`{}`)", self.code.describe(), self.subject)
    }
}

/// An allow: the reason, the account the call runs as, and the winning
/// grant's ceiling (if it declares one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allow<'a> {
    pub reason: Reason<'a>,
    pub account: &'a AccountRef,
    pub limits: Option<&'a Limits>,
    /// Index of the winning grant.
    pub grant: usize,
    /// The allow rests on conditions: for a call, the winning grant carries some (the call
    /// was allowed on what it does, not only on who makes it); for a listing, every grant
    /// that matches does (a call may still be denied on its arguments or time).
    pub conditional: bool,
}

/// The decision. A deny structurally has no account and no limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision<'a> {
    Allow(Allow<'a>),
    Deny(Reason<'a>),
}

impl<'a> Decision<'a> {
    pub fn reason(&self) -> &Reason<'a> {
        match self {
            Decision::Allow(allow) => &allow.reason,
            Decision::Deny(reason) => reason,
        }
    }

    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }

    pub fn outcome(&self) -> &'static str {
        if self.is_allow() {
            "allow"
        } else {
            "deny"
        }
    }
}
