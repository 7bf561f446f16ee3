//! Decides a stream of requests once, for `valgrind --tool=callgrind`:
//! instruction counts do not depend on what else the machine is doing, so they
//! compare two versions of the code where timings on a shared machine cannot.
//!
//! Arguments (after cargo's own `--bench`): grants (1000 or 10000), what to
//! run (`indexed`, `linear` or `listing`) and how many requests (or listings).
//! Only `decide_stream` and `list_stream` are worth counting; collect them
//! alone with `--toggle-collect='*decide_stream*'` (or `*list_stream*`) and
//! divide the total by the count. docs/benchmarks.md has the command.

// The fixed-policy generator in `support` serves the criterion benchmark only.
#[allow(dead_code)]
mod support;

use std::hint::black_box;

use capgate_core::access::{evaluate, evaluate_linear, visible, Decision, Instant, Ruleset, Usage};
use capgate_core::principals::Principal;

use support::stream::{self, Stream};

type Evaluator = for<'a> fn(&'a Ruleset, &Principal, &'a str, Instant, Usage) -> Decision<'a>;

/// Decides the first `count` requests of the stream (cycling), returning how many were allowed.
#[inline(never)]
fn decide_stream(stream: &Stream, count: usize, evaluator: Evaluator) -> usize {
    (0..count)
        .filter(|&n| {
            let (principal, capability) = stream.request(n % stream.requests.len());
            evaluator(
                &stream.ruleset,
                black_box(principal),
                black_box(capability),
                0,
                Usage::NotConsulted,
            )
            .is_allow()
        })
        .count()
}

/// Lists the capabilities of `count` principals in turn, returning how many were shown in all.
#[inline(never)]
fn list_stream(stream: &Stream, count: usize) -> usize {
    (0..count)
        .map(|n| {
            visible(
                &stream.ruleset,
                black_box(&stream.principals[n % stream.principals.len()]),
                0,
            )
            .len()
        })
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let number = |at: usize, default: usize| {
        args.get(at).map_or(default, |a| {
            a.parse().unwrap_or_else(|_| panic!("`{a}` is not a count"))
        })
    };
    let grants = number(0, 10_000);
    let what = args.get(1).map_or("indexed", String::as_str);
    let count = number(2, 10_000);
    let stream = stream::build(grants, stream::PRINCIPALS, 8_192, support::SEED);
    let result = match what {
        "indexed" => decide_stream(&stream, count, evaluate),
        "linear" => decide_stream(&stream, count, evaluate_linear),
        "listing" => list_stream(&stream, count),
        other => panic!("`{other}` is not one of `indexed`, `linear`, `listing`"),
    };
    println!("{what} at {grants} grants: {count} runs, result {result}");
}
