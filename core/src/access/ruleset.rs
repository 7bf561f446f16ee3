//! The ruleset: the projection of a compiled policy that evaluation consumes
//! (policy-core §2.5), with what a decision needs precomputed so that
//! evaluating is index lookups, not scans.

use std::collections::HashMap;

use super::Limits;
use crate::accounts::AccountRef;
use crate::principals::Principal;

/// Where a `capability_not_declared` points: the section, since what is
/// missing has no place of its own.
pub const CAPABILITIES_ANCHOR: &str = "/capabilities";
/// Where a `no_grant_matches` points.
pub const GRANTS_ANCHOR: &str = "/grants";

/// A declared capability as evaluation sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityRule {
    pub id: String,
    pub realized: bool,
    /// `/capabilities/i`.
    pub path: String,
}

/// A grant: selector → capabilities → account, with an optional ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub issuer: String,
    /// `to.attributes` as written (`{}` when absent).
    pub selector: Vec<(String, String)>,
    /// As listed; duplicates allowed.
    pub capabilities: Vec<String>,
    pub account: AccountRef,
    pub limits: Option<Limits>,
    /// `/grants/g`.
    pub path: String,
}

impl Grant {
    /// Selector semantics (policy-core §3.1): same issuer, and every selector
    /// pair present in the principal with exactly that value.
    pub fn matches(&self, principal: &Principal) -> bool {
        self.issuer == principal.issuer && self.selects(principal)
    }

    /// The attribute half of `matches`, for callers that already know the issuer.
    pub(crate) fn selects(&self, principal: &Principal) -> bool {
        self.selector
            .iter()
            .all(|(name, value)| principal.attributes.get(name) == Some(value))
    }

    pub fn names(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|named| named == capability)
    }
}

/// Capabilities and grants, indexed by capability and then by issuer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    capabilities: Vec<CapabilityRule>,
    grants: Vec<Grant>,
    /// Capability id → index of its first declaration.
    by_capability: HashMap<String, usize>,
    /// Per capability index: issuer → the grants naming it, in file order.
    candidates: Vec<HashMap<String, Box<[u32]>>>,
}

impl Ruleset {
    pub fn new(capabilities: Vec<CapabilityRule>, grants: Vec<Grant>) -> Self {
        let mut by_capability = HashMap::with_capacity(capabilities.len());
        for (index, capability) in capabilities.iter().enumerate() {
            by_capability.entry(capability.id.clone()).or_insert(index);
        }
        let mut building: Vec<HashMap<String, Vec<u32>>> = vec![HashMap::new(); capabilities.len()];
        for (index, grant) in grants.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            for named in &grant.capabilities {
                let Some(&capability) = by_capability.get(named) else {
                    continue;
                };
                let list = building[capability].entry(grant.issuer.clone()).or_default();
                // A grant listing the same capability twice is one candidate.
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        let candidates = building
            .into_iter()
            .map(|by_issuer| {
                by_issuer
                    .into_iter()
                    .map(|(issuer, list)| (issuer, list.into_boxed_slice()))
                    .collect()
            })
            .collect();
        Ruleset {
            capabilities,
            grants,
            by_capability,
            candidates,
        }
    }

    pub fn capabilities(&self) -> &[CapabilityRule] {
        &self.capabilities
    }

    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// The declared capability with that id (its first declaration).
    pub fn capability(&self, id: &str) -> Option<(usize, &CapabilityRule)> {
        let &index = self.by_capability.get(id)?;
        Some((index, &self.capabilities[index]))
    }

    /// The grants of `issuer` that name the capability at `index`, in file order.
    pub(crate) fn candidates(&self, index: usize, issuer: &str) -> &[u32] {
        self.candidates
            .get(index)
            .and_then(|by_issuer| by_issuer.get(issuer))
            .map_or(&[], |list| list)
    }
}
