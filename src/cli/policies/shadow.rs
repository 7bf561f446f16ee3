//! `capgate policies shadow set REV | clear | show | report`: a shadow version, evaluated beside
//! the active one on live traffic without changing any answer (docs/decisions/0035).
//!
//! `set`, `clear` and `show` go through the server, as every `policies` command does (an admin
//! token). `report` reads the differences the replicas recorded from the store directly
//! (`--database-url`), as `capgate audit` reads the trail: counts per shadow revision and
//! transition, then the newest differences, each with both answers and both pointers.

use std::fmt::Write as _;

use crate::changes::Transition;
use crate::store::{AuditRecord, ShadowFilter, Store};
use crate::wire::convert;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{
    GetShadowPolicyRequest, GetShadowPolicyResponse, SetShadowPolicyRequest, SetShadowPolicyResponse,
};

use super::super::remote::{runtime, status_failure, Database, Server};
use super::super::{diff, publish, to_json, Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Evaluate a stored revision beside the active one on live traffic; prints what it would
    /// change, as `capgate diff` does.
    Set {
        /// The stored revision to shadow.
        #[arg(value_name = "REV")]
        revision: u64,
        /// Print the outcome as one JSON document.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Stop evaluating a shadow version (its recorded differences stay, until their retention).
    Clear {
        /// Print the outcome as one JSON document.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// The shadow version, who set it and when.
    Show {
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Where the shadow version decided otherwise: counts per revision and transition, then the
    /// newest differences, read from the store.
    Report(Report),
}

/// `policies shadow report`'s filters.
#[derive(Debug, clap::Args)]
pub struct Report {
    /// From this instant on (inclusive), as `capgate audit --since` takes it (`1h`, `7d`, a date).
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub since: Option<i64>,
    /// Before this instant (exclusive).
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub until: Option<i64>,
    /// Only this shadow revision's differences.
    #[arg(long, value_name = "REV")]
    pub revision: Option<u64>,
    /// Only this transition.
    #[arg(long, value_name = "T", value_parser = clap::builder::PossibleValuesParser::new(Transition::ALL.map(Transition::as_str)))]
    pub transition: Option<String>,
    /// At most this many differences listed (the counts are of all of them).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: u32,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub database: Database,
}

impl Command {
    pub fn json(&self) -> bool {
        match self {
            Command::Set { json, .. } | Command::Clear { json, .. } | Command::Show { json, .. } => *json,
            Command::Report(report) => report.json,
        }
    }
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    match &args.command {
        Command::Set {
            revision,
            json,
            server,
        } => set(Some(*revision), *json, server),
        Command::Clear { json, server } => set(None, *json, server),
        Command::Show { json, server } => show(*json, server),
        Command::Report(report) => self::report(report),
    }
}

fn set(revision: Option<u64>, as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = server.connect().await?;
        PolicyServiceClient::new(connection.channel.clone())
            .set_shadow_policy(connection.request(SetShadowPolicyRequest { revision }))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_failure(&status))
    })?;
    let SetShadowPolicyResponse { version, changes } = answer;
    if as_json {
        let document = serde_json::json!({
            "shadow": version.as_ref().map(|version| serde_json::json!({
                "revision": version.revision,
                "version": version.version,
            })),
            "changes": changes
                .iter()
                .filter_map(convert::change_from)
                .map(|change| diff::change_json(&change))
                .collect::<Vec<_>>(),
        });
        return Ok(Outcome::stdout(to_json(&document), Exit::Done));
    }
    let mut out = String::new();
    match version {
        None => {
            let _ = writeln!(out, "cleared: no shadow version is evaluated");
        }
        Some(version) => {
            let _ = writeln!(
                out,
                "shadow: revision {} ({}) is evaluated beside the active version; no answer changes. \
                 What it would change, as `capgate diff` shows it:\n",
                version.revision, version.version
            );
            out.push_str(&publish::render_changes(&changes));
        }
    }
    Ok(Outcome::stdout(out, Exit::Done))
}

fn show(as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = server.connect().await?;
        PolicyServiceClient::new(connection.channel.clone())
            .get_shadow_policy(connection.request(GetShadowPolicyRequest {}))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_failure(&status))
    })?;
    let GetShadowPolicyResponse {
        version,
        set_by,
        set_at,
    } = answer;
    let set_at = set_at.as_ref().map(|at| clock::format(convert::millis(at)));
    if as_json {
        let document = serde_json::json!({
            "shadow": version.as_ref().map(|version| serde_json::json!({
                "revision": version.revision,
                "version": version.version,
                "set_by": set_by,
                "set_at": set_at,
            })),
        });
        return Ok(Outcome::stdout(to_json(&document), Exit::Done));
    }
    let out = match version {
        None => "no shadow version is set\n".to_owned(),
        Some(version) => format!(
            "shadow: revision {} ({}), set by {set_by} at {}\n",
            version.revision,
            version.version,
            set_at.unwrap_or_default()
        ),
    };
    Ok(Outcome::stdout(out, Exit::Done))
}

fn report(args: &Report) -> Result<Outcome, Failure> {
    let filter = ShadowFilter {
        since_ms: args.since,
        until_ms: args.until,
        revision: args.revision,
        transition: args.transition.clone(),
        limit: args.limit,
    };
    let (counts, differences) = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        let counts = store
            .shadow_counts(&filter)
            .await
            .map_err(|error| args.database.explain(error))?;
        let differences = store
            .shadow_differences(&filter)
            .await
            .map_err(|error| args.database.explain(error))?;
        Ok::<_, Failure>((counts, differences))
    })?;
    // Newest shadow first, each in replay's order of transitions: deny → allow (widening) first.
    let mut counts = counts;
    counts.sort_by_key(|count| {
        (
            std::cmp::Reverse(count.revision),
            Transition::parse(&count.transition),
        )
    });
    if args.json {
        let document = serde_json::json!({
            "counts": counts.iter().map(|count| serde_json::json!({
                "revision": count.revision,
                "transition": count.transition,
                "records": count.records,
                "first_at": clock::format(count.first_at_ms),
                "last_at": clock::format(count.last_at_ms),
            })).collect::<Vec<_>>(),
            "differences": differences.iter().map(difference_json).collect::<Vec<_>>(),
        });
        return Ok(Outcome::stdout(to_json(&document), Exit::Done));
    }
    let mut out = String::new();
    if counts.is_empty() {
        let _ = writeln!(out, "no shadow difference recorded in this window");
        return Ok(Outcome::stdout(out, Exit::Done));
    }
    for count in &counts {
        let label = match Transition::parse(&count.transition) {
            Some(transition) => transition.label().to_owned(),
            None => count.transition.clone(),
        };
        let _ = writeln!(
            out,
            "shadow revision {:<5}  {label:18}  {:>8}  {} … {}",
            count.revision,
            count.records,
            clock::format(count.first_at_ms),
            clock::format(count.last_at_ms)
        );
    }
    if !differences.is_empty() {
        let _ = writeln!(out, "\nnewest differences:");
    }
    for record in &differences {
        let _ = writeln!(out, "{}", difference_line(record));
    }
    Ok(Outcome::stdout(out, Exit::Done))
}

/// One difference as one line: the transition, who and what, the active answer, then the shadow's.
fn difference_line(record: &AuditRecord) -> String {
    let Some(shadow) = record.shadow.as_deref() else {
        return String::new();
    };
    let what = record.tool.as_deref().or(record.capability.as_deref()).unwrap_or(
        if record.visible_count.is_some() {
            "listing"
        } else {
            "-"
        },
    );
    let active = format!(
        "{} {}{}",
        record.outcome.as_str(),
        record.code.map_or("-", |code| code.as_str()),
        record
            .path
            .as_deref()
            .map_or_else(String::new, |path| format!(" at {path}"))
    );
    let shadowed = format!(
        "{} {}{}",
        shadow.outcome.as_str(),
        shadow.code.as_deref().unwrap_or("-"),
        shadow
            .path
            .as_deref()
            .map_or_else(String::new, |path| format!(" at {path}"))
    );
    let mut line = format!(
        "{}  {:18}  {}  {what}  active: {active}  shadow r{}: {shadowed}",
        clock::format(record.at_ms),
        shadow.transition,
        record.principal_id.as_deref().unwrap_or("-"),
        shadow.revision,
    );
    if record.account_id != shadow.account_id {
        let _ = write!(
            line,
            "  account {} → {}",
            record.account_id.as_deref().unwrap_or("-"),
            shadow.account_id.as_deref().unwrap_or("-")
        );
    }
    if (record.limit_calls, &record.limit_per) != (shadow.limit_calls, &shadow.limit_per) {
        let ceiling = |calls: Option<u64>, per: &Option<String>| {
            calls.map_or_else(
                || "none".to_owned(),
                |calls| format!("{calls}/{}", per.as_deref().unwrap_or("?")),
            )
        };
        let _ = write!(
            line,
            "  ceiling {} → {}",
            ceiling(record.limit_calls, &record.limit_per),
            ceiling(shadow.limit_calls, &shadow.limit_per)
        );
    }
    if !shadow.gained.is_empty() {
        let _ = write!(line, "  +{}", shadow.gained.join(",+"));
    }
    if !shadow.lost.is_empty() {
        let _ = write!(line, "  -{}", shadow.lost.join(",-"));
    }
    let _ = write!(line, "  id={}", record.decision_id);
    line
}

fn difference_json(record: &AuditRecord) -> serde_json::Value {
    let shadow = record.shadow.as_deref().cloned().unwrap_or_default();
    serde_json::json!({
        "decision_id": record.decision_id,
        "at": clock::format(record.at_ms),
        "kind": record.kind.as_str(),
        "transition": shadow.transition,
        "principal_id": record.principal_id,
        "capability": record.capability,
        "tool": record.tool,
        "active": {
            "revision": record.policy_revision,
            "outcome": record.outcome.as_str(),
            "code": record.code.map(|code| code.as_str()),
            "path": record.path,
            "account_id": record.account_id,
            "limit_calls": record.limit_calls,
            "limit_per": record.limit_per,
        },
        "shadow": {
            "revision": shadow.revision,
            "outcome": shadow.outcome.as_str(),
            "code": shadow.code,
            "path": shadow.path,
            "account_id": shadow.account_id,
            "limit_calls": shadow.limit_calls,
            "limit_per": shadow.limit_per,
            "gained": shadow.gained,
            "lost": shadow.lost,
        },
    })
}
