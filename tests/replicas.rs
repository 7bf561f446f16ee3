//! Three `capgate serve` processes on one PostgreSQL database, as a
//! deployment behind a load balancer runs them (docs/service.md and §4):
//!
//! * many concurrent `Decide` calls, spread over the replicas, against a
//!   ceiling of L, with the server's default deadlines: exactly L allows,
//!   every other answer `limit_exhausted` (never `usage_unknown`: the store is
//!   healthy, and queueing in the service is not a store failure), and one
//!   audit record per answer saying the same — ten windows in a row;
//! * a version published through one replica is what the others decide on
//!   within moments. The poll interval is a minute, so only `LISTEN/NOTIFY`
//!   can explain that.
//!
//! Needs `DATABASE_URL` (skipped without it, unless
//! `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use capgate::store::{Actor, AuditFilter, AuditRecord, CounterKey, RecordOutcome, Store};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{DecideRequest, DecideResponse, ReasonCode};
use tonic::transport::Channel;

use support::client::{
    capped, code, decision, example_with_ceiling, publish, recorded_code, recorded_outcome, uncapped,
    wait_serving, CATALOG,
};
use support::postgres::TestDatabase;
use support::process::Serve;

/// The ceiling: calls per hour for Ana reading tickets.
const CEILING: u64 = 50;
/// Windows filled in a row, the counter reset between them.
const RUNS: usize = 10;
/// Calls fired at once, round-robin over the replicas.
const CALLS: usize = 300;
/// How long a replica may take to follow a publish made through another.
/// Notifications arrive in milliseconds; the poll would take a minute.
const FOLLOW_WITHIN: Duration = Duration::from_secs(3);

async fn decide(channel: &Channel, request: DecideRequest) -> DecideResponse {
    DecisionServiceClient::new(channel.clone())
        .decide(request)
        .await
        .expect("a decision")
        .into_inner()
}

/// Three replicas started together with `args` (each migrates the same empty database at
/// start-up) and the example with a ceiling of [`CEILING`], published through the first as
/// revision 1 and followed by the others from the store.
async fn three_replicas_with_a_ceiling(args: &[&str]) -> ([Serve; 3], Vec<Channel>) {
    let (first, second, third) = tokio::join!(Serve::start(args), Serve::start(args), Serve::start(args));
    let replicas = [first, second, third];
    let mut channels = Vec::new();
    for replica in &replicas {
        channels.push(replica.channel().await);
    }
    let published = publish(&channels[0], &example_with_ceiling(CEILING), Some(CATALOG))
        .await
        .expect("publish");
    assert!(published.accepted, "{:?}", published.diagnostics);
    assert_eq!(published.revision, 1);
    for channel in &channels {
        wait_serving(channel, FOLLOW_WITHIN).await;
    }
    (replicas, channels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_one_ceiling_and_follow_each_others_publishes() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let url = database.url();
    let args = [
        "--database-url",
        url.as_str(),
        // Only a notification can make a replica switch within seconds.
        "--poll-interval",
        "60s",
    ];
    let (replicas, channels) = three_replicas_with_a_ceiling(&args).await;
    let store = database.store().await;
    let ana = CounterKey {
        principal_id: "staff:ana",
        capability: "tickets.issue.read",
    };
    for run in 0..RUNS {
        exactly_the_ceiling_is_allowed(&channels, &store, run).await;
        if run + 1 == RUNS {
            break;
        }
        let reset = Actor {
            name: "test".to_owned(),
            at_ms: capgate::clock::now(),
        };
        store.reset_usage(ana, &reset).await.expect("reset the counter");
    }

    // ── A publish through one replica reaches the others ──────────────────
    let next = publish(&channels[0], &example_with_ceiling(7), Some(CATALOG))
        .await
        .expect("publish again");
    assert_eq!(next.revision, 2);
    let published_at = Instant::now();
    for (index, channel) in channels.iter().enumerate().skip(1) {
        loop {
            let response = decide(channel, uncapped()).await;
            if response.policy_revision == 2 {
                break;
            }
            assert!(
                published_at.elapsed() < FOLLOW_WITHIN,
                "replica {index} still decides on revision {} after {FOLLOW_WITHIN:?}",
                response.policy_revision
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The new ceiling applies there too: 7 is exceeded by the last window's 50.
    let last = decide(&channels[2], capped()).await;
    assert_eq!(last.policy_revision, 2);
    assert_eq!(code(&last), ReasonCode::LimitExhausted);

    drop(replicas);
}

/// [`CALLS`] calls at once, round-robin over the replicas, into a fresh window: exactly
/// [`CEILING`] allows and every other answer `limit_exhausted`, each recorded as answered.
async fn exactly_the_ceiling_is_allowed<S: Store>(channels: &[Channel], store: &S, run: usize) {
    let tasks: Vec<_> = (0..CALLS)
        .map(|index| {
            let mut client = DecisionServiceClient::new(channels[index % channels.len()].clone());
            tokio::spawn(async move { client.decide(capped()).await.map(tonic::Response::into_inner) })
        })
        .collect();
    let mut responses = Vec::with_capacity(CALLS);
    for (index, task) in tasks.into_iter().enumerate() {
        let response = task
            .await
            .expect("the call's task")
            .unwrap_or_else(|status| panic!("call {index} failed: {status:?}"));
        assert_eq!(response.policy_revision, 1);
        responses.push(response);
    }
    let allowed = responses
        .iter()
        .filter(|response| code(response) == ReasonCode::Granted)
        .count();
    let exhausted = responses
        .iter()
        .filter(|response| code(response) == ReasonCode::LimitExhausted)
        .count();
    assert_eq!(
        (allowed, exhausted),
        (CEILING as usize, CALLS - CEILING as usize),
        "run {run}: every answer is an allow within the ceiling or `limit_exhausted`: {:?}",
        responses
            .iter()
            .map(code)
            .collect::<std::collections::BTreeSet<_>>()
    );
    let mut remaining: Vec<u64> = responses
        .iter()
        .filter_map(|response| decision(response).limits.as_ref().map(|limits| limits.remaining))
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..CEILING).collect::<Vec<_>>());

    // One audit record per answer, saying what the answer said.
    let audit = store
        .query_audit(&AuditFilter {
            limit: 10_000,
            ..AuditFilter::default()
        })
        .await
        .expect("read the audit trail");
    let answered: std::collections::HashSet<&str> = responses
        .iter()
        .map(|response| response.decision_id.as_str())
        .collect();
    let decides: HashMap<&str, _> = audit
        .iter()
        .filter(|record| answered.contains(record.decision_id.as_str()))
        .map(|record| (record.decision_id.as_str(), record))
        .collect();
    assert_eq!(decides.len(), CALLS, "exactly one decide record per call");
    let decide_records = audit
        .iter()
        .filter(|record| record.kind.as_str() == "decide")
        .count();
    assert_eq!(
        decide_records,
        (run + 1) * CALLS,
        "no record of a call not answered"
    );
    for response in &responses {
        let record = decides
            .get(response.decision_id.as_str())
            .unwrap_or_else(|| panic!("no record of {}", response.decision_id));
        assert_eq!(record.outcome.as_str(), recorded_outcome(response));
        assert_eq!(
            record.code.map(|code| code.as_str().to_owned()),
            Some(recorded_code(code(response)))
        );
        assert_eq!(record.policy_revision, Some(1));
    }
    // The allows are the window's calls 1..=L, whichever replica took them.
    let mut numbered: Vec<u64> = decides
        .values()
        .filter(|record| record.outcome.as_str() == "allow")
        .map(|record| record.usage_calls.expect("an allow records its count"))
        .collect();
    numbered.sort_unstable();
    assert_eq!(numbered, (1..=CEILING).collect::<Vec<_>>());
    let counter = store
        .read_usage(CounterKey {
            principal_id: "staff:ana",
            capability: "tickets.issue.read",
        })
        .await
        .expect("read the counter")
        .expect("a counter");
    assert_eq!(counter.calls, CEILING);
}

/// Request ids in flight.
const IDS: usize = 20;
/// Concurrent copies of each, spread over the replicas (two per replica).
const COPIES: usize = 6;

/// `request_id` idempotency holds across replicas (docs/service.md): copies of one request sent
/// at once to different replicas give one decision, consume at most one call, and every copy
/// gets that decision. Without a claim in the shared store each replica decided on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_id_is_decided_once_across_replicas() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let url = database.url();
    let args = ["--database-url", url.as_str(), "--store-timeout", "5s"];
    let (replicas, channels) = three_replicas_with_a_ceiling(&args).await;

    let tasks: Vec<_> = (0..IDS * COPIES)
        .map(|index| {
            let id = index % IDS;
            let mut client = DecisionServiceClient::new(channels[(index / IDS) % channels.len()].clone());
            let request = DecideRequest {
                request_id: format!("retry-{id}"),
                ..capped()
            };
            tokio::spawn(async move { (id, client.decide(request).await.map(tonic::Response::into_inner)) })
        })
        .collect();
    let mut answers: HashMap<usize, Vec<DecideResponse>> = HashMap::new();
    for task in tasks {
        let (id, answered) = task.await.expect("the call's task");
        let response = answered.unwrap_or_else(|status| panic!("a copy of retry-{id} failed: {status:?}"));
        answers.entry(id).or_default().push(response);
    }
    for (id, copies) in &answers {
        let first = &copies[0];
        for copy in copies {
            assert_eq!(
                copy.decision_id, first.decision_id,
                "every copy of retry-{id} gets one decision"
            );
            assert_eq!(code(copy), code(first), "retry-{id}");
        }
        assert_eq!(
            code(first),
            ReasonCode::Granted,
            "retry-{id}: {IDS} ids fit the ceiling"
        );
    }
    let store = database.store().await;
    let audit = store
        .query_audit(&AuditFilter {
            limit: 10_000,
            ..AuditFilter::default()
        })
        .await
        .expect("read the audit trail");
    // Every copy but the one that decided was answered with its answer: a replay of it.
    let decided: Vec<&AuditRecord> = audit
        .iter()
        .filter(|record| record.outcome != RecordOutcome::Replayed)
        .collect();
    assert_eq!(
        decided.len(),
        IDS,
        "one decision per request id, whichever replica took it"
    );
    for replay in audit
        .iter()
        .filter(|record| record.outcome == RecordOutcome::Replayed)
    {
        let first = decided
            .iter()
            .find(|record| record.request_id == replay.request_id)
            .unwrap_or_else(|| panic!("a replay of no decision: {replay:?}"));
        assert_eq!(replay.first_decision_id.as_ref(), Some(&first.decision_id));
    }
    let counter = store
        .read_usage(CounterKey {
            principal_id: "staff:ana",
            capability: "tickets.issue.read",
        })
        .await
        .expect("read the counter")
        .expect("a counter");
    assert_eq!(counter.calls, IDS as u64, "one call consumed per request id");
    drop(replicas);
}
