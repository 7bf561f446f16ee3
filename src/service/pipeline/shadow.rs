//! A shadow version on live traffic (docs/decisions/0035): every decision and listing is taken
//! again on the shadow version, beside the active one, and where the two differ the record carries
//! the shadow's side ([`ShadowSide`]), stored in the transaction that stores the record. The
//! answer is always the active version's; nothing here can change it.
//!
//! The shadow decides on what the active decision had: the principal the active version
//! identified, the call's arguments, its instant, and the usage its counter read (an uncapped
//! call's usage is not consulted, so a ceiling only the shadow has is compared, not counted).

use capgate_core::access::{evaluate_prepared_call, visible, Arguments, Decision, Usage, VisibleCapability};
use capgate_core::principals::Principal;

use crate::changes::{self, Side, Transition};
use crate::service::active::Active;
use crate::store::{AuditRecord, RecordCode, RecordOutcome, ShadowSide};

use super::record::bounded_ids;

/// A call the active version decided, as `record` (complete) says: the shadow's side when the
/// shadow decides otherwise. `tool` is the tool asked for by name (resolved in the shadow's own
/// catalog), else the call is for `capability`.
pub(super) fn decided(
    record: &AuditRecord,
    shadow: &Active,
    principal: &Principal,
    tool: Option<&str>,
    capability: &str,
    arguments: Arguments<'_>,
    usage: Usage,
) -> Option<Box<ShadowSide>> {
    if shadow.revision == record.policy_revision? {
        return None;
    }
    let active = active_side(record);
    let capability = match tool {
        None => capability,
        Some(name) => match shadow.policy.tools.resolve(name) {
            Some(tool) => tool.capability.as_str(),
            None => {
                let unknown = Side {
                    allowed: false,
                    code: Some(RecordOutcome::UnknownTool.as_str()),
                    path: None,
                    account: None,
                    ceiling: None,
                };
                let transition = changes::transition(&active, &unknown)?;
                return Some(Box::new(ShadowSide {
                    revision: shadow.revision,
                    transition: transition.as_str().to_owned(),
                    outcome: RecordOutcome::UnknownTool,
                    ..ShadowSide::default()
                }));
            }
        },
    };
    let prepared = shadow.policy.ruleset.prepare(principal);
    let decision = evaluate_prepared_call(&prepared, capability, record.at_ms, usage, arguments);
    let reason = decision.reason();
    let code = RecordCode::Reason(reason.code).as_str();
    let (account, ceiling) = match &decision {
        Decision::Allow(allow) => (
            Some(allow.account.id.as_str()),
            allow.limits.map(|limits| (limits.calls, limits.per.as_str())),
        ),
        Decision::Deny(_) => (None, None),
    };
    let side = Side {
        allowed: decision.is_allow(),
        code: Some(code),
        path: Some(reason.path),
        account,
        ceiling,
    };
    let transition = changes::transition(&active, &side)?;
    Some(Box::new(ShadowSide {
        revision: shadow.revision,
        transition: transition.as_str().to_owned(),
        outcome: if side.allowed {
            RecordOutcome::Allow
        } else {
            RecordOutcome::Deny
        },
        code: Some(code.to_owned()),
        path: Some(reason.path.to_owned()),
        account_id: account.map(str::to_owned),
        limit_calls: ceiling.map(|(calls, _)| calls),
        limit_per: ceiling.map(|(_, per)| per.to_owned()),
        gained: Vec::new(),
        lost: Vec::new(),
    }))
}

/// A listing the active version answered with `shown`: the shadow's side when the shadow shows
/// other capabilities.
pub(super) fn listed(
    record: &AuditRecord,
    shadow: &Active,
    principal: &Principal,
    shown: &[VisibleCapability<'_>],
) -> Option<Box<ShadowSide>> {
    if shadow.revision == record.policy_revision? {
        return None;
    }
    let shadowed = visible(&shadow.policy.ruleset, principal, record.at_ms);
    let change = changes::listing_change(
        shown.iter().map(|item| item.capability.id.as_str()),
        shadowed.iter().map(|item| item.capability.id.as_str()),
    );
    let transition = change.transition()?;
    Some(Box::new(ShadowSide {
        revision: shadow.revision,
        transition: transition.as_str().to_owned(),
        outcome: RecordOutcome::Allow,
        gained: bounded_ids(change.gained.into_iter()),
        lost: bounded_ids(change.lost.into_iter()),
        ..ShadowSide::default()
    }))
}

/// Counts a difference the answer's record carries (once per answered request).
pub(super) fn count(record: &AuditRecord) {
    if let Some(transition) = record
        .shadow
        .as_deref()
        .and_then(|shadow| Transition::parse(&shadow.transition))
    {
        crate::telemetry::metrics().shadow_difference(transition.as_str());
    }
}

/// What the active version decided, as its record says.
fn active_side(record: &AuditRecord) -> Side<'_> {
    let allowed = record.outcome == RecordOutcome::Allow;
    Side {
        allowed,
        code: match record.outcome {
            RecordOutcome::UnknownTool => Some(RecordOutcome::UnknownTool.as_str()),
            _ => record.code.map(RecordCode::as_str),
        },
        path: record.path.as_deref(),
        account: record.account_id.as_deref().filter(|_| allowed),
        ceiling: record
            .limit_calls
            .zip(record.limit_per.as_deref())
            .filter(|_| allowed),
    }
}
