//! `limits.calls` beyond what a 64-bit counter holds (docs/decisions/0004):
//! such a ceiling is refused with a `schema_violation` at its `calls`, never
//! saturated into a different number. A saturated ceiling would decide and
//! diff as `2^64 − 1`, so two artifacts that say different things would
//! compare as equal.
//!
//! `check(calls, expected)`: the artifact below with `calls` written as given,
//! and what compiling it yields — `calls=N` for the compiled ceiling, or the
//! diagnostics as `code path line:column`.

use capgate_core::access::{effective_diff, Side};
use capgate_core::policy::{compile, CompiledPolicy};

fn artifact(calls: &str) -> String {
    format!(
        "version: 1
capabilities:
  - id: docs.page.search
upstreams:
  - id: knowledge
    transport: {{ kind: mcp-http, url: https://knowledge.example.net/mcp }}
    tools:
      - name: search_pages
        capability: docs.page.search
accounts:
  - id: docs-reader
    secret: {{ ref: \"env://DOCS_READER_TOKEN\" }}
principals:
  issuers:
    - id: staff
      kind: static-key
grants:
  - to: {{ issuer: staff }}
    capabilities: [docs.page.search]
    using: docs-reader
    limits: {{ calls: {calls}, per: 1h }}
"
    )
}

fn compiled(calls: &str) -> String {
    let result = compile(artifact(calls).as_bytes(), None);
    match &result.policy {
        Some(policy) => {
            let limits = policy.ruleset.grants()[0].limits.as_ref().expect("a ceiling");
            format!("calls={}", limits.calls)
        }
        None => result
            .diagnostics
            .iter()
            .map(|d| {
                let at = d
                    .position
                    .map_or_else(|| "-:-".to_owned(), |p| format!("{}:{}", p.line, p.column));
                format!("{} {} {at}", d.code.as_str(), d.path)
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn check(calls: &str, expected: &str) {
    assert_eq!(compiled(calls), expected, "calls: {calls}");
}

const BEYOND: &str = "schema_violation /grants/0/limits/calls 21:22";

#[test]
fn ceilings_a_counter_holds_compile_as_written() {
    check("0", "calls=0");
    check("18446744073709551615", "calls=18446744073709551615");
    check("0xffffffffffffffff", "calls=18446744073709551615");
    check("1e19", "calls=10000000000000000000");
}

#[test]
fn ceilings_beyond_a_counter_are_refused_not_saturated() {
    check("18446744073709551616", BEYOND);
    check("0x10000000000000000", BEYOND);
    check("99999999999999999999", BEYOND);
    check("1e20", BEYOND);
    check("18446744073709551616.0", BEYOND);
    // Beyond what i128 holds, read as a double.
    check("1000000000000000000000000000000000000000000", BEYOND);
}

/// The effective diff between `2^64 − 1` and `2^64` must not say "no change":
/// the second side does not compile, so there is nothing equal to report.
#[test]
fn the_largest_ceiling_and_the_next_never_diff_as_equal() {
    let policy = |calls: &str| -> Option<CompiledPolicy> { compile(artifact(calls).as_bytes(), None).policy };
    let before = policy("18446744073709551615").expect("the largest ceiling compiles");
    let same = policy("0xffffffffffffffff").expect("another spelling of it");
    let side = |p: &CompiledPolicy| (p.issuer_ids(), p.ruleset.clone());
    let (before_issuers, before_rules) = side(&before);
    let (same_issuers, same_rules) = side(&same);
    assert!(effective_diff(
        Side {
            ruleset: &before_rules,
            issuers: &before_issuers
        },
        Side {
            ruleset: &same_rules,
            issuers: &same_issuers
        },
    )
    .is_empty());
    assert!(
        policy("18446744073709551616").is_none(),
        "2^64 calls would compare as 2^64 − 1"
    );
}
