//! Benchmarks of the decision path and the compiler on generated policies
//! (see `benches/support`): one decision (indexed and, as the baseline, the
//! linear scan), a listing, and compiling end to end with its parse and
//! schema stages on their own; then the same questions on a stream of
//! requests from thousands of rotating principals over overlapping grants
//! (`benches/support/stream.rs`), where neither the principal nor its
//! candidate grants are hot in cache. `docs/benchmarks.md` has the figures
//! and how to reproduce them.

mod support;

use std::hint::black_box;

use capgate_core::access::{
    evaluate, evaluate_call, evaluate_linear, evaluate_prepared, visible, Decision, Prepared, ReasonCode,
    Ruleset, Usage,
};
use capgate_core::policy::{compile, schema, Document, Severity};
use capgate_core::principals::Principal;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};

use support::stream::{self, Stream};
use support::Generated;

/// Grant counts the decision and listing benchmarks run at.
const SIZES: [usize; 2] = [1_000, 10_000];
/// An arbitrary fixed instant (ms since the epoch); only ceilings read it.
const AT: i64 = 1_760_000_000_000;
/// A counter read with one call so far in a window that just opened.
const USAGE: Usage = Usage::Counted {
    calls: 1,
    window_start: AT,
};

/// A compiled generated policy and the inputs its benchmarks use.
struct Fixture {
    grants: usize,
    ruleset: Ruleset,
    principal: Principal,
    /// A capability `principal` is granted (the decision allows).
    allowed: String,
    /// A capability no grant gives `principal`, chosen among those with the
    /// most grants of its issuer, so that both paths do the most work.
    denied: String,
}

fn fixture(grants: usize) -> Fixture {
    let generated = support::generate(grants);
    let compilation = compile(generated.text.as_bytes(), None);
    let errors: Vec<_> = compilation
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| format!("{} {}", d.code.as_str(), d.path))
        .collect();
    assert!(errors.is_empty(), "the generated policy must compile: {errors:?}");
    let ruleset = compilation.policy.expect("no errors, so a policy").ruleset;

    let (principal, allowed) = allowed_case(&generated, &ruleset);
    let denied = denied_case(&ruleset, &principal);
    let candidates = |capability: &str| {
        ruleset
            .grants()
            .iter()
            .filter(|g| g.issuer == principal.issuer && g.names(capability))
            .count()
    };
    eprintln!(
        "fixture {grants}: {} bytes, {} diagnostics; principal {} {:?}; allow `{allowed}` ({} grants of the issuer name it), deny `{denied}` ({})",
        generated.text.len(),
        compilation.diagnostics.len(),
        principal.id,
        principal.attributes,
        candidates(&allowed),
        candidates(&denied),
    );
    Fixture {
        grants,
        ruleset,
        principal,
        allowed,
        denied,
    }
}

/// From the middle grant onwards, the first whose principal is allowed its
/// first capability (skipping disabled accounts and suspended ceilings).
fn allowed_case(generated: &Generated, ruleset: &Ruleset) -> (Principal, String) {
    let middle = generated.grants.len() / 2;
    for (index, grant) in generated.grants.iter().enumerate().skip(middle) {
        let issuer = &generated.issuers[grant.issuer].id;
        let attributes = support::principal_attributes(&generated.issuers, grant, index);
        let principal = Principal::new(issuer, &format!("user-{index}"), attributes);
        let capability = &grant.capabilities[0];
        let decision = evaluate_linear(ruleset, &principal, capability, AT, USAGE);
        if decision.is_allow() {
            assert_eq!(decision, evaluate(ruleset, &principal, capability, AT, USAGE));
            return (principal, capability.clone());
        }
    }
    panic!("no allowed case in the generated policy");
}

fn denied_case(ruleset: &Ruleset, principal: &Principal) -> String {
    let mut best: Option<(usize, &str)> = None;
    for capability in ruleset.capabilities() {
        let decision = evaluate_linear(ruleset, principal, &capability.id, AT, USAGE);
        if decision.reason().code != ReasonCode::NoGrantMatches {
            continue;
        }
        assert_eq!(decision, evaluate(ruleset, principal, &capability.id, AT, USAGE));
        let candidates = ruleset
            .grants()
            .iter()
            .filter(|g| g.issuer == principal.issuer && g.names(&capability.id))
            .count();
        if best.is_none_or(|(most, _)| candidates > most) {
            best = Some((candidates, &capability.id));
        }
    }
    best.expect("some capability is denied").1.to_owned()
}

/// The listing through the linear scan: `visible`'s baseline.
fn visible_linear<'a>(ruleset: &'a Ruleset, principal: &Principal) -> Vec<&'a str> {
    ruleset
        .capabilities()
        .iter()
        .filter(|c| {
            matches!(
                evaluate_linear(ruleset, principal, &c.id, AT, Usage::NotConsulted),
                Decision::Allow(_)
            )
        })
        .map(|c| c.id.as_str())
        .collect()
}

fn decisions_and_listings(c: &mut Criterion) {
    let fixtures: Vec<Fixture> = SIZES.iter().map(|&n| fixture(n)).collect();

    for f in &fixtures {
        let mut group = c.benchmark_group(format!("decision/{}", f.grants));
        let cases = [("allow", f.allowed.as_str()), ("deny", f.denied.as_str())];
        for (case, capability) in cases {
            group.bench_function(BenchmarkId::new("indexed", case), |b| {
                b.iter(|| {
                    evaluate(
                        &f.ruleset,
                        black_box(&f.principal),
                        black_box(capability),
                        AT,
                        USAGE,
                    )
                })
            });
            group.bench_function(BenchmarkId::new("linear", case), |b| {
                b.iter(|| {
                    evaluate_linear(
                        &f.ruleset,
                        black_box(&f.principal),
                        black_box(capability),
                        AT,
                        USAGE,
                    )
                })
            });
        }
        group.finish();
    }

    for f in &fixtures {
        let visible_ids: Vec<&str> = visible(&f.ruleset, &f.principal, AT)
            .iter()
            .map(|v| v.capability.id.as_str())
            .collect();
        assert_eq!(visible_ids, visible_linear(&f.ruleset, &f.principal));
        eprintln!("listing {}: {} capabilities visible", f.grants, visible_ids.len());
        let mut group = c.benchmark_group(format!("listing/{}", f.grants));
        group.bench_function("indexed", |b| {
            b.iter(|| visible(&f.ruleset, black_box(&f.principal), AT))
        });
        group.bench_function("linear", |b| {
            b.iter(|| visible_linear(&f.ruleset, black_box(&f.principal)))
        });
        group.finish();
    }
}

fn compiling(c: &mut Criterion) {
    for grants in SIZES {
        let text = support::generate(grants).text;
        let mut group = c.benchmark_group(format!("compile/{grants}"));
        // A 10k-grant compile takes a good fraction of a second on a busy
        // machine: ten samples are criterion's minimum and enough here.
        group.sample_size(10);
        group.bench_function("end_to_end", |b| {
            b.iter(|| compile(black_box(text.as_bytes()), None))
        });
        group.bench_function("parse", |b| {
            b.iter(|| Document::parse(black_box(&text)).map(|d| d.root().is_some()))
        });
        let document = Document::parse(&text).expect("generated YAML parses");
        group.bench_function("schema", |b| b.iter(|| schema::validate(black_box(&document))));
        group.finish();
    }
}

/// Requests in a benchmarked stream: four per principal on average, so that
/// consecutive decisions rarely share a principal or candidate grants.
const STREAM: usize = 8_192;

/// Builds the stream at `grants` and checks, before measuring anything, that
/// the index, a prepared principal and the scan decide every request alike.
fn stream_fixture(grants: usize) -> Stream {
    let stream = stream::build(grants, stream::PRINCIPALS, STREAM, support::SEED);
    let mut allowed = 0;
    let mut codes: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let prepared = prepare_all(&stream);
    for n in 0..stream.requests.len() {
        let (principal, capability) = stream.request(n);
        let fast = evaluate(&stream.ruleset, principal, capability, AT, Usage::NotConsulted);
        let slow = evaluate_linear(&stream.ruleset, principal, capability, AT, Usage::NotConsulted);
        assert_eq!(fast, slow, "{principal:?} `{capability}`");
        let ready = &prepared[stream.requests[n].principal];
        let once = evaluate_prepared(ready, capability, AT, Usage::NotConsulted);
        assert_eq!(once, fast, "prepared: {principal:?} `{capability}`");
        allowed += usize::from(fast.is_allow());
        *codes.entry(fast.reason().code.as_str()).or_default() += 1;
    }
    let (per_pair, per_request) = stream.candidates();
    eprintln!(
        "stream {grants}: {} bytes, {} principals, {} requests, {:.1} % allowed {codes:?}; \
         {per_pair:.1} candidates per (issuer, capability), {per_request:.1} per request",
        stream.bytes,
        stream.principals.len(),
        stream.requests.len(),
        100.0 * allowed as f64 / stream.requests.len() as f64,
    );
    stream
}

/// Every principal of the stream prepared, as a service would once per token
/// (or per request): `[n]` is `principals[n]`'s.
fn prepare_all(stream: &Stream) -> Vec<Prepared<'_>> {
    stream
        .principals
        .iter()
        .map(|principal| stream.ruleset.prepare(principal))
        .collect()
}

fn streams(c: &mut Criterion) {
    let fixtures: Vec<Stream> = SIZES.iter().map(|&n| stream_fixture(n)).collect();

    for f in &fixtures {
        let prepared = prepare_all(f);
        let mut group = c.benchmark_group(format!("stream/{}", f.grants));
        // One iteration is one decision: the next request of the stream, so
        // the figure is per decision and every request is visited in turn.
        let mut next = 0;
        group.bench_function("indexed", |b| {
            b.iter(|| {
                let (principal, capability) = f.request(next);
                next = (next + 1) % f.requests.len();
                evaluate(
                    &f.ruleset,
                    black_box(principal),
                    black_box(capability),
                    AT,
                    Usage::NotConsulted,
                )
                .is_allow()
            })
        });
        group.bench_function("linear", |b| {
            b.iter(|| {
                let (principal, capability) = f.request(next);
                next = (next + 1) % f.requests.len();
                evaluate_linear(
                    &f.ruleset,
                    black_box(principal),
                    black_box(capability),
                    AT,
                    Usage::NotConsulted,
                )
                .is_allow()
            })
        });
        // Per token: the request's principal was prepared beforehand (as a
        // service would when it verified the token), so a decision is the
        // capability look-up and steps 3–8; `prepare` is what preparing costs.
        group.bench_function("prepared", |b| {
            b.iter(|| {
                let request = &f.requests[next];
                next = (next + 1) % f.requests.len();
                evaluate_prepared(
                    black_box(&prepared[request.principal]),
                    black_box(&request.capability),
                    AT,
                    Usage::NotConsulted,
                )
                .is_allow()
            })
        });
        group.bench_function("prepare", |b| {
            b.iter(|| {
                let request = &f.requests[next];
                next = (next + 1) % f.requests.len();
                f.ruleset.prepare(black_box(&f.principals[request.principal]))
            })
        });
        group.finish();
    }

    for f in &fixtures {
        let mut group = c.benchmark_group(format!("stream_listing/{}", f.grants));
        // The linear listing at 10k grants takes milliseconds an iteration.
        group.sample_size(20);
        let mut next = 0;
        group.bench_function("indexed", |b| {
            b.iter(|| {
                let principal = &f.principals[next];
                next = (next + 1) % f.principals.len();
                visible(&f.ruleset, black_box(principal), AT).len()
            })
        });
        group.bench_function("linear", |b| {
            b.iter(|| {
                let principal = &f.principals[next];
                next = (next + 1) % f.principals.len();
                visible_linear(&f.ruleset, black_box(principal)).len()
            })
        });
        group.finish();
    }

    // The compile of the 10k artifact against its 250 ms target, and its
    // stages: the parse, the schema, and building the ruleset (the index) from
    // the compiled grants, which is what the decision path's speed costs.
    let text = stream::policy(10_000, support::SEED).text;
    let ruleset = &fixtures[fixtures.len() - 1].ruleset;
    let mut group = c.benchmark_group("stream_compile/10000");
    group.sample_size(10);
    group.bench_function("end_to_end", |b| {
        b.iter(|| compile(black_box(text.as_bytes()), None))
    });
    group.bench_function("parse", |b| {
        b.iter(|| Document::parse(black_box(&text)).map(|d| d.root().is_some()))
    });
    let document = Document::parse(&text).expect("generated YAML parses");
    group.bench_function("schema", |b| b.iter(|| schema::validate(black_box(&document))));
    group.bench_function("ruleset", |b| {
        b.iter_batched(
            || (ruleset.capabilities().to_vec(), ruleset.grants().to_vec()),
            |(capabilities, grants)| Ruleset::new(capabilities, grants),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// Conditions (docs/decisions/0034): the same 1 000-grant stream decided with the same
/// arguments through `evaluate_call`, over the plain policy and over the one whose every grant
/// carries an amount ceiling, a currency list and (one in four) a weekday window; and the
/// compile of the conditional 10 000-grant artifact against its 500 ms target.
fn conditions(c: &mut Criterion) {
    let arguments: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(stream::CONDITIONAL_ARGUMENTS).expect("an object");
    let plain = stream::build(1_000, stream::PRINCIPALS, STREAM, support::SEED);
    let conditional = stream::build_conditional(1_000, stream::PRINCIPALS, STREAM, support::SEED);
    // The arguments meet every condition, so both decide every request alike (the pointers
    // are the same grants'): what differs is only the conditions' cost.
    for n in 0..plain.requests.len() {
        let (principal, capability) = plain.request(n);
        let a = evaluate_call(
            &plain.ruleset,
            principal,
            capability,
            AT,
            Usage::NotConsulted,
            Some(&arguments),
        );
        let b = evaluate_call(
            &conditional.ruleset,
            principal,
            capability,
            AT,
            Usage::NotConsulted,
            Some(&arguments),
        );
        assert_eq!(a.outcome(), b.outcome(), "{principal:?} `{capability}`");
        assert_eq!(a.reason().path, b.reason().path, "{principal:?} `{capability}`");
    }
    let mut group = c.benchmark_group("conditions/1000");
    for (name, stream) in [("unconditional", &plain), ("conditional", &conditional)] {
        let mut next = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let (principal, capability) = stream.request(next % stream.requests.len());
                next += 1;
                evaluate_call(
                    &stream.ruleset,
                    black_box(principal),
                    black_box(capability),
                    AT,
                    Usage::NotConsulted,
                    Some(black_box(&arguments)),
                )
                .is_allow()
            })
        });
    }
    group.finish();

    // Side by side with the same grants without conditions, the baseline of the same run.
    let mut group = c.benchmark_group("conditions_compile/10000");
    group.sample_size(10);
    for (name, text) in [
        ("unconditional", stream::policy(10_000, support::SEED).text),
        (
            "conditional",
            stream::conditional_policy(10_000, support::SEED).text,
        ),
    ] {
        group.bench_function(name, |b| b.iter(|| compile(black_box(text.as_bytes()), None)));
    }
    group.finish();
}

criterion_group!(benches, decisions_and_listings, compiling, streams, conditions);
criterion_main!(benches);
