//! `capgate decide`: ask a running server what a gateway would ask it —
//! `Decide` for one principal and one tool or capability — and print the
//! answer with its reason. The way to try a deployment without writing a
//! gateway; unlike `explain`, the server's counters are consumed and the
//! decision is audited. `--arg` and `--args-json` are the call's arguments, sent
//! as `arguments_json` for the grants' conditions to read.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::wire::convert;
use crate::wire::proto::decision_service_client::DecisionServiceClient;
use crate::wire::proto::{
    credential, decide_request, decide_response, transport, Account, AssertedPrincipal, Attribute,
    Credential, DecideRequest, DecideResponse, Decision, Limits, Outcome as ProtoOutcome, Position, Reason,
    Tool, Transport, Unauthenticated, UnknownTool,
};
use capgate_core::access::ReasonCode;
use capgate_core::principals::AuthProblem;

use super::args::{Asserted, Attr, CallArguments};
use super::remote::{runtime, status_failure, Server};
use super::{Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["capability", "tool"]))]
pub struct Args {
    /// Who calls: a principal the gateway asserts (the server must trust the
    /// token to assert), or the caller's own credential, which the server
    /// authenticates.
    #[command(flatten)]
    pub principal: Asserted,
    /// The capability id to decide on.
    #[arg(long, value_name = "C")]
    pub capability: Option<String>,
    /// An exposed tool name (`<upstream>__<name>`).
    #[arg(long, value_name = "EXPOSED")]
    pub tool: Option<String>,
    #[command(flatten)]
    pub arguments: CallArguments,
    /// An idempotency key: the same key returns the first answer again.
    #[arg(long, value_name = "ID", default_value = "", hide_default_value = true)]
    pub request_id: String,
    /// Print the response as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: Server,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    let request = request(args)?;
    let response = runtime()?.block_on(async {
        let connection = args.server.connect().await?;
        let mut client = DecisionServiceClient::new(connection.channel.clone());
        client
            .decide(connection.request(request))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_failure(&status))
    })?;
    let stdout = if args.json {
        let mut text = serde_json::to_string_pretty(&to_json(&response)).unwrap_or_default();
        text.push('\n');
        text
    } else {
        human(&response)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

/// The request a gateway would send; the arguments are checked before any server is called.
fn request(args: &Args) -> Result<DecideRequest, Failure> {
    let arguments = args.arguments.resolve()?;
    let who = &args.principal;
    let hint = who.issuer.clone().unwrap_or_default();
    let credential = |kind| {
        decide_request::Caller::Credential(Credential {
            kind: Some(kind),
            issuer: hint.clone(),
        })
    };
    let caller = if let Some(token) = &who.token {
        credential(credential::Kind::BearerToken(token.clone()))
    } else if let Some(key) = &who.api_key {
        credential(credential::Kind::ApiKey(key.clone()))
    } else if let Some(forwarded) = &who.client_dn {
        credential(credential::Kind::ClientCertificate(forwarded.clone()))
    } else {
        decide_request::Caller::Principal(AssertedPrincipal {
            issuer: hint.clone(),
            subject: who.subject.clone().unwrap_or_default(),
            attributes: attributes(&who.attrs),
        })
    };
    let request = DecideRequest {
        caller: Some(caller),
        target: match (&args.tool, &args.capability) {
            (Some(tool), _) => Some(decide_request::Target::Tool(tool.clone())),
            (None, Some(capability)) => Some(decide_request::Target::Capability(capability.clone())),
            (None, None) => None,
        },
        request_id: args.request_id.clone(),
        arguments_json: arguments.map(|arguments| Value::Object(arguments).to_string()),
    };
    Ok(request)
}

/// `--attr` pairs grouped by name, values in the order given.
fn attributes(pairs: &[Attr]) -> Vec<Attribute> {
    let mut grouped: Vec<Attribute> = Vec::new();
    for Attr { key, value } in pairs {
        match grouped.iter_mut().find(|attribute| attribute.name == *key) {
            Some(attribute) => attribute.values.push(value.clone()),
            None => grouped.push(Attribute {
                name: key.clone(),
                values: vec![value.clone()],
            }),
        }
    }
    grouped
}

/// The core's name for a wire reason code (`granted`, …).
fn code_name(code: i32) -> &'static str {
    ReasonCode::ALL
        .into_iter()
        .find(|core| i32::from(convert::reason_code(*core)) == code)
        .map_or("unspecified", ReasonCode::as_str)
}

/// The core's name for a wire authentication problem.
fn problem_name(problem: i32) -> &'static str {
    [
        AuthProblem::CredentialMissing,
        AuthProblem::CredentialInvalid,
        AuthProblem::CredentialExpired,
        AuthProblem::IssuerUnknown,
    ]
    .into_iter()
    .find(|core| i32::from(convert::auth_problem(*core)) == problem)
    .map_or("unspecified", AuthProblem::as_str)
}

fn at_text(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp.map_or_else(String::new, |t| clock::format(convert::millis(t)))
}

fn human(response: &DecideResponse) -> String {
    let DecideResponse {
        decision_id,
        policy_version,
        policy_revision,
        at,
        result,
    } = response;
    let mut out = String::new();
    let _ = writeln!(out, "decision   {decision_id}");
    let _ = writeln!(out, "policy     revision {policy_revision} ({policy_version})");
    let _ = writeln!(out, "at         {}", at_text(at.as_ref()));
    let _ = writeln!(out);
    match result {
        None => {
            let _ = writeln!(out, "the server answered without a result");
        }
        Some(decide_response::Result::Unauthenticated(Unauthenticated { problem, message })) => {
            let _ = writeln!(out, "UNAUTHENTICATED  {}", problem_name(*problem));
            let _ = writeln!(out, "  {message}");
        }
        Some(decide_response::Result::UnknownTool(UnknownTool { name: _, message })) => {
            let _ = writeln!(out, "UNKNOWN TOOL  {message}");
        }
        Some(decide_response::Result::Decision(decision)) => human_decision(&mut out, decision),
    }
    out
}

fn human_decision(out: &mut String, decision: &Decision) {
    let Decision {
        outcome,
        reason,
        account,
        limits,
        tool,
        resets_at,
    } = decision;
    let allowed = ProtoOutcome::try_from(*outcome) == Ok(ProtoOutcome::Allow);
    let _ = writeln!(out, "{}", if allowed { "ALLOWED" } else { "DENIED" });
    if let Some(Reason {
        code,
        path,
        subject,
        position,
        message,
    }) = reason
    {
        let _ = writeln!(out, "  reason    {}: {message}", code_name(*code));
        let _ = writeln!(out, "  subject   {subject}");
        let site = match position {
            Some(Position { line, column }) => format!("{line}:{column}  {path}"),
            None => path.clone(),
        };
        let _ = writeln!(out, "  site      {site}");
    }
    if let Some(Account { id, secret_ref }) = account {
        let _ = writeln!(out, "  account   {id}  (secret at {secret_ref})");
    }
    if let Some(resets_at) = resets_at {
        let _ = writeln!(out, "  retry     after {}", at_text(Some(resets_at)));
    }
    match limits {
        Some(Limits {
            calls,
            per,
            window_ms: _,
            remaining,
            resets_at,
        }) => {
            let _ = writeln!(
                out,
                "  ceiling   {calls} calls per {per}; {remaining} left until {}",
                at_text(resets_at.as_ref())
            );
        }
        None if allowed => {
            let _ = writeln!(out, "  ceiling   no ceiling declared");
        }
        None => {}
    }
    if let Some(Tool {
        exposed_name,
        upstream,
        name,
        capability: _,
        transport,
    }) = tool
    {
        let how = match transport.as_ref().and_then(|t| t.kind.as_ref()) {
            Some(transport::Kind::Stdio(stdio)) => format!("stdio `{}`", stdio.command),
            Some(transport::Kind::Http(http)) => format!("http {}", http.url),
            None => "unknown transport".to_owned(),
        };
        let _ = writeln!(
            out,
            "  tool      {exposed_name} → `{name}` on `{upstream}` via {how}"
        );
    }
}

fn to_json(response: &DecideResponse) -> Value {
    let DecideResponse {
        decision_id,
        policy_version,
        policy_revision,
        at,
        result,
    } = response;
    let result = match result {
        None => Value::Null,
        Some(decide_response::Result::Unauthenticated(Unauthenticated { problem, message })) => {
            json!({"unauthenticated": {"problem": problem_name(*problem), "message": message}})
        }
        Some(decide_response::Result::UnknownTool(UnknownTool { name, message })) => {
            json!({"unknown_tool": {"name": name, "message": message}})
        }
        Some(decide_response::Result::Decision(decision)) => json!({"decision": decision_json(decision)}),
    };
    json!({
        "decision_id": decision_id,
        "policy_version": policy_version,
        "policy_revision": policy_revision,
        "at": at_text(at.as_ref()),
        "result": result,
    })
}

fn decision_json(decision: &Decision) -> Value {
    let Decision {
        outcome,
        reason,
        account,
        limits,
        tool,
        resets_at,
    } = decision;
    let allowed = ProtoOutcome::try_from(*outcome) == Ok(ProtoOutcome::Allow);
    let reason = reason.as_ref().map(
        |Reason {
             code,
             path,
             subject,
             position,
             message,
         }| {
            json!({
                "code": code_name(*code),
                "message": message,
                "path": path,
                "subject": subject,
                "position": position.as_ref().map(|Position { line, column }| json!({"line": line, "column": column})),
            })
        },
    );
    let mut value = json!({"outcome": if allowed { "allow" } else { "deny" }, "reason": reason});
    if let Some(resets_at) = resets_at {
        value["resets_at"] = json!(at_text(Some(resets_at)));
    }
    if let Some(Account { id, secret_ref }) = account {
        value["account"] = json!({"id": id, "secret_ref": secret_ref});
    }
    if allowed {
        value["limits"] = limits.as_ref().map_or(
            Value::Null,
            |Limits {
                 calls,
                 per,
                 window_ms,
                 remaining,
                 resets_at,
             }| {
                json!({"calls": calls, "per": per, "window_ms": window_ms,
                       "remaining": remaining, "resets_at": at_text(resets_at.as_ref())})
            },
        );
    }
    if let Some(Tool {
        exposed_name,
        upstream,
        name,
        capability,
        transport,
    }) = tool
    {
        let transport = match transport.as_ref().and_then(|Transport { kind }| kind.as_ref()) {
            Some(transport::Kind::Stdio(stdio)) => {
                json!({"kind": "mcp-stdio", "command": stdio.command, "args": stdio.args})
            }
            Some(transport::Kind::Http(http)) => json!({"kind": "mcp-http", "url": http.url}),
            None => Value::Null,
        };
        value["tool"] = json!({"exposed_name": exposed_name, "upstream": upstream, "name": name,
                               "capability": capability, "transport": transport});
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_attributes_become_one_multi_valued_attribute() {
        let pairs = [
            Attr {
                key: "team".into(),
                value: "a".into(),
            },
            Attr {
                key: "dept".into(),
                value: "x".into(),
            },
            Attr {
                key: "team".into(),
                value: "b".into(),
            },
        ];
        let grouped = attributes(&pairs);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].values, ["a", "b"]);
        assert_eq!(grouped[1].values, ["x"]);
    }

    /// `decide`'s arguments as the command line gives them.
    #[derive(Debug, clap::Parser)]
    struct Line {
        #[command(flatten)]
        args: Args,
    }

    fn request_of(extra: &[&str]) -> Result<DecideRequest, Failure> {
        use clap::Parser;
        let mut words = vec!["decide", "--server", "http://127.0.0.1:1", "--issuer", "staff"];
        words.extend(["--subject", "a", "--capability", "billing.refund.create"]);
        words.extend(extra);
        request(&Line::try_parse_from(words).expect("parses").args)
    }

    #[test]
    fn the_arguments_are_sent_as_one_json_object() {
        let sent = request_of(&[
            "--args-json",
            r#"{"amount": 500, "currency": "EUR"}"#,
            "--arg",
            "amount=50",
        ])
        .expect("a request")
        .arguments_json
        .expect("arguments sent");
        let sent: Value = serde_json::from_str(&sent).expect("JSON text");
        assert_eq!(sent, json!({"amount": 50, "currency": "EUR"}));
        let none = request_of(&[]).expect("a request");
        assert_eq!(none.arguments_json, None, "no flag: the arguments are not given");
        assert!(matches!(
            request_of(&["--args-json", "[]"]),
            Err(Failure::Usage(message)) if message.contains("`--args-json`")
        ));
    }

    #[test]
    fn a_denial_prints_no_account_and_no_ceiling() {
        let response = DecideResponse {
            decision_id: "d".into(),
            policy_version: "sha256:x".into(),
            policy_revision: 1,
            at: None,
            result: Some(decide_response::Result::Decision(Decision {
                outcome: ProtoOutcome::Deny.into(),
                reason: Some(Reason {
                    code: convert::reason_code(ReasonCode::LimitExhausted).into(),
                    path: "/grants/0".into(),
                    subject: "a.b".into(),
                    position: Some(Position { line: 3, column: 5 }),
                    message: "the ceiling of the winning grant is exhausted (`a.b`)".into(),
                }),
                account: None,
                limits: None,
                tool: None,
                resets_at: Some(convert::timestamp(1_796_083_200_000)),
            })),
        };
        let text = human(&response);
        assert!(
            text.contains("DENIED") && text.contains("limit_exhausted") && text.contains("3:5  /grants/0")
        );
        assert!(text.contains("exhausted (`a.b`)") && text.contains("retry     after 2026-12-01T"));
        assert!(
            !text.contains("  account ") && !text.contains("  ceiling "),
            "{text}"
        );
        let value = to_json(&response);
        assert_eq!(value["result"]["decision"]["outcome"], "deny");
        assert!(value["result"]["decision"].get("limits").is_none());
        assert!(value["result"]["decision"]["resets_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-12-01T"));
    }
}
