//! Appending a batch so that one bad entry cannot sink the rest
//! (docs/decisions/0014). A batch holds the entries of many requests; the
//! store takes it in one transaction, so one value the store refuses (a
//! U+0000 PostgreSQL cannot hold, a count past `BIGINT`) fails them all. When
//! the store says the failure is about the data
//! ([`StoreError::is_data_error`](crate::store::StoreError::is_data_error)),
//! the batch is split in halves and each half tried again, down to single
//! units: the good ones commit, and only the unit that holds the bad value is
//! refused. k bad units among n cost about 2·k·log2(n) more transactions, and
//! none when the batch is good.
//!
//! A capped call is a unit whose entries are not known until it is counted (a
//! [`Meter`]): every attempt counts the meters of its units in the same
//! transaction as their entries (`Store::commit_batch`), so a call is counted
//! exactly when its record is stored, splits included.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{AuditRecord, CommitGate, CounterAsk, Store, Tally};
use crate::telemetry::{metrics, throttle, CallResult, Throttle};

use super::RememberedEntry;

/// A unit's entries once its call is counted: called with the tally, or with
/// `None` when the call could not be counted (its usage is unknown).
pub type Settler = Arc<dyn Fn(Option<Tally>) -> (Vec<AuditRecord>, Vec<RememberedEntry>) + Send + Sync>;

/// A capped call to count in a batch, and how its entries are made.
#[derive(Clone)]
pub struct Meter {
    pub ask: CounterAsk,
    pub settle: Settler,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("ask", &self.ask)
            .finish_non_exhaustive()
    }
}

/// Entries to append, in units that are stored or refused together: a
/// request's records and the response it remembers, a capped call to count
/// with the entries it makes, or one spooled entry. Units are kept in order,
/// so any range of them is one slice of records and one slice of responses
/// (a metered unit has none there) and the meters among them, in order.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) records: Vec<AuditRecord>,
    pub(super) remembered: Vec<RememberedEntry>,
    /// Where each unit ends, in `records` and in `remembered`.
    ends: Vec<(usize, usize)>,
    /// Each unit's meter, if it is a capped call.
    meters: Vec<Option<Meter>>,
}

impl Batch {
    /// Adds a unit.
    pub(super) fn push(&mut self, records: Vec<AuditRecord>, remembered: Vec<RememberedEntry>) {
        self.records.extend(records);
        self.remembered.extend(remembered);
        self.ends.push((self.records.len(), self.remembered.len()));
        self.meters.push(None);
    }

    /// Adds a capped call to count.
    pub(super) fn push_metered(&mut self, meter: Meter) {
        self.ends.push((self.records.len(), self.remembered.len()));
        self.meters.push(Some(meter));
    }

    /// The unit's meter, if it is a capped call.
    pub(super) fn meter(&self, unit: usize) -> Option<&Meter> {
        self.meters[unit].as_ref()
    }

    /// Whether any unit is a capped call.
    pub(super) fn metered(&self) -> bool {
        self.meters.iter().any(Option::is_some)
    }

    pub(super) fn units(&self) -> usize {
        self.ends.len()
    }

    /// The entries of the units in `units`.
    pub(super) fn entries(&self, units: Range<usize>) -> (&[AuditRecord], &[RememberedEntry]) {
        let (records_start, remembered_start) = match units.start {
            0 => (0, 0),
            start => self.ends[start - 1],
        };
        let (records_end, remembered_end) = match units.end {
            0 => (0, 0),
            end => self.ends[end - 1],
        };
        (
            &self.records[records_start..records_end],
            &self.remembered[remembered_start..remembered_end],
        )
    }
}

/// What became of one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fate {
    /// In the store.
    Stored,
    /// The store refused its values, with the store's words.
    Refused(String),
    /// Not stored: the store failed or did not answer before it was tried.
    Unstored,
}

/// What an append made of a batch.
#[derive(Debug)]
pub(super) struct Appended {
    /// One per unit.
    pub(super) fates: Vec<Fate>,
    /// One per unit: what counting made of a stored capped call.
    pub(super) tallies: Vec<Option<Tally>>,
    /// Why the units left [`Fate::Unstored`] were not stored: the store
    /// failed (not over the data) or did not answer by the deadline.
    pub(super) failure: Option<String>,
}

/// Appends `batch`, splitting it as long as the store refuses its data, until
/// every unit is stored or refused, or the store fails otherwise, or
/// `timeout` has passed since it began (what is left is then
/// [`Fate::Unstored`]): the splitting shares the batch's one deadline. Every
/// attempt is one audit transaction in the metrics. No attempt commits once
/// `gate` is abandoned.
pub(super) async fn append<S: Store>(
    store: &S,
    batch: &Batch,
    timeout: Duration,
    gate: &CommitGate,
) -> Appended {
    let deadline = Instant::now() + timeout;
    let mut fates = vec![Fate::Unstored; batch.units()];
    let mut tallies = vec![None; batch.units()];
    let mut failure = None;
    let mut counting = true;
    // A stack of unit ranges still to try, the earliest on top, so that units
    // are stored in the order they came.
    let mut pending: Vec<Range<usize>> = Vec::new();
    pending.push(0..batch.units());
    while let Some(units) = pending.pop() {
        if units.is_empty() {
            continue;
        }
        let (fixed_records, fixed_remembered) = batch.entries(units.clone());
        let metered: Vec<(usize, &Meter)> = units
            .clone()
            .filter_map(|unit| batch.meter(unit).map(|meter| (unit, meter)))
            .collect();
        // Once counting failed, the batch is stored without it: its capped calls are uncounted.
        let (records, remembered) = if counting || metered.is_empty() {
            (Cow::Borrowed(fixed_records), Cow::Borrowed(fixed_remembered))
        } else {
            let (records, remembered) = settle_all(metered.iter().map(|(_, meter)| (*meter, None)));
            (
                Cow::Owned([fixed_records, &records].concat()),
                Cow::Owned([fixed_remembered, &remembered].concat()),
            )
        };
        let asks: Vec<CounterAsk> = if counting {
            metered.iter().map(|(_, meter)| meter.ask.clone()).collect()
        } else {
            Vec::new()
        };
        let settle = |counted: &[Tally]| {
            settle_all(
                metered
                    .iter()
                    .zip(counted)
                    .map(|((_, meter), tally)| (*meter, Some(*tally))),
            )
        };
        let started = std::time::Instant::now();
        let attempt = tokio::time::timeout_at(
            deadline,
            store.commit_batch(&asks, &records, &remembered, &settle, gate),
        )
        .await;
        let result = match &attempt {
            Ok(Ok(_)) => CallResult::Ok,
            Ok(Err(_)) => CallResult::Error,
            Err(_) => CallResult::Timeout,
        };
        metrics().audit_commit(records.len() + asks.len(), result, started.elapsed());
        if !asks.is_empty() {
            metrics().counter_store("count", result, started.elapsed());
        }
        match attempt {
            Ok(Ok(counted)) => {
                for ((unit, _), tally) in metered.iter().zip(counted) {
                    tallies[*unit] = Some(tally);
                }
                fates[units].fill(Fate::Stored);
            }
            Ok(Err(error)) if error.is_counting() => {
                static COUNTING: Throttle = Throttle::every(throttle::EVERY);
                if let Some(held_back) = COUNTING.check() {
                    tracing::warn!(
                        %error,
                        batches_not_logged = held_back,
                        "the usage counters cannot be counted; capped calls are denied usage_unknown"
                    );
                }
                counting = false;
                pending.push(units);
            }
            Ok(Err(error)) if error.is_data_error() && units.len() == 1 => {
                fates[units.start] = Fate::Refused(error.to_string());
            }
            Ok(Err(error)) if error.is_data_error() => {
                let middle = units.start + units.len() / 2;
                pending.push(middle..units.end);
                pending.push(units.start..middle);
            }
            Ok(Err(error)) => {
                failure = Some(error.to_string());
                break;
            }
            Err(_) => {
                failure = Some(format!("no answer within {} ms", timeout.as_millis()));
                break;
            }
        }
    }
    Appended {
        fates,
        tallies,
        failure,
    }
}

/// The entries the meters make of their tallies, in order.
fn settle_all<'m>(
    meters: impl Iterator<Item = (&'m Meter, Option<Tally>)>,
) -> (Vec<AuditRecord>, Vec<RememberedEntry>) {
    let (mut records, mut remembered) = (Vec::new(), Vec::new());
    for (meter, tally) in meters {
        let (unit_records, unit_remembered) = (meter.settle)(tally);
        records.extend(unit_records);
        remembered.extend(unit_remembered);
    }
    (records, remembered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> AuditRecord {
        AuditRecord {
            decision_id: id.to_owned(),
            ..AuditRecord::default()
        }
    }

    fn ids(records: &[AuditRecord]) -> Vec<&str> {
        records.iter().map(|record| record.decision_id.as_str()).collect()
    }

    #[test]
    fn a_range_of_units_is_one_slice_of_each() {
        let mut batch = Batch::default();
        let answer = |id: &str| {
            (
                "gw".to_owned(),
                id.to_owned(),
                crate::store::Remembered {
                    decision_id: id.to_owned(),
                    response: Vec::new(),
                    at_ms: 0,
                    fingerprint: None,
                },
            )
        };
        batch.push(vec![record("a")], vec![answer("a")]);
        batch.push(vec![record("b1"), record("b2")], Vec::new());
        batch.push(Vec::new(), vec![answer("c")]);
        assert_eq!(batch.units(), 3);
        let (records, remembered) = batch.entries(1..3);
        assert_eq!((ids(records), remembered.len()), (vec!["b1", "b2"], 1));
        assert_eq!(remembered[0].1, "c");
        let (records, remembered) = batch.entries(0..1);
        assert_eq!((ids(records), remembered.len()), (vec!["a"], 1));
        let (records, remembered) = batch.entries(0..0);
        assert!(records.is_empty() && remembered.is_empty());
    }
}
