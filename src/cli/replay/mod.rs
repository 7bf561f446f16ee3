//! `capgate replay --policy CANDIDATE --since T [--until T]`: what a candidate policy would have
//! decided on the calls and listings the audit trail recorded (cli.md, `replay`). Every record of
//! the window is decided again under the candidate — on the principal it recorded (issuer,
//! subject, attributes), its target, its instant, the usage its ceiling was checked against and
//! the arguments it kept — and compared with what was decided, in the words of
//! `crate::changes` that shadow versions use too. Records that cannot be decided again are
//! counted by cause, never guessed (`engine.rs`).
//!
//! Read from the store directly (`--database-url`), streaming: the memory it takes does not
//! grow with the records read.

pub mod engine;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::changes::Transition;
use crate::clock;

use super::args::Common;
use super::diff::FailOn;
use super::input::{Inputs, Loaded};
use super::remote::{runtime, Database};
use super::{json, validate, Exit, Failure, Outcome};
use engine::{Cause, Changed, Example, Report, Window};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The candidate policy artifact (`-` reads standard input).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// Replay the records from this instant on (inclusive): RFC 3339, a date (`2026-12-01`,
    /// midnight UTC), `today`, `yesterday`, or a span back from now (`1h`, `7d`).
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub since: i64,
    /// Up to this instant (exclusive), in the same forms as `--since` (default: now).
    #[arg(long, value_name = "T", value_parser = clock::parse_when)]
    pub until: Option<i64>,
    /// Exit 1 when a change of this kind is found: `widening` (deny → allow, another account or
    /// ceiling, a listing that shows more) or `any`. Without it, a report exits 0.
    #[arg(long, value_enum, value_name = "WHICH")]
    pub fail_on: Option<FailOn>,
    /// How many example records to show per kind of change.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub examples: usize,
    /// How many of the most affected principals, and tools or capabilities, to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub database: Database,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let until = args.until.unwrap_or_else(clock::now);
    if args.since >= until {
        return Err(Failure::Usage(format!(
            "`--since {}` is not before `--until {}`: there is nothing to replay",
            clock::format(args.since),
            clock::format(until)
        )));
    }
    let window = Window {
        since_ms: args.since,
        until_ms: until,
    };
    let source = inputs.policy(&args.policy)?;
    let catalog = inputs.catalog(args.common.catalog.as_deref())?;
    let loaded = Loaded::compile(source, catalog.as_ref());
    let Some(policy) = &loaded.compilation.policy else {
        // What `validate` prints, and nothing replayed: the candidate is an input that cannot be
        // used (as a side of `diff` that does not compile).
        return Ok(Outcome {
            stdout: validate::report(&loaded, args.common.json),
            stderr: format!(
                "error: nothing replayed: `{}` does not compile\n",
                loaded.source.origin
            ),
            exit: Exit::Input,
        });
    };
    let report = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        engine::replay(&store, policy, window, args.examples)
            .await
            .map_err(|error| args.database.explain(error))
    })?;
    let failing = match args.fail_on {
        None => false,
        Some(FailOn::Any) => report.changed() > 0,
        Some(FailOn::Widening) => report.widens(),
    };
    let stdout = if args.common.json {
        super::to_json(&document(&loaded, window, &report, args.top))
    } else {
        human(&loaded, window, &report, args.top)
    };
    Ok(Outcome::stdout(
        stdout,
        if failing { Exit::Findings } else { Exit::Done },
    ))
}

/// The `--json` document (cli.md, "replay").
fn document(loaded: &Loaded, window: Window, report: &Report, top: usize) -> Value {
    let counts = |pairs: Vec<(&str, u64)>, key: &str| -> Value {
        pairs
            .into_iter()
            .map(|(name, records)| json!({key: name, "records": records}))
            .collect()
    };
    json!({
        "policy": json::policy(&loaded.source, &loaded.compilation.version),
        "since": clock::format(window.since_ms),
        "until": clock::format(window.until_ms),
        "records": {
            "read": report.read,
            "replayed": report.replayed,
            "unchanged": report.unchanged,
            "changed": report.changed(),
            "not_replayable": report.not_replayable_total(),
        },
        "transitions": Transition::ALL.into_iter().map(|transition| json!({
            "transition": transition.as_str(),
            "widens": transition.widens(),
            "records": report.count(transition),
            "examples": report.examples_of(transition).iter().map(example_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "not_replayable": Cause::ALL.into_iter().map(|cause| json!({
            "cause": cause.as_str(),
            "records": report.not_replayable(cause),
        })).collect::<Vec<_>>(),
        "ceilings": {
            "against_recorded_usage": report.ceilings_against_recorded_usage,
            "without_recorded_usage": report.ceilings_without_recorded_usage,
        },
        "principals": counts(report.top_principals(top), "principal"),
        "targets": counts(report.top_targets(top), "target"),
    })
}

fn example_json(example: &Example) -> Value {
    let Example {
        decision_id,
        at_ms,
        principal_id,
        tool,
        capability,
        changed,
    } = example;
    let mut value = json!({
        "decision_id": decision_id,
        "at": clock::format(*at_ms),
        "principal": principal_id,
    });
    match changed {
        Changed::Decision { before, after } => {
            value["kind"] = json!("decide");
            value["tool"] = json!(tool);
            value["capability"] = json!(capability);
            value["before"] = outcome_json(before);
            value["after"] = outcome_json(after);
        }
        Changed::Listing { gained, lost } => {
            value["kind"] = json!("list");
            value["gained"] = json!(gained);
            value["lost"] = json!(lost);
        }
    }
    value
}

/// `{"outcome", "code", "path", "account"?, "limits"?}`: account and limits on an allow only.
fn outcome_json(outcome: &engine::Outcome) -> Value {
    let engine::Outcome {
        allowed,
        code,
        path,
        account,
        ceiling,
    } = outcome;
    let mut value = json!({
        "outcome": if *allowed { "allow" } else { "deny" },
        "code": code,
        "path": path,
    });
    if *allowed {
        value["account"] = json!(account);
        value["limits"] = ceiling
            .as_ref()
            .map_or(Value::Null, |(calls, per)| json!({"calls": calls, "per": per}));
    }
    value
}

fn human(loaded: &Loaded, window: Window, report: &Report, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replayed `{}` ({}) on the audit trail from {} to {}",
        loaded.source.origin,
        loaded.compilation.version,
        clock::format(window.since_ms),
        clock::format(window.until_ms)
    );
    let _ = writeln!(
        out,
        "{} record{} read: {} replayed ({} unchanged, {} changed), {} not replayable",
        report.read,
        if report.read == 1 { "" } else { "s" },
        report.replayed,
        report.unchanged,
        report.changed(),
        report.not_replayable_total()
    );
    out.push('\n');
    let _ = writeln!(out, "changes");
    for transition in Transition::ALL {
        let mark = if transition.widens() { "  (widening)" } else { "" };
        let _ = writeln!(
            out,
            "  {:18} {:>9}{mark}",
            transition.label(),
            report.count(transition)
        );
    }
    out.push('\n');
    let _ = writeln!(out, "not replayable");
    for cause in Cause::ALL {
        let _ = writeln!(out, "  {:64} {:>9}", cause.label(), report.not_replayable(cause));
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "ceilings: checked against the usage each record saw (the calls counted before it, in a \
         window opened at its instant)"
    );
    let _ = writeln!(
        out,
        "  {} checked against recorded usage, {} against no recorded usage (no ceiling applied \
         when recorded: 0 calls)",
        report.ceilings_against_recorded_usage, report.ceilings_without_recorded_usage
    );
    for (heading, counts) in [
        ("most affected principals", report.top_principals(top)),
        ("most affected tools and capabilities", report.top_targets(top)),
    ] {
        if counts.is_empty() {
            continue;
        }
        out.push('\n');
        let _ = writeln!(out, "{heading}");
        let width = counts
            .iter()
            .map(|(name, _)| name.chars().count())
            .max()
            .unwrap_or(0);
        for (name, records) in counts {
            let _ = writeln!(out, "  {name:width$}  {records}");
        }
    }
    if report.examples.iter().any(|examples| !examples.is_empty()) {
        out.push('\n');
        let _ = writeln!(out, "examples");
        for transition in Transition::ALL {
            let examples = report.examples_of(transition);
            if examples.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  {}", transition.label());
            for example in examples {
                human_example(&mut out, example);
            }
        }
    }
    out
}

fn human_example(out: &mut String, example: &Example) {
    let target = match (&example.tool, &example.capability, &example.changed) {
        (_, _, Changed::Listing { .. }) => "listing".to_owned(),
        (Some(tool), _, _) => format!("tool {tool}"),
        (None, Some(capability), _) => format!("capability {capability}"),
        (None, None, _) => "-".to_owned(),
    };
    let _ = writeln!(
        out,
        "    {}  {}  {target}  id={}",
        clock::format(example.at_ms),
        example.principal_id,
        example.decision_id
    );
    match &example.changed {
        Changed::Decision { before, after } => {
            let _ = writeln!(out, "      before  {}", outcome_text(before));
            let _ = writeln!(out, "      after   {}", outcome_text(after));
        }
        Changed::Listing { gained, lost } => {
            if !gained.is_empty() {
                let _ = writeln!(out, "      shows   {}", gained.join(", "));
            }
            if !lost.is_empty() {
                let _ = writeln!(out, "      hides   {}", lost.join(", "));
            }
        }
    }
}

fn outcome_text(outcome: &engine::Outcome) -> String {
    let mut text = String::from(if outcome.allowed { "allow" } else { "deny" });
    if let Some(code) = &outcome.code {
        let _ = write!(text, " {code}");
    }
    if let Some(path) = &outcome.path {
        let _ = write!(text, " {path}");
    }
    if let Some(account) = outcome.account.as_ref().filter(|_| outcome.allowed) {
        let _ = write!(text, " as {account}");
    }
    if outcome.allowed {
        match &outcome.ceiling {
            Some((calls, per)) => {
                let _ = write!(text, ", {calls} calls per {per}");
            }
            None => text.push_str(", no ceiling"),
        }
    }
    text
}
