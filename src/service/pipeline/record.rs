//! The audit record of a decision or a listing, built in one place (docs/service.md): what was
//! asked, who asked, what was decided and why. Never a credential or a secret; of a tool call's
//! arguments, their digest, and their redacted values only where the operator opted in
//! (`arguments.rs`).

use capgate_core::access::VisibleCapability;
use capgate_core::principals::{AuthProblem, Principal};
use uuid::Uuid;

use crate::service::active::Active;
use crate::service::identify::Identified;
use crate::store::{AuditRecord, Door, RecordCode, RecordKind, RecordOutcome};

use super::arguments::{Kept, Recorded};
use super::{Ask, Metered, Target};

/// What every record of one request shares.
pub(super) struct Base {
    at_ms: i64,
    request_id: Option<String>,
    gateway: String,
    door: Door,
    policy_version: String,
    policy_revision: u64,
    /// What every record of the request keeps of its arguments, when it had some.
    arguments: Option<Recorded>,
}

impl Base {
    /// `arguments`: what the request's records keep of the call's arguments
    /// ([`Recorded::of`] on `ask.arguments`, made once per request).
    pub(super) fn new(ask: &Ask<'_>, active: &Active, at_ms: i64, arguments: Option<&Recorded>) -> Base {
        Base {
            at_ms,
            request_id: ask.request_id.map(str::to_owned),
            gateway: ask.gateway.name.clone(),
            door: ask.door,
            policy_version: active.version.clone(),
            policy_revision: active.revision,
            arguments: arguments.cloned(),
        }
    }

    /// A decision's record, before its outcome is known (denied until decided otherwise). It
    /// names the target as asked for from the start, so that a caller who is never identified
    /// still leaves a record of what they tried (bounded: the door checked its length).
    pub(super) fn decide(&self, identified: &Identified, target: Target<'_>) -> AuditRecord {
        let mut record = self.record(RecordKind::Decide, Some(identified));
        asked_for(&mut record, target);
        record
    }

    /// A retry answered with the answer of `first`, the decision it repeats: nothing was decided,
    /// and the caller is the one `first` records (the retry's fingerprint is that request's).
    pub(super) fn replayed(&self, target: Target<'_>, first: &str) -> AuditRecord {
        let mut record = self.record(RecordKind::Decide, None);
        asked_for(&mut record, target);
        record.outcome = RecordOutcome::Replayed;
        record.first_decision_id = Some(first.to_owned());
        record
    }

    /// A request refused for reusing the `request_id` of another request (`first`, once known):
    /// who tried, as far as identification tells (`None`: it could not be finished), and what
    /// they asked for. Nothing was decided.
    pub(super) fn reused(
        &self,
        identified: Option<&Identified>,
        target: Target<'_>,
        first: Option<String>,
    ) -> AuditRecord {
        let mut record = self.record(RecordKind::Decide, identified);
        asked_for(&mut record, target);
        if let Some(Ok(principal)) = identified.map(|identified| &identified.outcome) {
            record.principal_id = Some(principal.id.clone());
        }
        record.outcome = RecordOutcome::RequestIdReused;
        record.first_decision_id = first;
        record
    }

    /// One listing record.
    pub(super) fn list(&self, identified: &Identified) -> AuditRecord {
        self.record(RecordKind::List, Some(identified))
    }

    /// A record of `kind` by the caller `identified` (`None`: not known).
    fn record(&self, kind: RecordKind, identified: Option<&Identified>) -> AuditRecord {
        let (arguments_digest, arguments, arguments_omitted) = match &self.arguments {
            None => (None, None, None),
            Some(Recorded { digest, kept }) => {
                let (kept, omitted) = match kept {
                    Kept::Nothing => (None, None),
                    Kept::Redacted(text) => (Some(text.clone()), None),
                    Kept::Omitted(bytes) => (None, Some(*bytes)),
                };
                (Some(digest.clone()), kept, omitted)
            }
        };
        AuditRecord {
            decision_id: Uuid::now_v7().to_string(),
            at_ms: self.at_ms,
            request_id: self.request_id.clone(),
            gateway: self.gateway.clone(),
            door: self.door,
            kind,
            issuer: identified.and_then(|identified| identified.issuer.clone()),
            subject: identified.and_then(|identified| identified.subject.clone()),
            policy_version: Some(self.policy_version.clone()),
            policy_revision: Some(self.policy_revision),
            arguments_digest,
            arguments,
            arguments_omitted,
            ..AuditRecord::default()
        }
    }
}

/// The target as asked for: a tool by its exposed name, or a capability.
fn asked_for(record: &mut AuditRecord, target: Target<'_>) {
    match target {
        Target::Tool(name) => record.tool = Some(name.to_owned()),
        Target::Capability(capability) => record.capability = Some(capability.to_owned()),
    }
}

/// The caller could not be identified.
pub(super) fn unauthenticated(record: &mut AuditRecord, problem: AuthProblem) {
    record.outcome = RecordOutcome::Unauthenticated;
    record.code = Some(RecordCode::Problem(problem));
}

/// The caller is this principal: its id, and its attributes, which with the issuer and subject
/// already recorded are what `capgate replay` decides the record again on.
pub(super) fn principal(record: &mut AuditRecord, principal: &Principal) {
    record.principal_id = Some(principal.id.clone());
    record.attributes = Some(attributes_json(principal));
}

/// A principal's attributes as a JSON object, sorted by name (they are a `BTreeMap`).
fn attributes_json(principal: &Principal) -> String {
    serde_json::to_string(&principal.attributes).expect("a map of strings is JSON")
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

/// The most a listing's record holds of the ids it showed: the ids and the spaces between them.
/// A listing may show every capability of an 8 MiB policy; its record says how many it showed and
/// which, as many as fit here (in declaration order), so that it stays one small row whatever
/// the policy's size. 16 KiB holds some 500 ids of a usual length, more than an agent lists.
const MAX_VISIBLE_RECORDED_BYTES: usize = 16 * 1024;

/// What a listing showed an identified principal: one record for the whole listing.
pub(super) fn listed(record: &mut AuditRecord, principal: &Principal, seen: &[VisibleCapability<'_>]) {
    // The listing was answered; how much it showed is `visible_count`, which grant showed each
    // capability is a question for `capgate explain` on the recorded revision.
    record.outcome = RecordOutcome::Allow;
    record.principal_id = Some(principal.id.clone());
    record.issuer = Some(principal.issuer.clone());
    record.subject = Some(principal.subject.clone());
    record.attributes = Some(attributes_json(principal));
    record.visible_count = Some(seen.len() as u64);
    record.visible = bounded_ids(seen.iter().map(|item| item.capability.id.as_str()));
}

/// The first `ids` that fit in [`MAX_VISIBLE_RECORDED_BYTES`], spaces between them included.
pub(super) fn bounded_ids<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut bytes = 0;
    ids.take_while(|id| {
        // The first id needs no separator; every later one does.
        bytes += id.len() + usize::from(bytes > 0);
        bytes <= MAX_VISIBLE_RECORDED_BYTES
    })
    .map(str::to_owned)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_ids_stop_where_the_next_would_pass_the_bound() {
        // 8-byte ids: 1820 of them and 1819 spaces are 16,379 bytes; one more would be 16,388.
        let ids: Vec<String> = (0..2000).map(|n| format!("c{n:07}")).collect();
        let kept = bounded_ids(ids.iter().map(String::as_str));
        assert_eq!(kept.len(), 1820);
        assert_eq!(kept[..], ids[..1820]);
        // Exactly at the bound is kept.
        let whole = "x".repeat(MAX_VISIBLE_RECORDED_BYTES);
        assert_eq!(bounded_ids([whole.as_str()].into_iter()), [whole]);
        // An id longer than the bound keeps nothing after it either: the record holds a prefix.
        let long = "y".repeat(MAX_VISIBLE_RECORDED_BYTES + 1);
        assert!(bounded_ids([long.as_str(), "a.b"].into_iter()).is_empty());
    }
}
