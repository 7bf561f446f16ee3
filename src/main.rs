//! The `capgate` binary: runs the command line and writes what it produced.
//! All the work is in `capgate::cli`; this file is the process
//! edge — the real arguments, standard input and output, the exit code.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context as _;
use capgate::cli::{run, Exit};

fn main() -> ExitCode {
    let outcome = run(std::env::args_os(), &mut std::io::stdin().lock());
    let mut code = outcome.exit.code();
    if let Err(error) = emit(&outcome.stdout, &outcome.stderr) {
        // A reader that went away (`capgate schema | head -1`) is not an
        // error of ours; anything else about our own output is reported.
        let broken_pipe = error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe);
        if !broken_pipe {
            let _ = writeln!(std::io::stderr().lock(), "error: {error:#}");
            code = Exit::Input.code();
        }
    }
    ExitCode::from(code)
}

fn emit(stdout: &str, stderr: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(stdout.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write to standard output")?;
    let mut err = std::io::stderr().lock();
    err.write_all(stderr.as_bytes())
        .and_then(|()| err.flush())
        .context("cannot write to standard error")?;
    Ok(())
}
