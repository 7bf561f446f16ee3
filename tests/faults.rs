//! Load and faults together, the way a deployment meets them: three `capgate serve` replicas on a
//! PostgreSQL server of the test's own (tests/support/cluster.rs), each with an audit spool,
//! under steady load from concurrent callers with a share of hostile requests mixed in. During
//! the run the database is stopped and started again, and one replica is killed with SIGKILL and
//! started again on the same spool. Afterwards it checks the promises (docs/service.md):
//!
//! * **nothing lost**: every decision that was answered has its audit record in `audit_log`
//!   once the store is back and the spools are replayed;
//! * **ceilings exact**: no principal is allowed more calls than its ceiling, in the answers, in
//!   the records or in the counters;
//! * **hostile input harms no one**: every hostile request is `INVALID_ARGUMENT`, never a
//!   decision.
//!
//! It prints what it saw (requests sent, answered, errors by code, allows against the ceiling,
//! answered ids against audit rows). Run it alone, for longer, with
//!
//! ```sh
//! CAPGATE_FAULTS_SECONDS=120 cargo test --test faults -- --nocapture
//! ```
//!
//! Needs PostgreSQL's server binaries (skipped without them, unless `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use capgate::store::{AuditFilter, CounterKey, PostgresStore, Store, StoreOptions};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{Attribute, DecideRequest, DecideResponse, Outcome, ReasonCode};
use tonic::Code;

use support::client::{
    code, decision, example_with_ceiling, for_capability, principal, publish, wait_serving, CATALOG,
};
use support::cluster::Cluster;
use support::process::Serve;

/// Calls per hour for each capped principal.
const CEILING: u64 = 150;
/// Capped principals (each its own counter): `staff:ana-0` … in support.
const PRINCIPALS: usize = 4;
/// Concurrent callers.
const WORKERS: usize = 12;
/// Each caller's pause between requests: the load is steady, not a flood.
const PAUSE: Duration = Duration::from_millis(8);
/// How long the load runs unless `CAPGATE_FAULTS_SECONDS` says otherwise.
const DEFAULT_SECONDS: u64 = 30;
/// How long the spools may take to reach the store once everything is back.
const DRAIN_WITHIN: Duration = Duration::from_secs(60);

/// What a request was meant to test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Capped,
    Uncapped,
    /// A NUL byte in the subject: the store cannot hold it.
    Nul,
    /// A tool name over its bound.
    Oversized,
    /// More attributes than allowed.
    Crowded,
}

impl Kind {
    fn hostile(self) -> bool {
        matches!(self, Kind::Nul | Kind::Oversized | Kind::Crowded)
    }

    /// One request in twenty of each hostile kind; most calls count against a ceiling.
    fn of(sequence: usize) -> Kind {
        match sequence % 20 {
            17 => Kind::Nul,
            18 => Kind::Oversized,
            19 => Kind::Crowded,
            14..=16 => Kind::Uncapped,
            _ => Kind::Capped,
        }
    }
}

fn request(kind: Kind, worker: usize, sequence: usize) -> DecideRequest {
    let ana = |index: usize| principal("staff", &format!("ana-{index}"), &[("dept", &["support"])]);
    let mut request = match kind {
        Kind::Capped => for_capability(ana((worker + sequence) % PRINCIPALS), "tickets.issue.read"),
        Kind::Uncapped => for_capability(principal("staff", "dee", &[]), "docs.page.search"),
        Kind::Nul => for_capability(
            principal("staff", "ana-0\u{0}evil", &[("dept", &["support"])]),
            "tickets.issue.read",
        ),
        Kind::Oversized => for_capability(ana(0), &"x".repeat(600)),
        Kind::Crowded => {
            let mut crowded = ana(0);
            crowded.attributes = (0..65)
                .map(|index| Attribute {
                    name: format!("a{index}"),
                    values: vec!["v".to_owned()],
                })
                .collect();
            for_capability(crowded, "tickets.issue.read")
        }
    };
    // Every third request carries an idempotency key, so that claims and remembered answers are
    // under the same faults.
    if sequence % 3 == 0 {
        request.request_id = format!("w{worker}-{sequence}");
    }
    request
}

/// What the callers saw.
#[derive(Default)]
struct Seen {
    sent: BTreeMap<Kind, u64>,
    /// Answered decisions: id → (kind, principal subject, outcome, code).
    answered: HashMap<String, (Kind, String, Outcome, ReasonCode)>,
    /// Errors by kind and gRPC code.
    errors: BTreeMap<(Kind, String), u64>,
    /// Hostile requests that got a decision instead of `INVALID_ARGUMENT`.
    hostile_answered: Vec<String>,
}

/// Notes what a caller got.
fn record(
    seen: &Mutex<Seen>,
    kind: Kind,
    subject: String,
    answered: Result<tonic::Response<DecideResponse>, tonic::Status>,
) {
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    *seen.sent.entry(kind).or_default() += 1;
    match answered {
        Ok(response) => {
            let response = response.into_inner();
            if kind.hostile() {
                seen.hostile_answered.push(format!("{kind:?}: {response:?}"));
            } else {
                let outcome = decision(&response).outcome();
                let answer = (kind, subject, outcome, code(&response));
                seen.answered.insert(response.decision_id.clone(), answer);
            }
        }
        Err(status) => {
            // A replica that is down is never reached: the channel says so, not the server.
            let unreached = std::error::Error::source(&status)
                .is_some_and(|source| source.downcast_ref::<tonic::transport::Error>().is_some());
            let name = if unreached {
                "unreached".to_owned()
            } else {
                format!("{:?}", status.code())
            };
            *seen.errors.entry((kind, name)).or_default() += 1;
            if kind.hostile() && !unreached && status.code() != Code::InvalidArgument {
                seen.hostile_answered.push(format!("{kind:?}: {status:?}"));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_answered_is_lost_and_no_ceiling_is_exceeded_through_faults() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let seconds = std::env::var("CAPGATE_FAULTS_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_SECONDS);
    let run_for = Duration::from_secs(seconds);
    let url = cluster.url();
    let spools: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("a spool")).collect();
    let args = |spool: &PathBuf| -> Vec<String> {
        [
            "--database-url",
            url.as_str(),
            "--audit-spool",
            spool.to_str().expect("utf-8 path"),
            "--poll-interval",
            "500ms",
            "--audit-timeout",
            "500ms",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let start = |spool: PathBuf| {
        let args = args(&spool);
        async move { Serve::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let mut replicas = vec![
        start(spools[0].path().to_owned()).await,
        start(spools[1].path().to_owned()).await,
        start(spools[2].path().to_owned()).await,
    ];
    let mut channels = Vec::new();
    for replica in &replicas {
        channels.push(replica.channel().await);
    }
    let published = publish(&channels[0], &example_with_ceiling(CEILING), Some(CATALOG))
        .await
        .expect("publish");
    assert!(published.accepted, "{:?}", published.diagnostics);
    for channel in &channels {
        wait_serving(channel, Duration::from_secs(5)).await;
    }
    let channels = Arc::new(RwLock::new(channels));
    let seen = Arc::new(Mutex::new(Seen::default()));

    // ── Load ─────────────────────────────────────────────────────────────
    let began = Instant::now();
    let callers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let channels = channels.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut sequence = 0;
                while began.elapsed() < run_for {
                    let kind = Kind::of(sequence);
                    let request = request(kind, worker, sequence);
                    let subject = match &request.caller {
                        Some(capgate::wire::proto::decide_request::Caller::Principal(who)) => {
                            who.subject.clone()
                        }
                        _ => String::new(),
                    };
                    let channel = {
                        let channels = channels.read().unwrap_or_else(|e| e.into_inner());
                        channels[(worker + sequence) % channels.len()].clone()
                    };
                    let answered = DecisionServiceClient::new(channel)
                        .decide(tonic::Request::new(request))
                        .await;
                    record(&seen, kind, subject, answered);
                    sequence += 1;
                    tokio::time::sleep(PAUSE).await;
                }
            })
        })
        .collect();

    // ── Faults, at fixed shares of the run ───────────────────────────────
    let at = |share: f64| began + run_for.mul_f64(share);
    tokio::time::sleep_until(at(0.2).into()).await;
    cluster.stop();
    eprintln!("{:>6.1} s  PostgreSQL stopped", began.elapsed().as_secs_f64());
    tokio::time::sleep_until(at(0.4).into()).await;
    cluster.start_again();
    eprintln!(
        "{:>6.1} s  PostgreSQL started again",
        began.elapsed().as_secs_f64()
    );
    tokio::time::sleep_until(at(0.6).into()).await;
    replicas[2].kill();
    eprintln!(
        "{:>6.1} s  replica 3 killed (SIGKILL)",
        began.elapsed().as_secs_f64()
    );
    tokio::time::sleep_until(at(0.7).into()).await;
    replicas[2] = start(spools[2].path().to_owned()).await;
    let restarted = replicas[2].channel().await;
    channels.write().unwrap_or_else(|e| e.into_inner())[2] = restarted;
    eprintln!(
        "{:>6.1} s  replica 3 started again on its spool",
        began.elapsed().as_secs_f64()
    );
    for caller in callers {
        caller.await.expect("a caller");
    }
    let elapsed = began.elapsed();

    // ── Every answered decision reaches the audit trail ──────────────────
    let store =
        PostgresStore::connect_with(url.parse().expect("the cluster's URL"), &StoreOptions::default())
            .await
            .expect("open the store");
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let drain_began = Instant::now();
    let (records, missing) = loop {
        let records = store
            .query_audit(&AuditFilter {
                limit: 1_000_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail");
        let stored: HashSet<&str> = records.iter().map(|record| record.decision_id.as_str()).collect();
        let missing: Vec<String> = seen
            .answered
            .keys()
            .filter(|id| !stored.contains(id.as_str()))
            .cloned()
            .collect();
        if missing.is_empty() || drain_began.elapsed() > DRAIN_WITHIN {
            break (records, missing);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // ── What happened ────────────────────────────────────────────────────
    let sent: u64 = seen.sent.values().sum();
    let errors: u64 = seen.errors.values().sum();
    let answered_allows = |subject: &str| {
        seen.answered
            .values()
            .filter(|(kind, who, outcome, _)| {
                *kind == Kind::Capped && who == subject && *outcome == Outcome::Allow
            })
            .count() as u64
    };
    let recorded_allows = |subject: &str| {
        records
            .iter()
            .filter(|record| {
                record.kind.as_str() == "decide"
                    && record.outcome.as_str() == "allow"
                    && record.subject.as_deref() == Some(subject)
                    && record.capability.as_deref() == Some("tickets.issue.read")
            })
            .count() as u64
    };
    let usage_unknown = seen
        .answered
        .values()
        .filter(|(_, _, _, code)| *code == ReasonCode::UsageUnknown)
        .count();
    eprintln!(
        "── load and faults: {:.1} s of load, {WORKERS} callers, 3 replicas ──",
        elapsed.as_secs_f64()
    );
    eprintln!("requests sent      {sent}  ({:?})", seen.sent);
    eprintln!(
        "answered           {}  (usage_unknown during the outage: {usage_unknown})",
        seen.answered.len()
    );
    eprintln!("errors             {errors}  {:?}", seen.errors);
    eprintln!(
        "answered ids       {}; in audit_log {} ({} audit rows in all, drained in {:.1} s)",
        seen.answered.len(),
        seen.answered.len() - missing.len(),
        records.len(),
        drain_began.elapsed().as_secs_f64()
    );
    let mut over = Vec::new();
    let mut filled = 0;
    for index in 0..PRINCIPALS {
        let subject = format!("ana-{index}");
        let counter = store
            .read_usage(CounterKey {
                principal_id: &format!("staff:{subject}"),
                capability: "tickets.issue.read",
            })
            .await
            .expect("read a counter")
            .map_or(0, |counter| counter.calls);
        let (answered, recorded) = (answered_allows(&subject), recorded_allows(&subject));
        eprintln!("{subject:<18} allows answered {answered}, recorded {recorded}, counted {counter}; ceiling {CEILING}");
        if answered > CEILING || recorded > CEILING || counter > CEILING {
            over.push(subject);
        }
        filled += usize::from(counter == CEILING);
    }

    // ── The promises ─────────────────────────────────────────────────────
    assert!(
        missing.is_empty(),
        "{} answered decisions never reached audit_log: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(over.is_empty(), "ceilings exceeded for {over:?}");
    assert!(
        seen.hostile_answered.is_empty(),
        "hostile requests not refused as INVALID_ARGUMENT: {:?}",
        &seen.hostile_answered[..seen.hostile_answered.len().min(5)]
    );
    let hostile_refused: u64 = seen
        .errors
        .iter()
        .filter(|((kind, code), _)| kind.hostile() && code == "InvalidArgument")
        .map(|(_, count)| count)
        .sum();
    assert!(hostile_refused > 0, "no hostile request was sent");
    // The faults were felt: otherwise this test proves nothing.
    assert!(usage_unknown > 0, "no capped call met the outage");
    assert!(
        filled > 0,
        "no window was filled: the load is too light to test the ceiling"
    );
    drop(replicas);
}
