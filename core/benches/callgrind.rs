//! Decides a stream of requests once, for `valgrind --tool=callgrind`:
//! instruction counts do not depend on what else the machine is doing, so they
//! compare two versions of the code where timings on a shared machine cannot.
//!
//! Arguments (after cargo's own `--bench`): grants (1000 or 10000), what to
//! run (`indexed`, `linear`, `prepared`, `prepare`, `listing`, `compile`, or for
//! conditions `call`, `call-conditional` and `compile-conditional`) and how many requests
//! (or preparations, listings, compiles). `call` decides the stream with arguments through
//! `evaluate_call` on the plain policy, `call-conditional` the same on the policy whose every
//! grant carries conditions (count `*decide_call_stream*`). `prepared`
//! decides each request for its principal prepared beforehand (once per
//! token), `prepare` prepares the requests' principals and nothing else. Only
//! `decide_stream`, `decide_prepared_stream`, `prepare_stream`, `list_stream`
//! and `compile_stream` are worth counting; collect one alone with
//! `--toggle-collect='*decide_stream*'` (or `*decide_prepared_stream*`, …)
//! and divide the total by the count. docs/benchmarks.md has the command.

// The fixed-policy generator in `support` serves the criterion benchmark only.
#[allow(dead_code)]
mod support;

use std::hint::black_box;

use capgate_core::access::{
    evaluate, evaluate_call, evaluate_linear, evaluate_prepared, visible, Decision, Instant, Prepared,
    Ruleset, Usage,
};
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

/// Decides the first `count` requests of the stream (cycling) with `arguments`, through
/// `evaluate_call`, returning how many were allowed: the conditional stream's decisions.
#[inline(never)]
fn decide_call_stream(
    stream: &Stream,
    count: usize,
    arguments: &serde_json::Map<String, serde_json::Value>,
) -> usize {
    (0..count)
        .filter(|&n| {
            let (principal, capability) = stream.request(n % stream.requests.len());
            evaluate_call(
                &stream.ruleset,
                black_box(principal),
                black_box(capability),
                0,
                Usage::NotConsulted,
                Some(black_box(arguments)),
            )
            .is_allow()
        })
        .count()
}

/// Decides the first `count` requests of the stream (cycling) for their
/// principals prepared beforehand (`prepared[n]` is principal `n`'s),
/// returning how many were allowed.
#[inline(never)]
fn decide_prepared_stream(stream: &Stream, prepared: &[Prepared<'_>], count: usize) -> usize {
    (0..count)
        .filter(|&n| {
            let request = &stream.requests[n % stream.requests.len()];
            evaluate_prepared(
                black_box(&prepared[request.principal]),
                black_box(&request.capability),
                0,
                Usage::NotConsulted,
            )
            .is_allow()
        })
        .count()
}

/// Prepares the principals of the first `count` requests (cycling), returning
/// how many were prepared.
#[inline(never)]
fn prepare_stream(stream: &Stream, count: usize) -> usize {
    (0..count)
        .map(|n| {
            let (principal, _) = stream.request(n % stream.requests.len());
            black_box(stream.ruleset.prepare(black_box(principal)));
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

/// Compiles the stream's artifact `count` times, returning the grants of the last ruleset.
#[inline(never)]
fn compile_stream(text: &str, count: usize) -> usize {
    let mut grants = 0;
    for _ in 0..count {
        let compilation = capgate_core::policy::compile(black_box(text.as_bytes()), None);
        grants = compilation
            .policy
            .map_or(0, |policy| policy.ruleset.grants().len());
    }
    grants
}

// The core's clippy.toml bans reading the environment so that the library stays pure; a bench
// binary's command line is its only input, and the library never sees it.
#[allow(clippy::disallowed_methods)]
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
    if what == "compile" || what == "compile-conditional" {
        let text = if what == "compile" {
            stream::policy(grants, support::SEED).text
        } else {
            stream::conditional_policy(grants, support::SEED).text
        };
        let result = compile_stream(&text, count);
        println!("{what} at {grants} grants: {count} runs, result {result}");
        return;
    }
    if what == "call" || what == "call-conditional" {
        // The same requests with the same arguments, over the policy without conditions
        // (`call`) and with them (`call-conditional`): the difference is what conditions cost.
        let stream = if what == "call" {
            stream::build(grants, stream::PRINCIPALS, 8_192, support::SEED)
        } else {
            stream::build_conditional(grants, stream::PRINCIPALS, 8_192, support::SEED)
        };
        let arguments = serde_json::from_str(stream::CONDITIONAL_ARGUMENTS).expect("an object");
        let result = decide_call_stream(&stream, count, &arguments);
        println!("{what} at {grants} grants: {count} runs, result {result}");
        return;
    }
    let stream = stream::build(grants, stream::PRINCIPALS, 8_192, support::SEED);
    let result = match what {
        "indexed" => decide_stream(&stream, count, evaluate),
        "linear" => decide_stream(&stream, count, evaluate_linear),
        "prepared" => {
            let prepared: Vec<Prepared<'_>> = stream
                .principals
                .iter()
                .map(|principal| stream.ruleset.prepare(principal))
                .collect();
            decide_prepared_stream(&stream, &prepared, count)
        }
        "prepare" => prepare_stream(&stream, count),
        "listing" => {
            // One listing first, outside the count: the first large
            // allocation makes the allocator consolidate what building the
            // stream freed (19 M instructions at 10k grants, 2 M at 1k), a
            // one-off that would otherwise be charged to the listings.
            black_box(visible(&stream.ruleset, &stream.principals[0], 0));
            list_stream(&stream, count)
        }
        other => {
            panic!(
                "`{other}` is not one of `indexed`, `linear`, `prepared`, `prepare`, `listing`, `compile`, \
                 `compile-conditional`, `call`, `call-conditional`"
            )
        }
    };
    println!("{what} at {grants} grants: {count} runs, result {result}");
}
