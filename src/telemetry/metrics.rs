//! Every metric `capgate serve` exports, by name (docs/operations.md, "Telemetry", is the
//! reference an operator reads; keep the two in step).
//!
//! The instruments come from the global meter provider, which [`super::Telemetry::start`]
//! installs before the server runs; without `--otlp-endpoint` or `--metrics-listen` that provider
//! is OpenTelemetry's no-op one and recording costs next to nothing.
//!
//! INVARIANT: every attribute value is drawn from a closed set (an outcome, a reason or problem
//! code, an operation, a result, an RPC name of the proto), so no caller can grow a metric's
//! cardinality, and no value is a principal, a token, a secret reference or a tool argument.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter, ObservableGauge};
use opentelemetry::{InstrumentationScope, KeyValue};

/// `capgate.decisions`: answered `Decide` calls.
pub const DECISIONS: &str = "capgate.decisions";
/// `capgate.request_ids`: requests whose `request_id` was used before: replayed (a retry,
/// answered with its first answer) or reused (refused: the id belongs to another request).
pub const REQUEST_IDS: &str = "capgate.request_ids";
/// `capgate.rpc.duration`: every capgate RPC, from request to response headers.
pub const RPC_DURATION: &str = "capgate.rpc.duration";
pub const HTTP_DURATION: &str = "capgate.http.duration";
/// `capgate.counter_store.duration`: one counter read or consumption.
pub const COUNTER_STORE_DURATION: &str = "capgate.counter_store.duration";
/// `capgate.counter_store.errors`: counter calls that failed or timed out.
pub const COUNTER_STORE_ERRORS: &str = "capgate.counter_store.errors";
/// `capgate.audit.batch.size`: records per audit commit.
pub const AUDIT_BATCH_SIZE: &str = "capgate.audit.batch.size";
/// `capgate.audit.commit.duration`: one audit transaction against the store.
pub const AUDIT_COMMIT_DURATION: &str = "capgate.audit.commit.duration";
/// `capgate.audit.rejected`: audit entries the store refused for their values, set aside.
pub const AUDIT_REJECTED: &str = "capgate.audit.rejected";
/// `capgate.audit.spool.size`: bytes of spool files waiting for replay.
pub const AUDIT_SPOOL_SIZE: &str = "capgate.audit.spool.size";
/// `capgate.audit.spool.oldest_age`: how long the oldest entry waiting for replay has waited.
pub const AUDIT_SPOOL_OLDEST_AGE: &str = "capgate.audit.spool.oldest_age";
/// `capgate.policy.active_revision`: the revision this replica decides on.
pub const ACTIVE_REVISION: &str = "capgate.policy.active_revision";
/// `capgate.policy.swaps`: installations of a policy version on this replica.
pub const POLICY_SWAPS: &str = "capgate.policy.swaps";
/// `capgate.connections.closed`: decision-port connections the server closed, by reason.
pub const CONNECTIONS_CLOSED: &str = "capgate.connections.closed";
/// `capgate.policy.shadow_revision`: the shadow revision this replica evaluates beside the active one.
pub const SHADOW_REVISION: &str = "capgate.policy.shadow_revision";
/// `capgate.shadow.differences`: decisions and listings the shadow version answered otherwise, by
/// transition (docs/decisions/0035).
pub const SHADOW_DIFFERENCES: &str = "capgate.shadow.differences";

/// Seconds, from 100 µs (a denial decided in memory) to 10 s (far past every timeout).
const LATENCY_BOUNDARIES: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Records, in powers of two up to the largest `--audit-batch` worth telling apart.
const BATCH_BOUNDARIES: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// The instruments.
pub struct Metrics {
    decisions: Counter<u64>,
    request_ids: Counter<u64>,
    rpc_duration: Histogram<f64>,
    http_duration: Histogram<f64>,
    counter_store_duration: Histogram<f64>,
    counter_store_errors: Counter<u64>,
    audit_batch_size: Histogram<u64>,
    audit_commit_duration: Histogram<f64>,
    policy_swaps: Counter<u64>,
    connections_closed: Counter<u64>,
    /// 0 while no version is active (then the gauge reports nothing).
    active_revision: Arc<AtomicU64>,
    _active_revision_gauge: ObservableGauge<u64>,
    /// 0 while no shadow is set (then the gauge reports nothing).
    shadow_revision: Arc<AtomicU64>,
    _shadow_revision_gauge: ObservableGauge<u64>,
    shadow_differences: Counter<u64>,
    audit_rejected: Counter<u64>,
    /// What the spool holds, while there is one.
    spool: Arc<SpoolBacklog>,
    _spool_size_gauge: ObservableGauge<u64>,
    _spool_oldest_age_gauge: ObservableGauge<f64>,
}

/// The spool's backlog as the gauges read it: nothing is reported until a
/// spool reports, so a replica without one has no such series.
#[derive(Default)]
struct SpoolBacklog {
    present: AtomicBool,
    bytes: AtomicU64,
    /// Milliseconds since the Unix epoch; 0 when nothing waits.
    oldest_at_ms: AtomicI64,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's instruments, made on first use from the global meter provider.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(|| {
        let scope = InstrumentationScope::builder("capgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Metrics::new(&opentelemetry::global::meter_with_scope(scope))
    })
}

/// How a counter-store or audit call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Ok,
    Error,
    Timeout,
}

/// Where the audit writer met an entry the store refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditPath {
    /// A request's entries, on their way to the store: the request fails.
    Write,
    /// A spooled entry, replayed: it is moved to the spool's `rejected/`.
    Replay,
}

impl AuditPath {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditPath::Write => "write",
            AuditPath::Replay => "replay",
        }
    }
}

impl CallResult {
    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Error => "error",
            CallResult::Timeout => "timeout",
        }
    }
}

/// Why the server closed a connection of the decision port (docs/decisions/0013).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// `--max-connections` were open: closed as soon as accepted.
    MaxConnections,
    /// TLS and the HTTP/2 preface were not done within `--handshake-timeout`.
    HandshakeTimeout,
    /// The peer closed, failed TLS, or did not speak HTTP/2 before its handshake was done.
    HandshakeError,
    /// No stream was open for `--idle-timeout`.
    IdleTimeout,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::MaxConnections => "max_connections",
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::HandshakeError => "handshake_error",
            CloseReason::IdleTimeout => "idle_timeout",
        }
    }
}

impl Metrics {
    fn new(meter: &Meter) -> Metrics {
        let active_revision = Arc::new(AtomicU64::new(0));
        let observed = active_revision.clone();
        let shadow_revision = Arc::new(AtomicU64::new(0));
        let shadow_observed = shadow_revision.clone();
        let spool = Arc::new(SpoolBacklog::default());
        let (sized, aged) = (spool.clone(), spool.clone());
        Metrics {
            decisions: meter
                .u64_counter(DECISIONS)
                .with_description("Decide calls answered, by outcome and reason (or problem) code")
                .with_unit("{decision}")
                .build(),
            request_ids: meter
                .u64_counter(REQUEST_IDS)
                .with_description(
                    "Requests whose request_id was used before, by door and result: replayed (a retry, given \
                     its first answer) or reused (refused: the id belongs to another request)",
                )
                .with_unit("{request}")
                .build(),
            rpc_duration: meter
                .f64_histogram(RPC_DURATION)
                .with_description("capgate RPCs, from the request to the response, by method and gRPC status")
                .with_unit("s")
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build(),
            http_duration: meter
                .f64_histogram(HTTP_DURATION)
                .with_description("Requests to the AuthZEN HTTP door, from the request to the response, by route and status")
                .with_unit("s")
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build(),
            counter_store_duration: meter
                .f64_histogram(COUNTER_STORE_DURATION)
                .with_description("Audit transactions that counted capped calls (operation `count`), by result")
                .with_unit("s")
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build(),
            counter_store_errors: meter
                .u64_counter(COUNTER_STORE_ERRORS)
                .with_description("Audit transactions counting capped calls that failed or timed out (their usage unknown)")
                .with_unit("{error}")
                .build(),
            audit_batch_size: meter
                .u64_histogram(AUDIT_BATCH_SIZE)
                .with_description("Audit records per commit attempt, by result")
                .with_unit("{record}")
                .with_boundaries(BATCH_BOUNDARIES.to_vec())
                .build(),
            audit_commit_duration: meter
                .f64_histogram(AUDIT_COMMIT_DURATION)
                .with_description("Audit transactions against the store, by result")
                .with_unit("s")
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build(),
            policy_swaps: meter
                .u64_counter(POLICY_SWAPS)
                .with_description("Policy versions installed on this replica, the first one included")
                .with_unit("{swap}")
                .build(),
            connections_closed: meter
                .u64_counter(CONNECTIONS_CLOSED)
                .with_description("Decision-port connections the server closed, by reason")
                .with_unit("{connection}")
                .build(),
            _active_revision_gauge: meter
                .u64_observable_gauge(ACTIVE_REVISION)
                .with_description("The policy revision this replica decides on")
                .with_unit("{revision}")
                .with_callback(move |observer| {
                    let revision = observed.load(Ordering::Relaxed);
                    if revision > 0 {
                        observer.observe(revision, &[]);
                    }
                })
                .build(),
            active_revision,
            _shadow_revision_gauge: meter
                .u64_observable_gauge(SHADOW_REVISION)
                .with_description("The shadow policy revision this replica evaluates beside the active one")
                .with_unit("{revision}")
                .with_callback(move |observer| {
                    let revision = shadow_observed.load(Ordering::Relaxed);
                    if revision > 0 {
                        observer.observe(revision, &[]);
                    }
                })
                .build(),
            shadow_revision,
            shadow_differences: meter
                .u64_counter(SHADOW_DIFFERENCES)
                .with_description(
                    "Decisions and listings the shadow policy version answered otherwise than the active one, \
                     by transition",
                )
                .with_unit("{decision}")
                .build(),
            audit_rejected: meter
                .u64_counter(AUDIT_REJECTED)
                .with_description(
                    "Audit entries (records, responses to remember) the store refused for their values and \
                     that were set aside, by where they were met",
                )
                .with_unit("{entry}")
                .build(),
            _spool_size_gauge: meter
                .u64_observable_gauge(AUDIT_SPOOL_SIZE)
                .with_description("Bytes of audit spool files waiting for replay into the store")
                .with_unit("By")
                .with_callback(move |observer| {
                    if sized.present.load(Ordering::Relaxed) {
                        observer.observe(sized.bytes.load(Ordering::Relaxed), &[]);
                    }
                })
                .build(),
            _spool_oldest_age_gauge: meter
                .f64_observable_gauge(AUDIT_SPOOL_OLDEST_AGE)
                .with_description(
                    "How long the oldest audit entry waiting in the spool has waited (0 when none)",
                )
                .with_unit("s")
                .with_callback(move |observer| {
                    if aged.present.load(Ordering::Relaxed) {
                        let oldest = aged.oldest_at_ms.load(Ordering::Relaxed);
                        let waited_ms = match oldest {
                            0 => 0,
                            oldest => crate::clock::now().saturating_sub(oldest).max(0),
                        };
                        observer.observe(waited_ms as f64 / 1000.0, &[]);
                    }
                })
                .build(),
            spool,
        }
    }

    /// A decision answered with `outcome` and `code`, through `door` (`capgate` for `Decide`).
    pub fn request_id(&self, door: &'static str, result: &'static str) {
        self.request_ids
            .add(1, &[KeyValue::new("door", door), KeyValue::new("result", result)]);
    }

    pub fn decision(&self, door: &'static str, outcome: &'static str, code: &str) {
        self.decisions.add(
            1,
            &[
                KeyValue::new("door", door),
                KeyValue::new("outcome", outcome),
                KeyValue::new("code", code.to_owned()),
            ],
        );
    }

    /// A capgate RPC ended with `status`; `outcome` for a `Decide` that was answered.
    pub fn rpc(&self, method: &'static str, status: i64, outcome: Option<&'static str>, elapsed: Duration) {
        let mut attributes = vec![
            KeyValue::new("rpc.method", method),
            KeyValue::new("rpc.grpc.status_code", status),
        ];
        if let Some(outcome) = outcome {
            attributes.push(KeyValue::new("outcome", outcome));
        }
        self.rpc_duration.record(elapsed.as_secs_f64(), &attributes);
    }

    /// An HTTP request to `route` answered with `status`.
    pub fn http(&self, route: &'static str, status: u16, elapsed: Duration) {
        let attributes = [
            KeyValue::new("http.route", route),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ];
        self.http_duration.record(elapsed.as_secs_f64(), &attributes);
    }

    /// One audit transaction that counted capped calls (`count`), its whole commit timed.
    pub fn counter_store(&self, operation: &'static str, result: CallResult, elapsed: Duration) {
        let attributes = [
            KeyValue::new("operation", operation),
            KeyValue::new("result", result.as_str()),
        ];
        self.counter_store_duration
            .record(elapsed.as_secs_f64(), &attributes);
        if result != CallResult::Ok {
            self.counter_store_errors.add(1, &attributes);
        }
    }

    /// One audit commit attempt of `records` records.
    pub fn audit_commit(&self, records: usize, result: CallResult, elapsed: Duration) {
        let attributes = [KeyValue::new("result", result.as_str())];
        self.audit_batch_size
            .record(u64::try_from(records).unwrap_or(u64::MAX), &attributes);
        self.audit_commit_duration
            .record(elapsed.as_secs_f64(), &attributes);
    }

    /// The server closed a connection of the decision port.
    pub fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed
            .add(1, &[KeyValue::new("reason", reason.as_str())]);
    }

    /// `entries` audit entries refused by the store and set aside, met on `path`.
    pub fn audit_rejected(&self, path: AuditPath, entries: usize) {
        self.audit_rejected.add(
            u64::try_from(entries).unwrap_or(u64::MAX),
            &[KeyValue::new("source", path.as_str())],
        );
    }

    /// The spool now holds `bytes` waiting for replay, the oldest entry from
    /// `oldest_at_ms` (milliseconds since the Unix epoch; `None` when empty).
    pub fn audit_spool(&self, bytes: u64, oldest_at_ms: Option<i64>) {
        self.spool.bytes.store(bytes, Ordering::Relaxed);
        // 0 means "none": an entry from the epoch itself is reported as 1 ms after it.
        self.spool
            .oldest_at_ms
            .store(oldest_at_ms.map_or(0, |at| at.max(1)), Ordering::Relaxed);
        self.spool.present.store(true, Ordering::Relaxed);
    }

    /// `revision` is now the shadow version this replica evaluates (`None`: none).
    pub fn shadow_installed(&self, revision: Option<u64>) {
        self.shadow_revision
            .store(revision.unwrap_or(0), Ordering::Relaxed);
    }

    /// The shadow version answered a request otherwise, as `transition` (a closed set:
    /// `changes::Transition`'s names).
    pub fn shadow_difference(&self, transition: &'static str) {
        self.shadow_differences
            .add(1, &[KeyValue::new("transition", transition)]);
    }

    /// `revision` is now the version this replica decides on.
    pub fn policy_installed(&self, revision: u64) {
        self.active_revision.store(revision, Ordering::Relaxed);
        self.policy_swaps.add(1, &[]);
    }
}
