//! `capgate who-can POLICY --capability C`: the reverse query ("who can issue
//! refunds?") — every grant naming `C`, in file order, whatever its account
//! state, ceiling or conditions (each shown, with where it is written), and the
//! tools that realise `C`.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use capgate_core::access::{who_can, Grant, Reach};
use capgate_core::capabilities::ToolDescriptor;
use capgate_core::policy::Document;

use super::args::Common;
use super::input::{Inputs, Loaded};
use super::{json, render, validate, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy artifact (`-` reads standard input).
    #[arg(value_name = "POLICY")]
    pub policy: PathBuf,
    /// The capability id to ask about.
    #[arg(long, value_name = "C")]
    pub capability: String,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let source = inputs.policy(&args.policy)?;
    let catalog = inputs.catalog(args.common.catalog.as_deref())?;
    let loaded = Loaded::compile(source, catalog.as_ref());
    let Some(policy) = &loaded.compilation.policy else {
        return Ok(Outcome::stdout(
            validate::report(&loaded, args.common.json),
            Exit::Findings,
        ));
    };
    let capability = args.capability.as_str();
    let reach = who_can(&policy.ruleset, capability);
    let tools: Vec<&ToolDescriptor> = policy
        .tools
        .realizing(|realized| realized == capability)
        .collect();
    let document = loaded.compilation.document.as_ref();
    let stdout = if args.common.json {
        super::to_json(&to_json(&loaded, document, capability, &reach, &tools))
    } else {
        human(&loaded, document, capability, &reach, &tools)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn to_json(
    loaded: &Loaded,
    document: Option<&Document>,
    capability: &str,
    reach: &Reach<'_>,
    tools: &[&ToolDescriptor],
) -> Value {
    let Reach {
        declared,
        realized,
        grants,
    } = reach;
    json!({
        "policy": json::policy(&loaded.source, &loaded.compilation.version),
        "capability": capability,
        "declared": declared,
        "realized": realized,
        "grants": grants.iter().map(|(_, grant)| grant_json(grant, document)).collect::<Vec<_>>(),
        "tools": tools.iter().map(|tool| json::tool_ref(tool)).collect::<Vec<_>>(),
    })
}

fn grant_json(grant: &Grant, document: Option<&Document>) -> Value {
    let Grant {
        issuer,
        selector,
        capabilities: _,
        account,
        limits,
        conditions,
        path,
    } = grant;
    json!({
        "issuer": issuer,
        "attributes": json::attributes(selector.iter().map(|(name, value)| (name, value))),
        "account": json::account_state(account),
        "limits": json::ceiling(limits.as_ref()),
        "conditions": conditions
            .iter()
            .map(|condition| json::condition(condition, document))
            .collect::<Vec<_>>(),
        "path": path,
        "position": json::position_of(document, path),
    })
}

fn human(
    loaded: &Loaded,
    document: Option<&Document>,
    capability: &str,
    reach: &Reach<'_>,
    tools: &[&ToolDescriptor],
) -> String {
    let mut out = String::new();
    let origin = &loaded.source.origin;
    if !reach.declared {
        let _ = writeln!(
            out,
            "the capability `{capability}` is not declared in {origin}: nobody can use it"
        );
        return out;
    }
    let _ = writeln!(out, "who can use `{capability}`:");
    out.push('\n');
    if reach.grants.is_empty() {
        let _ = writeln!(out, "  nobody: the capability is declared and no grant names it");
        out.push('\n');
    }
    for (_, grant) in &reach.grants {
        let selector = render::attribute_list(grant.selector.iter().map(|(name, value)| (name, value)));
        if selector.is_empty() {
            let _ = writeln!(out, "  issuer {}  (every principal)", grant.issuer);
        } else {
            let _ = writeln!(out, "  issuer {}  {selector}", grant.issuer);
        }
        let disabled = if grant.account.disabled {
            "  (disabled: every call denies)"
        } else {
            ""
        };
        let _ = writeln!(out, "    account   {}{disabled}", grant.account.id);
        let _ = writeln!(out, "    ceiling   {}", render::ceiling(grant.limits.as_ref()));
        let width = grant
            .conditions
            .iter()
            .map(|condition| condition.test.written().chars().count())
            .max()
            .unwrap_or(0);
        for (n, condition) in grant.conditions.iter().enumerate() {
            let position = document.and_then(|document| document.resolve(&condition.path));
            let _ = writeln!(
                out,
                "    {:<8}  {:width$}  {}",
                if n == 0 { "when" } else { "" },
                condition.test.written(),
                render::site(origin, position, &condition.path)
            );
        }
        let position = document.and_then(|document| document.resolve(&grant.path));
        let _ = writeln!(
            out,
            "    granted   {}",
            render::site(origin, position, &grant.path)
        );
        out.push('\n');
    }
    if reach.realized {
        let names: Vec<&str> = tools.iter().map(|tool| tool.exposed_name.as_str()).collect();
        let _ = writeln!(out, "realised by: {}", names.join(", "));
    } else {
        let _ = writeln!(
            out,
            "warning: no tool realises this capability, so granting it exposes nothing"
        );
    }
    out
}
