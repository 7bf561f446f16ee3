//! Counting capped calls inside the audit batch's transaction
//! (docs/decisions/0025-ceilings-counted-in-the-audit-batch.md).
//!
//! A batch's capped calls ([`CounterAsk`]s, in arrival order) are counted by one
//! pass over the counters the transaction has locked: each ask is taken if its
//! window has room, in order, and refused otherwise. Both stores read and lock the
//! rows their own way, then hand them to [`count`]; what it changed is written
//! back before the batch's audit records, in the same transaction, so a call is
//! counted exactly when its record is stored.

use std::sync::atomic::{AtomicU8, Ordering};

use super::{sql, CounterReading};

/// The operation a `StoreError::Database` names when counting failed, as opposed to storing
/// the batch's entries: the audit writer then stores the batch without counting
/// ([`StoreError::is_counting`](super::StoreError::is_counting)).
pub const COUNT_USAGE: &str = "count_usage";

/// One capped call to count: its counter, the instant it was decided at and the
/// ceiling of the grant that allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterAsk {
    pub principal_id: String,
    pub capability: String,
    pub at_ms: i64,
    pub window_ms: u64,
    pub limit: u64,
}

/// What counting made of one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Counted: the counter now reads this, this call included.
    Taken(CounterReading),
    /// The window was full: the counter as it was found; nothing counted.
    Refused(CounterReading),
}

/// The distinct counters of `asks`, sorted (principal, capability) bytewise —
/// the order both stores lock them in, so two replicas' batches never wait for
/// each other in a cycle — and for each ask the position of its counter.
pub(crate) fn counter_keys(asks: &[CounterAsk]) -> (Vec<(&str, &str)>, Vec<usize>) {
    let mut keys: Vec<(&str, &str)> = asks
        .iter()
        .map(|ask| (ask.principal_id.as_str(), ask.capability.as_str()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let positions = asks
        .iter()
        .map(|ask| {
            let key = (ask.principal_id.as_str(), ask.capability.as_str());
            // Present: `keys` holds every ask's key.
            keys.binary_search(&key).unwrap_or_default()
        })
        .collect();
    (keys, positions)
}

/// The counters found for `keys` (as `counter_keys` made them), one per key in their order:
/// `rows` are the stored rows (principal, capability, calls, window start) of some of them, in any
/// order; a key with no row, or with a negative count (a row written behind capgate's back), has
/// none.
pub(crate) fn readings(
    keys: &[(&str, &str)],
    rows: impl IntoIterator<Item = (String, String, i64, i64)>,
) -> Vec<Option<CounterReading>> {
    let mut counters = vec![None; keys.len()];
    for (principal, capability, calls, window_start) in rows {
        if let Ok(at) = keys.binary_search(&(principal.as_str(), capability.as_str())) {
            counters[at] = u64::try_from(calls).ok().map(|calls| CounterReading {
                calls,
                window_start_ms: window_start,
            });
        }
    }
    counters
}

/// Counts `asks` in order against `counters` (one per key, as `counter_keys`
/// ordered them; `None` where the key has no row), updating them. A counter with
/// no call in it, or whose window expired at the ask's instant, opens a new window
/// at that instant. Returns one tally per ask.
pub(crate) fn count(
    asks: &[CounterAsk],
    positions: &[usize],
    counters: &mut [Option<CounterReading>],
) -> Vec<Tally> {
    asks.iter()
        .zip(positions)
        .map(|(ask, &position)| {
            let counter = &mut counters[position];
            let open = counter
                .filter(|found| found.calls > 0 && !expired(found.window_start_ms, ask.at_ms, ask.window_ms));
            let found = open.unwrap_or(CounterReading {
                calls: 0,
                window_start_ms: ask.at_ms,
            });
            if found.calls < ask.limit {
                let now = CounterReading {
                    calls: found.calls + 1,
                    window_start_ms: found.window_start_ms,
                };
                *counter = Some(now);
                Tally::Taken(now)
            } else {
                Tally::Refused(found)
            }
        })
        .collect()
}

/// Whether a window opened at `window_start_ms` has expired at `at_ms`
/// (`at_ms − window_start_ms ≥ window_ms`), computed without overflow.
fn expired(window_start_ms: i64, at_ms: i64, window_ms: u64) -> bool {
    sql::expired_at_or_before(at_ms, window_ms).is_some_and(|latest| window_start_ms <= latest)
}

/// Whether a batch's transaction may still commit, decided once between the
/// store, just before `COMMIT`, and the audit writer, when it stops waiting for
/// the batch: whichever comes first wins. Once the writer has abandoned a batch
/// (and told its capped calls that their usage is unknown) no transaction of it
/// commits; once one is committing, the writer waits for its outcome.
#[derive(Debug, Default)]
pub struct CommitGate(AtomicU8);

const OPEN: u8 = 0;
const COMMITTING: u8 = 1;
const ABANDONED: u8 = 2;

impl CommitGate {
    /// The store is about to commit: whether it may.
    pub fn commit(&self) -> bool {
        match self
            .0
            .compare_exchange(OPEN, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == COMMITTING,
        }
    }

    /// The writer stops waiting: whether no transaction of the batch can commit
    /// any more (`false`: one is committing or committed).
    pub fn abandon(&self) -> bool {
        match self
            .0
            .compare_exchange(OPEN, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == ABANDONED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(principal: &str, at_ms: i64, limit: u64) -> CounterAsk {
        CounterAsk {
            principal_id: principal.to_owned(),
            capability: "cap".to_owned(),
            at_ms,
            window_ms: 1_000,
            limit,
        }
    }

    fn reading(calls: u64, window_start_ms: i64) -> CounterReading {
        CounterReading {
            calls,
            window_start_ms,
        }
    }

    #[test]
    fn asks_are_taken_in_arrival_order_until_the_window_is_full() {
        let asks = [ask("b", 10, 2), ask("a", 11, 2), ask("b", 12, 2), ask("b", 13, 2)];
        let (keys, positions) = counter_keys(&asks);
        assert_eq!(keys, vec![("a", "cap"), ("b", "cap")]);
        assert_eq!(positions, vec![1, 0, 1, 1]);
        let mut counters = vec![None, Some(reading(1, 5))];
        let tallies = count(&asks, &positions, &mut counters);
        assert_eq!(
            tallies,
            vec![
                Tally::Taken(reading(2, 5)),
                Tally::Taken(reading(1, 11)),
                Tally::Refused(reading(2, 5)),
                Tally::Refused(reading(2, 5)),
            ]
        );
        assert_eq!(counters, vec![Some(reading(1, 11)), Some(reading(2, 5))]);
    }

    #[test]
    fn an_expired_or_empty_window_opens_at_the_asks_instant() {
        let asks = [ask("a", 1_005, 1), ask("b", 50, 1), ask("c", 60, 0)];
        let (_, positions) = counter_keys(&asks);
        // `a` opened at 5: expired at 1 005 (1 000 ms later). `b` has a row with no call.
        let mut counters = vec![Some(reading(1, 5)), Some(reading(0, 7)), None];
        let tallies = count(&asks, &positions, &mut counters);
        assert_eq!(
            tallies,
            vec![
                Tally::Taken(reading(1, 1_005)),
                Tally::Taken(reading(1, 50)),
                // A ceiling of zero takes nothing, not even a first call.
                Tally::Refused(reading(0, 60)),
            ]
        );
        assert_eq!(counters[2], None, "a refused ask writes nothing");
    }

    #[test]
    fn a_window_one_millisecond_short_of_its_end_is_still_full() {
        let asks = [ask("a", 1_004, 1)];
        let mut counters = vec![Some(reading(1, 5))];
        assert_eq!(
            count(&asks, &[0], &mut counters),
            vec![Tally::Refused(reading(1, 5))]
        );
    }

    #[test]
    fn a_window_of_forever_never_expires_even_at_the_ends_of_time() {
        let mut forever = ask("a", i64::MAX, 1);
        forever.window_ms = u64::MAX;
        let mut counters = vec![Some(reading(1, 0))];
        assert_eq!(
            count(&[forever.clone()], &[0], &mut counters),
            vec![Tally::Refused(reading(1, 0))]
        );
        // … except the one difference as large as the window itself.
        let mut counters = vec![Some(reading(1, i64::MIN))];
        assert_eq!(
            count(&[forever], &[0], &mut counters),
            vec![Tally::Taken(reading(1, i64::MAX))]
        );
    }

    #[test]
    fn the_gate_lets_exactly_one_side_win() {
        let gate = CommitGate::default();
        assert!(
            gate.commit() && gate.commit(),
            "a batch split in parts commits each"
        );
        assert!(!gate.abandon(), "a committing batch cannot be abandoned");
        let gate = CommitGate::default();
        assert!(gate.abandon() && gate.abandon());
        assert!(!gate.commit(), "an abandoned batch never commits");
    }
}
