//! The ruleset: the projection of a compiled policy that evaluation consumes
//! (docs/reference.md#compilation), with what a decision needs precomputed (the decision
//! index, `index.rs`) so that evaluating is index lookups, not scans.

use std::collections::BTreeMap;

use super::conditions::Condition;
use super::dictionary::Dictionary;
use super::evaluate::Prepared;
use super::index::Index;
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
    /// `when`: all must hold for the grant to apply to a call (none: it always applies).
    pub conditions: Vec<Condition>,
    /// `/grants/g`.
    pub path: String,
}

impl Grant {
    /// Selector semantics (docs/reference.md#grants): same issuer, and every selector
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
    /// Capability id → its number, an index into `declared_at`.
    ids: Dictionary<1>,
    /// Per capability id number: the index of its first declaration.
    declared_at: Vec<usize>,
    /// Per capability index: the index of the first declaration of its id
    /// (itself, unless the id is declared twice), which is what a decision on
    /// that id reads.
    first_declaration: Vec<usize>,
    /// Per capability index and issuer, the candidate grants in file order.
    index: Index,
    /// No id is declared twice: every capability is its own first
    /// declaration (always so in a compiled policy, which rejects a
    /// duplicate id).
    distinct_ids: bool,
}

impl Ruleset {
    pub fn new(capabilities: Vec<CapabilityRule>, grants: Vec<Grant>) -> Self {
        let mut first: BTreeMap<&str, usize> = BTreeMap::new();
        let mut declared_at = Vec::new();
        for (index, capability) in capabilities.iter().enumerate() {
            first.entry(capability.id.as_str()).or_insert_with(|| {
                declared_at.push(index);
                index
            });
        }
        // Numbered in declaration order: `declared_at[n]` is the n-th distinct id's.
        let ids = Dictionary::new(declared_at.iter().map(|&index| [capabilities[index].id.as_str()]));
        let first_declaration = capabilities
            .iter()
            .map(|capability| first[capability.id.as_str()])
            .collect();
        // Through the dictionary rather than `first`: each grant entry is looked
        // up, and comparing ids in a tree was a tenth of building the index.
        let index = Index::new(capabilities.len(), &grants, |id| {
            ids.get([id]).map(|number| declared_at[number])
        });
        let distinct_ids = declared_at.len() == capabilities.len();
        Ruleset {
            capabilities,
            grants,
            ids,
            declared_at,
            first_declaration,
            index,
            distinct_ids,
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
        let index = self.declared_at[self.ids.get([id])?];
        Some((index, &self.capabilities[index]))
    }

    /// The principal made ready for any number of decisions on this ruleset:
    /// its attributes are looked up and interned once, here, instead of in
    /// every decision (`evaluate_prepared`).
    pub fn prepare(&self, principal: &Principal) -> Prepared<'_> {
        Prepared::new(self, self.index.intern(principal))
    }

    /// The index of the first declaration of the capability declared at `index`.
    pub(crate) fn first_declaration(&self, index: usize) -> usize {
        self.first_declaration[index]
    }

    pub(crate) fn distinct_ids(&self) -> bool {
        self.distinct_ids
    }

    pub(crate) fn index(&self) -> &Index {
        &self.index
    }
}
