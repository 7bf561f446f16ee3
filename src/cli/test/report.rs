//! What `capgate test` prints: the human report (one line per case, each
//! failure with expected and actual and the source lines of the case and of
//! what decided it), the `--json` document, and JUnit XML for CI systems.

use std::fmt::Write as _;

use serde_json::{json, Value};

use capgate_core::policy::{Document, Position};

use super::cases::{CaseResult, Mismatch};
use super::{PolicyCoverage, SuiteOutcome, SuiteRun};
use crate::cli::{json as shared, render, validate, Exit};

pub fn human(runs: &[SuiteRun], coverages: &[PolicyCoverage], min_coverage: Option<f64>) -> String {
    let mut out = String::new();
    for run in runs {
        let _ = writeln!(out, "{}", run.origin);
        match &run.outcome {
            SuiteOutcome::Unusable(problems) => {
                for problem in problems {
                    let _ = writeln!(
                        out,
                        "  error: {}: {}",
                        render::location(&run.origin, problem.position),
                        problem.message
                    );
                }
            }
            SuiteOutcome::Unreadable(message) => {
                let _ = writeln!(out, "  error: {message}");
            }
            SuiteOutcome::PolicyRefused(loaded) => {
                let _ = writeln!(
                    out,
                    "  error: the policy `{}` does not compile; no case ran",
                    loaded.source.origin
                );
                for line in validate::human(loaded).lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
            SuiteOutcome::Ran {
                policy,
                results,
                suite,
            } => {
                if results.is_empty() {
                    let _ = writeln!(out, "  no case selected");
                }
                let policy_text = policy.source.text();
                for result in results {
                    if result.passed() {
                        let _ = writeln!(out, "  ok    {:<8} {}", result.kind.as_str(), result.name);
                        continue;
                    }
                    let _ = writeln!(out, "  FAIL  {:<8} {}", result.kind.as_str(), result.name);
                    let _ = writeln!(
                        out,
                        "        case at {}",
                        render::location(&run.origin, result.position)
                    );
                    source_line(&mut out, &suite.text, result.position);
                    for Mismatch {
                        field,
                        expected,
                        actual,
                    } in &result.mismatches
                    {
                        let _ = writeln!(out, "        {field}: expected {expected}, got {actual}");
                    }
                    if let Some(pointer) = &result.decided_by {
                        let position = resolve(policy.compilation.document.as_ref(), pointer);
                        let _ = writeln!(
                            out,
                            "        decided by {} at {}",
                            render::pointer(pointer),
                            render::location(&policy.source.origin, position)
                        );
                        source_line(&mut out, &policy_text, position);
                    }
                }
            }
        }
    }
    for PolicyCoverage { loaded, coverage, .. } in coverages {
        // Conditions are counted where the policy has some.
        let conditions = if coverage.conditions.1 == 0 {
            String::new()
        } else {
            format!(", conditions {}/{}", coverage.conditions.0, coverage.conditions.1)
        };
        let _ = writeln!(
            out,
            "coverage of {}: {:.1} % (grants {}/{}, capabilities {}/{}, accounts {}/{}{conditions})",
            loaded.source.origin,
            coverage.percent(),
            coverage.grants.0,
            coverage.grants.1,
            coverage.capabilities.0,
            coverage.capabilities.1,
            coverage.accounts.0,
            coverage.accounts.1
        );
        let document = loaded.compilation.document.as_ref();
        for item in &coverage.uncovered {
            let position = resolve(document, &item.path);
            let site = render::location(&loaded.source.origin, position);
            match item.tried {
                Some(tried) => {
                    let _ = writeln!(
                        out,
                        "  not exercised: {} `{}` at {site}  {} ({})",
                        item.kind,
                        item.id,
                        item.path,
                        tried.missing()
                    );
                }
                None => {
                    let _ = writeln!(out, "  not exercised: {} `{}` at {site}", item.kind, item.id);
                }
            }
        }
        if let Some(bar) = min_coverage {
            if coverage.percent() < bar {
                let _ = writeln!(out, "  below --min-coverage {bar} %");
            }
        }
    }
    let (passed, failed) = tally(runs);
    let _ = writeln!(out, "{} cases: {passed} passed, {failed} failed", passed + failed);
    out
}

/// How many cases that ran passed, and how many failed.
fn tally(runs: &[SuiteRun]) -> (usize, usize) {
    let results = runs.iter().flat_map(|run| match &run.outcome {
        SuiteOutcome::Ran { results, .. } => results.as_slice(),
        _ => &[],
    });
    let (passed, failed): (Vec<&CaseResult>, Vec<&CaseResult>) = results.partition(|result| result.passed());
    (passed.len(), failed.len())
}

fn resolve(document: Option<&Document>, pointer: &str) -> Option<Position> {
    document.and_then(|document| document.resolve(pointer))
}

/// The source line at `position`, indented under the report line.
fn source_line(out: &mut String, text: &str, position: Option<Position>) {
    let Some(position) = position else { return };
    if let Some(line) = text.lines().nth(position.line.wrapping_sub(1)) {
        let _ = writeln!(out, "        {:>5} | {}", position.line, line.trim_end());
    }
}

pub fn json(runs: &[SuiteRun], coverages: &[PolicyCoverage], min_coverage: Option<f64>, exit: Exit) -> Value {
    let suites: Vec<Value> = runs
        .iter()
        .map(|run| match &run.outcome {
            SuiteOutcome::Unusable(problems) => json!({
                "file": run.origin,
                "problems": problems
                    .iter()
                    .map(|problem| json!({
                        "pointer": problem.pointer,
                        "position": shared::position(problem.position),
                        "message": problem.message,
                    }))
                    .collect::<Vec<_>>(),
            }),
            SuiteOutcome::Unreadable(message) => json!({
                "file": run.origin,
                "problems": [{"pointer": "", "position": null, "message": message}],
            }),
            SuiteOutcome::PolicyRefused(loaded) => json!({
                "file": run.origin,
                "policy": shared::policy(&loaded.source, &loaded.compilation.version),
                "diagnostics": validate::diagnostics(loaded),
            }),
            SuiteOutcome::Ran { policy, results, .. } => {
                let document = policy.compilation.document.as_ref();
                json!({
                    "file": run.origin,
                    "policy": shared::policy(&policy.source, &policy.compilation.version),
                    "cases": results
                        .iter()
                        .map(|result| case_json(result, document))
                        .collect::<Vec<_>>(),
                })
            }
        })
        .collect();
    let (passed, failed) = tally(runs);
    json!({
        "suites": suites,
        "coverage": coverages
            .iter()
            .map(|PolicyCoverage { loaded, coverage, .. }| {
                let document = loaded.compilation.document.as_ref();
                let pair = |(covered, total): (usize, usize)| json!({"covered": covered, "total": total});
                let mut value = json!({
                    "policy": shared::policy(&loaded.source, &loaded.compilation.version),
                    "percent": (coverage.percent() * 10.0).round() / 10.0,
                    "grants": pair(coverage.grants),
                    "capabilities": pair(coverage.capabilities),
                    "accounts": pair(coverage.accounts),
                    "conditions": pair(coverage.conditions),
                    "uncovered": coverage.uncovered.iter().map(|item| {
                        let mut value = json!({
                            "kind": item.kind,
                            "id": item.id,
                            "path": item.path,
                            "position": shared::position_of(document, &item.path),
                        });
                        // A condition says which side no case tried.
                        if let Some(tried) = item.tried {
                            value["held"] = json!(tried.held);
                            value["failed"] = json!(tried.failed);
                        }
                        value
                    }).collect::<Vec<_>>(),
                });
                if let Some(bar) = min_coverage {
                    value["below_minimum"] = json!(coverage.percent() < bar);
                }
                value
            })
            .collect::<Vec<_>>(),
        "summary": {"cases": passed + failed, "passed": passed, "failed": failed, "exit": exit.code()},
    })
}

fn case_json(result: &CaseResult, document: Option<&Document>) -> Value {
    let mut value = json!({
        "kind": result.kind.as_str(),
        "name": result.name,
        "pointer": result.pointer,
        "position": shared::position(result.position),
        "passed": result.passed(),
        "mismatches": result.mismatches.iter().map(|Mismatch { field, expected, actual }| json!({
            "field": field,
            "expected": expected,
            "actual": actual,
        })).collect::<Vec<_>>(),
    });
    if let Some(pointer) = &result.decided_by {
        value["decided_by"] = json!({"pointer": pointer, "position": shared::position_of(document, pointer)});
    }
    value
}

/// JUnit XML: one `testsuite` per test file, one `testcase` per case
/// (`classname` is the case kind), a `failure` per failing case; a file that
/// could not run is one `testcase` with an `error`.
pub fn junit(runs: &[SuiteRun]) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let mut suites = String::new();
    let (mut total, mut failures, mut errors) = (0, 0, 0);
    for run in runs {
        let file = escape(&run.origin);
        match &run.outcome {
            SuiteOutcome::Ran { results, .. } => {
                let failed = results.iter().filter(|result| !result.passed()).count();
                total += results.len();
                failures += failed;
                let _ = writeln!(
                    suites,
                    "  <testsuite name=\"{file}\" tests=\"{}\" failures=\"{failed}\" errors=\"0\">",
                    results.len()
                );
                for result in results {
                    let _ = write!(
                        suites,
                        "    <testcase name=\"{}\" classname=\"{}\" file=\"{file}\"",
                        escape(&result.name),
                        result.kind.as_str()
                    );
                    if let Some(position) = result.position {
                        let _ = write!(suites, " line=\"{}\"", position.line);
                    }
                    if result.passed() {
                        suites.push_str("/>\n");
                        continue;
                    }
                    let text: Vec<String> = result
                        .mismatches
                        .iter()
                        .map(|mismatch| {
                            format!(
                                "{}: expected {}, got {}",
                                mismatch.field, mismatch.expected, mismatch.actual
                            )
                        })
                        .collect();
                    let _ = writeln!(
                        suites,
                        ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                        escape(text.first().map_or("", String::as_str)),
                        escape(&text.join("\n"))
                    );
                }
                suites.push_str("  </testsuite>\n");
            }
            other => {
                let message = match other {
                    SuiteOutcome::Unusable(problems) => problems
                        .iter()
                        .map(|problem| {
                            format!(
                                "{}: {}",
                                render::location(&run.origin, problem.position),
                                problem.message
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                    SuiteOutcome::Unreadable(message) => message.clone(),
                    SuiteOutcome::PolicyRefused(loaded) => {
                        format!("the policy `{}` does not compile", loaded.source.origin)
                    }
                    SuiteOutcome::Ran { .. } => String::new(),
                };
                total += 1;
                errors += 1;
                let first = message.lines().next().unwrap_or_default();
                let _ = writeln!(
                    suites,
                    "  <testsuite name=\"{file}\" tests=\"1\" failures=\"0\" errors=\"1\">\n    \
                     <testcase name=\"load\" classname=\"suite\" file=\"{file}\">\n      \
                     <error message=\"{}\">{}</error>\n    </testcase>\n  </testsuite>",
                    escape(first),
                    escape(&message)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "<testsuites name=\"capgate test\" tests=\"{total}\" failures=\"{failures}\" errors=\"{errors}\">"
    );
    out.push_str(&suites);
    out.push_str("</testsuites>\n");
    out
}

/// Text for an XML attribute or element: the five special characters
/// escaped, and characters XML 1.0 cannot carry at all dropped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(' '),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn xml_text_is_escaped_and_unrepresentable_characters_dropped() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
        );
        assert_eq!(escape("x\u{0}y\u{1b}z"), "xyz");
        assert_eq!(escape("two\nlines"), "two&#10;lines");
    }
}
