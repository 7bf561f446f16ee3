//! `capgate audit [FILTERS] [--since T] [--until T] [--limit N] [--json]`: the audit trail,
//! newest first, read from the store directly (`--database-url`). The filters are equalities on
//! the record's columns (principal, capability, account, outcome, code, tool, gateway, kind,
//! decision id, request id). `--since` is inclusive, `--until` exclusive; both take what
//! `clock::parse_when` takes (an instant, a date, `today`, `yesterday`, `1h`, `7d`), and
//! `--since` must come first. `--json` prints an array of records with the table's columns.
//!
//! Two other shapes of the same query: `--group-by KEYS` counts the matching records per value
//! of some columns, in the database (`groups.rs`); `--follow` keeps printing the records that
//! arrive (`follow.rs`).
//!
//! `capgate audit prune --before T` removes whole months of it (`prune.rs`);
//! the filters belong to the query and cannot be combined with it.

mod follow;
mod groups;
pub mod prune;

use std::time::Duration;

use std::fmt::Write as _;

use crate::store::{
    AuditFilter, AuditRecord, DecisionNote, Door, GroupKey, Note, RecordKind, RecordOutcome, Store,
};

use super::remote::{parse_duration, runtime, Database};
use super::{Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub query: Query,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Drop the audit records of every whole month before an instant.
    Prune(prune::Args),
}

/// The filters of a query (`capgate audit` without a subcommand).
#[derive(Debug, clap::Args)]
pub struct Query {
    /// Only this principal (`issuer:subject`).
    #[arg(long, value_name = "P")]
    pub principal: Option<String>,
    /// Only this capability.
    #[arg(long, value_name = "C")]
    pub capability: Option<String>,
    /// Only calls that ran as this execution account ("who used the billing account?").
    #[arg(long, value_name = "A")]
    pub account: Option<String>,
    /// Only this outcome.
    #[arg(long, value_name = "O", value_parser = clap::builder::PossibleValuesParser::new(RecordOutcome::ALL.map(RecordOutcome::as_str)))]
    pub outcome: Option<String>,
    /// Only this reason or problem code (`limit_exhausted`, `issuer_unknown`, …).
    #[arg(long, value_name = "X")]
    pub code: Option<String>,
    /// From this instant on (inclusive): RFC 3339, a date (`2026-12-01`, midnight UTC), `today`,
    /// `yesterday`, or a span back from now (`1h`, `7d`).
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub since: Option<i64>,
    /// Before this instant (exclusive), in the same forms as `--since`.
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub until: Option<i64>,
    /// Only calls of this exposed tool (`helpdesk__get_ticket`).
    #[arg(long, value_name = "TOOL")]
    pub tool: Option<String>,
    /// Only records written for this gateway: its token's name, or `loopback`.
    #[arg(long, value_name = "G")]
    pub gateway: Option<String>,
    /// Only decisions about calls (`decide`) or only listings (`list`).
    #[arg(long, value_name = "K", value_parser = clap::builder::PossibleValuesParser::new(RecordKind::ALL.map(RecordKind::as_str)))]
    pub kind: Option<String>,
    /// Only the record of this decision (the id a gateway was answered with).
    #[arg(long, value_name = "ID")]
    pub decision_id: Option<String>,
    /// Only the records of this request id (as the gateway sent it; add `--gateway` for one
    /// gateway's).
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
    /// Count the matching records per value of these columns, comma-separated: principal,
    /// capability, account, code, tool, gateway, outcome, kind, path (or rule: the grant's
    /// pointer). Most records first; `--limit` bounds the groups.
    #[arg(long, value_name = "KEYS", value_delimiter = ',', value_parser = parse_group_key, conflicts_with = "follow")]
    pub group_by: Vec<GroupKey>,
    /// Keep printing matching records as they reach the store, oldest first, polling it every
    /// second, until interrupted. The last `--limit` records come first, oldest first too.
    #[arg(long)]
    pub follow: bool,
    /// Stop following after this long (for tests and scripts).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "follow", hide = true)]
    pub follow_for: Option<Duration>,
    /// At most this many records (or groups, with `--group-by`).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: u32,
    /// Print a JSON array instead of one line per record (with `--follow`, one JSON object per
    /// line).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub database: Database,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    match &args.command {
        Some(Command::Prune(prune)) => prune::run(prune),
        None => query(&args.query),
    }
}

fn query(args: &Query) -> Result<Outcome, Failure> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(Failure::Usage(format!(
                "`--since {}` is not before `--until {}`: no record can match",
                clock::format(since),
                clock::format(until)
            )));
        }
    }
    let filter = AuditFilter {
        principal_id: args.principal.clone(),
        capability: args.capability.clone(),
        account_id: args.account.clone(),
        outcome: args.outcome.clone(),
        code: args.code.clone(),
        since_ms: args.since,
        until_ms: args.until,
        tool: args.tool.clone(),
        gateway: args.gateway.clone(),
        kind: args.kind.clone(),
        decision_id: args.decision_id.clone(),
        request_id: args.request_id.clone(),
        after: None,
        oldest_first: false,
        limit: args.limit,
    };
    if !args.group_by.is_empty() {
        return groups::run(args, &filter);
    }
    if args.follow {
        return follow::run(args, filter);
    }
    let (records, notes) = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        let records = store
            .query_audit(&filter)
            .await
            .map_err(|error| args.database.explain(error))?;
        // A gateway notes allows (`NoteDecision`); capgate notes any decision whose answer was
        // lost (`answer_lost`).
        let decided: Vec<String> = records.iter().map(|record| record.decision_id.clone()).collect();
        // In chunks: a database takes a bounded number of parameters (PostgreSQL 65,535),
        // `--limit` does not. A store an older server migrated has no notes table yet, and so no
        // notes.
        let mut notes = Vec::new();
        for ids in decided.chunks(NOTES_PER_QUERY) {
            match store.decision_notes(ids).await {
                Ok(found) => notes.extend(found),
                Err(error) if error.is_missing_table() => break,
                Err(error) => return Err(Failure::Input(error.to_string())),
            }
        }
        Ok::<_, Failure>((records, notes))
    })?;
    let stdout = if args.json {
        // The records' serde form: the columns, in table order (the spool's too), and `notes`
        // on a record a gateway noted.
        let mut json = serde_json::to_value(&records)
            .map_err(|error| Failure::Input(format!("cannot print the records as JSON: {error}")))?;
        if let Some(items) = json.as_array_mut() {
            for (item, record) in items.iter_mut().zip(&records) {
                let noted: Vec<&DecisionNote> = notes_of(&notes, &record.decision_id).collect();
                if !noted.is_empty() {
                    item["notes"] = serde_json::to_value(noted)
                        .map_err(|error| Failure::Input(format!("cannot print a note as JSON: {error}")))?;
                }
            }
        }
        super::to_json(&json)
    } else {
        human(&records, &notes)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

/// How many decision ids one query for their notes names.
const NOTES_PER_QUERY: usize = 1_000;

fn notes_of<'a>(notes: &'a [DecisionNote], decision_id: &'a str) -> impl Iterator<Item = &'a DecisionNote> {
    notes.iter().filter(move |note| note.decision_id == decision_id)
}

/// `--group-by`'s keys, as `GroupKey::parse` reads them.
fn parse_group_key(text: &str) -> Result<GroupKey, String> {
    GroupKey::parse(text).ok_or_else(|| {
        let known: Vec<&str> = GroupKey::ALL.iter().map(|key| key.as_str()).collect();
        format!("expected one of {}, or rule", known.join(", "))
    })
}

fn human(records: &[AuditRecord], notes: &[DecisionNote]) -> String {
    let mut out = String::new();
    if records.is_empty() {
        let _ = writeln!(out, "no audit record matches");
        return out;
    }
    for record in records {
        let _ = writeln!(out, "{}", line(record));
        for note in notes_of(notes, &record.decision_id) {
            let by = match note.kind {
                // capgate's own correction: the gateway is the one that was answered.
                Note::AnswerLost => format!("by capgate, answering {}", note.gateway),
                Note::CredentialFailed | Note::UpstreamFailed => format!("by {}", note.gateway),
            };
            let _ = writeln!(
                out,
                "    noted {}  {}  {by}: {}",
                clock::format(note.at_ms),
                note.kind.as_str(),
                note.detail
            );
        }
    }
    out
}

/// One record as one line, its decision id last.
fn line(record: &AuditRecord) -> String {
    let AuditRecord {
        decision_id,
        at_ms,
        request_id,
        gateway,
        kind,
        outcome,
        code,
        path,
        principal_id,
        issuer,
        subject,
        capability,
        tool,
        account_id,
        limit_calls,
        limit_per,
        usage_calls,
        policy_version: _,
        policy_revision,
        visible_count,
        visible,
        door,
        first_decision_id,
        arguments_digest,
        arguments,
        arguments_omitted,
        // In `--json`: the line names the principal by its id, which its attributes do not change.
        attributes: _,
        // Read by `capgate policies shadow report`; a queried record never has one.
        shadow: _,
    } = record;
    let who = principal_id.clone().unwrap_or_else(|| {
        format!(
            "{}:{}",
            issuer.as_deref().unwrap_or("?"),
            subject.as_deref().unwrap_or("?")
        )
    });
    let mut line = format!(
        "{}  {kind:6}  {outcome:15}  {:24}  {who}  {}",
        clock::format(*at_ms),
        code.as_ref().map_or("-", |code| code.as_str()),
        capability.as_deref().unwrap_or("-"),
    );
    if let Some(tool) = tool {
        let _ = write!(line, "  tool={tool}");
    }
    if let Some(account) = account_id {
        let _ = write!(line, "  account={account}");
    }
    if let (Some(calls), Some(per)) = (limit_calls, limit_per) {
        let _ = write!(line, "  limit={calls}/{per}");
    }
    if let Some(used) = usage_calls {
        let _ = write!(line, "  used={used}");
    }
    if let Some(path) = path {
        let _ = write!(line, "  at={path}");
    }
    if let Some(digest) = arguments_digest {
        // The call's arguments: their digest always, their (redacted) values where the server
        // was told to keep them.
        let _ = write!(line, "  arguments={digest}");
        if let Some(kept) = arguments {
            let _ = write!(line, " {kept}");
        }
        if let Some(bytes) = arguments_omitted {
            let _ = write!(line, " (values not kept: {bytes} bytes)");
        }
    }
    if let Some(count) = visible_count {
        // A listing: how many capabilities it showed, and the ones its record holds.
        let _ = write!(line, "  visible={count}({}", visible.join(","));
        let unrecorded = count.saturating_sub(visible.len() as u64);
        if unrecorded > 0 {
            let _ = write!(line, ",+{unrecorded} more");
        }
        line.push(')');
    }
    if let Some(revision) = policy_revision {
        let _ = write!(line, "  rev={revision}");
    }
    let _ = write!(line, "  gateway={gateway}");
    if *door != Door::Capgate {
        let _ = write!(line, "  door={}", door.as_str());
    }
    if let Some(request) = request_id {
        let _ = write!(line, "  request={request}");
    }
    if let Some(first) = first_decision_id {
        // A replay or a refused reuse: the decision its request id belongs to.
        let _ = write!(line, "  first={first}");
    }
    let _ = write!(line, "  id={decision_id}");
    line
}
