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

use std::ops::Range;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{AuditRecord, Store};
use crate::telemetry::{metrics, CallResult};

use super::RememberedEntry;

/// Entries to append, in units that are stored or refused together: a
/// request's records and the response it remembers, or one spooled entry.
/// Units are kept in order, so any range of them is one slice of records and
/// one slice of responses.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) records: Vec<AuditRecord>,
    pub(super) remembered: Vec<RememberedEntry>,
    /// Where each unit ends, in `records` and in `remembered`.
    ends: Vec<(usize, usize)>,
}

impl Batch {
    /// Adds a unit.
    pub(super) fn push(&mut self, records: Vec<AuditRecord>, remembered: Vec<RememberedEntry>) {
        self.records.extend(records);
        self.remembered.extend(remembered);
        self.ends.push((self.records.len(), self.remembered.len()));
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
    /// Why the units left [`Fate::Unstored`] were not stored: the store
    /// failed (not over the data) or did not answer by the deadline.
    pub(super) failure: Option<String>,
}

/// Appends `batch`, splitting it as long as the store refuses its data, until
/// every unit is stored or refused, or the store fails otherwise, or
/// `timeout` has passed since it began (what is left is then
/// [`Fate::Unstored`]): the splitting shares the batch's one deadline. Every
/// attempt is one audit transaction in the metrics.
pub(super) async fn append<S: Store>(store: &S, batch: &Batch, timeout: Duration) -> Appended {
    let deadline = Instant::now() + timeout;
    let mut fates = vec![Fate::Unstored; batch.units()];
    let mut failure = None;
    // A stack of unit ranges still to try, the earliest on top, so that units
    // are stored in the order they came.
    let mut pending: Vec<Range<usize>> = Vec::new();
    pending.push(0..batch.units());
    while let Some(units) = pending.pop() {
        if units.is_empty() {
            continue;
        }
        let (records, remembered) = batch.entries(units.clone());
        let started = std::time::Instant::now();
        let attempt = tokio::time::timeout_at(deadline, store.append_audit(records, remembered)).await;
        let result = match &attempt {
            Ok(Ok(())) => CallResult::Ok,
            Ok(Err(_)) => CallResult::Error,
            Err(_) => CallResult::Timeout,
        };
        metrics().audit_commit(records.len(), result, started.elapsed());
        match attempt {
            Ok(Ok(())) => fates[units].fill(Fate::Stored),
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
    Appended { fates, failure }
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
