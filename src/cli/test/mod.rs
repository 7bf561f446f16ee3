//! `capgate test [PATHS…] [--filter TEXT] [--min-coverage N] [--junit FILE] [--json]`:
//! runs policy test suites — files of expected decisions, listings and who-can
//! answers (`*.capgate-test.yaml`, format in `suite.rs`, schema from `capgate
//! schema --tests`) — against the policies they name, offline.
//!
//! Exit codes: 0 every case passed (and coverage is at least `--min-coverage`),
//! 1 a case failed, a policy did not compile or coverage is below the bar, 2 a
//! usage error (no test file found), 3 a test file, policy, catalog or key set
//! could not be used. Every file that loads is run even when another does not.

mod cases;
mod coverage;
mod report;
pub mod suite;

use std::path::{Path, PathBuf};

use capgate_core::access::Instant;

use super::input::{Inputs, Loaded};
use super::{Exit, Failure, Outcome};
use crate::clock;

use cases::CaseResult;
use coverage::Coverage;
use suite::{Problem, Suite};

/// How a test file is recognised when a folder is searched.
pub const SUFFIX: &str = ".capgate-test.yaml";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Test files, or folders searched for `*.capgate-test.yaml` (default: the current folder).
    #[arg(value_name = "PATHS")]
    pub paths: Vec<PathBuf>,
    /// Only cases whose name contains this text (any case); repeat for several.
    #[arg(long, value_name = "TEXT")]
    pub filter: Vec<String>,
    /// Fail (exit 1) when the cases exercise less than N % of a policy's grants, capabilities,
    /// accounts and conditions together (a condition counts when some case made it hold and
    /// some case made it fail).
    #[arg(long, value_name = "N", value_parser = parse_percent)]
    pub min_coverage: Option<f64>,
    /// Also write the results as JUnit XML to FILE, for CI systems.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Print the JSON document instead of the human report.
    #[arg(long)]
    pub json: bool,
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=100.0).contains(&value) => Ok(value),
        _ => Err("expected a percentage from 0 to 100".to_owned()),
    }
}

/// One test file and what became of it.
pub struct SuiteRun {
    pub origin: String,
    pub outcome: SuiteOutcome,
}

pub enum SuiteOutcome {
    /// The test file could not be used.
    Unusable(Vec<Problem>),
    /// Its policy, catalog or a key set could not be read.
    Unreadable(String),
    /// Its policy did not compile: the diagnostics, as `validate` prints them.
    PolicyRefused(Box<Loaded>),
    Ran {
        policy: Box<Loaded>,
        results: Vec<CaseResult>,
        /// The case file, for the positions of its cases.
        suite: Box<Suite>,
    },
}

/// The coverage of one policy, by every suite that ran against it.
pub struct PolicyCoverage<'r> {
    pub loaded: &'r Loaded,
    pub coverage: Coverage,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    let files = discover(&args.paths)?;
    let now = clock::now();
    let filters: Vec<String> = args.filter.iter().map(|text| text.to_lowercase()).collect();
    let selected = |name: &str| {
        let name = name.to_lowercase();
        filters.is_empty() || filters.iter().any(|filter| name.contains(filter))
    };
    let runs: Vec<SuiteRun> = files
        .iter()
        .map(|file| {
            let origin = file.to_string_lossy().into_owned();
            let outcome = run_file(file, &origin, inputs, now, &selected);
            SuiteRun { origin, outcome }
        })
        .collect();
    let coverages = coverages(&runs);
    let exit = exit_of(&runs, &coverages, args.min_coverage);
    if let Some(path) = &args.junit {
        write_atomically(path, report::junit(&runs).as_bytes())?;
    }
    let stdout = if args.json {
        super::to_json(&report::json(&runs, &coverages, args.min_coverage, exit))
    } else {
        report::human(&runs, &coverages, args.min_coverage)
    };
    Ok(Outcome::stdout(stdout, exit))
}

fn run_file(
    file: &Path,
    origin: &str,
    inputs: &mut Inputs<'_>,
    now: Instant,
    selected: &dyn Fn(&str) -> bool,
) -> SuiteOutcome {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(error) => {
            return SuiteOutcome::Unreadable(format!(
                "cannot read `{origin}`: {}",
                super::input::describe(&error)
            ))
        }
    };
    let folder = file.parent().unwrap_or(Path::new("."));
    let suite = match suite::load(origin, folder, &bytes) {
        Ok(suite) => suite,
        Err(problems) => return SuiteOutcome::Unusable(problems),
    };
    let loaded = match load_policy(&suite, inputs) {
        Ok(loaded) => loaded,
        Err(Failure::Input(message) | Failure::Usage(message)) => return SuiteOutcome::Unreadable(message),
    };
    let Some(policy) = &loaded.compilation.policy else {
        return SuiteOutcome::PolicyRefused(Box::new(loaded));
    };
    let mut context = cases::Context::new(&suite, policy, now);
    let results = match cases::run(&mut context, selected) {
        Ok(results) => results,
        Err(Failure::Input(message) | Failure::Usage(message)) => return SuiteOutcome::Unreadable(message),
    };
    SuiteOutcome::Ran {
        policy: Box::new(loaded),
        results,
        suite: Box::new(suite),
    }
}

fn load_policy(suite: &Suite, inputs: &mut Inputs<'_>) -> Result<Loaded, Failure> {
    let mut source = inputs.policy(&suite.policy)?;
    source.origin = suite.policy.to_string_lossy().into_owned();
    let catalog = inputs.catalog(suite.catalog.as_deref())?;
    Ok(Loaded::compile(source, catalog.as_ref()))
}

/// Suites naming the same policy file (and the same bytes) add up to one coverage, measured over
/// all their cases.
fn coverages(runs: &[SuiteRun]) -> Vec<PolicyCoverage<'_>> {
    // (the policy file, the first run that loaded it, every case run against it)
    let mut groups: Vec<(PathBuf, &Loaded, Vec<&CaseResult>)> = Vec::new();
    for run in runs {
        let SuiteOutcome::Ran {
            policy,
            results,
            suite,
        } = &run.outcome
        else {
            continue;
        };
        let key = std::fs::canonicalize(&suite.policy).unwrap_or_else(|_| suite.policy.clone());
        let same = |(path, loaded, _): &&mut (PathBuf, &Loaded, Vec<&CaseResult>)| {
            *path == key && loaded.compilation.version == policy.compilation.version
        };
        match groups.iter_mut().find(same) {
            Some((_, _, cases)) => cases.extend(results),
            None => groups.push((key, policy, results.iter().collect())),
        }
    }
    groups
        .into_iter()
        .filter_map(|(_, loaded, cases)| {
            let coverage = coverage::measure(loaded.compilation.policy.as_ref()?, cases);
            Some(PolicyCoverage { loaded, coverage })
        })
        .collect()
}

fn exit_of(runs: &[SuiteRun], coverages: &[PolicyCoverage], min_coverage: Option<f64>) -> Exit {
    let unusable = runs.iter().any(|run| {
        matches!(
            run.outcome,
            SuiteOutcome::Unusable(_) | SuiteOutcome::Unreadable(_)
        )
    });
    if unusable {
        return Exit::Input;
    }
    let failed = runs.iter().any(|run| match &run.outcome {
        SuiteOutcome::PolicyRefused(_) => true,
        SuiteOutcome::Ran { results, .. } => results.iter().any(|result| !result.passed()),
        _ => false,
    });
    let short =
        min_coverage.is_some_and(|bar| coverages.iter().any(|coverage| coverage.coverage.percent() < bar));
    if failed || short {
        Exit::Findings
    } else {
        Exit::Done
    }
}

/// The test files named: files as given, folders searched (sorted, hidden
/// folders, `target` and `node_modules` skipped, symbolic links not followed).
fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let roots: Vec<PathBuf> = if paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        paths.to_vec()
    };
    let mut files = Vec::new();
    for root in &roots {
        let metadata = std::fs::metadata(root).map_err(|error| {
            Failure::Input(format!(
                "cannot read `{}`: {}",
                root.display(),
                super::input::describe(&error)
            ))
        })?;
        if metadata.is_dir() {
            search(root, 0, &mut files);
        } else {
            files.push(root.clone());
        }
    }
    if files.is_empty() {
        let searched: Vec<String> = roots.iter().map(|root| format!("`{}`", root.display())).collect();
        return Err(Failure::Usage(format!(
            "no test file (`*{SUFFIX}`) under {}",
            searched.join(", ")
        )));
    }
    Ok(files)
}

/// Folders deeper than this are not searched: a bound on the walk.
const MAX_DEPTH: usize = 16;

fn search(folder: &Path, depth: usize, files: &mut Vec<PathBuf>) {
    if depth > MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                search(&path, depth + 1, files);
            }
        } else if metadata.is_file() && name.ends_with(SUFFIX) {
            files.push(path.strip_prefix("./").map(Path::to_owned).unwrap_or(path));
        }
    }
}

/// Writes a whole file or nothing: to a temporary sibling, then renamed.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let failed = |error: std::io::Error| {
        Failure::Input(format!(
            "cannot write `{}`: {}",
            path.display(),
            super::input::describe(&error)
        ))
    };
    std::fs::write(&temporary, bytes).map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(|error| {
        let _ = std::fs::remove_file(&temporary);
        failed(error)
    })
}
