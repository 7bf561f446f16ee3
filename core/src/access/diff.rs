//! The effective diff (cli.md `diff`): which decisions change between two
//! versions of a policy. A text diff cannot say this — one added selector
//! attribute is one line and can cut a whole team off.
//!
//! Ours differs from upstream on purpose: pointers are not compared (a
//! reorder is not a change) and ceilings are, as (`calls`, `window_ms`).
//!
//! Conditions are not consulted (as for a listing: what a call would pass is not known,
//! and the instant is no instant of any call), so a grant whose `when` changed changes no
//! decision here; the CLI compares conditions grant against grant.

use std::collections::{BTreeMap, BTreeSet};

use super::{is_looser, Decision, Limits, Prepared, ReasonCode, Ruleset, Usage};
use crate::principals::Principal;

/// What a decision amounts to, for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub allow: bool,
    pub code: ReasonCode,
    /// Only on allow.
    pub account: Option<String>,
    /// Only meaningful on allow: `None` there means no ceiling.
    pub limits: Option<Limits>,
}

impl Summary {
    fn of(decision: &Decision<'_>) -> Self {
        match decision {
            Decision::Allow(allow) => Summary {
                allow: true,
                code: allow.reason.code,
                account: Some(allow.account.id.clone()),
                limits: allow.limits.cloned(),
            },
            Decision::Deny(reason) => Summary {
                allow: false,
                code: reason.code,
                account: None,
                limits: None,
            },
        }
    }

    /// The compared content: `per`'s spelling is not part of it.
    fn key(&self) -> (bool, ReasonCode, Option<&str>, Option<(u64, u64)>) {
        (
            self.allow,
            self.code,
            self.account.as_deref(),
            self.limits.as_ref().map(|l| (l.calls, l.window_ms)),
        )
    }
}

/// How a decision changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// deny → allow.
    Gained,
    /// allow → deny.
    Lost,
    /// allow → allow with another account or ceiling, or deny → deny with another code.
    Changed,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Gained => "gained",
            ChangeKind::Lost => "lost",
            ChangeKind::Changed => "changed",
        }
    }
}

/// One representative principal × capability whose summary differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub issuer: String,
    /// The representative's attributes, sorted by name.
    pub attributes: BTreeMap<String, String>,
    pub capability: String,
    pub kind: ChangeKind,
    /// `None`: the capability is not declared on that side.
    pub before: Option<Summary>,
    pub after: Option<Summary>,
}

impl Change {
    /// `--fail-on widening`: gained, or an allow whose ceiling got looser.
    pub fn is_widening(&self) -> bool {
        match (&self.before, &self.after, self.kind) {
            (_, _, ChangeKind::Gained) => true,
            (Some(before), Some(after), ChangeKind::Changed) if before.allow && after.allow => {
                is_looser(after.limits.as_ref(), before.limits.as_ref())
            }
            _ => false,
        }
    }
}

/// One side of the diff: its ruleset and its declared issuer ids.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    pub ruleset: &'a Ruleset,
    pub issuers: &'a [String],
}

/// The representative principals of both sides, de-duplicated by
/// (issuer, sorted attributes): one attribute-less principal per issuer and
/// one per grant selector, used as they are (no defaults, no normalisation).
pub fn representatives(sides: &[Side<'_>]) -> Vec<Principal> {
    let mut found: BTreeSet<(String, Vec<(String, String)>)> = BTreeSet::new();
    for side in sides {
        for issuer in side.issuers {
            found.insert((issuer.clone(), Vec::new()));
        }
        for grant in side.ruleset.grants() {
            let mut attributes = grant.selector.clone();
            attributes.sort();
            found.insert((grant.issuer.clone(), attributes));
        }
    }
    found
        .into_iter()
        .map(|(issuer, attributes)| Principal::new(&issuer, "*", attributes.into_iter().collect()))
        .collect()
}

/// Every representative × capability whose decision differs, sorted by
/// issuer, then sorted attribute list (byte order), then capability.
pub fn effective_diff(before: Side<'_>, after: Side<'_>) -> Vec<Change> {
    let capabilities: BTreeSet<&str> = [before, after]
        .iter()
        .flat_map(|side| side.ruleset.capabilities().iter().map(|c| c.id.as_str()))
        .collect();
    // Ceilings and conditions not consulted: a decision on who may use what, whatever the
    // call's usage, arguments and instant (a listing's decision).
    let summary = |prepared: &Prepared<'_>, capability: &str| {
        let ruleset = prepared.ruleset();
        ruleset
            .capability(capability)
            .map(|(index, _)| Summary::of(&prepared.decide_at(index, 0, Usage::NotConsulted)))
    };
    // `representatives` yields (issuer, sorted attributes) order already.
    let mut changes = Vec::new();
    for principal in representatives(&[before, after]) {
        let (earlier, later) = (
            before.ruleset.prepare(&principal),
            after.ruleset.prepare(&principal),
        );
        for &capability in &capabilities {
            let left = summary(&earlier, capability);
            let right = summary(&later, capability);
            if left.as_ref().map(Summary::key) == right.as_ref().map(Summary::key) {
                continue;
            }
            let allows = |side: &Option<Summary>| side.as_ref().is_some_and(|s| s.allow);
            let kind = match (allows(&left), allows(&right)) {
                (false, true) => ChangeKind::Gained,
                (true, false) => ChangeKind::Lost,
                _ => ChangeKind::Changed,
            };
            changes.push(Change {
                issuer: principal.issuer.clone(),
                attributes: principal.attributes.clone(),
                capability: capability.to_owned(),
                kind,
                before: left,
                after: right,
            });
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::compile;

    fn ruleset(when: &str) -> Ruleset {
        let text = format!(
            "version: 2
capabilities:
  - id: billing.refund.create
upstreams:
  - id: payments
    transport: {{ kind: mcp-http, url: https://payments.example.net/mcp }}
    tools:
      - name: create_refund
        capability: billing.refund.create
accounts:
  - id: support-payments
    secret: {{ ref: \"env://SUPPORT\" }}
principals:
  issuers:
    - id: staff
      kind: static-key
      attributes: {{ dept: support }}
grants:
  - to: {{ issuer: staff }}
    capabilities: [billing.refund.create]
    using: support-payments
{when}"
        );
        let compiled = compile(text.as_bytes(), None);
        let diagnostics: Vec<&str> = compiled.diagnostics.iter().map(|d| d.message.as_str()).collect();
        compiled
            .policy
            .unwrap_or_else(|| panic!("{}", diagnostics.join("; ")))
            .ruleset
    }

    #[test]
    fn conditions_change_no_decision_the_diff_compares() {
        // An argument no call is known to pass, and a window the epoch (a Thursday, 00:00
        // UTC) is outside of: neither may turn the unconditional allow into a denial.
        let conditional = ruleset(
            "    when:
      - argument: amount
        at_most: 100
      - time: { zone: UTC, days: [mon], from: \"09:00\", until: \"10:00\" }
",
        );
        let unconditional = ruleset("");
        let issuers = ["staff".to_owned()];
        let side = |ruleset| Side {
            ruleset,
            issuers: &issuers,
        };
        assert_eq!(
            effective_diff(side(&unconditional), side(&conditional)),
            [],
            "conditions are not consulted"
        );
    }
}
