//! `capgate publish FILE [--catalog F] [--dry-run | --shadow] [--comment C]
//! [--expected-revision N] --server URL`: sends the artifact to the server,
//! which compiles it with the same compiler as `validate`. With `--shadow` the
//! version is stored as the shadow one: evaluated beside the active version on
//! live traffic, its differences recorded, no answer changed
//! (docs/decisions/0035).
//!
//! Rejected: stdout carries the diagnostics as `validate` prints them (the
//! server's, rendered against the local file), exit 1. Accepted: the
//! revision (or "unchanged", or "dry run") and the effective diff against
//! the previously active version, exit 0. A compare-and-set conflict exits 1.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::wire::convert;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{DecisionChange, Diagnostic, PublishPolicyRequest, PublishPolicyResponse};
use capgate_core::policy::Document;

use super::input::{Inputs, Source};
use super::remote::{conflict_or_failure, runtime, Server};
use super::{diff, json, render, Exit, Failure, Outcome};
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy artifact (`-` reads standard input).
    #[arg(value_name = "FILE")]
    pub policy: PathBuf,
    /// The declared catalog to publish with it.
    #[arg(long, value_name = "F")]
    pub catalog: Option<PathBuf>,
    /// Compile and diff on the server; store nothing.
    #[arg(long, conflicts_with = "shadow")]
    pub dry_run: bool,
    /// Store it as the shadow version instead of activating it: every replica evaluates it
    /// beside the active one and records where it decides otherwise (`policies shadow report`).
    #[arg(long)]
    pub shadow: bool,
    /// Free text stored with the version.
    #[arg(long, value_name = "C", default_value = "", hide_default_value = true)]
    pub comment: String,
    /// Publish only if this is still the active revision (0: none is active).
    #[arg(long, value_name = "N")]
    pub expected_revision: Option<u64>,
    /// Print the outcome as one JSON document (cli.md, "publish").
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: Server,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let source = inputs.policy(&args.policy)?;
    let artifact = String::from_utf8(source.bytes.clone())
        .map_err(|_| Failure::Input(format!("`{}` is not UTF-8", source.origin)))?;
    let catalog = match &args.catalog {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|error| {
            Failure::Input(format!(
                "cannot read the catalog `{}`: {}",
                path.display(),
                error.kind()
            ))
        })?),
        None => None,
    };
    let request = PublishPolicyRequest {
        artifact,
        catalog,
        expected_active_revision: args.expected_revision,
        dry_run: args.dry_run,
        comment: args.comment.clone(),
        shadow: args.shadow,
    };
    let answer = runtime()?.block_on(async {
        let connection = args.server.connect().await.map_err(Err)?;
        let mut client = PolicyServiceClient::new(connection.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        client
            .publish_policy(connection.request(request))
            .await
            .map_err(|status| conflict_or_failure(&status))
    });
    match answer {
        Ok(response) if args.json => Ok(report_json(&source, args, &response.into_inner())),
        Ok(response) => Ok(report(&source, args, &response.into_inner())),
        Err(refused) => refused,
    }
}

fn report(source: &Source, args: &Args, response: &PublishPolicyResponse) -> Outcome {
    let PublishPolicyResponse {
        accepted,
        revision,
        version,
        diagnostics,
        changes,
        unchanged,
    } = response;
    let mut stdout = String::new();
    if !diagnostics.is_empty() || !accepted {
        stdout.push_str(&render_diagnostics(source, diagnostics));
    }
    if !accepted {
        return Outcome {
            stdout,
            stderr: format!(
                "error: `{}` was not published: it does not compile\n",
                source.origin
            ),
            exit: Exit::Findings,
        };
    }
    if !stdout.is_empty() {
        stdout.push('\n');
    }
    if *unchanged {
        let _ = writeln!(stdout, "unchanged: revision {revision} already is {version}");
        return Outcome::stdout(stdout, Exit::Done);
    }
    if args.dry_run {
        let _ = writeln!(stdout, "dry run: {version} compiles; nothing was stored");
    } else if args.shadow {
        let _ = writeln!(
            stdout,
            "published: revision {revision} ({version}) is the shadow version; the active one still \
             answers (what the shadow would change, as `capgate diff` shows it, below)"
        );
    } else {
        let _ = writeln!(stdout, "published: revision {revision} ({version}) is active");
    }
    stdout.push('\n');
    stdout.push_str(&render_changes(changes));
    Outcome::stdout(stdout, Exit::Done)
}

/// The outcome as JSON: `{"policy", "accepted", "dry_run", "unchanged", "revision",
/// "diagnostics", "changes"}`; exit 1 when the artifact does not compile, as in the human form.
fn report_json(source: &Source, args: &Args, response: &PublishPolicyResponse) -> Outcome {
    let dry_run = args.dry_run;
    let PublishPolicyResponse {
        accepted,
        revision,
        version,
        diagnostics,
        changes,
        unchanged,
    } = response;
    let diagnostics: Vec<Value> = diagnostics
        .iter()
        .map(|diagnostic| match convert::diagnostic_from(diagnostic) {
            Ok(known) => json::diagnostic(&known),
            // A code this build does not know: what the server said, as it said it.
            Err(_) => serde_json::json!({
                "severity": diagnostic.severity,
                "code": diagnostic.code,
                "message": diagnostic.message,
                "path": diagnostic.path,
            }),
        })
        .collect();
    let changes: Vec<Value> = changes
        .iter()
        .filter_map(convert::change_from)
        .map(|change| diff::change_json(&change))
        .collect();
    let document = serde_json::json!({
        "policy": {"origin": source.origin, "version": version},
        "accepted": accepted,
        "dry_run": dry_run,
        "shadow": args.shadow,
        "unchanged": unchanged,
        "revision": (*accepted && (!dry_run || *unchanged)).then_some(*revision),
        "diagnostics": diagnostics,
        "changes": changes,
    });
    let exit = if *accepted { Exit::Done } else { Exit::Findings };
    Outcome::stdout(super::to_json(&document), exit)
}

/// The server's diagnostics as `validate` prints them, with snippets from
/// the local file. A code this build does not know is listed plainly.
fn render_diagnostics(source: &Source, diagnostics: &[Diagnostic]) -> String {
    let converted: Result<Vec<_>, String> = diagnostics.iter().map(convert::diagnostic_from).collect();
    match converted {
        Ok(converted) => {
            let document = Document::parse_bytes(&source.bytes).ok();
            render::diagnostics(source, document.as_ref(), &converted)
        }
        Err(_) => {
            let mut out = String::new();
            for diagnostic in diagnostics {
                let at = diagnostic
                    .position
                    .map(|p| format!(":{}:{}", p.line, p.column))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{}{at}  {}  {}\n  {}\n  at {}\n",
                    source.origin,
                    diagnostic.severity,
                    diagnostic.code,
                    diagnostic.message,
                    render::pointer(&diagnostic.path)
                );
            }
            out
        }
    }
}

/// The effective diff as `capgate diff` prints it.
pub(super) fn render_changes(changes: &[DecisionChange]) -> String {
    let converted: Option<Vec<_>> = changes.iter().map(convert::change_from).collect();
    match converted {
        Some(converted) => diff::human(&converted),
        None => format!(
            "{} decision(s) change (this build cannot show them)\n",
            changes.len()
        ),
    }
}
