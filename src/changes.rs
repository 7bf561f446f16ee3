//! How two decisions about one request differ: the vocabulary `capgate replay` (a candidate
//! policy against recorded traffic) and shadow versions on the service (a shadow against the
//! active one, live) share, so that both report a change in the same words
//! (docs/decisions/0035).
//!
//! A decision is compared by what the gateway acts on — allowed or not, the execution account,
//! the ceiling — and then by why: the reason code and the pointer into the artifact. A listing is
//! compared by the capabilities it shows.

use std::collections::BTreeSet;

/// What one decision came to, as far as a comparison looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side<'a> {
    pub allowed: bool,
    /// The reason code (`unknown_tool` when the tool was not in the catalog).
    pub code: Option<&'a str>,
    /// The pointer into the artifact the reason names.
    pub path: Option<&'a str>,
    /// On an allow: the execution account.
    pub account: Option<&'a str>,
    /// On an allow under a ceiling: its calls and window.
    pub ceiling: Option<(u64, &'a str)>,
}

/// How a decision changed, the first that applies in this order: the order a reviewer reads a
/// change in, widening first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transition {
    /// Denied before, allowed after: access widens.
    DenyToAllow,
    /// Allowed before, denied after.
    AllowToDeny,
    /// Allowed both times, as another execution account.
    AccountChanged,
    /// Allowed both times as the same account, under another ceiling (or none instead of one).
    CeilingChanged,
    /// The same answer for another reason: another code, or another rule (pointer).
    ReasonChanged,
    /// A listing that shows capabilities it did not, and hides none it showed.
    ListingWidened,
    /// A listing that hides capabilities it showed, and shows no new one.
    ListingNarrowed,
    /// A listing that both shows and hides some.
    ListingChanged,
}

impl Transition {
    pub const ALL: [Transition; 8] = [
        Transition::DenyToAllow,
        Transition::AllowToDeny,
        Transition::AccountChanged,
        Transition::CeilingChanged,
        Transition::ReasonChanged,
        Transition::ListingWidened,
        Transition::ListingNarrowed,
        Transition::ListingChanged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Transition::DenyToAllow => "deny_to_allow",
            Transition::AllowToDeny => "allow_to_deny",
            Transition::AccountChanged => "account_changed",
            Transition::CeilingChanged => "ceiling_changed",
            Transition::ReasonChanged => "reason_changed",
            Transition::ListingWidened => "listing_widened",
            Transition::ListingNarrowed => "listing_narrowed",
            Transition::ListingChanged => "listing_changed",
        }
    }

    /// How a report heads it.
    pub fn label(self) -> &'static str {
        match self {
            Transition::DenyToAllow => "deny → allow",
            Transition::AllowToDeny => "allow → deny",
            Transition::AccountChanged => "account changed",
            Transition::CeilingChanged => "ceiling changed",
            Transition::ReasonChanged => "reason changed",
            Transition::ListingWidened => "listing widened",
            Transition::ListingNarrowed => "listing narrowed",
            Transition::ListingChanged => "listing changed",
        }
    }

    pub fn parse(text: &str) -> Option<Transition> {
        Transition::ALL
            .into_iter()
            .find(|transition| transition.as_str() == text)
    }

    /// Whether the change may let through what was not let through before: what
    /// `--fail-on widening` fails on. A ceiling that changed may be higher; a listing that
    /// changed shows something new.
    pub fn widens(self) -> bool {
        matches!(
            self,
            Transition::DenyToAllow
                | Transition::AccountChanged
                | Transition::CeilingChanged
                | Transition::ListingWidened
                | Transition::ListingChanged
        )
    }
}

/// Whether two ceilings are the same rule: the same calls over the same window, however the window
/// is written (`1h` and `60m` are one window; a window the core cannot read compares as written).
fn same_ceiling(before: Option<(u64, &str)>, after: Option<(u64, &str)>) -> bool {
    use capgate_core::policy::syntax::window_ms;
    match (before, after) {
        (None, None) => true,
        (Some((calls, per)), Some((other_calls, other_per))) => {
            calls == other_calls
                && (per == other_per
                    || window_ms(per).is_some_and(|window| window_ms(other_per) == Some(window)))
        }
        _ => false,
    }
}

/// How `after` differs from `before`; `None` when a gateway could not tell them apart and they
/// give the same reason.
pub fn transition(before: &Side<'_>, after: &Side<'_>) -> Option<Transition> {
    match (before.allowed, after.allowed) {
        (false, true) => Some(Transition::DenyToAllow),
        (true, false) => Some(Transition::AllowToDeny),
        (true, true) if before.account != after.account => Some(Transition::AccountChanged),
        (true, true) if !same_ceiling(before.ceiling, after.ceiling) => Some(Transition::CeilingChanged),
        _ if before.code != after.code || before.path != after.path => Some(Transition::ReasonChanged),
        _ => None,
    }
}

/// What a listing shows after that it did not before (`gained`), and what it no longer shows
/// (`lost`), each in the order of the listing they come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListingChange<'a> {
    pub gained: Vec<&'a str>,
    pub lost: Vec<&'a str>,
}

impl ListingChange<'_> {
    pub fn transition(&self) -> Option<Transition> {
        match (self.gained.is_empty(), self.lost.is_empty()) {
            (true, true) => None,
            (false, true) => Some(Transition::ListingWidened),
            (true, false) => Some(Transition::ListingNarrowed),
            (false, false) => Some(Transition::ListingChanged),
        }
    }
}

/// How the capability ids a listing showed `after` differ from those it showed `before`.
pub fn listing_change<'a>(
    before: impl IntoIterator<Item = &'a str>,
    after: impl IntoIterator<Item = &'a str>,
) -> ListingChange<'a> {
    let before: Vec<&str> = before.into_iter().collect();
    let after: Vec<&str> = after.into_iter().collect();
    let before_set: BTreeSet<&str> = before.iter().copied().collect();
    let after_set: BTreeSet<&str> = after.iter().copied().collect();
    ListingChange {
        gained: after.into_iter().filter(|id| !before_set.contains(id)).collect(),
        lost: before.into_iter().filter(|id| !after_set.contains(id)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow<'a>(account: &'a str, ceiling: Option<(u64, &'a str)>, path: &'a str) -> Side<'a> {
        Side {
            allowed: true,
            code: Some("granted"),
            path: Some(path),
            account: Some(account),
            ceiling,
        }
    }

    fn deny<'a>(code: &'a str, path: &'a str) -> Side<'a> {
        Side {
            allowed: false,
            code: Some(code),
            path: Some(path),
            account: None,
            ceiling: None,
        }
    }

    #[test]
    fn a_change_is_named_by_the_first_difference_a_gateway_acts_on() {
        let a = allow("support", Some((10, "1h")), "/grants/0");
        let d = deny("no_matching_grant", "/capabilities/0");
        assert_eq!(transition(&d, &a), Some(Transition::DenyToAllow));
        assert_eq!(transition(&a, &d), Some(Transition::AllowToDeny));
        // Account before ceiling before reason.
        let other = allow("billing", None, "/grants/1");
        assert_eq!(transition(&a, &other), Some(Transition::AccountChanged));
        let looser = allow("support", Some((100, "1h")), "/grants/1");
        assert_eq!(transition(&a, &looser), Some(Transition::CeilingChanged));
        // One window written two ways is one ceiling; a record's `60m` against a candidate's `1h`
        // is no change.
        assert_eq!(
            transition(&a, &allow("support", Some((10, "60m")), "/grants/0")),
            None
        );
        assert_eq!(
            transition(&a, &allow("support", Some((10, "2h")), "/grants/0")),
            Some(Transition::CeilingChanged)
        );
        let uncapped = allow("support", None, "/grants/0");
        assert_eq!(transition(&a, &uncapped), Some(Transition::CeilingChanged));
        let moved = allow("support", Some((10, "1h")), "/grants/3");
        assert_eq!(transition(&a, &moved), Some(Transition::ReasonChanged));
        assert_eq!(
            transition(&d, &deny("condition_failed", "/grants/0/when/0")),
            Some(Transition::ReasonChanged)
        );
        assert_eq!(transition(&a, &a), None);
        assert_eq!(transition(&d, &d), None);
    }

    #[test]
    fn a_listing_is_compared_by_what_it_shows() {
        let change = listing_change(["a", "b"], ["b", "c", "a"]);
        assert_eq!(change.gained, ["c"]);
        assert!(change.lost.is_empty());
        assert_eq!(change.transition(), Some(Transition::ListingWidened));
        assert_eq!(
            listing_change(["a", "b"], ["a"]).transition(),
            Some(Transition::ListingNarrowed)
        );
        assert_eq!(
            listing_change(["a"], ["b"]).transition(),
            Some(Transition::ListingChanged)
        );
        assert_eq!(listing_change(["a", "b"], ["b", "a"]).transition(), None);
    }

    #[test]
    fn every_transition_reads_back_from_its_name() {
        for transition in Transition::ALL {
            assert_eq!(Transition::parse(transition.as_str()), Some(transition));
        }
        assert_eq!(Transition::parse("deny→allow"), None);
    }
}
