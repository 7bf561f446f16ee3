//! The store port: everything the service shares between replicas — policy
//! versions, usage counters, the audit trail, idempotency keys — behind one
//! trait with two real implementations, PostgreSQL (production, many
//! replicas) and SQLite (the embedded default: one replica, a laptop, an
//! edge box). Nothing else holds state (service.md §1).
//!
//! The server is generic over `Store` and monomorphised at start-up for the
//! URL's scheme; the same behavioural suite (`tests/store.rs`) runs against
//! both implementations.

use std::future::Future;

pub mod postgres;
pub mod sqlite;

/// Why a store operation failed. Messages never contain secret material
/// (database URLs are redacted before they reach an error).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database did not answer in time.
    #[error("the store did not answer within {0} ms")]
    Timeout(u64),
    /// The database refused or failed the operation.
    #[error("store error: {0}")]
    Database(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A stored policy version (service.md §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    /// Monotonic, assigned by the store, starting at 1.
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
pub struct Counted {
    pub calls: u64,
    pub window_start_ms: i64,
}

/// The result of an atomic conditional consumption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// One call taken; the counter now reads this.
    Taken(Counted),
    /// The window is full: nothing taken (another request took the last call).
    Refused,
}

/// One audit record (service.md §5). Never holds a credential, a secret or
/// tool arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditRecord {
    /// UUIDv7, primary key.
    pub decision_id: String,
    pub at_ms: i64,
    pub request_id: Option<String>,
    /// The authenticated gateway identity (token name), or `loopback`.
    pub gateway: String,
    /// `decide` or `list`.
    pub kind: String,
    /// `allow`, `deny`, `unauthenticated` or `unknown_tool`.
    pub outcome: String,
    /// Reason code (decisions) or problem code (authentication).
    pub code: Option<String>,
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
}

/// What `capgate audit` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditFilter {
    pub principal_id: Option<String>,
    pub capability: Option<String>,
    pub outcome: Option<String>,
    pub code: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Newest first, at most this many.
    pub limit: u32,
}

/// A stored answer for an idempotent retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub decision_id: String,
    /// The encoded response returned the first time.
    pub response: Vec<u8>,
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

    /// Makes a stored revision active again; notifies other replicas.
    fn activate(
        &self,
        revision: u64,
        expected: ExpectedRevision,
    ) -> impl Future<Output = StoreResult<ActivateOutcome>> + Send;

    fn policy(&self, revision: u64) -> impl Future<Output = StoreResult<Option<StoredPolicy>>> + Send;

    /// Newest first.
    fn list_policies(&self, limit: u32) -> impl Future<Output = StoreResult<Vec<StoredPolicy>>> + Send;

    /// Resolves when another replica may have changed the active version
    /// (PostgreSQL `LISTEN`); never resolves where the store has no
    /// notifications (SQLite: a single replica). Callers also poll.
    fn policy_changed(&self) -> impl Future<Output = StoreResult<()>> + Send;

    // ── Usage counters ────────────────────────────────────────────────────

    /// The counter for `key`, if any call was ever counted.
    fn read_usage(&self, key: CounterKey<'_>) -> impl Future<Output = StoreResult<Option<Counted>>> + Send;

    /// In one statement: start a new window at `at_ms` if the current one
    /// expired (`at_ms − window_start ≥ window_ms`), else add one call only if
    /// the count stays within `limit`.
    fn consume(
        &self,
        key: CounterKey<'_>,
        at_ms: i64,
        window_ms: u64,
        limit: u64,
    ) -> impl Future<Output = StoreResult<Consumed>> + Send;

    // ── Audit and idempotency ─────────────────────────────────────────────

    /// Appends records (and the responses to remember for their request ids)
    /// in one transaction: durable when this returns `Ok`.
    fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// The response first returned to `gateway` for `request_id`.
    fn remembered(
        &self,
        gateway: &str,
        request_id: &str,
    ) -> impl Future<Output = StoreResult<Option<Remembered>>> + Send;

    fn query_audit(&self, filter: &AuditFilter)
        -> impl Future<Output = StoreResult<Vec<AuditRecord>>> + Send;
}
