//! Core types as JSON, for the `--json` documents of cli.md. The core derives
//! no `Serialize`: each conversion here destructures every field, so a field
//! added to a core type breaks the build at its conversion instead of
//! silently missing from (or leaking into) the contract. A field the contract
//! leaves out is named and ignored explicitly (`offset: _`).
//!
//! Members keep the order the spec lists them in (`serde_json` is built with
//! `preserve_order`).

use serde_json::{json, Map, Value};

use capgate_core::access::{Allow, Condition, Decision, Limits, Outcome, Reason, Summary, Usage};
use capgate_core::accounts::AccountRef;
use capgate_core::capabilities::ToolDescriptor;
use capgate_core::policy::{Diagnostic, Document, Position, Related};
use capgate_core::principals::{AuthProblem, Principal};

use super::input::Source;
use crate::clock;

/// `policy = {"origin", "version"}`.
pub fn policy(source: &Source, version: &str) -> Value {
    json!({"origin": source.origin, "version": version})
}

/// `position = {"line", "column"}` or `null`; the character offset is not part
/// of the contract.
pub fn position(position: Option<Position>) -> Value {
    match position {
        Some(Position {
            line,
            column,
            offset: _,
        }) => json!({"line": line, "column": column}),
        None => Value::Null,
    }
}

/// The position a pointer resolves to in the artifact, or `null`.
pub fn position_of(document: Option<&Document>, path: &str) -> Value {
    position(document.and_then(|document| document.resolve(path)))
}

pub fn diagnostic(diagnostic: &Diagnostic) -> Value {
    let Diagnostic {
        severity,
        code,
        message,
        path,
        position: at,
        related,
    } = diagnostic;
    json!({
        "severity": severity.as_str(),
        "code": code.as_str(),
        "message": message,
        "path": path,
        "position": position(*at),
        "related": related.iter().map(related_location).collect::<Vec<_>>(),
    })
}

fn related_location(related: &Related) -> Value {
    let Related {
        path,
        position: at,
        note,
    } = related;
    json!({"path": path, "position": position(*at), "note": note})
}

/// `limits = {"calls", "per", "window_ms"}`.
pub fn limits(limits: &Limits) -> Value {
    let Limits {
        calls,
        per,
        window_ms,
    } = limits;
    json!({"calls": calls, "per": per, "window_ms": window_ms})
}

/// A ceiling or `null` for "no ceiling declared".
pub fn ceiling(ceiling: Option<&Limits>) -> Value {
    ceiling.map_or(Value::Null, limits)
}

/// `{"id"}`: what a decision or a listing says about its account.
pub fn account(account: &AccountRef) -> Value {
    let AccountRef { id, disabled: _ } = account;
    json!({"id": id})
}

/// `{"id", "disabled"}`: what `who-can` says about a grant's account.
pub fn account_state(account: &AccountRef) -> Value {
    let AccountRef { id, disabled } = account;
    json!({"id": id, "disabled": disabled})
}

/// `principal = {"id", "issuer", "subject", "attributes"}`.
pub fn principal(principal: &Principal) -> Value {
    let Principal {
        id,
        issuer,
        subject,
        attributes,
    } = principal;
    json!({
        "id": id,
        "issuer": issuer,
        "subject": subject,
        "attributes": attributes,
    })
}

/// An attribute map (a principal's or a selector's) as a JSON object, in the
/// order given.
pub fn attributes<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect(),
    )
}

pub fn problem(problem: Option<AuthProblem>) -> Value {
    problem.map_or(Value::Null, |problem| Value::String(problem.as_str().to_owned()))
}

/// `tool_ref = {"exposed_name", "upstream", "name"}`.
pub fn tool_ref(tool: &ToolDescriptor) -> Value {
    let ToolDescriptor {
        exposed_name,
        upstream,
        name,
        capability: _,
        description: _,
        input_schema: _,
    } = tool;
    json!({"exposed_name": exposed_name, "upstream": upstream, "name": name})
}

/// A listed tool: the reference, its capability and its descriptor.
pub fn listed_tool(tool: &ToolDescriptor) -> Value {
    let ToolDescriptor {
        exposed_name,
        upstream,
        name,
        capability,
        description,
        input_schema,
    } = tool;
    json!({
        "exposed_name": exposed_name,
        "upstream": upstream,
        "name": name,
        "capability": capability,
        "description": description,
        "input_schema": input_schema.as_ref().map_or(Value::Null, crate::wire::plain::json),
    })
}

/// The usage state `explain` evaluated with.
pub fn usage(usage: Usage) -> Value {
    match usage {
        Usage::Counted { calls, window_start } => json!({
            "state": "counted",
            "calls": calls,
            "window_start": clock::format(window_start),
        }),
        Usage::Unknown => json!({"state": "unknown"}),
        Usage::NotConsulted => json!({"state": "not_consulted"}),
    }
}

/// `{"outcome", "reason", "account"?, "limits"?, "conditional"?}`: account, limits and
/// conditional exist on an allow only, and there `limits` is `null` for "no ceiling declared".
pub fn decision(decision: &Decision<'_>, document: Option<&Document>) -> Value {
    match decision {
        Decision::Allow(Allow {
            reason,
            account: granted,
            limits: ceiling_of,
            grant: _,
            conditional,
        }) => json!({
            "outcome": "allow",
            "reason": self::reason(reason, document),
            "account": account(granted),
            "limits": ceiling(*ceiling_of),
            "conditional": conditional,
        }),
        Decision::Deny(reason) => json!({
            "outcome": "deny",
            "reason": self::reason(reason, document),
        }),
    }
}

/// `condition = {"path", "position", "subject", "condition"}`: a grant's condition, its
/// pointer and where that is, what it is about (an argument's path as written, or `time`)
/// and the condition in one line (`amount at_most 100`).
pub fn condition(condition: &Condition, document: Option<&Document>) -> Value {
    let Condition { path, test } = condition;
    json!({
        "path": path,
        "position": position_of(document, path),
        "subject": test.subject(),
        "condition": test.written(),
    })
}

/// How a condition came out for a call: `held`, `failed` or `missing` (the argument it
/// reads was not given).
pub fn outcome(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Holds => "held",
        Outcome::Fails => "failed",
        Outcome::Missing => "missing",
    }
}

fn reason(reason: &Reason<'_>, document: Option<&Document>) -> Value {
    let Reason { code, path, subject } = reason;
    json!({
        "code": code.as_str(),
        "path": path,
        "subject": subject,
        "position": position_of(document, path),
    })
}

/// A `diff` side's summary: `{"outcome", "code", "account"?, "limits"?}`.
pub fn summary(summary: &Summary) -> Value {
    let Summary {
        allow,
        code,
        account,
        limits: ceiling_of,
    } = summary;
    let mut object = Map::new();
    object.insert("outcome".into(), json!(if *allow { "allow" } else { "deny" }));
    object.insert("code".into(), json!(code.as_str()));
    if *allow {
        object.insert("account".into(), json!(account));
        object.insert("limits".into(), ceiling(ceiling_of.as_ref()));
    }
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_drop_the_offset() {
        let at = Position {
            line: 3,
            column: 7,
            offset: 40,
        };
        assert_eq!(position(Some(at)), json!({"line": 3, "column": 7}));
        assert_eq!(position(None), Value::Null);
    }

    #[test]
    fn a_deny_summary_has_no_account_and_no_limits() {
        let deny = Summary {
            allow: false,
            code: capgate_core::access::ReasonCode::NoGrantMatches,
            account: None,
            limits: None,
        };
        assert_eq!(
            summary(&deny),
            json!({"outcome": "deny", "code": "no_grant_matches"})
        );
        let allow = Summary {
            allow: true,
            code: capgate_core::access::ReasonCode::Granted,
            account: Some("a".into()),
            limits: None,
        };
        assert_eq!(
            summary(&allow),
            json!({"outcome": "allow", "code": "granted", "account": "a", "limits": null})
        );
    }
}
