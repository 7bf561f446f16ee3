//! `capgate schema [--tests]`: prints the policy artifact's JSON Schema, or
//! with `--tests` the policy test file's (draft 2020-12), for editors and
//! external validators. Always exit 0.

use capgate_core::policy::schema::SCHEMA_JSON;

use super::{Exit, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the schema of `capgate test` files (`*.capgate-test.yaml`) instead.
    #[arg(long)]
    pub tests: bool,
}

pub fn run(args: &Args) -> Outcome {
    let schema = if args.tests {
        super::test::suite::SCHEMA_JSON
    } else {
        SCHEMA_JSON
    };
    let mut stdout = schema.to_owned();
    if !stdout.ends_with('\n') {
        stdout.push('\n');
    }
    Outcome::stdout(stdout, Exit::Done)
}
