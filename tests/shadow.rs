//! Shadow versions through the real binary, on both stores (docs/decisions/0035): an admin
//! publishes a version as the shadow one (`capgate publish --shadow`); the server evaluates it
//! beside the active version on every decision and listing, answers as the active version says,
//! records each difference in the transaction that stores the decision's audit record, counts it
//! in `capgate_shadow_differences_total`, and `capgate policies shadow report` reads them back with
//! both answers and both pointers. Clearing the shadow stops the recording.

mod support;

use std::process::Command;

use capgate::store::{
    Actor, AnyStore, AuditRecord, NewPolicy, RecordKind, RecordOutcome, ShadowFilter, ShadowSide, Store,
    StoreOptions,
};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{list_visible_request, DecideRequest, DecideResponse, ListVisibleRequest};
use serde_json::{json, Value};
use support::client::{ana, dee, example_with_ceiling, for_capability, recorded_outcome, CATALOG, POLICY};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;
use tonic::transport::Channel;

enum Kind {
    Sqlite,
    Postgres,
}

crate::on_both_stores! {
    a_shadow_version_records_what_it_would_change_and_changes_no_answer,
    the_store_keeps_the_shadow_pointer_and_its_differences,
    activating_the_shadow_version_retires_the_shadow,
}

/// The example with a ceiling of one call an hour on support's ticket reading, and a grant of
/// ticket reading to every staff principal (after the others, so that their pointers stay).
fn shadow_policy() -> String {
    let everyone_reads = "  - to:\n      issuer: staff\n    capabilities: [tickets.issue.read]\n    \
                          using: helpdesk-reader\n\n  # /grants/7";
    let policy = example_with_ceiling(1).replace("  # /grants/7", everyone_reads);
    assert!(
        policy.contains("using: helpdesk-reader\n\n  # /grants/7"),
        "the example moved"
    );
    policy
}

/// A store of `kind` for the test: its URL, kept alive as long as the value is.
struct Place {
    url: String,
    _dir: Option<tempfile::TempDir>,
    _database: Option<TestDatabase>,
}

async fn place(kind: Kind) -> Place {
    match kind {
        Kind::Sqlite => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            Place {
                url: format!("sqlite://{}", dir.path().join("capgate.db").display()),
                _dir: Some(dir),
                _database: None,
            }
        }
        Kind::Postgres => {
            let database = TestDatabase::create().await.expect("a PostgreSQL database");
            Place {
                url: database.url(),
                _dir: None,
                _database: Some(database),
            }
        }
    }
}

async fn open(url: &str) -> AnyStore {
    let store = capgate::store::connect(url, &StoreOptions::default())
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    store
}

/// `capgate ARGS` (the binary), in an empty directory: exit code, stdout, stderr.
fn capgate(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(args)
        .current_dir(dir.path())
        .env_remove("CAPGATE_DATABASE_URL")
        .output()
        .expect("the binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).expect("UTF-8"),
        String::from_utf8(output.stderr).expect("UTF-8"),
    )
}

fn json_of(args: &[&str]) -> Value {
    let (code, stdout, stderr) = capgate(args);
    assert_eq!(code, 0, "capgate {args:?}: {stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("JSON from {args:?}: {stdout}"))
}

async fn decide(channel: &Channel, request: DecideRequest) -> DecideResponse {
    DecisionServiceClient::new(channel.clone())
        .decide(request)
        .await
        .expect("Decide answers")
        .into_inner()
}

async fn list(channel: &Channel, who: capgate::wire::proto::AssertedPrincipal) {
    DecisionServiceClient::new(channel.clone())
        .list_visible(ListVisibleRequest {
            caller: Some(list_visible_request::Caller::Principal(who)),
            request_id: String::new(),
        })
        .await
        .expect("ListVisible answers");
}

/// The differences' transitions, oldest first, with what the report says of each.
fn transitions(report: &Value) -> Vec<(String, String, String)> {
    let mut found: Vec<(String, String, String)> = report["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .rev()
        .map(|difference| {
            (
                difference["transition"].as_str().unwrap_or("").to_owned(),
                difference["principal_id"].as_str().unwrap_or("").to_owned(),
                difference["kind"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    found.dedup();
    found
}

async fn a_shadow_version_records_what_it_would_change_and_changes_no_answer(kind: Kind) {
    let place = place(kind).await;
    let files = tempfile::tempdir().expect("a temporary directory");
    let write = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let active = write("policy.yaml", POLICY);
    let catalog = write("catalog.yaml", CATALOG);
    let candidate = write("candidate.yaml", &shadow_policy());
    let serve = Serve::start(&[
        "--database-url",
        &place.url,
        "--policy",
        &active,
        "--catalog",
        &catalog,
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .await;
    let server = format!("http://{}", serve.addr);
    let channel = serve.channel().await;

    // Published as the shadow: stored as revision 2, the active one still revision 1.
    let (code, stdout, stderr) = capgate(&[
        "publish",
        &candidate,
        "--catalog",
        &catalog,
        "--shadow",
        "--comment",
        "tighter reads",
        "--server",
        &server,
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("revision 2"), "{stdout}");
    assert!(stdout.contains("is the shadow version"), "{stdout}");
    let shown = json_of(&["policies", "shadow", "show", "--json", "--server", &server]);
    assert_eq!(shown["shadow"]["revision"], 2, "{shown}");
    let versions = json_of(&["policies", "list", "--json", "--server", &server]);
    assert_eq!(versions.as_array().map(Vec::len), Some(2), "{versions}");
    assert_eq!(
        (
            &versions[0]["revision"],
            &versions[0]["shadow"],
            &versions[0]["active"]
        ),
        (&json!(2), &json!(true), &json!(false))
    );
    assert_eq!(
        (&versions[1]["active"], &versions[1]["shadow"]),
        (&json!(true), &json!(false))
    );
    // Every answer that names a version flags it as the pointers say.
    let two = json_of(&["policies", "show", "2", "--json", "--server", &server]);
    assert_eq!((&two["shadow"], &two["active"]), (&json!(true), &json!(false)));
    let one = json_of(&["policies", "show", "1", "--json", "--server", &server]);
    assert_eq!((&one["shadow"], &one["active"]), (&json!(false), &json!(true)));

    // Answers are the active version's: Ana reads twice (600 an hour), Dee may not read tickets.
    for _ in 0..2 {
        let answer = decide(&channel, for_capability(ana(), "tickets.issue.read")).await;
        assert_eq!(recorded_outcome(&answer), "allow", "{answer:?}");
    }
    let answer = decide(&channel, for_capability(dee(), "tickets.issue.read")).await;
    assert_eq!(recorded_outcome(&answer), "deny", "{answer:?}");
    // The same answer from both versions: no difference.
    let answer = decide(&channel, for_capability(dee(), "docs.page.search")).await;
    assert_eq!(recorded_outcome(&answer), "allow", "{answer:?}");
    list(&channel, dee()).await;
    list(&channel, ana()).await;

    // What the shadow would have changed, in the order the calls came.
    let report = json_of(&[
        "policies",
        "shadow",
        "report",
        "--json",
        "--database-url",
        &place.url,
    ]);
    assert_eq!(
        transitions(&report),
        [
            ("ceiling_changed".into(), "staff:ana".into(), "decide".into()),
            ("allow_to_deny".into(), "staff:ana".into(), "decide".into()),
            ("deny_to_allow".into(), "staff:dee".into(), "decide".into()),
            ("listing_widened".into(), "staff:dee".into(), "list".into()),
        ],
        "{report}"
    );
    let differences = report["differences"].as_array().expect("differences");
    // Newest first: Dee's listing, Dee's call, Ana's second call, her first.
    let listing = &differences[0];
    assert_eq!(
        listing["shadow"]["gained"],
        json!(["tickets.issue.read"]),
        "{listing}"
    );
    let widened = &differences[1];
    assert_eq!(
        (
            &widened["active"]["outcome"],
            &widened["active"]["code"],
            &widened["shadow"]["outcome"],
            &widened["shadow"]["path"],
            &widened["shadow"]["account_id"],
        ),
        (
            &json!("deny"),
            &json!("no_grant_matches"),
            &json!("allow"),
            &json!("/grants/7"),
            &json!("helpdesk-reader")
        ),
        "{widened}"
    );
    let exhausted = &differences[2];
    assert_eq!(
        (
            &exhausted["active"]["outcome"],
            &exhausted["active"]["path"],
            &exhausted["shadow"]["code"],
            &exhausted["shadow"]["path"],
            &exhausted["active"]["revision"],
            &exhausted["shadow"]["revision"],
        ),
        (
            &json!("allow"),
            &json!("/grants/0"),
            &json!("limit_exhausted"),
            &json!("/grants/0"),
            &json!(1),
            &json!(2)
        ),
        "{exhausted}"
    );
    let ceiling = &differences[3];
    assert_eq!(
        (
            &ceiling["active"]["limit_calls"],
            &ceiling["shadow"]["limit_calls"]
        ),
        (&json!(600), &json!(1)),
        "{ceiling}"
    );
    // Each difference names a decision the audit trail holds.
    let id = widened["decision_id"].as_str().expect("an id");
    let audited = json_of(&[
        "audit",
        "--decision-id",
        id,
        "--json",
        "--database-url",
        &place.url,
    ]);
    assert_eq!(audited[0]["outcome"], "deny", "{audited}");
    // Counted per transition; the human report heads them the same way.
    let counts: Vec<(String, u64)> = report["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .map(|count| {
            (
                count["transition"].as_str().unwrap_or("").to_owned(),
                count["records"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("deny_to_allow".to_owned(), 1),
            ("allow_to_deny".to_owned(), 1),
            ("ceiling_changed".to_owned(), 1),
            ("listing_widened".to_owned(), 1),
        ]
    );
    let (code, human, _) = capgate(&["policies", "shadow", "report", "--database-url", &place.url]);
    assert_eq!(code, 0);
    assert!(human.contains("deny → allow"), "{human}");
    assert!(human.contains("ceiling 600/1h → 1/1h"), "{human}");
    let (_, scraped) = http_get(metrics_addr(&serve), "/metrics").await;
    for transition in [
        "deny_to_allow",
        "allow_to_deny",
        "ceiling_changed",
        "listing_widened",
    ] {
        assert_eq!(
            prometheus_value(
                &scraped,
                "capgate_shadow_differences_total",
                &[("transition", transition)]
            ),
            Some(1.0),
            "{transition} in:\n{scraped}"
        );
    }

    // Cleared: the same call is no longer compared.
    let cleared = json_of(&["policies", "shadow", "clear", "--json", "--server", &server]);
    assert_eq!(cleared["shadow"], Value::Null);
    let answer = decide(&channel, for_capability(dee(), "tickets.issue.read")).await;
    assert_eq!(recorded_outcome(&answer), "deny");
    let after = json_of(&[
        "policies",
        "shadow",
        "report",
        "--json",
        "--database-url",
        &place.url,
    ]);
    assert_eq!(after["differences"].as_array().map(Vec::len), Some(4), "{after}");
    // Set again by revision: the differences resume.
    let set = json_of(&["policies", "shadow", "set", "2", "--json", "--server", &server]);
    assert_eq!(set["shadow"]["revision"], 2, "{set}");
    decide(&channel, for_capability(dee(), "tickets.issue.read")).await;
    let resumed = json_of(&[
        "policies",
        "shadow",
        "report",
        "--json",
        "--database-url",
        &place.url,
    ]);
    assert_eq!(
        resumed["differences"].as_array().map(Vec::len),
        Some(5),
        "{resumed}"
    );
    let (code, _, stderr) = capgate(&["policies", "shadow", "set", "9", "--server", &server]);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("no stored revision 9"), "{stderr}");
}

fn difference(id: &str, at_ms: i64, transition: &str) -> AuditRecord {
    AuditRecord {
        decision_id: id.to_owned(),
        at_ms,
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Deny,
        principal_id: Some("staff:dee".to_owned()),
        capability: Some("tickets.issue.read".to_owned()),
        policy_revision: Some(1),
        shadow: Some(Box::new(ShadowSide {
            revision: 2,
            transition: transition.to_owned(),
            outcome: RecordOutcome::Allow,
            code: Some("granted".to_owned()),
            path: Some("/grants/7".to_owned()),
            account_id: Some("helpdesk-reader".to_owned()),
            limit_calls: Some(5),
            limit_per: Some("1h".to_owned()),
            gained: Vec::new(),
            lost: Vec::new(),
        })),
        ..AuditRecord::default()
    }
}

async fn the_store_keeps_the_shadow_pointer_and_its_differences(kind: Kind) {
    let place = place(kind).await;
    let store = open(&place.url).await;
    let by = Actor {
        name: "ops".to_owned(),
        at_ms: 1_000,
    };
    assert_eq!(store.shadow_policy().await.expect("read"), None);
    // No such revision: refused, nothing set.
    assert!(!store.set_shadow(Some(1), &by).await.expect("set"));
    let stored = store
        .publish_shadow(NewPolicy {
            version: "sha256:00".to_owned(),
            artifact: POLICY.to_owned(),
            catalog: None,
            author: "ops".to_owned(),
            comment: String::new(),
            created_at_ms: 2_000,
        })
        .await
        .expect("publish a shadow");
    let shadow = store.shadow_policy().await.expect("read").expect("a shadow");
    assert_eq!(
        (shadow.policy.revision, shadow.set.name.as_str()),
        (stored.revision, "ops")
    );
    // Publishing a shadow activates nothing.
    assert_eq!(store.active_policy().await.expect("read"), None);
    assert!(store.set_shadow(None, &by).await.expect("clear"));
    assert_eq!(store.shadow_policy().await.expect("read"), None);

    // A difference is stored with its record, in the same append, and read back whole.
    let old = difference("d1", 10_000, "deny_to_allow");
    let new = difference("d2", 20_000, "deny_to_allow");
    store
        .append_audit(&[old.clone(), new.clone()], &[])
        .await
        .expect("append");
    let read = store
        .shadow_differences(&ShadowFilter {
            limit: 10,
            ..ShadowFilter::default()
        })
        .await
        .expect("read");
    assert_eq!(read.len(), 2);
    assert_eq!(read[0].decision_id, "d2");
    assert_eq!(read[0].shadow, new.shadow);
    // The audit record itself is stored too, without the shadow side.
    let audited = store
        .query_audit(&capgate::store::AuditFilter {
            decision_id: Some("d1".to_owned()),
            limit: 1,
            ..Default::default()
        })
        .await
        .expect("query");
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0].shadow, None);
    let counts = store
        .shadow_counts(&ShadowFilter {
            since_ms: Some(15_000),
            ..ShadowFilter::default()
        })
        .await
        .expect("count");
    assert_eq!(counts.len(), 1);
    assert_eq!((counts[0].records, counts[0].revision), (1, 2));
    // Retention: what is older than the cut goes, the rest stays.
    assert_eq!(store.prune_shadow(15_000).await.expect("prune"), 1);
    let left = store
        .shadow_differences(&ShadowFilter {
            limit: 10,
            ..ShadowFilter::default()
        })
        .await
        .expect("read");
    assert_eq!(
        left.iter().map(|r| r.decision_id.as_str()).collect::<Vec<_>>(),
        ["d2"]
    );
}

fn version(label: &str, catalog: Option<&str>) -> NewPolicy {
    NewPolicy {
        version: label.to_owned(),
        artifact: POLICY.to_owned(),
        catalog: catalog.map(str::to_owned),
        author: "ops".to_owned(),
        comment: String::new(),
        created_at_ms: 2_000,
    }
}

/// A shadow equal to the active version would record nothing and cost an evaluation per call: the
/// transaction that activates the shadow's artifact and catalog (under its revision or a new one)
/// clears the pointer. Activating anything else leaves it.
async fn activating_the_shadow_version_retires_the_shadow(kind: Kind) {
    let place = place(kind).await;
    let store = open(&place.url).await;
    let by = Actor {
        name: "ops".to_owned(),
        at_ms: 3_000,
    };
    let shadow_revision = |store: AnyStore| async move {
        store
            .shadow_policy()
            .await
            .expect("read")
            .map(|shadow| (shadow.policy.revision, shadow.set.name))
    };
    let first = store
        .publish_shadow(version("sha256:aa", None))
        .await
        .expect("shadow");
    // Another version activated: the shadow stays.
    let published = store
        .publish(version("sha256:bb", None), None)
        .await
        .expect("publish");
    assert!(matches!(published, capgate::store::PublishOutcome::Activated(_)));
    assert_eq!(
        shadow_revision(store.clone()).await,
        Some((first.revision, "ops".to_owned()))
    );
    // The same artifact with another catalog is another version: the shadow stays.
    store
        .publish(version("sha256:aa", Some("{}")), None)
        .await
        .expect("publish");
    assert_eq!(
        shadow_revision(store.clone()).await.map(|(revision, _)| revision),
        Some(first.revision)
    );
    // The shadow's own artifact and catalog published again (a new revision): retired.
    store
        .publish(version("sha256:aa", None), None)
        .await
        .expect("publish");
    assert_eq!(shadow_revision(store.clone()).await, None);
    // The shadow's revision activated by number (a rollback or a promotion): retired, by its actor.
    let second = store
        .publish_shadow(version("sha256:cc", None))
        .await
        .expect("shadow");
    assert!(store.set_shadow(Some(second.revision), &by).await.expect("set"));
    assert!(matches!(
        store
            .activate(second.revision, None, &by)
            .await
            .expect("activate"),
        capgate::store::ActivateOutcome::Activated(_)
    ));
    assert_eq!(shadow_revision(store.clone()).await, None);
}
