//! Listing (docs/reference.md#listings): *the same function*, applied to every
//! declared capability with usage not consulted. Visibility is not a separate
//! filter that could drift from authorisation. A capability that no grant of
//! the principal's issuer names is denied by step 3 without being looked at.

use super::{CapabilityRule, Instant, Limits, Ruleset};
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
    /// Every grant that gives it carries conditions: a call may still be denied on its
    /// arguments or time (conditions are not evaluated for a listing).
    pub conditional: bool,
}

/// The capabilities `principal` may see, in declaration order. Ceilings are
/// not consulted, so a `calls: 0` grant still lists its tools.
///
/// The decision for each is `evaluate`'s on the capability's id, taken by its
/// position instead (no look-up by id), with the principal interned once for
/// the whole listing, and only for the capabilities that some grant of the
/// principal's issuer names (`Prepared::each_allowed`).
pub fn visible<'a>(ruleset: &'a Ruleset, principal: &Principal, at: Instant) -> Vec<VisibleCapability<'a>> {
    let prepared = ruleset.prepare(principal);
    // Room for every capability at once: growing the list as it fills cost
    // about a tenth of a listing in reallocations.
    let mut shown = Vec::with_capacity(ruleset.capabilities().len());
    prepared.each_allowed(at, |index, allow| {
        shown.push(VisibleCapability {
            capability: &ruleset.capabilities()[index],
            account: allow.account,
            limits: allow.limits,
            path: allow.reason.path,
            conditional: allow.conditional,
        });
    });
    shown
}
