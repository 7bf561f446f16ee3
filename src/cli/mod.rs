//! The `capgate` command line: the dry-run commands (`validate`, `explain`,
//! `visible`, `who-can`, `diff`, `schema`; docs/cli.md) and the service
//! commands (`serve`, `migrate`, `publish`, `policies`, `audit`, `usage`,
//! `decide`, `replay`; docs/service.md), and `completions`. One file per subcommand; `json` converts core types for
//! `--json`, `render` writes the human reports, `remote` holds what the
//! service commands share.
//!
//! [`run`] is the whole program but for the process edge: it takes the
//! arguments and standard input and returns what to print and the exit code,
//! so `main` only writes and exits. Nothing here panics on any input.
//!
//! Exit codes (every command): 0 done, 1 findings, 2 usage error, 3 an input
//! could not be used.

mod args;
mod audit;
mod completions;
mod condition_diff;
mod decide;
mod diff;
mod explain;
mod input;
mod json;
mod migrate;
mod policies;
mod publish;
pub mod remote;
mod render;
pub mod replay;
mod schema;
mod serve;
mod test;
mod usage;
mod validate;
mod visible;
mod who_can;

use std::ffi::OsString;
use std::io::Read;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

use input::Inputs;

/// capgate: which tools an AI agent may see and call, as which account, under
/// which ceiling — and why.
#[derive(Debug, Parser)]
#[command(
    name = "capgate",
    version,
    after_help = "Dry run, from the policy file alone (no server, no network, no credentials):\n  \
                  validate, explain, visible, who-can, diff, test, schema\n\
                  The decision service: serve and migrate run it; decide, publish and policies \
                  call a running server; audit, usage and replay read its store (usage reset calls the \
                  server):\n  \
                  serve, migrate, decide, publish, policies, audit, usage, replay\n\
                  The shell:\n  \
                  completions",
    color = clap::ColorChoice::Never,
    arg_required_else_help = false,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile a policy and report every diagnostic (exit 1 on any error).
    Validate(validate::Args),
    /// Decide for one principal and one capability or tool, and say why.
    Explain(explain::Args),
    /// List the capabilities and tools a principal can see.
    Visible(visible::Args),
    /// List every grant naming a capability.
    WhoCan(who_can::Args),
    /// Show which decisions change between two versions of a policy.
    Diff(diff::Args),
    /// Run policy test suites (`*.capgate-test.yaml`): expected decisions, listings, who-can.
    Test(test::Args),
    /// Print the policy artifact's JSON Schema (or the test file's, with `--tests`).
    Schema(schema::Args),
    /// Run the gRPC decision service.
    Serve(Box<serve::Args>),
    /// Apply the store's schema.
    Migrate(migrate::Args),
    /// Ask a running server for a decision, as a gateway would.
    Decide(decide::Args),
    /// Publish a policy version to a server.
    Publish(publish::Args),
    /// List stored policy versions, or activate one (rollback).
    Policies(policies::Args),
    /// Query the audit trail in the store, or prune whole months of it.
    Audit(audit::Args),
    /// Show a principal's usage counters from the store, or reset one through the server.
    Usage(usage::Args),
    /// Decide the audit trail's records again under a candidate policy, and count what changes.
    Replay(replay::Args),
    /// Print a shell completion script (bash, zsh, fish).
    Completions(completions::Args),
}

/// How the process ends (cli.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done, no findings.
    Done,
    /// Findings: errors, a policy that does not compile, changes.
    Findings,
    /// A usage error.
    Usage,
    /// An input could not be used.
    Input,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::Findings => 1,
            Exit::Usage => 2,
            Exit::Input => 3,
        }
    }
}

/// What one invocation prints, and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: String,
    pub exit: Exit,
}

impl Outcome {
    fn stdout(stdout: String, exit: Exit) -> Self {
        Outcome {
            stdout,
            stderr: String::new(),
            exit,
        }
    }
}

/// Why a command stopped before answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A usage error found after parsing (exit 2); the message is one line.
    Usage(String),
    /// An input could not be used (exit 3); the message is one line.
    Input(String),
}

const HINT: &str = "For more information, try '--help'.";

/// Runs one invocation: `arguments` as the process received them (program
/// name first), `stdin` for the policy argument `-`.
pub fn run<I, T>(arguments: I, stdin: &mut dyn Read) -> Outcome
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let arguments: Vec<OsString> = arguments.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(arguments.iter().cloned()) {
        Ok(cli) => cli,
        Err(error) => {
            // Not parsed, so the flag is looked for as written.
            let json = arguments.iter().any(|argument| argument == "--json");
            return errors_as_json(clap_outcome(&error), json);
        }
    };
    let json = cli.command.wants_json();
    let mut inputs = Inputs::new(stdin);
    let result = match &cli.command {
        Command::Validate(args) => validate::run(args, &mut inputs),
        Command::Explain(args) => explain::run(args, &mut inputs),
        Command::Visible(args) => visible::run(args, &mut inputs),
        Command::WhoCan(args) => who_can::run(args, &mut inputs),
        Command::Diff(args) => diff::run(args, &mut inputs),
        Command::Test(args) => test::run(args, &mut inputs),
        Command::Schema(args) => Ok(schema::run(args)),
        Command::Serve(args) => serve::run(args, &mut inputs),
        Command::Migrate(args) => migrate::run(args),
        Command::Decide(args) => decide::run(args),
        Command::Publish(args) => publish::run(args, &mut inputs),
        Command::Policies(args) => policies::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Usage(args) => usage::run(args),
        Command::Replay(args) => replay::run(args, &mut inputs),
        Command::Completions(args) => completions::run(args),
    };
    let outcome = result.unwrap_or_else(|failure| match failure {
        Failure::Usage(message) => Outcome {
            stdout: String::new(),
            stderr: format!("error: {message}\n{HINT}\n"),
            exit: Exit::Usage,
        },
        Failure::Input(message) => Outcome {
            stdout: String::new(),
            stderr: format!("error: {message}\n"),
            exit: Exit::Input,
        },
    });
    errors_as_json(outcome, json)
}

impl Command {
    /// Whether the invocation asked for `--json`.
    fn wants_json(&self) -> bool {
        match self {
            Command::Validate(args) => args.common.json,
            Command::Explain(args) => args.common.json,
            Command::Visible(args) => args.common.json,
            Command::WhoCan(args) => args.common.json,
            Command::Diff(args) => args.common.json,
            Command::Test(args) => args.json,
            Command::Decide(args) => args.json,
            Command::Publish(args) => args.json,
            Command::Policies(args) => match &args.command {
                policies::Command::List { json, .. }
                | policies::Command::Show { json, .. }
                | policies::Command::Diff { json, .. }
                | policies::Command::History { json, .. }
                | policies::Command::Activate { json, .. } => *json,
                policies::Command::Shadow(shadow) => shadow.command.json(),
            },
            Command::Usage(args) => match &args.command {
                Some(usage::Command::Reset(reset)) => reset.json,
                None => args.query.json,
            },
            Command::Audit(args) => match &args.command {
                Some(audit::Command::Prune(prune)) => prune.json,
                None => args.query.json,
            },
            Command::Replay(args) => args.common.json,
            // The schema is JSON already; serve and migrate print logs, not documents; a
            // completion script is a script.
            Command::Schema(_) | Command::Serve(_) | Command::Migrate(_) | Command::Completions(_) => false,
        }
    }
}

/// With `--json`, a run that ends in an error and printed no document prints one: `{"error":
/// {"exit": N, "message": "…"}}` on standard output (the human line stays on standard error), so
/// a script reads every answer the same way.
fn errors_as_json(outcome: Outcome, json: bool) -> Outcome {
    if !json || outcome.exit == Exit::Done || !outcome.stdout.is_empty() || outcome.stderr.is_empty() {
        return outcome;
    }
    let message = outcome
        .stderr
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    Outcome {
        stdout: to_json(&serde_json::json!({"error": {"exit": outcome.exit.code(), "message": message}})),
        ..outcome
    }
}

/// Help and version go to stdout with exit 0. Every other clap error is a
/// usage error: one line naming the problem, then the `--help` hint, to
/// stderr, exit 2. Clap's own rendering spreads a problem over several
/// lines (the list of missing arguments, a usage line, tips); only the
/// problem is kept, its continuation lines folded into the first.
fn clap_outcome(error: &clap::Error) -> Outcome {
    let rendered = error.render().to_string();
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Outcome::stdout(rendered, Exit::Done),
        _ => Outcome {
            stdout: String::new(),
            stderr: format!("{}\n{HINT}\n", problem_line(&rendered)),
            exit: Exit::Usage,
        },
    }
}

/// The first paragraph of a clap error as one line.
fn problem_line(rendered: &str) -> String {
    let mut paragraph = rendered.lines().take_while(|line| !line.trim().is_empty());
    let mut line = paragraph
        .next()
        .unwrap_or("error: invalid usage")
        .trim_end()
        .to_owned();
    let rest: Vec<&str> = paragraph.map(str::trim).collect();
    if !rest.is_empty() {
        line.push(' ');
        line.push_str(&rest.join(", "));
    }
    if !line.starts_with("error:") {
        line.insert_str(0, "error: ");
    }
    line
}

/// A JSON document as printed: pretty, with a final newline.
fn to_json(value: &serde_json::Value) -> String {
    // Serialising a `Value` cannot fail: its keys are strings.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_problems_fold_into_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  --issuer <I>\n  --subject <S>\n\nUsage: capgate explain\n\nFor more information, try '--help'.\n";
        assert_eq!(
            problem_line(rendered),
            "error: the following required arguments were not provided: --issuer <I>, --subject <S>"
        );
        assert_eq!(
            problem_line("error: unexpected argument '--x' found\n\n  tip: …\n"),
            "error: unexpected argument '--x' found"
        );
        assert_eq!(problem_line(""), "error: invalid usage");
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
