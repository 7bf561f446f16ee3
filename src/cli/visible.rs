//! `capgate visible`: the listing question (`ListVisible`) — the same
//! evaluation per declared capability with usage not consulted, and the
//! catalog tools that realise what is allowed (docs/reference.md#listings).
//!
//! No `--at`: ceilings are not consulted in a listing, so time cannot matter. Nor are
//! conditions: a capability whose every grant is conditional is listed, marked
//! `conditional` (a call may still be denied on its arguments or time).

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use capgate_core::access::{visible, VisibleCapability};
use capgate_core::capabilities::ToolDescriptor;
use capgate_core::policy::CompiledPolicy;
use capgate_core::principals::{AuthProblem, Resolution};

use super::args::{Asserted, Common, LocalKeys};
use super::input::{Inputs, Loaded};
use super::{json, render, validate, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy artifact (`-` reads standard input).
    #[arg(value_name = "POLICY")]
    pub policy: PathBuf,
    #[command(flatten)]
    pub principal: Asserted,
    #[command(flatten)]
    pub keys: LocalKeys,
    #[command(flatten)]
    pub common: Common,
}

/// The listing, before it is printed.
struct Listing<'p> {
    resolution: Result<Resolution, AuthProblem>,
    capabilities: Vec<VisibleCapability<'p>>,
    tools: Vec<&'p ToolDescriptor>,
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
    // A credential's `exp` and `nbf` are checked now.
    let resolution = args.principal.resolve(policy, crate::clock::now(), &args.keys)?;
    let listing = list(policy, resolution);
    let stdout = if args.common.json {
        super::to_json(&to_json(&loaded, &listing))
    } else {
        human(&loaded, &listing)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn list<'p>(policy: &'p CompiledPolicy, resolution: Result<Resolution, AuthProblem>) -> Listing<'p> {
    // `at` only matters to the ceiling check, which a listing skips.
    let capabilities = match &resolution {
        Ok(resolution) => visible(&policy.ruleset, &resolution.principal, 0),
        Err(_) => Vec::new(),
    };
    let allowed: Vec<&'p str> = capabilities
        .iter()
        .map(|visible| visible.capability.id.as_str())
        .collect();
    let tools = policy
        .tools
        .realizing(move |capability| allowed.contains(&capability))
        .collect();
    Listing {
        resolution,
        capabilities,
        tools,
    }
}

fn to_json(loaded: &Loaded, listing: &Listing<'_>) -> Value {
    let Listing {
        resolution,
        capabilities,
        tools,
    } = listing;
    let (principal, discarded, problem) = match resolution {
        Ok(Resolution { principal, discarded }) => (json::principal(principal), json!(discarded), None),
        Err(problem) => (Value::Null, json!([]), Some(*problem)),
    };
    json!({
        "policy": json::policy(&loaded.source, &loaded.compilation.version),
        "principal": principal,
        "discarded": discarded,
        "problem": json::problem(problem),
        "capabilities": capabilities.iter().map(visible_capability).collect::<Vec<_>>(),
        "tools": tools.iter().map(|tool| json::listed_tool(tool)).collect::<Vec<_>>(),
    })
}

fn visible_capability(visible: &VisibleCapability<'_>) -> Value {
    let VisibleCapability {
        capability,
        account,
        limits,
        path,
        conditional,
    } = visible;
    json!({
        "capability": capability.id,
        "account": json::account(account),
        "limits": json::ceiling(*limits),
        "path": path,
        "conditional": conditional,
    })
}

fn human(loaded: &Loaded, listing: &Listing<'_>) -> String {
    let mut out = String::new();
    let Listing {
        resolution,
        capabilities,
        tools,
    } = listing;
    render::principal(
        &mut out,
        resolution
            .as_ref()
            .map(|resolution| (&resolution.principal, resolution.discarded.as_slice()))
            .map_err(|problem| *problem),
    );
    if resolution.is_err() {
        let _ = writeln!(out, "\nnothing is visible: the principal did not resolve");
        return out;
    }
    out.push('\n');
    if capabilities.is_empty() {
        let _ = writeln!(out, "nothing is visible to this principal");
        return out;
    }
    let document = loaded.compilation.document.as_ref();
    let origin = &loaded.source.origin;
    let _ = writeln!(out, "capabilities ({})", capabilities.len());
    for visible in capabilities {
        let position = document.and_then(|document| document.resolve(visible.path));
        if visible.conditional {
            let _ = writeln!(
                out,
                "  {}  (conditional: a call may be denied on its arguments or time)",
                visible.capability.id
            );
        } else {
            let _ = writeln!(out, "  {}", visible.capability.id);
        }
        let _ = writeln!(out, "    account   {}", visible.account.id);
        let _ = writeln!(out, "    ceiling   {}", render::ceiling(visible.limits));
        let _ = writeln!(
            out,
            "    granted   {}",
            render::site(origin, position, visible.path)
        );
    }
    out.push('\n');
    let _ = writeln!(out, "tools ({})", tools.len());
    let width = |text: &dyn Fn(&ToolDescriptor) -> &str| {
        tools
            .iter()
            .map(|tool| text(tool).chars().count())
            .max()
            .unwrap_or(0)
    };
    let name_width = width(&|tool| &tool.exposed_name);
    let capability_width = width(&|tool| &tool.capability);
    for tool in tools {
        // One line per tool: a multi-line description shows its first line.
        let description = tool.description.as_deref().and_then(|text| text.lines().next());
        let line = format!(
            "  {:name_width$}  {:capability_width$}  {}",
            tool.exposed_name,
            tool.capability,
            description.unwrap_or("")
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}
