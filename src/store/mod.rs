//! The store port: everything the service shares between replicas — policy
//! versions, usage counters, the audit trail, idempotency keys — behind one
//! trait with two real implementations, PostgreSQL (production, many
//! replicas) and SQLite (the embedded default: one replica, a laptop, an
//! edge box). Nothing else holds state (docs/service.md).
//!
//! [`connect`] opens the store a URL names as an [`AnyStore`], which is a
//! `Store` itself: code that only calls the port takes `S: Store` and is
//! handed the `AnyStore`. The server, which runs for long and calls the
//! store on every request, is monomorphised instead, through
//! `with_store!` — the one place that lists the implementations. The same
//! behavioural suite (`tests/store.rs`) runs against both implementations.
//!
//! Changes to this port since the server started coding against it:
//! * `Remembered` carries `at_ms`, the decision time, so retention can be
//!   judged by the caller and old entries pruned by time.
//! * `policy_changed` keeps its signature; its contract is now precise (see
//!   the method): one subscription per store value, shared by clones, and a
//!   (re)subscription resolves at once.
//! * Added: [`connect`], [`StoreOptions`], [`AnyStore`], [`redact`].
//! * Added: [`Store::prepare_audit_periods`] and [`Store::prune_audit`]
//!   (audit retention, docs/decisions/0009-audit-partitioning.md).
//! * Added: [`Store::claim_request`] and [`Store::forget_requests`]
//!   (idempotency across replicas, docs/decisions/0016); a claim and a
//!   remembered answer carry the request's [`Fingerprint`], and
//!   [`Store::request_key`] keeps the key it is made with (docs/decisions/0027).
//! * Audit records are typed ([`RecordKind`], [`RecordOutcome`],
//!   [`RecordCode`]); a stored value this build cannot read is
//!   [`StoreError::Corrupt`].
//! * [`StoreError`] keeps the database's error as its source.
//! * `Counted` is now [`CounterReading`] (it is a counter as read, and the
//!   core's `Usage::Counted` is another thing).
//! * Added: [`StoreError::is_data_error`], which tells a write the store
//!   refused for its values from a store that failed.
//! * `activate` takes the [`Actor`]; every change of the active version is
//!   recorded with it ([`Store::activations`]). Added: [`Store::counters`],
//!   [`Store::reset_usage`] and [`Store::usage_resets`] (the operator's view
//!   of the counters), [`Store::audit_groups`], and more [`AuditFilter`]
//!   fields (tool, gateway, kind, ids, a cursor for following).

use std::future::Future;
use std::time::Duration;

use capgate_core::access::ReasonCode;
use capgate_core::principals::AuthProblem;

mod counting;
pub mod postgres;
pub mod retention;
mod sql;
pub mod sqlite;

pub use counting::{CommitGate, CounterAsk, Tally, COUNT_USAGE};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Why a store operation failed.
///
/// Each message is one line that already says what went wrong, the
/// database's own words included, because every caller prints it as one
/// (a log field, a gRPC status, a CLI error). The database's error is also
/// kept as the [`source`](std::error::Error::source), for callers that
/// branch on it (an SQLSTATE, an I/O error); printing the chain as well
/// would repeat it.
///
/// Messages never contain secret material: a URL is redacted ([`redact`])
/// before it is kept, and sqlx's errors never quote the URL they were given
/// (checked for sqlx 0.9: URL parse errors, connection, TLS and
/// authentication failures); the one that quotes a character of the
/// password is replaced (see `scrub`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database did not answer in time. Neither store returns it: the
    /// server bounds each call itself (`--store-timeout`); it is here for
    /// wrappers that bound an operation and report it as the store's.
    #[error("the store did not answer within {0} ms")]
    Timeout(u64),
    /// The database refused or failed `operation` (the port's method name,
    /// or `connect`).
    #[error("store error during {operation}: {source}")]
    Database {
        operation: &'static str,
        #[source]
        source: sqlx::Error,
    },
    /// The store a URL names cannot be opened. `url` is redacted.
    #[error("store error: cannot open `{url}`: {source}")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// The URL names no store this build has. `url` is redacted.
    #[error("store error: unsupported database URL `{url}`: expected `postgres://…` or `sqlite://…`")]
    UnsupportedUrl { url: String },
    /// A PostgreSQL URL capgate will not connect with. `url` is redacted.
    #[error("store error: cannot use `{url}`: {problem}")]
    UnsupportedUrlSetting {
        url: String,
        problem: postgres::UrlProblem,
    },
    /// The server reached is not the kind the URL's `target_session_attrs` asks for (a standby,
    /// where `read-write` or `primary` was asked for).
    #[error(
        "store error: the server at `{address}` {found}, and the URL asks for \
         `target_session_attrs={wanted}`: point the URL at the primary (with Patroni, HAProxy's \
         port that only the primary passes, deploy/ha/)"
    )]
    WrongServer {
        address: String,
        found: &'static str,
        wanted: &'static str,
    },
    /// Through a pooler in transaction mode the schema is checked, not migrated
    /// (docs/decisions/0033-behind-a-pooler-and-a-failover.md).
    #[error(
        "store error: the schema is not this build's ({detail}), and migrations cannot run \
         through a pooler in transaction mode (`pooler=transaction`: the migrator holds a \
         session's advisory lock): run `capgate migrate` with a URL to PostgreSQL itself or to a \
         pooler in session mode"
    )]
    SchemaNotCurrent { detail: String },
    /// A migration failed; the schema is as the last applied one left it.
    #[error("store error: migration failed: {0}")]
    Migration(#[source] sqlx::migrate::MigrateError),
    /// A value to write does not fit its column (an unsigned count past
    /// `BIGINT`); nothing was written. Refused rather than clamped, because
    /// the row would then lie.
    #[error("store error: `{column}` {value} does not fit the store's BIGINT")]
    OutOfRange { column: &'static str, value: u64 },
    /// A stored value this build cannot read: a negative count, or a kind,
    /// outcome or code it does not know (a newer build's, or a row written
    /// behind the store's back). The whole read fails rather than skip or
    /// guess.
    #[error("store error: the stored `{column}` `{value}` is not a value this build can read")]
    Corrupt { column: &'static str, value: String },
    /// PostgreSQL's notification connection closed; the next
    /// [`Store::policy_changed`] subscribes again.
    #[error("store error: the notification connection was lost; changes may have been missed")]
    NotificationsLost,
    /// The audit writer stopped waiting for the batch before its commit
    /// (`CommitGate`): it was rolled back; nothing was counted or stored.
    #[error("store error: the batch was abandoned before its commit")]
    Abandoned,
    /// Another prune holds the prune lock (PostgreSQL).
    #[error("store error: another prune of the audit trail is running; try again when it is done")]
    PruneRunning,
    /// A prune gave up waiting for its locks `attempts` times, each wait
    /// bounded by `lock_wait_ms` (PostgreSQL); nothing was dropped.
    #[error(
        "store error: audit_log stayed busy through {attempts} attempts (each waits at most \
         {lock_wait_ms} ms for its locks); nothing was dropped, try again later: {source}"
    )]
    PruneBusy {
        attempts: u32,
        lock_wait_ms: u64,
        #[source]
        source: sqlx::Error,
    },
}

impl StoreError {
    /// Whether the store refused the values it was given, as opposed to
    /// failing or not being reached: a value it cannot hold (PostgreSQL
    /// refuses U+0000 in text), a count past `BIGINT`, a violated constraint.
    /// Retrying the same write fails the same way, and the same write without
    /// the offending value succeeds, so the audit writer retries a batch that
    /// fails this way in smaller parts to set the offending record aside
    /// (docs/decisions/0014). Conservative: an error that may be the
    /// connection's, the server's or a timeout's is not one.
    pub fn is_data_error(&self) -> bool {
        match self {
            StoreError::OutOfRange { .. } => true,
            StoreError::Database { source, .. } => {
                matches!(source, sqlx::Error::Encode(_))
                    || postgres::refuses_data(source)
                    || sqlite::refuses_data(source)
            }
            _ => false,
        }
    }

    /// Whether counting a batch's capped calls failed, before anything of the batch was
    /// stored: the same batch may still be stored without counting them.
    pub fn is_counting(&self) -> bool {
        matches!(self, StoreError::Database { operation, .. } if *operation == counting::COUNT_USAGE)
    }

    /// Whether the store has no capgate tables: a database nothing has migrated (neither
    /// `capgate serve` nor `capgate migrate` ran on it).
    pub fn is_missing_table(&self) -> bool {
        let StoreError::Database {
            source: sqlx::Error::Database(database),
            ..
        } = self
        else {
            return false;
        };
        // PostgreSQL's `undefined_table`; SQLite has no code of its own for it.
        database.code().as_deref() == Some("42P01") || database.message().starts_with("no such table")
    }

    /// A database failure during `operation`, its message scrubbed.
    pub(crate) fn database(operation: &'static str, source: sqlx::Error) -> StoreError {
        StoreError::Database {
            operation,
            source: scrub(source),
        }
    }
}

/// `error`, unless its message quotes secret material. sqlx 0.9 reports a
/// password that SASLprep refuses with the `Debug` form of stringprep's
/// error, which names the offending character of the password; that one is
/// replaced by a message of its own (still a configuration error).
fn scrub(error: sqlx::Error) -> sqlx::Error {
    match error {
        sqlx::Error::Configuration(cause) if cause.to_string().contains("saslprep password") => {
            sqlx::Error::Configuration(
                "the password cannot be prepared for SCRAM authentication (SASLprep refuses one of \
                 its characters)"
                    .into(),
            )
        }
        other => other,
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A stored policy version (docs/service.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    /// Monotonic, assigned by the store, starting at 1. PostgreSQL may skip
    /// a number when a publishing transaction fails after taking it.
    pub revision: u64,
    /// `sha256:<hex>` of the artifact's bytes.
    pub version: String,
    pub artifact: String,
    pub catalog: Option<String>,
    pub author: String,
    pub comment: String,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: i64,
}

/// A version to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPolicy {
    pub version: String,
    pub artifact: String,
    pub catalog: Option<String>,
    pub author: String,
    pub comment: String,
    pub created_at_ms: i64,
}

/// Compare-and-set on the active revision: `None` means "don't check",
/// `Some(0)` means "no version may be active yet".
pub type ExpectedRevision = Option<u64>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Stored and activated in one transaction.
    Activated(StoredPolicy),
    /// Same version and catalog as the active one: nothing stored.
    Unchanged(StoredPolicy),
    /// The active revision was not the expected one: nothing changed.
    Conflict { active: Option<u64> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivateOutcome {
    Activated(StoredPolicy),
    NotFound,
    Conflict { active: Option<u64> },
}

/// A usage counter's key: who, doing what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CounterKey<'a> {
    pub principal_id: &'a str,
    pub capability: &'a str,
}

/// A counter as read: calls counted in the window opened at `window_start_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterReading {
    pub calls: u64,
    pub window_start_ms: i64,
}

/// A response to remember for an idempotent retry: `(gateway, request_id, response)`.
pub type RememberedEntry = (String, String, Remembered);

/// The audit entries a batch's capped calls add once they are counted: called by
/// [`Store::commit_batch`] inside its transaction with one tally per ask.
pub type Settle<'a> = &'a (dyn Fn(&[Tally]) -> (Vec<AuditRecord>, Vec<RememberedEntry>) + Sync);

/// What an audit record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// One decision about one call.
    #[default]
    Decide,
    /// One capability seen in a listing.
    List,
}

impl RecordKind {
    pub const ALL: [RecordKind; 2] = [RecordKind::Decide, RecordKind::List];

    /// The column's text, which is also the serde name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Decide => "decide",
            RecordKind::List => "list",
        }
    }

    pub fn parse(text: &str) -> Option<RecordKind> {
        RecordKind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

/// Which protocol a request came through (the `door` column): capgate's own gRPC API, or one of
/// the decision-point protocols gateways already speak. Every door is an adapter over one
/// decision pipeline, so the record is the same whichever door it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// `capgate.v1.DecisionService` (`Decide`, `ListVisible`).
    #[default]
    Capgate,
    /// Envoy's `envoy.service.auth.v3.Authorization/Check`.
    ExtAuthz,
    /// agentgateway's ExtMCP callout.
    ExtMcp,
    /// OpenID AuthZEN 1.0 over HTTP.
    Authzen,
    /// A proxy's forward-auth subrequest (nginx `auth_request`, Caddy, Traefik, HAProxy).
    ForwardAuth,
}

impl Door {
    pub const ALL: [Door; 5] = [
        Door::Capgate,
        Door::ExtAuthz,
        Door::ExtMcp,
        Door::Authzen,
        Door::ForwardAuth,
    ];

    /// The column's text, which is also the serde name and the metrics' `door` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Capgate => "capgate",
            Door::ExtAuthz => "ext_authz",
            Door::ExtMcp => "ext_mcp",
            Door::Authzen => "authzen",
            Door::ForwardAuth => "forward_auth",
        }
    }

    pub fn is_capgate(&self) -> bool {
        *self == Door::Capgate
    }

    pub fn parse(text: &str) -> Option<Door> {
        Door::ALL.into_iter().find(|door| door.as_str() == text)
    }
}

/// How a request ended, as the audit trail records it (the `outcome` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordOutcome {
    Allow,
    /// The default only so that records can be built field by field; every writer sets it.
    #[default]
    Deny,
    /// The caller's identity could not be established (`code` is the problem).
    Unauthenticated,
    /// The tool asked for is not in the active catalog.
    UnknownTool,
    /// A retry of a request answered already, answered with what the first got
    /// (`first_decision_id`); nothing was decided (docs/decisions/0027).
    Replayed,
    /// Refused: the request reused a `request_id` that belongs to another request
    /// (`first_decision_id`, once known); nothing was decided or consumed.
    RequestIdReused,
}

impl RecordOutcome {
    pub const ALL: [RecordOutcome; 6] = [
        RecordOutcome::Allow,
        RecordOutcome::Deny,
        RecordOutcome::Unauthenticated,
        RecordOutcome::UnknownTool,
        RecordOutcome::Replayed,
        RecordOutcome::RequestIdReused,
    ];

    /// The column's text, which is also the serde name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordOutcome::Allow => "allow",
            RecordOutcome::Deny => "deny",
            RecordOutcome::Unauthenticated => "unauthenticated",
            RecordOutcome::UnknownTool => "unknown_tool",
            RecordOutcome::Replayed => "replayed",
            RecordOutcome::RequestIdReused => "request_id_reused",
        }
    }

    pub fn parse(text: &str) -> Option<RecordOutcome> {
        RecordOutcome::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == text)
    }
}

/// The code of a record: a reason code for a decision, a problem code for an authentication
/// failure. Both vocabularies are closed and their spellings do not overlap, so the column holds
/// either as its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordCode {
    Reason(ReasonCode),
    Problem(AuthProblem),
}

impl RecordCode {
    /// The column's text, which is also the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordCode::Reason(code) => code.as_str(),
            RecordCode::Problem(problem) => problem.as_str(),
        }
    }

    /// The code spelled `text`, from either vocabulary.
    pub fn parse(text: &str) -> Option<RecordCode> {
        ReasonCode::ALL
            .into_iter()
            .find(|code| code.as_str() == text)
            .map(RecordCode::Reason)
            .or_else(|| {
                AuthProblem::ALL
                    .into_iter()
                    .find(|problem| problem.as_str() == text)
                    .map(RecordCode::Problem)
            })
    }
}

// As text wherever they are shown; `pad` so that a width (`{kind:6}`) applies.

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for RecordOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for RecordCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl serde::Serialize for RecordCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for RecordCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        RecordCode::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("unknown code `{text}`")))
    }
}

/// One audit record (docs/service.md). Never holds a credential, a secret or
/// tool arguments. Its JSON form (the spool, `capgate audit --json`) is the
/// serde one: the column names, in table order.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AuditRecord {
    /// UUIDv7, primary key.
    pub decision_id: String,
    pub at_ms: i64,
    pub request_id: Option<String>,
    /// The authenticated gateway identity (token name), or `loopback`.
    pub gateway: String,
    pub kind: RecordKind,
    pub outcome: RecordOutcome,
    /// Reason code (decisions) or problem code (authentication).
    pub code: Option<RecordCode>,
    pub path: Option<String>,
    pub principal_id: Option<String>,
    pub issuer: Option<String>,
    pub subject: Option<String>,
    pub capability: Option<String>,
    /// The exposed tool name asked for.
    pub tool: Option<String>,
    /// Only on allow.
    pub account_id: Option<String>,
    pub limit_calls: Option<u64>,
    pub limit_per: Option<String>,
    pub usage_calls: Option<u64>,
    pub policy_version: Option<String>,
    pub policy_revision: Option<u64>,
    /// A listing's record only: how many capabilities the listing showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_count: Option<u64>,
    /// A listing's record only: the ids of the capabilities it showed, in declaration order — all
    /// of them, or the first ones when `visible_count` says there were more (the service bounds
    /// what it records; service.md, "The audit trail"). Stored as one text, the ids separated by
    /// spaces (a capability id has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub visible: Vec<String>,
    /// The protocol the request came through. Written out only when it is not capgate's own,
    /// so that spool lines and `audit --json` stay as they were for `Decide` (and records spooled
    /// before doors existed read as capgate's).
    #[serde(default, skip_serializing_if = "Door::is_capgate")]
    pub door: Door,
    /// A replay's or a refused reuse's record only: the decision its `request_id` belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_decision_id: Option<String>,
    /// A decision about a call whose arguments were forwarded: `sha256:<hex>` of their canonical
    /// JSON (members sorted by name, no whitespace; src/service/pipeline/arguments.rs). Never
    /// their values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_digest: Option<String>,
    /// Only when the operator opted in (`serve --audit-arguments`): the arguments' canonical
    /// JSON, the value of every member with a sensitive name `"[redacted]"`. Stored as text; in
    /// the JSON form (the spool, `audit --json`) the object itself.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_text")]
    pub arguments: Option<String>,
    /// Only when the operator opted in: the redacted arguments were this many bytes, more than a
    /// record keeps (16 KiB), so only their digest was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_omitted: Option<u64>,
    /// The normalised principal's attributes the decision or listing was taken on, as a JSON
    /// object of strings (sorted by name); with `issuer` and `subject`, what `capgate replay`
    /// decides the record again on. Never credential material: the core's principal holds none.
    /// `None` on records written before it was kept, which replay reports as not replayable.
    /// In the JSON form, the object itself.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_text")]
    pub attributes: Option<String>,
    /// Where a shadow version decided otherwise (docs/decisions/0035): stored in
    /// `shadow_differences`, in the transaction that stores this record, beside this record's
    /// columns (the active side). Never in `audit_log` itself: `query_audit` leaves it `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Box<ShadowSide>>,
}

/// What a shadow version decided about a request where it differs from the active version
/// (whose decision is the record's own columns). The transition is one of
/// `changes::Transition`'s names.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ShadowSide {
    pub revision: u64,
    pub transition: String,
    pub outcome: RecordOutcome,
    pub code: Option<String>,
    pub path: Option<String>,
    pub account_id: Option<String>,
    pub limit_calls: Option<u64>,
    pub limit_per: Option<String>,
    /// A listing: the capabilities the shadow shows and the active one does not (bounded as a
    /// listing record's `visible` is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gained: Vec<String>,
    /// A listing: the capabilities the active version shows and the shadow does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<String>,
}

/// Which shadow differences to read (`capgate policies shadow report`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShadowFilter {
    /// At or after (inclusive).
    pub since_ms: Option<i64>,
    /// Before (exclusive).
    pub until_ms: Option<i64>,
    /// Only this shadow revision's.
    pub revision: Option<u64>,
    /// Only this transition.
    pub transition: Option<String>,
    /// Newest first, at most this many.
    pub limit: u32,
}

/// How many differences of one transition a shadow revision recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowCount {
    pub revision: u64,
    pub transition: String,
    pub records: u64,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
}

/// The shadow version, and who set it when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadow {
    pub policy: StoredPolicy,
    pub set: Actor,
}

/// A JSON text held as a `String` and written out as the JSON value it is: a record's kept
/// `arguments` read in `audit --json` and in the spool as an object, not as a string of JSON.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(text: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
        match text.as_deref().map(serde_json::from_str::<Value>) {
            Some(Ok(value)) => value.serialize(serializer),
            // A stored text that is not JSON (written behind the store's back) is shown as it is.
            Some(Err(_)) => text.serialize(serializer),
            None => serializer.serialize_none(),
        }
    }

    /// The value written back as text. Read in order (`preserve_order`) from a canonical text, it
    /// is the same text again.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
        let value = Option::<Value>::deserialize(deserializer)?;
        Ok(value.map(|value| value.to_string()))
    }
}

/// What a gateway noted about an allowed call after it (`NoteDecision`), or capgate's correction
/// of what a caller received ([`Note::AnswerLost`]), appended to the decision's audit trail. The
/// record itself is never updated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecisionNote {
    pub decision_id: String,
    /// The gateway that noted it (always the one the allow was given to), or, for a correction,
    /// the gateway that was answered.
    pub gateway: String,
    pub kind: Note,
    /// As the gateway wrote it (bounded; the gateway's to keep free of secrets).
    pub detail: String,
    pub at_ms: i64,
}

/// What a caller received instead of what a decision's record says, when the commit that stored
/// the record lost its answer (docs/decisions/0031): a capped call denied `usage_unknown`, or no
/// decision at all (`UNAVAILABLE`). Kept by the audit writer (in the spool, or in memory until the
/// store answers) and stored as an [`Note::AnswerLost`] note when a record of the decision is
/// stored and says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LostAnswer {
    pub decision_id: String,
    /// The gateway that was answered.
    pub gateway: String,
    /// When the caller was answered.
    pub at_ms: i64,
    /// The decision the caller received (`deny`, `usage_unknown`); `None`: no decision, the call
    /// failed `UNAVAILABLE`.
    pub received: Option<(RecordOutcome, String)>,
}

impl LostAnswer {
    /// The note's `detail`: what the caller received, in words.
    pub fn detail(&self) -> String {
        let received = match &self.received {
            Some((outcome, code)) => format!("{} {code}", outcome.as_str()),
            None => "no decision (UNAVAILABLE)".to_owned(),
        };
        format!("the caller received {received}: the commit that stored this record lost its answer")
    }
}

/// What happened after a decision was recorded: at the gateway after an allow, or to the answer
/// itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Note {
    /// The account's secret could not be resolved: nothing was executed.
    CredentialFailed,
    /// The upstream could not be reached, or failed the call.
    UpstreamFailed,
    /// capgate's own correction: the commit that stored the record lost its answer, so the caller
    /// was answered otherwise (`detail` says how: `usage_unknown`, or no answer at all), while the
    /// record may have been stored as decided (docs/decisions/0031).
    AnswerLost,
}

impl Note {
    pub fn as_str(self) -> &'static str {
        match self {
            Note::CredentialFailed => "credential_failed",
            Note::UpstreamFailed => "upstream_failed",
            Note::AnswerLost => "answer_lost",
        }
    }

    pub fn parse(text: &str) -> Option<Note> {
        [Note::CredentialFailed, Note::UpstreamFailed, Note::AnswerLost]
            .into_iter()
            .find(|note| note.as_str() == text)
    }
}

/// What `capgate audit` asks for. Every field that is set must match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditFilter {
    pub principal_id: Option<String>,
    pub capability: Option<String>,
    /// Decisions that ran as this execution account (allows only carry one).
    pub account_id: Option<String>,
    pub outcome: Option<String>,
    pub code: Option<String>,
    /// Records at or after this instant (inclusive).
    pub since_ms: Option<i64>,
    /// Records before this instant (exclusive), so consecutive ranges do not
    /// overlap.
    pub until_ms: Option<i64>,
    /// The exposed tool name asked for.
    pub tool: Option<String>,
    /// The gateway the record was written for (its token's name, or `loopback`).
    pub gateway: Option<String>,
    /// `decide` or `list`.
    pub kind: Option<String>,
    pub decision_id: Option<String>,
    /// The gateway's request id (any gateway's: combine with `gateway` for one request).
    pub request_id: Option<String>,
    /// Only records after this one, in the order (`at`, `decision_id`): where a follow
    /// (`capgate audit --follow`) left off.
    pub after: Option<AuditCursor>,
    /// Oldest first instead of newest first (a follow reads forward).
    pub oldest_first: bool,
    /// Newest first (by `at`, then by `decision_id`), at most this many; `0`
    /// returns nothing.
    pub limit: u32,
}

/// A place in the audit trail's order: a record's `at` and `decision_id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditCursor {
    pub at_ms: i64,
    pub decision_id: String,
}

/// What audit records can be counted by (`capgate audit --group-by`): a column each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKey {
    Principal,
    Capability,
    Account,
    Code,
    Tool,
    Gateway,
    Outcome,
    Kind,
    /// The record's `path`: the pointer to the grant that decided (the rule), or to what denied.
    Path,
}

impl GroupKey {
    pub const ALL: [GroupKey; 9] = [
        GroupKey::Principal,
        GroupKey::Capability,
        GroupKey::Account,
        GroupKey::Code,
        GroupKey::Tool,
        GroupKey::Gateway,
        GroupKey::Outcome,
        GroupKey::Kind,
        GroupKey::Path,
    ];

    /// As `--group-by` spells it (`rule` is another name for `path`).
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKey::Principal => "principal",
            GroupKey::Capability => "capability",
            GroupKey::Account => "account",
            GroupKey::Code => "code",
            GroupKey::Tool => "tool",
            GroupKey::Gateway => "gateway",
            GroupKey::Outcome => "outcome",
            GroupKey::Kind => "kind",
            GroupKey::Path => "path",
        }
    }

    pub fn parse(text: &str) -> Option<GroupKey> {
        if text == "rule" {
            return Some(GroupKey::Path);
        }
        GroupKey::ALL.into_iter().find(|key| key.as_str() == text)
    }

    /// The `audit_log` column it groups by.
    pub fn column(self) -> &'static str {
        match self {
            GroupKey::Principal => "principal_id",
            GroupKey::Capability => "capability",
            GroupKey::Account => "account_id",
            GroupKey::Code => "code",
            GroupKey::Tool => "tool",
            GroupKey::Gateway => "gateway",
            GroupKey::Outcome => "outcome",
            GroupKey::Kind => "kind",
            GroupKey::Path => "path",
        }
    }
}

/// One group of audit records: the values of the keys it was grouped by (`None`: the column is
/// empty on these records, such as the account of a denial), how many records, and the first
/// and last instant among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditGroup {
    pub values: Vec<Option<String>>,
    pub records: u64,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
}

/// Who made an admin change, and when: the admin token's name (`serve --policy` for the file published at start-up,
/// `loopback` on a server without tokens) and the instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub name: String,
    pub at_ms: i64,
}

/// How a version became active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationKind {
    /// A publish stored it and activated it.
    Publish,
    /// `ActivatePolicy` made a stored version active again: a rollback, or a roll-forward to a
    /// newer stored one.
    Rollback,
}

impl ActivationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActivationKind::Publish => "publish",
            ActivationKind::Rollback => "rollback",
        }
    }

    pub fn parse(text: &str) -> Option<ActivationKind> {
        [ActivationKind::Publish, ActivationKind::Rollback]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

/// One change of the active version, as the store recorded it with the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activation {
    pub at_ms: i64,
    pub actor: String,
    pub kind: ActivationKind,
    /// `None` when no version was active before.
    pub from_revision: Option<u64>,
    pub to_revision: u64,
}

/// A usage counter as stored: whose, for what, and its reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCounter {
    pub principal_id: String,
    pub capability: String,
    pub reading: CounterReading,
}

/// A counter an admin reset, with what it read when it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReset {
    pub at_ms: i64,
    pub actor: String,
    pub principal_id: String,
    pub capability: String,
    pub reading: CounterReading,
}

/// One period of the audit trail that a prune removed (or, in a dry run,
/// would remove): a partition on PostgreSQL, a bucket of records on SQLite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedPeriod {
    /// The partition's name (`audit_log_p2026_11`); on SQLite the name the
    /// partition would have.
    pub name: String,
    /// The first instant the period holds (inclusive); `None` when it is
    /// unbounded below.
    pub from_ms: Option<i64>,
    /// The first instant after the period (exclusive): at or before the
    /// cutoff, always.
    pub until_ms: i64,
    /// The records it held when it was removed (counted, not estimated).
    pub records: u64,
}

/// What makes a request with a `request_id` that request and no other: a keyed digest of its
/// door, gateway, caller, target and the door's own facts (docs/decisions/0027). Never the
/// credential it covers.
pub type Fingerprint = [u8; 32];

/// A stored answer for an idempotent retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub decision_id: String,
    /// The encoded response returned the first time.
    pub response: Vec<u8>,
    /// The fingerprint of the request it answered: only that request gets it again. `None` for
    /// an answer remembered before fingerprints existed, which is no request's.
    pub fingerprint: Option<Fingerprint>,
    /// When it was decided (milliseconds since the Unix epoch): the caller
    /// judges the retention window with it.
    pub at_ms: i64,
}

/// What claiming a request id found (docs/decisions/0016-idempotency-across-replicas.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the claim: it decides, and writes the answer with its audit record.
    Won,
    /// A decision with this request id was answered already: this is its answer.
    Answered(Remembered),
    /// A claim is held and not answered yet: a live one, or one of another request (which is
    /// never taken over). Its request's fingerprint (`None`: claimed before fingerprints).
    Taken { fingerprint: Option<Fingerprint> },
}

/// The store port. Implementations are cheap to clone (a pool handle).
pub trait Store: Clone + Send + Sync + 'static {
    /// Applies the migrations in `migrations/<dialect>/`.
    fn migrate(&self) -> impl Future<Output = StoreResult<()>> + Send;

    // ── Policy versions ───────────────────────────────────────────────────

    fn active_policy(&self) -> impl Future<Output = StoreResult<Option<StoredPolicy>>> + Send;

    /// Stores and activates `new` in one transaction, unless its version and
    /// catalog equal the active one's (`Unchanged`) or the active revision is
    /// not `expected` (`Conflict`). Notifies other replicas on success.
    fn publish(
        &self,
        new: NewPolicy,
        expected: ExpectedRevision,
    ) -> impl Future<Output = StoreResult<PublishOutcome>> + Send;

    /// Makes a stored revision active again; notifies other replicas. `by` is recorded in the
    /// activation history in the same transaction (as a publish records its author).
    fn activate(
        &self,
        revision: u64,
        expected: ExpectedRevision,
        by: &Actor,
    ) -> impl Future<Output = StoreResult<ActivateOutcome>> + Send;

    /// The changes of the active version, newest first, at most `limit`.
    fn activations(&self, limit: u32) -> impl Future<Output = StoreResult<Vec<Activation>>> + Send;

    fn policy(&self, revision: u64) -> impl Future<Output = StoreResult<Option<StoredPolicy>>> + Send;

    /// Newest first.
    fn list_policies(&self, limit: u32) -> impl Future<Output = StoreResult<Vec<StoredPolicy>>> + Send;

    /// The shadow version, if one is set (docs/decisions/0035).
    fn shadow_policy(&self) -> impl Future<Output = StoreResult<Option<Shadow>>> + Send;

    /// Makes the stored `revision` the shadow version (`None`: no shadow) and notifies other
    /// replicas, as an activation does. `Ok(false)`: there is no such revision; nothing changed.
    fn set_shadow(&self, revision: Option<u64>, by: &Actor)
        -> impl Future<Output = StoreResult<bool>> + Send;

    /// Stores `new` as a new version and makes it the shadow one, in one transaction, without
    /// touching the active version; notifies other replicas.
    fn publish_shadow(&self, new: NewPolicy) -> impl Future<Output = StoreResult<StoredPolicy>> + Send;

    /// The shadow differences `filter` matches, newest first; each as the record of the active
    /// side (its decision's columns) with `shadow` set.
    fn shadow_differences(
        &self,
        filter: &ShadowFilter,
    ) -> impl Future<Output = StoreResult<Vec<AuditRecord>>> + Send;

    /// The differences in `filter`'s window (its revision and transition too, its limit aside),
    /// counted per shadow revision and transition, by the database.
    fn shadow_counts(
        &self,
        filter: &ShadowFilter,
    ) -> impl Future<Output = StoreResult<Vec<ShadowCount>>> + Send;

    /// Removes the shadow differences recorded before `before_ms`; says how many went.
    fn prune_shadow(&self, before_ms: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Resolves when another replica may have changed the active version;
    /// the caller then reads [`Store::active_policy`]. Callers also poll.
    ///
    /// PostgreSQL: one `LISTEN` connection per store value, opened by the
    /// first call and shared by clones, so one task should call this in a
    /// loop. Notifications that arrive between calls are kept. The call that
    /// opens (or reopens) the subscription resolves at once, since a change
    /// may have been missed before it; a lost connection is an error (the
    /// next call subscribes again). SQLite (a single replica, no
    /// notifications): never resolves.
    fn policy_changed(&self) -> impl Future<Output = StoreResult<()>> + Send;

    // ── Usage counters ────────────────────────────────────────────────────

    /// The counter for `key`, if any call was ever counted.
    fn read_usage(
        &self,
        key: CounterKey<'_>,
    ) -> impl Future<Output = StoreResult<Option<CounterReading>>> + Send;

    /// A principal's counters (one capability's, with `capability`), by capability, at most
    /// `limit`.
    fn counters(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = StoreResult<Vec<StoredCounter>>> + Send;

    /// Removes the counter for `key` and records who did, with what it read, in one
    /// transaction; the next call opens a fresh window. `None` (nothing recorded): there was no
    /// counter.
    fn reset_usage(
        &self,
        key: CounterKey<'_>,
        by: &Actor,
    ) -> impl Future<Output = StoreResult<Option<CounterReading>>> + Send;

    /// The resets of a principal's counters (one capability's, with `capability`), newest
    /// first, at most `limit`.
    fn usage_resets(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = StoreResult<Vec<UsageReset>>> + Send;

    // ── Audit and idempotency ─────────────────────────────────────────────

    /// Appends records (and the responses to remember, as `(gateway,
    /// request_id, response)`) in one transaction: durable when this returns
    /// `Ok`. A record whose `decision_id` is already stored, or a response
    /// whose `(gateway, request_id)` is, is skipped: replays are harmless and
    /// the first response wins.
    fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// One audit batch in one transaction (docs/decisions/0025): counts the
    /// capped calls `asks`, in order, against their counters — each is taken if
    /// its window (`at_ms − window_start < window_ms`, else a new window opens at
    /// `at_ms`) has room under its `limit`, refused otherwise — then appends
    /// `records` and `remembered` (as [`Store::append_audit`]) together with
    /// the entries `settle` makes of the tallies, and commits if `gate` still
    /// lets it. Returns one tally per ask; nothing is counted or stored unless
    /// this returns `Ok`. Counters are locked in one order (by key), so
    /// concurrent batches of several replicas queue rather than deadlock, and a
    /// call is counted exactly when its record is stored.
    fn commit_batch(
        &self,
        asks: &[CounterAsk],
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        settle: Settle<'_>,
        gate: &CommitGate,
    ) -> impl Future<Output = StoreResult<Vec<Tally>>> + Send;

    /// The response first returned to `gateway` for `request_id`.
    fn remembered(
        &self,
        gateway: &str,
        request_id: &str,
    ) -> impl Future<Output = StoreResult<Option<Remembered>>> + Send;

    /// Claims `(gateway, request_id)` for the request `fingerprint` names, about to be decided at
    /// `now_ms`: won when nobody holds it, or when the same request took it before
    /// `stale_before_ms` and never answered (its process died mid-decision). Otherwise the
    /// answer, if there is one yet, else the holder's fingerprint; the caller compares them
    /// (docs/decisions/0027). One statement, so two replicas claiming at once cannot both win.
    fn claim_request(
        &self,
        gateway: &str,
        request_id: &str,
        fingerprint: &Fingerprint,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> impl Future<Output = StoreResult<Claim>> + Send;

    /// The deployment's fingerprint key: the one stored, or `candidate` stored now when there is
    /// none yet (the first replica to start on the store draws it), so that every replica of
    /// one store uses the same key.
    fn request_key(&self, candidate: &[u8; 32]) -> impl Future<Output = StoreResult<[u8; 32]>> + Send;

    /// Forgets the remembered answers and the claims made before `before_ms` (past the
    /// idempotency retention, they answer nothing). Returns how many rows went.
    fn forget_requests(&self, before_ms: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    fn query_audit(&self, filter: &AuditFilter)
        -> impl Future<Output = StoreResult<Vec<AuditRecord>>> + Send;

    /// The records `filter` matches (its order, cursor and limit aside), counted per distinct
    /// value of `keys`: most records first, then by the values (an empty one last), at most
    /// `filter.limit` groups. Counted by the database (`GROUP BY`), not by reading the records.
    fn audit_groups(
        &self,
        filter: &AuditFilter,
        keys: &[GroupKey],
    ) -> impl Future<Output = StoreResult<Vec<AuditGroup>>> + Send;

    /// Stores `note` when `note.gateway` was given the allow `note.decision_id` names, and says
    /// whether it was (`false`: no such allow for that gateway). A second note of the same kind
    /// for the same decision keeps the first: a retried call notes once.
    fn note_decision(&self, note: &DecisionNote) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Stores `lost` as an [`Note::AnswerLost`] note when a record of its decision is stored and
    /// holds something other than what the caller received, and says whether it did. Once per
    /// decision, like every note.
    fn correct_lost_answer(&self, lost: &LostAnswer) -> impl Future<Output = StoreResult<bool>> + Send;

    /// The notes on these decisions, oldest first.
    fn decision_notes(
        &self,
        decision_ids: &[String],
    ) -> impl Future<Output = StoreResult<Vec<DecisionNote>>> + Send;

    // ── Audit retention (docs/decisions/0009-audit-partitioning.md) ───────

    /// Makes sure the audit periods from the one holding `now_ms` through
    /// [`retention::PERIODS_AHEAD`] later can take records at once.
    /// PostgreSQL creates the partitions that are missing; SQLite has
    /// nothing to prepare. Idempotent and safe to race from several
    /// replicas. Not needed for correctness: `append_audit` creates a
    /// missing partition itself, but off the hot path is better.
    fn prepare_audit_periods(&self, now_ms: i64) -> impl Future<Output = StoreResult<()>> + Send;

    /// Removes every whole audit period that ends at or before `before_ms`,
    /// oldest first, and says what went; with `dry_run`, removes nothing and
    /// says what would go. The period holding `before_ms` is kept whole, and
    /// so is everything after it. PostgreSQL drops partitions (also empty
    /// ones); SQLite deletes the records of each period, in bounded batches,
    /// and reports the periods that held any.
    fn prune_audit(
        &self,
        before_ms: i64,
        dry_run: bool,
    ) -> impl Future<Output = StoreResult<Vec<PrunedPeriod>>> + Send;
}

/// How to open a store; [`StoreOptions::default`] suits a small box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in the pool; `None` picks the dialect's default
    /// (PostgreSQL 8, SQLite 4). PostgreSQL also opens one more, for
    /// notifications, when the server subscribes.
    pub max_connections: Option<u32>,
    /// How long an operation waits for a free connection.
    pub acquire_timeout: Duration,
    /// A server-side bound on any one statement (PostgreSQL only), so that
    /// work a caller gave up on does not run on. A safety net, not the
    /// request deadline: the server enforces `--store-timeout` itself.
    /// Migrations are not bound by it.
    pub statement_timeout: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: None,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// A store opened from a URL ([`connect`]), whichever implementation it
/// names. It is a [`Store`] itself, each method delegating to the
/// implementation: code that only calls the port is written once, against
/// `S: Store`, and handed this. The server is monomorphised instead, with
/// `with_store!`.
#[derive(Clone)]
pub enum AnyStore {
    Postgres(PostgresStore),
    Sqlite(SqliteStore),
}

/// `with_store!(any, store => body)`: evaluates `body` with `store` bound to
/// the implementation inside the [`AnyStore`] `any` (by value, or by
/// reference when `any` is a reference), so that generic code in `body` is
/// compiled once per implementation — for the server, which calls the store
/// on every request and runs for long (`service::run`, and `capgate bench`
/// which measures that server). The one place, with [`connect`], that lists
/// the implementations: a new one is added here and nowhere else.
#[macro_export]
macro_rules! with_store {
    ($any:expr, $store:ident => $body:expr) => {
        match $any {
            $crate::store::AnyStore::Postgres($store) => $body,
            $crate::store::AnyStore::Sqlite($store) => $body,
        }
    };
}
pub use with_store;

impl Store for AnyStore {
    async fn migrate(&self) -> StoreResult<()> {
        with_store!(self, store => store.migrate().await)
    }

    async fn active_policy(&self) -> StoreResult<Option<StoredPolicy>> {
        with_store!(self, store => store.active_policy().await)
    }

    async fn publish(&self, new: NewPolicy, expected: ExpectedRevision) -> StoreResult<PublishOutcome> {
        with_store!(self, store => store.publish(new, expected).await)
    }

    async fn activate(
        &self,
        revision: u64,
        expected: ExpectedRevision,
        by: &Actor,
    ) -> StoreResult<ActivateOutcome> {
        with_store!(self, store => store.activate(revision, expected, by).await)
    }

    async fn activations(&self, limit: u32) -> StoreResult<Vec<Activation>> {
        with_store!(self, store => store.activations(limit).await)
    }

    async fn counters(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<StoredCounter>> {
        with_store!(self, store => store.counters(principal_id, capability, limit).await)
    }

    async fn reset_usage(&self, key: CounterKey<'_>, by: &Actor) -> StoreResult<Option<CounterReading>> {
        with_store!(self, store => store.reset_usage(key, by).await)
    }

    async fn usage_resets(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<UsageReset>> {
        with_store!(self, store => store.usage_resets(principal_id, capability, limit).await)
    }

    async fn audit_groups(&self, filter: &AuditFilter, keys: &[GroupKey]) -> StoreResult<Vec<AuditGroup>> {
        with_store!(self, store => store.audit_groups(filter, keys).await)
    }

    async fn policy(&self, revision: u64) -> StoreResult<Option<StoredPolicy>> {
        with_store!(self, store => store.policy(revision).await)
    }

    async fn shadow_policy(&self) -> StoreResult<Option<Shadow>> {
        with_store!(self, store => store.shadow_policy().await)
    }

    async fn set_shadow(&self, revision: Option<u64>, by: &Actor) -> StoreResult<bool> {
        with_store!(self, store => store.set_shadow(revision, by).await)
    }

    async fn publish_shadow(&self, new: NewPolicy) -> StoreResult<StoredPolicy> {
        with_store!(self, store => store.publish_shadow(new).await)
    }

    async fn shadow_differences(&self, filter: &ShadowFilter) -> StoreResult<Vec<AuditRecord>> {
        with_store!(self, store => store.shadow_differences(filter).await)
    }

    async fn shadow_counts(&self, filter: &ShadowFilter) -> StoreResult<Vec<ShadowCount>> {
        with_store!(self, store => store.shadow_counts(filter).await)
    }

    async fn prune_shadow(&self, before_ms: i64) -> StoreResult<u64> {
        with_store!(self, store => store.prune_shadow(before_ms).await)
    }

    async fn list_policies(&self, limit: u32) -> StoreResult<Vec<StoredPolicy>> {
        with_store!(self, store => store.list_policies(limit).await)
    }

    async fn policy_changed(&self) -> StoreResult<()> {
        with_store!(self, store => store.policy_changed().await)
    }

    async fn read_usage(&self, key: CounterKey<'_>) -> StoreResult<Option<CounterReading>> {
        with_store!(self, store => store.read_usage(key).await)
    }

    async fn commit_batch(
        &self,
        asks: &[CounterAsk],
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        settle: Settle<'_>,
        gate: &CommitGate,
    ) -> StoreResult<Vec<Tally>> {
        with_store!(self, store => store.commit_batch(asks, records, remembered, settle, gate).await)
    }

    async fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> StoreResult<()> {
        with_store!(self, store => store.append_audit(records, remembered).await)
    }

    async fn remembered(&self, gateway: &str, request_id: &str) -> StoreResult<Option<Remembered>> {
        with_store!(self, store => store.remembered(gateway, request_id).await)
    }

    async fn claim_request(
        &self,
        gateway: &str,
        request_id: &str,
        fingerprint: &Fingerprint,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> StoreResult<Claim> {
        with_store!(self, store => store.claim_request(gateway, request_id, fingerprint, now_ms, stale_before_ms).await)
    }

    async fn request_key(&self, candidate: &[u8; 32]) -> StoreResult<[u8; 32]> {
        with_store!(self, store => store.request_key(candidate).await)
    }

    async fn forget_requests(&self, before_ms: i64) -> StoreResult<u64> {
        with_store!(self, store => store.forget_requests(before_ms).await)
    }

    async fn note_decision(&self, note: &DecisionNote) -> StoreResult<bool> {
        with_store!(self, store => store.note_decision(note).await)
    }

    async fn correct_lost_answer(&self, lost: &LostAnswer) -> StoreResult<bool> {
        with_store!(self, store => store.correct_lost_answer(lost).await)
    }

    async fn decision_notes(&self, decision_ids: &[String]) -> StoreResult<Vec<DecisionNote>> {
        with_store!(self, store => store.decision_notes(decision_ids).await)
    }

    async fn query_audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        with_store!(self, store => store.query_audit(filter).await)
    }

    async fn prepare_audit_periods(&self, now_ms: i64) -> StoreResult<()> {
        with_store!(self, store => store.prepare_audit_periods(now_ms).await)
    }

    async fn prune_audit(&self, before_ms: i64, dry_run: bool) -> StoreResult<Vec<PrunedPeriod>> {
        with_store!(self, store => store.prune_audit(before_ms, dry_run).await)
    }
}

/// Opens the store a `--database-url` names: `postgres://…` (or
/// `postgresql://…`) or `sqlite://path` (the file is created when missing,
/// unless the URL sets `mode`). Connects at once, so a wrong URL fails at
/// start-up; does not migrate. Errors show the URL with its password
/// redacted.
pub async fn connect(url: &str, options: &StoreOptions) -> StoreResult<AnyStore> {
    let opened = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        PostgresStore::connect(url, options).await.map(AnyStore::Postgres)
    } else if url.starts_with("sqlite:") {
        SqliteStore::connect(url, options).await.map(AnyStore::Sqlite)
    } else {
        return Err(StoreError::UnsupportedUrl { url: redact(url) });
    };
    // The implementations' errors never hold the URL; this one names it.
    opened.map_err(|error| match error {
        StoreError::Database { source, .. } => StoreError::Connect {
            url: redact(url),
            source,
        },
        other => other,
    })
}

/// `url` with its password hidden, fit for messages and logs: the userinfo's
/// password and the `password`/`sslpassword` query parameters become `***`.
///
/// Conservative by design, because a URL that fails to parse is exactly the
/// one that ends up in an error message: everything between the first `:`
/// after `scheme://` and the *last* `@` is treated as a password, even when
/// it holds unescaped `/`, `?` or `@`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(end) => url.split_at(end + 3),
        None => ("", url),
    };
    let mut hidden = String::with_capacity(url.len());
    hidden.push_str(scheme);
    match rest.rfind('@') {
        Some(at) if !scheme.is_empty() => {
            let (userinfo, location) = (&rest[..at], &rest[at..]);
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    hidden.push_str(user);
                    hidden.push_str(":***");
                }
                None => hidden.push_str(userinfo),
            }
            hidden.push_str(location);
        }
        _ => hidden.push_str(rest),
    }
    // The query is searched for in what is left, so a `?` that was part of a
    // hidden password cannot start it, and one in an odd userinfo still does.
    let Some((before, query)) = hidden.split_once('?') else {
        return hidden;
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _value))
                if key.eq_ignore_ascii_case("password") || key.eq_ignore_ascii_case("sslpassword") =>
            {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_texts_are_their_serde_names_and_parse_back() {
        for kind in RecordKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
            assert_eq!(RecordKind::parse(kind.as_str()), Some(kind));
            assert_eq!(format!("{kind:7}|"), format!("{:7}|", kind.as_str()));
        }
        for outcome in RecordOutcome::ALL {
            assert_eq!(serde_json::to_value(outcome).unwrap(), outcome.as_str());
            assert_eq!(RecordOutcome::parse(outcome.as_str()), Some(outcome));
        }
        let codes = ReasonCode::ALL
            .into_iter()
            .map(RecordCode::Reason)
            .chain(AuthProblem::ALL.into_iter().map(RecordCode::Problem));
        for code in codes {
            // Parsing finds the code itself, not a same-spelled one of the other vocabulary.
            assert_eq!(RecordCode::parse(code.as_str()), Some(code));
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str());
            assert_eq!(serde_json::from_value::<RecordCode>(json).unwrap(), code);
        }
        for door in Door::ALL {
            assert_eq!(serde_json::to_value(door).unwrap(), door.as_str());
            assert_eq!(Door::parse(door.as_str()), Some(door));
        }
        assert_eq!(Door::parse("envoy"), None);
        assert_eq!(RecordKind::parse("Decide"), None);
        assert_eq!(RecordOutcome::parse("perhaps"), None);
        assert_eq!(RecordCode::parse("no_grant"), None);
        assert!(serde_json::from_value::<RecordCode>(serde_json::json!("no_grant")).is_err());
    }

    #[test]
    fn kept_arguments_are_an_object_in_json_and_read_back_as_the_same_text() {
        let record = AuditRecord {
            decision_id: "d1".to_owned(),
            arguments_digest: Some("sha256:00".to_owned()),
            arguments: Some(r#"{"amount":1.5,"b":[null,true,"x\n"],"password":"[redacted]"}"#.to_owned()),
            ..AuditRecord::default()
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["arguments"],
            serde_json::json!({"amount": 1.5, "b": [null, true, "x\n"], "password": "[redacted]"})
        );
        // As the spool writes and reads it: a line of text.
        let line = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<AuditRecord>(&line).unwrap(), record);
        // Records without arguments write none of the three fields, as before they existed.
        let bare = serde_json::to_value(AuditRecord::default()).unwrap();
        for field in ["arguments_digest", "arguments", "arguments_omitted"] {
            assert_eq!(bare.get(field), None, "{field}");
        }
        assert_eq!(
            serde_json::from_value::<AuditRecord>(bare).unwrap(),
            AuditRecord::default()
        );
    }

    #[test]
    fn a_refused_password_is_not_quoted() {
        // What sqlx 0.9 reports for a password SASLprep refuses (U+0007 in it).
        let leaky = sqlx::Error::Configuration(
            "Failed to saslprep password: Error(ProhibitedCharacter('\\u{7}'))".into(),
        );
        let message = StoreError::database("connect", leaky).to_string();
        assert!(!message.contains("ProhibitedCharacter"), "{message}");
        assert!(
            message.contains("SASLprep refuses one of its characters"),
            "{message}"
        );
        // Other configuration errors are kept as they are.
        let plain = sqlx::Error::Configuration("unknown value \"x\" for `ssl_mode`".into());
        let message = StoreError::database("connect", plain).to_string();
        assert!(
            message.ends_with("unknown value \"x\" for `ssl_mode`"),
            "{message}"
        );
    }

    #[track_caller]
    fn check(url: &str, expected: &str) {
        assert_eq!(redact(url), expected);
    }

    #[test]
    fn redact_hides_passwords_and_keeps_the_rest() {
        check(
            "postgres://capgate:s3cret@db:5432/capgate",
            "postgres://capgate:***@db:5432/capgate",
        );
        check("postgres://capgate@db/capgate", "postgres://capgate@db/capgate");
        check("postgres://db/capgate", "postgres://db/capgate");
        check("postgres://:s3cret@db/x", "postgres://:***@db/x");
        check(
            "postgres://u@db/x?sslmode=require&password=s3cret&application_name=a",
            "postgres://u@db/x?sslmode=require&password=***&application_name=a",
        );
        check("postgres://db/x?PASSWORD=s3cret", "postgres://db/x?PASSWORD=***");
        check(
            "postgres://db/x?sslpassword=s3cret",
            "postgres://db/x?sslpassword=***",
        );
        check("sqlite://capgate.db", "sqlite://capgate.db");
        check("sqlite:capgate.db?mode=rwc", "sqlite:capgate.db?mode=rwc");
    }

    #[test]
    fn redact_hides_unescaped_reserved_characters_in_a_password() {
        check("postgres://u:p@ss@db/x", "postgres://u:***@db/x");
        check("postgres://u:pa/ss@db/x", "postgres://u:***@db/x");
        check("postgres://u:pa?ss@db/x", "postgres://u:***@db/x");
        check(
            "postgres://db/x?password=s3cret&application_name=a@b",
            "postgres://db/x?password=***&application_name=a@b",
        );
    }
}
