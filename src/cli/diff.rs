//! `capgate diff BEFORE AFTER`: the effective difference — which decisions
//! change between two versions of the artifact (cli.md, `diff`). Outcome,
//! code, account and ceiling (as calls and window) are compared; pointers are
//! not, so reordering grants is not a change. Decisions do not consult
//! conditions, so the grants whose conditions changed are reported beside them
//! (`condition_diff`), each as widening, narrowing or changed.
//!
//! Both sides must compile; otherwise nothing is compared, stdout carries
//! what `validate` prints for each failing side, and the exit code is 3.
//!
//! [`compare`] is also `capgate policies diff REV REV`'s, on two stored
//! revisions.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use capgate_core::access::{effective_diff, Change, Side, Summary};
use capgate_core::policy::CompiledPolicy;

use super::args::Common;
use super::condition_diff::{condition_changes, ConditionChange, Direction};
use super::input::{Inputs, Loaded};
use super::{json, render, validate, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The earlier artifact (`-` reads standard input).
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The later artifact (`-` reads standard input).
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    #[command(flatten)]
    pub common: Common,
    /// Which changes make the exit code 1.
    #[arg(long, value_enum, value_name = "WHICH", default_value_t = FailOn::Any)]
    pub fail_on: FailOn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// Any change.
    Any,
    /// A gained decision, a ceiling that got looser, or a grant's conditions loosened (or
    /// changed in a way that may loosen them).
    Widening,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let before = inputs.policy(&args.before)?;
    let after = inputs.policy(&args.after)?;
    let catalog = inputs.catalog(args.common.catalog.as_deref())?;
    let before = Loaded::compile(before, catalog.as_ref());
    let after = Loaded::compile(after, catalog.as_ref());
    Ok(compare(&before, &after, args.common.json, args.fail_on))
}

/// The effective diff of two compiled sides, as `diff` reports it (also `policies diff`, on two
/// stored revisions).
pub(super) fn compare(before: &Loaded, after: &Loaded, as_json: bool, fail_on: FailOn) -> Outcome {
    let (Some(left), Some(right)) = (&before.compilation.policy, &after.compilation.policy) else {
        return failing_sides(before, after, as_json);
    };
    let changes = effective_diff(side(left, &left.issuer_ids()), side(right, &right.issuer_ids()));
    let conditions = condition_changes(&left.ruleset, &right.ruleset);
    let failing = match fail_on {
        FailOn::Any => !changes.is_empty() || !conditions.is_empty(),
        FailOn::Widening => {
            changes.iter().any(Change::is_widening) || conditions.iter().any(ConditionChange::may_widen)
        }
    };
    let stdout = if as_json {
        super::to_json(&json!({
            "before": json::policy(&before.source, &before.compilation.version),
            "after": json::policy(&after.source, &after.compilation.version),
            "changes": changes.iter().map(change_json).collect::<Vec<_>>(),
            "conditions": conditions
                .iter()
                .map(|change| condition_change_json(change, before, after))
                .collect::<Vec<_>>(),
        }))
    } else {
        let mut text = human(&changes);
        text.push_str(&human_conditions(&conditions, before, after));
        text
    };
    Outcome::stdout(stdout, if failing { Exit::Findings } else { Exit::Done })
}

fn side<'p>(policy: &'p CompiledPolicy, issuers: &'p [String]) -> Side<'p> {
    Side {
        ruleset: &policy.ruleset,
        issuers,
    }
}

/// What `validate` prints for each side that does not compile, before then
/// after; exit 3.
fn failing_sides(before: &Loaded, after: &Loaded, as_json: bool) -> Outcome {
    let sides = [("before", before), ("after", after)];
    let failing = sides
        .iter()
        .filter(|(_, loaded)| loaded.compilation.policy.is_none());
    let stdout = if as_json {
        super::to_json(&json!({
            "before": json::policy(&before.source, &before.compilation.version),
            "after": json::policy(&after.source, &after.compilation.version),
            "errors": failing
                .clone()
                .map(|(side, loaded)| json!({"side": side, "diagnostics": validate::diagnostics(loaded)}))
                .collect::<Vec<_>>(),
        }))
    } else {
        failing
            .clone()
            .map(|(_, loaded)| validate::human(loaded))
            .collect()
    };
    let names: Vec<String> = failing
        .map(|(side, loaded)| format!("`{}` ({side})", loaded.source.origin))
        .collect();
    let verb = if names.len() == 1 { "does" } else { "do" };
    let stderr = format!(
        "error: nothing compared: {} {verb} not compile\n",
        names.join(" and ")
    );
    Outcome {
        stdout,
        stderr,
        exit: Exit::Input,
    }
}

pub(super) fn change_json(change: &Change) -> Value {
    let Change {
        issuer,
        attributes,
        capability,
        kind,
        before,
        after,
    } = change;
    json!({
        "issuer": issuer,
        "attributes": json::attributes(attributes),
        "capability": capability,
        "kind": kind.as_str(),
        "before": before.as_ref().map_or(Value::Null, json::summary),
        "after": after.as_ref().map_or(Value::Null, json::summary),
    })
}

/// `{"kind", "issuer", "attributes", "capabilities", "account", "before", "after"}`, each side
/// `{"path", "position", "conditions": [condition]}`.
fn condition_change_json(change: &ConditionChange, before: &Loaded, after: &Loaded) -> Value {
    let ConditionChange {
        issuer,
        attributes,
        capabilities,
        account,
        before_path,
        after_path,
        before: earlier,
        after: later,
        direction,
    } = change;
    let side = |loaded: &Loaded, path: &str, conditions: &[capgate_core::access::Condition]| {
        let document = loaded.compilation.document.as_ref();
        json!({
            "path": path,
            "position": json::position_of(document, path),
            "conditions": conditions.iter().map(|c| json::condition(c, document)).collect::<Vec<_>>(),
        })
    };
    json!({
        "kind": direction.as_str(),
        "issuer": issuer,
        "attributes": json::attributes(attributes),
        "capabilities": capabilities,
        "account": account,
        "before": side(before, before_path, earlier),
        "after": side(after, after_path, later),
    })
}

/// The grants whose conditions changed, after the decision changes; nothing when none did.
fn human_conditions(conditions: &[ConditionChange], before: &Loaded, after: &Loaded) -> String {
    let mut out = String::new();
    if conditions.is_empty() {
        return out;
    }
    let count = |direction: Direction| conditions.iter().filter(|c| c.direction == direction).count();
    out.push('\n');
    let _ = writeln!(
        out,
        "{} grant{} change{} conditions ({} widening, {} narrowing, {} changed):",
        conditions.len(),
        if conditions.len() == 1 { "" } else { "s" },
        if conditions.len() == 1 { "s its" } else { " their" },
        count(Direction::Widening),
        count(Direction::Narrowing),
        count(Direction::Changed),
    );
    out.push('\n');
    for change in conditions {
        let selector = render::attribute_list(&change.attributes);
        let who = if selector.is_empty() {
            format!("{} (every principal)", change.issuer)
        } else {
            format!("{} {selector}", change.issuer)
        };
        let _ = writeln!(
            out,
            "  {}  {who}  →  {}  as {}",
            change.direction.as_str(),
            change.capabilities.join(", "),
            change.account
        );
        for (label, loaded, path, list) in [
            ("before", before, &change.before_path, &change.before),
            ("after ", after, &change.after_path, &change.after),
        ] {
            let document = loaded.compilation.document.as_ref();
            let position = document.and_then(|document| document.resolve(path));
            let _ = writeln!(
                out,
                "    {label}  {}",
                render::site(&loaded.source.origin, position, path)
            );
            if list.is_empty() {
                let _ = writeln!(out, "      no conditions");
            }
            for condition in list.iter() {
                let _ = writeln!(out, "      {}", condition.test.written());
            }
        }
        out.push('\n');
    }
    out
}

pub(super) fn human(changes: &[Change]) -> String {
    let mut out = String::new();
    if changes.is_empty() {
        let _ = writeln!(out, "no decision changes between the two versions");
        return out;
    }
    let widening = changes.iter().filter(|change| change.is_widening()).count();
    let _ = writeln!(
        out,
        "{} decision{} change ({widening} widening):",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" }
    );
    out.push('\n');
    for change in changes {
        let selector = render::attribute_list(&change.attributes);
        let who = if selector.is_empty() {
            format!("{} (no attributes)", change.issuer)
        } else {
            format!("{} {selector}", change.issuer)
        };
        let mark = if change.is_widening() { "  [widening]" } else { "" };
        let _ = writeln!(
            out,
            "  {}  {who}  →  {}{mark}",
            change.kind.as_str(),
            change.capability
        );
        let _ = writeln!(out, "    before  {}", describe(change.before.as_ref()));
        let _ = writeln!(out, "    after   {}", describe(change.after.as_ref()));
        out.push('\n');
    }
    out
}

fn describe(summary: Option<&Summary>) -> String {
    match summary {
        None => "the capability is not declared".to_owned(),
        Some(Summary {
            allow: true,
            code,
            account,
            limits,
        }) => format!(
            "allow ({}, account {}, {})",
            code.as_str(),
            account.as_deref().unwrap_or("?"),
            render::ceiling(limits.as_ref())
        ),
        Some(Summary {
            allow: false, code, ..
        }) => format!("deny ({})", code.as_str()),
    }
}
