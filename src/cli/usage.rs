//! `capgate usage --principal P [--capability C] [--json]`: a principal's usage counters, read
//! from the store directly (`--database-url`, as `audit`): per capability, the calls counted in
//! the window that opened at its start, and the resets an admin made.
//!
//! `capgate usage reset --principal P --capability C --server URL`: resets one counter, so the
//! next call opens a fresh window. An admin action, so it goes through the server with an admin
//! token, which names who did it; the store records the reset with that name and what the
//! counter read, in the transaction that removes it (docs/decisions/0022).

use std::fmt::Write as _;

use crate::clock;
use crate::store::{Store, StoredCounter, UsageReset};
use crate::wire::convert;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{ResetUsageRequest, ResetUsageResponse};

use super::remote::{runtime, status_failure, Database, Server};
use super::{Exit, Failure, Outcome};

/// Counters and resets shown at most: a principal has one counter per capped capability.
const SHOWN: u32 = 1000;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub query: Query,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Reset one counter through the server (an admin token); the reset is recorded.
    Reset(Reset),
}

/// Whose counters to show (`capgate usage` without a subcommand).
#[derive(Debug, clap::Args)]
pub struct Query {
    /// The principal (`issuer:subject`).
    #[arg(long, value_name = "P", required = true)]
    pub principal: Option<String>,
    /// Only this capability's counter.
    #[arg(long, value_name = "C")]
    pub capability: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub database: Database,
}

#[derive(Debug, clap::Args)]
pub struct Reset {
    /// The principal (`issuer:subject`).
    #[arg(long, value_name = "P")]
    pub principal: String,
    /// The capability whose counter to reset.
    #[arg(long, value_name = "C")]
    pub capability: String,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: Server,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    match &args.command {
        Some(Command::Reset(reset)) => reset_counter(reset),
        None => show(&args.query),
    }
}

fn show(args: &Query) -> Result<Outcome, Failure> {
    // Required by clap unless a subcommand is given.
    let principal = args.principal.as_deref().unwrap_or_default();
    let capability = args.capability.as_deref();
    let (counters, resets) = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        let counters = store
            .counters(principal, capability, SHOWN)
            .await
            .map_err(|error| args.database.explain(error))?;
        let resets = store
            .usage_resets(principal, capability, SHOWN)
            .await
            .map_err(|error| args.database.explain(error))?;
        Ok::<_, Failure>((counters, resets))
    })?;
    let stdout = if args.json {
        super::to_json(&serde_json::json!({
            "principal": principal,
            "counters": counters.iter().map(|counter| {
                let StoredCounter { principal_id: _, capability, reading } = counter;
                serde_json::json!({
                    "capability": capability,
                    "calls": reading.calls,
                    "window_start": clock::format(reading.window_start_ms),
                })
            }).collect::<Vec<_>>(),
            "resets": resets.iter().map(reset_json).collect::<Vec<_>>(),
        }))
    } else {
        human(principal, &counters, &resets)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn reset_json(reset: &UsageReset) -> serde_json::Value {
    let UsageReset {
        at_ms,
        actor,
        principal_id: _,
        capability,
        reading,
    } = reset;
    serde_json::json!({
        "at": clock::format(*at_ms),
        "actor": actor,
        "capability": capability,
        "calls": reading.calls,
        "window_start": clock::format(reading.window_start_ms),
    })
}

fn human(principal: &str, counters: &[StoredCounter], resets: &[UsageReset]) -> String {
    let mut out = String::new();
    if counters.is_empty() {
        let _ = writeln!(out, "no usage counter for `{principal}`");
    } else {
        let width = counters
            .iter()
            .map(|counter| counter.capability.chars().count())
            .chain(["capability".len()])
            .max()
            .unwrap_or(0);
        let _ = writeln!(out, "{:width$}  {:>8}  window start", "capability", "calls");
        for counter in counters {
            let _ = writeln!(
                out,
                "{:width$}  {:>8}  {}",
                counter.capability,
                counter.reading.calls,
                clock::format(counter.reading.window_start_ms)
            );
        }
    }
    for reset in resets {
        let _ = writeln!(
            out,
            "reset {} by {}: {}, {} call(s) in the window from {}",
            clock::format(reset.at_ms),
            reset.actor,
            reset.capability,
            reset.reading.calls,
            clock::format(reset.reading.window_start_ms)
        );
    }
    out
}

fn reset_counter(args: &Reset) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = args.server.connect().await?;
        PolicyServiceClient::new(connection.channel.clone())
            .reset_usage(connection.request(ResetUsageRequest {
                principal_id: args.principal.clone(),
                capability: args.capability.clone(),
            }))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_failure(&status))
    })?;
    let ResetUsageResponse {
        reset,
        calls,
        window_start,
    } = answer;
    let window_start = window_start.map(|at| clock::format(convert::millis(&at)));
    let stdout = if args.json {
        super::to_json(&serde_json::json!({
            "principal": args.principal,
            "capability": args.capability,
            "reset": reset,
            "calls": reset.then_some(calls),
            "window_start": window_start,
        }))
    } else if reset {
        format!(
            "reset: `{}` on `{}` had {calls} call(s) in the window from {}; the next call opens a \
             new one\n",
            args.principal,
            args.capability,
            window_start.unwrap_or_default()
        )
    } else {
        format!(
            "nothing to reset: `{}` has no counter for `{}`\n",
            args.principal, args.capability
        )
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}
