//! `capgate audit --follow`: the matching records as they reach the store, oldest first, until
//! interrupted (Ctrl-C ends it with exit 0) or, with the hidden `--follow-for`, after a while.
//! The last `--limit` matching records come first, oldest first too, as `tail -f` starts.
//!
//! The store is polled every [`POLL`]. A record's place in the trail is its decision time, not
//! when it was committed: replicas commit in batches, so a record can land after a later one was
//! already printed. Each poll therefore reads again from [`LOOKBACK`] before the newest record
//! seen, and skips the ones printed already; a record that reaches the store later than that
//! after its decision (one replayed from a spool after an outage) is not followed — a query
//! finds it.
//!
//! Unlike every other command, this one writes as it goes, to standard output, one line per
//! record (`--json`: one JSON object per line), and returns nothing more to print.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use crate::clock;
use crate::store::{AnyStore, AuditCursor, AuditFilter, AuditRecord, Store};

use super::super::remote::runtime;
use super::super::{Exit, Failure, Outcome};
use super::Query;

/// How often the store is asked for new records.
const POLL: Duration = Duration::from_secs(1);

/// How far before the newest record seen each poll reads again: room for the batches replicas
/// commit (the audit writer's `--audit-timeout` is 1 s by default) and for their clocks' skew.
const LOOKBACK: i64 = 10_000;

/// Records read per query while catching up.
const PAGE: u32 = 500;

pub(super) fn run(args: &Query, filter: AuditFilter) -> Result<Outcome, Failure> {
    runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        let deadline = args.follow_for.map(|bound| tokio::time::Instant::now() + bound);
        let mut follower = Follower {
            store,
            filter,
            json: args.json,
            seen: BTreeSet::new(),
            newest: None,
        };
        let stopped = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        };
        tokio::select! {
            followed = follower.follow(args) => followed,
            () = stopped => Ok(()),
        }
    })?;
    Ok(Outcome::stdout(String::new(), Exit::Done))
}

struct Follower {
    store: AnyStore,
    /// The query's filter, as given (newest first, `--limit`).
    filter: AuditFilter,
    json: bool,
    /// What was printed at or after `newest − LOOKBACK`, to be skipped when read again.
    seen: BTreeSet<AuditCursor>,
    /// The latest decision time printed, or the start.
    newest: Option<i64>,
}

impl Follower {
    async fn follow(&mut self, args: &Query) -> Result<(), Failure> {
        let explain = |error| args.database.explain(error);
        // The last `--limit` records, oldest first.
        let mut last = self.store.query_audit(&self.filter).await.map_err(explain)?;
        last.reverse();
        // What the window already holds counts as seen, printed or not: a record the limit left
        // out is not new.
        let start = last.last().map_or_else(clock::now, |record| record.at_ms);
        self.newest = Some(start);
        for record in self.window(start).await.map_err(explain)? {
            self.seen.insert(cursor(&record));
        }
        if !self.print(&last) {
            return Ok(());
        }
        loop {
            tokio::time::sleep(POLL).await;
            let newest = self.newest.unwrap_or(start);
            let fresh: Vec<AuditRecord> = self
                .window(newest)
                .await
                .map_err(explain)?
                .into_iter()
                .filter(|record| !self.seen.contains(&cursor(record)))
                .collect();
            if !self.print(&fresh) {
                return Ok(());
            }
            if let Some(latest) = fresh.iter().map(|record| record.at_ms).max() {
                self.newest = Some(latest.max(newest));
            }
            let horizon = AuditCursor {
                at_ms: self.newest.unwrap_or(start).saturating_sub(LOOKBACK),
                decision_id: String::new(),
            };
            self.seen = self.seen.split_off(&horizon);
        }
    }

    /// Every matching record from `LOOKBACK` before `newest` on, oldest first, page by page.
    async fn window(&self, newest: i64) -> crate::store::StoreResult<Vec<AuditRecord>> {
        let from = newest.saturating_sub(LOOKBACK);
        let mut filter = AuditFilter {
            since_ms: Some(self.filter.since_ms.map_or(from, |since| since.max(from))),
            oldest_first: true,
            after: None,
            limit: PAGE,
            ..self.filter.clone()
        };
        let mut records = Vec::new();
        loop {
            let page = self.store.query_audit(&filter).await?;
            let full = page.len() == PAGE as usize;
            filter.after = page.last().map(cursor);
            records.extend(page);
            if !full {
                return Ok(records);
            }
        }
    }

    /// Prints `records` and marks them seen; `false` once standard output is gone (a closed
    /// pipe), which ends the follow.
    fn print(&mut self, records: &[AuditRecord]) -> bool {
        let mut stdout = std::io::stdout().lock();
        for record in records {
            let line = if self.json {
                serde_json::to_string(record).unwrap_or_default()
            } else {
                super::line(record)
            };
            if writeln!(stdout, "{line}").is_err() {
                return false;
            }
            self.seen.insert(cursor(record));
        }
        stdout.flush().is_ok()
    }
}

fn cursor(record: &AuditRecord) -> AuditCursor {
    AuditCursor {
        at_ms: record.at_ms,
        decision_id: record.decision_id.clone(),
    }
}
