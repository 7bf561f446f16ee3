//! The store's behavioural suite: one set of scenarios, each run against
//! SQLite and against PostgreSQL (STYLE.md, "interchangeable peripheries").
//!
//! Every scenario is an `async fn name<S: Store>(store: S)` (or
//! `(store: S, replica: S)` when two replicas must race), and `suite!` runs
//! it twice, as `sqlite::name` and `postgres::name`:
//!
//! * SQLite: a fresh database file under the temporary directory, removed
//!   afterwards.
//! * PostgreSQL: a fresh database `capgate_test_…` on the server in
//!   `DATABASE_URL`, dropped afterwards. Without `DATABASE_URL` the
//!   PostgreSQL variants say they were skipped and pass — unless
//!   `CAPGATE_REQUIRE_POSTGRES=1` (scripts/test.sh sets it), where the
//!   absence fails them.
//!
//! `replica` is a second store opened on the same database, as another
//! process would. A scenario that must do what the store would never do (a
//! constraint the schema lacks, a row no store writes) takes `raw: Raw`
//! instead, the database itself. A few tests at the end are specific to one
//! dialect (notifications, the journal mode, URL handling).

mod support;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use capgate::store::retention::{self, Period};
use capgate::store::{
    connect, ActivateOutcome, Activation, ActivationKind, Actor, AnyStore, AuditCursor, AuditFilter,
    AuditGroup, AuditRecord, Claim, CommitGate, CounterAsk, CounterKey, CounterReading, Door, Fingerprint,
    GroupKey, NewPolicy, PostgresStore, PrunedPeriod, PublishOutcome, RecordCode, RecordKind, RecordOutcome,
    Remembered, RememberedEntry, SqliteStore, Store, StoreError, StoreOptions, StoredCounter, StoredPolicy,
    Tally, UsageReset,
};
use capgate_core::access::ReasonCode;
use capgate_core::principals::AuthProblem;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, SqliteConnection};
use support::counting::{consume, Consumed};
use support::postgres::{server_url, through_transaction_pooler, TestDatabase};
use support::unique;

// ── The suite ─────────────────────────────────────────────────────────────

macro_rules! suite {
    (
        single: [$($one:ident),* $(,)?],
        pair: [$($two:ident),* $(,)?],
        raw: [$($raw:ident),* $(,)?] $(,)?
    ) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $one() {
                    super::on_sqlite(|store, _replica, _raw| super::$one(store)).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $two() {
                    super::on_sqlite(|store, replica, _raw| super::$two(store, replica)).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $raw() {
                    super::on_sqlite(|store, _replica, raw| super::$raw(store, raw)).await;
                }
            )*
        }

        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $one() {
                    super::on_postgres(|store, _replica, _database| super::$one(store)).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $two() {
                    super::on_postgres(|store, replica, _database| super::$two(store, replica)).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $raw() {
                    super::on_postgres(|store, _replica, database| {
                        super::$raw(store, super::Raw::Postgres(Box::new(database)))
                    })
                    .await;
                }
            )*
        }
    };
}

suite! {
    single: [
        migrating_again_changes_nothing,
        nothing_is_active_at_first,
        publishing_stores_and_activates,
        identical_content_is_a_no_op,
        publish_compares_and_sets,
        versions_list_newest_first,
        activating_rolls_back,
        every_activation_is_recorded_with_its_actor,
        counters_are_listed_and_reset_on_record,
        audit_groups_are_counted_by_the_store,
        a_follow_reads_forward_from_its_cursor,
        first_call_opens_a_window,
        calls_stop_at_the_ceiling,
        an_expired_window_restarts,
        a_window_starting_later_has_not_expired,
        a_zero_ceiling_takes_nothing,
        a_batch_counts_in_arrival_order_with_its_records,
        a_batch_over_many_counters_counts_each,
        an_abandoned_or_refused_batch_counts_nothing,
        audit_records_round_trip,
        audit_queries_filter,
        appending_again_changes_nothing,
        a_large_batch_round_trips_in_order,
        remembered_responses_round_trip,
        a_request_id_is_claimed_once,
        the_request_key_is_drawn_once,
        expired_request_ids_are_forgotten,
        pruning_drops_whole_months_before_the_cutoff,
        a_dry_run_drops_nothing,
        records_far_from_the_prepared_months_are_kept,
        replaying_across_months_changes_nothing,
        prepared_months_take_records,
    ],
    pair: [
        concurrent_publishes_one_wins,
        the_ceiling_holds_under_concurrency,
        batches_of_many_counters_on_two_replicas_queue_and_stay_exact,
        concurrent_claims_one_wins,
    ],
    raw: [
        a_failed_batch_leaves_nothing,
        an_unreadable_stored_value_fails_the_read,
    ],
}

// ── Policy versions ───────────────────────────────────────────────────────

async fn migrating_again_changes_nothing<S: Store>(store: S) {
    let published = activated(store.publish(policy(1), None).await.expect("publish"));
    store.migrate().await.expect("second migration");
    store.migrate().await.expect("third migration");
    assert_eq!(
        store.active_policy().await.expect("active"),
        Some(published.clone())
    );
    assert_eq!(store.list_policies(10).await.expect("list"), vec![published]);
}

async fn nothing_is_active_at_first<S: Store>(store: S) {
    assert_eq!(store.active_policy().await.expect("active"), None);
    assert_eq!(store.list_policies(10).await.expect("list"), vec![]);
    assert_eq!(store.policy(1).await.expect("policy"), None);
    assert_eq!(store.policy(u64::MAX).await.expect("policy"), None);
}

async fn publishing_stores_and_activates<S: Store>(store: S) {
    let first = activated(store.publish(policy(1), None).await.expect("publish"));
    assert_eq!(first, stored(1, policy(1)));
    assert_eq!(store.active_policy().await.expect("active"), Some(first.clone()));
    assert_eq!(store.policy(1).await.expect("policy"), Some(first.clone()));

    let with_catalog = NewPolicy {
        catalog: Some("tools: []\n".to_owned()),
        ..policy(2)
    };
    let second = activated(store.publish(with_catalog.clone(), None).await.expect("publish"));
    assert_eq!(second, stored(2, with_catalog));
    assert_eq!(store.active_policy().await.expect("active"), Some(second));
    assert_eq!(store.policy(1).await.expect("policy"), Some(first));
}

async fn identical_content_is_a_no_op<S: Store>(store: S) {
    let first = activated(store.publish(policy(1), None).await.expect("publish"));
    // Only the version and the catalog count: author, comment and time do not.
    let again = NewPolicy {
        author: "bob".to_owned(),
        comment: "again".to_owned(),
        created_at_ms: 9,
        ..policy(1)
    };
    assert_eq!(
        store.publish(again, None).await.expect("publish"),
        PublishOutcome::Unchanged(first.clone())
    );
    // A stale expectation does not refuse what already holds.
    assert_eq!(
        store.publish(policy(1), Some(0)).await.expect("publish"),
        PublishOutcome::Unchanged(first.clone())
    );
    assert_eq!(store.list_policies(10).await.expect("list"), vec![first.clone()]);

    // Same artifact, another catalog: a new version.
    let catalogued = NewPolicy {
        catalog: Some("tools: []\n".to_owned()),
        ..policy(1)
    };
    let second = activated(store.publish(catalogued, None).await.expect("publish"));
    assert_eq!(second.revision, 2);
    // Content equal to a stored but inactive version is stored again.
    let third = activated(store.publish(policy(1), None).await.expect("publish"));
    assert_eq!(third, stored(3, policy(1)));
}

async fn publish_compares_and_sets<S: Store>(store: S) {
    assert_eq!(
        store.publish(policy(1), Some(1)).await.expect("publish"),
        PublishOutcome::Conflict { active: None }
    );
    let first = activated(store.publish(policy(1), Some(0)).await.expect("publish"));
    assert_eq!(
        store.publish(policy(2), Some(0)).await.expect("publish"),
        PublishOutcome::Conflict { active: Some(1) }
    );
    assert_eq!(
        store.publish(policy(2), Some(7)).await.expect("publish"),
        PublishOutcome::Conflict { active: Some(1) }
    );
    // Nothing changed on conflict.
    assert_eq!(store.active_policy().await.expect("active"), Some(first.clone()));
    assert_eq!(store.list_policies(10).await.expect("list"), vec![first]);

    let second = activated(store.publish(policy(2), Some(1)).await.expect("publish"));
    assert_eq!(second.revision, 2);
}

async fn versions_list_newest_first<S: Store>(store: S) {
    for n in 1..=3 {
        store.publish(policy(n), None).await.expect("publish");
    }
    assert_eq!(
        revisions(&store.list_policies(10).await.expect("list")),
        [3, 2, 1]
    );
    assert_eq!(revisions(&store.list_policies(2).await.expect("list")), [3, 2]);
    assert_eq!(revisions(&store.list_policies(0).await.expect("list")), [0u64; 0]);
}

async fn activating_rolls_back<S: Store>(store: S) {
    let first = activated(store.publish(policy(1), None).await.expect("publish"));
    let second = activated(store.publish(policy(2), None).await.expect("publish"));

    assert_eq!(
        store.activate(1, Some(2), &admin()).await.expect("activate"),
        ActivateOutcome::Activated(first.clone())
    );
    assert_eq!(store.active_policy().await.expect("active"), Some(first.clone()));
    // Already active: answered, whatever the expectation.
    assert_eq!(
        store.activate(1, Some(5), &admin()).await.expect("activate"),
        ActivateOutcome::Activated(first.clone())
    );
    assert_eq!(
        store.activate(2, Some(2), &admin()).await.expect("activate"),
        ActivateOutcome::Conflict { active: Some(1) }
    );
    assert_eq!(
        store.activate(99, None, &admin()).await.expect("activate"),
        ActivateOutcome::NotFound
    );
    assert_eq!(
        store.activate(u64::MAX, None, &admin()).await.expect("activate"),
        ActivateOutcome::NotFound
    );
    assert_eq!(store.active_policy().await.expect("active"), Some(first));

    assert_eq!(
        store.activate(2, None, &admin()).await.expect("activate"),
        ActivateOutcome::Activated(second.clone())
    );
    assert_eq!(store.active_policy().await.expect("active"), Some(second));
    assert_eq!(
        store.list_policies(10).await.expect("list").len(),
        2,
        "activating stores nothing"
    );
}

async fn concurrent_publishes_one_wins<S: Store>(store: S, replica: S) {
    let mut active = 0;
    for round in 0..10 {
        let (left, right) = tokio::join!(
            store.publish(policy(2 * round), Some(active)),
            replica.publish(policy(2 * round + 1), Some(active)),
        );
        let outcomes = [left.expect("publish"), right.expect("publish")];
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                PublishOutcome::Activated(policy) => Some(policy.revision),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert!(
            outcomes.contains(&PublishOutcome::Conflict {
                active: Some(winners[0])
            }),
            "round {round}: {outcomes:?}"
        );
        active = winners[0];
    }
    assert_eq!(store.list_policies(100).await.expect("list").len(), 10);
}

/// Each change of the active version leaves one row, written with it: a publish under its
/// author, an activation under the actor it was given; a no-op or a refusal leaves none.
async fn every_activation_is_recorded_with_its_actor<S: Store>(store: S) {
    store.publish(policy(1), None).await.expect("publish");
    store.publish(policy(2), None).await.expect("publish");
    // Unchanged, conflicting, already active, not found: nothing changed, nothing is recorded.
    store.publish(policy(2), None).await.expect("unchanged");
    store.publish(policy(3), Some(9)).await.expect("conflict");
    store.activate(2, None, &admin()).await.expect("already active");
    store.activate(99, None, &admin()).await.expect("not found");
    store.activate(1, None, &admin()).await.expect("rollback");
    let expected = [
        Activation {
            at_ms: admin().at_ms,
            actor: "ops-admin".to_owned(),
            kind: ActivationKind::Rollback,
            from_revision: Some(2),
            to_revision: 1,
        },
        Activation {
            at_ms: policy(2).created_at_ms,
            actor: "alice".to_owned(),
            kind: ActivationKind::Publish,
            from_revision: Some(1),
            to_revision: 2,
        },
        Activation {
            at_ms: policy(1).created_at_ms,
            actor: "alice".to_owned(),
            kind: ActivationKind::Publish,
            from_revision: None,
            to_revision: 1,
        },
    ];
    assert_eq!(store.activations(10).await.expect("history"), expected);
    assert_eq!(store.activations(1).await.expect("history"), expected[..1]);
}

/// A principal's counters are read by capability; a reset removes one and records who did and
/// what it read, and the next call opens a fresh window.
async fn counters_are_listed_and_reset_on_record<S: Store>(store: S) {
    let read = CounterKey {
        principal_id: "staff:ana",
        capability: "tickets.read",
    };
    let write = CounterKey {
        capability: "tickets.write",
        ..read
    };
    let other = CounterKey {
        principal_id: "staff:bo",
        ..read
    };
    for _ in 0..3 {
        taken(&store, read, 1_000, 10).await;
    }
    taken(&store, write, 2_000, 10).await;
    taken(&store, other, 2_000, 10).await;
    let counter = |key: CounterKey<'_>, reading| StoredCounter {
        principal_id: key.principal_id.to_owned(),
        capability: key.capability.to_owned(),
        reading,
    };
    assert_eq!(
        store.counters("staff:ana", None, 10).await.expect("counters"),
        [
            counter(read, counted(3, 1_000)),
            counter(write, counted(1, 2_000))
        ]
    );
    assert_eq!(
        store
            .counters("staff:ana", Some("tickets.write"), 10)
            .await
            .expect("counters"),
        [counter(write, counted(1, 2_000))]
    );
    assert_eq!(
        store
            .counters("staff:ana", None, 1)
            .await
            .expect("counters")
            .len(),
        1
    );
    assert_eq!(
        store.reset_usage(read, &admin()).await.expect("reset"),
        Some(counted(3, 1_000))
    );
    // Nothing to reset: nothing is recorded.
    assert_eq!(store.reset_usage(read, &admin()).await.expect("reset"), None);
    assert_eq!(
        store.counters("staff:ana", None, 10).await.expect("counters"),
        [counter(write, counted(1, 2_000))]
    );
    assert_eq!(
        store.counters("staff:bo", None, 10).await.expect("counters"),
        [counter(other, counted(1, 2_000))],
        "another principal's counter is untouched"
    );
    let reset = UsageReset {
        at_ms: admin().at_ms,
        actor: "ops-admin".to_owned(),
        principal_id: "staff:ana".to_owned(),
        capability: "tickets.read".to_owned(),
        reading: counted(3, 1_000),
    };
    assert_eq!(
        store.usage_resets("staff:ana", None, 10).await.expect("resets"),
        [reset]
    );
    assert_eq!(
        store
            .usage_resets("staff:ana", Some("tickets.write"), 10)
            .await
            .expect("resets"),
        []
    );
    // The window the reset forgave is gone: the next call opens one at its own instant.
    assert_eq!(taken(&store, read, 1_500, 10).await, counted(1, 1_500));
}

/// `GROUP BY` in the store: counts, first and last instants, most records first, then by the
/// values with an empty one last; the filter applies before the grouping, the limit to groups.
async fn audit_groups_are_counted_by_the_store<S: Store>(store: S) {
    let with = |record: AuditRecord, account: Option<&str>, path: &str| AuditRecord {
        account_id: account.map(str::to_owned),
        path: Some(path.to_owned()),
        ..record
    };
    let records = vec![
        with(
            record(1, 1_000, "staff:ana", "billing.refund", "allow", "granted"),
            Some("billing"),
            "/grants/0",
        ),
        with(
            record(2, 2_000, "staff:ana", "billing.refund", "allow", "granted"),
            Some("billing"),
            "/grants/0",
        ),
        with(
            record(3, 3_000, "staff:bo", "billing.refund", "allow", "granted"),
            Some("billing"),
            "/grants/1",
        ),
        with(
            record(4, 4_000, "staff:bo", "billing.read", "allow", "granted"),
            Some("billing"),
            "/grants/2",
        ),
        with(
            record(5, 5_000, "staff:cy", "billing.refund", "deny", "no_grant_matches"),
            None,
            "/capabilities/0",
        ),
        // Upper case sorts before lower case bytewise, whatever the database's collation.
        with(
            record(6, 6_000, "Staff:Dee", "billing.read", "allow", "granted"),
            Some("billing"),
            "/grants/2",
        ),
    ];
    store.append_audit(&records, &[]).await.expect("append");
    let group = |values: &[Option<&str>], records: u64, first: i64, last: i64| AuditGroup {
        values: values.iter().map(|value| value.map(str::to_owned)).collect(),
        records,
        first_at_ms: first,
        last_at_ms: last,
    };
    let billing = AuditFilter {
        account_id: Some("billing".to_owned()),
        ..all(10)
    };
    assert_eq!(
        store
            .audit_groups(&billing, &[GroupKey::Principal, GroupKey::Path])
            .await
            .expect("groups"),
        [
            group(&[Some("staff:ana"), Some("/grants/0")], 2, 1_000, 2_000),
            group(&[Some("Staff:Dee"), Some("/grants/2")], 1, 6_000, 6_000),
            group(&[Some("staff:bo"), Some("/grants/1")], 1, 3_000, 3_000),
            group(&[Some("staff:bo"), Some("/grants/2")], 1, 4_000, 4_000),
        ]
    );
    // An empty value (a denial has no account) is a group of its own, last among equals.
    assert_eq!(
        store
            .audit_groups(
                &AuditFilter {
                    capability: Some("billing.refund".to_owned()),
                    ..all(10)
                },
                &[GroupKey::Account],
            )
            .await
            .expect("groups"),
        [
            group(&[Some("billing")], 3, 1_000, 3_000),
            group(&[None], 1, 5_000, 5_000)
        ]
    );
    assert_eq!(
        store
            .audit_groups(
                &AuditFilter {
                    since_ms: Some(2_000),
                    until_ms: Some(5_000),
                    ..all(1)
                },
                &[GroupKey::Outcome]
            )
            .await
            .expect("groups"),
        [group(&[Some("allow")], 3, 2_000, 4_000)]
    );
    assert_eq!(
        store
            .audit_groups(
                &AuditFilter {
                    principal_id: Some("nobody".to_owned()),
                    ..all(10)
                },
                &[GroupKey::Code]
            )
            .await
            .expect("groups"),
        []
    );
}

/// The new filters, and reading forward from a cursor: oldest first, strictly after it in
/// (`at`, `decision_id`) order, so records at the cursor's instant with a later id still come.
async fn a_follow_reads_forward_from_its_cursor<S: Store>(store: S) {
    let mut records = vec![
        record(1, 1_000, "staff:ana", "tickets.read", "allow", "granted"),
        record(2, 2_000, "staff:ana", "tickets.read", "allow", "granted"),
        record(3, 2_000, "staff:bo", "tickets.read", "allow", "granted"),
        record(4, 3_000, "staff:bo", "tickets.read", "allow", "granted"),
    ];
    records[1].tool = Some("helpdesk__get_ticket".to_owned());
    records[2].gateway = "other".to_owned();
    records[2].request_id = Some("req-7".to_owned());
    records[3].kind = RecordKind::List;
    store.append_audit(&records, &[]).await.expect("append");
    let ids = |filter: AuditFilter| {
        let store = store.clone();
        async move {
            store
                .query_audit(&filter)
                .await
                .expect("query")
                .into_iter()
                .map(|record| record.decision_id)
                .collect::<Vec<_>>()
        }
    };
    let forward = |at_ms: i64, id: &str| AuditFilter {
        after: Some(AuditCursor {
            at_ms,
            decision_id: id.to_owned(),
        }),
        oldest_first: true,
        ..all(10)
    };
    assert_eq!(ids(forward(1_000, "d1")).await, ["d2", "d3", "d4"]);
    assert_eq!(ids(forward(2_000, "d2")).await, ["d3", "d4"]);
    assert_eq!(ids(forward(2_000, "d3")).await, ["d4"]);
    assert_eq!(ids(forward(3_000, "d4")).await, [""; 0]);
    assert_eq!(
        ids(AuditFilter {
            oldest_first: true,
            ..all(2)
        })
        .await,
        ["d1", "d2"]
    );
    let only = |filter: AuditFilter| ids(filter);
    assert_eq!(
        only(AuditFilter {
            tool: Some("helpdesk__get_ticket".to_owned()),
            ..all(10)
        })
        .await,
        ["d2"]
    );
    assert_eq!(
        only(AuditFilter {
            gateway: Some("other".to_owned()),
            ..all(10)
        })
        .await,
        ["d3"]
    );
    assert_eq!(
        only(AuditFilter {
            request_id: Some("req-7".to_owned()),
            ..all(10)
        })
        .await,
        ["d3"]
    );
    assert_eq!(
        only(AuditFilter {
            kind: Some("list".to_owned()),
            ..all(10)
        })
        .await,
        ["d4"]
    );
    assert_eq!(
        only(AuditFilter {
            decision_id: Some("d1".to_owned()),
            ..all(10)
        })
        .await,
        ["d1"]
    );
    assert_eq!(
        only(AuditFilter {
            gateway: Some("edge".to_owned()),
            ..forward(1_000, "d1")
        })
        .await,
        ["d2", "d4"]
    );
}

// ── Usage counters ────────────────────────────────────────────────────────

const WINDOW_MS: u64 = 60_000;

async fn first_call_opens_a_window<S: Store>(store: S) {
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    assert_eq!(store.read_usage(key).await.expect("read"), None);
    assert_eq!(taken(&store, key, 1_000, 3).await, counted(1, 1_000));
    assert_eq!(
        store.read_usage(key).await.expect("read"),
        Some(counted(1, 1_000))
    );
}

async fn calls_stop_at_the_ceiling<S: Store>(store: S) {
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    assert_eq!(taken(&store, key, 1_000, 3).await, counted(1, 1_000));
    assert_eq!(taken(&store, key, 2_000, 3).await, counted(2, 1_000));
    assert_eq!(taken(&store, key, 3_000, 3).await, counted(3, 1_000));
    assert_eq!(consume(&store, key, 4_000, WINDOW_MS, 3).await, Consumed::Refused);
    assert_eq!(
        store.read_usage(key).await.expect("read"),
        Some(counted(3, 1_000))
    );
    // A higher ceiling (a new policy) lets the same window go on.
    assert_eq!(taken(&store, key, 5_000, 4).await, counted(4, 1_000));

    // Counters are per principal and per capability.
    let other_capability = CounterKey {
        principal_id: "alice",
        capability: "tickets.write",
    };
    let other_principal = CounterKey {
        principal_id: "bob",
        capability: "tickets.read",
    };
    assert_eq!(taken(&store, other_capability, 6_000, 3).await, counted(1, 6_000));
    assert_eq!(taken(&store, other_principal, 7_000, 3).await, counted(1, 7_000));
}

async fn an_expired_window_restarts<S: Store>(store: S) {
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    for _ in 0..3 {
        taken(&store, key, 1_000, 3).await;
    }
    // One millisecond before the window ends: still full.
    assert_eq!(
        consume(&store, key, 60_999, WINDOW_MS, 3).await,
        Consumed::Refused
    );
    // `at − window_start ≥ window`: a new window with one call.
    assert_eq!(taken(&store, key, 61_000, 3).await, counted(1, 61_000));
    assert_eq!(taken(&store, key, 61_001, 3).await, counted(2, 61_000));

    // A window below its ceiling restarts all the same.
    assert_eq!(taken(&store, key, 500_000, 3).await, counted(1, 500_000));
}

async fn a_window_starting_later_has_not_expired<S: Store>(store: S) {
    // Another replica's clock was ahead: its window starts after our `at`.
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    assert_eq!(taken(&store, key, 10_000, 3).await, counted(1, 10_000));
    assert_eq!(taken(&store, key, 5_000, 3).await, counted(2, 10_000));
    assert_eq!(taken(&store, key, 5_000, 3).await, counted(3, 10_000));
    assert_eq!(consume(&store, key, 5_000, WINDOW_MS, 3).await, Consumed::Refused);

    // Extreme windows neither overflow nor expire.
    let forever = CounterKey {
        principal_id: "alice",
        capability: "forever",
    };
    assert_eq!(
        consume(&store, forever, 0, u64::MAX, 1).await,
        Consumed::Taken(counted(1, 0))
    );
    assert_eq!(
        consume(&store, forever, i64::MAX, u64::MAX, 1).await,
        Consumed::Refused
    );
    assert_eq!(consume(&store, forever, i64::MIN, 1, 1).await, Consumed::Refused);
    // … except the one difference as large as the window itself.
    let ends = CounterKey {
        principal_id: "alice",
        capability: "ends",
    };
    let opened = consume(&store, ends, i64::MIN, u64::MAX, 1).await;
    assert_eq!(opened, Consumed::Taken(counted(1, i64::MIN)));
    let restarted = consume(&store, ends, i64::MAX, u64::MAX, 1).await;
    assert_eq!(restarted, Consumed::Taken(counted(1, i64::MAX)));
}

async fn a_zero_ceiling_takes_nothing<S: Store>(store: S) {
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    assert_eq!(consume(&store, key, 1_000, WINDOW_MS, 0).await, Consumed::Refused);
    assert_eq!(store.read_usage(key).await.expect("read"), None);
}

/// The property of docs/service.md: across replicas and any concurrency, the
/// allows in one window never exceed the ceiling — and every call up to it is
/// granted once.
async fn the_ceiling_holds_under_concurrency<S: Store>(store: S, replica: S) {
    const TASKS: usize = 64;
    const CALLS_PER_TASK: usize = 4;
    const LIMIT: u64 = 25;

    for window_start in [1_000, 1_000 + WINDOW_MS as i64] {
        let mut tasks = Vec::with_capacity(TASKS);
        for task in 0..TASKS {
            let store = if task % 2 == 0 {
                store.clone()
            } else {
                replica.clone()
            };
            tasks.push(tokio::spawn(async move {
                let key = CounterKey {
                    principal_id: "alice",
                    capability: "tickets.read",
                };
                let mut taken = Vec::new();
                for call in 0..CALLS_PER_TASK {
                    let at = window_start + (call as i64);
                    match consume(&store, key, at, WINDOW_MS, LIMIT).await {
                        Consumed::Taken(counted) => taken.push(counted),
                        Consumed::Refused => {}
                    }
                }
                taken
            }));
        }
        let mut taken = Vec::new();
        for task in tasks {
            taken.extend(task.await.expect("consumer task"));
        }
        let mut calls: Vec<u64> = taken.iter().map(|counted| counted.calls).collect();
        calls.sort_unstable();
        assert_eq!(
            calls,
            (1..=LIMIT).collect::<Vec<_>>(),
            "each call up to the ceiling granted once"
        );
        assert!(
            taken
                .iter()
                .all(|counted| counted.window_start_ms == window_start),
            "{taken:?}"
        );
        let key = CounterKey {
            principal_id: "alice",
            capability: "tickets.read",
        };
        assert_eq!(
            store.read_usage(key).await.expect("read"),
            Some(counted(LIMIT, window_start))
        );
    }
}

/// One batch over more counters than one statement reads (SQLite reads and writes them in chunks
/// of up to 64): 150 counters, those of the even principals already holding a call, each asked
/// twice with a ceiling of 2. Every counter is read and written back, whatever chunk it falls in.
async fn a_batch_over_many_counters_counts_each<S: Store>(store: S) {
    const COUNTERS: usize = 150;
    let nothing = |_: &[Tally]| (Vec::new(), Vec::new());
    let first: Vec<CounterAsk> = (0..COUNTERS)
        .step_by(2)
        .map(|n| ask(&format!("p{n:03}"), 1_000, 2))
        .collect();
    store
        .commit_batch(&first, &[], &[], &nothing, &CommitGate::default())
        .await
        .expect("first batch");
    // Each principal twice, the second round after the first, in an order no sort gives.
    let asks: Vec<CounterAsk> = (0..2 * COUNTERS)
        .map(|n| ask(&format!("p{:03}", (n * 7) % COUNTERS), 2_000, 2))
        .collect();
    let tallies = store
        .commit_batch(&asks, &[], &[], &nothing, &CommitGate::default())
        .await
        .expect("second batch");
    for (n, (ask, tally)) in asks.iter().zip(&tallies).enumerate() {
        let principal: usize = ask.principal_id[1..].parse().expect("p<n>");
        let (held, window) = if principal % 2 == 0 {
            (1, 1_000)
        } else {
            (0, 2_000)
        };
        // A principal's first ask in this batch comes before its second.
        let earlier = asks[..n]
            .iter()
            .any(|other| other.principal_id == ask.principal_id);
        let before = held + u64::from(earlier);
        let expected = if before < 2 {
            Tally::Taken(counted(before + 1, window))
        } else {
            Tally::Refused(counted(2, window))
        };
        assert_eq!(*tally, expected, "ask {n}, {}", ask.principal_id);
    }
    for principal in 0..COUNTERS {
        let principal_id = format!("p{principal:03}");
        let key = CounterKey {
            principal_id: &principal_id,
            capability: "tickets.read",
        };
        let window = if principal % 2 == 0 { 1_000 } else { 2_000 };
        assert_eq!(
            store.read_usage(key).await.expect("read"),
            Some(counted(2, window)),
            "{principal_id}"
        );
    }
}

/// A capped call of `principal` at `at_ms` on `tickets.read`, at most `limit` per window.
fn ask(principal: &str, at_ms: i64, limit: u64) -> CounterAsk {
    CounterAsk {
        principal_id: principal.to_owned(),
        capability: "tickets.read".to_owned(),
        at_ms,
        window_ms: WINDOW_MS,
        limit,
    }
}

/// One record per tally, as the server settles a capped call: `d<first>`, `d<first + 1>`, …,
/// allowed when taken, `limit_exhausted` when refused.
fn settle_from(first: u32) -> impl Fn(&[Tally]) -> (Vec<AuditRecord>, Vec<RememberedEntry>) + Sync {
    move |tallies: &[Tally]| {
        let records = (first..)
            .zip(tallies)
            .map(|(n, tally)| match tally {
                Tally::Taken(now) => AuditRecord {
                    usage_calls: Some(now.calls),
                    ..record(n, 1_000, "alice", "tickets.read", "allow", "granted")
                },
                Tally::Refused(_) => record(n, 1_000, "alice", "tickets.read", "deny", "limit_exhausted"),
            })
            .collect();
        (records, Vec::new())
    }
}

async fn a_batch_counts_in_arrival_order_with_its_records<S: Store>(store: S) {
    let asks = [
        ask("bob", 1_000, 2),
        ask("alice", 1_001, 2),
        ask("bob", 1_002, 2),
        ask("bob", 1_003, 2),
    ];
    let plain = record(1, 1_000, "carol", "tickets.read", "deny", "no_grant_matches");
    let settle = settle_from(10);
    let tallies = store
        .commit_batch(
            &asks,
            std::slice::from_ref(&plain),
            &[],
            &settle,
            &CommitGate::default(),
        )
        .await
        .expect("commit");
    assert_eq!(
        tallies,
        vec![
            Tally::Taken(counted(1, 1_000)),
            Tally::Taken(counted(1, 1_001)),
            Tally::Taken(counted(2, 1_000)),
            Tally::Refused(counted(2, 1_000)),
        ],
        "in arrival order, until bob's window is full"
    );
    let bob = CounterKey {
        principal_id: "bob",
        capability: "tickets.read",
    };
    assert_eq!(
        store.read_usage(bob).await.expect("read"),
        Some(counted(2, 1_000))
    );
    let stored = store.query_audit(&all(10)).await.expect("query");
    let mut ids: Vec<&str> = stored.iter().map(|record| record.decision_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        vec!["d1", "d10", "d11", "d12", "d13"],
        "the batch's records and the settled ones"
    );

    // A ceiling of zero counts nothing and leaves no row behind (PostgreSQL locks a row it
    // inserts for the purpose).
    let nobody = ask("dave", 2_000, 0);
    let tallies = store
        .commit_batch(&[nobody], &[], &[], &settle_from(20), &CommitGate::default())
        .await
        .expect("commit");
    assert_eq!(tallies, vec![Tally::Refused(counted(0, 2_000))]);
    let dave = CounterKey {
        principal_id: "dave",
        capability: "tickets.read",
    };
    assert_eq!(store.read_usage(dave).await.expect("read"), None);
}

async fn an_abandoned_or_refused_batch_counts_nothing<S: Store>(store: S) {
    let key = CounterKey {
        principal_id: "alice",
        capability: "tickets.read",
    };
    // Abandoned by the writer before it could commit: rolled back.
    let gate = CommitGate::default();
    assert!(gate.abandon());
    let abandoned = store
        .commit_batch(&[ask("alice", 1_000, 5)], &[], &[], &settle_from(1), &gate)
        .await;
    assert!(matches!(abandoned, Err(StoreError::Abandoned)), "{abandoned:?}");
    assert_eq!(
        store.read_usage(key).await.expect("read"),
        None,
        "nothing counted"
    );
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![]);

    // A settled record the store refuses (a count past BIGINT) fails the batch, counters included.
    let huge = |_: &[Tally]| {
        let record = AuditRecord {
            limit_calls: Some(u64::MAX),
            ..record(2, 1_000, "alice", "tickets.read", "allow", "granted")
        };
        (vec![record], Vec::new())
    };
    let refused = store
        .commit_batch(&[ask("alice", 1_000, 5)], &[], &[], &huge, &CommitGate::default())
        .await;
    assert!(
        refused.as_ref().is_err_and(StoreError::is_data_error),
        "{refused:?}"
    );
    assert_eq!(
        store.read_usage(key).await.expect("read"),
        None,
        "nothing counted"
    );
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![]);
}

/// Batches of asks over overlapping counters, from two replicas at once: they queue on the
/// counters' locks (taken in one order, so never in a cycle) and every counter ends exactly at
/// its ceiling, with exactly that many calls taken.
async fn batches_of_many_counters_on_two_replicas_queue_and_stay_exact<S: Store>(store: S, replica: S) {
    const TASKS: usize = 16;
    const BATCHES_PER_TASK: usize = 6;
    const PRINCIPALS: usize = 5;
    const LIMIT: u64 = 20;
    let mut tasks = Vec::with_capacity(TASKS);
    for task in 0..TASKS {
        let store = if task % 2 == 0 {
            store.clone()
        } else {
            replica.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut taken = vec![0_u64; PRINCIPALS];
            for batch in 0..BATCHES_PER_TASK {
                // Each batch names the principals in its own rotation, some twice.
                let asks: Vec<CounterAsk> = (0..PRINCIPALS + 2)
                    .map(|n| ask(&format!("p{}", (n + task + batch) % PRINCIPALS), 1_000, LIMIT))
                    .collect();
                let nothing = |_: &[Tally]| (Vec::new(), Vec::new());
                let tallies = store
                    .commit_batch(&asks, &[], &[], &nothing, &CommitGate::default())
                    .await
                    .expect("commit");
                for (ask, tally) in asks.iter().zip(tallies) {
                    if matches!(tally, Tally::Taken(_)) {
                        let principal: usize = ask.principal_id[1..].parse().expect("p<n>");
                        taken[principal] += 1;
                    }
                }
            }
            taken
        }));
    }
    let mut taken = vec![0_u64; PRINCIPALS];
    for task in tasks {
        for (total, of_task) in taken.iter_mut().zip(task.await.expect("batch task")) {
            *total += of_task;
        }
    }
    // 16 × 6 × 7 = 672 asks over 5 counters: every one is full, and no call past its ceiling.
    assert_eq!(taken, vec![LIMIT; PRINCIPALS]);
    for principal in 0..PRINCIPALS {
        let principal_id = format!("p{principal}");
        let key = CounterKey {
            principal_id: &principal_id,
            capability: "tickets.read",
        };
        assert_eq!(
            store.read_usage(key).await.expect("read"),
            Some(counted(LIMIT, 1_000))
        );
    }
}

// ── Audit and idempotency ─────────────────────────────────────────────────

async fn audit_records_round_trip<S: Store>(store: S) {
    let full = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000002".to_owned(),
        at_ms: 1_700_000_000_002,
        request_id: Some("req-1".to_owned()),
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(ReasonCode::Granted)),
        path: Some("/grants/0".to_owned()),
        principal_id: Some("oidc:https://id.example|alice".to_owned()),
        issuer: Some("https://id.example".to_owned()),
        subject: Some("alice".to_owned()),
        capability: Some("tickets.read".to_owned()),
        tool: Some("jira__get_issue".to_owned()),
        account_id: Some("jira-ro".to_owned()),
        limit_calls: Some(100),
        limit_per: Some("1h".to_owned()),
        usage_calls: Some(42),
        policy_version: Some(format!("sha256:{:064x}", 1)),
        policy_revision: Some(i64::MAX as u64),
        visible_count: None,
        visible: Vec::new(),
        // Not the default, so that the column is seen to round-trip.
        door: Door::ExtAuthz,
        first_decision_id: None,
        // A call's arguments: their digest, and what an operator who opted in keeps of them.
        arguments_digest: Some(format!("sha256:{:064x}", 7)),
        arguments: Some(r#"{"amount":50,"password":"[redacted]"}"#.to_owned()),
        arguments_omitted: Some(20_000),
        // The principal's attributes, which replay decides the record again on.
        attributes: Some(r#"{"dept":"support","tier":"gold"}"#.to_owned()),
        shadow: None,
    };
    // A listing's one record: how many capabilities it showed, and which (here all of them).
    let listing = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000004".to_owned(),
        at_ms: 1_700_000_000_004,
        gateway: "edge".to_owned(),
        kind: RecordKind::List,
        outcome: RecordOutcome::Allow,
        principal_id: Some("staff:ana".to_owned()),
        visible_count: Some(3),
        visible: vec![
            "tickets.issue.read".to_owned(),
            "tickets.issue.write".to_owned(),
            "docs.page.search".to_owned(),
        ],
        ..AuditRecord::default()
    };
    let bare = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000001".to_owned(),
        at_ms: 1_700_000_000_001,
        gateway: "loopback".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Unauthenticated,
        ..AuditRecord::default()
    };
    // The other kind, and a code of the other vocabulary.
    let refused_listing = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000003".to_owned(),
        at_ms: 1_700_000_000_003,
        gateway: "edge".to_owned(),
        kind: RecordKind::List,
        outcome: RecordOutcome::Unauthenticated,
        code: Some(RecordCode::Problem(AuthProblem::CredentialExpired)),
        issuer: Some("https://id.example".to_owned()),
        ..AuditRecord::default()
    };
    // A retry answered with the first answer, and a reuse refused: each names the decision.
    let replay = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000005".to_owned(),
        at_ms: 1_700_000_000_005,
        request_id: Some("req-1".to_owned()),
        gateway: "edge".to_owned(),
        outcome: RecordOutcome::Replayed,
        tool: Some("jira__get_issue".to_owned()),
        first_decision_id: Some(full.decision_id.clone()),
        ..AuditRecord::default()
    };
    let reused = AuditRecord {
        decision_id: "0190a000-0000-7000-8000-000000000006".to_owned(),
        outcome: RecordOutcome::RequestIdReused,
        issuer: Some("https://id.example".to_owned()),
        subject: Some("mallory".to_owned()),
        tool: Some("jira__delete_issue".to_owned()),
        at_ms: 1_700_000_000_006,
        ..replay.clone()
    };
    store
        .append_audit(
            &[
                full.clone(),
                bare.clone(),
                refused_listing.clone(),
                listing.clone(),
                replay.clone(),
                reused.clone(),
            ],
            &[],
        )
        .await
        .expect("append");
    assert_eq!(
        store.query_audit(&all(10)).await.expect("query"),
        vec![reused, replay, listing, refused_listing, full, bare]
    );
}

async fn audit_queries_filter<S: Store>(store: S) {
    let records = vec![
        record(1, 1_000, "alice", "tickets.read", "allow", "granted"),
        record(2, 2_000, "alice", "tickets.write", "deny", "no_grant_matches"),
        record(3, 3_000, "bob", "tickets.read", "deny", "limit_exhausted"),
        record(4, 4_000, "bob", "tickets.write", "allow", "granted"),
        record(5, 4_000, "alice", "tickets.read", "deny", "limit_exhausted"),
        // A tool the catalog does not have: the record has no code.
        AuditRecord {
            decision_id: "d6".to_owned(),
            at_ms: 5_000,
            gateway: "edge".to_owned(),
            kind: RecordKind::Decide,
            outcome: RecordOutcome::UnknownTool,
            principal_id: Some("carol".to_owned()),
            capability: Some("wiki.read".to_owned()),
            ..AuditRecord::default()
        },
    ];
    store.append_audit(&records, &[]).await.expect("append");

    let ids = |filter: AuditFilter| {
        let store = store.clone();
        async move {
            let found = store.query_audit(&filter).await.expect("query");
            found
                .iter()
                .map(|record| record.decision_id.clone())
                .collect::<Vec<_>>()
        }
    };
    // Newest first; the same instant is ordered by decision id.
    assert_eq!(ids(all(10)).await, ["d6", "d5", "d4", "d3", "d2", "d1"]);
    assert_eq!(ids(all(2)).await, ["d6", "d5"]);
    assert_eq!(ids(all(0)).await, [""; 0]);
    assert_eq!(
        ids(AuditFilter {
            principal_id: Some("alice".to_owned()),
            ..all(10)
        })
        .await,
        ["d5", "d2", "d1"]
    );
    assert_eq!(
        ids(AuditFilter {
            capability: Some("tickets.read".to_owned()),
            ..all(10)
        })
        .await,
        ["d5", "d3", "d1"]
    );
    assert_eq!(
        ids(AuditFilter {
            outcome: Some("deny".to_owned()),
            ..all(10)
        })
        .await,
        ["d5", "d3", "d2"]
    );
    assert_eq!(
        ids(AuditFilter {
            code: Some("limit_exhausted".to_owned()),
            ..all(10)
        })
        .await,
        ["d5", "d3"]
    );
    // `since` is inclusive, `until` exclusive.
    assert_eq!(
        ids(AuditFilter {
            since_ms: Some(2_000),
            until_ms: Some(4_000),
            ..all(10)
        })
        .await,
        ["d3", "d2"]
    );
    assert_eq!(
        ids(AuditFilter {
            since_ms: Some(4_000),
            ..all(10)
        })
        .await,
        ["d6", "d5", "d4"]
    );
    assert_eq!(
        ids(AuditFilter {
            until_ms: Some(2_000),
            ..all(10)
        })
        .await,
        ["d1"]
    );
    // Every filter at once must match them all.
    assert_eq!(
        ids(AuditFilter {
            principal_id: Some("alice".to_owned()),
            capability: Some("tickets.read".to_owned()),
            account_id: None,
            outcome: Some("deny".to_owned()),
            code: Some("limit_exhausted".to_owned()),
            since_ms: Some(4_000),
            until_ms: Some(4_001),
            limit: 10,
            ..all(10)
        })
        .await,
        ["d5"]
    );
    assert_eq!(
        ids(AuditFilter {
            principal_id: Some("dave".to_owned()),
            ..all(10)
        })
        .await,
        [""; 0]
    );
    // "Who used the billing account?": the calls that ran as it.
    let billing = AuditRecord {
        account_id: Some("billing-svc".to_owned()),
        ..record(7, 7_000, "bob", "billing.refund", "allow", "granted")
    };
    store.append_audit(&[billing], &[]).await.expect("append");
    assert_eq!(
        ids(AuditFilter {
            account_id: Some("billing-svc".to_owned()),
            ..all(10)
        })
        .await,
        ["d7"]
    );
}

/// A batch of 101 records, each field varied (a batch larger than any statement would hold if an
/// append were split into multi-row statements), with a replayed duplicate among them: every
/// record comes back whole, in order, and the duplicate changes nothing.
async fn a_large_batch_round_trips_in_order<S: Store>(store: S) {
    let records: Vec<AuditRecord> = (0..101_u32)
        .map(|n| {
            let listing = n % 3 == 0;
            AuditRecord {
                decision_id: format!("0190a000-0000-7000-8000-{n:012}"),
                at_ms: 1_700_000_000_000 + i64::from(n),
                request_id: (n % 2 == 0).then(|| format!("req-{n}")),
                gateway: format!("edge-{}", n % 4),
                kind: if listing {
                    RecordKind::List
                } else {
                    RecordKind::Decide
                },
                outcome: if n % 5 == 0 {
                    RecordOutcome::Deny
                } else {
                    RecordOutcome::Allow
                },
                code: Some(RecordCode::Reason(if n % 5 == 0 {
                    ReasonCode::NoGrantMatches
                } else {
                    ReasonCode::Granted
                })),
                path: Some(format!("/grants/{n}")),
                principal_id: Some(format!("staff:p{n}")),
                issuer: Some(format!("https://id{}.example", n % 3)),
                subject: Some(format!("s{n}")),
                capability: (!listing).then(|| format!("cap.{n}")),
                tool: (!listing).then(|| format!("tool__{n}")),
                account_id: Some(format!("acct-{}", n % 7)),
                limit_calls: (n % 2 == 1).then_some(u64::from(n) * 10),
                limit_per: (n % 2 == 1).then(|| "1h".to_owned()),
                usage_calls: (n % 2 == 1).then_some(u64::from(n)),
                policy_version: Some(format!("sha256:{n:064x}")),
                policy_revision: Some(u64::from(n) + 1),
                visible_count: listing.then_some(2),
                visible: if listing {
                    vec![format!("cap.{n}"), "docs.read".to_owned()]
                } else {
                    Vec::new()
                },
                door: if n % 2 == 0 {
                    Door::ExtAuthz
                } else {
                    Door::default()
                },
                first_decision_id: None,
                arguments_digest: (n % 4 == 1).then(|| format!("sha256:{:064x}", n + 7)),
                arguments: (n % 4 == 1).then(|| format!(r#"{{"amount":{n}}}"#)),
                arguments_omitted: (n % 8 == 1).then_some(u64::from(n)),
                attributes: Some(format!(r#"{{"n":{n}}}"#)),
                shadow: None,
            }
        })
        .collect();
    // A spool's replay of record 5, altered, in the second statement's rows: the stored one stays.
    let mut batch = records.clone();
    batch.insert(
        80,
        AuditRecord {
            outcome: RecordOutcome::Deny,
            ..records[5].clone()
        },
    );
    store.append_audit(&batch, &[]).await.expect("append");
    let mut expected = records;
    expected.reverse();
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), expected);
}

async fn appending_again_changes_nothing<S: Store>(store: S) {
    let first = record(1, 1_000, "alice", "tickets.read", "allow", "granted");
    let second = record(2, 2_000, "alice", "tickets.read", "deny", "no_grant_matches");
    store
        .append_audit(&[first.clone(), second.clone()], &[])
        .await
        .expect("append");
    // A spool replaying its records, one of them altered: the stored one stays.
    let altered = AuditRecord {
        outcome: RecordOutcome::Deny,
        ..first.clone()
    };
    store
        .append_audit(&[altered.clone(), second.clone(), altered], &[])
        .await
        .expect("append again");
    assert_eq!(
        store.query_audit(&all(10)).await.expect("query"),
        vec![second, first]
    );
}

/// The gateway [`Raw::refuse_gateway`] makes the database refuse.
const REFUSED_GATEWAY: &str = "refused-by-the-test";

async fn a_failed_batch_leaves_nothing<S: Store>(store: S, raw: Raw) {
    let good = record(1, 1_000, "alice", "tickets.read", "allow", "granted");
    let answer = remembered_answer("d1", b"first");
    // The database refuses a record after the good one: the whole batch,
    // remembered responses included, must be refused with it. (The refusal
    // is the test's constraint, as no value of a typed record breaks the
    // schema's own.)
    raw.refuse_gateway(REFUSED_GATEWAY).await;
    let bad = AuditRecord {
        gateway: REFUSED_GATEWAY.to_owned(),
        ..record(2, 2_000, "bob", "x", "deny", "no_grant_matches")
    };
    let batch = [good.clone(), bad];
    let remember = [("edge".to_owned(), "req-1".to_owned(), answer.clone())];
    let refused = store.append_audit(&batch, &remember).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Database {
                operation: "append_audit",
                ..
            })
        ),
        "an invalid record fails the batch: {refused:?}"
    );
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![]);
    assert_eq!(store.remembered("edge", "req-1").await.expect("remembered"), None);

    // A count past BIGINT is refused too, rather than stored wrong.
    let huge = AuditRecord {
        limit_calls: Some(u64::MAX),
        ..record(3, 3_000, "bob", "x", "deny", "no_grant_matches")
    };
    let refused = store.append_audit(&[good.clone(), huge], &remember).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::OutOfRange {
                column: "limit_calls",
                value: u64::MAX
            })
        ),
        "{refused:?}"
    );
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![]);

    store
        .append_audit(std::slice::from_ref(&good), &remember)
        .await
        .expect("append");
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![good]);
    assert_eq!(
        store.remembered("edge", "req-1").await.expect("remembered"),
        Some(answer)
    );
    store.append_audit(&[], &[]).await.expect("an empty batch");
}

/// A stored value this build cannot read fails the query, naming the column
/// and the value: a code it does not know (one a newer build wrote, say), a
/// negative count.
async fn an_unreadable_stored_value_fails_the_read<S: Store>(store: S, raw: Raw) {
    // The month of the rows below must have its partition before SQL alone
    // inserts into it (PostgreSQL).
    store.prepare_audit_periods(1_000).await.expect("prepare");
    let good = record(1, 1_000, "alice", "tickets.read", "allow", "granted");
    store
        .append_audit(std::slice::from_ref(&good), &[])
        .await
        .expect("append");
    let insert = |values: &str| {
        format!(
            "INSERT INTO audit_log (decision_id, at, gateway, kind, outcome, code, usage_calls) \
             VALUES {values}"
        )
    };
    for (values, column, value) in [
        (
            "('d2', 2000, 'edge', 'decide', 'deny', 'no_grant', NULL)",
            "code",
            "no_grant",
        ),
        (
            "('d2', 2000, 'edge', 'decide', 'allow', 'granted', -1)",
            "usage_calls",
            "-1",
        ),
    ] {
        let sql = insert(values);
        raw.execute(&sql, &sql).await;
        let read = store.query_audit(&all(10)).await;
        assert!(
            matches!(
                &read,
                Err(StoreError::Corrupt { column: c, value: v }) if *c == column && v == value
            ),
            "{read:?}"
        );
        let message = read.unwrap_err().to_string();
        assert!(message.contains(column) && message.contains(value), "{message}");
        raw.execute(
            "DELETE FROM audit_log WHERE decision_id = 'd2'",
            "DELETE FROM audit_log WHERE decision_id = 'd2'",
        )
        .await;
    }
    assert_eq!(store.query_audit(&all(10)).await.expect("query"), vec![good]);
}

/// The fingerprint of request `n` (docs/decisions/0027): a stand-in for the service's digest.
const fn request(n: u8) -> Fingerprint {
    [n; 32]
}

async fn a_request_id_is_claimed_once<S: Store>(store: S) {
    let claim_as = |request_id: &'static str, fingerprint: Fingerprint, now: i64| {
        let store = store.clone();
        async move {
            store
                .claim_request("edge", request_id, &fingerprint, now, now - 30_000)
                .await
                .expect("claim")
        }
    };
    let claim = |request_id: &'static str, now: i64| claim_as(request_id, request(1), now);
    let held_by = |n: u8| Claim::Taken {
        fingerprint: Some(request(n)),
    };
    assert_eq!(claim("req-1", 100_000).await, Claim::Won);
    // Held, not answered yet: whoever comes next finds who holds it (the same request waits for
    // the answer; the pipeline refuses another one).
    assert_eq!(claim("req-1", 100_010).await, held_by(1));
    assert_eq!(claim_as("req-1", request(2), 100_010).await, held_by(1));
    // Another gateway's id of the same spelling is another request.
    assert_eq!(
        store
            .claim_request("other-gateway", "req-1", &request(2), 100_010, 70_010)
            .await
            .expect("claim"),
        Claim::Won
    );
    // Answered: the answer, with the fingerprint of the request it answered, from then on.
    let answer = remembered_answer("d1", b"first");
    store
        .append_audit(&[], &[("edge".to_owned(), "req-1".to_owned(), answer.clone())])
        .await
        .expect("append");
    assert_eq!(claim("req-1", 100_020).await, Claim::Answered(answer.clone()));
    assert_eq!(
        claim_as("req-1", request(2), 100_020).await,
        Claim::Answered(answer.clone())
    );
    // An answer outlives its claim's lease: an answered id is never claimed again.
    assert_eq!(claim("req-1", 500_000).await, Claim::Answered(answer));
    // A claim whose holder never answered is taken over once its lease is over, and only then,
    // and only by the same request: an id names one request.
    assert_eq!(claim("req-2", 100_000).await, Claim::Won);
    assert_eq!(claim("req-2", 129_999).await, held_by(1));
    assert_eq!(claim_as("req-2", request(2), 130_001).await, held_by(1));
    assert_eq!(claim("req-2", 130_001).await, Claim::Won);
    assert_eq!(claim("req-2", 130_002).await, held_by(1));
    // An answer stored without a claim (decided while the store was out of reach, replayed from
    // the spool) stands too.
    let spooled = remembered_answer("d3", b"spooled");
    store
        .append_audit(&[], &[("edge".to_owned(), "req-3".to_owned(), spooled.clone())])
        .await
        .expect("append");
    assert_eq!(claim("req-3", 100_000).await, Claim::Answered(spooled));
    // An answer remembered before fingerprints existed is no request's; a claim of then is held
    // by nobody the pipeline can match, and is never taken over.
    let anonymous = Remembered {
        fingerprint: None,
        ..remembered_answer("d4", b"before")
    };
    store
        .append_audit(&[], &[("edge".to_owned(), "req-4".to_owned(), anonymous.clone())])
        .await
        .expect("append");
    assert_eq!(claim("req-4", 100_000).await, Claim::Answered(anonymous));
}

/// The fingerprint key: drawn by the first replica, then the same for every later one.
async fn the_request_key_is_drawn_once<S: Store>(store: S) {
    let first = store.request_key(&[1; 32]).await.expect("the key");
    assert_eq!(first, [1; 32]);
    assert_eq!(store.request_key(&[2; 32]).await.expect("the key again"), [1; 32]);
}

async fn expired_request_ids_are_forgotten<S: Store>(store: S) {
    let answered_at = |at_ms: i64| Remembered {
        at_ms,
        ..remembered_answer("d", b"answer")
    };
    store
        .append_audit(
            &[],
            &[
                ("edge".to_owned(), "old".to_owned(), answered_at(1_000)),
                ("edge".to_owned(), "recent".to_owned(), answered_at(9_000)),
            ],
        )
        .await
        .expect("append");
    for (request_id, at) in [("old-claim", 1_000), ("recent-claim", 9_000)] {
        let claimed = store
            .claim_request("edge", request_id, &request(1), at, at - 30_000)
            .await;
        assert_eq!(claimed.expect("claim"), Claim::Won);
    }
    assert_eq!(store.forget_requests(5_000).await.expect("forget"), 2);
    assert_eq!(store.remembered("edge", "old").await.expect("read"), None);
    assert_eq!(
        store.remembered("edge", "recent").await.expect("read"),
        Some(answered_at(9_000))
    );
    // The forgotten claim can be made again; the recent one still holds.
    let fingerprint = request(1);
    let claim = |request_id| store.claim_request("edge", request_id, &fingerprint, 9_500, -20_500);
    assert_eq!(claim("old-claim").await.expect("claim"), Claim::Won);
    assert_eq!(
        claim("recent-claim").await.expect("claim"),
        Claim::Taken {
            fingerprint: Some(request(1))
        }
    );
    assert_eq!(store.forget_requests(5_000).await.expect("forget"), 0);
}

/// Copies of one request claiming at once through two handles (two replicas): one wins.
async fn concurrent_claims_one_wins<S: Store>(store: S, replica: S) {
    let claims: Vec<_> = (0..16)
        .map(|index| {
            let store = if index % 2 == 0 {
                store.clone()
            } else {
                replica.clone()
            };
            tokio::spawn(async move {
                store
                    .claim_request("edge", "contested", &request(1), 100_000, 70_000)
                    .await
                    .expect("claim")
            })
        })
        .collect();
    let mut won = 0;
    for claim in claims {
        match claim.await.expect("the claim's task") {
            Claim::Won => won += 1,
            Claim::Taken { fingerprint } => assert_eq!(fingerprint, Some(request(1))),
            Claim::Answered(answer) => panic!("answered without an answer: {answer:?}"),
        }
    }
    assert_eq!(won, 1, "exactly one copy decides");
}

async fn remembered_responses_round_trip<S: Store>(store: S) {
    let first = remembered_answer("d1", &[0, 159, 255, 1]);
    let records = [record(1, 1_000, "alice", "tickets.read", "allow", "granted")];
    let remember = [("edge".to_owned(), "req-1".to_owned(), first.clone())];
    store.append_audit(&records, &remember).await.expect("append");
    assert_eq!(
        store.remembered("edge", "req-1").await.expect("remembered"),
        Some(first.clone())
    );
    // Keyed by gateway and request id together.
    assert_eq!(
        store
            .remembered("other-gateway", "req-1")
            .await
            .expect("remembered"),
        None
    );
    assert_eq!(store.remembered("edge", "req-2").await.expect("remembered"), None);

    // The first answer wins, across batches and within one.
    let later = remembered_answer("d2", b"later");
    store
        .append_audit(&[], &[("edge".to_owned(), "req-1".to_owned(), later.clone())])
        .await
        .expect("append");
    assert_eq!(
        store.remembered("edge", "req-1").await.expect("remembered"),
        Some(first)
    );
    let batch = [
        ("edge".to_owned(), "req-2".to_owned(), later.clone()),
        (
            "edge".to_owned(),
            "req-2".to_owned(),
            remembered_answer("d3", b"third"),
        ),
    ];
    store.append_audit(&[], &batch).await.expect("append");
    assert_eq!(
        store.remembered("edge", "req-2").await.expect("remembered"),
        Some(later)
    );
}

// ── Audit retention ───────────────────────────────────────────────────────

/// Three records in each month from January to June 2025: the month's first
/// millisecond, one in the middle, its last millisecond.
fn spread_over_months() -> Vec<AuditRecord> {
    let mut records = Vec::new();
    for month in 1..=6 {
        let start = utc(2025, month, 1);
        let end = utc(2025, month + 1, 1);
        for (i, at) in [start, start + 14 * DAY_MS + 1_234, end - 1]
            .into_iter()
            .enumerate()
        {
            let n = u32::from(month) * 10 + i as u32;
            records.push(record(n, at, "alice", "tickets.read", "allow", "granted"));
        }
    }
    records
}

/// What a prune reports for a month of 2025 that held `records`; the name
/// and the bounds written out independently of `retention.rs`.
fn month_2025(month: u8, records: u64) -> PrunedPeriod {
    PrunedPeriod {
        name: format!("audit_log_p2025_{month:02}"),
        from_ms: Some(utc(2025, month, 1)),
        until_ms: utc(2025, month + 1, 1),
        records,
    }
}

async fn pruning_drops_whole_months_before_the_cutoff<S: Store>(store: S) {
    store
        .append_audit(&spread_over_months(), &[])
        .await
        .expect("append");
    let before = store.query_audit(&all(1_000)).await.expect("query");
    assert_eq!(before.len(), 18);

    // Mid-April: January to March go; April holds the cutoff and stays whole.
    let cutoff = utc(2025, 4, 15) + 12 * 3_600_000;
    assert_eq!(
        store.prune_audit(cutoff, false).await.expect("prune"),
        [month_2025(1, 3), month_2025(2, 3), month_2025(3, 3)]
    );
    let kept: Vec<AuditRecord> = before
        .iter()
        .filter(|record| record.at_ms >= utc(2025, 4, 1))
        .cloned()
        .collect();
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), kept);
    assert!(
        kept.iter().any(|record| record.at_ms < cutoff),
        "April's records before the cutoff are kept"
    );

    // Nothing more before the same cutoff.
    assert_eq!(store.prune_audit(cutoff, false).await.expect("prune"), []);

    // A cutoff on a month's first instant takes the month before, not that one.
    let may = utc(2025, 5, 1);
    assert_eq!(
        store.prune_audit(may, false).await.expect("prune"),
        [month_2025(4, 3)]
    );
    let kept: Vec<AuditRecord> = kept.into_iter().filter(|record| record.at_ms >= may).collect();
    assert_eq!(kept.last().map(|record| record.at_ms), Some(may));
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), kept);
}

async fn a_dry_run_drops_nothing<S: Store>(store: S) {
    store
        .append_audit(&spread_over_months(), &[])
        .await
        .expect("append");
    let before = store.query_audit(&all(1_000)).await.expect("query");
    let cutoff = utc(2025, 3, 31);

    let would = store.prune_audit(cutoff, true).await.expect("dry run");
    assert_eq!(would, [month_2025(1, 3), month_2025(2, 3)]);
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), before);
    assert_eq!(
        store.prune_audit(cutoff, true).await.expect("dry run"),
        would,
        "a dry run can be repeated"
    );

    // The prune then does what the dry run said.
    assert_eq!(store.prune_audit(cutoff, false).await.expect("prune"), would);
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query").len(), 12);
}

/// Records no prepared partition covers — a broken clock, a replay of old
/// records — are stored all the same, in the period they belong to.
async fn records_far_from_the_prepared_months_are_kept<S: Store>(store: S) {
    store
        .prepare_audit_periods(utc(2026, 11, 30))
        .await
        .expect("prepare");
    let far = [
        i64::MIN,
        retention::MONTHS_START_MS - 1,
        retention::MONTHS_START_MS,
        -1,
        0,
        utc(1990, 6, 15),
        utc(2026, 11, 30),
        utc(2124, 2, 29),
        retention::MONTHS_END_MS - 1,
        retention::MONTHS_END_MS,
        i64::MAX,
    ];
    let records: Vec<AuditRecord> = far
        .iter()
        .enumerate()
        .map(|(n, at)| record(n as u32 + 100, *at, "alice", "tickets.read", "allow", "granted"))
        .collect();
    // One batch for all of them, and one more with a single far record.
    store.append_audit(&records[1..], &[]).await.expect("append");
    store.append_audit(&records[..1], &[]).await.expect("append");
    let mut expected = records.clone();
    expected.reverse();
    assert_eq!(store.query_audit(&all(100)).await.expect("query"), expected);

    // The far past goes in the periods it was filed in; the rest stays.
    let pruned = store.prune_audit(utc(2000, 1, 1), false).await.expect("prune");
    let summary: Vec<(&str, Option<i64>, i64, u64)> = pruned
        .iter()
        .map(|period| {
            (
                period.name.as_str(),
                period.from_ms,
                period.until_ms,
                period.records,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("audit_log_p_before", None, retention::MONTHS_START_MS, 2),
            (
                "audit_log_p0001_01",
                Some(retention::MONTHS_START_MS),
                utc(1, 2, 1),
                1
            ),
            ("audit_log_p1969_12", Some(utc(1969, 12, 1)), 0, 1),
            ("audit_log_p1970_01", Some(0), utc(1970, 2, 1), 1),
            ("audit_log_p1990_06", Some(utc(1990, 6, 1)), utc(1990, 7, 1), 1),
        ]
    );
    assert_eq!(
        store.query_audit(&all(100)).await.expect("query"),
        expected[..5].to_vec()
    );
}

async fn replaying_across_months_changes_nothing<S: Store>(store: S) {
    let records = spread_over_months();
    store.append_audit(&records[..9], &[]).await.expect("append");
    // The spool replays everything — half of it a second time — in another
    // order, with a duplicate inside the batch; and then all of it again.
    let mut replay = records.clone();
    replay.reverse();
    replay.push(records[0].clone());
    store.append_audit(&replay, &[]).await.expect("replay");
    store.append_audit(&replay, &[]).await.expect("replay again");
    let mut expected = records;
    expected.reverse();
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), expected);
}

async fn prepared_months_take_records<S: Store>(store: S) {
    let now = utc(2026, 11, 30) + 3_600_000;
    store.prepare_audit_periods(now).await.expect("prepare");
    store.prepare_audit_periods(now).await.expect("prepare again");
    let records: Vec<AuditRecord> = [now, utc(2026, 12, 1), utc(2027, 1, 31)]
        .into_iter()
        .enumerate()
        .map(|(n, at)| record(n as u32, at, "alice", "tickets.read", "allow", "granted"))
        .collect();
    store.append_audit(&records, &[]).await.expect("append");
    assert_eq!(store.query_audit(&all(10)).await.expect("query").len(), 3);
    // Nothing of it ends before the current month.
    assert_eq!(store.prune_audit(now, true).await.expect("dry run"), []);
}

// ── Dialect-specific behaviour ────────────────────────────────────────────

mod postgres_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_replicas_are_notified() {
        on_postgres(|store, replica, _database| async move {
            if through_transaction_pooler() {
                // No `LISTEN` through it: the server polls, as on SQLite.
                store.publish(policy(1), None).await.expect("publish");
                expect_quiet(&replica).await;
                return;
            }
            // Subscribing resolves at once: a change may have come before.
            expect_notified(&replica).await;
            expect_quiet(&replica).await;

            store.publish(policy(1), None).await.expect("publish");
            expect_notified(&replica).await;
            store.publish(policy(2), None).await.expect("publish");
            store.activate(1, None, &admin()).await.expect("activate");
            // Both are kept while nobody waits.
            expect_notified(&replica).await;
            expect_notified(&replica).await;
            expect_quiet(&replica).await;

            // Nothing is announced when nothing changed.
            store.publish(policy(1), None).await.expect("unchanged");
            store.publish(policy(3), Some(9)).await.expect("conflict");
            store.activate(1, None, &admin()).await.expect("already active");
            store.activate(99, None, &admin()).await.expect("not found");
            expect_quiet(&replica).await;
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_notification_connection_is_reported() {
        on_postgres(|store, replica, database| async move {
            if through_transaction_pooler() {
                // No notification connection to lose (`other_replicas_are_notified`).
                return;
            }
            expect_notified(&replica).await;
            let mut admin = PgConnection::connect_with(&database).await.expect("connect");
            let terminated: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'",
            )
            .fetch_all(&mut admin)
            .await
            .expect("terminate the listener");
            assert_eq!(terminated, [true], "exactly one listening connection");

            let lost = tokio::time::timeout(Duration::from_secs(10), replica.policy_changed())
                .await
                .expect("the loss is noticed");
            assert!(
                lost.is_err(),
                "a lost connection is an error, not a change: {lost:?}"
            );
            // The next call subscribes again, and says a change may have been missed.
            expect_notified(&replica).await;
            store.publish(policy(1), None).await.expect("publish");
            expect_notified(&replica).await;
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_opens_a_postgres_url() {
        let Some(url) = server_url() else { return };
        let store = connect(&url, &StoreOptions::default()).await.expect("connect");
        assert!(matches!(store, AnyStore::Postgres(_)));
    }

    /// The partitions of `audit_log`, by name, with their bounds as
    /// PostgreSQL prints them.
    async fn partitions(database: &PgConnectOptions) -> Vec<(String, String)> {
        let mut admin = PgConnection::connect_with(database).await.expect("connect");
        sqlx::query_as(
            "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'audit_log'::regclass ORDER BY 1",
        )
        .fetch_all(&mut admin)
        .await
        .expect("list the partitions")
    }

    /// `FOR VALUES FROM (…) TO (…)` for a period, as PostgreSQL prints it.
    fn printed_bounds(period: Period) -> String {
        let bound =
            |ms: Option<i64>, unbounded: &str| ms.map_or(unbounded.to_owned(), |ms| format!("'{ms}'"));
        format!(
            "FOR VALUES FROM ({}) TO ({})",
            bound(period.start_ms(), "MINVALUE"),
            bound(period.end_ms(), "MAXVALUE")
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn preparing_creates_the_coming_months_once() {
        on_postgres(|store, replica, database| async move {
            assert_eq!(partitions(&database).await, [], "a fresh store has none");
            let now = utc(2026, 11, 30) + 1;
            let (left, right) = tokio::join!(
                store.prepare_audit_periods(now),
                replica.prepare_audit_periods(now)
            );
            left.expect("prepare");
            right.expect("prepare on a replica at the same time");
            let expected: Vec<(String, String)> = ["2026_11", "2026_12", "2027_01"]
                .iter()
                .zip([utc(2026, 11, 1), utc(2026, 12, 1), utc(2027, 1, 1)])
                .map(|(name, start)| {
                    let period = Period::containing(start);
                    (format!("audit_log_p{name}"), printed_bounds(period))
                })
                .collect();
            assert_eq!(partitions(&database).await, expected);
            // A month later, one more; none twice.
            store
                .prepare_audit_periods(utc(2026, 12, 15))
                .await
                .expect("prepare");
            let names: Vec<String> = partitions(&database)
                .await
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            assert_eq!(
                names,
                [
                    "audit_log_p2026_11",
                    "audit_log_p2026_12",
                    "audit_log_p2027_01",
                    "audit_log_p2027_02"
                ]
            );
            // An insert far from them makes its own; two replicas missing the
            // same month at once both get their records in.
            let late = [record(
                1,
                utc(1999, 12, 31),
                "alice",
                "tickets.read",
                "allow",
                "granted",
            )];
            let early = [record(
                2,
                utc(1999, 12, 1),
                "bob",
                "tickets.read",
                "allow",
                "granted",
            )];
            let (left, right) =
                tokio::join!(store.append_audit(&late, &[]), replica.append_audit(&early, &[]));
            left.expect("append");
            right.expect("append on a replica at the same time");
            assert_eq!(partitions(&database).await[0].0, "audit_log_p1999_12");
            assert_eq!(store.query_audit(&all(10)).await.expect("query").len(), 2);
        })
        .await;
    }

    /// Dropping partitions needs `audit_log` to itself for an instant; the
    /// writers of newer records wait for that instant, and lose nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_keep_arriving_while_months_are_dropped() {
        on_postgres(|store, replica, _database| async move {
            store
                .append_audit(&spread_over_months(), &[])
                .await
                .expect("append");
            let writer = tokio::spawn(async move {
                let mut written = Vec::new();
                for n in 0..200u32 {
                    let at = utc(2026, 11, 1) + i64::from(n) * 60_000;
                    let batch = [record(1_000 + n, at, "carol", "wiki.read", "allow", "granted")];
                    replica
                        .append_audit(&batch, &[])
                        .await
                        .expect("append during the prune");
                    written.extend(batch);
                }
                written
            });
            let mut dropped = Vec::new();
            for month in 2..=7 {
                dropped.extend(
                    store
                        .prune_audit(utc(2025, month, 1), false)
                        .await
                        .expect("prune"),
                );
            }
            let written = writer.await.expect("the writer");
            assert_eq!(
                dropped,
                (1..=6).map(|month| month_2025(month, 3)).collect::<Vec<_>>()
            );
            let mut expected = written;
            expected.reverse();
            assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), expected);
        })
        .await;
    }

    /// A database at migration 0001 with rows in it — what a server before
    /// partitioning left — is migrated (0002 partitions it) without losing one, each row
    /// in the partition `retention.rs` names, and goes on taking records.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_partitioning_migration_keeps_every_row() {
        let Some(database) = TestDatabase::create().await else {
            return;
        };
        let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
        let migrator = sqlx::migrate::Migrator::new(migrations)
            .await
            .expect("read the migrations");
        let pool = sqlx::PgPool::connect_with(database.options.clone())
            .await
            .expect("connect");
        migrator.run_to(1, &pool).await.expect("migrate to 0001");
        let kind: String =
            sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'audit_log'::regclass")
                .fetch_one(&pool)
                .await
                .expect("relkind");
        assert_eq!(kind, "r", "0001's audit_log is a plain table");

        // 0001-shaped rows, written with 0001's columns (the store's insert names later ones too).
        let store = PostgresStore::connect_with(database.options.clone(), &StoreOptions::default())
            .await
            .expect("open");
        let mut rows = spread_over_months();
        for (n, at) in [i64::MIN, -1, 0, retention::MONTHS_END_MS, i64::MAX]
            .into_iter()
            .enumerate()
        {
            rows.push(record(
                n as u32 + 200,
                at,
                "bob",
                "wiki.read",
                "deny",
                "no_grant_matches",
            ));
        }
        rows.push(AuditRecord {
            decision_id: "full".to_owned(),
            at_ms: utc(2026, 11, 30),
            request_id: Some("req-1".to_owned()),
            gateway: "edge".to_owned(),
            kind: RecordKind::List,
            outcome: RecordOutcome::Allow,
            code: Some(RecordCode::Reason(ReasonCode::Granted)),
            path: Some("/grants/0".to_owned()),
            principal_id: Some("staff:ana".to_owned()),
            issuer: Some("staff".to_owned()),
            subject: Some("ana".to_owned()),
            capability: Some("tickets.read".to_owned()),
            tool: Some("jira__get_issue".to_owned()),
            account_id: Some("jira-ro".to_owned()),
            limit_calls: Some(100),
            limit_per: Some("1h".to_owned()),
            usage_calls: Some(42),
            policy_version: Some(format!("sha256:{:064x}", 1)),
            policy_revision: Some(7),
            visible_count: None,
            visible: Vec::new(),
            // Written before doors existed: the migration's default names capgate's own.
            door: Door::Capgate,
            first_decision_id: None,
            arguments_digest: None,
            arguments: None,
            arguments_omitted: None,
            attributes: None,
            shadow: None,
        });
        for row in &rows {
            insert_at_0001(&pool, row).await;
        }
        // What the store reads back: the rows, newest first (by `at`, then by id).
        let mut before = rows.clone();
        before.sort_by(|a, b| (b.at_ms, &b.decision_id).cmp(&(a.at_ms, &a.decision_id)));

        store.migrate().await.expect("migrate from 0001 to the latest");
        assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), before);

        // Each row in its month's partition, with the bounds retention.rs computes.
        let placed: Vec<(String, i64, String)> =
            sqlx::query_as("SELECT decision_id, at, tableoid::regclass::text FROM audit_log")
                .fetch_all(&pool)
                .await
                .expect("where the rows are");
        assert_eq!(placed.len(), rows.len());
        for (id, at, partition) in &placed {
            assert_eq!(partition, &Period::containing(*at).name(), "{id} at {at}");
        }
        for (name, bounds) in partitions(&database.options).await {
            let period = placed
                .iter()
                .find(|(_, _, partition)| *partition == name)
                .map(|(_, at, _)| Period::containing(*at))
                .expect("no partition without rows");
            assert_eq!(bounds, printed_bounds(period), "{name}");
        }

        // The shape the queries need: partitioned, the key with `at`, the indexes.
        let kind: String =
            sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'audit_log'::regclass")
                .fetch_one(&pool)
                .await
                .expect("relkind");
        assert_eq!(kind, "p");
        let key: String = sqlx::query_scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = 'audit_log'::regclass AND contype = 'p'",
        )
        .fetch_one(&pool)
        .await
        .expect("primary key");
        assert_eq!(key, "PRIMARY KEY (decision_id, at)");
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE tablename = 'audit_log' ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .expect("indexes");
        assert_eq!(
            indexes,
            [
                "audit_log_account_at",
                "audit_log_at",
                "audit_log_capability_at",
                "audit_log_code_at",
                "audit_log_outcome_at",
                "audit_log_pkey",
                "audit_log_principal_at",
            ]
        );
        let leftover: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('audit_log_partitioned')::text")
                .fetch_one(&pool)
                .await
                .expect("leftover");
        assert_eq!(leftover, None);

        // The old rows are replayed idempotently, and new ones go in.
        let new = record(999, utc(2027, 3, 3), "carol", "wiki.read", "allow", "granted");
        let mut again = rows.clone();
        again.push(new.clone());
        store.append_audit(&again, &[]).await.expect("append after 0002");
        let after = store.query_audit(&all(1_000)).await.expect("query");
        assert_eq!(after.len(), rows.len() + 1);
        assert!(after.contains(&new));
        pool.close().await;
        drop(database);
    }

    /// A record as a server at migration 0001 wrote it: that schema's columns only.
    async fn insert_at_0001(pool: &sqlx::PgPool, record: &AuditRecord) {
        let bigint = |value: Option<u64>| value.map(|value| i64::try_from(value).expect("fits BIGINT"));
        sqlx::query(
            "INSERT INTO audit_log (decision_id, at, request_id, gateway, kind, outcome, code, path, \
                 principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, \
                 usage_calls, policy_version, policy_revision) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        )
        .bind(&record.decision_id)
        .bind(record.at_ms)
        .bind(&record.request_id)
        .bind(&record.gateway)
        .bind(record.kind.as_str())
        .bind(record.outcome.as_str())
        .bind(record.code.map(RecordCode::as_str))
        .bind(&record.path)
        .bind(&record.principal_id)
        .bind(&record.issuer)
        .bind(&record.subject)
        .bind(&record.capability)
        .bind(&record.tool)
        .bind(&record.account_id)
        .bind(bigint(record.limit_calls))
        .bind(&record.limit_per)
        .bind(bigint(record.usage_calls))
        .bind(&record.policy_version)
        .bind(bigint(record.policy_revision))
        .execute(pool)
        .await
        .expect("insert a 0001 row");
    }

    /// A libpq list of hosts is refused by `migrate` and `serve` at start, with the topology that
    /// works, instead of sqlx's "invalid port number"; and the password stays hidden.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_list_of_hosts_is_refused_at_start() {
        let url =
            "postgres://capgate:s3cret-pw@127.0.0.1:1,127.0.0.1:2/capgate?target_session_attrs=read-write";
        for command in [&["migrate"][..], &["serve", "--listen", "127.0.0.1:0"]] {
            let (exit, stderr) = capgate(command, url).await;
            assert_ne!(exit, Some(0), "{command:?}: {stderr}");
            assert!(
                stderr.contains("several hosts") && stderr.contains("HAProxy"),
                "{command:?}: {stderr}"
            );
            assert!(!stderr.contains("s3cret-pw"), "{command:?}: {stderr}");
        }
    }

    /// With `target_session_attrs=read-write`, a server that takes no writes is refused at start,
    /// by `migrate` and by `serve`, saying so — where the parameter was dropped and `serve` failed
    /// later with "read-only transaction". A server that takes writes is used. Through the
    /// pooler under test when there is one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_server_is_refused_when_the_url_asks_for_read_write() {
        // Two databases, one read-only from the start: a pooler keeps the server sessions it
        // opened, with the settings they started with.
        let (Some(read_only), Some(writable)) = (TestDatabase::create().await, TestDatabase::create().await)
        else {
            return;
        };
        let asking_read_write = |database: &TestDatabase| {
            let base = database.store_url();
            let separator = if base.contains('?') { '&' } else { '?' };
            format!("{base}{separator}target_session_attrs=read-write")
        };
        for database in [&read_only, &writable] {
            database.migrate().await.expect("migrate");
        }
        let mut admin = PgConnection::connect_with(&read_only.options)
            .await
            .expect("connect");
        admin
            .execute(AssertSqlSafe(format!(
                "ALTER DATABASE {} SET default_transaction_read_only = on",
                read_only.name
            )))
            .await
            .expect("make the database read-only");
        let _ = admin.close().await;

        let url = asking_read_write(&read_only);
        for command in [&["migrate"][..], &["serve", "--listen", "127.0.0.1:0"]] {
            let (exit, stderr) = capgate(command, &url).await;
            assert_ne!(exit, Some(0), "{command:?}: {stderr}");
            assert!(
                stderr.contains("is read-only") && stderr.contains("target_session_attrs=read-write"),
                "{command:?}: {stderr}"
            );
        }
        let (exit, stderr) = capgate(&["migrate"], &asking_read_write(&writable)).await;
        assert_eq!(exit, Some(0), "{stderr}");
    }

    /// Two `capgate serve` replicas through PgBouncer in transaction mode (`pooler=transaction`):
    /// both start, their calls are answered, and a ceiling holds across them, every answer in
    /// the audit trail. `capgate migrate` through it refuses, naming the fix. Before, the second
    /// replica died at start (`prepared statement "sqlx_s_1" already exists`). Only where the
    /// pooler under test works in transaction mode (scripts/test.sh runs it so).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_serve_through_a_transaction_pooler() {
        use capgate::wire::proto::decision_service_client::DecisionServiceClient;
        use capgate::wire::proto::Outcome;
        use support::client::{capped, decision, example_with_ceiling, publish, wait_serving, CATALOG};
        use support::process::Serve;

        if !through_transaction_pooler() {
            eprintln!("skipped: needs CAPGATE_TEST_POOLER_URL with pooler=transaction");
            return;
        }
        let Some(database) = TestDatabase::create().await else {
            return;
        };
        let url = database.store_url();
        let (exit, stderr) = capgate(&["migrate"], &url).await;
        assert_eq!(exit, Some(3), "{stderr}");
        assert!(
            stderr.contains("pooler=transaction") && stderr.contains("capgate migrate"),
            "{stderr}"
        );
        database.migrate().await.expect("migrate on the server itself");

        let args = ["--database-url", url.as_str(), "--poll-interval", "200ms"];
        let (first, second) = tokio::join!(Serve::start(&args), Serve::start(&args));
        let channels = [first.channel().await, second.channel().await];
        let ceiling = 5;
        let published = publish(&channels[0], &example_with_ceiling(ceiling), Some(CATALOG))
            .await
            .expect("publish");
        assert!(published.accepted, "{:?}", published.diagnostics);
        for channel in &channels {
            wait_serving(channel, Duration::from_secs(5)).await;
        }
        let mut allowed = 0;
        for call in 0..20 {
            let response = DecisionServiceClient::new(channels[call % 2].clone())
                .decide(capped())
                .await
                .expect("an answer, not UNAVAILABLE")
                .into_inner();
            if decision(&response).outcome() == Outcome::Allow {
                allowed += 1;
            }
        }
        assert_eq!(allowed, ceiling, "the ceiling holds across both replicas");
        let store = database.store().await;
        let records = store.query_audit(&all(100)).await.expect("read the audit trail");
        let decided = records
            .iter()
            .filter(|record| record.kind == RecordKind::Decide)
            .count();
        assert_eq!(decided, 20, "one record per answer");
        drop((first, second));
    }

    /// Runs `capgate ARGS` with `CAPGATE_DATABASE_URL=url` until it exits (within 30 s):
    /// its exit code and standard error.
    async fn capgate(args: &[&str], url: &str) -> (Option<i32>, String) {
        use std::io::Read;
        use std::process::{Command, Stdio};

        let mut child = Command::new(env!("CARGO_BIN_EXE_capgate"))
            .args(args)
            .env("CAPGATE_DATABASE_URL", url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start capgate");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for capgate") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("capgate {args:?} did not exit within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr)
            .expect("stderr is UTF-8");
        (status.code(), stderr)
    }

    async fn expect_notified(store: &PostgresStore) {
        tokio::time::timeout(Duration::from_secs(10), store.policy_changed())
            .await
            .expect("a notification in time")
            .expect("notification");
    }

    async fn expect_quiet(store: &PostgresStore) {
        let waited = tokio::time::timeout(Duration::from_millis(300), store.policy_changed()).await;
        assert!(waited.is_err(), "no notification expected: {waited:?}");
    }
}

mod sqlite_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn there_are_no_notifications() {
        on_sqlite(|store, replica, _raw| async move {
            store.publish(policy(1), None).await.expect("publish");
            let waited = tokio::time::timeout(Duration::from_millis(200), replica.policy_changed()).await;
            assert!(waited.is_err(), "SQLite never notifies: {waited:?}");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_creates_the_file_in_wal_mode() {
        let file = TempFile::new();
        assert!(!file.path.exists());
        let store = connect(
            &format!("sqlite://{}", file.path.display()),
            &StoreOptions::default(),
        )
        .await
        .expect("connect");
        assert!(matches!(store, AnyStore::Sqlite(_)));
        assert!(file.path.exists(), "the database file is created");
        let mut connection = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.path.display()))
            .await
            .expect("open the file");
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut connection)
            .await
            .expect("pragma");
        assert_eq!(mode, "wal");
    }
}

#[tokio::test]
async fn connect_refuses_other_schemes() {
    let Err(error) = connect("mysql://root:s3cret@localhost/capgate", &StoreOptions::default()).await else {
        panic!("a MySQL URL was accepted");
    };
    let message = error.to_string();
    assert!(message.contains("unsupported database URL"), "{message}");
    assert!(
        message.contains("root:***@localhost") && !message.contains("s3cret"),
        "{message}"
    );
}

#[tokio::test]
async fn connection_errors_never_show_the_password() {
    // Nothing listens on port 1: the connection is refused at once.
    let url = "postgres://capgate:s3cret-pw@127.0.0.1:1/capgate";
    let Err(error) = connect(url, &StoreOptions::default()).await else {
        panic!("connected to port 1");
    };
    let message = error.to_string();
    assert!(!message.contains("s3cret-pw"), "{message}");
    // The cause, at once — not a pool that gave up after retrying.
    assert!(
        message.contains("refused") && !message.contains("timed out"),
        "{message}"
    );
    assert_eq!(message.matches("store error").count(), 1, "{message}");
    assert!(
        message.contains("postgres://capgate:***@127.0.0.1:1/capgate"),
        "{message}"
    );

    let file = TempFile::new();
    let url = format!("sqlite://{}/missing-directory/capgate.db", file.path.display());
    assert!(
        connect(&url, &StoreOptions::default()).await.is_err(),
        "no directory, no database"
    );
}

/// An SQLite file at migration 0006 with records of every shape in it — what a server before
/// request fingerprints left — is migrated (0007 makes `audit_log` again, to widen its outcomes)
/// without losing or changing one, with every index back, and takes the new outcomes after. Its
/// remembered answers and claims, which have no fingerprint, answer no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fingerprint_migration_keeps_every_sqlite_record() {
    let file = TempFile::new();
    let url = format!("sqlite://{}", file.path.display());
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    let migrator = sqlx::migrate::Migrator::new(migrations)
        .await
        .expect("read the migrations");
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("an SQLite URL");
    let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
        .await
        .expect("open the file");
    migrator.run_to(6, &pool).await.expect("migrate to 0006");

    let mut rows = spread_over_months();
    rows.push(AuditRecord {
        decision_id: "listing".to_owned(),
        at_ms: utc(2026, 11, 30),
        request_id: Some("req-9".to_owned()),
        gateway: "edge".to_owned(),
        kind: RecordKind::List,
        outcome: RecordOutcome::Allow,
        principal_id: Some("staff:ana".to_owned()),
        issuer: Some("staff".to_owned()),
        subject: Some("ana".to_owned()),
        policy_version: Some(format!("sha256:{:064x}", 1)),
        policy_revision: Some(7),
        visible_count: Some(2),
        visible: vec!["tickets.read".to_owned(), "docs.search".to_owned()],
        door: Door::Authzen,
        ..AuditRecord::default()
    });
    rows.push(AuditRecord {
        decision_id: "capped".to_owned(),
        at_ms: utc(2026, 11, 29),
        request_id: Some("req-8".to_owned()),
        gateway: "edge".to_owned(),
        outcome: RecordOutcome::Deny,
        code: Some(RecordCode::Reason(ReasonCode::LimitExhausted)),
        path: Some("/grants/0".to_owned()),
        principal_id: Some("staff:ana".to_owned()),
        capability: Some("tickets.read".to_owned()),
        tool: Some("jira__get_issue".to_owned()),
        limit_calls: Some(100),
        limit_per: Some("1h".to_owned()),
        usage_calls: Some(100),
        door: Door::ExtAuthz,
        ..AuditRecord::default()
    });
    for row in &rows {
        let bigint = |value: Option<u64>| value.map(|value| i64::try_from(value).expect("fits"));
        sqlx::query(
            "INSERT INTO audit_log (decision_id, at, request_id, gateway, kind, outcome, code, path, \
                 principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, \
                 usage_calls, policy_version, policy_revision, visible_count, visible, door) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
                 $18, $19, $20, $21, $22)",
        )
        .bind(&row.decision_id)
        .bind(row.at_ms)
        .bind(&row.request_id)
        .bind(&row.gateway)
        .bind(row.kind.as_str())
        .bind(row.outcome.as_str())
        .bind(row.code.map(RecordCode::as_str))
        .bind(&row.path)
        .bind(&row.principal_id)
        .bind(&row.issuer)
        .bind(&row.subject)
        .bind(&row.capability)
        .bind(&row.tool)
        .bind(&row.account_id)
        .bind(bigint(row.limit_calls))
        .bind(&row.limit_per)
        .bind(bigint(row.usage_calls))
        .bind(&row.policy_version)
        .bind(bigint(row.policy_revision))
        .bind(bigint(row.visible_count))
        .bind((!row.visible.is_empty()).then(|| row.visible.join(" ")))
        .bind(row.door.as_str())
        .execute(&pool)
        .await
        .expect("insert a 0006 row");
    }
    sqlx::raw_sql(
        "INSERT INTO remembered_responses (gateway, request_id, decision_id, response, at) \
             VALUES ('edge', 'req-8', 'capped', x'0102', 1000); \
         INSERT INTO request_claims (gateway, request_id, claimed_at) VALUES ('edge', 'req-7', 1000);",
    )
    .execute(&pool)
    .await
    .expect("a 0006 answer and claim");
    pool.close().await;
    let mut before = rows.clone();
    before.sort_by(|a, b| (b.at_ms, &b.decision_id).cmp(&(a.at_ms, &a.decision_id)));

    let store = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("open SQLite");
    store.migrate().await.expect("migrate from 0006 to the latest");
    assert_eq!(store.query_audit(&all(1_000)).await.expect("query"), before);

    let raw = sqlx::SqlitePool::connect(&url).await.expect("open the file");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'audit_log' \
         AND name NOT LIKE 'sqlite_autoindex%' ORDER BY name",
    )
    .fetch_all(&raw)
    .await
    .expect("indexes");
    assert_eq!(
        indexes,
        [
            "audit_log_account_at",
            "audit_log_at",
            "audit_log_capability_at",
            "audit_log_code_at",
            "audit_log_outcome_at",
            "audit_log_principal_at",
        ]
    );
    let leftover: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'audit_log_new'")
        .fetch_one(&raw)
        .await
        .expect("no leftover");
    assert_eq!(leftover, 0);
    raw.close().await;

    // The new outcomes are taken, with the decision they name.
    let replay = AuditRecord {
        decision_id: "replay".to_owned(),
        at_ms: utc(2026, 12, 1),
        request_id: Some("req-8".to_owned()),
        gateway: "edge".to_owned(),
        outcome: RecordOutcome::Replayed,
        first_decision_id: Some("capped".to_owned()),
        ..AuditRecord::default()
    };
    store
        .append_audit(std::slice::from_ref(&replay), &[])
        .await
        .expect("append a replay");
    assert_eq!(store.query_audit(&all(1)).await.expect("query"), vec![replay]);

    // What was remembered before is no request's.
    let fingerprint = request(1);
    let claim =
        |request_id: &'static str| store.claim_request("edge", request_id, &fingerprint, 2_000, -28_000);
    assert!(matches!(
        claim("req-8").await.expect("claim"),
        Claim::Answered(Remembered {
            fingerprint: None,
            ..
        })
    ));
    assert_eq!(
        claim("req-7").await.expect("claim"),
        Claim::Taken { fingerprint: None }
    );
}

// ── Harness ───────────────────────────────────────────────────────────────

/// Runs `scenario` on two stores over a fresh SQLite file (and hands it the
/// file, as [`Raw`]), then removes it.
async fn on_sqlite<F, Fut>(scenario: F)
where
    F: FnOnce(SqliteStore, SqliteStore, Raw) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let file = TempFile::new();
    let url = format!("sqlite://{}", file.path.display());
    let store = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("open SQLite");
    store.migrate().await.expect("migrate");
    let replica = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("open SQLite again");
    // On its own task, so that a failing scenario still gets cleaned up
    // after: the panic is caught here and raised again below.
    let outcome = tokio::spawn(scenario(store, replica, Raw::Sqlite(url))).await;
    drop(file);
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

/// Runs `scenario` on two stores over a fresh PostgreSQL database (and hands
/// it that database's connection options), then drops the database.
async fn on_postgres<F, Fut>(scenario: F)
where
    F: FnOnce(PostgresStore, PostgresStore, PgConnectOptions) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let opened = async {
        database.migrate().await?;
        let store = PostgresStore::connect(&database.store_url(), &StoreOptions::default()).await?;
        // Through a transaction pooler this only checks that the schema is current.
        store.migrate().await?;
        let replica = PostgresStore::connect(&database.store_url(), &StoreOptions::default()).await?;
        Ok::<_, capgate::store::StoreError>((store, replica))
    }
    .await;
    let outcome = match opened {
        Ok((store, replica)) => Ok(tokio::spawn(scenario(store, replica, database.options.clone())).await),
        Err(error) => Err(error),
    };
    drop(database);
    match outcome {
        Err(error) => panic!("cannot open the test database: {error}"),
        Ok(Err(panicked)) => std::panic::resume_unwind(panicked.into_panic()),
        Ok(Ok(())) => {}
    }
}

/// The database under a scenario's store, for what the store itself would
/// never do.
enum Raw {
    /// The SQLite file's URL.
    Sqlite(String),
    Postgres(Box<PgConnectOptions>),
}

impl Raw {
    /// Runs `sqlite` or `postgres` (one or more statements), whichever the
    /// dialect is, on a connection of its own.
    async fn execute(&self, sqlite: &str, postgres: &str) {
        match self {
            Raw::Sqlite(url) => {
                let mut connection = SqliteConnection::connect(url).await.expect("open the file");
                connection
                    .execute(AssertSqlSafe(sqlite.to_owned()))
                    .await
                    .expect("run the SQL");
                connection.close().await.expect("close");
            }
            Raw::Postgres(options) => {
                let mut connection = PgConnection::connect_with(options).await.expect("connect");
                connection
                    .execute(AssertSqlSafe(postgres.to_owned()))
                    .await
                    .expect("run the SQL");
                connection.close().await.expect("close");
            }
        }
    }

    /// Makes the database refuse every audit record of `gateway`, as its
    /// schema refuses an unknown outcome: a constraint on PostgreSQL (which
    /// its partitions, also those made later, inherit), a trigger on SQLite
    /// (whose tables take no constraint once made).
    async fn refuse_gateway(&self, gateway: &str) {
        self.execute(
            &format!(
                "CREATE TRIGGER audit_log_refuses BEFORE INSERT ON audit_log \
                 WHEN NEW.gateway = '{gateway}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            ),
            &format!("ALTER TABLE audit_log ADD CONSTRAINT audit_log_refuses CHECK (gateway <> '{gateway}')"),
        )
        .await;
    }
}

/// A path under the temporary directory; the file and SQLite's companions
/// (`-wal`, `-shm`) are removed on drop, even when a test fails.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn new() -> Self {
        TempFile {
            path: std::env::temp_dir().join(format!("capgate-store-test-{}.db", unique())),
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            // Absent companions are expected.
            let _ = std::fs::remove_file(path);
        }
    }
}

// ── Data ──────────────────────────────────────────────────────────────────

fn policy(n: u64) -> NewPolicy {
    NewPolicy {
        version: format!("sha256:{n:064x}"),
        artifact: format!("version: 1\n# revision {n}\n"),
        catalog: None,
        author: "alice".to_owned(),
        comment: format!("change {n}"),
        created_at_ms: 1_700_000_000_000 + n as i64,
    }
}

fn stored(revision: u64, new: NewPolicy) -> StoredPolicy {
    let NewPolicy {
        version,
        artifact,
        catalog,
        author,
        comment,
        created_at_ms,
    } = new;
    StoredPolicy {
        revision,
        version,
        artifact,
        catalog,
        author,
        comment,
        created_at_ms,
    }
}

#[track_caller]
fn activated(outcome: PublishOutcome) -> StoredPolicy {
    match outcome {
        PublishOutcome::Activated(policy) => policy,
        other => panic!("expected a new active version, got {other:?}"),
    }
}

fn revisions(policies: &[StoredPolicy]) -> Vec<u64> {
    policies.iter().map(|policy| policy.revision).collect()
}

fn counted(calls: u64, window_start_ms: i64) -> CounterReading {
    CounterReading {
        calls,
        window_start_ms,
    }
}

/// Consumes one call in a [`WINDOW_MS`] window, which must be granted.
async fn taken<S: Store>(store: &S, key: CounterKey<'_>, at_ms: i64, limit: u64) -> CounterReading {
    match consume(store, key, at_ms, WINDOW_MS, limit).await {
        Consumed::Taken(counted) => counted,
        Consumed::Refused => panic!("refused at {at_ms} with a ceiling of {limit}"),
    }
}

/// The admin who activates in these tests.
fn admin() -> Actor {
    Actor {
        name: "ops-admin".to_owned(),
        at_ms: 1_700_000_100_000,
    }
}

fn all(limit: u32) -> AuditFilter {
    AuditFilter {
        limit,
        ..AuditFilter::default()
    }
}

/// A decision's record; `outcome` and `code` are spelled as the columns
/// hold them, and must be real ones.
#[track_caller]
fn record(n: u32, at_ms: i64, principal: &str, capability: &str, outcome: &str, code: &str) -> AuditRecord {
    AuditRecord {
        decision_id: format!("d{n}"),
        at_ms,
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::parse(outcome).unwrap_or_else(|| panic!("`{outcome}` is no outcome")),
        code: Some(RecordCode::parse(code).unwrap_or_else(|| panic!("`{code}` is no code"))),
        principal_id: Some(principal.to_owned()),
        capability: Some(capability.to_owned()),
        ..AuditRecord::default()
    }
}

fn remembered_answer(decision_id: &str, response: &[u8]) -> Remembered {
    Remembered {
        decision_id: decision_id.to_owned(),
        response: response.to_vec(),
        at_ms: 1_000,
        fingerprint: Some(request(1)),
    }
}

const DAY_MS: i64 = 86_400_000;

/// Midnight UTC of a date, through the `time` crate; `month` 13 is January
/// of the next year.
fn utc(year: i32, month: u8, day: u8) -> i64 {
    let (year, month) = if month == 13 { (year + 1, 1) } else { (year, month) };
    let month = time::Month::try_from(month).expect("a month");
    let date = time::Date::from_calendar_date(year, month, day).expect("a date");
    i64::try_from(date.midnight().assume_utc().unix_timestamp_nanos() / 1_000_000).expect("in range")
}
