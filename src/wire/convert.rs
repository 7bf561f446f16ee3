//! Core types ↔ protobuf messages. The core derives no `prost::Message`:
//! every conversion here destructures its source, so a field added to a core
//! type (or a proto message, on the way back) breaks the build here instead
//! of silently going missing. A field the wire leaves out is named and
//! ignored explicitly (`offset: _`).
//!
//! The way back (proto → core) serves the command line, which renders what a
//! server answered with the same renderers the dry-run commands use.

use std::collections::BTreeMap;

use prost_types::Timestamp;

use capgate_core::access::{
    Allow, Change, ChangeKind, Decision, Limits, Reason, ReasonCode, Standing, Summary,
};
use capgate_core::accounts::AccountRef;
use capgate_core::capabilities::{ToolDescriptor, ToolIndex, Transport};
use capgate_core::policy::{Code, Diagnostic, Document, Position, Related, Severity};
use capgate_core::principals::AuthProblem;

use super::proto;

/// Milliseconds since the Unix epoch as a protobuf timestamp.
pub fn timestamp(ms: i64) -> Timestamp {
    let nanos = ms.rem_euclid(1000) * 1_000_000;
    Timestamp {
        seconds: ms.div_euclid(1000),
        // Below 10^9 by construction.
        nanos: i32::try_from(nanos).unwrap_or(0),
    }
}

/// A protobuf timestamp as milliseconds since the Unix epoch (sub-millisecond
/// digits dropped).
pub fn millis(timestamp: &Timestamp) -> i64 {
    let Timestamp { seconds, nanos } = timestamp;
    seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(*nanos) / 1_000_000)
}

fn small(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

pub fn position(position: Option<Position>) -> Option<proto::Position> {
    position.map(
        |Position {
             line,
             column,
             offset: _,
         }| proto::Position {
            line: small(line),
            column: small(column),
        },
    )
}

pub fn diagnostic(diagnostic: &Diagnostic) -> proto::Diagnostic {
    let Diagnostic {
        severity,
        code,
        message,
        path,
        position: at,
        related,
    } = diagnostic;
    proto::Diagnostic {
        severity: severity.as_str().to_owned(),
        code: code.as_str().to_owned(),
        message: message.clone(),
        path: path.clone(),
        position: position(*at),
        related: related
            .iter()
            .map(|related| {
                let Related {
                    path,
                    position: at,
                    note,
                } = related;
                proto::RelatedLocation {
                    path: path.clone(),
                    position: position(*at),
                    note: note.clone(),
                }
            })
            .collect(),
    }
}

pub fn reason_code(code: ReasonCode) -> proto::ReasonCode {
    match code {
        ReasonCode::Granted => proto::ReasonCode::Granted,
        ReasonCode::CapabilityNotDeclared => proto::ReasonCode::CapabilityNotDeclared,
        ReasonCode::CapabilityNotRealized => proto::ReasonCode::CapabilityNotRealized,
        ReasonCode::NoGrantMatches => proto::ReasonCode::NoGrantMatches,
        ReasonCode::AmbiguousGrant => proto::ReasonCode::AmbiguousGrant,
        ReasonCode::AccountDisabled => proto::ReasonCode::AccountDisabled,
        ReasonCode::UsageUnknown => proto::ReasonCode::UsageUnknown,
        ReasonCode::LimitExhausted => proto::ReasonCode::LimitExhausted,
        ReasonCode::ConditionFailed => proto::ReasonCode::ConditionFailed,
        ReasonCode::ArgumentsMissing => proto::ReasonCode::ArgumentsMissing,
    }
}

/// `UnknownTool.message`: one line naming the tool asked for, and the exposed name of `tools`
/// it most likely meant.
pub fn unknown_tool_message(name: &str, tools: &ToolIndex) -> String {
    let hint = tools.did_you_mean(name);
    format!(
        "no tool `{name}` is exposed: it is not in the active catalog, or not mapped to a capability{hint}"
    )
}

pub fn auth_problem(problem: AuthProblem) -> proto::AuthProblem {
    match problem {
        AuthProblem::CredentialMissing => proto::AuthProblem::CredentialMissing,
        AuthProblem::CredentialInvalid => proto::AuthProblem::CredentialInvalid,
        AuthProblem::CredentialExpired => proto::AuthProblem::CredentialExpired,
        AuthProblem::IssuerUnknown => proto::AuthProblem::IssuerUnknown,
    }
}

/// A reason, with the position its pointer resolves to in `document`.
pub fn reason(reason: &Reason<'_>, document: Option<&Document>) -> proto::Reason {
    let Reason { code, path, subject } = reason;
    proto::Reason {
        code: reason_code(*code).into(),
        path: (*path).to_owned(),
        subject: (*subject).to_owned(),
        position: position(document.and_then(|document| document.resolve(path))),
        message: reason.message(),
    }
}

pub fn ceiling(limits: &Limits) -> proto::Ceiling {
    let Limits {
        calls,
        per,
        window_ms,
    } = limits;
    proto::Ceiling {
        calls: *calls,
        per: per.clone(),
        window_ms: *window_ms,
    }
}

/// A decision as the wire carries it. `secret_ref`, `standing` and `tool`
/// are what the service adds to an allow: the account's secret reference,
/// the counter after consumption (when a ceiling applies) and the tool asked
/// for (when the target was a tool). A deny gets none of them; `limit_exhausted` gets
/// `resets_at`, when its window ends.
pub fn decision(
    decision: &Decision<'_>,
    document: Option<&Document>,
    secret_ref: &str,
    standing: Option<Standing>,
    tool: Option<proto::Tool>,
    resets_at: Option<i64>,
) -> proto::Decision {
    match decision {
        Decision::Allow(Allow {
            reason: why,
            account,
            limits,
            grant: _,
            conditional: _,
        }) => {
            let AccountRef { id, disabled: _ } = account;
            proto::Decision {
                outcome: proto::Outcome::Allow.into(),
                reason: Some(reason(why, document)),
                account: Some(proto::Account {
                    id: id.clone(),
                    secret_ref: secret_ref.to_owned(),
                }),
                limits: limits.zip(standing).map(|(limits, standing)| {
                    let Limits {
                        calls,
                        per,
                        window_ms,
                    } = limits;
                    let Standing { remaining, resets_at } = standing;
                    proto::Limits {
                        calls: *calls,
                        per: per.clone(),
                        window_ms: *window_ms,
                        remaining,
                        resets_at: Some(timestamp(resets_at)),
                    }
                }),
                tool,
                resets_at: None,
            }
        }
        Decision::Deny(why) => proto::Decision {
            outcome: proto::Outcome::Deny.into(),
            reason: Some(reason(why, document)),
            account: None,
            limits: None,
            tool: None,
            resets_at: resets_at.map(timestamp),
        },
    }
}

pub fn transport(transport: &Transport) -> proto::Transport {
    let kind = match transport {
        Transport::Stdio { command, args } => proto::transport::Kind::Stdio(proto::StdioTransport {
            command: command.clone(),
            args: args.clone(),
        }),
        Transport::Http { url } => proto::transport::Kind::Http(proto::HttpTransport { url: url.clone() }),
    };
    proto::Transport { kind: Some(kind) }
}

/// The tool a decision was about, with its upstream's transport.
pub fn tool(tool: &ToolDescriptor, reached_by: Option<&Transport>) -> proto::Tool {
    let ToolDescriptor {
        exposed_name,
        upstream,
        name,
        capability,
        description: _,
        input_schema: _,
    } = tool;
    proto::Tool {
        exposed_name: exposed_name.clone(),
        upstream: upstream.clone(),
        name: name.clone(),
        capability: capability.clone(),
        transport: reached_by.map(transport),
    }
}

/// A listed tool; its input schema as JSON text (the command line's JSON
/// conversion of catalog values, so both say the same thing). `conditional` when its capability
/// is listed conditional: every grant that shows it carries conditions, so a call may still be
/// denied on its arguments or instant.
pub fn visible_tool(tool: &ToolDescriptor, conditional: bool) -> proto::VisibleTool {
    let ToolDescriptor {
        exposed_name,
        upstream,
        name,
        capability,
        description,
        input_schema,
    } = tool;
    proto::VisibleTool {
        exposed_name: exposed_name.clone(),
        upstream: upstream.clone(),
        name: name.clone(),
        capability: capability.clone(),
        description: description.clone().unwrap_or_default(),
        input_schema_json: input_schema
            .as_ref()
            .map(|schema| super::plain::json(schema).to_string())
            .unwrap_or_default(),
        conditional,
    }
}

pub fn change(change: &Change) -> proto::DecisionChange {
    let Change {
        issuer,
        attributes,
        capability,
        kind,
        before,
        after,
    } = change;
    proto::DecisionChange {
        issuer: issuer.clone(),
        attributes: attributes.clone(),
        capability: capability.clone(),
        kind: kind.as_str().to_owned(),
        before: before.as_ref().map(summary),
        after: after.as_ref().map(summary),
    }
}

fn summary(summary: &Summary) -> proto::DecisionSummary {
    let Summary {
        allow,
        code,
        account,
        limits,
    } = summary;
    proto::DecisionSummary {
        outcome: if *allow { "allow" } else { "deny" }.to_owned(),
        code: code.as_str().to_owned(),
        account: account.clone().unwrap_or_default(),
        limits: limits.as_ref().map(ceiling),
    }
}

// ── The way back, for the command line ────────────────────────────────────

/// A diagnostic a server sent, as the renderers take it. `Err` carries the
/// code when this build does not know it (a newer server).
pub fn diagnostic_from(diagnostic: &proto::Diagnostic) -> Result<Diagnostic, String> {
    let proto::Diagnostic {
        severity,
        code,
        message,
        path,
        position: at,
        related,
    } = diagnostic;
    let known = Code::ALL
        .iter()
        .copied()
        .find(|known| known.as_str() == code)
        .ok_or_else(|| code.clone())?;
    Ok(Diagnostic {
        severity: if severity == "warning" {
            Severity::Warning
        } else {
            Severity::Error
        },
        code: known,
        message: message.clone(),
        path: path.clone(),
        position: position_from(at.as_ref()),
        related: related
            .iter()
            .map(|related| {
                let proto::RelatedLocation {
                    path,
                    position: at,
                    note,
                } = related;
                Related {
                    path: path.clone(),
                    position: position_from(at.as_ref()),
                    note: note.clone(),
                }
            })
            .collect(),
    })
}

fn position_from(position: Option<&proto::Position>) -> Option<Position> {
    position.map(|proto::Position { line, column }| Position {
        line: *line as usize,
        column: *column as usize,
        // Not on the wire; the renderers use line and column only.
        offset: 0,
    })
}

/// A change a server sent, as the `diff` renderer takes it; `None` when it
/// names a kind or a code this build does not know.
pub fn change_from(change: &proto::DecisionChange) -> Option<Change> {
    let proto::DecisionChange {
        issuer,
        attributes,
        capability,
        kind,
        before,
        after,
    } = change;
    let kind = [ChangeKind::Gained, ChangeKind::Lost, ChangeKind::Changed]
        .into_iter()
        .find(|known| known.as_str() == kind)?;
    let side = |summary: &Option<proto::DecisionSummary>| match summary {
        None => Some(None),
        Some(summary) => summary_from(summary).map(Some),
    };
    Some(Change {
        issuer: issuer.clone(),
        attributes: attributes
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect::<BTreeMap<_, _>>(),
        capability: capability.clone(),
        kind,
        before: side(before)?,
        after: side(after)?,
    })
}

fn summary_from(summary: &proto::DecisionSummary) -> Option<Summary> {
    let proto::DecisionSummary {
        outcome,
        code,
        account,
        limits,
    } = summary;
    let code = ReasonCode::ALL.into_iter().find(|known| known.as_str() == code)?;
    let allow = outcome == "allow";
    Some(Summary {
        allow,
        code,
        account: allow.then(|| account.clone()),
        limits: limits.as_ref().map(
            |proto::Ceiling {
                 calls,
                 per,
                 window_ms,
             }| Limits {
                calls: *calls,
                per: per.clone(),
                window_ms: *window_ms,
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_before_and_after_the_epoch() {
        for ms in [0, 1, 999, 1000, -1, -1001, 1_795_910_400_123] {
            assert_eq!(millis(&timestamp(ms)), ms, "{ms}");
            assert!((0..1_000_000_000).contains(&timestamp(ms).nanos));
        }
    }

    #[test]
    fn every_reason_code_has_its_own_wire_value() {
        let mut seen: Vec<i32> = ReasonCode::ALL
            .iter()
            .map(|code| reason_code(*code) as i32)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ReasonCode::ALL.len());
        assert!(!seen.contains(&0));
    }

    #[test]
    fn changes_survive_the_round_trip() {
        let change = Change {
            issuer: "staff".into(),
            attributes: [("dept".to_owned(), "support".to_owned())].into(),
            capability: "tickets.issue.read".into(),
            kind: ChangeKind::Changed,
            before: Some(Summary {
                allow: true,
                code: ReasonCode::Granted,
                account: Some("helpdesk-reader".into()),
                limits: Some(Limits {
                    calls: 600,
                    per: "1h".into(),
                    window_ms: 3_600_000,
                }),
            }),
            after: None,
        };
        assert_eq!(change_from(&super::change(&change)), Some(change));
    }
}
