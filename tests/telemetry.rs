//! Telemetry of `capgate serve`, end to end (docs/service.md, docs/operations.md "Telemetry"): a real
//! `serve` process exports over OTLP/gRPC to a real receiver (tests/support/otlp.rs: a tonic
//! server implementing the collector's `TraceService` and `MetricsService` from
//! `opentelemetry-proto`) and serves Prometheus text that is scraped over real HTTP.
//!
//! * [`spans_and_metrics_describe_each_call`]: one span per RPC with the documented name and
//!   attributes (the decision id of the real response, outcome, code, revision), the caller's
//!   `traceparent` honoured, the resource attributes, every documented metric with plausible
//!   values, and the same values in `GET /metrics`.
//! * [`shutdown_flushes_the_exporters`]: with a 60 s interval, what a process holds still arrives
//!   when it is stopped.
//! * [`no_token_or_secret_reference_reaches_telemetry`]: unique token values and a unique secret
//!   reference, live in the calls, appear in no exported byte, no scrape and no log line (debug
//!   level included).
//! * [`log_lines_are_human_by_default_and_json_on_request`], [`unusable_telemetry_flags_are_usage_errors`],
//!   [`an_https_collector_is_reached_with_the_given_ca`].

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{
    list_visible_request, list_visible_response, DecideRequest, DecideResponse, ListVisibleRequest,
    ListVisibleResponse,
};
use opentelemetry_proto::tonic::metrics::v1::metric;
use opentelemetry_proto::tonic::trace::v1::span;
use support::client::{
    ana, dee, for_capability, for_tool, principal, recorded_outcome, wait_serving, CATALOG, POLICY,
};
use support::otlp::{
    eventually, gauge_value, histogram, http_get, int, leaks, metrics_addr, prometheus_value, sum_value,
    text, Receiver, DECIDE_SPAN, LIST_SPAN,
};
use support::process::Serve;
use tonic::transport::{Channel, Identity};

/// How long anything exported every second may take to arrive.
const ARRIVES_WITHIN: Duration = Duration::from_secs(20);

// ── The server under test ─────────────────────────────────────────────────

/// Files and a database for one server.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new(policy: &str) -> Scene {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("policy.yaml"), policy).expect("write the policy");
        std::fs::write(dir.path().join("catalog.yaml"), CATALOG).expect("write the catalog");
        Scene { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir
            .path()
            .join(name)
            .to_str()
            .expect("a UTF-8 path")
            .to_owned()
    }

    /// `--database-url`, `--policy`, `--catalog`, then `extra`.
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--database-url".to_owned(),
            format!("sqlite://{}", self.path("capgate.db")),
            "--policy".to_owned(),
            self.path("policy.yaml"),
            "--catalog".to_owned(),
            self.path("catalog.yaml"),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    }
}

async fn start(args: &[String], env: &[(&str, &str)]) -> (Serve, Channel) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = Serve::start_with_env(&args, env).await;
    let channel = serve.channel().await;
    wait_serving(&channel, Duration::from_secs(10)).await;
    (serve, channel)
}

async fn decide(channel: &Channel, request: DecideRequest) -> DecideResponse {
    DecisionServiceClient::new(channel.clone())
        .decide(request)
        .await
        .expect("Decide answers")
        .into_inner()
}

fn list_request(who: capgate::wire::proto::AssertedPrincipal) -> ListVisibleRequest {
    ListVisibleRequest {
        caller: Some(list_visible_request::Caller::Principal(who)),
        request_id: String::new(),
    }
}

fn visible_count(response: &ListVisibleResponse) -> usize {
    match &response.result {
        Some(list_visible_response::Result::Visible(visible)) => visible.capabilities.len(),
        other => panic!("expected a listing, got {other:?}"),
    }
}

// ── The tests ─────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_describe_each_call() {
    let receiver = Receiver::start(None).await;
    let scene = Scene::new(POLICY);
    let endpoint = receiver.endpoint();
    let (serve, channel) = start(
        &scene.args(&[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "1s",
            "--metrics-listen",
            "127.0.0.1:0",
        ]),
        &[],
    )
    .await;

    // Two uncapped allows, a capped allow (the counter store is read and consumed once), a
    // denial, an unknown tool and an unknown issuer.
    let calls = vec![
        (for_capability(dee(), "docs.page.search"), "allow", "granted"),
        (for_capability(dee(), "docs.page.search"), "allow", "granted"),
        (for_capability(ana(), "tickets.issue.read"), "allow", "granted"),
        (
            for_capability(ana(), "tickets.issue.write"),
            "deny",
            "no_grant_matches",
        ),
        (for_tool(ana(), "nowhere__nothing"), "unknown_tool", "none"),
        (
            for_capability(principal("strangers", "x", &[]), "docs.page.search"),
            "unauthenticated",
            "issuer_unknown",
        ),
    ];
    let mut answered = Vec::new();
    for (request, outcome, code) in calls {
        let response = decide(&channel, request).await;
        assert_eq!(recorded_outcome(&response), outcome, "{response:?}");
        answered.push((response, outcome, code));
    }
    // One more allow, as a child of the caller's span.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut traced = tonic::Request::new(for_capability(dee(), "docs.page.search"));
    traced.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01")
            .parse()
            .expect("a metadata value"),
    );
    let traced = DecisionServiceClient::new(channel.clone())
        .decide(traced)
        .await
        .expect("Decide answers")
        .into_inner();
    answered.push((traced.clone(), "allow", "granted"));
    let listed = DecisionServiceClient::new(channel.clone())
        .list_visible(list_request(ana()))
        .await
        .expect("ListVisible answers")
        .into_inner();
    let visible = visible_count(&listed);
    assert!(visible > 0, "Ana sees something: {listed:?}");

    // ── Spans ──
    let ids: Vec<String> = answered
        .iter()
        .map(|(response, ..)| response.decision_id.clone())
        .collect();
    eventually("a span for every decision", ARRIVES_WITHIN, || {
        ids.iter()
            .all(|id| receiver.decision_span(id).is_some())
            .then_some(())
    })
    .await;
    let mut instances = BTreeSet::new();
    for (response, outcome, code) in &answered {
        let (resource, span) = receiver.decision_span(&response.decision_id).expect("its span");
        assert_eq!(span.name, DECIDE_SPAN);
        assert_eq!(span.kind(), span::SpanKind::Server);
        let attributes = &span.attributes;
        assert_eq!(
            text(attributes, "capgate.outcome").as_deref(),
            Some(*outcome),
            "{span:?}"
        );
        assert_eq!(
            text(attributes, "capgate.code").as_deref(),
            Some(*code),
            "{span:?}"
        );
        assert_eq!(
            int(attributes, "capgate.policy.revision"),
            Some(i64::try_from(response.policy_revision).unwrap()),
            "{span:?}"
        );
        assert_eq!(
            text(attributes, "capgate.policy.version"),
            Some(response.policy_version.clone())
        );
        assert_eq!(text(attributes, "rpc.system").as_deref(), Some("grpc"));
        assert_eq!(
            text(attributes, "rpc.service").as_deref(),
            Some("capgate.v1.DecisionService")
        );
        assert_eq!(text(attributes, "rpc.method").as_deref(), Some("Decide"));
        assert_eq!(int(attributes, "rpc.grpc.status_code"), Some(0));
        assert_eq!(text(&resource, "service.name").as_deref(), Some("capgate"));
        assert_eq!(
            text(&resource, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        instances.insert(text(&resource, "service.instance.id").expect("service.instance.id"));
    }
    assert_eq!(instances.len(), 1, "one instance id per process: {instances:?}");
    let instance = instances.into_iter().next().unwrap();
    assert!(!instance.is_empty());

    let (_, traced_span) = receiver.decision_span(&traced.decision_id).unwrap();
    assert_eq!(
        hex(&traced_span.trace_id),
        trace_id,
        "the caller's trace continues"
    );
    assert_eq!(
        hex(&traced_span.parent_span_id),
        parent_id,
        "the caller's span is the parent"
    );

    let list_span = eventually("the ListVisible span", ARRIVES_WITHIN, || {
        receiver
            .spans()
            .into_iter()
            .find(|(_, span)| span.name == LIST_SPAN)
    })
    .await
    .1;
    assert_eq!(
        int(&list_span.attributes, "capgate.visible.count"),
        Some(i64::try_from(visible).unwrap())
    );
    assert_eq!(
        int(&list_span.attributes, "capgate.policy.revision"),
        Some(i64::try_from(listed.policy_revision).unwrap())
    );
    assert_eq!(
        text(&list_span.attributes, "capgate.outcome").as_deref(),
        Some("allow")
    );
    // Health checks (wait_serving) are not capgate RPCs: no span.
    assert!(
        receiver
            .spans()
            .iter()
            .all(|(_, span)| span.name.starts_with("capgate.v1.")),
        "only capgate RPCs have spans: {:?}",
        receiver
            .spans()
            .iter()
            .map(|(_, span)| &span.name)
            .collect::<Vec<_>>()
    );

    // ── Metrics over OTLP ──
    let allows = answered
        .iter()
        .filter(|(_, outcome, _)| *outcome == "allow")
        .count();
    let decides = answered.len();
    let decisions = eventually("every decision counted", ARRIVES_WITHIN, || {
        let (_, metric) = receiver.latest_metric("capgate.decisions")?;
        (sum_value(
            &metric,
            &[("door", "capgate"), ("outcome", "allow"), ("code", "granted")],
        ) == Some(i64::try_from(allows).unwrap()))
        .then_some(metric)
    })
    .await;
    for (outcome, code) in [
        ("deny", "no_grant_matches"),
        ("unknown_tool", "none"),
        ("unauthenticated", "issuer_unknown"),
    ] {
        assert_eq!(
            sum_value(&decisions, &[("outcome", outcome), ("code", code)]),
            Some(1),
            "{outcome}/{code}: {decisions:?}"
        );
    }
    let Some(metric::Data::Sum(sum)) = &decisions.data else {
        unreachable!()
    };
    assert!(sum.is_monotonic, "capgate.decisions is a counter");

    // Read the rest from the export that already holds every call's effects.
    let metric = |name: &str| {
        receiver
            .latest_metric(name)
            .unwrap_or_else(|| panic!("{name} was exported"))
            .1
    };
    let rpc = metric("capgate.rpc.duration");
    assert_eq!(rpc.unit, "s");
    let (count, sum) = histogram(&rpc, &[("rpc.method", "Decide")]);
    assert_eq!(
        count,
        u64::try_from(decides).unwrap(),
        "every Decide timed: {rpc:?}"
    );
    assert!(
        sum > 0.0 && sum < 10.0 * decides as f64,
        "plausible seconds: {sum}"
    );
    assert_eq!(
        histogram(&rpc, &[("rpc.method", "Decide"), ("outcome", "allow")]).0,
        u64::try_from(allows).unwrap()
    );
    assert_eq!(histogram(&rpc, &[("rpc.method", "ListVisible")]).0, 1);

    let counter = metric("capgate.counter_store.duration");
    assert_eq!(counter.unit, "s");
    assert_eq!(
        histogram(&counter, &[("operation", "count"), ("result", "ok")]).0,
        1,
        "the one capped allow was counted in one audit transaction"
    );
    assert!(
        receiver.latest_metric("capgate.counter_store.errors").is_none(),
        "no counter call failed"
    );

    // Every Decide writes one record, and so does the listing, whatever it shows.
    let records = decides + 1;
    let batches = metric("capgate.audit.batch.size");
    let (commits, recorded) = histogram(&batches, &[("result", "ok")]);
    assert_eq!(
        recorded, records as f64,
        "every record in a committed batch: {batches:?}"
    );
    assert!(commits >= 1 && commits <= u64::try_from(records).unwrap());
    let commit = metric("capgate.audit.commit.duration");
    assert_eq!(commit.unit, "s");
    assert_eq!(histogram(&commit, &[("result", "ok")]).0, commits);

    let revision = i64::try_from(answered[0].0.policy_revision).unwrap();
    assert_eq!(
        gauge_value(&metric("capgate.policy.active_revision")),
        Some(revision)
    );
    assert_eq!(sum_value(&metric("capgate.policy.swaps"), &[]), Some(1));
    let (resource, _) = receiver.latest_metric("capgate.decisions").unwrap();
    assert_eq!(text(&resource, "service.name").as_deref(), Some("capgate"));
    assert_eq!(text(&resource, "service.instance.id"), Some(instance.clone()));

    // ── The same metrics as Prometheus text ──
    let addr = metrics_addr(&serve);
    let (status, scraped) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "{scraped}");
    let value = |name: &str, labels: &[(&str, &str)]| {
        prometheus_value(&scraped, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} in:\n{scraped}"))
    };
    assert_eq!(
        value(
            "capgate_decisions_total",
            &[("outcome", "allow"), ("code", "granted")]
        ),
        allows as f64
    );
    assert_eq!(
        value(
            "capgate_decisions_total",
            &[("outcome", "deny"), ("code", "no_grant_matches")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "capgate_rpc_duration_seconds_count",
            &[("rpc_method", "Decide"), ("outcome", "allow")]
        ),
        allows as f64
    );
    assert_eq!(
        value(
            "capgate_counter_store_duration_seconds_count",
            &[("operation", "count"), ("result", "ok")]
        ),
        1.0
    );
    assert_eq!(
        value("capgate_audit_batch_size_sum", &[("result", "ok")]),
        records as f64
    );
    assert_eq!(
        value("capgate_audit_commit_duration_seconds_count", &[("result", "ok")]),
        commits as f64
    );
    assert_eq!(value("capgate_policy_active_revision", &[]), revision as f64);
    assert_eq!(value("capgate_policy_swaps_total", &[]), 1.0);
    assert_eq!(
        value(
            "target_info",
            &[("service_name", "capgate"), ("service_instance_id", &instance)]
        ),
        1.0
    );
    let (status, _) = http_get(addr, "/elsewhere").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_the_exporters() {
    let receiver = Receiver::start(None).await;
    let scene = Scene::new(POLICY);
    let endpoint = receiver.endpoint();
    // Nothing would be sent for a minute: what arrives, the shutdown sent.
    let (mut serve, channel) = start(
        &scene.args(&["--otlp-endpoint", &endpoint, "--otlp-interval", "60s"]),
        &[],
    )
    .await;
    let response = decide(&channel, for_capability(dee(), "docs.page.search")).await;
    assert_eq!(recorded_outcome(&response), "allow");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        receiver.decision_span(&response.decision_id).is_none(),
        "nothing is exported before the interval"
    );

    serve.terminate();
    let status = serve.wait(Duration::from_secs(30)).await;
    assert!(status.success(), "serve exits 0: {status:?}");
    assert!(
        receiver.decision_span(&response.decision_id).is_some(),
        "the span was flushed at shutdown:\n{}",
        serve.logs()
    );
    let (_, decisions) = receiver
        .latest_metric("capgate.decisions")
        .unwrap_or_else(|| panic!("the metrics were flushed at shutdown:\n{}", serve.logs()));
    assert_eq!(
        sum_value(&decisions, &[("outcome", "allow"), ("code", "granted")]),
        Some(1)
    );
    let (_, commits) = receiver
        .latest_metric("capgate.audit.batch.size")
        .expect("audit metrics");
    assert_eq!(histogram(&commits, &[("result", "ok")]).1, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_secret_reference_reaches_telemetry() {
    let unique = support::unique();
    let gateway_token = format!("sentinel-gateway-token-{unique}");
    let admin_token = format!("sentinel-admin-token-{unique}");
    let wrong_token = format!("sentinel-wrong-token-{unique}");
    let secret_target = format!("sentinel-secret-{unique}");
    let secret_ref = format!("vault://secret/mcp/{secret_target}#token");
    let policy = POLICY.replace("vault://secret/mcp/helpdesk-ro#token", &secret_ref);
    assert_ne!(policy, POLICY, "the example's secret reference moved");

    let receiver = Receiver::start(None).await;
    let scene = Scene::new(&policy);
    std::fs::write(scene.dir.path().join("gateway.token"), &gateway_token).unwrap();
    std::fs::write(scene.dir.path().join("admin.token"), &admin_token).unwrap();
    let endpoint = receiver.endpoint();
    let gateway = format!("edge=file://{}", scene.path("gateway.token"));
    let admin = format!("ci=file://{}", scene.path("admin.token"));
    let (mut serve, channel) = start(
        &scene.args(&[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "1s",
            "--metrics-listen",
            "127.0.0.1:0",
            // A gateway that may assert principals, as every call here does.
            "--asserting-gateway-token",
            &gateway,
            "--admin-token",
            &admin,
        ]),
        // Every line capgate logs, at the most talkative level it has.
        &[("CAPGATE_LOG", "debug")],
    )
    .await;

    let mut decisions = DecisionServiceClient::new(channel.clone());
    let allowed = decisions
        .decide(with_token(
            &gateway_token,
            for_capability(ana(), "tickets.issue.read"),
        ))
        .await
        .expect("Decide answers")
        .into_inner();
    let listed = decisions
        .list_visible(with_token(&admin_token, list_request(ana())))
        .await
        .expect("ListVisible answers")
        .into_inner();
    let refused = decisions
        .decide(with_token(
            &wrong_token,
            for_capability(ana(), "tickets.issue.read"),
        ))
        .await
        .expect_err("a wrong token is refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    // The sentinels were live: the answers carry the secret reference, and the search below
    // finds it where it is.
    let answers = format!("{allowed:?}\n{listed:?}");
    assert!(
        leaks(answers.as_bytes(), &secret_target),
        "the secret reference is in the answers"
    );

    eventually("the decision's span", ARRIVES_WITHIN, || {
        receiver.decision_span(&allowed.decision_id)
    })
    .await;
    let (_, scraped) = http_get(metrics_addr(&serve), "/metrics").await;
    assert!(scraped.contains("capgate_decisions_total"), "{scraped}");
    serve.terminate();
    assert!(serve.wait(Duration::from_secs(30)).await.success());

    let (bytes, text) = receiver.everything();
    assert!(!bytes.is_empty());
    let logs = serve.logs();
    assert!(
        logs.lines().any(|line| line.contains(&allowed.decision_id)),
        "the debug log names the decision: {logs}"
    );
    for line in logs.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "`--log-format json` writes JSON lines only: {line}"
        );
    }
    for sentinel in [&gateway_token, &admin_token, &wrong_token, &secret_target] {
        assert!(
            !leaks(&bytes, sentinel),
            "`{sentinel}` was exported over OTLP:\n{text}"
        );
        assert!(
            !leaks(text.as_bytes(), sentinel),
            "`{sentinel}` was exported over OTLP"
        );
        assert!(
            !leaks(scraped.as_bytes(), sentinel),
            "`{sentinel}` is in /metrics"
        );
        assert!(
            !leaks(logs.as_bytes(), sentinel),
            "`{sentinel}` was logged:\n{logs}"
        );
    }
}

/// `request` with `authorization: Bearer token`.
fn with_token<T>(token: &str, request: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a metadata value"),
    );
    request
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_are_human_by_default_and_json_on_request() {
    let scene = Scene::new(POLICY);
    let mut child = Command::new(env!("CARGO_BIN_EXE_capgate"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(scene.args(&[]))
        .env("CAPGATE_LOG", "info")
        .env_remove("CAPGATE_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn capgate serve");
    let stderr = child.stderr.take().expect("piped standard error");
    let (lines, found) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let serving = loop {
        match found.recv_timeout(Duration::from_secs(15)) {
            Ok(line) if line.contains("capgate serving") => break line,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("no `capgate serving` line: {seen:?}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        serde_json::from_str::<serde_json::Value>(&serving).is_err(),
        "human by default: {serving}"
    );
    assert!(serving.contains("INFO"), "{serving}");
    // JSON on request: every other test reads `--log-format json` lines (support/process.rs),
    // and the sentinel test checks every one of them parses.
}

#[test]
fn unusable_telemetry_flags_are_usage_errors() {
    let scene = Scene::new(POLICY);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--otlp-endpoint", "ftp://collector:4317"],
            "`http://` or `https://`",
        ),
        (&["--otlp-endpoint", "collector:4317"], "`http://` or `https://`"),
        (
            &["--otlp-endpoint", "http://user:pass@collector:4317"],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (&["--otlp-endpoint", "https://collector:4317"], "--otlp-ca"),
        (
            &[
                "--otlp-endpoint",
                "http://127.0.0.1:4317",
                "--otlp-interval",
                "0ms",
            ],
            "--otlp-interval",
        ),
        (&["--metrics-listen", "not-an-address"], "--metrics-listen"),
    ];
    for (flags, message) in cases {
        let mut child = Command::new(env!("CARGO_BIN_EXE_capgate"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(scene.args(flags))
            .env_remove("CAPGATE_DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run capgate serve");
        // A flag that is wrongly accepted starts a server: stop it rather than wait forever.
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().expect("poll capgate serve").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{flags:?}: capgate serve started instead of refusing the flags");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().expect("capgate serve's output");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{flags:?}: expected `{message}` in {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_collector_is_reached_with_the_given_ca() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "telemetry test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "collector");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();

    let receiver = Receiver::start(Some(Identity::from_pem(cert.pem(), key.serialize_pem()))).await;
    let scene = Scene::new(POLICY);
    std::fs::write(scene.dir.path().join("ca.pem"), ca.pem()).unwrap();
    let endpoint = format!("https://localhost:{}", receiver.addr.port());
    let ca_file = scene.path("ca.pem");
    let (_serve, channel) = start(
        &scene.args(&[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-ca",
            &ca_file,
            "--otlp-interval",
            "1s",
        ]),
        &[],
    )
    .await;
    let response = decide(&channel, for_capability(dee(), "docs.page.search")).await;
    eventually("the span, over TLS", ARRIVES_WITHIN, || {
        receiver.decision_span(&response.decision_id)
    })
    .await;
    eventually("the metrics, over TLS", ARRIVES_WITHIN, || {
        receiver.latest_metric("capgate.decisions")
    })
    .await;
}
