//! The decision service end to end: a real server on a loopback port, in
//! this process, called by a real tonic client (service.md). Where a test
//! needs the store to fail, it wraps the store in [`Flaky`], which fails
//! counters or audit writes on demand and delegates everything else.
//!
//! The main scenarios run against both stores (STYLE.md, "interchangeable
//! peripheries"): `on_both_stores!` makes each `async fn name(kind: Kind)`
//! two tests, `sqlite::name` (a SQLite file in a temporary directory) and
//! `postgres::name` (a fresh database on the server in `DATABASE_URL`,
//! dropped afterwards; skipped without it unless
//! `CAPGATE_REQUIRE_POSTGRES=1`). The rest do not depend on the store and
//! run on SQLite only.

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capgate::service::{self, Config, ConfigError, PolicyFile, Running, StartError, Token};
use capgate::store::{
    self, ActivateOutcome, AnyStore, AuditFilter, AuditRecord, Claim, CounterKey, CounterReading,
    DecisionNote, ExpectedRevision, LostAnswer, NewPolicy, Note, PrunedPeriod, PublishOutcome, RecordOutcome,
    Remembered, SqliteStore, Store, StoreError, StoreOptions, StoreResult, StoredPolicy,
};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::policy_service_client::PolicyServiceClient;
use capgate::wire::proto::{
    decide_response, list_visible_request, list_visible_response, transport, ActivatePolicyRequest,
    AssertedPrincipal, Attribute, AuthProblem, DecideRequest, DecideResponse, GetActivePolicyRequest,
    ListPolicyVersionsRequest, ListVisibleRequest, Outcome, PublishPolicyRequest, PublishPolicyResponse,
    ReasonCode,
};
use support::client::{
    ana, code, decision, example_with_ceiling, for_capability, for_tool, principal, recorded_code,
    recorded_outcome, summary, CATALOG, POLICY,
};
use support::postgres::TestDatabase;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

// ── The suite ─────────────────────────────────────────────────────────────

/// Which store a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
}

crate::on_both_stores! {
    invalid_artifacts_are_refused_with_positions_and_not_stored,
    a_lost_answer_is_noted_only_where_the_record_says_otherwise,
    publish_dry_run_identical_conflict_list_and_rollback,
    the_startup_file_is_published_only_when_it_differs,
    decide_answers_the_worked_examples,
    tools_unknown_tools_and_unauthenticated_callers,
    a_ceiling_of_l_allows_exactly_l_calls,
    concurrent_calls_never_exceed_the_ceiling,
    commits_in_flight_overlap_and_keep_the_ceiling_exact,
    a_retried_request_id_returns_the_original_and_consumes_nothing,
    concurrent_decisions_each_get_exactly_one_audit_record,
    a_failing_counter_store_denies_capped_calls_and_allows_uncapped_ones,
    without_a_spool_an_unwritable_audit_fails_the_call,
    with_a_spool_decisions_go_on_and_records_arrive_later,
    a_capped_call_spooled_past_its_deadline_is_never_counted,
    list_visible_lists_tools_in_catalog_order_and_records_what_was_visible,
    tokens_are_required_and_roles_enforced,
    health_follows_the_active_policy_and_reflection_lists_the_services,
    stopping_finishes_in_flight_calls_and_flushes_the_audit,
    watch_policy_streams_the_active_version_and_ends_on_stop,
    a_gateway_notes_what_happened_after_its_allow,
    denials_say_why_in_words_and_when_a_ceiling_resets,
}

// ── A store that fails on demand ──────────────────────────────────────────

/// A store, with switches that make counter reads, counter consumptions or
/// audit writes fail. Over [`AnyStore`], so that one server type serves both
/// variants of a scenario.
#[derive(Clone)]
struct Flaky {
    inner: AnyStore,
    reads_down: Arc<AtomicBool>,
    /// Counting capped calls fails (their batch is then stored without counting them).
    counters_down: Arc<AtomicBool>,
    /// A batch that counts capped calls waits this long (ms) before its transaction starts.
    stall_counting_ms: Arc<AtomicU64>,
    audit_down: Arc<AtomicBool>,
    /// Batch transactions under way now, and the most seen at once.
    commits: Arc<Gauge>,
}

/// How many of something run now, and the most that ever did at once.
#[derive(Default)]
struct Gauge {
    now: AtomicU64,
    most: AtomicU64,
}

impl Gauge {
    /// Counts one in until the returned guard drops.
    fn enter(self: &Arc<Self>) -> impl Drop + Send {
        struct Leave(Arc<Gauge>);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0.now.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Leave(self.clone())
    }
}

/// What a switched-off `operation` fails with: what a store that went away
/// reports.
fn down<T>(operation: &'static str) -> StoreResult<T> {
    Err(StoreError::Database {
        operation,
        source: sqlx::Error::Io(std::io::Error::other("switched off by the test")),
    })
}

impl Store for Flaky {
    fn migrate(&self) -> impl Future<Output = StoreResult<()>> + Send {
        self.inner.migrate()
    }
    fn active_policy(&self) -> impl Future<Output = StoreResult<Option<StoredPolicy>>> + Send {
        self.inner.active_policy()
    }
    fn publish(
        &self,
        new: NewPolicy,
        expected: ExpectedRevision,
    ) -> impl Future<Output = StoreResult<PublishOutcome>> + Send {
        self.inner.publish(new, expected)
    }
    fn activate(
        &self,
        revision: u64,
        expected: ExpectedRevision,
        by: &store::Actor,
    ) -> impl Future<Output = StoreResult<ActivateOutcome>> + Send {
        self.inner.activate(revision, expected, by)
    }
    fn activations(&self, limit: u32) -> impl Future<Output = StoreResult<Vec<store::Activation>>> + Send {
        self.inner.activations(limit)
    }
    fn counters(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = StoreResult<Vec<store::StoredCounter>>> + Send {
        self.inner.counters(principal_id, capability, limit)
    }
    fn reset_usage(
        &self,
        key: CounterKey<'_>,
        by: &store::Actor,
    ) -> impl Future<Output = StoreResult<Option<CounterReading>>> + Send {
        self.inner.reset_usage(key, by)
    }
    fn usage_resets(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = StoreResult<Vec<store::UsageReset>>> + Send {
        self.inner.usage_resets(principal_id, capability, limit)
    }
    fn audit_groups(
        &self,
        filter: &AuditFilter,
        keys: &[store::GroupKey],
    ) -> impl Future<Output = StoreResult<Vec<store::AuditGroup>>> + Send {
        self.inner.audit_groups(filter, keys)
    }
    fn policy(&self, revision: u64) -> impl Future<Output = StoreResult<Option<StoredPolicy>>> + Send {
        self.inner.policy(revision)
    }
    fn list_policies(&self, limit: u32) -> impl Future<Output = StoreResult<Vec<StoredPolicy>>> + Send {
        self.inner.list_policies(limit)
    }
    fn shadow_policy(&self) -> impl Future<Output = StoreResult<Option<store::Shadow>>> + Send {
        self.inner.shadow_policy()
    }
    fn set_shadow(
        &self,
        revision: Option<u64>,
        by: &store::Actor,
    ) -> impl Future<Output = StoreResult<bool>> + Send {
        self.inner.set_shadow(revision, by)
    }
    fn publish_shadow(&self, new: NewPolicy) -> impl Future<Output = StoreResult<StoredPolicy>> + Send {
        self.inner.publish_shadow(new)
    }
    fn shadow_differences(
        &self,
        filter: &store::ShadowFilter,
    ) -> impl Future<Output = StoreResult<Vec<AuditRecord>>> + Send {
        self.inner.shadow_differences(filter)
    }
    fn shadow_counts(
        &self,
        filter: &store::ShadowFilter,
    ) -> impl Future<Output = StoreResult<Vec<store::ShadowCount>>> + Send {
        self.inner.shadow_counts(filter)
    }
    fn prune_shadow(&self, before_ms: i64) -> impl Future<Output = StoreResult<u64>> + Send {
        self.inner.prune_shadow(before_ms)
    }
    fn policy_changed(&self) -> impl Future<Output = StoreResult<()>> + Send {
        self.inner.policy_changed()
    }
    fn read_usage(
        &self,
        key: CounterKey<'_>,
    ) -> impl Future<Output = StoreResult<Option<CounterReading>>> + Send {
        let fail = self.reads_down.load(Ordering::SeqCst);
        let read = self.inner.read_usage(key);
        async move {
            if fail {
                down("read_usage")
            } else {
                read.await
            }
        }
    }
    fn commit_batch(
        &self,
        asks: &[store::CounterAsk],
        records: &[AuditRecord],
        remembered: &[store::RememberedEntry],
        settle: store::Settle<'_>,
        gate: &store::CommitGate,
    ) -> impl Future<Output = StoreResult<Vec<store::Tally>>> + Send {
        let counters_down = self.counters_down.load(Ordering::SeqCst) && !asks.is_empty();
        let audit_down = self.audit_down.load(Ordering::SeqCst);
        let stall = match asks.is_empty() {
            true => 0,
            false => self.stall_counting_ms.load(Ordering::SeqCst),
        };
        let commit = self.inner.commit_batch(asks, records, remembered, settle, gate);
        let gauge = self.commits.clone();
        async move {
            let _under_way = gauge.enter();
            tokio::time::sleep(Duration::from_millis(stall)).await;
            if counters_down {
                down(store::COUNT_USAGE)
            } else if audit_down {
                down("commit_batch")
            } else {
                commit.await
            }
        }
    }
    fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let fail = self.audit_down.load(Ordering::SeqCst);
        let append = self.inner.append_audit(records, remembered);
        async move {
            if fail {
                down("append_audit")
            } else {
                append.await
            }
        }
    }
    fn remembered(
        &self,
        gateway: &str,
        request_id: &str,
    ) -> impl Future<Output = StoreResult<Option<Remembered>>> + Send {
        self.inner.remembered(gateway, request_id)
    }
    fn claim_request(
        &self,
        gateway: &str,
        request_id: &str,
        fingerprint: &store::Fingerprint,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> impl Future<Output = StoreResult<Claim>> + Send {
        self.inner
            .claim_request(gateway, request_id, fingerprint, now_ms, stale_before_ms)
    }
    fn request_key(&self, candidate: &[u8; 32]) -> impl Future<Output = StoreResult<[u8; 32]>> + Send {
        self.inner.request_key(candidate)
    }
    fn forget_requests(&self, before_ms: i64) -> impl Future<Output = StoreResult<u64>> + Send {
        self.inner.forget_requests(before_ms)
    }
    fn query_audit(
        &self,
        filter: &AuditFilter,
    ) -> impl Future<Output = StoreResult<Vec<AuditRecord>>> + Send {
        self.inner.query_audit(filter)
    }
    fn note_decision(&self, note: &DecisionNote) -> impl Future<Output = StoreResult<bool>> + Send {
        self.inner.note_decision(note)
    }
    fn correct_lost_answer(&self, lost: &LostAnswer) -> impl Future<Output = StoreResult<bool>> + Send {
        self.inner.correct_lost_answer(lost)
    }
    fn decision_notes(
        &self,
        decision_ids: &[String],
    ) -> impl Future<Output = StoreResult<Vec<DecisionNote>>> + Send {
        self.inner.decision_notes(decision_ids)
    }
    fn prepare_audit_periods(&self, now_ms: i64) -> impl Future<Output = StoreResult<()>> + Send {
        self.inner.prepare_audit_periods(now_ms)
    }
    fn prune_audit(
        &self,
        before_ms: i64,
        dry_run: bool,
    ) -> impl Future<Output = StoreResult<Vec<PrunedPeriod>>> + Send {
        self.inner.prune_audit(before_ms, dry_run)
    }
}

// ── The harness ───────────────────────────────────────────────────────────

struct Harness {
    running: Option<Running>,
    store: Flaky,
    channel: Channel,
    place: Place,
}

/// Where a harness keeps its state: a temporary directory (the SQLite file,
/// and files a test writes) and, for PostgreSQL, a fresh database. Handed
/// from one harness to the next, it is what a restarted server finds.
struct Place {
    dir: tempfile::TempDir,
    database: Option<TestDatabase>,
}

impl Place {
    async fn new(kind: Kind) -> Place {
        let database = match kind {
            Kind::Sqlite => None,
            Kind::Postgres => Some(
                TestDatabase::create()
                    .await
                    .expect("the PostgreSQL variant runs only with DATABASE_URL"),
            ),
        };
        Place {
            dir: tempfile::tempdir().expect("temporary directory"),
            database,
        }
    }

    async fn store(&self) -> AnyStore {
        match &self.database {
            None => AnyStore::Sqlite(sqlite(&self.dir).await),
            Some(database) => AnyStore::Postgres(database.store().await),
        }
    }
}

impl Harness {
    /// A server on 127.0.0.1:0 over a fresh store, configured by `adjust`.
    async fn start(kind: Kind, adjust: impl FnOnce(&mut Config)) -> Harness {
        Harness::start_in(Place::new(kind).await, adjust).await
    }

    async fn start_in(place: Place, adjust: impl FnOnce(&mut Config)) -> Harness {
        let store = Flaky {
            inner: place.store().await,
            reads_down: Arc::new(AtomicBool::new(false)),
            counters_down: Arc::new(AtomicBool::new(false)),
            stall_counting_ms: Arc::new(AtomicU64::new(0)),
            audit_down: Arc::new(AtomicBool::new(false)),
            commits: Arc::default(),
        };
        let mut config = Config::new(vec!["127.0.0.1:0".parse().unwrap()]);
        config.poll_interval = Duration::from_millis(200);
        adjust(&mut config);
        let running = service::start(store.clone(), config)
            .await
            .expect("the server starts");
        let channel = Endpoint::from_shared(format!("http://{}", running.addrs[0]))
            .unwrap()
            .connect()
            .await
            .expect("connect to the server");
        Harness {
            running: Some(running),
            store,
            channel,
            place,
        }
    }

    /// Stops the server and hands back its place, for the next one.
    async fn restart_place(self) -> Place {
        let Harness { running, place, .. } = self;
        running.unwrap().stop().await.expect("a clean stop");
        place
    }

    fn decisions(&self) -> DecisionServiceClient<Channel> {
        DecisionServiceClient::new(self.channel.clone())
    }

    fn policies(&self) -> PolicyServiceClient<Channel> {
        PolicyServiceClient::new(self.channel.clone())
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX)
    }

    async fn publish(&self, artifact: &str, catalog: Option<&str>) -> Result<PublishPolicyResponse, Status> {
        self.policies()
            .publish_policy(PublishPolicyRequest {
                artifact: artifact.to_owned(),
                catalog: catalog.map(str::to_owned),
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn decide(&self, request: DecideRequest) -> Result<DecideResponse, Status> {
        self.decisions()
            .decide(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        self.store
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .expect("query the audit trail")
    }

    async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("a clean stop");
        }
    }
}

async fn sqlite(dir: &tempfile::TempDir) -> SqliteStore {
    let url = format!("sqlite://{}", dir.path().join("capgate.db").display());
    match store::connect(&url, &StoreOptions::default())
        .await
        .expect("open SQLite")
    {
        AnyStore::Sqlite(store) => store,
        AnyStore::Postgres(_) => unreachable!("a sqlite URL"),
    }
}

fn violations(status: &Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

// ── Policy versions ───────────────────────────────────────────────────────

async fn invalid_artifacts_are_refused_with_positions_and_not_stored(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    let bad = POLICY.replacen("using: helpdesk-reader", "using: docs-writer", 1);
    let response = harness.publish(&bad, None).await.unwrap();
    assert!(!response.accepted);
    assert_eq!(response.revision, 0);
    let error = &response.diagnostics[0];
    assert_eq!(
        (error.severity.as_str(), error.code.as_str(), error.path.as_str()),
        ("error", "unknown_account_in_grant", "/grants/0/using")
    );
    let position = error.position.expect("a position");
    assert_eq!((position.line, position.column), (129, 12));
    assert!(harness.store.list_policies(10).await.unwrap().is_empty());
    assert!(harness.store.active_policy().await.unwrap().is_none());

    // A catalog that is not one is the caller's mistake, named.
    let status = harness.publish(POLICY, Some("tools: {}\n")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(violations(&status), ["catalog"]);
    harness.stop().await;
}

async fn publish_dry_run_identical_conflict_list_and_rollback(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    let mut policies = harness.policies();

    // A dry run compiles and diffs, and stores nothing.
    let dry = policies
        .publish_policy(PublishPolicyRequest {
            artifact: POLICY.into(),
            catalog: Some(CATALOG.into()),
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dry.accepted && !dry.unchanged);
    assert_eq!(dry.revision, 0);
    // Against no policy at all: nothing was declared before.
    assert!(dry.changes.iter().all(|change| change.before.is_none()));
    assert!(dry
        .changes
        .iter()
        .any(|change| change.kind == "gained" && change.capability == "tickets.issue.read"));
    assert!(harness.store.list_policies(10).await.unwrap().is_empty());

    // The first version: revision 1, two catalog warnings, every allow gained; and the server's
    // own warning when it cannot read the `nightly` issuer's key (`env://NIGHTLY_RUNNER_KEY`), as
    // a remote publisher would otherwise never learn.
    let first = harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    assert!(first.accepted && !first.unchanged);
    assert_eq!(first.revision, 1);
    let codes: Vec<&str> = first.diagnostics.iter().map(|d| d.code.as_str()).collect();
    let key_is_set = std::env::var_os("NIGHTLY_RUNNER_KEY").is_some();
    let mut expected = vec!["catalog_tool_unmapped", "catalog_tool_unmapped"];
    if !key_is_set {
        expected.push("secret_unreadable");
        let warning = first.diagnostics.last().expect("the server's warning");
        assert_eq!(
            (warning.severity.as_str(), warning.path.as_str()),
            ("warning", "/principals/issuers/1/secret/ref")
        );
        assert!(
            warning.message.contains("NIGHTLY_RUNNER_KEY"),
            "{}",
            warning.message
        );
        assert!(warning.position.is_some(), "{warning:?}");
    }
    assert_eq!(codes, expected);
    assert_eq!(first.changes, dry.changes);

    // The same content again: nothing stored, the active revision returned.
    let again = harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    assert!(again.accepted && again.unchanged);
    assert_eq!(again.revision, 1);
    assert!(again.changes.is_empty());
    assert_eq!(harness.store.list_policies(10).await.unwrap().len(), 1);

    // Compare-and-set against a stale revision: ABORTED, nothing changes.
    let stale = policies
        .publish_policy(PublishPolicyRequest {
            artifact: example_with_ceiling(300),
            catalog: Some(CATALOG.into()),
            expected_active_revision: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    assert_eq!(harness.store.list_policies(10).await.unwrap().len(), 1);

    // The right revision: stored, activated, and the diff says exactly what changed.
    let second = policies
        .publish_policy(PublishPolicyRequest {
            artifact: example_with_ceiling(300),
            catalog: Some(CATALOG.into()),
            expected_active_revision: Some(1),
            comment: "halve the support read ceiling".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.revision, 2);
    // Three representatives hold `dept: support`: plain, intern, senior.
    let calls = |side: &Option<capgate::wire::proto::DecisionSummary>| {
        side.as_ref().and_then(|s| s.limits.as_ref()).map(|l| l.calls)
    };
    let shape: Vec<_> = second
        .changes
        .iter()
        .map(|change| {
            (
                change.issuer.as_str(),
                change.attributes.get("level"),
                change.capability.as_str(),
                change.kind.as_str(),
                calls(&change.before),
                calls(&change.after),
            )
        })
        .collect();
    let (intern, senior) = ("intern".to_owned(), "senior".to_owned());
    assert_eq!(
        shape,
        [
            (
                "staff",
                None,
                "tickets.issue.read",
                "changed",
                Some(600),
                Some(300)
            ),
            (
                "staff",
                Some(&intern),
                "tickets.issue.read",
                "changed",
                Some(600),
                Some(300)
            ),
            (
                "staff",
                Some(&senior),
                "tickets.issue.read",
                "changed",
                Some(600),
                Some(300)
            ),
        ]
    );
    assert_eq!(
        second.changes[0].attributes,
        BTreeMap::from([("dept".to_owned(), "support".to_owned())])
    );

    // The new version decides at once on this replica.
    let allowed = harness
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    assert_eq!(allowed.policy_revision, 2);
    assert_eq!(decision(&allowed).limits.as_ref().map(|l| l.calls), Some(300));

    let active = policies
        .get_active_policy(GetActivePolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    let version = active.version.expect("a version");
    assert_eq!((version.revision, version.active), (2, true));
    assert_eq!(version.comment, "halve the support read ceiling");
    assert_eq!(version.author, "loopback");
    assert_eq!(active.artifact, example_with_ceiling(300));
    assert_eq!(active.catalog.as_deref(), Some(CATALOG));

    let listed = policies
        .list_policy_versions(ListPolicyVersionsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .versions;
    let shape: Vec<(u64, bool)> = listed.iter().map(|v| (v.revision, v.active)).collect();
    assert_eq!(shape, [(2, true), (1, false)]);

    // Roll back to revision 1: the ceiling is 600 again, and the diff says so.
    let rolled = policies
        .activate_policy(ActivatePolicyRequest {
            revision: 1,
            expected_active_revision: Some(2),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rolled.version.map(|v| v.revision), Some(1));
    assert_eq!(rolled.changes.len(), 3);
    assert!(rolled
        .changes
        .iter()
        .all(|change| (calls(&change.before), calls(&change.after)) == (Some(300), Some(600))));
    let after = harness
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    assert_eq!(after.policy_revision, 1);
    assert_eq!(decision(&after).limits.as_ref().map(|l| l.calls), Some(600));

    let missing = policies
        .activate_policy(ActivatePolicyRequest {
            revision: 99,
            expected_active_revision: None,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let conflict = policies
        .activate_policy(ActivatePolicyRequest {
            revision: 2,
            expected_active_revision: Some(2),
        })
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::Aborted);
    harness.stop().await;
}

async fn the_startup_file_is_published_only_when_it_differs(kind: Kind) {
    let place = Place::new(kind).await;
    let with_file = |artifact: String| {
        move |config: &mut Config| {
            config.policy = Some(PolicyFile {
                artifact,
                catalog: Some(CATALOG.into()),
            })
        }
    };
    let first = Harness::start_in(place, with_file(POLICY.into())).await;
    assert_eq!(
        first.store.active_policy().await.unwrap().map(|p| p.revision),
        Some(1)
    );
    let allowed = first
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    assert_eq!(allowed.policy_revision, 1);
    let place = first.restart_place().await;
    // The same file again: nothing new.
    let same = Harness::start_in(place, with_file(POLICY.into())).await;
    assert_eq!(same.store.list_policies(10).await.unwrap().len(), 1);
    let place = same.restart_place().await;
    // Another file: published and active before the first call.
    let changed = Harness::start_in(place, with_file(example_with_ceiling(7))).await;
    let response = changed
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    assert_eq!(response.policy_revision, 2);
    assert_eq!(decision(&response).limits.as_ref().map(|l| l.calls), Some(7));
    changed.stop().await;
}

// ── Decide ────────────────────────────────────────────────────────────────

/// (outcome, code, path, subject) a row expects.
type Expected = (Outcome, ReasonCode, &'static str, &'static str);
/// For an allow: the account and the ceiling's calls, if any.
type Allowed = Option<(&'static str, Option<u64>)>;

async fn decide_answers_the_worked_examples(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    use Outcome::{Allow, Deny};
    use ReasonCode::*;
    let senior = || principal("staff", "bo", &[("dept", &["support"]), ("level", &["senior"])]);
    let intern = || principal("staff", "cy", &[("dept", &["support"]), ("level", &["intern"])]);
    let nightly = || {
        principal(
            "nightly",
            "nightly-runner",
            &[("role", &["batch"]), ("env", &["prod"])],
        )
    };
    let rows: Vec<(DecideRequest, Expected, Allowed)> = vec![
        (
            for_capability(ana(), "tickets.issue.read"),
            (Allow, Granted, "/grants/0", "tickets.issue.read"),
            Some(("helpdesk-reader", Some(600))),
        ),
        (
            for_capability(ana(), "tickets.issue.write"),
            (Deny, NoGrantMatches, "/grants", "tickets.issue.write"),
            None,
        ),
        (
            for_capability(senior(), "tickets.issue.write"),
            (Allow, Granted, "/grants/1", "tickets.issue.write"),
            Some(("helpdesk-agent", Some(100))),
        ),
        (
            for_capability(principal("staff", "dee", &[]), "docs.page.search"),
            (Allow, Granted, "/grants/2", "docs.page.search"),
            Some(("docs-reader", None)),
        ),
        (
            for_capability(senior(), "docs.page.search"),
            (Allow, Granted, "/grants/3", "docs.page.search"),
            Some(("docs-reader", Some(2400))),
        ),
        (
            for_capability(intern(), "docs.page.search"),
            (Allow, Granted, "/grants/4", "docs.page.search"),
            Some(("docs-reader", Some(100))),
        ),
        (
            for_capability(
                principal("staff", "fin", &[("dept", &["finance"])]),
                "billing.refund.create",
            ),
            (Deny, LimitExhausted, "/grants/10", "billing.refund.create"),
            None,
        ),
        (
            for_capability(nightly(), "deploy.release.approve"),
            (Deny, AccountDisabled, "/grants/11", "release-robot"),
            None,
        ),
        (
            for_capability(
                principal(
                    "mesh",
                    "CN=grafana",
                    &[("org", &["Acme Corp"]), ("unit", &["sre"])],
                ),
                "metrics.dashboard-view",
            ),
            (Allow, Granted, "/grants/8", "metrics.dashboard-view"),
            Some(("metrics-viewer", Some(30))),
        ),
        (
            for_capability(ana(), "crm.contact.read"),
            (Deny, CapabilityNotDeclared, "/capabilities", "crm.contact.read"),
            None,
        ),
        (
            for_capability(
                principal("mesh", "CN=pay", &[("unit", &["payments"])]),
                "billing.refund.create",
            ),
            (Deny, NoGrantMatches, "/grants", "billing.refund.create"),
            None,
        ),
        // An asserted static-key principal carries no literal defaults: no `role`.
        (
            for_capability(principal("nightly", "nightly-runner", &[]), "tickets.issue.read"),
            (Deny, NoGrantMatches, "/grants", "tickets.issue.read"),
            None,
        ),
        // Multi-valued: two values, or the name twice, give no attribute.
        (
            for_capability(
                principal("staff", "eve", &[("dept", &["support", "sre"])]),
                "tickets.issue.read",
            ),
            (Deny, NoGrantMatches, "/grants", "tickets.issue.read"),
            None,
        ),
        (
            for_capability(
                principal("staff", "eve", &[("dept", &["support"]), ("dept", &["support"])]),
                "docs.page.search",
            ),
            (Allow, Granted, "/grants/2", "docs.page.search"),
            Some(("docs-reader", None)),
        ),
    ];
    let mut ids = Vec::new();
    for (request, expected, allow) in rows {
        let response = harness.decide(request.clone()).await.unwrap();
        let (outcome, code, path, subject) = summary(&response);
        assert_eq!(
            (outcome, code, path.as_str(), subject.as_str()),
            expected,
            "{request:?}"
        );
        let decision = decision(&response);
        let position = decision.reason.as_ref().unwrap().position;
        assert!(position.is_some_and(|p| p.line > 0), "{path} has a position");
        assert_eq!(response.policy_revision, 1);
        assert!(response.policy_version.starts_with("sha256:"));
        match allow {
            Some((account, ceiling)) => {
                assert_eq!(decision.account.as_ref().map(|a| a.id.as_str()), Some(account));
                assert!(!decision.account.as_ref().unwrap().secret_ref.is_empty());
                let limits = decision.limits.as_ref();
                assert_eq!(limits.map(|l| l.calls), ceiling);
                if let (Some(limits), Some(calls)) = (limits, ceiling) {
                    // The first call of the window: one taken.
                    assert_eq!(limits.remaining, calls - 1);
                    let resets = limits.resets_at.as_ref().unwrap();
                    let at = response.at.as_ref().unwrap();
                    let window = i64::try_from(limits.window_ms).unwrap();
                    assert_eq!(
                        resets.seconds * 1000 + i64::from(resets.nanos / 1_000_000),
                        at.seconds * 1000 + i64::from(at.nanos / 1_000_000) + window
                    );
                }
            }
            None => {
                assert!(decision.account.is_none() && decision.limits.is_none() && decision.tool.is_none());
            }
        }
        ids.push((response.decision_id.clone(), outcome, code));
    }

    // The secret reference of the allow, verbatim from the artifact.
    let response = harness
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    assert_eq!(
        decision(&response).account.as_ref().unwrap().secret_ref,
        "vault://secret/mcp/helpdesk-ro#token"
    );

    // One audit record per decision, with what the response said.
    let audit = harness.audit().await;
    for (id, outcome, code) in &ids {
        let record = audit
            .iter()
            .find(|record| &record.decision_id == id)
            .unwrap_or_else(|| panic!("no audit record for {id}"));
        let expected_outcome = if *outcome == Allow { "allow" } else { "deny" };
        assert_eq!(record.outcome.as_str(), expected_outcome);
        assert_eq!(
            record.code.map(|code| code.as_str().to_owned()),
            Some(recorded_code(*code))
        );
        assert_eq!(record.kind.as_str(), "decide");
        assert_eq!(record.gateway, "loopback");
        assert_eq!(record.policy_revision, Some(1));
        assert_eq!(record.account_id.is_some(), *outcome == Allow);
    }
    harness.stop().await;
}

async fn tools_unknown_tools_and_unauthenticated_callers(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();

    let stdio = harness
        .decide(for_tool(ana(), "helpdesk__get_ticket"))
        .await
        .unwrap();
    let tool = decision(&stdio).tool.clone().expect("the tool on an allow");
    assert_eq!(
        (
            tool.exposed_name.as_str(),
            tool.upstream.as_str(),
            tool.name.as_str(),
            tool.capability.as_str()
        ),
        (
            "helpdesk__get_ticket",
            "helpdesk",
            "get_ticket",
            "tickets.issue.read"
        )
    );
    match tool.transport.and_then(|t| t.kind) {
        Some(transport::Kind::Stdio(stdio)) => {
            assert_eq!(stdio.command, "helpdesk-mcp");
            assert_eq!(stdio.args, ["--region", "eu-west-1"]);
        }
        other => panic!("expected stdio, got {other:?}"),
    }
    let http = harness
        .decide(for_tool(ana(), "helpdesk-legacy__fetch_case"))
        .await
        .unwrap();
    match decision(&http)
        .tool
        .clone()
        .and_then(|t| t.transport)
        .and_then(|t| t.kind)
    {
        Some(transport::Kind::Http(http)) => assert_eq!(http.url, "https://legacy-helpdesk.example.net/mcp"),
        other => panic!("expected http, got {other:?}"),
    }
    // A deny through a tool names no tool.
    let denied = harness
        .decide(for_tool(ana(), "helpdesk__comment_ticket"))
        .await
        .unwrap();
    assert_eq!(summary(&denied).1, ReasonCode::NoGrantMatches);
    assert!(decision(&denied).tool.is_none());

    // In the catalog but unmapped: it does not exist for clients.
    let unknown = harness
        .decide(for_tool(ana(), "helpdesk__delete_ticket"))
        .await
        .unwrap();
    match &unknown.result {
        Some(decide_response::Result::UnknownTool(tool)) => assert_eq!(tool.name, "helpdesk__delete_ticket"),
        other => panic!("expected unknown_tool, got {other:?}"),
    }

    let problem = |response: &DecideResponse| match &response.result {
        Some(decide_response::Result::Unauthenticated(u)) => u.problem(),
        other => panic!("expected unauthenticated, got {other:?}"),
    };
    let stranger = harness
        .decide(for_capability(
            principal("partners", "zed", &[]),
            "docs.page.search",
        ))
        .await
        .unwrap();
    assert_eq!(problem(&stranger), AuthProblem::IssuerUnknown);
    let blank = harness
        .decide(for_capability(principal("staff", " \t", &[]), "docs.page.search"))
        .await
        .unwrap();
    assert_eq!(problem(&blank), AuthProblem::CredentialMissing);

    let audit = harness.audit().await;
    let find = |id: &str| {
        audit
            .iter()
            .find(|r| r.decision_id == id)
            .expect("recorded")
            .clone()
    };
    let record = find(&unknown.decision_id);
    assert_eq!(
        (
            record.outcome.as_str(),
            record.tool.as_deref(),
            record.account_id.as_deref()
        ),
        ("unknown_tool", Some("helpdesk__delete_ticket"), None)
    );
    let record = find(&stranger.decision_id);
    assert_eq!(
        (
            record.outcome.as_str(),
            record.code.map(|code| code.as_str()),
            record.issuer.as_deref()
        ),
        ("unauthenticated", Some("issuer_unknown"), Some("partners"))
    );
    let record = find(&stdio.decision_id);
    assert_eq!(record.tool.as_deref(), Some("helpdesk__get_ticket"));
    assert_eq!(record.capability.as_deref(), Some("tickets.issue.read"));
    harness.stop().await;
}

async fn a_ceiling_of_l_allows_exactly_l_calls(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness
        .publish(&example_with_ceiling(3), Some(CATALOG))
        .await
        .unwrap();
    let mut remaining = Vec::new();
    let mut codes = Vec::new();
    for _ in 0..5 {
        let response = harness
            .decide(for_capability(ana(), "tickets.issue.read"))
            .await
            .unwrap();
        codes.push(summary(&response).1);
        remaining.push(decision(&response).limits.as_ref().map(|l| l.remaining));
    }
    use ReasonCode::{Granted, LimitExhausted};
    assert_eq!(codes, [Granted, Granted, Granted, LimitExhausted, LimitExhausted]);
    assert_eq!(remaining, [Some(2), Some(1), Some(0), None, None]);
    // Another principal has a counter of its own.
    let other = harness
        .decide(for_capability(
            principal("staff", "zoe", &[("dept", &["support"])]),
            "tickets.issue.read",
        ))
        .await
        .unwrap();
    assert_eq!(summary(&other).1, Granted);

    let audit = harness.audit().await;
    let mut used: Vec<(String, Option<u64>)> = audit
        .iter()
        .filter(|r| r.principal_id.as_deref() == Some("staff:ana"))
        .map(|r| (r.code.unwrap().as_str().to_owned(), r.usage_calls))
        .collect();
    used.sort();
    assert_eq!(
        used,
        [
            ("granted".to_owned(), Some(1)),
            ("granted".to_owned(), Some(2)),
            ("granted".to_owned(), Some(3)),
            ("limit_exhausted".to_owned(), Some(3)),
            ("limit_exhausted".to_owned(), Some(3)),
        ]
    );
    assert!(audit
        .iter()
        .all(|r| r.limit_calls == Some(3) && r.limit_per.as_deref() == Some("1h")));
    harness.stop().await;
}

async fn concurrent_calls_never_exceed_the_ceiling(kind: Kind) {
    let harness = Harness::start(kind, |config| config.store_timeout = Duration::from_secs(5)).await;
    harness
        .publish(&example_with_ceiling(10), Some(CATALOG))
        .await
        .unwrap();
    let calls = (0..40).map(|_| {
        let mut client = harness.decisions();
        async move {
            client
                .decide(for_capability(ana(), "tickets.issue.read"))
                .await
                .map(tonic::Response::into_inner)
        }
    });
    let mut tasks = Vec::new();
    for call in calls {
        tasks.push(tokio::spawn(call));
    }
    let mut granted = 0;
    for task in tasks {
        let response = task.await.unwrap().unwrap();
        if summary(&response).1 == ReasonCode::Granted {
            granted += 1;
        }
    }
    assert_eq!(granted, 10);
    harness.stop().await;
}

/// With `--audit-in-flight`, batch transactions overlap (as those of separate replicas do), at
/// most that many at once, and a ceiling stays exact across them: every call is counted in one
/// transaction, whose counter rows it locks.
async fn commits_in_flight_overlap_and_keep_the_ceiling_exact(kind: Kind) {
    for in_flight in [1, 3] {
        let harness = Harness::start(kind, |config| {
            config.store_timeout = Duration::from_secs(5);
            config.audit_in_flight = in_flight;
            // One capped call per transaction, so that 40 of them make 40 batches.
            config.audit_batch = 1;
        })
        .await;
        harness
            .publish(&example_with_ceiling(10), Some(CATALOG))
            .await
            .unwrap();
        // Each counted batch waits a little before its transaction, so that batches started
        // together are under way together.
        harness.store.stall_counting_ms.store(30, Ordering::SeqCst);
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let mut client = harness.decisions();
                tokio::spawn(async move {
                    client
                        .decide(for_capability(ana(), "tickets.issue.read"))
                        .await
                        .map(tonic::Response::into_inner)
                })
            })
            .collect();
        let mut granted = 0;
        for task in tasks {
            let response = task.await.unwrap().unwrap();
            if summary(&response).1 == ReasonCode::Granted {
                granted += 1;
            }
        }
        assert_eq!(granted, 10, "{in_flight} in flight");
        let capped = harness
            .audit()
            .await
            .into_iter()
            .filter(|record| record.capability.as_deref() == Some("tickets.issue.read"))
            .count();
        assert_eq!(capped, 40, "one record per call, {in_flight} in flight");
        let most = harness.store.commits.most.load(Ordering::SeqCst);
        assert_eq!(most, in_flight as u64, "the most transactions at once");
        harness.stop().await;
    }
}

async fn a_retried_request_id_returns_the_original_and_consumes_nothing(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness
        .publish(&example_with_ceiling(2), Some(CATALOG))
        .await
        .unwrap();
    let with_id = |id: &str| DecideRequest {
        request_id: id.into(),
        ..for_capability(ana(), "tickets.issue.read")
    };
    let first = harness.decide(with_id("req-1")).await.unwrap();
    let retry = harness.decide(with_id("req-1")).await.unwrap();
    assert_eq!(retry, first);
    assert_eq!(decision(&first).limits.as_ref().map(|l| l.remaining), Some(1));
    // One call was consumed, not two: one more allow, then the ceiling.
    let second = harness.decide(with_id("req-2")).await.unwrap();
    assert_eq!(summary(&second).1, ReasonCode::Granted);
    let third = harness.decide(with_id("req-3")).await.unwrap();
    assert_eq!(summary(&third).1, ReasonCode::LimitExhausted);
    // Each request id was decided once; the retry is recorded as a replay of req-1's decision.
    let audit = harness.audit().await;
    let decided: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| r.outcome != RecordOutcome::Replayed)
        .collect();
    assert_eq!(decided.len(), 3);
    let first_records: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| r.request_id.as_deref() == Some("req-1"))
        .collect();
    assert_eq!(first_records.len(), 2, "{first_records:#?}");
    let replay = first_records
        .iter()
        .find(|r| r.outcome == RecordOutcome::Replayed)
        .expect("the retry's record");
    assert_eq!(
        replay.first_decision_id.as_deref(),
        Some(first.decision_id.as_str())
    );
    harness.stop().await;
}

async fn concurrent_decisions_each_get_exactly_one_audit_record(kind: Kind) {
    let harness = Harness::start(kind, |config| config.store_timeout = Duration::from_secs(5)).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let requests = [
        for_capability(ana(), "tickets.issue.read"),
        for_capability(ana(), "tickets.issue.write"),
        for_tool(ana(), "knowledge__search_pages"),
        for_tool(ana(), "nowhere__nothing"),
        for_capability(principal("partners", "x", &[]), "docs.page.search"),
    ];
    let count = 100;
    let mut tasks = Vec::new();
    for index in 0..count {
        let request = requests[index % requests.len()].clone();
        let mut client = harness.decisions();
        tasks.push(tokio::spawn(async move {
            client.decide(request).await.map(tonic::Response::into_inner)
        }));
    }
    let mut responses = Vec::new();
    for task in tasks {
        responses.push(task.await.unwrap().unwrap());
    }
    let audit = harness.audit().await;
    assert_eq!(audit.len(), count);
    for response in &responses {
        let record = audit
            .iter()
            .find(|r| r.decision_id == response.decision_id)
            .expect("every answer has its record");
        assert_eq!(record.outcome.as_str(), recorded_outcome(response));
    }
    harness.stop().await;
}

// ── Counter and audit store failures ──────────────────────────────────────

async fn a_failing_counter_store_denies_capped_calls_and_allows_uncapped_ones(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let payments = || {
        for_capability(
            principal(
                "mesh",
                "CN=pay",
                &[("org", &["Acme Corp"]), ("unit", &["payments"])],
            ),
            "billing.refund.create",
        )
    };
    let usage_unknown = (
        Outcome::Deny,
        ReasonCode::UsageUnknown,
        "/grants/7".to_owned(),
        "payments-bot".to_owned(),
    );
    // Counting that fails is unknown usage, never zero (a counter that answered
    // 0 here would allow), and the call is still answered and recorded.
    harness.store.counters_down.store(true, Ordering::SeqCst);
    assert_eq!(summary(&harness.decide(payments()).await.unwrap()), usage_unknown);
    assert_eq!(summary(&harness.decide(payments()).await.unwrap()), usage_unknown);
    // An uncapped grant does not need the counters at all.
    let uncapped = harness
        .decide(for_capability(principal("staff", "dee", &[]), "docs.page.search"))
        .await
        .unwrap();
    assert_eq!(summary(&uncapped).1, ReasonCode::Granted);
    harness.store.counters_down.store(false, Ordering::SeqCst);
    // Nothing was counted while it failed: the first counted call opens the window.
    let recovered = harness.decide(payments()).await.unwrap();
    assert_eq!(summary(&recovered).1, ReasonCode::Granted);
    assert_eq!(
        decision(&recovered).limits.as_ref().map(|l| l.remaining),
        Some(19)
    );
    let audit = harness.audit().await;
    assert_eq!(
        audit
            .iter()
            .filter(|r| r.code.map(|code| code.as_str()) == Some("usage_unknown"))
            .count(),
        2
    );
    harness.stop().await;
}

async fn without_a_spool_an_unwritable_audit_fails_the_call(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    harness.store.audit_down.store(true, Ordering::SeqCst);
    let status = harness
        .decide(for_capability(principal("staff", "dee", &[]), "docs.page.search"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    harness.store.audit_down.store(false, Ordering::SeqCst);
    assert!(harness.audit().await.is_empty());
    harness.stop().await;
}

async fn with_a_spool_decisions_go_on_and_records_arrive_later(kind: Kind) {
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_owned();
    let harness = Harness::start(kind, |config| {
        config.audit_spool = Some(spool_dir.clone());
        config.audit_timeout = Duration::from_millis(200);
    })
    .await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    harness.store.audit_down.store(true, Ordering::SeqCst);
    let answered = harness
        .decide(for_capability(principal("staff", "dee", &[]), "docs.page.search"))
        .await
        .unwrap();
    assert_eq!(summary(&answered).1, ReasonCode::Granted);
    let spooled: usize = std::fs::read_dir(&spool_dir)
        .unwrap()
        .map(|entry| {
            std::fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .lines()
                .count()
        })
        .sum();
    assert_eq!(spooled, 1);
    assert!(harness.audit().await.is_empty());

    harness.store.audit_down.store(false, Ordering::SeqCst);
    // The record is committed first and its file removed after, so each is
    // waited for on its own.
    let mut replayed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if harness
            .audit()
            .await
            .iter()
            .any(|r| r.decision_id == answered.decision_id)
        {
            replayed = true;
            break;
        }
    }
    assert!(replayed, "the spooled record reaches the store");
    let mut emptied = false;
    for _ in 0..50 {
        if std::fs::read_dir(&spool_dir).unwrap().count() == 0 {
            emptied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(emptied, "the spool is emptied");
    harness.stop().await;
}

/// With a spool, a capped call whose batch has not begun committing by the deadline is answered
/// `usage_unknown` and spooled as such — and its transaction, when it gets to its commit, must not
/// count it: the gate rolls it back (docs/decisions/0025). A call answered `usage_unknown` but
/// counted would take a call from the window that nobody was allowed.
async fn a_capped_call_spooled_past_its_deadline_is_never_counted(kind: Kind) {
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_owned();
    let harness = Harness::start(kind, |config| {
        config.audit_spool = Some(spool_dir.clone());
        config.store_timeout = Duration::from_millis(50);
        config.audit_timeout = Duration::from_secs(2);
    })
    .await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let payments = for_capability(
        principal(
            "mesh",
            "CN=pay",
            &[("org", &["Acme Corp"]), ("unit", &["payments"])],
        ),
        "billing.refund.create",
    );
    harness.store.stall_counting_ms.store(400, Ordering::SeqCst);
    let answered = harness.decide(payments.clone()).await.unwrap();
    assert_eq!(
        summary(&answered).1,
        ReasonCode::UsageUnknown,
        "answered at the deadline"
    );
    // The stalled transaction reaches its commit after the answer, and must roll back.
    tokio::time::sleep(Duration::from_millis(700)).await;
    harness.store.stall_counting_ms.store(0, Ordering::SeqCst);
    let key = CounterKey {
        principal_id: "mesh:CN=pay",
        capability: "billing.refund.create",
    };
    assert_eq!(
        harness.store.inner.read_usage(key).await.unwrap(),
        None,
        "the abandoned batch counted nothing"
    );
    // The store answers again: the next capped call is counted as the window's first.
    let mut recovered = None;
    for _ in 0..50 {
        let answer = harness.decide(payments.clone()).await.unwrap();
        if summary(&answer).1 == ReasonCode::Granted {
            recovered = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = recovered.expect("capped calls are allowed again once the store keeps up");
    assert_eq!(
        decision(&recovered).limits.as_ref().map(|l| l.remaining),
        Some(19)
    );
    harness.stop().await;
}

// ── ListVisible ───────────────────────────────────────────────────────────

async fn list_visible_lists_tools_in_catalog_order_and_records_what_was_visible(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let response = harness
        .decisions()
        .list_visible(ListVisibleRequest {
            caller: Some(list_visible_request::Caller::Principal(principal(
                "staff",
                "bo",
                &[("dept", &["support"]), ("level", &["senior"])],
            ))),
            request_id: "list-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let Some(list_visible_response::Result::Visible(visible)) = &response.result else {
        panic!("expected a listing, got {:?}", response.result);
    };
    let tools: Vec<&str> = visible.tools.iter().map(|t| t.exposed_name.as_str()).collect();
    assert_eq!(
        tools,
        [
            "helpdesk__comment_ticket",
            "helpdesk__get_ticket",
            "helpdesk__list_tickets",
            "helpdesk-legacy__fetch_case",
            "knowledge__search_pages",
            "knowledge__semantic_search",
        ]
    );
    assert!(visible.tools[1].input_schema_json.contains("ticketId"));
    let capabilities: Vec<(&str, &str)> = visible
        .capabilities
        .iter()
        .map(|c| (c.capability.as_str(), c.path.as_str()))
        .collect();
    assert_eq!(
        capabilities,
        [
            ("tickets.issue.read", "/grants/0"),
            ("tickets.issue.write", "/grants/1"),
            ("docs.page.search", "/grants/3"),
        ]
    );
    // One record for the listing, which every listed capability names: how many were visible
    // and which.
    let audit = harness.audit().await;
    assert_eq!(audit.len(), 1);
    let record = &audit[0];
    assert!(visible
        .capabilities
        .iter()
        .all(|capability| capability.decision_id == record.decision_id));
    assert_eq!(
        (
            record.kind.as_str(),
            record.outcome.as_str(),
            record.principal_id.as_deref(),
            record.request_id.as_deref(),
            record.visible_count,
        ),
        ("list", "allow", Some("staff:bo"), Some("list-1"), Some(3))
    );
    assert_eq!(
        record.visible,
        ["tickets.issue.read", "tickets.issue.write", "docs.page.search"]
    );
    // A listing consults no ceiling: the suspended grant still lists its tool.
    let finance = harness
        .decisions()
        .list_visible(ListVisibleRequest {
            caller: Some(list_visible_request::Caller::Principal(principal(
                "staff",
                "fin",
                &[("dept", &["finance"])],
            ))),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let Some(list_visible_response::Result::Visible(visible)) = &finance.result else {
        panic!("expected a listing");
    };
    assert!(visible
        .tools
        .iter()
        .any(|t| t.exposed_name == "payments__issue_refund"));
    harness.stop().await;
}

// ── Bounds ────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bound_is_invalid_argument_naming_the_field() {
    let harness = Harness::start(Kind::Sqlite, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let long = |n: usize| "x".repeat(n);
    let many = |n: usize| -> Vec<(String, Vec<String>)> {
        (0..n).map(|i| (format!("a{i}"), vec!["v".to_owned()])).collect()
    };
    let asserted = |subject: String, attributes: Vec<(String, Vec<String>)>| AssertedPrincipal {
        issuer: "staff".into(),
        subject,
        attributes: attributes
            .into_iter()
            .map(|(name, values)| Attribute { name, values })
            .collect(),
    };
    let cases: Vec<(DecideRequest, &str)> = vec![
        (
            for_capability(asserted(long(1025), vec![]), "docs.page.search"),
            "principal.subject",
        ),
        (
            for_capability(
                AssertedPrincipal {
                    issuer: long(513),
                    ..asserted("ana".into(), vec![])
                },
                "docs.page.search",
            ),
            "principal.issuer",
        ),
        (
            for_capability(asserted("ana".into(), many(65)), "docs.page.search"),
            "principal.attributes",
        ),
        (
            for_capability(
                asserted("ana".into(), vec![(long(1025), vec!["v".into()])]),
                "docs.page.search",
            ),
            "principal.attributes[0].name",
        ),
        (
            for_capability(
                asserted("ana".into(), vec![("dept".into(), vec![long(1025)])]),
                "docs.page.search",
            ),
            "principal.attributes[0].values[0]",
        ),
        (
            for_capability(
                asserted("ana".into(), vec![("dept".into(), vec!["v".into(); 65])]),
                "docs.page.search",
            ),
            "principal.attributes[0].values",
        ),
        (for_capability(ana(), &long(513)), "capability"),
        (for_tool(ana(), &long(513)), "tool"),
        (
            DecideRequest {
                request_id: long(129),
                ..for_capability(ana(), "docs.page.search")
            },
            "request_id",
        ),
        (
            DecideRequest {
                caller: None,
                ..for_capability(ana(), "docs.page.search")
            },
            "caller",
        ),
        (
            DecideRequest {
                target: None,
                ..for_capability(ana(), "docs.page.search")
            },
            "target",
        ),
    ];
    for (request, field) in cases {
        let status = harness.decide(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(violations(&status), [field]);
        assert!(
            status.message().contains(&format!("`{field}`")),
            "{}",
            status.message()
        );
    }
    // At the limits, a request is fine.
    let edge = for_capability(asserted(long(1024), many(64)), "docs.page.search");
    assert!(harness.decide(edge).await.is_ok());

    let listing = harness
        .decisions()
        .list_visible(ListVisibleRequest {
            caller: None,
            request_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&listing), ["caller"]);

    // An artifact over 8 MiB never reaches the compiler.
    let huge = format!("{POLICY}\n#{}\n", long(8 * 1024 * 1024));
    let status = harness.publish(&huge, None).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(violations(&status), ["artifact"]);
    // Nothing was recorded for refused requests.
    assert_eq!(harness.audit().await.len(), 1);
    harness.stop().await;
}

// ── Who may call ──────────────────────────────────────────────────────────

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

async fn tokens_are_required_and_roles_enforced(kind: Kind) {
    let harness = Harness::start(kind, |config| {
        config.gateway_tokens = vec![Token::new("edge-gw", b"gateway-secret")];
        config.asserting_gateway_tokens = vec![Token::new("trusted-gw", b"trusted-secret")];
        config.admin_tokens = vec![Token::new("ops", b"admin-secret")];
    })
    .await;
    let publish = || PublishPolicyRequest {
        artifact: POLICY.into(),
        catalog: Some(CATALOG.into()),
        ..Default::default()
    };
    let mut policies = harness.policies();
    let no_token = policies.publish_policy(publish()).await.unwrap_err();
    assert_eq!(no_token.code(), Code::Unauthenticated);
    let gateway = policies
        .publish_policy(with_token(publish(), "gateway-secret"))
        .await
        .unwrap_err();
    assert_eq!(gateway.code(), Code::PermissionDenied);
    let reading = policies
        .list_policy_versions(with_token(
            ListPolicyVersionsRequest { limit: 0 },
            "gateway-secret",
        ))
        .await
        .unwrap_err();
    assert_eq!(reading.code(), Code::PermissionDenied);
    assert!(harness.store.list_policies(10).await.unwrap().is_empty());
    let published = policies
        .publish_policy(with_token(publish(), "admin-secret"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.revision, 1);

    let mut decisions = harness.decisions();
    let ask = || for_capability(ana(), "docs.page.search");
    let missing = decisions.decide(ask()).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    let wrong = decisions
        .decide(with_token(ask(), "gateway-secreT"))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    assert!(!wrong.message().contains("gateway-secreT"));
    // A gateway not trusted to assert may not name the principal itself.
    let asserting = decisions
        .decide(with_token(ask(), "gateway-secret"))
        .await
        .unwrap_err();
    assert_eq!(asserting.code(), Code::PermissionDenied);
    assert!(asserting.message().contains("edge-gw"));
    let answered = decisions
        .decide(with_token(ask(), "trusted-secret"))
        .await
        .unwrap()
        .into_inner();
    let by_admin = decisions
        .decide(with_token(ask(), "admin-secret"))
        .await
        .unwrap()
        .into_inner();

    let audit = harness.audit().await;
    assert_eq!(audit.len(), 2, "refused calls write nothing");
    let gateway_of = |id: &str| {
        audit
            .iter()
            .find(|r| r.decision_id == id)
            .map(|r| r.gateway.clone())
    };
    assert_eq!(gateway_of(&answered.decision_id).as_deref(), Some("trusted-gw"));
    assert_eq!(gateway_of(&by_admin.decision_id).as_deref(), Some("ops"));
    let version = harness.store.active_policy().await.unwrap().unwrap();
    assert_eq!(version.author, "ops");
    // No token value ever reaches the audit trail.
    let everything = format!("{audit:?}");
    for secret in ["gateway-secret", "trusted-secret", "admin-secret"] {
        assert!(!everything.contains(secret));
    }
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_addresses_without_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let config = Config::new(vec!["127.0.0.1:0".parse().unwrap(), "0.0.0.0:0".parse().unwrap()]);
    match service::start(store.clone(), config).await {
        Err(StartError::Config(ConfigError::UnauthenticatedNetwork(addr))) => {
            assert_eq!(addr, "0.0.0.0:0".parse().unwrap());
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("started on 0.0.0.0 without tokens"),
    }
    // With a token, the same addresses are fine.
    let mut config = Config::new(vec!["0.0.0.0:0".parse().unwrap()]);
    config.gateway_tokens.push(Token::new("gw", b"s"));
    let running = service::start(store, config).await.expect("starts with tokens");
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_listen_publishes_nothing() {
    // The README's tour beside a running service: the same port. The start fails on the port,
    // before it touches the store (it used to publish its policy first).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let mut config = Config::new(vec![taken.local_addr().unwrap()]);
    config.policy = Some(PolicyFile {
        artifact: POLICY.into(),
        catalog: Some(CATALOG.into()),
    });
    match service::start(store.clone(), config).await {
        Err(StartError::Bind { addr, .. }) => assert_eq!(addr, taken.local_addr().unwrap()),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("started on a taken port"),
    }
    // Its HTTP port taken instead: the same.
    let mut config = Config::new(vec!["127.0.0.1:0".parse().unwrap()]);
    config.http_listen = vec![taken.local_addr().unwrap()];
    config.policy = Some(PolicyFile {
        artifact: POLICY.into(),
        catalog: Some(CATALOG.into()),
    });
    assert!(matches!(
        service::start(store.clone(), config).await,
        Err(StartError::Bind { .. })
    ));
    store.migrate().await.unwrap();
    assert!(
        store.list_policies(10).await.unwrap().is_empty(),
        "nothing was published"
    );
}

// ── Operations ────────────────────────────────────────────────────────────

async fn health_follows_the_active_policy_and_reflection_lists_the_services(kind: Kind) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let harness = Harness::start(kind, |_| {}).await;
    let mut health = HealthClient::new(harness.channel.clone());
    let status = |name: &str| {
        let mut health = health.clone();
        let name = name.to_owned();
        async move {
            health
                .check(HealthCheckRequest { service: name })
                .await
                .unwrap()
                .into_inner()
                .status()
        }
    };
    let names = ["", "capgate.v1.DecisionService", "capgate.v1.PolicyService"];
    for name in names {
        assert_eq!(status(name).await, ServingStatus::NotServing, "{name:?}");
    }
    // Fail closed: no policy, no decisions.
    let refused = harness
        .decide(for_capability(ana(), "docs.page.search"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(harness.audit().await.is_empty());

    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    for name in names {
        assert_eq!(status(name).await, ServingStatus::Serving, "{name:?}");
    }
    let _ = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();

    // Reflection: what `grpcurl list` shows.
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let mut reflection = ServerReflectionClient::new(harness.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("expected a service list");
    };
    let mut services: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    services.sort();
    // Every service the port serves, the doors' included.
    let served = [
        "agentgateway.dev.ext_mcp.ExtMcp",
        "capgate.v1.DecisionService",
        "capgate.v1.PolicyService",
        "envoy.service.auth.v3.Authorization",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    assert_eq!(services, served);
    // The error details INVALID_ARGUMENT carries, and Envoy's check, resolve by reflection.
    for symbol in ["google.rpc.BadRequest", "envoy.service.auth.v3.CheckRequest"] {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
        };
        let mut answers = reflection
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().expect("one answer");
        assert!(
            matches!(answer.message_response, Some(MessageResponse::FileDescriptorResponse(ref files)) if !files.file_descriptor_proto.is_empty()),
            "{symbol}: {answer:?}"
        );
    }

    // The same through v1alpha, which grpcio-reflection and older grpcurl builds speak.
    {
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        let mut reflection = ServerReflectionClient::new(harness.channel.clone());
        let requests = vec![
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            },
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol(
                    "google.rpc.BadRequest".into(),
                )),
            },
        ];
        let mut answers = reflection
            .server_reflection_info(tokio_stream::iter(requests))
            .await
            .unwrap()
            .into_inner();
        let listed = answers.message().await.unwrap().expect("a service list");
        let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
            panic!("expected a service list");
        };
        let mut listed: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        listed.sort();
        assert_eq!(listed, served);
        let resolved = answers.message().await.unwrap().expect("a file");
        assert!(
            matches!(resolved.message_response, Some(MessageResponse::FileDescriptorResponse(ref files)) if !files.file_descriptor_proto.is_empty()),
            "{resolved:?}"
        );
    }
    harness.stop().await;
}

// ── What a thin gateway needs ─────────────────────────────────────────────

/// The next revision a watch sends, within `within`.
async fn next_revision(
    stream: &mut tonic::Streaming<capgate::wire::proto::PolicyRevision>,
    within: Duration,
) -> Option<u64> {
    tokio::time::timeout(within, stream.message())
        .await
        .expect("the watch answers in time")
        .expect("the watch does not fail")
        .map(|revision| revision.policy_revision)
}

async fn watch_policy_streams_the_active_version_and_ends_on_stop(kind: Kind) {
    use capgate::wire::proto::WatchPolicyRequest;
    let harness = Harness::start(kind, |_| {}).await;
    let mut early = harness
        .decisions()
        .watch_policy(WatchPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    // Nothing is active: nothing is sent (a gateway lists nothing until something is).
    assert!(
        tokio::time::timeout(Duration::from_millis(300), early.message())
            .await
            .is_err(),
        "a watch said something before any version was active"
    );
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    assert_eq!(next_revision(&mut early, Duration::from_secs(2)).await, Some(1));
    harness
        .publish(&example_with_ceiling(7), Some(CATALOG))
        .await
        .unwrap();
    assert_eq!(next_revision(&mut early, Duration::from_secs(2)).await, Some(2));
    // A publish that changes nothing installs nothing, so nothing is sent.
    harness
        .publish(&example_with_ceiling(7), Some(CATALOG))
        .await
        .unwrap();
    // A watcher that joins now starts where things stand.
    let mut late = harness
        .decisions()
        .watch_policy(WatchPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(2), late.message())
        .await
        .unwrap()
        .unwrap()
        .expect("the active version");
    assert_eq!(first.policy_revision, 2);
    assert!(first.policy_version.starts_with("sha256:"));
    assert!(first.installed_at.is_some());
    // Stopping ends every watch instead of waiting for it.
    tokio::time::timeout(Duration::from_secs(10), harness.stop())
        .await
        .expect("a watch does not hold the server open");
    for stream in [&mut early, &mut late] {
        let ended = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the watch ends with the server");
        assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    }
}

async fn a_gateway_notes_what_happened_after_its_allow(kind: Kind) {
    use capgate::wire::proto::{NoteDecisionRequest, NoteKind};
    let harness = Harness::start(kind, |config| {
        config.asserting_gateway_tokens = vec![
            Token::new("gw-a", b"gateway-a-secret"),
            Token::new("gw-b", b"gateway-b-secret"),
        ];
        config.admin_tokens = vec![Token::new("ops", b"admin-secret")];
    })
    .await;
    let mut policies = harness.policies();
    policies
        .publish_policy(with_token(
            PublishPolicyRequest {
                artifact: POLICY.into(),
                catalog: Some(CATALOG.into()),
                ..Default::default()
            },
            "admin-secret",
        ))
        .await
        .unwrap();
    let mut decisions = harness.decisions();
    let allowed = decisions
        .decide(with_token(
            for_capability(ana(), "docs.page.search"),
            "gateway-a-secret",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded_outcome(&allowed), "allow");
    let denied = decisions
        .decide(with_token(
            for_capability(ana(), "billing.refund.create"),
            "gateway-a-secret",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded_outcome(&denied), "deny");
    let note = |decision_id: &str, kind: NoteKind, detail: &str| NoteDecisionRequest {
        decision_id: decision_id.into(),
        kind: kind.into(),
        detail: detail.into(),
    };
    let failed = "no resolver for scheme `gcp-secrets`";

    // Only the gateway that was given the allow may note it; a deny or an unknown id has none.
    for (request, token) in [
        (
            note(&allowed.decision_id, NoteKind::CredentialFailed, failed),
            "gateway-b-secret",
        ),
        (
            note(&denied.decision_id, NoteKind::CredentialFailed, failed),
            "gateway-a-secret",
        ),
        (
            note(
                "01934b5e-0000-7000-8000-000000000000",
                NoteKind::UpstreamFailed,
                "",
            ),
            "gateway-a-secret",
        ),
        (
            note("not-an-id", NoteKind::UpstreamFailed, ""),
            "gateway-a-secret",
        ),
    ] {
        let refused = decisions
            .note_decision(with_token(request, token))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    }
    // A malformed note names its field.
    for (request, field) in [
        (note(&allowed.decision_id, NoteKind::Unspecified, failed), "kind"),
        (
            note(&allowed.decision_id, NoteKind::UpstreamFailed, &"x".repeat(1025)),
            "detail",
        ),
        (note("", NoteKind::UpstreamFailed, failed), "decision_id"),
        (
            note(&allowed.decision_id, NoteKind::UpstreamFailed, "a\0b"),
            "detail",
        ),
    ] {
        let refused = decisions
            .note_decision(with_token(request, "gateway-a-secret"))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        let fields: Vec<String> = refused
            .get_details_bad_request()
            .expect("field violations")
            .field_violations
            .into_iter()
            .map(|violation| violation.field)
            .collect();
        assert_eq!(fields, [field], "{refused:?}");
    }
    assert!(harness
        .store
        .decision_notes(std::slice::from_ref(&allowed.decision_id))
        .await
        .unwrap()
        .is_empty());

    // Noted twice (a retried call), kept once; the record itself is unchanged.
    for _ in 0..2 {
        decisions
            .note_decision(with_token(
                note(&allowed.decision_id, NoteKind::CredentialFailed, failed),
                "gateway-a-secret",
            ))
            .await
            .unwrap();
    }
    decisions
        .note_decision(with_token(
            note(
                &allowed.decision_id,
                NoteKind::UpstreamFailed,
                "connection refused",
            ),
            "gateway-a-secret",
        ))
        .await
        .unwrap();
    let notes = harness
        .store
        .decision_notes(&[allowed.decision_id.clone(), denied.decision_id.clone()])
        .await
        .unwrap();
    let seen: Vec<(&str, &str, &str)> = notes
        .iter()
        .map(|note| (note.gateway.as_str(), note.kind.as_str(), note.detail.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("gw-a", "credential_failed", failed),
            ("gw-a", "upstream_failed", "connection refused")
        ]
    );
    let record = harness
        .audit()
        .await
        .into_iter()
        .find(|record| record.decision_id == allowed.decision_id)
        .unwrap();
    assert_eq!(record.outcome, capgate::store::RecordOutcome::Allow);
    harness.stop().await;
}

/// A lost answer is noted only beside a stored record that says something else, once
/// (docs/decisions/0031): a denied caller beside an allow, no decision beside a deny; nothing
/// beside a record that says what the caller received, nor for a decision with no record.
async fn a_lost_answer_is_noted_only_where_the_record_says_otherwise(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let allowed = harness
        .decide(for_capability(ana(), "docs.page.search"))
        .await
        .unwrap();
    let denied = harness
        .decide(for_capability(ana(), "billing.refund.create"))
        .await
        .unwrap();
    assert_eq!(
        (recorded_outcome(&allowed), recorded_outcome(&denied)),
        ("allow", "deny")
    );
    let lost = |decision_id: &str, received: Option<(RecordOutcome, &str)>| LostAnswer {
        decision_id: decision_id.to_owned(),
        gateway: "loopback".to_owned(),
        at_ms: 1,
        received: received.map(|(outcome, code)| (outcome, code.to_owned())),
    };
    let denied_code = recorded_code(code(&denied));
    for (answer, noted) in [
        // What the record says: nothing to correct.
        (
            lost(&allowed.decision_id, Some((RecordOutcome::Allow, "granted"))),
            false,
        ),
        (
            lost(&denied.decision_id, Some((RecordOutcome::Deny, &denied_code))),
            false,
        ),
        // No record of the decision.
        (lost("01934b5e-0000-7000-8000-000000000000", None), false),
        (lost("not-an-id", None), false),
        // The record says otherwise: noted, once.
        (
            lost(&allowed.decision_id, Some((RecordOutcome::Deny, "usage_unknown"))),
            true,
        ),
        (
            lost(&allowed.decision_id, Some((RecordOutcome::Deny, "usage_unknown"))),
            false,
        ),
        (lost(&denied.decision_id, None), true),
    ] {
        let stored = harness.store.correct_lost_answer(&answer).await.unwrap();
        assert_eq!(stored, noted, "{answer:?}");
    }
    let notes = harness
        .store
        .decision_notes(&[allowed.decision_id.clone(), denied.decision_id.clone()])
        .await
        .unwrap();
    let seen: Vec<(&str, Note, &str)> = notes
        .iter()
        .map(|note| (note.decision_id.as_str(), note.kind, note.detail.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                allowed.decision_id.as_str(),
                Note::AnswerLost,
                "the caller received deny usage_unknown: the commit that stored this record lost its answer"
            ),
            (
                denied.decision_id.as_str(),
                Note::AnswerLost,
                "the caller received no decision (UNAVAILABLE): the commit that stored this record lost \
                 its answer"
            ),
        ]
    );
    harness.stop().await;
}

async fn denials_say_why_in_words_and_when_a_ceiling_resets(kind: Kind) {
    use capgate::wire::proto::Unauthenticated;
    let harness = Harness::start(kind, |_| {}).await;
    harness
        .publish(&example_with_ceiling(1), Some(CATALOG))
        .await
        .unwrap();
    let first = harness.decide(support::client::capped()).await.unwrap();
    let limits = decision(&first).limits.clone().expect("a ceiling applies");
    assert!(decision(&first).resets_at.is_none(), "an allow has no retry time");
    let reason = decision(&first).reason.clone().unwrap();
    assert!(reason.message.contains("tickets.issue.read"), "{reason:?}");

    // The exhausted window ends when the allow said it would.
    let second = harness.decide(support::client::capped()).await.unwrap();
    assert_eq!(summary(&second).1, ReasonCode::LimitExhausted);
    assert_eq!(decision(&second).resets_at, limits.resets_at);
    let reason = decision(&second).reason.clone().unwrap();
    assert!(reason.message.contains("exhausted"), "{reason:?}");

    // Other denials have words and no retry time.
    let nobody = harness
        .decide(for_capability(ana(), "billing.refund.create"))
        .await
        .unwrap();
    assert_eq!(decision(&nobody).resets_at, None);
    let words = &decision(&nobody).reason.as_ref().unwrap().message;
    assert!(
        words.contains("no grant") && words.contains("billing.refund.create"),
        "{words}"
    );
    let blank = harness
        .decide(for_capability(principal("staff", " ", &[]), "docs.page.search"))
        .await
        .unwrap();
    let Some(decide_response::Result::Unauthenticated(Unauthenticated { problem, message })) = &blank.result
    else {
        panic!("{blank:?}");
    };
    assert_eq!(*problem, AuthProblem::CredentialMissing as i32);
    assert!(message.contains("no credential"), "{message}");
    let unknown = harness.decide(for_tool(ana(), "helpdesk__nope")).await.unwrap();
    let Some(decide_response::Result::UnknownTool(unknown)) = &unknown.result else {
        panic!("{unknown:?}");
    };
    assert!(unknown.message.contains("`helpdesk__nope`"), "{unknown:?}");
    harness.stop().await;
}

async fn stopping_finishes_in_flight_calls_and_flushes_the_audit(kind: Kind) {
    let harness = Harness::start(kind, |_| {}).await;
    harness.publish(POLICY, Some(CATALOG)).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let mut client = harness.decisions();
        tasks.push(tokio::spawn(async move {
            client
                .decide(for_capability(principal("staff", "dee", &[]), "docs.page.search"))
                .await
        }));
    }
    let Harness {
        running,
        store,
        place,
        ..
    } = harness;
    // Let the calls reach the server, then stop it while some are in flight.
    tokio::time::sleep(Duration::from_millis(20)).await;
    running.unwrap().stop().await.expect("a clean stop");
    let mut answered = Vec::new();
    for task in tasks {
        if let Ok(response) = task.await.unwrap() {
            answered.push(response.into_inner().decision_id);
        }
    }
    let audit = store
        .query_audit(&AuditFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    for id in &answered {
        assert!(
            audit.iter().any(|r| &r.decision_id == id),
            "answered {id} without a record"
        );
    }
    drop(place);
}

// ── The command line against a server ─────────────────────────────────────

/// Runs `capgate ARGS` in this process, on a thread of its own (the service
/// commands start their own runtime).
fn capgate(args: &[&str]) -> capgate::cli::Outcome {
    let args: Vec<String> = std::iter::once("capgate")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    std::thread::spawn(move || capgate::cli::run(args, &mut std::io::empty()))
        .join()
        .expect("the command does not panic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_publishes_lists_activates_and_reads_the_audit() {
    use capgate::cli::Exit;

    let harness = Harness::start(Kind::Sqlite, |_| {}).await;
    let server = format!("http://{}", harness.running.as_ref().unwrap().addrs[0]);
    let files = harness.place.dir.path();
    let write = |name: &str, text: &str| {
        let path = files.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let good = write("policy.yaml", POLICY);
    let tighter = write("tighter.yaml", &example_with_ceiling(300));
    let catalog = write("catalog.yaml", CATALOG);
    let bad = write(
        "bad.yaml",
        &POLICY.replacen("using: helpdesk-reader", "using: docs-writer", 1),
    );

    // Rejected: the diagnostics as `validate` prints them, exit 1.
    let rejected = capgate(&["publish", &bad, "--server", &server]);
    assert_eq!(rejected.exit, Exit::Findings, "{rejected:?}");
    assert!(
        rejected
            .stdout
            .contains(&format!("{bad}:129:12  error  unknown_account_in_grant")),
        "{}",
        rejected.stdout
    );
    assert!(
        rejected.stdout.contains("using: docs-writer"),
        "the source line is shown"
    );

    let published = capgate(&[
        "publish",
        &good,
        "--catalog",
        &catalog,
        "--server",
        &server,
        "--comment",
        "first",
    ]);
    assert_eq!(published.exit, Exit::Done, "{published:?}");
    assert!(
        published.stdout.contains("published: revision 1"),
        "{}",
        published.stdout
    );
    assert!(
        published.stdout.contains("catalog_tool_unmapped"),
        "warnings are shown"
    );

    let conflict = capgate(&[
        "publish",
        &tighter,
        "--catalog",
        &catalog,
        "--server",
        &server,
        "--expected-revision",
        "0",
    ]);
    assert_eq!(conflict.exit, Exit::Findings);
    assert!(
        conflict.stderr.contains("not the expected revision 0"),
        "{}",
        conflict.stderr
    );

    let dry = capgate(&[
        "publish",
        &tighter,
        "--catalog",
        &catalog,
        "--server",
        &server,
        "--dry-run",
    ]);
    assert_eq!(dry.exit, Exit::Done);
    assert!(
        dry.stdout.contains("dry run:") && dry.stdout.contains("3 decisions change"),
        "{}",
        dry.stdout
    );

    let second = capgate(&["publish", &tighter, "--catalog", &catalog, "--server", &server]);
    assert!(
        second.stdout.contains("published: revision 2"),
        "{}",
        second.stdout
    );
    // A dry run of what is active says which revision it already is.
    let same = capgate(&[
        "publish",
        &tighter,
        "--catalog",
        &catalog,
        "--server",
        &server,
        "--dry-run",
    ]);
    assert_eq!(same.exit, Exit::Done);
    assert!(
        same.stdout.contains("unchanged: revision 2 already is"),
        "{}",
        same.stdout
    );

    let listed = capgate(&["policies", "list", "--server", &server]);
    assert_eq!(listed.exit, Exit::Done);
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", listed.stdout);
    assert!(
        lines[0].starts_with("*     2") && lines[1].starts_with("      1"),
        "{}",
        listed.stdout
    );
    assert!(lines[1].ends_with("loopback  first"), "{}", listed.stdout);

    let rolled = capgate(&["policies", "activate", "1", "--server", &server]);
    assert_eq!(rolled.exit, Exit::Done, "{rolled:?}");
    assert!(rolled.stdout.contains("activated: revision 1"));
    // Every command takes `--json`, its errors included.
    let parse = |outcome: &capgate::cli::Outcome| -> serde_json::Value {
        serde_json::from_str(&outcome.stdout).unwrap_or_else(|_| panic!("JSON: {outcome:?}"))
    };
    let tighter_json = capgate(&[
        "publish",
        &tighter,
        "--catalog",
        &catalog,
        "--server",
        &server,
        "--dry-run",
        "--json",
    ]);
    assert_eq!(tighter_json.exit, Exit::Done, "{tighter_json:?}");
    let document = parse(&tighter_json);
    assert_eq!(
        (
            &document["accepted"],
            &document["dry_run"],
            &document["unchanged"],
            &document["revision"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(true),
            &serde_json::json!(false),
            &serde_json::Value::Null
        ),
        "{document}"
    );
    // Revision 1 is active again, so the tighter version would change three decisions.
    assert_eq!(
        document["changes"].as_array().map(Vec::len),
        Some(3),
        "{document}"
    );
    assert!(document["policy"]["version"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    let versions = parse(&capgate(&["policies", "list", "--json", "--server", &server]));
    let listed: Vec<(u64, bool)> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|version| {
            (
                version["revision"].as_u64().unwrap(),
                version["active"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, [(2, false), (1, true)], "{versions}");
    let nowhere = capgate(&[
        "decide",
        "--server",
        "http://127.0.0.1:1",
        "--issuer",
        "staff",
        "--subject",
        "ana",
        "--capability",
        "x",
        "--json",
    ]);
    assert_eq!(nowhere.exit, Exit::Input, "{nowhere:?}");
    assert_eq!(parse(&nowhere)["error"]["exit"], 3, "{nowhere:?}");

    // A compare-and-set conflict is a finding, as for `publish`: exit 1.
    let stale = capgate(&[
        "policies",
        "activate",
        "2",
        "--expected-revision",
        "2",
        "--server",
        &server,
    ]);
    assert_eq!(stale.exit, Exit::Findings, "{stale:?}");
    assert!(stale.stderr.starts_with("error: "), "{}", stale.stderr);
    let stale_json = capgate(&[
        "policies",
        "activate",
        "2",
        "--expected-revision",
        "2",
        "--json",
        "--server",
        &server,
    ]);
    assert_eq!(parse(&stale_json)["error"]["exit"], 1, "{stale_json:?}");
    let missing = capgate(&["policies", "activate", "9", "--server", &server]);
    assert_eq!(missing.exit, Exit::Input);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);

    // One decision, then the audit trail from the store.
    harness
        .decide(for_capability(ana(), "tickets.issue.read"))
        .await
        .unwrap();
    harness
        .decide(for_capability(ana(), "tickets.issue.write"))
        .await
        .unwrap();
    let url = format!("sqlite://{}", files.join("capgate.db").display());
    let denied = capgate(&["audit", "--outcome", "deny", "--json", "--database-url", &url]);
    assert_eq!(denied.exit, Exit::Done, "{denied:?}");
    let records: serde_json::Value = serde_json::from_str(&denied.stdout).unwrap();
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["code"], "no_grant_matches");
    assert_eq!(records[0]["principal_id"], "staff:ana");
    let human = capgate(&["audit", "--principal", "staff:ana", "--database-url", &url]);
    assert_eq!(human.stdout.lines().count(), 2, "{}", human.stdout);
    assert!(human.stdout.contains("allow") && human.stdout.contains("account=helpdesk-reader"));
    let unreachable = capgate(&["policies", "list", "--server", "http://127.0.0.1:1"]);
    assert_eq!(unreachable.exit, Exit::Input);
    harness.stop().await;
}
