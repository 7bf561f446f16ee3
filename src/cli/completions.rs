//! `capgate completions bash|zsh|fish`: the shell's completion script for every command and
//! flag, generated from the same definition the parser uses (clap_complete), so it cannot drift.

use clap::CommandFactory;

use super::{Cli, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete in.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "capgate", &mut script);
    let script = String::from_utf8(script)
        .map_err(|_| Failure::Input("the completion script is not UTF-8".to_owned()))?;
    Ok(Outcome::stdout(script, Exit::Done))
}
