//! `capgate audit prune --before T [--dry-run] [--json] [--database-url URL]`:
//! audit retention (docs/audit.md, "Retention").
//!
//! The audit trail is kept in calendar months (UTC): partitions on
//! PostgreSQL, groups of records on SQLite. A prune drops every month that
//! ends at or before `T` — whole, never part of one — and prints each with
//! its range and the records it held. The month holding `T` is kept whole,
//! and everything after it. `--dry-run` prints the same and drops nothing.
//! `T` is an RFC 3339 instant or a date (its midnight UTC), and may not be in
//! the future: the current month is never pruned.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::store::{retention, PrunedPeriod, Store};

use super::super::remote::{runtime, Database};
use super::super::{to_json, Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Drop the months that end at or before this instant (RFC 3339, a date
    /// `YYYY-MM-DD` for its midnight UTC, `today`, `yesterday`, or a span back
    /// from now such as `90d`); the month holding it is kept.
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub before: i64,
    /// Print what would be dropped, and drop nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print a JSON document instead of one line per month.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub database: Database,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    let before = args.before;
    if before > clock::now() {
        return Err(Failure::Usage(format!(
            "`--before {}` is in the future: a prune only drops months that are over",
            clock::format(before)
        )));
    }
    let pruned = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        store
            .prune_audit(before, args.dry_run)
            .await
            .map_err(|error| args.database.explain(error))
    })?;
    let stdout = if args.json {
        to_json(&document(before, args.dry_run, &pruned))
    } else {
        human(before, args.dry_run, &pruned)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn human(before: i64, dry_run: bool, pruned: &[PrunedPeriod]) -> String {
    let mut out = String::new();
    let verb = if dry_run { "would drop" } else { "dropped" };
    for period in pruned {
        let PrunedPeriod {
            name,
            from_ms,
            until_ms,
            records,
        } = period;
        let from = from_ms.map_or_else(|| "…".to_owned(), clock::format);
        let _ = writeln!(
            out,
            "{verb} {name}  [{from}, {})  {records} record(s)",
            clock::format(*until_ms)
        );
    }
    let total: u64 = pruned.iter().map(|period| period.records).sum();
    let cutoff = clock::format(before);
    match (pruned.is_empty(), dry_run) {
        (true, _) => {
            let _ = writeln!(
                out,
                "nothing to drop: no month of the audit trail ends by {cutoff}"
            );
        }
        (false, true) => {
            let _ = writeln!(
                out,
                "dry run: {} month(s), {total} record(s) would be dropped; nothing was",
                pruned.len()
            );
        }
        (false, false) => {
            let _ = writeln!(out, "dropped {} month(s), {total} record(s)", pruned.len());
        }
    }
    if let Some(kept) = retention::prune_cutoff(before).filter(|kept| *kept < before) {
        let _ = writeln!(
            out,
            "kept whole: the month from {} holds {cutoff}, and everything after it",
            clock::format(kept)
        );
    }
    out
}

fn document(before: i64, dry_run: bool, pruned: &[PrunedPeriod]) -> Value {
    let periods: Vec<Value> = pruned
        .iter()
        .map(|period| {
            let PrunedPeriod {
                name,
                from_ms,
                until_ms,
                records,
            } = period;
            json!({
                "name": name,
                "from": from_ms.map(clock::format),
                "until": clock::format(*until_ms),
                "records": records,
            })
        })
        .collect();
    json!({
        "before": clock::format(before),
        "dry_run": dry_run,
        "kept_from": retention::prune_cutoff(before).map(clock::format),
        "dropped": periods,
        "records": pruned.iter().map(|period| period.records).sum::<u64>(),
    })
}
