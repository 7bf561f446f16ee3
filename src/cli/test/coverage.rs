//! Coverage: which grants, capabilities and accounts of a policy no case
//! exercised — the question a reviewer asks of a policy change.
//!
//! A grant is exercised when it decided a case: an allow's winning grant, a
//! deny whose pointer is that grant (`limit_exhausted`, `usage_unknown`,
//! `account_disabled`), or the winner of a capability a listing showed. A
//! who-can case does not exercise a grant: it reads the grants, it does not
//! select one for a principal. A capability is exercised when a case decided
//! on it, a listing showed it or a who-can case asked about it (declared). An
//! account is exercised when a decision ran as it or was refused because it is
//! disabled.

use std::collections::BTreeSet;

use capgate_core::policy::CompiledPolicy;

use super::cases::CaseResult;

/// One item of the policy no case exercised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    /// `grant`, `capability`, `account` or `condition`.
    pub kind: &'static str,
    /// The grant's pointer, the capability's or account's id, or the condition as written
    /// (`amount at_most 100`).
    pub id: String,
    /// Its pointer into the artifact.
    pub path: String,
    /// For a condition: whether some case made it hold, and whether some case made it fail
    /// (or miss its argument); it is covered when both did.
    pub tried: Option<Tried>,
}

/// Which sides of a condition the cases tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tried {
    pub held: bool,
    pub failed: bool,
}

impl Tried {
    /// What is missing, for a person: `never held`, `never failed`, `never checked`.
    pub fn missing(self) -> &'static str {
        match (self.held, self.failed) {
            (false, false) => "never checked",
            (false, true) => "never held",
            (true, false) => "never failed",
            (true, true) => "held and failed",
        }
    }
}

/// The coverage of one policy by every case that ran against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    pub grants: (usize, usize),
    pub capabilities: (usize, usize),
    pub accounts: (usize, usize),
    pub conditions: (usize, usize),
    pub uncovered: Vec<Uncovered>,
}

impl Coverage {
    /// Covered items over all items, in percent; a policy with nothing to
    /// cover is fully covered.
    pub fn percent(&self) -> f64 {
        let covered = self.grants.0 + self.capabilities.0 + self.accounts.0 + self.conditions.0;
        let total = self.grants.1 + self.capabilities.1 + self.accounts.1 + self.conditions.1;
        if total == 0 {
            return 100.0;
        }
        #[allow(clippy::cast_precision_loss)] // counts of a bounded artifact
        let ratio = covered as f64 / total as f64;
        ratio * 100.0
    }
}

pub fn measure<'a>(policy: &CompiledPolicy, results: impl IntoIterator<Item = &'a CaseResult>) -> Coverage {
    let mut grants = BTreeSet::new();
    let mut capabilities = BTreeSet::new();
    let mut accounts = BTreeSet::new();
    // (pointer, held): each side of each condition some case tried.
    let mut conditions: BTreeSet<(String, bool)> = BTreeSet::new();
    for result in results {
        grants.extend(result.exercised.grants.iter().copied());
        capabilities.extend(result.exercised.capabilities.iter().cloned());
        accounts.extend(result.exercised.accounts.iter().cloned());
        conditions.extend(result.exercised.conditions.iter().cloned());
    }
    let mut uncovered = Vec::new();
    let all_grants = policy.ruleset.grants();
    for (index, grant) in all_grants.iter().enumerate() {
        if !grants.contains(&index) {
            uncovered.push(Uncovered {
                kind: "grant",
                id: grant.path.clone(),
                path: grant.path.clone(),
                tried: None,
            });
        }
    }
    let all_capabilities = policy.ruleset.capabilities();
    for capability in all_capabilities {
        if !capabilities.contains(&capability.id) {
            uncovered.push(Uncovered {
                kind: "capability",
                id: capability.id.clone(),
                path: capability.path.clone(),
                tried: None,
            });
        }
    }
    for account in &policy.accounts {
        if !accounts.contains(&account.id) {
            uncovered.push(Uncovered {
                kind: "account",
                id: account.id.clone(),
                path: account.path.clone(),
                tried: None,
            });
        }
    }
    let mut all_conditions = 0;
    for condition in all_grants.iter().flat_map(|grant| &grant.conditions) {
        all_conditions += 1;
        let tried = Tried {
            held: conditions.contains(&(condition.path.clone(), true)),
            failed: conditions.contains(&(condition.path.clone(), false)),
        };
        if !(tried.held && tried.failed) {
            uncovered.push(Uncovered {
                kind: "condition",
                id: condition.test.written(),
                path: condition.path.clone(),
                tried: Some(tried),
            });
        }
    }
    let count = |kind: &str| uncovered.iter().filter(|item| item.kind == kind).count();
    Coverage {
        grants: (all_grants.len() - count("grant"), all_grants.len()),
        capabilities: (
            all_capabilities.len() - count("capability"),
            all_capabilities.len(),
        ),
        accounts: (policy.accounts.len() - count("account"), policy.accounts.len()),
        conditions: (all_conditions - count("condition"), all_conditions),
        uncovered,
    }
}
