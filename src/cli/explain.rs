//! `capgate explain`: the decision for one principal and one capability (or
//! one exposed tool name, resolved through the catalog as the service does),
//! with its reason and the site in the artifact to change.
//!
//! `--at`, `--usage` and `--window-start` make time and usage explicit data,
//! exactly as the service hands them to the pure evaluation; `--arg` and
//! `--args-json` give the call's arguments, which grants' conditions read. The
//! conditions of the grants that match are shown each with how it came out.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Map, Value};

use capgate_core::access::{
    evaluate_call, Condition, Decision, Grant, Instant, Outcome as Held, ReasonCode, Ruleset, Usage,
};
use capgate_core::capabilities::ToolDescriptor;
use capgate_core::policy::{CompiledPolicy, Document};
use capgate_core::principals::{AuthProblem, Principal, Resolution};

use super::args::{parse_instant, parse_usage, Asserted, CallArguments, Common, LocalKeys, UsageArg};
use super::input::{Inputs, Loaded};
use super::{json, render, validate, Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("asked").required(true).args(["capability", "tool"]))]
pub struct Args {
    /// The policy artifact (`-` reads standard input).
    #[arg(value_name = "POLICY")]
    pub policy: PathBuf,
    #[command(flatten)]
    pub principal: Asserted,
    #[command(flatten)]
    pub keys: LocalKeys,
    /// The capability id to decide on.
    #[arg(long, value_name = "C")]
    pub capability: Option<String>,
    /// An exposed tool name (`<upstream>__<name>`), resolved through the catalog.
    #[arg(long, value_name = "EXPOSED")]
    pub tool: Option<String>,
    /// The instant of the call, RFC 3339 (default: now).
    #[arg(long, value_name = "T", value_parser = parse_instant)]
    pub at: Option<Instant>,
    /// Usage for the ceiling check: a call count, `unknown` or `none` (default: 0).
    #[arg(long, value_name = "N|unknown|none", value_parser = parse_usage, allow_negative_numbers = true)]
    pub usage: Option<UsageArg>,
    /// With a counted usage, when the counted window opened (default: `--at`).
    #[arg(long, value_name = "T", value_parser = parse_instant)]
    pub window_start: Option<Instant>,
    #[command(flatten)]
    pub arguments: CallArguments,
    #[command(flatten)]
    pub common: Common,
}

impl Args {
    /// The usage state to evaluate with; `--window-start` needs a counted usage.
    fn usage(&self, at: Instant) -> Result<Usage, Failure> {
        match (self.usage.unwrap_or(UsageArg::Counted(0)), self.window_start) {
            (UsageArg::Counted(calls), window_start) => Ok(Usage::Counted {
                calls,
                window_start: window_start.unwrap_or(at),
            }),
            (UsageArg::Unknown | UsageArg::NotConsulted, Some(_)) => Err(Failure::Usage(
                "`--window-start` needs a counted usage, not `--usage unknown` or `--usage none`".to_owned(),
            )),
            (UsageArg::Unknown, None) => Ok(Usage::Unknown),
            (UsageArg::NotConsulted, None) => Ok(Usage::NotConsulted),
        }
    }
}

/// Everything `explain` found, before it is printed. Borrows from the
/// arguments and the policy, which both outlive it.
struct Explanation<'a> {
    at: Instant,
    usage: Usage,
    /// `None`: not given.
    arguments: Option<&'a Map<String, Value>>,
    resolution: Result<Resolution, AuthProblem>,
    capability: Option<&'a str>,
    /// `--tool` as given, whether or not it resolved.
    asked_tool: Option<&'a str>,
    tool: Option<&'a ToolDescriptor>,
    unknown_tool: bool,
    /// For an unknown tool, the exposed name it most likely meant.
    suggestion: Option<&'a str>,
    decision: Option<Decision<'a>>,
    /// The matching grants' conditions, when the decision got to them.
    conditions: Vec<Checked<'a>>,
    tools: Vec<&'a ToolDescriptor>,
}

/// A grant that matches the principal and names the capability, with each of its
/// conditions as it came out for the call.
pub(super) struct Checked<'p> {
    pub grant: &'p Grant,
    pub outcomes: Vec<(&'p Condition, Held)>,
}

impl Checked<'_> {
    /// All its conditions held: the grant applies to the call.
    pub fn applies(&self) -> bool {
        self.outcomes.iter().all(|(_, held)| *held == Held::Holds)
    }
}

/// The conditions a decision consulted (step 6, docs/reference.md#the-steps): of every
/// grant that matches the principal and names the capability and has conditions, each
/// checked against the call, in file order. None when the decision ended before step 6
/// (nothing matches, the capability is not declared or realised, the account is disabled).
pub(super) fn checked_conditions<'p>(
    ruleset: &'p Ruleset,
    principal: &Principal,
    capability: &str,
    decision: &Decision<'_>,
    arguments: Option<&Map<String, Value>>,
    at: Instant,
) -> Vec<Checked<'p>> {
    let consulted = match decision {
        Decision::Allow(_) => true,
        Decision::Deny(reason) => matches!(
            reason.code,
            ReasonCode::ConditionFailed
                | ReasonCode::ArgumentsMissing
                | ReasonCode::LimitExhausted
                | ReasonCode::UsageUnknown
        ),
    };
    if !consulted {
        return Vec::new();
    }
    ruleset
        .grants()
        .iter()
        .filter(|grant| !grant.conditions.is_empty() && grant.matches(principal) && grant.names(capability))
        .map(|grant| Checked {
            grant,
            outcomes: grant
                .conditions
                .iter()
                .map(|condition| (condition, condition.check(arguments, at)))
                .collect(),
        })
        .collect()
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let at = args.at.unwrap_or_else(clock::now);
    let usage = args.usage(at)?;
    let arguments = args.arguments.resolve()?;
    let source = inputs.policy(&args.policy)?;
    let catalog = inputs.catalog(args.common.catalog.as_deref())?;
    let loaded = Loaded::compile(source, catalog.as_ref());
    let Some(policy) = &loaded.compilation.policy else {
        return Ok(Outcome::stdout(
            validate::report(&loaded, args.common.json),
            Exit::Findings,
        ));
    };
    let resolution = args.principal.resolve(policy, at, &args.keys)?;
    let explanation = explain(args, policy, at, usage, arguments.as_ref(), resolution);
    let document = loaded.compilation.document.as_ref();
    let stdout = if args.common.json {
        super::to_json(&to_json(&loaded, document, &explanation))
    } else {
        human(&loaded, document, &explanation)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn explain<'a>(
    args: &'a Args,
    policy: &'a CompiledPolicy,
    at: Instant,
    usage: Usage,
    arguments: Option<&'a Map<String, Value>>,
    resolution: Result<Resolution, AuthProblem>,
) -> Explanation<'a> {
    let asked_tool = args.tool.as_deref();
    let (capability, tool) = match (args.capability.as_deref(), asked_tool) {
        (Some(capability), _) => (Some(capability), None),
        (None, Some(exposed)) => match policy.tools.resolve(exposed) {
            Some(tool) => (Some(tool.capability.as_str()), Some(tool)),
            None => (None, None),
        },
        // clap's required group makes this unreachable; answering "nothing
        // asked" is still better than a panic.
        (None, None) => (None, None),
    };
    let unknown_tool = asked_tool.is_some() && tool.is_none() && args.capability.is_none();
    let suggestion = asked_tool
        .filter(|_| unknown_tool)
        .and_then(|asked| policy.tools.closest(asked));
    let decision = match (&resolution, capability) {
        (Ok(resolution), Some(capability)) => Some(evaluate_call(
            &policy.ruleset,
            &resolution.principal,
            capability,
            at,
            usage,
            arguments,
        )),
        _ => None,
    };
    let conditions = match (&resolution, capability, &decision) {
        (Ok(resolution), Some(capability), Some(decision)) => checked_conditions(
            &policy.ruleset,
            &resolution.principal,
            capability,
            decision,
            arguments,
            at,
        ),
        _ => Vec::new(),
    };
    let tools = match (&decision, capability) {
        (Some(Decision::Allow(_)), Some(capability)) => policy
            .tools
            .realizing(move |realized| realized == capability)
            .collect(),
        _ => Vec::new(),
    };
    Explanation {
        at,
        usage,
        arguments,
        resolution,
        capability,
        asked_tool,
        tool,
        unknown_tool,
        suggestion,
        decision,
        conditions,
        tools,
    }
}

fn to_json(loaded: &Loaded, document_of: Option<&Document>, explanation: &Explanation<'_>) -> Value {
    let Explanation {
        at,
        usage,
        arguments,
        resolution,
        capability,
        asked_tool: _,
        tool,
        unknown_tool,
        suggestion,
        decision,
        conditions,
        tools,
    } = explanation;
    let (principal, discarded, problem) = match resolution {
        Ok(Resolution { principal, discarded }) => (json::principal(principal), json!(discarded), None),
        Err(problem) => (Value::Null, json!([]), Some(*problem)),
    };
    let mut document = json!({
        "policy": json::policy(&loaded.source, &loaded.compilation.version),
        "at": clock::format(*at),
        "usage": json::usage(*usage),
        "arguments": arguments.map_or(Value::Null, |arguments| Value::Object(arguments.clone())),
        "principal": principal,
        "discarded": discarded,
        "problem": json::problem(problem),
        "capability": capability,
        "tool": tool.map_or(Value::Null, json::tool_ref),
        "unknown_tool": unknown_tool,
        "decision": decision.as_ref().map_or(Value::Null, |decision| json::decision(decision, document_of)),
    });
    // Optional members that do not apply are absent (cli.md): the tool an unknown one most likely
    // meant, when there is one; the realising tools on an allow only.
    if let Some(suggestion) = suggestion {
        document["suggestion"] = json!(suggestion);
    }
    if decision.as_ref().is_some_and(Decision::is_allow) {
        document["tools"] = json!(tools.iter().map(|tool| json::tool_ref(tool)).collect::<Vec<_>>());
    }
    // The matching grants' conditions, when the decision consulted some.
    if !conditions.is_empty() {
        document["conditions"] = json!(conditions
            .iter()
            .map(|checked| checked_json(checked, document_of))
            .collect::<Vec<_>>());
    }
    document
}

/// `{"grant", "position", "applies", "conditions": [condition + "outcome"]}`.
pub(super) fn checked_json(checked: &Checked<'_>, document: Option<&Document>) -> Value {
    let path = &checked.grant.path;
    json!({
        "grant": path,
        "position": json::position_of(document, path),
        "applies": checked.applies(),
        "conditions": checked
            .outcomes
            .iter()
            .map(|(condition, held)| {
                let mut value = json::condition(condition, document);
                value["outcome"] = json!(json::outcome(*held));
                value
            })
            .collect::<Vec<_>>(),
    })
}

fn human(loaded: &Loaded, document: Option<&Document>, explanation: &Explanation<'_>) -> String {
    let mut out = String::new();
    let origin = &loaded.source.origin;
    let Explanation {
        at,
        usage,
        arguments,
        resolution,
        capability,
        asked_tool,
        tool,
        unknown_tool,
        suggestion,
        decision,
        conditions,
        tools,
    } = explanation;
    render::principal(
        &mut out,
        resolution
            .as_ref()
            .map(|resolution| (&resolution.principal, resolution.discarded.as_slice()))
            .map_err(|problem| *problem),
    );
    match (tool, capability) {
        (Some(tool), Some(capability)) => {
            let _ = writeln!(out, "tool       {} (realises {capability})", tool.exposed_name);
        }
        (None, Some(capability)) => {
            let _ = writeln!(out, "capability {capability}");
        }
        _ => {}
    }
    let _ = writeln!(out, "at         {}", clock::format(*at));
    let _ = writeln!(out, "usage      {}", usage_text(*usage));
    if let Some(arguments) = arguments {
        let _ = writeln!(out, "arguments  {}", Value::Object((*arguments).clone()));
    }
    out.push('\n');
    if *unknown_tool {
        let _ = writeln!(out, "UNKNOWN TOOL");
        let _ = writeln!(
            out,
            "  `{}` is not a mapped tool of the catalog: no decision is made",
            asked_tool.unwrap_or_default()
        );
        if let Some(suggestion) = suggestion {
            let _ = writeln!(out, "  did you mean `{suggestion}`?");
        }
        return out;
    }
    let Some(decision) = decision else {
        let _ = writeln!(out, "no decision: the principal did not resolve");
        return out;
    };
    let reason = decision.reason();
    let _ = writeln!(out, "{}", if decision.is_allow() { "ALLOWED" } else { "DENIED" });
    let _ = writeln!(
        out,
        "  reason    {} — {}",
        reason.code.as_str(),
        reason.code.describe()
    );
    let _ = writeln!(out, "  subject   {}", reason.subject);
    let position = document.and_then(|document| document.resolve(reason.path));
    let _ = writeln!(out, "  site      {}", render::site(origin, position, reason.path));
    if let Decision::Allow(allow) = decision {
        let _ = writeln!(out, "  account   {}", allow.account.id);
        let _ = writeln!(out, "  ceiling   {}", render::ceiling(allow.limits));
        let names: Vec<&str> = tools.iter().map(|tool| tool.exposed_name.as_str()).collect();
        if names.is_empty() {
            let _ = writeln!(out, "  tools     none");
        } else {
            let _ = writeln!(out, "  tools     {}", names.join(", "));
        }
        if allow.conditional {
            let _ = writeln!(
                out,
                "  conditional  yes: every grant that applies has conditions, and this call meets them"
            );
        }
    }
    if !conditions.is_empty() {
        out.push('\n');
        human_conditions(&mut out, origin, document, conditions);
    }
    out
}

/// Each matching grant's conditions and how each came out, with its site.
pub(super) fn human_conditions(
    out: &mut String,
    origin: &str,
    document: Option<&Document>,
    conditions: &[Checked<'_>],
) {
    let _ = writeln!(out, "conditions");
    let width = conditions
        .iter()
        .flat_map(|checked| &checked.outcomes)
        .map(|(condition, _)| condition.test.written().chars().count())
        .max()
        .unwrap_or(0);
    for checked in conditions {
        let path = &checked.grant.path;
        let position = document.and_then(|document| document.resolve(path));
        let verdict = if checked.applies() {
            "applies"
        } else {
            "does not apply"
        };
        let _ = writeln!(
            out,
            "  grant {}  ({verdict})",
            render::site(origin, position, path)
        );
        for (condition, held) in &checked.outcomes {
            let position = document.and_then(|document| document.resolve(&condition.path));
            let _ = writeln!(
                out,
                "    {:<7}  {:width$}  {}",
                json::outcome(*held),
                condition.test.written(),
                render::site(origin, position, &condition.path)
            );
        }
    }
}

fn usage_text(usage: Usage) -> String {
    match usage {
        Usage::Counted {
            calls: 1,
            window_start,
        } => format!("1 call counted since {}", clock::format(window_start)),
        Usage::Counted { calls, window_start } => {
            format!("{calls} calls counted since {}", clock::format(window_start))
        }
        Usage::Unknown => "unknown (the counter store failed)".to_owned(),
        Usage::NotConsulted => "not consulted (ceilings are not evaluated)".to_owned(),
    }
}
