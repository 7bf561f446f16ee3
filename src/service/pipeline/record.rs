//! The audit record of a decision or a listing, built in one place (service.md §5): what was
//! asked, who asked, what was decided and why. Never a credential, a secret or tool arguments.

use capgate_core::access::VisibleCapability;
use capgate_core::principals::{AuthProblem, Principal};
use uuid::Uuid;

use crate::service::active::Active;
use crate::service::identify::Identified;
use crate::store::{AuditRecord, RecordCode, RecordKind, RecordOutcome};

use super::{Ask, Metered};

/// What every record of one request shares.
pub(super) struct Base {
    at_ms: i64,
    request_id: Option<String>,
    gateway: String,
    policy_version: String,
    policy_revision: u64,
}

impl Base {
    pub(super) fn new(ask: &Ask<'_>, active: &Active, at_ms: i64) -> Base {
        Base {
            at_ms,
            request_id: ask.request_id.map(str::to_owned),
            gateway: ask.gateway.name.clone(),
            policy_version: active.version.clone(),
            policy_revision: active.revision,
        }
    }

    /// A decision's record, before its outcome is known (denied until decided otherwise).
    pub(super) fn decide(&self, identified: &Identified) -> AuditRecord {
        self.record(RecordKind::Decide, identified)
    }

    /// One listing record.
    pub(super) fn list(&self, identified: &Identified) -> AuditRecord {
        self.record(RecordKind::List, identified)
    }

    fn record(&self, kind: RecordKind, identified: &Identified) -> AuditRecord {
        AuditRecord {
            decision_id: Uuid::now_v7().to_string(),
            at_ms: self.at_ms,
            request_id: self.request_id.clone(),
            gateway: self.gateway.clone(),
            kind,
            issuer: identified.issuer.clone(),
            subject: identified.subject.clone(),
            policy_version: Some(self.policy_version.clone()),
            policy_revision: Some(self.policy_revision),
            ..AuditRecord::default()
        }
    }
}

/// The caller could not be identified.
pub(super) fn unauthenticated(record: &mut AuditRecord, problem: AuthProblem) {
    record.outcome = RecordOutcome::Unauthenticated;
    record.code = Some(RecordCode::Problem(problem));
}

/// The caller is this principal.
pub(super) fn principal(record: &mut AuditRecord, principal: &Principal) {
    record.principal_id = Some(principal.id.clone());
}

/// The tool asked for (already in `record.tool`) is not in the catalog.
pub(super) fn unknown_tool(record: &mut AuditRecord) {
    record.outcome = RecordOutcome::UnknownTool;
}

/// The core decided, with what the counter said.
pub(super) fn decided(record: &mut AuditRecord, capability: &str, metered: &Metered<'_>) {
    let reason = metered.decision.reason();
    record.capability = Some(capability.to_owned());
    record.outcome = if metered.decision.is_allow() {
        RecordOutcome::Allow
    } else {
        RecordOutcome::Deny
    };
    record.code = Some(RecordCode::Reason(reason.code));
    record.path = Some(reason.path.to_owned());
    record.limit_calls = metered.ceiling.map(|limits| limits.calls);
    record.limit_per = metered.ceiling.map(|limits| limits.per.clone());
    record.usage_calls = metered.usage_calls;
    if let capgate_core::access::Decision::Allow(allow) = &metered.decision {
        record.account_id = Some(allow.account.id.clone());
    }
}

/// One capability a listing shows.
pub(super) fn listed(
    mut record: AuditRecord,
    principal: &Principal,
    item: &VisibleCapability<'_>,
) -> AuditRecord {
    record.outcome = RecordOutcome::Allow;
    record.code = Some(RecordCode::Reason(capgate_core::access::ReasonCode::Granted));
    record.path = Some(item.path.to_owned());
    record.principal_id = Some(principal.id.clone());
    record.issuer = Some(principal.issuer.clone());
    record.subject = Some(principal.subject.clone());
    record.capability = Some(item.capability.id.clone());
    record.account_id = Some(item.account.id.clone());
    record.limit_calls = item.limits.map(|limits| limits.calls);
    record.limit_per = item.limits.map(|limits| limits.per.clone());
    record
}
