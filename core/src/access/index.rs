//! The decision index: what selector matching and steps 3–7 need, computed
//! once when the ruleset is built, so that a decision is a few word
//! operations over a precomputed list of candidates instead of string
//! comparisons in scattered grants.
//!
//! * Per issuer, a *vocabulary*: the attribute names its grants select on,
//!   sorted (a name's *slot* is its position) and, per name, the values they
//!   require, sorted (a value's number is its position; the count of values
//!   is the number of every other value and of absence, which no selector
//!   requires).
//! * Per (capability, issuer), a *list* of the candidate grants, ordered most
//!   restrictive ceiling first (ties in file order), so that the winner of
//!   step 7 is the first candidate that matches. Per slot the list's
//!   selectors use and per value of that slot, a bitset of the candidates the
//!   value admits; matching is the AND of one bitset per slot, over
//!   ⌈candidates / 64⌉ words. A bitset of the disabled candidates answers
//!   step 5 with one more AND. A list whose bitsets would cost more than a
//!   few words per candidate and selector pair (many values for many
//!   candidates) keeps its selectors as (slot, value) pairs instead, checked
//!   candidate by candidate into the same bitset of matches: memory stays
//!   linear in the policy. Each issuer also keeps its lists in capability
//!   order, which a listing walks instead of looking every capability up.
//! * A principal is interned once per request (`Interned`, kept by
//!   `Prepared` for many decisions): its issuer's number and, per slot, the
//!   number of its value, found by one look-up per attribute of its (name,
//!   value) pair in a `Dictionary` (`dictionary.rs`): a few integer
//!   operations, no string hashing or `memcmp`.
//!
//! The grants themselves are only read for what the decision returns (the
//! winner's pointer, account and ceiling).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxBuildHasher;

use super::dictionary::Dictionary;
use super::evaluate::{Matches, Visit};
use super::limits::{orders_totally, replaces, restrictiveness, Rate};
use super::Grant;
use crate::principals::Principal;

/// Slots a principal's interned values hold without allocating; a vocabulary
/// with more attribute names spills to the heap.
const INLINE_SLOTS: usize = 8;

/// Words of a decision's bitset of matches held on the stack: lists of up to
/// 256 candidates decide without allocating.
const INLINE_WORDS: usize = 4;

/// The most words of value bitsets a list may hold per candidate and per
/// selector pair; a list that would need more keeps its selectors as pairs.
/// It bounds the bitsets' memory linearly in the policy, where one list of
/// n candidates selecting on n distinct values would otherwise cost n²/64
/// words.
const WORDS_PER_ENTRY: usize = 4;

/// The attribute names one issuer's grants select on and, per name, the
/// values they require, each numbered in sorted order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Vocabulary {
    /// (name, value) → `required[n]`, for every pair some selector requires.
    pairs: Dictionary<2>,
    /// The pair's slot and value number.
    required: Vec<(u32, u32)>,
    /// Per slot: the number of any value no selector requires, and of
    /// absence (the count of values some selector requires). It is the
    /// interned form of a principal with none of the attributes, which
    /// interning starts from: a copy of a value, not of a slice.
    unknown: Values,
}

impl Vocabulary {
    fn unknown(&self, slot: usize) -> u32 {
        self.unknown.as_ref()[slot]
    }
}

/// One candidate grant of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    /// Index of the grant in file order.
    grant: u32,
    /// The account, numbered by id: two candidates run as the same account
    /// iff their numbers are equal.
    account: u32,
    /// The selector: `pairs[start..start + len]` of the index (read only by
    /// lists that keep pairs).
    start: u32,
    len: u32,
}

/// The candidates of one issuer for one capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct List {
    issuer: u32,
    /// `candidates[start..end]` (and `rates`).
    start: u32,
    end: u32,
    /// `words[disabled..disabled + words]`: the candidates whose account is
    /// disabled.
    disabled: u32,
    /// `Some((from, to))`: matching is the AND of the value bitsets of
    /// `uses[from..to]`. `None`: each candidate's selector pairs are checked.
    uses: Option<(u32, u32)>,
    /// INVARIANT: if true, the candidates are in `restrictiveness` order,
    /// ties in file order, so the first match is the winner; if false (some
    /// ceiling with a 0 ms window, see `orders_totally`) they are in file
    /// order and the winner is the fold of `replaces` over the matches.
    ranked: bool,
    /// Every candidate runs as one account, so no match can be ambiguous.
    one_account: bool,
    /// Some candidate carries conditions: a decision must look at each match.
    conditional: bool,
}

impl List {
    fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Words per bitset of this list's candidates.
    fn words(&self) -> usize {
        self.len().div_ceil(64)
    }
}

/// The value bitsets of one slot in one list: the bitset of the candidates
/// value `v` admits (those that require `v` of the slot, or nothing of it)
/// is `words[at + v × list.words()..]`, for every `v` up to and including the
/// vocabulary's unknown number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotMasks {
    slot: u32,
    at: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Index {
    /// Issuer ids that some grant names, numbered in sorted order.
    issuers: Dictionary<1>,
    vocabularies: Vec<Vocabulary>,
    /// Per capability index: `lists[from..to]`, sorted by issuer number.
    by_capability: Vec<(u32, u32)>,
    /// Per issuer number: `issuer_lists[from..to]`, its lists in capability
    /// order as (capability index, list), which a listing walks instead of
    /// finding each capability's list of that issuer.
    by_issuer: Vec<(u32, u32)>,
    issuer_lists: Vec<(u32, u32)>,
    lists: Vec<List>,
    /// Every list's candidates, list after list.
    candidates: Vec<Candidate>,
    /// `rates[i]` is the ceiling of `candidates[i]`, apart because only an
    /// unranked list's fold reads it.
    rates: Vec<Option<Rate>>,
    /// Per list, the positions of its candidates in file order: where steps 4
    /// and 5 look for the first match of some kind.
    file_order: Vec<u32>,
    /// (slot, value number) pairs of the selectors of lists that keep pairs.
    pairs: Vec<(u32, u32)>,
    uses: Vec<SlotMasks>,
    /// Every list's bitsets: disabled candidates, then value bitsets.
    words: Vec<u64>,
}

/// What building the lists reads of each grant, computed once per grant:
/// `[g]` is grant `g`'s.
struct GrantFacts {
    /// The selector as (slot, value number) pairs.
    selectors: Vec<Vec<(u32, u32)>>,
    /// The account, numbered by id.
    accounts: Vec<u32>,
    /// The ceiling's rate.
    rates: Vec<Option<Rate>>,
}

fn number(n: usize) -> u32 {
    // INVARIANT: a ruleset has fewer than 2^32 grants, selector pairs,
    // candidates, bitset words and capabilities (an artifact is bounded far
    // below that).
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The positions of the set bits of `words`, in increasing order.
fn ones(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(at, &word)| {
        let mut rest = word;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let bit = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            Some(at * 64 + bit)
        })
    })
}

/// The position of the first set bit of `words`: what `ones(words).next()`
/// gives, without the iterator's state, for the step every decision takes.
fn first_one(words: &[u64]) -> Option<usize> {
    let at = words.iter().position(|&word| word != 0)?;
    Some(at * 64 + words[at].trailing_zeros() as usize)
}

fn set(words: &mut [u64], bit: usize) {
    words[bit / 64] |= 1 << (bit % 64);
}

fn has(words: &[u64], bit: usize) -> bool {
    words[bit / 64] >> (bit % 64) & 1 == 1
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
        let issuers = Dictionary::new(issuer_names.keys().map(|&issuer| [issuer]));
        let vocabularies: Vec<Vocabulary> = issuer_names
            .values()
            .map(|names| {
                let pairs = || {
                    names.iter().enumerate().flat_map(|(slot, (&name, values))| {
                        values
                            .iter()
                            .enumerate()
                            .map(move |(at, &value)| (slot, name, at, value))
                    })
                };
                Vocabulary {
                    pairs: Dictionary::new(pairs().map(|(_, name, _, value)| [name, value])),
                    required: pairs()
                        .map(|(slot, _, at, _)| (number(slot), number(at)))
                        .collect(),
                    unknown: Values::of(names.values().map(|values| number(values.len()))),
                }
            })
            .collect();

        // Each grant's selector as pairs, its account as a number and its
        // ceiling as a rate, once, rather than once per list that names it
        // and per comparison of the sort.
        let mut accounts: HashMap<&str, u32, FxBuildHasher> = HashMap::default();
        let mut lists: Vec<BTreeMap<u32, Vec<u32>>> = vec![BTreeMap::new(); capabilities];
        let mut grant_facts = GrantFacts {
            selectors: Vec::with_capacity(grants.len()),
            accounts: Vec::with_capacity(grants.len()),
            rates: Vec::with_capacity(grants.len()),
        };
        for (at, grant) in grants.iter().enumerate() {
            // INVARIANT: every grant's issuer and selector pair is in the
            // dictionaries, built above from these very grants.
            let issuer = number(issuers.get([&grant.issuer]).unwrap_or_default());
            let vocabulary = &vocabularies[issuer as usize];
            let pairs = grant
                .selector
                .iter()
                .map(|(name, value)| {
                    let at = vocabulary.pairs.get([name, value]).unwrap_or_default();
                    vocabulary.required[at]
                })
                .collect();
            grant_facts.selectors.push(pairs);
            let next = number(accounts.len());
            let account = *accounts.entry(grant.account.id.as_str()).or_insert(next);
            grant_facts.accounts.push(account);
            grant_facts.rates.push(grant.limits.as_ref().map(Rate::of));
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
            let from = number(index.lists.len());
            for (issuer, mut members) in by_issuer {
                let rate = |at: &u32| grant_facts.rates[*at as usize];
                let ranked = members.iter().all(|at| orders_totally(rate(at)));
                if ranked {
                    // Stable: candidates of equal restrictiveness stay in file order.
                    members.sort_by(|a, b| restrictiveness(rate(a), rate(b)));
                }
                index.push_list(issuer, &members, ranked, grants, &grant_facts);
            }
            index.by_capability.push((from, number(index.lists.len())));
        }
        let mut per_issuer: Vec<Vec<(u32, u32)>> = vec![Vec::new(); index.vocabularies.len()];
        for (capability, &(from, to)) in index.by_capability.iter().enumerate() {
            for list in from..to {
                let issuer = index.lists[list as usize].issuer as usize;
                per_issuer[issuer].push((number(capability), list));
            }
        }
        for lists in per_issuer {
            let from = number(index.issuer_lists.len());
            index.issuer_lists.extend(lists);
            index.by_issuer.push((from, number(index.issuer_lists.len())));
        }
        index
    }

    /// Appends the list of `members` (grant indices, in the list's order).
    fn push_list(
        &mut self,
        issuer: u32,
        members: &[u32],
        ranked: bool,
        grants: &[Grant],
        facts: &GrantFacts,
    ) {
        let GrantFacts {
            selectors,
            accounts,
            rates,
        } = facts;
        let start = number(self.candidates.len());
        let words = members.len().div_ceil(64);
        let disabled = self.words.len();
        self.words.resize(disabled + words, 0);
        for (at, &grant) in members.iter().enumerate() {
            if grants[grant as usize].account.disabled {
                set(&mut self.words[disabled..], at);
            }
            self.rates.push(rates[grant as usize]);
        }
        let first_account = members.first().map(|&at| accounts[at as usize]);
        let one_account = members
            .iter()
            .all(|&at| Some(accounts[at as usize]) == first_account);

        // The slots this list's selectors use, and what their bitsets would cost.
        let used: BTreeSet<u32> = members
            .iter()
            .flat_map(|&at| selectors[at as usize].iter().map(|&(slot, _)| slot))
            .collect();
        let vocabulary = &self.vocabularies[issuer as usize];
        let pairs: usize = members.iter().map(|&at| selectors[at as usize].len()).sum();
        let cost: usize = used
            .iter()
            .map(|&slot| (vocabulary.unknown(slot as usize) as usize + 1) * words)
            .sum();
        let uses = if cost <= WORDS_PER_ENTRY * (members.len() + pairs) {
            let from = number(self.uses.len());
            for &slot in &used {
                let at = self.words.len();
                let values = vocabulary.unknown(slot as usize) as usize + 1;
                self.words.resize(at + values * words, 0);
                for (bit, &member) in members.iter().enumerate() {
                    // A value admits the candidate iff every pair on the slot
                    // requires exactly it: no pair, every value (absence
                    // included); pairs requiring two values, none.
                    let mut required = selectors[member as usize]
                        .iter()
                        .filter(|&&(of, _)| of == slot)
                        .map(|&(_, value)| value as usize);
                    let admitted = match required.next() {
                        None => 0..values,
                        Some(value) if required.all(|other| other == value) => value..value + 1,
                        Some(_) => 0..0,
                    };
                    for value in admitted {
                        set(&mut self.words[at + value * words..], bit);
                    }
                }
                self.uses.push(SlotMasks { slot, at: number(at) });
            }
            Some((from, number(self.uses.len())))
        } else {
            None
        };

        let mut by_file: Vec<u32> = (0..number(members.len())).collect();
        by_file.sort_by_key(|&at| members[at as usize]);
        self.file_order.extend(by_file);
        for &member in members {
            let selector = &selectors[member as usize];
            self.candidates.push(Candidate {
                grant: member,
                account: accounts[member as usize],
                start: number(self.pairs.len()),
                len: number(if uses.is_some() { 0 } else { selector.len() }),
            });
            if uses.is_none() {
                self.pairs.extend_from_slice(selector);
            }
        }
        self.lists.push(List {
            issuer,
            start,
            end: number(self.candidates.len()),
            disabled: number(disabled),
            uses,
            ranked,
            one_account,
            conditional: members
                .iter()
                .any(|&member| !grants[member as usize].conditions.is_empty()),
        });
    }

    /// The principal's interned form for this index.
    pub(crate) fn intern(&self, principal: &Principal) -> Interned {
        let Some(issuer) = self.issuers.get([&principal.issuer]) else {
            return Interned {
                issuer: None,
                values: Values::of(std::iter::empty()),
            };
        };
        let vocabulary = &self.vocabularies[issuer];
        let mut values = vocabulary.unknown.clone();
        let slots = values.slots_mut();
        // An attribute no selector names, or with a value none requires,
        // is not in the dictionary: its slot, if any, stays unknown.
        for (name, value) in &principal.attributes {
            if let Some(at) = vocabulary.pairs.get([name, value]) {
                let (slot, known) = vocabulary.required[at];
                slots[slot as usize] = known;
            }
        }
        Interned {
            issuer: Some(number(issuer)),
            values,
        }
    }

    /// Steps 3–7's inputs for `interned` and the capability at `capability`:
    /// which of its issuer's candidates match, summed up as `Matches`, or
    /// `None` if none does.
    pub(crate) fn matches(&self, capability: usize, interned: &Interned) -> Option<Matches> {
        let issuer = interned.issuer?;
        let &(from, to) = self.by_capability.get(capability)?;
        let lists = &self.lists[from as usize..to as usize];
        let list = &lists[lists.binary_search_by_key(&issuer, |list| list.issuer).ok()?];
        self.list_matches(list, interned.values.as_ref())
    }

    /// `visit(grant, order)` for each grant of the capability's list that the interned
    /// principal matches, until `visit` returns `true`: what a decision reads when some
    /// candidate carries conditions. `order` is the list's: `Ranked` (most restrictive
    /// ceiling first, ties in file order, so the first grant that applies wins) or `FileOrder`.
    pub(crate) fn visit_matching(&self, capability: usize, interned: &Interned, visit: &mut Visit<'_>) {
        let Some(issuer) = interned.issuer else {
            return;
        };
        let Some(&(from, to)) = self.by_capability.get(capability) else {
            return;
        };
        let lists = &self.lists[from as usize..to as usize];
        let Ok(at) = lists.binary_search_by_key(&issuer, |list| list.issuer) else {
            return;
        };
        let list = &lists[at];
        let words = list.words();
        let mut inline = [0u64; INLINE_WORDS];
        let mut spilled = Vec::new();
        let matching: &mut [u64] = if words <= INLINE_WORDS {
            &mut inline[..words]
        } else {
            spilled.resize(words, 0);
            &mut spilled
        };
        self.match_into(list, interned.values.as_ref(), matching);
        let (start, end) = (list.start as usize, list.end as usize);
        let candidates = &self.candidates[start..end];
        if list.ranked {
            for at in ones(matching) {
                if visit(candidates[at].grant as usize, Order::Ranked) {
                    break;
                }
            }
        } else {
            for &at in &self.file_order[start..end] {
                if has(matching, at as usize)
                    && visit(candidates[at as usize].grant as usize, Order::FileOrder)
                {
                    break;
                }
            }
        }
    }

    /// `found(capability, matches)` for each capability index, in order, for
    /// which some candidate of the interned principal's issuer matches: what
    /// `matches` answers for every capability, without looking each one's
    /// list up.
    pub(crate) fn each_match(&self, interned: &Interned, mut found: impl FnMut(usize, Matches)) {
        let Some(issuer) = interned.issuer else {
            return;
        };
        let Some(&(from, to)) = self.by_issuer.get(issuer as usize) else {
            return;
        };
        let values = interned.values.as_ref();
        for &(capability, list) in &self.issuer_lists[from as usize..to as usize] {
            if let Some(matches) = self.list_matches(&self.lists[list as usize], values) {
                found(capability as usize, matches);
            }
        }
    }

    /// Which candidates of `list` the interned `values` select, summed up.
    #[inline(always)]
    fn list_matches(&self, list: &List, values: &[u32]) -> Option<Matches> {
        if let (Some((from, to)), 1..=64) = (list.uses, list.len()) {
            // Most lists: one word of matches, one load and one AND per slot
            // the selectors use, starting from every candidate (a list whose
            // selectors name no attribute uses no slot).
            let every = u64::MAX >> (64 - list.len());
            let word = self.uses[from as usize..to as usize]
                .iter()
                .fold(every, |word, uses| {
                    word & self.words[uses.at as usize + values[uses.slot as usize] as usize]
                });
            return self.summarise_word(list, word);
        }
        self.matches_in_words(list, values)
    }

    /// `matches` for a list of several words of candidates, or that keeps its
    /// selectors as pairs. Apart, so that the common path above saves and
    /// restores only the registers it uses.
    #[inline(never)]
    fn matches_in_words(&self, list: &List, values: &[u32]) -> Option<Matches> {
        let words = list.words();
        let mut inline = [0u64; INLINE_WORDS];
        let mut spilled = Vec::new();
        let matching: &mut [u64] = if words <= INLINE_WORDS {
            &mut inline[..words]
        } else {
            spilled.resize(words, 0);
            &mut spilled
        };
        self.match_into(list, values, matching);
        self.summarise(list, matching)
    }

    /// `summarise` for a list of at most 64 candidates, whose matches are one
    /// word: the common answer (ranked, one account, no disabled match: the
    /// first match wins, nothing else to report) without the general walk.
    fn summarise_word(&self, list: &List, word: u64) -> Option<Matches> {
        if word == 0 {
            return None;
        }
        if !(list.ranked && list.one_account)
            || list.conditional
            || word & self.words[list.disabled as usize] != 0
        {
            return self.summarise(list, &[word]);
        }
        let first = word.trailing_zeros();
        Some(Matches {
            winner: self.candidates[(list.start + first) as usize].grant as usize,
            ambiguous: None,
            disabled: None,
            conditional: false,
        })
    }

    /// Sets in `matching` (zeroed, `list.words()` long) the bit of every
    /// candidate of `list` whose selector `values` satisfy.
    fn match_into(&self, list: &List, values: &[u32], matching: &mut [u64]) {
        let words = matching.len();
        match list.uses {
            Some((from, to)) if from == to => {
                // No selector names any attribute: every candidate matches.
                matching.fill(u64::MAX);
                if list.len() % 64 != 0 {
                    matching[words - 1] = (1 << (list.len() % 64)) - 1;
                }
            }
            Some((from, to)) => {
                let uses = &self.uses[from as usize..to as usize];
                let admitted =
                    |uses: &SlotMasks| uses.at as usize + values[uses.slot as usize] as usize * words;
                if let [word] = matching {
                    // Most lists: one word, one load and one AND per slot.
                    *word = uses
                        .iter()
                        .fold(u64::MAX, |word, uses| word & self.words[admitted(uses)]);
                } else {
                    matching.fill(u64::MAX);
                    for uses in uses {
                        let at = admitted(uses);
                        for (word, mask) in matching.iter_mut().zip(&self.words[at..at + words]) {
                            *word &= mask;
                        }
                    }
                }
            }
            None => {
                let candidates = &self.candidates[list.start as usize..list.end as usize];
                for (bit, candidate) in candidates.iter().enumerate() {
                    let start = candidate.start as usize;
                    let selected = self.pairs[start..start + candidate.len as usize]
                        .iter()
                        .all(|&(slot, value)| values[slot as usize] == value);
                    if selected {
                        set(matching, bit);
                    }
                }
            }
        }
    }

    /// What steps 3–7 read of the matches of `list`: the same answers as the
    /// fold over the matching grants in file order (`Matches::fold`).
    #[inline(never)]
    fn summarise(&self, list: &List, matching: &[u64]) -> Option<Matches> {
        let (start, end) = (list.start as usize, list.end as usize);
        let candidates = &self.candidates[start..end];
        let first_match = first_one(matching)?;
        let winner = if list.ranked {
            first_match
        } else {
            let rates = &self.rates[start..end];
            ones(matching).fold(first_match, |incumbent, at| {
                if replaces(rates[at], rates[incumbent]) {
                    at
                } else {
                    incumbent
                }
            })
        };
        // The first in file order of the candidates that `wanted` accepts.
        let earliest = |wanted: &dyn Fn(usize) -> bool| {
            self.file_order[start..end]
                .iter()
                .map(|&at| at as usize)
                .find(|&at| wanted(at))
                .map(|at| candidates[at].grant as usize)
        };
        let ambiguous = if list.one_account {
            None
        } else {
            let account = candidates[winner].account;
            if ones(matching).any(|at| candidates[at].account != account) {
                earliest(&|at| has(matching, at))
            } else {
                None
            }
        };
        let disabled_words = &self.words[list.disabled as usize..list.disabled as usize + matching.len()];
        let disabled = if matching.iter().zip(disabled_words).any(|(m, d)| m & d != 0) {
            earliest(&|at| has(matching, at) && has(disabled_words, at))
        } else {
            None
        };
        Some(Matches {
            winner: candidates[winner].grant as usize,
            ambiguous,
            disabled,
            conditional: list.conditional,
        })
    }
}

/// The order `Index::visit_matching` visits a list's matches in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Most restrictive ceiling first, ties in file order: the first that applies wins.
    Ranked,
    /// File order: the winner is the fold of `replaces` over those that apply.
    FileOrder,
}

/// A principal interned against one ruleset's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interned {
    /// `None`: no grant names the principal's issuer.
    issuer: Option<u32>,
    values: Values,
}

/// Per slot, the number of the principal's value (the slot's unknown number
/// if it has none or one no selector requires).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Values {
    Inline { len: u8, slots: [u32; INLINE_SLOTS] },
    Spilled(Vec<u32>),
}

impl Values {
    fn of(numbers: impl ExactSizeIterator<Item = u32>) -> Self {
        let len = numbers.len();
        match u8::try_from(len) {
            Ok(short) if len <= INLINE_SLOTS => {
                let mut slots = [0; INLINE_SLOTS];
                for (slot, number) in slots.iter_mut().zip(numbers) {
                    *slot = number;
                }
                Values::Inline { len: short, slots }
            }
            _ => Values::Spilled(numbers.collect()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::AccountRef;

    /// `grants` grants of one issuer for one capability, the n-th selecting
    /// `team: value(n)`.
    fn index(grants: usize, value: impl Fn(usize) -> String) -> Index {
        let grants: Vec<Grant> = (0..grants)
            .map(|n| Grant {
                issuer: "corp".to_owned(),
                selector: vec![("team".to_owned(), value(n))],
                capabilities: vec!["crm.read".to_owned()],
                account: AccountRef {
                    id: "svc".to_owned(),
                    disabled: false,
                },
                limits: None,
                conditions: Vec::new(),
                path: format!("/grants/{n}"),
            })
            .collect();
        Index::new(1, &grants, |id| (id == "crm.read").then_some(0))
    }

    #[test]
    fn bitsets_where_they_are_cheap_pairs_where_they_would_grow_quadratically() {
        // 300 candidates on 3 values: 4 bitsets of 5 words.
        let few = index(300, |n| format!("t{}", n % 3));
        assert_eq!(few.lists.len(), 1);
        assert!(few.lists[0].uses.is_some());
        assert_eq!(few.words.len(), 5 + 4 * 5);
        assert!(few.pairs.is_empty());
        // 300 candidates on 300 values: 301 bitsets of 5 words, within
        // WORDS_PER_ENTRY per candidate and pair (2 400 words).
        assert!(index(300, |n| format!("t{n}")).lists[0].uses.is_some());
        // 1 000 on 1 000 values would need 1 001 bitsets of 16 words, twice
        // the bound: kept as pairs, 1 000 of them.
        let many = index(1_000, |n| format!("t{n}"));
        assert!(many.lists[0].uses.is_none());
        assert_eq!(many.words.len(), 16);
        assert_eq!(many.pairs.len(), 1_000);
    }
}
