//! `capgate validate POLICY [--catalog F] [--json]`: compile and report every
//! diagnostic in emission order; exit 1 iff any is an error.
//!
//! What this prints is also what `explain`, `visible` and `who-can` print for
//! a policy that does not compile, and what `diff` prints per failing side.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::args::Common;
use super::input::{Inputs, Loaded};
use super::{json, render, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy artifact (`-` reads standard input).
    #[arg(value_name = "POLICY")]
    pub policy: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let source = inputs.policy(&args.policy)?;
    let catalog = inputs.catalog(args.common.catalog.as_deref())?;
    let loaded = Loaded::compile(source, catalog.as_ref());
    let exit = if loaded.compilation.ok() {
        Exit::Done
    } else {
        Exit::Findings
    };
    Ok(Outcome::stdout(report(&loaded, args.common.json), exit))
}

/// The validate report, JSON or human, ready to print.
pub fn report(loaded: &Loaded, as_json: bool) -> String {
    if as_json {
        super::to_json(&document(loaded))
    } else {
        human(loaded)
    }
}

/// `{"policy", "ok", "diagnostics"}`.
pub fn document(loaded: &Loaded) -> Value {
    let Loaded { source, compilation } = loaded;
    json!({
        "policy": json::policy(source, &compilation.version),
        "ok": compilation.ok(),
        "diagnostics": diagnostics(loaded),
    })
}

/// The diagnostics array alone (also `diff`'s per-side `errors[].diagnostics`).
pub fn diagnostics(loaded: &Loaded) -> Value {
    Value::Array(
        loaded
            .compilation
            .diagnostics
            .iter()
            .map(json::diagnostic)
            .collect(),
    )
}

pub fn human(loaded: &Loaded) -> String {
    let Loaded { source, compilation } = loaded;
    render::diagnostics(source, compilation.document.as_ref(), &compilation.diagnostics)
}
