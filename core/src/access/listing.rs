//! Listing (docs/reference.md#listings): *the same function*, applied to every
//! declared capability with usage not consulted. Visibility is not a separate
//! filter that could drift from authorisation.

use super::{CapabilityRule, Decision, Instant, Limits, Ruleset, Usage};
use crate::accounts::AccountRef;
use crate::principals::Principal;

/// A capability the principal may see, with the account and ceiling a call
/// would run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisibleCapability<'a> {
    pub capability: &'a CapabilityRule,
    pub account: &'a AccountRef,
    pub limits: Option<&'a Limits>,
    /// The winning grant's pointer.
    pub path: &'a str,
}

/// The capabilities `principal` may see, in declaration order. Ceilings are
/// not consulted, so a `calls: 0` grant still lists its tools.
///
/// The decision for each is `evaluate`'s on the capability's id, taken by its
/// position instead (no look-up by id) and with the principal interned once
/// for the whole listing.
pub fn visible<'a>(ruleset: &'a Ruleset, principal: &Principal, at: Instant) -> Vec<VisibleCapability<'a>> {
    let prepared = ruleset.prepare(principal);
    // Room for every capability at once: growing the list as it fills cost
    // about a tenth of a listing in reallocations.
    let mut shown = Vec::with_capacity(ruleset.capabilities().len());
    shown.extend(
        ruleset
            .capabilities()
            .iter()
            .enumerate()
            .filter_map(
                |(index, capability)| match prepared.decide_at(index, at, Usage::NotConsulted) {
                    Decision::Allow(allow) => Some(VisibleCapability {
                        capability,
                        account: allow.account,
                        limits: allow.limits,
                        path: allow.reason.path,
                    }),
                    Decision::Deny(_) => None,
                },
            ),
    );
    shown
}
