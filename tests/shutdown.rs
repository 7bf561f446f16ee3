//! SIGTERM under load loses no record of an answered request (service.md
//! §5 and §7): a real `capgate serve` process, several clients calling
//! `Decide` on connections of their own, SIGTERM in the middle, the clients
//! going on until their connections fail. The process must exit 0, and every
//! decision a client received must be in `audit_log`.
//!
//! Run on PostgreSQL (skipped without `DATABASE_URL`, unless
//! `CAPGATE_REQUIRE_POSTGRES=1`) and on SQLite.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capgate::store::{AuditFilter, AuditRecord, SqliteStore, Store, StoreOptions};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;

use support::client::{capped, connect, uncapped, wait_serving, CATALOG, POLICY};
use support::postgres::TestDatabase;
use support::process::Serve;

/// Concurrent clients, each on a connection of its own.
const CLIENTS: usize = 6;
/// Answers to collect before the signal, so that it lands under load.
const ANSWERS_BEFORE_SIGNAL: usize = 60;
/// No client runs longer than this, whatever the server does.
const LOAD_AT_MOST: Duration = Duration::from_secs(20);

/// What the load saw.
struct Load {
    /// Every decision id a client received.
    answered: BTreeSet<String>,
    /// Answers received after SIGTERM was sent.
    after_signal: usize,
}

/// Starts `capgate serve` on `database_url` with the example policy, loads
/// it, sends SIGTERM, keeps loading until every client's connection fails,
/// and checks that the process exits 0.
async fn terminate_under_load(database_url: &str) -> Load {
    let files = tempfile::tempdir().expect("a temporary directory");
    let policy = files.path().join("policy.yaml");
    let catalog = files.path().join("catalog.yaml");
    std::fs::write(&policy, POLICY).expect("write the policy");
    std::fs::write(&catalog, CATALOG).expect("write the catalog");
    let mut serve = Serve::start(&[
        "--database-url",
        database_url,
        "--policy",
        policy.to_str().expect("a UTF-8 path"),
        "--catalog",
        catalog.to_str().expect("a UTF-8 path"),
    ])
    .await;
    wait_serving(&serve.channel().await, Duration::from_secs(5)).await;

    let answers = Arc::new(AtomicUsize::new(0));
    let signalled = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let channel = connect(serve.addr).await;
        let answers = answers.clone();
        let signalled = signalled.clone();
        clients.push(tokio::spawn(async move {
            let mut decisions = DecisionServiceClient::new(channel);
            let mut answered = Vec::new();
            let mut after_signal = 0;
            let started = Instant::now();
            for call in 0usize.. {
                // Uncapped and capped calls: both write a record, only one
                // touches the counter.
                let request = if (client + call) % 2 == 0 {
                    uncapped()
                } else {
                    capped()
                };
                let was_signalled = signalled.load(Ordering::SeqCst) == 1;
                match decisions.decide(request).await {
                    Ok(response) => {
                        answered.push(response.into_inner().decision_id);
                        answers.fetch_add(1, Ordering::SeqCst);
                        if was_signalled {
                            after_signal += 1;
                        }
                    }
                    // The connection failed: the server has stopped serving it.
                    Err(_) => return Ok((answered, after_signal)),
                }
                if started.elapsed() > LOAD_AT_MOST {
                    return Err(format!(
                        "client {client} was still answered after {LOAD_AT_MOST:?}"
                    ));
                }
            }
            Err(format!("client {client} ran out of calls"))
        }));
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    while answers.load(Ordering::SeqCst) < ANSWERS_BEFORE_SIGNAL {
        assert!(
            Instant::now() < deadline,
            "only {} answers before the signal",
            answers.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signalled.store(1, Ordering::SeqCst);
    serve.terminate();

    let mut load = Load {
        answered: BTreeSet::new(),
        after_signal: 0,
    };
    for client in clients {
        let (answered, after_signal) = client
            .await
            .expect("the client's task")
            .unwrap_or_else(|problem| panic!("{problem}"));
        load.answered.extend(answered);
        load.after_signal += after_signal;
    }
    let status = serve.wait(Duration::from_secs(15)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit {status:?} after SIGTERM:\n{}",
        serve.logs()
    );
    assert!(
        serve.logs().contains("audit flushed; stopped"),
        "{}",
        serve.logs()
    );
    load
}

/// Every answered decision is in the audit trail.
#[track_caller]
fn assert_recorded(load: &Load, audit: &[AuditRecord]) {
    let recorded: BTreeSet<&str> = audit.iter().map(|record| record.decision_id.as_str()).collect();
    let lost: Vec<&String> = load
        .answered
        .iter()
        .filter(|id| !recorded.contains(id.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} answered decisions have no record (first {:?}); {} answered after SIGTERM",
        lost.len(),
        load.answered.len(),
        lost.first(),
        load.after_signal
    );
    assert!(load.answered.len() >= ANSWERS_BEFORE_SIGNAL);
}

fn everything() -> AuditFilter {
    AuditFilter {
        limit: 100_000,
        ..AuditFilter::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_sigterm_under_load_loses_no_answered_record() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let load = terminate_under_load(&database.url()).await;
    let audit = database
        .store()
        .await
        .query_audit(&everything())
        .await
        .expect("read the audit trail");
    assert_recorded(&load, &audit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_sigterm_under_load_loses_no_answered_record() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("capgate.db").display());
    let load = terminate_under_load(&url).await;
    let audit = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("open the database")
        .query_audit(&everything())
        .await
        .expect("read the audit trail");
    assert_recorded(&load, &audit);
}
