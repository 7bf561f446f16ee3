//! `capgate replay`'s throughput and memory (docs/benchmarks.md, "Replay"): a generated audit
//! table of `--records N` records (1,000,000 by default) in a fresh SQLite file — and in a fresh
//! PostgreSQL database when `DATABASE_URL` names a server — replayed under a candidate by the
//! command's own library function (`capgate::cli::replay::engine::replay`), `--runs` times.
//!
//! The records are what the service would have written for the example policy: each decision
//! taken by the core on that policy, with the usage a capped allow saw; a realistic mix of calls
//! by tool and by capability from 5,000 principals, listings, unauthenticated calls, retries
//! answered again and a few rows from before principals were kept. The candidate halves the
//! support team's ticket-reading ceiling and lets interns comment on tickets.
//!
//! Printed: the time to fill the table, each run's records per minute and the median, and the
//! peak resident memory (VmHWM, reset through /proc/self/clear_refs before each replay) of a
//! replay of the first fifth of the records, of the first half and of all of them: the same peak
//! shows that memory does not grow with the records read.
//!
//! `cargo bench --bench replay -- [--records N] [--runs R]`

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Instant;

use capgate::cli::replay::engine::{replay, Report, Window};
use capgate::store::{
    self, AnyStore, AuditRecord, PostgresStore, RecordCode, RecordKind, RecordOutcome, Store, StoreOptions,
};
use capgate_core::access::{evaluate_call, visible, Decision, Usage};
use capgate_core::policy::{compile, load_catalog, CompiledPolicy};
use capgate_core::principals::{AuthProblem, Principal};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

const POLICY: &str = include_str!("../examples/policy.yaml");
const CATALOG: &str = include_str!("../examples/catalog.yaml");

/// 2026-11-02T00:00:00Z: the first record's instant; one record every 600 ms after it, so that a
/// million records span a week.
const BASE: i64 = 1_793_577_600_000;
const STEP: i64 = 600;
const BATCH: usize = 5_000;

const TOOLS: [&str; 11] = [
    "helpdesk__get_ticket",
    "helpdesk__list_tickets",
    "helpdesk__comment_ticket",
    "helpdesk__delete_ticket",
    "helpdesk-legacy__fetch_case",
    "knowledge__search_pages",
    "knowledge__semantic_search",
    "observability__open_dashboard",
    "payments__issue_refund",
    "payments__void_payment",
    "releases__approve_release",
];

fn main() -> ExitCode {
    let mut records: u64 = 1_000_000;
    let mut runs: usize = 3;
    let mut arguments = std::env::args().skip(1);
    while let Some(argument) = arguments.next() {
        let value = |name: &str, arguments: &mut dyn Iterator<Item = String>| {
            arguments
                .next()
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("`{name}` takes a number"))
        };
        match argument.as_str() {
            "--records" => records = value("--records", &mut arguments),
            "--runs" => runs = value("--runs", &mut arguments) as usize,
            // cargo bench passes `--bench`.
            "--bench" => {}
            other => {
                eprintln!("unknown argument `{other}`: expected --records N, --runs R");
                return ExitCode::from(2);
            }
        }
    }
    let active = compiled(POLICY);
    let candidate = compiled(
        &POLICY
            .replace(
                "limits: { calls: 600, per: 1h }",
                "limits: { calls: 300, per: 1h }",
            )
            .replace(
                "attributes: { dept: support, level: senior }",
                "attributes: { dept: support }",
            ),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let path = std::env::temp_dir().join(format!("capgate-bench-replay-{}.db", std::process::id()));
        let url = format!("sqlite://{}", path.display());
        let sqlite = store::connect(&url, &StoreOptions::default())
            .await
            .expect("a fresh SQLite file");
        sqlite.migrate().await.expect("migrate");
        measure("sqlite", &sqlite, &active, &candidate, records, runs).await;
        drop(sqlite);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => postgres(&url, &active, &candidate, records, runs).await,
            _ => println!("postgres: skipped (set DATABASE_URL to a server to measure it too)"),
        }
    });
    ExitCode::SUCCESS
}

/// A fresh `capgate_bench_replay_…` database on the server, dropped after.
async fn postgres(url: &str, active: &CompiledPolicy, candidate: &CompiledPolicy, records: u64, runs: usize) {
    let admin = PgConnectOptions::from_str(url).expect("DATABASE_URL is a PostgreSQL URL");
    let name = format!("capgate_bench_replay_{}", std::process::id());
    let mut connection = PgConnection::connect_with(&admin).await.expect("connect");
    connection
        .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("create the database");
    let store = PostgresStore::connect_with(admin.clone().database(&name), &StoreOptions::default())
        .await
        .expect("open the database");
    store.migrate().await.expect("migrate");
    let store = AnyStore::Postgres(store);
    for at in [BASE, BASE + records as i64 * STEP] {
        store.prepare_audit_periods(at).await.expect("partitions");
    }
    measure("postgres", &store, active, candidate, records, runs).await;
    drop(store);
    connection
        .execute(AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
        .await
        .expect("drop the database");
}

async fn measure(
    kind: &str,
    store: &AnyStore,
    active: &CompiledPolicy,
    candidate: &CompiledPolicy,
    records: u64,
    runs: usize,
) {
    let started = Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..records {
        batch.push(record(active, i));
        if batch.len() == BATCH {
            store.append_audit(&batch, &[]).await.expect("append");
            batch.clear();
        }
    }
    store.append_audit(&batch, &[]).await.expect("append");
    drop(batch);
    println!(
        "{kind}: {records} records generated and stored in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let all = Window {
        since_ms: BASE,
        until_ms: BASE + records as i64 * STEP,
    };
    // Peaks of replays of the first fifth and the first half, to compare with the whole's.
    let mut prefixes = Vec::new();
    for part in [5, 2] {
        let window = Window {
            since_ms: BASE,
            until_ms: BASE + (records / part) as i64 * STEP,
        };
        reset_peak();
        let report = replay(store, candidate, window, 3).await.expect("replay");
        let peak = peak_kib();
        println!(
            "{kind}: first {} records: {} read, peak RSS {} MiB",
            records / part,
            report.read,
            peak / 1024
        );
        prefixes.push(format!("{} MiB for {}", peak / 1024, report.read));
    }
    let mut rates = Vec::new();
    let mut peaks = Vec::new();
    let mut last: Option<Report> = None;
    for run in 1..=runs {
        reset_peak();
        let started = Instant::now();
        let report = replay(store, candidate, all, 3).await.expect("replay");
        let seconds = started.elapsed().as_secs_f64();
        let rate = report.read as f64 / seconds * 60.0;
        let peak = peak_kib();
        println!(
            "{kind}: run {run}: {} records in {seconds:.2} s: {:.0} records/min, peak RSS {} MiB",
            report.read,
            rate,
            peak / 1024
        );
        rates.push(rate);
        peaks.push(peak);
        last = Some(report);
    }
    rates.sort_by(f64::total_cmp);
    peaks.sort_unstable();
    if let Some(report) = last {
        println!(
            "{kind}: median {:.0} records/min over {runs} runs; peak RSS {} MiB for {} records, {}",
            rates[rates.len() / 2],
            peaks[peaks.len() / 2] / 1024,
            report.read,
            prefixes.join(", ")
        );
        println!(
            "{kind}: replayed {}, unchanged {}, changed {}, not replayable {}",
            report.replayed,
            report.unchanged,
            report.changed(),
            report.not_replayable_total()
        );
    }
}

/// The `i`-th record: what the service would have written deciding it on `active`.
fn record(active: &CompiledPolicy, i: u64) -> AuditRecord {
    let at = BASE + i as i64 * STEP;
    let user = (i * 7_919) % 5_000;
    let mut attributes = BTreeMap::new();
    let dept = ["support", "finance", "engineering", ""][(user % 4) as usize];
    let level = ["senior", "intern", ""][(user % 3) as usize];
    for (name, value) in [("dept", dept), ("level", level)] {
        if !value.is_empty() {
            attributes.insert(name.to_owned(), value.to_owned());
        }
    }
    let principal = Principal::new("staff", &format!("user{user}"), attributes);
    let mut record = AuditRecord {
        decision_id: format!("{i:012}"),
        at_ms: at,
        gateway: "edge".to_owned(),
        policy_version: Some(active.version.clone()),
        policy_revision: Some(1),
        issuer: Some("staff".to_owned()),
        subject: Some(principal.subject.clone()),
        ..AuditRecord::default()
    };
    let tool = TOOLS[(i % TOOLS.len() as u64) as usize];
    match i % 100 {
        // A retry answered again.
        0 => {
            record.outcome = RecordOutcome::Replayed;
            record.tool = Some(tool.to_owned());
            record.first_decision_id = Some(format!("{:012}", i.saturating_sub(1)));
            return record;
        }
        // A caller never identified.
        1..=3 => {
            record.outcome = RecordOutcome::Unauthenticated;
            record.code = Some(RecordCode::Problem(AuthProblem::CredentialInvalid));
            record.subject = None;
            record.tool = Some(tool.to_owned());
            return record;
        }
        // A listing.
        4..=13 => {
            let shown = visible(&active.ruleset, &principal, at);
            record.kind = RecordKind::List;
            record.outcome = RecordOutcome::Allow;
            record.visible_count = Some(shown.len() as u64);
            record.visible = shown.iter().map(|seen| seen.capability.id.clone()).collect();
            record.principal_id = Some(principal.id.clone());
            record.attributes = Some(serde_json::to_string(&principal.attributes).expect("JSON"));
            return record;
        }
        _ => {}
    }
    record.principal_id = Some(principal.id.clone());
    // One in a hundred from before principals were kept.
    if i % 100 != 14 {
        record.attributes = Some(serde_json::to_string(&principal.attributes).expect("JSON"));
    }
    // Every fifth call asks for the capability directly, the others by tool name.
    let capability = if i % 5 == 0 {
        let capability = active.tools.resolve(tool).map(|tool| tool.capability.clone());
        record.capability = capability.clone();
        capability
    } else {
        record.tool = Some(tool.to_owned());
        active.tools.resolve(tool).map(|tool| tool.capability.clone())
    };
    let Some(capability) = capability else {
        record.outcome = RecordOutcome::UnknownTool;
        return record;
    };
    record.capability = Some(capability.clone());
    let first = evaluate_call(
        &active.ruleset,
        &principal,
        &capability,
        at,
        Usage::NotConsulted,
        None,
    );
    let ceiling = match &first {
        Decision::Allow(allow) => allow.limits.cloned(),
        Decision::Deny(_) => None,
    };
    // A capped call saw some calls already in its window: the record says how many, this one
    // included on an allow (as src/service/pipeline/metering.rs records them).
    let decision = match &ceiling {
        Some(limits) => {
            let calls = i % (limits.calls + limits.calls / 10 + 1);
            let usage = Usage::Counted {
                calls,
                window_start: at,
            };
            let decision = evaluate_call(&active.ruleset, &principal, &capability, at, usage, None);
            record.limit_calls = Some(limits.calls);
            record.limit_per = Some(limits.per.clone());
            record.usage_calls = Some(if decision.is_allow() { calls + 1 } else { calls });
            decision
        }
        None => first,
    };
    let reason = decision.reason();
    record.outcome = if decision.is_allow() {
        RecordOutcome::Allow
    } else {
        RecordOutcome::Deny
    };
    record.code = Some(RecordCode::Reason(reason.code));
    record.path = Some(reason.path.to_owned());
    if let Decision::Allow(allow) = &decision {
        record.account_id = Some(allow.account.id.clone());
    }
    record
}

fn compiled(artifact: &str) -> CompiledPolicy {
    let catalog = load_catalog(CATALOG.as_bytes()).expect("the example catalog loads");
    compile(artifact.as_bytes(), Some(&catalog))
        .policy
        .expect("the policy compiles")
}

/// Resets the peak resident set size to the current one (Linux 4.0+).
fn reset_peak() {
    if std::fs::write("/proc/self/clear_refs", "5").is_err() {
        eprintln!("cannot reset the peak RSS: the peaks printed include what came before");
    }
}

/// VmHWM, in KiB.
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmHWM:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}
