//! What the two SQL implementations share, so that they cannot drift apart
//! where no dialect difference forces them to: the shapes of the rows they
//! read, the conversions between the port's unsigned integers and SQL's
//! signed `BIGINT` and between the record's types and their text, how a
//! failure names its operation, the decisions of `publish` and `activate`
//! once the active pointer is locked, the `WHERE` clause of an audit
//! query and its `GROUP BY`, and the operator's history (activations, usage
//! resets).
//!
//! The SQL that differs (locking, bulk inserts, notifications) lives in
//! `postgres.rs` and `sqlite.rs`.

use capgate_core::access::ReasonCode;
use sqlx::{ColumnIndex, Database, Decode, Encode, QueryBuilder, Row, Type};

use super::{
    Activation, ActivationKind, Actor, AuditCursor, AuditFilter, AuditGroup, AuditRecord, Claim,
    CounterReading, DecisionNote, Door, ExpectedRevision, Fingerprint, GroupKey, NewPolicy, Note, RecordCode,
    RecordKind, RecordOutcome, Remembered, Shadow, ShadowCount, ShadowFilter, ShadowSide, StoreError,
    StoreResult, StoredCounter, StoredPolicy, UsageReset,
};

/// Names the operation a database failure happened in. There is no
/// `From<sqlx::Error>` for [`StoreError`], so that no `?` can forget to.
pub(super) trait During<T> {
    fn during(self, operation: &'static str) -> StoreResult<T>;
}

impl<T> During<T> for Result<T, sqlx::Error> {
    fn during(self, operation: &'static str) -> StoreResult<T> {
        self.map_err(|source| StoreError::database(operation, source))
    }
}

/// A port integer as a `BIGINT`. Values past `i64::MAX` are refused rather
/// than wrapped or clamped, because the record would then lie.
pub(super) fn to_bigint(value: u64, column: &'static str) -> StoreResult<i64> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { column, value })
}

fn to_unsigned(value: i64, column: &'static str) -> StoreResult<u64> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt {
        column,
        value: value.to_string(),
    })
}

/// A stored text as the closed type `parse` reads it into.
fn to_typed<T>(text: String, column: &'static str, parse: impl FnOnce(&str) -> Option<T>) -> StoreResult<T> {
    parse(&text).ok_or(StoreError::Corrupt { column, value: text })
}

/// A stored revision as the port's `u64`.
pub(super) fn to_revision(value: i64) -> StoreResult<u64> {
    to_unsigned(value, "revision")
}

fn to_unsigned_opt(value: Option<i64>, column: &'static str) -> StoreResult<Option<u64>> {
    value.map(|value| to_unsigned(value, column)).transpose()
}

/// A ceiling too large for `BIGINT` acts as `i64::MAX`: a counter stored as
/// `BIGINT` never reaches it either.
pub(super) fn saturating_bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The latest window start that has expired at `at_ms`: a window that opened
/// at `s` has expired when `at_ms − s ≥ window_ms`, that is when
/// `s ≤ at_ms − window_ms`. Computed here, exactly, rather than in SQL, where
/// a subtraction near the ends of `BIGINT` would fail (PostgreSQL) or turn
/// into floating point (SQLite). `None` when `at_ms − window_ms` is below
/// `i64::MIN`: then no window start has expired, and SQL's
/// `window_start <= NULL` is never true.
pub(super) fn expired_at_or_before(at_ms: i64, window_ms: u64) -> Option<i64> {
    i64::try_from(i128::from(at_ms) - i128::from(window_ms)).ok()
}

// ── Rows ──────────────────────────────────────────────────────────────────
// Field names are column names; `sqlx::FromRow` derives a reader for either
// dialect.

#[derive(sqlx::FromRow)]
pub(super) struct PolicyRow {
    revision: i64,
    version: String,
    artifact: String,
    catalog: Option<String>,
    author: String,
    comment: String,
    created_at: i64,
}

impl PolicyRow {
    pub(super) fn into_policy(self) -> StoreResult<StoredPolicy> {
        let PolicyRow {
            revision,
            version,
            artifact,
            catalog,
            author,
            comment,
            created_at,
        } = self;
        Ok(StoredPolicy {
            revision: to_unsigned(revision, "revision")?,
            version,
            artifact,
            catalog,
            author,
            comment,
            created_at_ms: created_at,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct CounterRow {
    calls: i64,
    window_start: i64,
}

impl CounterRow {
    pub(super) fn into_reading(self) -> StoreResult<CounterReading> {
        Ok(CounterReading {
            calls: to_unsigned(self.calls, "calls")?,
            window_start_ms: self.window_start,
        })
    }
}

/// The statement that claims `($1 gateway, $2 request_id)` for the request whose fingerprint is
/// `$5` at `$3`, taking over a claim the same request made before `$4`; it returns a row when the
/// claim is won. A request id that has an answer is never claimed: the answer stands. A claim of
/// another request is never taken over: an id names one request (docs/decisions/0027). In one
/// statement, a second claimer waits for the first's row and then finds it fresh. `$source` is
/// what the claim's row is selected from (a literal, maybe empty): a dialect may compute
/// something on the way.
macro_rules! claim_request {
    ($source:literal) => {
        concat!(
            "INSERT INTO request_claims (gateway, request_id, claimed_at, fingerprint) SELECT $1, $2, $3, $5 ",
            $source,
            " WHERE NOT EXISTS (SELECT 1 FROM remembered_responses WHERE gateway = $1 AND request_id = $2) \
             ON CONFLICT (gateway, request_id) DO UPDATE SET claimed_at = excluded.claimed_at \
             WHERE request_claims.claimed_at < $4 AND request_claims.fingerprint = $5 \
             AND NOT EXISTS (SELECT 1 FROM remembered_responses WHERE gateway = $1 AND request_id = $2) \
             RETURNING claimed_at"
        )
    };
}
pub(super) use claim_request;

/// The fingerprint of the request that holds a claim (`None` inside: claimed before fingerprints).
pub(super) const CLAIM_FINGERPRINT: &str =
    "SELECT fingerprint FROM request_claims WHERE gateway = $1 AND request_id = $2";

/// The answer to `(gateway, request_id)`, with the fingerprint of the request it answered.
pub(super) const REMEMBERED: &str =
    "SELECT decision_id, response, at, fingerprint FROM remembered_responses \
     WHERE gateway = $1 AND request_id = $2";

/// What a claim that was not won found: the answer, once its holder has written it, else the
/// holder's fingerprint. Both are read only then, so a won claim costs one statement.
pub(super) async fn claimed(
    won: bool,
    answer: impl std::future::Future<Output = StoreResult<Option<Remembered>>>,
    holder: impl std::future::Future<Output = StoreResult<Option<Option<Vec<u8>>>>>,
) -> StoreResult<Claim> {
    if won {
        return Ok(Claim::Won);
    }
    if let Some(answer) = answer.await? {
        return Ok(Claim::Answered(answer));
    }
    Ok(Claim::Taken {
        fingerprint: holder.await?.flatten().as_deref().and_then(fingerprint),
    })
}

/// A stored fingerprint; one of another length is no request's.
fn fingerprint(stored: &[u8]) -> Option<Fingerprint> {
    stored.try_into().ok()
}

/// `request_key`: the stored key, after storing `$1` if there was none.
pub(super) const REQUEST_KEY: &str = "SELECT key FROM request_key";

/// A stored key as the 32 bytes it must be (the table's check says so).
pub(super) fn request_key(stored: Vec<u8>) -> StoreResult<[u8; 32]> {
    stored.as_slice().try_into().map_err(|_| StoreError::Corrupt {
        column: "request_key.key",
        value: format!("{} bytes, not 32", stored.len()),
    })
}

/// `note_decision`: the allow exists, was given to gateway `$2`, and was decided between `$3`
/// and `$4` (around its UUIDv7's instant, so that PostgreSQL reads one or two partitions).
pub(super) const NOTED_ALLOW: &str = "SELECT count(*) FROM audit_log WHERE decision_id = $1 \
     AND gateway = $2 AND kind = 'decide' AND outcome = 'allow' AND at >= $3 AND at < $4";
pub(super) const INSERT_NOTE: &str = "INSERT INTO decision_notes (decision_id, kind, at, gateway, detail) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (decision_id, kind) DO NOTHING";

/// `correct_lost_answer`: the note, when a record of decision `$1` decided between `$5` and `$6`
/// holds something other than outcome `$7` with code `$8` (what the caller received; `''` for no
/// decision, which no record holds). Casts rather than `::` so that SQLite reads it too, and a
/// `WHERE` so that SQLite does not read `ON CONFLICT` as a join's `ON`.
pub(super) const INSERT_CORRECTION: &str =
    "INSERT INTO decision_notes (decision_id, kind, at, gateway, detail) \
     SELECT CAST($1 AS TEXT), 'answer_lost', CAST($2 AS BIGINT), CAST($3 AS TEXT), CAST($4 AS TEXT) \
     WHERE EXISTS (SELECT 1 FROM audit_log WHERE decision_id = $1 AND at >= $5 AND at < $6 \
         AND NOT (outcome = $7 AND COALESCE(code, '') = $8)) \
     ON CONFLICT (decision_id, kind) DO NOTHING";

/// How far from its id's instant a decision's `at` is looked for: the id and `at` are taken
/// from the same clock moments apart; a day is room for any skew a replica may have.
const NOTE_SEARCH_MS: i64 = 24 * 60 * 60 * 1000;

/// The `at` range a decision id's record lies in, or `None` for an id that is no UUIDv7.
pub(super) fn decided_around(decision_id: &str) -> Option<(i64, i64)> {
    let id = uuid::Uuid::parse_str(decision_id).ok()?;
    let (seconds, nanos) = id.get_timestamp()?.to_unix();
    let ms = i64::try_from(seconds).ok()?.checked_mul(1000)? + i64::from(nanos / 1_000_000);
    Some((
        ms.saturating_sub(NOTE_SEARCH_MS),
        ms.saturating_add(NOTE_SEARCH_MS),
    ))
}

/// `decision_notes`: the notes on the given decisions.
pub(super) fn notes_query<DB>(decision_ids: &[String]) -> QueryBuilder<DB>
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new(
        "SELECT decision_id, kind, at, gateway, detail FROM decision_notes WHERE decision_id IN (",
    );
    let mut ids = query.separated(", ");
    for id in decision_ids {
        ids.push_bind(id.clone());
    }
    query.push(") ORDER BY at, decision_id, kind");
    query
}

#[derive(sqlx::FromRow)]
pub(super) struct NoteRow {
    decision_id: String,
    kind: String,
    at: i64,
    gateway: String,
    detail: String,
}

impl NoteRow {
    pub(super) fn into_note(self) -> StoreResult<DecisionNote> {
        let NoteRow {
            decision_id,
            kind,
            at,
            gateway,
            detail,
        } = self;
        Ok(DecisionNote {
            decision_id,
            gateway,
            kind: to_typed(kind, "decision_notes.kind", Note::parse)?,
            detail,
            at_ms: at,
        })
    }
}

/// `prune_audit`: the notes made before the cutoff `$1` go with the records.
pub(super) const FORGET_NOTES: &str = "DELETE FROM decision_notes WHERE at < $1";

/// `forget_requests`: the answers and the claims made before `$1`, in one transaction.
pub(super) const FORGET_ANSWERS: &str = "DELETE FROM remembered_responses WHERE at < $1";
pub(super) const FORGET_CLAIMS: &str = "DELETE FROM request_claims WHERE claimed_at < $1";

#[derive(sqlx::FromRow)]
pub(super) struct RememberedRow {
    decision_id: String,
    response: Vec<u8>,
    at: i64,
    fingerprint: Option<Vec<u8>>,
}

impl RememberedRow {
    pub(super) fn into_remembered(self) -> Remembered {
        Remembered {
            decision_id: self.decision_id,
            response: self.response,
            at_ms: self.at,
            fingerprint: self.fingerprint.as_deref().and_then(fingerprint),
        }
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct AuditRow {
    decision_id: String,
    at: i64,
    request_id: Option<String>,
    gateway: String,
    kind: String,
    outcome: String,
    code: Option<String>,
    path: Option<String>,
    principal_id: Option<String>,
    issuer: Option<String>,
    subject: Option<String>,
    capability: Option<String>,
    tool: Option<String>,
    account_id: Option<String>,
    limit_calls: Option<i64>,
    limit_per: Option<String>,
    usage_calls: Option<i64>,
    policy_version: Option<String>,
    policy_revision: Option<i64>,
    visible_count: Option<i64>,
    visible: Option<String>,
    door: String,
    first_decision_id: Option<String>,
    arguments_digest: Option<String>,
    arguments: Option<String>,
    arguments_omitted: Option<i64>,
    attributes: Option<String>,
}

impl AuditRow {
    pub(super) fn into_record(self) -> StoreResult<AuditRecord> {
        let AuditRow {
            decision_id,
            at,
            request_id,
            gateway,
            kind,
            outcome,
            code,
            path,
            principal_id,
            issuer,
            subject,
            capability,
            tool,
            account_id,
            limit_calls,
            limit_per,
            usage_calls,
            policy_version,
            policy_revision,
            visible_count,
            visible,
            door,
            first_decision_id,
            arguments_digest,
            arguments,
            arguments_omitted,
            attributes,
        } = self;
        Ok(AuditRecord {
            decision_id,
            at_ms: at,
            request_id,
            gateway,
            kind: to_typed(kind, "kind", RecordKind::parse)?,
            outcome: to_typed(outcome, "outcome", RecordOutcome::parse)?,
            code: code
                .map(|code| to_typed(code, "code", RecordCode::parse))
                .transpose()?,
            path,
            principal_id,
            issuer,
            subject,
            capability,
            tool,
            account_id,
            limit_calls: to_unsigned_opt(limit_calls, "limit_calls")?,
            limit_per,
            usage_calls: to_unsigned_opt(usage_calls, "usage_calls")?,
            policy_version,
            policy_revision: to_unsigned_opt(policy_revision, "policy_revision")?,
            visible_count: to_unsigned_opt(visible_count, "visible_count")?,
            visible: visible.as_deref().map(split_visible).unwrap_or_default(),
            door: to_typed(door, "door", Door::parse)?,
            first_decision_id,
            arguments_digest,
            arguments,
            arguments_omitted: to_unsigned_opt(arguments_omitted, "arguments_omitted")?,
            attributes,
            shadow: None,
        })
    }
}

/// The `visible` column of a record: its ids, separated by spaces; `None` (NULL) for none.
pub(super) fn join_visible(visible: &[String]) -> Option<String> {
    (!visible.is_empty()).then(|| visible.join(" "))
}

fn split_visible(text: &str) -> Vec<String> {
    text.split(' ').map(str::to_owned).collect()
}

/// The columns of `audit_log`, in the order of [`AuditRow`]; SQLite's `insert_audit` binds a
/// record's values in this order too.
pub(super) const AUDIT_COLUMNS: &str = "decision_id, at, request_id, gateway, kind, outcome, code, path, \
     principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, usage_calls, \
     policy_version, policy_revision, visible_count, visible, door, first_decision_id, arguments_digest, \
     arguments, arguments_omitted, attributes";

/// A record as the values of its `audit_log` row, field by field in [`AUDIT_COLUMNS`]' order:
/// what both stores write (SQLite binds them row after row, PostgreSQL gathers them into one
/// array per column). The integers are `BIGINT`s, checked before anything is written.
pub(super) struct AuditValues<'a> {
    pub(super) decision_id: &'a str,
    pub(super) at: i64,
    pub(super) request_id: Option<&'a str>,
    pub(super) gateway: &'a str,
    pub(super) kind: &'static str,
    pub(super) outcome: &'static str,
    pub(super) code: Option<&'static str>,
    pub(super) path: Option<&'a str>,
    pub(super) principal_id: Option<&'a str>,
    pub(super) issuer: Option<&'a str>,
    pub(super) subject: Option<&'a str>,
    pub(super) capability: Option<&'a str>,
    pub(super) tool: Option<&'a str>,
    pub(super) account_id: Option<&'a str>,
    pub(super) limit_calls: Option<i64>,
    pub(super) limit_per: Option<&'a str>,
    pub(super) usage_calls: Option<i64>,
    pub(super) policy_version: Option<&'a str>,
    pub(super) policy_revision: Option<i64>,
    pub(super) visible_count: Option<i64>,
    pub(super) visible: Option<String>,
    pub(super) door: &'static str,
    pub(super) first_decision_id: Option<&'a str>,
    pub(super) arguments_digest: Option<&'a str>,
    pub(super) arguments: Option<&'a str>,
    pub(super) arguments_omitted: Option<i64>,
    pub(super) attributes: Option<&'a str>,
}

impl<'a> AuditValues<'a> {
    pub(super) fn of(record: &'a AuditRecord) -> StoreResult<Self> {
        // Destructured so that a new field of `AuditRecord` fails to compile here until it has a
        // column.
        let AuditRecord {
            decision_id,
            at_ms,
            request_id,
            gateway,
            kind,
            outcome,
            code,
            path,
            principal_id,
            issuer,
            subject,
            capability,
            tool,
            account_id,
            limit_calls,
            limit_per,
            usage_calls,
            policy_version,
            policy_revision,
            visible_count,
            visible,
            door,
            first_decision_id,
            arguments_digest,
            arguments,
            arguments_omitted,
            attributes,
            // Its own table's row: `ShadowColumns`.
            shadow: _,
        } = record;
        let bigint = |value: &Option<u64>, column| value.map(|value| to_bigint(value, column)).transpose();
        Ok(AuditValues {
            decision_id,
            at: *at_ms,
            request_id: request_id.as_deref(),
            gateway,
            kind: kind.as_str(),
            outcome: outcome.as_str(),
            code: code.map(RecordCode::as_str),
            path: path.as_deref(),
            principal_id: principal_id.as_deref(),
            issuer: issuer.as_deref(),
            subject: subject.as_deref(),
            capability: capability.as_deref(),
            tool: tool.as_deref(),
            account_id: account_id.as_deref(),
            limit_calls: bigint(limit_calls, "limit_calls")?,
            limit_per: limit_per.as_deref(),
            usage_calls: bigint(usage_calls, "usage_calls")?,
            policy_version: policy_version.as_deref(),
            policy_revision: bigint(policy_revision, "policy_revision")?,
            visible_count: bigint(visible_count, "visible_count")?,
            visible: join_visible(visible),
            door: door.as_str(),
            first_decision_id: first_decision_id.as_deref(),
            arguments_digest: arguments_digest.as_deref(),
            arguments: arguments.as_deref(),
            arguments_omitted: bigint(arguments_omitted, "arguments_omitted")?,
            attributes: attributes.as_deref(),
        })
    }
}

// ── Policy versions ───────────────────────────────────────────────────────

/// What `publish` does once the active pointer is locked.
pub(super) enum PublishPlan {
    /// Same version and catalog as the active one. Checked before the
    /// expectation: the state the caller asks for already holds, so a retry
    /// of a publish that succeeded (its answer lost) is answered, not refused.
    Unchanged(StoredPolicy),
    Conflict {
        active: Option<u64>,
    },
    Insert,
}

pub(super) fn plan_publish(
    active: Option<StoredPolicy>,
    new: &NewPolicy,
    expected: ExpectedRevision,
) -> PublishPlan {
    let active_revision = active.as_ref().map(|policy| policy.revision);
    match active {
        Some(active) if active.version == new.version && active.catalog == new.catalog => {
            PublishPlan::Unchanged(active)
        }
        _ if !expectation_holds(expected, active_revision) => PublishPlan::Conflict {
            active: active_revision,
        },
        _ => PublishPlan::Insert,
    }
}

/// What `activate` does once the active pointer is locked.
pub(super) enum ActivatePlan {
    /// The revision is already active: nothing to change or announce (checked
    /// before the expectation, as for `publish`).
    AlreadyActive,
    Conflict {
        active: Option<u64>,
    },
    /// Look the revision up, then point at it (or answer `NotFound`).
    Switch,
}

pub(super) fn plan_activate(active: Option<u64>, revision: u64, expected: ExpectedRevision) -> ActivatePlan {
    if active == Some(revision) {
        ActivatePlan::AlreadyActive
    } else if !expectation_holds(expected, active) {
        ActivatePlan::Conflict { active }
    } else {
        ActivatePlan::Switch
    }
}

/// `Some(0)` expects that no version is active.
fn expectation_holds(expected: ExpectedRevision, active: Option<u64>) -> bool {
    expected.is_none_or(|expected| expected == active.unwrap_or(0))
}

// ── Audit queries ─────────────────────────────────────────────────────────

/// `SELECT … FROM audit_log WHERE … ORDER BY … LIMIT …` with only the
/// conditions the filter sets, so that each query is a plain equality plus a
/// range on `at` and the planner can pick the matching index (a catch-all
/// `($1 IS NULL OR col = $1)` would defeat PostgreSQL's generic plans).
pub(super) fn audit_query<DB>(filter: &AuditFilter) -> QueryBuilder<DB>
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new(format!("SELECT {AUDIT_COLUMNS} FROM audit_log"));
    audit_conditions(&mut query, filter);
    if let Some(AuditCursor { at_ms, decision_id }) = &filter.after {
        // After the cursor in (`at`, `decision_id`) order; `at >=` first, so the range stays one
        // the `at` indexes answer.
        query
            .push(" AND at >= ")
            .push_bind(*at_ms)
            .push(" AND (at > ")
            .push_bind(*at_ms)
            .push(" OR decision_id > ")
            .push_bind(decision_id.clone())
            .push(")");
    }
    let order = if filter.oldest_first { "ASC" } else { "DESC" };
    query
        .push(format_args!(" ORDER BY at {order}, decision_id {order} LIMIT "))
        .push_bind(i64::from(filter.limit));
    query
}

/// The conditions of the partial indexes on `outcome` and `code` (migrations 0012 and 0011), as
/// they are written there: a query that looks for another outcome or code says them too.
const NOT_ALLOW: &str = " AND outcome <> 'allow'";
const NOT_GRANTED: &str = " AND code <> 'granted'";

/// ` WHERE TRUE AND …`: the conditions of a filter but its cursor, order and limit.
fn audit_conditions<DB>(query: &mut QueryBuilder<DB>, filter: &AuditFilter)
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let AuditFilter {
        principal_id,
        capability,
        account_id,
        outcome,
        code,
        since_ms,
        until_ms,
        tool,
        gateway,
        kind,
        decision_id,
        request_id,
        after: _,
        oldest_first: _,
        limit: _,
    } = filter;
    query.push(" WHERE TRUE");
    for (column, value) in [
        ("principal_id", principal_id),
        ("capability", capability),
        ("account_id", account_id),
        ("outcome", outcome),
        ("code", code),
        ("tool", tool),
        ("gateway", gateway),
        ("kind", kind),
        ("decision_id", decision_id),
        ("request_id", request_id),
    ] {
        if let Some(value) = value {
            query
                .push(format_args!(" AND {column} = "))
                .push_bind(value.clone());
        }
    }
    // The outcome and code indexes hold no allows (migrations 0012/0011, docs/decisions/0037). A
    // planner uses a partial index only where the query's conditions imply the index's, and with
    // the value bound neither can tell: say it in the index's own words.
    if outcome
        .as_deref()
        .is_some_and(|outcome| outcome != RecordOutcome::Allow.as_str())
    {
        query.push(NOT_ALLOW);
    }
    if code
        .as_deref()
        .is_some_and(|code| code != ReasonCode::Granted.as_str())
    {
        query.push(NOT_GRANTED);
    }
    if let Some(since) = since_ms {
        query.push(" AND at >= ").push_bind(*since);
    }
    if let Some(until) = until_ms {
        query.push(" AND at < ").push_bind(*until);
    }
}

/// `SELECT key…, count(*), min(at), max(at) FROM audit_log WHERE … GROUP BY key… ORDER BY …`:
/// the groups of [`Store::audit_groups`](super::Store::audit_groups). `collate` is how the
/// dialect compares the values bytewise (PostgreSQL's `COLLATE "C"`; SQLite's default already
/// does), so both stores order groups alike. `key IS NULL` sorts an empty value last on both.
pub(super) fn audit_groups_query<DB>(
    filter: &AuditFilter,
    keys: &[GroupKey],
    collate: &str,
) -> QueryBuilder<DB>
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let columns: Vec<&str> = keys.iter().map(|key| key.column()).collect();
    let mut query = QueryBuilder::new(format!(
        "SELECT {}, count(*) AS records, min(at) AS first_at, max(at) AS last_at FROM audit_log",
        columns.join(", ")
    ));
    audit_conditions(&mut query, filter);
    let order: Vec<String> = columns
        .iter()
        .map(|column| format!("{column} IS NULL, {column}{collate}"))
        .collect();
    query
        .push(format_args!(
            " GROUP BY {} ORDER BY records DESC, {} LIMIT ",
            columns.join(", "),
            order.join(", ")
        ))
        .push_bind(i64::from(filter.limit));
    query
}

/// One row of [`audit_groups_query`] with `keys` key columns.
pub(super) fn audit_group<R>(row: &R, keys: usize) -> StoreResult<AuditGroup>
where
    R: Row,
    usize: ColumnIndex<R>,
    Option<String>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
{
    let values = (0..keys)
        .map(|index| row.try_get::<Option<String>, usize>(index))
        .collect::<Result<Vec<_>, _>>()
        .during("audit_groups")?;
    let records: i64 = row.try_get(keys).during("audit_groups")?;
    Ok(AuditGroup {
        values,
        records: to_unsigned(records, "records")?,
        first_at_ms: row.try_get(keys + 1).during("audit_groups")?,
        last_at_ms: row.try_get(keys + 2).during("audit_groups")?,
    })
}

// ── Shadow versions (docs/decisions/0035) ─────────────────────────────────

/// The shadow version and who set it.
pub(super) const SHADOW_POLICY: &str = "SELECT p.revision, p.version, p.artifact, p.catalog, p.author, \
     p.comment, p.created_at, s.set_at, s.set_by \
     FROM shadow_policy s JOIN policy_versions p ON p.revision = s.revision";

/// Stores a new version (`$1` to `$6`) and returns it whole.
pub(super) const INSERT_POLICY: &str = "INSERT INTO policy_versions \
     (version, artifact, catalog, author, comment, created_at) VALUES ($1, $2, $3, $4, $5, $6) \
     RETURNING revision, version, artifact, catalog, author, comment, created_at";

/// Points the shadow at `$1` (NULL: none), set by `$3` at `$2`.
pub(super) const SET_SHADOW: &str = "UPDATE shadow_policy SET revision = $1, set_at = $2, set_by = $3";

/// Clears the shadow pointer (set by `$3` at `$2`) when the shadow version is the one revision `$1`
/// holds — the same artifact and catalog, under whichever revision — because `$1` just became active:
/// a shadow equal to the active version can record nothing and would cost an evaluation per call.
pub(super) const RETIRE_SHADOW: &str = "UPDATE shadow_policy SET revision = NULL, set_at = $2, set_by = $3 \
     WHERE revision IN (SELECT o.revision FROM policy_versions o JOIN policy_versions a ON a.revision = $1 \
     WHERE o.version = a.version AND COALESCE(o.catalog, '') = COALESCE(a.catalog, ''))";

/// Removes the differences recorded before `$1`.
pub(super) const PRUNE_SHADOW: &str = "DELETE FROM shadow_differences WHERE at < $1";

/// The columns of `shadow_differences`, in the order of [`ShadowRow`].
const SHADOW_COLUMNS: &str = "decision_id, at, kind, transition, active_revision, shadow_revision, \
     principal_id, capability, tool, active_outcome, active_code, active_path, active_account, \
     active_limit_calls, active_limit_per, shadow_outcome, shadow_code, shadow_path, shadow_account, \
     shadow_limit_calls, shadow_limit_per, gained, lost";

/// Inserts one difference (`$1` to `$23`, in [`SHADOW_COLUMNS`]' order).
pub(super) const INSERT_SHADOW: &str = "INSERT INTO shadow_differences (decision_id, at, kind, transition, \
     active_revision, shadow_revision, principal_id, capability, tool, active_outcome, active_code, \
     active_path, active_account, active_limit_calls, active_limit_per, shadow_outcome, shadow_code, \
     shadow_path, shadow_account, shadow_limit_calls, shadow_limit_per, gained, lost) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, \
     $20, $21, $22, $23) ON CONFLICT DO NOTHING";

#[derive(sqlx::FromRow)]
pub(super) struct ShadowPolicyRow {
    #[sqlx(flatten)]
    policy: PolicyRow,
    set_at: Option<i64>,
    set_by: Option<String>,
}

impl ShadowPolicyRow {
    pub(super) fn into_shadow(self) -> StoreResult<Shadow> {
        Ok(Shadow {
            policy: self.policy.into_policy()?,
            set: Actor {
                name: self.set_by.unwrap_or_default(),
                at_ms: self.set_at.unwrap_or_default(),
            },
        })
    }
}

/// One row of `shadow_differences`: a record's active side and the shadow's.
#[derive(sqlx::FromRow)]
pub(super) struct ShadowRow {
    decision_id: String,
    at: i64,
    kind: String,
    transition: String,
    active_revision: i64,
    shadow_revision: i64,
    principal_id: Option<String>,
    capability: Option<String>,
    tool: Option<String>,
    active_outcome: String,
    active_code: Option<String>,
    active_path: Option<String>,
    active_account: Option<String>,
    active_limit_calls: Option<i64>,
    active_limit_per: Option<String>,
    shadow_outcome: String,
    shadow_code: Option<String>,
    shadow_path: Option<String>,
    shadow_account: Option<String>,
    shadow_limit_calls: Option<i64>,
    shadow_limit_per: Option<String>,
    gained: Option<String>,
    lost: Option<String>,
}

impl ShadowRow {
    pub(super) fn into_record(self) -> StoreResult<AuditRecord> {
        let ShadowRow {
            decision_id,
            at,
            kind,
            transition,
            active_revision,
            shadow_revision,
            principal_id,
            capability,
            tool,
            active_outcome,
            active_code,
            active_path,
            active_account,
            active_limit_calls,
            active_limit_per,
            shadow_outcome,
            shadow_code,
            shadow_path,
            shadow_account,
            shadow_limit_calls,
            shadow_limit_per,
            gained,
            lost,
        } = self;
        Ok(AuditRecord {
            decision_id,
            at_ms: at,
            kind: to_typed(kind, "kind", RecordKind::parse)?,
            outcome: to_typed(active_outcome, "active_outcome", RecordOutcome::parse)?,
            code: active_code
                .map(|code| to_typed(code, "active_code", RecordCode::parse))
                .transpose()?,
            path: active_path,
            principal_id,
            capability,
            tool,
            account_id: active_account,
            limit_calls: to_unsigned_opt(active_limit_calls, "active_limit_calls")?,
            limit_per: active_limit_per,
            policy_revision: Some(to_unsigned(active_revision, "active_revision")?),
            shadow: Some(Box::new(ShadowSide {
                revision: to_unsigned(shadow_revision, "shadow_revision")?,
                transition,
                outcome: to_typed(shadow_outcome, "shadow_outcome", RecordOutcome::parse)?,
                code: shadow_code,
                path: shadow_path,
                account_id: shadow_account,
                limit_calls: to_unsigned_opt(shadow_limit_calls, "shadow_limit_calls")?,
                limit_per: shadow_limit_per,
                gained: gained.as_deref().map(split_visible).unwrap_or_default(),
                lost: lost.as_deref().map(split_visible).unwrap_or_default(),
            })),
            ..AuditRecord::default()
        })
    }
}

/// A shadow difference's columns, checked before anything is written: the record's active side
/// and its shadow side, in [`INSERT_SHADOW`]'s order. `None` for a record without one.
pub(super) struct ShadowColumns {
    pub(super) decision_id: String,
    pub(super) at: i64,
    pub(super) kind: &'static str,
    pub(super) transition: String,
    pub(super) active_revision: i64,
    pub(super) shadow_revision: i64,
    pub(super) principal_id: Option<String>,
    pub(super) capability: Option<String>,
    pub(super) tool: Option<String>,
    pub(super) active_outcome: &'static str,
    pub(super) active_code: Option<&'static str>,
    pub(super) active_path: Option<String>,
    pub(super) active_account: Option<String>,
    pub(super) active_limit_calls: Option<i64>,
    pub(super) active_limit_per: Option<String>,
    pub(super) shadow_outcome: &'static str,
    pub(super) shadow_code: Option<String>,
    pub(super) shadow_path: Option<String>,
    pub(super) shadow_account: Option<String>,
    pub(super) shadow_limit_calls: Option<i64>,
    pub(super) shadow_limit_per: Option<String>,
    pub(super) gained: Option<String>,
    pub(super) lost: Option<String>,
}

impl ShadowColumns {
    pub(super) fn of(record: &AuditRecord) -> StoreResult<Option<Self>> {
        let Some(shadow) = record.shadow.as_deref() else {
            return Ok(None);
        };
        let opt = |value: Option<u64>, column| value.map(|value| to_bigint(value, column)).transpose();
        Ok(Some(ShadowColumns {
            decision_id: record.decision_id.clone(),
            at: record.at_ms,
            kind: record.kind.as_str(),
            transition: shadow.transition.clone(),
            active_revision: to_bigint(record.policy_revision.unwrap_or_default(), "active_revision")?,
            shadow_revision: to_bigint(shadow.revision, "shadow_revision")?,
            principal_id: record.principal_id.clone(),
            capability: record.capability.clone(),
            tool: record.tool.clone(),
            active_outcome: record.outcome.as_str(),
            active_code: record.code.map(RecordCode::as_str),
            active_path: record.path.clone(),
            active_account: record.account_id.clone(),
            active_limit_calls: opt(record.limit_calls, "active_limit_calls")?,
            active_limit_per: record.limit_per.clone(),
            shadow_outcome: shadow.outcome.as_str(),
            shadow_code: shadow.code.clone(),
            shadow_path: shadow.path.clone(),
            shadow_account: shadow.account_id.clone(),
            shadow_limit_calls: opt(shadow.limit_calls, "shadow_limit_calls")?,
            shadow_limit_per: shadow.limit_per.clone(),
            gained: join_visible(&shadow.gained),
            lost: join_visible(&shadow.lost),
        }))
    }
}

/// ` WHERE TRUE AND …`: a shadow filter's conditions, its limit aside.
fn shadow_conditions<DB>(query: &mut QueryBuilder<DB>, filter: &ShadowFilter)
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    query.push(" WHERE TRUE");
    if let Some(since) = filter.since_ms {
        query.push(" AND at >= ").push_bind(since);
    }
    if let Some(until) = filter.until_ms {
        query.push(" AND at < ").push_bind(until);
    }
    if let Some(revision) = filter.revision {
        query
            .push(" AND shadow_revision = ")
            .push_bind(saturating_bigint(revision));
    }
    if let Some(transition) = &filter.transition {
        query.push(" AND transition = ").push_bind(transition.clone());
    }
}

/// The differences `filter` matches, newest first.
pub(super) fn shadow_query<DB>(filter: &ShadowFilter) -> QueryBuilder<DB>
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new(format!("SELECT {SHADOW_COLUMNS} FROM shadow_differences"));
    shadow_conditions(&mut query, filter);
    query
        .push(" ORDER BY at DESC, decision_id DESC LIMIT ")
        .push_bind(i64::from(filter.limit));
    query
}

/// The differences `filter` matches, counted per shadow revision and transition.
pub(super) fn shadow_counts_query<DB>(filter: &ShadowFilter) -> QueryBuilder<DB>
where
    DB: Database,
    DB::Arguments: Default,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new(
        "SELECT shadow_revision, transition, count(*) AS records, min(at) AS first_at, max(at) AS last_at \
         FROM shadow_differences",
    );
    shadow_conditions(&mut query, filter);
    query.push(" GROUP BY shadow_revision, transition ORDER BY shadow_revision DESC, transition");
    query
}

#[derive(sqlx::FromRow)]
pub(super) struct ShadowCountRow {
    shadow_revision: i64,
    transition: String,
    records: i64,
    first_at: i64,
    last_at: i64,
}

impl ShadowCountRow {
    pub(super) fn into_count(self) -> StoreResult<ShadowCount> {
        Ok(ShadowCount {
            revision: to_unsigned(self.shadow_revision, "shadow_revision")?,
            transition: self.transition,
            records: to_unsigned(self.records, "records")?,
            first_at_ms: self.first_at,
            last_at_ms: self.last_at,
        })
    }
}

// ── The operator's history ────────────────────────────────────────────────

/// Records a change of the active version, inside the transaction that made it.
pub(super) const INSERT_ACTIVATION: &str = "INSERT INTO policy_activations \
     (at, actor, kind, from_revision, to_revision) VALUES ($1, $2, $3, $4, $5)";

pub(super) const ACTIVATIONS: &str = "SELECT at, actor, kind, from_revision, to_revision \
     FROM policy_activations ORDER BY id DESC LIMIT $1";

#[derive(sqlx::FromRow)]
pub(super) struct ActivationRow {
    at: i64,
    actor: String,
    kind: String,
    from_revision: Option<i64>,
    to_revision: i64,
}

impl ActivationRow {
    pub(super) fn into_activation(self) -> StoreResult<Activation> {
        let ActivationRow {
            at,
            actor,
            kind,
            from_revision,
            to_revision,
        } = self;
        Ok(Activation {
            at_ms: at,
            actor,
            kind: to_typed(kind, "policy_activations.kind", ActivationKind::parse)?,
            from_revision: to_unsigned_opt(from_revision, "from_revision")?,
            to_revision: to_unsigned(to_revision, "to_revision")?,
        })
    }
}

/// `counters`: `$1` principal, `$2` capability or NULL for all of them, `$3` at most.
pub(super) const COUNTERS: &str = "SELECT principal_id, capability, calls, window_start FROM usage_counters \
     WHERE principal_id = $1 AND ($2 IS NULL OR capability = $2) ORDER BY capability LIMIT $3";

#[derive(sqlx::FromRow)]
pub(super) struct StoredCounterRow {
    principal_id: String,
    capability: String,
    calls: i64,
    window_start: i64,
}

impl StoredCounterRow {
    pub(super) fn into_counter(self) -> StoreResult<StoredCounter> {
        let StoredCounterRow {
            principal_id,
            capability,
            calls,
            window_start,
        } = self;
        Ok(StoredCounter {
            principal_id,
            capability,
            reading: CounterReading {
                calls: to_unsigned(calls, "calls")?,
                window_start_ms: window_start,
            },
        })
    }
}

/// `reset_usage`: the counter goes, returning what it read…
pub(super) const DELETE_COUNTER: &str = "DELETE FROM usage_counters \
     WHERE principal_id = $1 AND capability = $2 RETURNING calls, window_start";
/// …and the reset is recorded in the same transaction.
pub(super) const INSERT_RESET: &str = "INSERT INTO usage_resets \
     (at, actor, principal_id, capability, calls, window_start) VALUES ($1, $2, $3, $4, $5, $6)";

pub(super) const RESETS: &str = "SELECT at, actor, principal_id, capability, calls, window_start \
     FROM usage_resets WHERE principal_id = $1 AND ($2 IS NULL OR capability = $2) \
     ORDER BY id DESC LIMIT $3";

#[derive(sqlx::FromRow)]
pub(super) struct ResetRow {
    at: i64,
    actor: String,
    principal_id: String,
    capability: String,
    calls: i64,
    window_start: i64,
}

impl ResetRow {
    pub(super) fn into_reset(self) -> StoreResult<UsageReset> {
        let ResetRow {
            at,
            actor,
            principal_id,
            capability,
            calls,
            window_start,
        } = self;
        Ok(UsageReset {
            at_ms: at,
            actor,
            principal_id,
            capability,
            reading: CounterReading {
                calls: to_unsigned(calls, "calls")?,
                window_start_ms: window_start,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(revision: u64, version: &str, catalog: Option<&str>) -> StoredPolicy {
        StoredPolicy {
            revision,
            version: version.to_owned(),
            artifact: String::new(),
            catalog: catalog.map(str::to_owned),
            author: String::new(),
            comment: String::new(),
            created_at_ms: 0,
        }
    }

    fn new(version: &str, catalog: Option<&str>) -> NewPolicy {
        NewPolicy {
            version: version.to_owned(),
            artifact: String::new(),
            catalog: catalog.map(str::to_owned),
            author: String::new(),
            comment: String::new(),
            created_at_ms: 0,
        }
    }

    fn row(kind: &str, outcome: &str, code: Option<&str>, usage_calls: Option<i64>) -> AuditRow {
        AuditRow {
            decision_id: "d1".to_owned(),
            at: 1_000,
            request_id: None,
            gateway: "edge".to_owned(),
            kind: kind.to_owned(),
            outcome: outcome.to_owned(),
            code: code.map(str::to_owned),
            path: None,
            principal_id: None,
            issuer: None,
            subject: None,
            capability: None,
            tool: None,
            account_id: None,
            limit_calls: None,
            limit_per: None,
            usage_calls,
            policy_version: None,
            policy_revision: None,
            visible_count: None,
            visible: None,
            door: "capgate".to_owned(),
            first_decision_id: None,
            arguments_digest: None,
            arguments: None,
            arguments_omitted: None,
            attributes: None,
        }
    }

    #[track_caller]
    fn corrupt(row: AuditRow) -> (&'static str, String) {
        match row.into_record() {
            Err(StoreError::Corrupt { column, value }) => (column, value),
            other => panic!("expected a corrupt value, got {other:?}"),
        }
    }

    #[test]
    fn stored_texts_are_read_into_the_record_types() {
        let record = row("list", "unauthenticated", Some("issuer_unknown"), Some(3))
            .into_record()
            .expect("a readable row");
        assert_eq!(record.kind, RecordKind::List);
        assert_eq!(record.outcome, RecordOutcome::Unauthenticated);
        assert_eq!(record.code.map(RecordCode::as_str), Some("issuer_unknown"));
        assert_eq!(record.usage_calls, Some(3));
        assert_eq!(
            row("decide", "unknown_tool", None, None)
                .into_record()
                .unwrap()
                .code,
            None
        );
    }

    #[test]
    fn an_unreadable_stored_value_is_an_error_naming_its_column() {
        assert_eq!(
            corrupt(row("Decide", "allow", None, None)),
            ("kind", "Decide".to_owned())
        );
        assert_eq!(
            corrupt(row("decide", "perhaps", None, None)),
            ("outcome", "perhaps".to_owned())
        );
        assert_eq!(
            corrupt(row("decide", "deny", Some("no_grant"), None)),
            ("code", "no_grant".to_owned())
        );
        assert_eq!(
            corrupt(row("decide", "allow", Some("granted"), Some(-1))),
            ("usage_calls", "-1".to_owned())
        );
    }

    #[test]
    fn expired_threshold_is_exact_at_the_ends() {
        assert_eq!(expired_at_or_before(10_000, 3_000), Some(7_000));
        assert_eq!(expired_at_or_before(10_000, 0), Some(10_000));
        assert_eq!(expired_at_or_before(0, i64::MAX as u64), Some(-i64::MAX));
        assert_eq!(expired_at_or_before(0, u64::MAX), None);
        // The one window start a window of `u64::MAX` has outlived.
        assert_eq!(expired_at_or_before(i64::MAX, u64::MAX), Some(i64::MIN));
        assert_eq!(expired_at_or_before(i64::MIN, 1), None);
    }

    #[test]
    fn identical_content_wins_over_a_stale_expectation() {
        let active = Some(stored(3, "sha256:a", None));
        assert!(matches!(
            plan_publish(active.clone(), &new("sha256:a", None), Some(2)),
            PublishPlan::Unchanged(policy) if policy.revision == 3
        ));
        assert!(matches!(
            plan_publish(active.clone(), &new("sha256:a", Some("c")), Some(2)),
            PublishPlan::Conflict { active: Some(3) }
        ));
        assert!(matches!(
            plan_publish(active, &new("sha256:b", None), Some(3)),
            PublishPlan::Insert
        ));
        assert!(matches!(
            plan_publish(None, &new("sha256:b", None), Some(0)),
            PublishPlan::Insert
        ));
        assert!(matches!(
            plan_publish(None, &new("sha256:b", None), Some(1)),
            PublishPlan::Conflict { active: None }
        ));
    }

    #[test]
    fn activating_the_active_revision_changes_nothing() {
        assert!(matches!(
            plan_activate(Some(2), 2, Some(7)),
            ActivatePlan::AlreadyActive
        ));
        assert!(matches!(
            plan_activate(Some(2), 1, Some(7)),
            ActivatePlan::Conflict { active: Some(2) }
        ));
        assert!(matches!(plan_activate(None, 1, Some(0)), ActivatePlan::Switch));
        assert!(matches!(plan_activate(Some(2), 1, None), ActivatePlan::Switch));
    }
}
