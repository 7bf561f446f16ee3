//! `capgate schema`: prints the artifact's JSON Schema (draft 2020-12), for
//! editors and external validators. Always exit 0.

use capgate_core::policy::schema::SCHEMA_JSON;

use super::{Exit, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> Outcome {
    let mut stdout = SCHEMA_JSON.to_owned();
    if !stdout.ends_with('\n') {
        stdout.push('\n');
    }
    Outcome::stdout(stdout, Exit::Done)
}
