//! The decision index: what selector matching needs, computed once when the
//! ruleset is built, so that a decision compares small integers over a
//! contiguous run of candidates instead of strings in scattered grants.
//!
//! * Per issuer, a *vocabulary*: the attribute names its grants select on
//!   (each a slot) and, per name, the values they require (each a number).
//! * Per (capability, issuer), the candidate grants in file order, each with
//!   its selector as (slot, value) pairs, its account as a number, whether that
//!   account is disabled, and its ceiling as a rate: everything the decision
//!   loop reads, side by side in memory.
//! * A principal is interned once per request (`Prepared`): its issuer's
//!   number and, per slot, the number of the value it carries. A value no
//!   selector names and a missing attribute are both `ABSENT`, which no pair
//!   holds, so neither can satisfy a selector — as a string comparison would
//!   not.
//!
//! The grants themselves are only read for what the decision returns (the
//! winner's pointer, account and ceiling).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxBuildHasher;

use super::limits::Rate;
use super::Grant;
use crate::principals::Principal;

/// The value number of an attribute the principal lacks, or carries with a
/// value no selector of its issuer names.
const ABSENT: u32 = u32::MAX;

/// Slots a principal's interned values hold without allocating; a vocabulary
/// with more attribute names spills to the heap.
const INLINE_SLOTS: usize = 8;

/// A hash map keyed by the policy's ids, hashed with FxHash (rustc's hasher,
/// the `rustc-hash` crate): keys are the policy's own ids, looked up once or
/// twice per decision, where SipHash's resistance to chosen collisions costs
/// more than the rest of the look-up. Deterministic: no seed.
pub(crate) type IdMap<V> = HashMap<Box<str>, V, FxBuildHasher>;

/// The attribute names one issuer's grants select on and, per name, the
/// values they require: a name's slot and a value's number are its position
/// in sorted order, found by hashing (a request interns each of its
/// attributes once).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Vocabulary {
    /// Name → slot.
    slots: IdMap<u32>,
    /// Per slot: value → number.
    values: Vec<IdMap<u32>>,
}
/// One candidate grant of a (capability, issuer) list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Index of the grant in file order.
    pub grant: u32,
    /// The account, numbered by id: two candidates run as the same account
    /// iff their numbers are equal.
    pub account: u32,
    pub disabled: bool,
    /// The selector: `pairs[start..start + len]` of the index.
    start: u32,
    len: u32,
}

/// Where the candidates of one issuer for one capability are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    issuer: u32,
    start: u32,
    end: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Index {
    /// Issuer id → its number (issuers that some grant names).
    issuers: IdMap<u32>,
    vocabularies: Vec<Vocabulary>,
    /// Per capability index: `spans[from..to]`, sorted by issuer number.
    by_capability: Vec<(u32, u32)>,
    spans: Vec<Span>,
    /// Every list's candidates, list after list, each list in file order.
    candidates: Vec<Candidate>,
    /// `rates[i]` is the ceiling of `candidates[i]`, apart because the loop
    /// reads it only for the grants that match.
    rates: Vec<Option<Rate>>,
    /// (slot, value number) pairs of every candidate's selector, in candidate order.
    pairs: Vec<(u32, u32)>,
}

fn number(n: usize) -> u32 {
    // INVARIANT: a ruleset has fewer than 2^32 grants, selector pairs and
    // capabilities (an artifact is bounded far below that).
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Index {
    /// `capability_of(name)` is the index of the first declaration of a
    /// capability id, `None` for an undeclared one (whose grant entries are
    /// skipped, as the scan never reaches them either).
    pub(crate) fn new(
        capabilities: usize,
        grants: &[Grant],
        capability_of: impl Fn(&str) -> Option<usize>,
    ) -> Self {
        // Vocabularies first, in sorted order, so that numbers are positions.
        let mut issuer_names: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
        for grant in grants {
            let names = issuer_names.entry(grant.issuer.as_str()).or_default();
            for (name, value) in &grant.selector {
                names.entry(name.as_str()).or_default().insert(value.as_str());
            }
        }
        let mut issuers = IdMap::default();
        let mut vocabularies = Vec::with_capacity(issuer_names.len());
        for (number_of, (issuer, names)) in issuer_names.iter().enumerate() {
            issuers.insert(Box::from(*issuer), number(number_of));
            vocabularies.push(Vocabulary {
                slots: names
                    .keys()
                    .enumerate()
                    .map(|(slot, &name)| (Box::from(name), number(slot)))
                    .collect(),
                values: names
                    .values()
                    .map(|values| {
                        values
                            .iter()
                            .enumerate()
                            .map(|(at, &value)| (Box::from(value), number(at)))
                            .collect()
                    })
                    .collect(),
            });
        }

        // Each grant's selector as pairs, and its account as a number.
        let mut accounts: HashMap<&str, u32, FxBuildHasher> = HashMap::default();
        let mut lists: Vec<BTreeMap<u32, Vec<u32>>> = vec![BTreeMap::new(); capabilities];
        let mut selectors: Vec<Vec<(u32, u32)>> = Vec::with_capacity(grants.len());
        for (at, grant) in grants.iter().enumerate() {
            let issuer = issuers[grant.issuer.as_str()];
            let vocabulary = &vocabularies[issuer as usize];
            let pairs = grant
                .selector
                .iter()
                .map(|(name, value)| {
                    // Every selector pair is in its issuer's vocabulary, built above.
                    let slot = vocabulary.slots[name.as_str()];
                    (slot, vocabulary.values[slot as usize][value.as_str()])
                })
                .collect();
            selectors.push(pairs);
            let next = number(accounts.len());
            accounts.entry(grant.account.id.as_str()).or_insert(next);
            for named in &grant.capabilities {
                let Some(capability) = capability_of(named) else {
                    continue;
                };
                let list = lists[capability].entry(issuer).or_default();
                // A grant listing the same capability twice is one candidate.
                if list.last() != Some(&number(at)) {
                    list.push(number(at));
                }
            }
        }

        let mut index = Index {
            issuers,
            vocabularies,
            ..Index::default()
        };
        for by_issuer in lists {
            let from = number(index.spans.len());
            for (issuer, list) in by_issuer {
                let start = number(index.candidates.len());
                for at in list {
                    let grant = &grants[at as usize];
                    let selector = &selectors[at as usize];
                    index.candidates.push(Candidate {
                        grant: at,
                        account: accounts[grant.account.id.as_str()],
                        disabled: grant.account.disabled,
                        start: number(index.pairs.len()),
                        len: number(selector.len()),
                    });
                    index.rates.push(grant.limits.as_ref().map(Rate::of));
                    index.pairs.extend_from_slice(selector);
                }
                index.spans.push(Span {
                    issuer,
                    start,
                    end: number(index.candidates.len()),
                });
            }
            index.by_capability.push((from, number(index.spans.len())));
        }
        index
    }

    /// The principal's interned form for this index.
    pub(crate) fn intern(&self, principal: &Principal) -> Interned {
        let Some(&issuer) = self.issuers.get(principal.issuer.as_str()) else {
            return Interned {
                issuer: None,
                values: Values::new(0),
            };
        };
        let vocabulary = &self.vocabularies[issuer as usize];
        let mut values = Values::new(vocabulary.values.len());
        let slots = values.slots_mut();
        for (name, value) in &principal.attributes {
            let Some(&slot) = vocabulary.slots.get(name.as_str()) else {
                continue;
            };
            if let Some(&known) = vocabulary.values[slot as usize].get(value.as_str()) {
                slots[slot as usize] = known;
            }
        }
        Interned {
            issuer: Some(issuer),
            values,
        }
    }

    /// The candidates of `interned`'s issuer for the capability at `capability`,
    /// in file order, with the offset of the first in the index (for `rate`).
    pub(crate) fn candidates(&self, capability: usize, interned: &Interned) -> (usize, &[Candidate]) {
        let Some(issuer) = interned.issuer else {
            return (0, &[]);
        };
        let Some(&(from, to)) = self.by_capability.get(capability) else {
            return (0, &[]);
        };
        let spans = &self.spans[from as usize..to as usize];
        match spans.binary_search_by_key(&issuer, |span| span.issuer) {
            Ok(at) => {
                let span = spans[at];
                (
                    span.start as usize,
                    &self.candidates[span.start as usize..span.end as usize],
                )
            }
            Err(_) => (0, &[]),
        }
    }

    /// Whether `interned` satisfies the candidate's selector: every pair's
    /// slot holds the pair's value.
    pub(crate) fn selects(&self, candidate: &Candidate, interned: &Interned) -> bool {
        let values = interned.values.as_ref();
        let start = candidate.start as usize;
        self.pairs[start..start + candidate.len as usize]
            .iter()
            .all(|&(slot, value)| values.get(slot as usize) == Some(&value))
    }

    /// The ceiling of the candidate at `offset` in the index.
    pub(crate) fn rate(&self, offset: usize) -> Option<Rate> {
        self.rates[offset]
    }
}

/// A principal interned against one ruleset's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interned {
    /// `None`: no grant names the principal's issuer.
    issuer: Option<u32>,
    values: Values,
}

/// Per slot, the number of the principal's value (`ABSENT` if none).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Values {
    Inline { len: u8, slots: [u32; INLINE_SLOTS] },
    Spilled(Vec<u32>),
}

impl Values {
    fn new(len: usize) -> Self {
        match u8::try_from(len) {
            Ok(short) if len <= INLINE_SLOTS => Values::Inline {
                len: short,
                slots: [ABSENT; INLINE_SLOTS],
            },
            _ => Values::Spilled(vec![ABSENT; len]),
        }
    }

    fn slots_mut(&mut self) -> &mut [u32] {
        match self {
            Values::Inline { len, slots } => &mut slots[..usize::from(*len)],
            Values::Spilled(values) => values,
        }
    }
}

impl AsRef<[u32]> for Values {
    fn as_ref(&self) -> &[u32] {
        match self {
            Values::Inline { len, slots } => &slots[..usize::from(*len)],
            Values::Spilled(values) => values,
        }
    }
}
