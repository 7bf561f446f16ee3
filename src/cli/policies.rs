//! `capgate policies list|activate`: the stored versions, and rolling back
//! (or forward) to one of them, through the server (`--server URL`, an admin
//! token). `activate` prints the effective diff it caused.

use std::fmt::Write as _;

use crate::wire::convert;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{
    ActivatePolicyRequest, ActivatePolicyResponse, ListPolicyVersionsRequest, PolicyVersion,
};

use super::remote::{conflict_or_failure, runtime, status_failure, Server};
use super::{publish, Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The stored versions, newest first; `*` marks the active one.
    List {
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 20)]
        limit: u32,
        /// Print a JSON array of versions.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Make a stored revision active again (a rollback).
    Activate {
        /// The revision to activate.
        #[arg(value_name = "REV")]
        revision: u64,
        /// Only if this is still the active revision.
        #[arg(long, value_name = "N")]
        expected_revision: Option<u64>,
        /// Print the outcome as one JSON document.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    match &args.command {
        Command::List { limit, json, server } => list(*limit, *json, server),
        Command::Activate {
            revision,
            expected_revision,
            json,
            server,
        } => activate(*revision, *expected_revision, *json, server),
    }
}

fn list(limit: u32, as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let versions = runtime()?.block_on(async {
        let connection = server.connect().await?;
        let mut client = PolicyServiceClient::new(connection.channel.clone());
        client
            .list_policy_versions(connection.request(ListPolicyVersionsRequest { limit }))
            .await
            .map(|response| response.into_inner().versions)
            .map_err(|status| status_failure(&status))
    })?;
    if as_json {
        let versions: Vec<serde_json::Value> = versions
            .iter()
            .map(|version| {
                serde_json::json!({
                    "revision": version.revision,
                    "version": version.version,
                    "active": version.active,
                    "author": version.author,
                    "comment": version.comment,
                    "created_at": version.created_at.as_ref().map(|at| clock::format(convert::millis(at))),
                })
            })
            .collect();
        return Ok(Outcome::stdout(
            super::to_json(&serde_json::Value::Array(versions)),
            Exit::Done,
        ));
    }
    let mut out = String::new();
    if versions.is_empty() {
        let _ = writeln!(out, "no policy version is stored");
    }
    for version in &versions {
        let PolicyVersion {
            revision,
            version,
            author,
            comment,
            created_at,
            active,
        } = version;
        let created = created_at
            .as_ref()
            .map_or_else(String::new, |at| clock::format(convert::millis(at)));
        let mark = if *active { "*" } else { " " };
        let line = format!("{mark} {revision:>5}  {created:24}  {version}  {author}  {comment}");
        let _ = writeln!(out, "{}", line.trim_end());
    }
    Ok(Outcome::stdout(out, Exit::Done))
}

/// A compare-and-set conflict exits 1, as `publish`'s does: the request was understood and
/// refused, which is a finding, not an input that could not be used.
fn activate(
    revision: u64,
    expected: Option<u64>,
    as_json: bool,
    server: &Server,
) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = server.connect().await.map_err(Err)?;
        let mut client = PolicyServiceClient::new(connection.channel.clone());
        client
            .activate_policy(connection.request(ActivatePolicyRequest {
                revision,
                expected_active_revision: expected,
            }))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| conflict_or_failure(&status))
    });
    let response = match answer {
        Ok(response) => response,
        Err(refused) => return refused,
    };
    let ActivatePolicyResponse { version, changes } = response;
    if as_json {
        let document = serde_json::json!({
            "revision": revision,
            "version": version.as_ref().map(|version| version.version.clone()),
            "changes": changes
                .iter()
                .filter_map(convert::change_from)
                .map(|change| super::diff::change_json(&change))
                .collect::<Vec<_>>(),
        });
        return Ok(Outcome::stdout(super::to_json(&document), Exit::Done));
    }
    let mut out = String::new();
    let label = version.as_ref().map_or("", |version| version.version.as_str());
    let _ = writeln!(out, "activated: revision {revision} ({label}) is active\n");
    out.push_str(&publish::render_changes(&changes));
    Ok(Outcome::stdout(out, Exit::Done))
}
