//! The SQLite store: the embedded default for a single replica, a laptop, an
//! edge box (docs/service.md). Same tables and same behaviour as PostgreSQL.
//!
//! SQLite lets one writer in at a time. The database runs in WAL mode, so
//! readers never wait for the writer, and every connection has a busy
//! timeout, so a second writer waits for the first instead of failing.
//! Transactions that read and then write start with `BEGIN IMMEDIATE`: they
//! take the write lock first, so what they read cannot change before they
//! write (a deferred transaction would fail with `SQLITE_BUSY` instead of
//! waiting when its snapshot went stale).
//!
//! Writers of one store value also queue in the process, first come first
//! served, before they ask SQLite for the write lock (see
//! `SqliteStore::write_turn`): a writer that finds the lock taken would
//! otherwise sleep in SQLite's busy handler, in steps of 1, 2, 5, 10… ms,
//! which under load costs more than the write itself and can push a counter
//! consumption past the server's store timeout. The busy timeout still
//! covers writers in other processes (`capgate publish` against the same
//! file).
//!
//! There is no notification channel: with one replica, the server knows of
//! its own changes, and polls for anyone else's (`capgate publish` against
//! the same file).
//!
//! There are no partitions either: a prune groups the audit records in the
//! periods PostgreSQL partitions by (`retention.rs`) and deletes those of
//! whole periods before the cutoff, oldest first, in bounded batches.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteError, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Executor, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, MutexGuard};

use super::counting::{self, COUNT_USAGE};
use super::retention::{self, Period};
use super::sql::{
    self, ActivatePlan, ActivationRow, AuditRow, AuditValues, CounterRow, During, NoteRow, PolicyRow,
    PublishPlan, RememberedRow, ResetRow, ShadowColumns, ShadowCountRow, ShadowPolicyRow, ShadowRow,
    StoredCounterRow, AUDIT_COLUMNS,
};
use super::{
    ActivateOutcome, Activation, ActivationKind, Actor, AuditFilter, AuditGroup, AuditRecord, Claim,
    CommitGate, CounterAsk, CounterKey, CounterReading, DecisionNote, ExpectedRevision, Fingerprint,
    GroupKey, LostAnswer, NewPolicy, PrunedPeriod, PublishOutcome, Remembered, RememberedEntry, Settle,
    Shadow, ShadowCount, ShadowFilter, Store, StoreError, StoreOptions, StoreResult, StoredCounter,
    StoredPolicy, Tally, UsageReset,
};

static MIGRATOR: Migrator = sqlx::migrate!("migrations/sqlite");

/// WAL mode lets readers run beside the one writer; more connections than
/// this only queue on the write lock.
const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// How long a writer waits for the write lock before failing. Far above the
/// server's store timeout, which gives up first; this only bounds the wait of
/// work nobody is waiting for any more.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many audit records one prune transaction deletes at most: each batch
/// holds the write lock for a few milliseconds, so the server's audit writer
/// gets its turn between batches.
const PRUNE_BATCH: i64 = 5_000;

/// A pool on one SQLite database file.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// One connection for request claims alone, whose commits do not sync the log
    /// (`synchronous = NORMAL`): see `claim_request`. Nothing else writes through it.
    claims: SqlitePool,
    /// Held by every writer of this store value (and its clones) while it
    /// writes: one writer at a time, in arrival order (tokio's mutex is fair).
    writer: Arc<Mutex<()>>,
}

impl SqliteStore {
    /// Opens a pool on `url` (`sqlite://path`). The file is created when
    /// missing, unless the URL chooses a `mode` itself (`?mode=ro`, …).
    pub async fn connect(url: &str, options: &StoreOptions) -> StoreResult<Self> {
        let mut connect_options = SqliteConnectOptions::from_str(url).during("connect")?;
        if !has_mode_parameter(url) {
            connect_options = connect_options.create_if_missing(true);
        }
        Self::connect_with(connect_options, options).await
    }

    /// Opens a pool with explicit connection options; the journal mode, the
    /// busy timeout and the durability level are set here whatever they say.
    pub async fn connect_with(
        connect_options: SqliteConnectOptions,
        options: &StoreOptions,
    ) -> StoreResult<Self> {
        let connect_options = connect_options
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            // INVARIANT: no decision is returned before its audit record is
            // durable (docs/service.md). In WAL mode, `NORMAL` may lose the last
            // commits on power loss; `FULL` syncs the log at every commit,
            // which the server's group commit amortises.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true);
        // One plain connection first, which creates the file and switches it
        // to WAL: a wrong path then fails at once with its cause, where the
        // pool would retry until `acquire_timeout`.
        SqliteConnection::connect_with(&connect_options)
            .await
            .during("connect")?
            .close()
            .await
            .during("connect")?;
        let claims = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect_options.clone().synchronous(SqliteSynchronous::Normal))
            .await
            .during("connect")?;
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect_options)
            .await
            .during("connect")?;
        Ok(SqliteStore {
            pool,
            claims,
            writer: Arc::new(Mutex::new(())),
        })
    }

    /// Waits for this store's turn to write. SQLite admits one writer at a
    /// time anyway; queueing here, in order, replaces the busy handler's
    /// sleeps with a wake-up the moment the previous writer is done. Dropping
    /// the future (a caller's timeout) leaves the queue.
    async fn write_turn(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().await
    }

    /// The policy at `revision`, read as part of `operation`.
    async fn policy_in(
        executor: impl Executor<'_, Database = Sqlite>,
        revision: i64,
        operation: &'static str,
    ) -> StoreResult<Option<StoredPolicy>> {
        sqlx::query_as::<_, PolicyRow>(
            "SELECT revision, version, artifact, catalog, author, comment, created_at \
             FROM policy_versions WHERE revision = $1",
        )
        .bind(revision)
        .fetch_optional(executor)
        .await
        .during(operation)?
        .map(PolicyRow::into_policy)
        .transpose()
    }
}

/// Whether the URL's query sets `mode` (SQLite's `ro`, `rw`, `rwc`, `memory`).
fn has_mode_parameter(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair == "mode" || pair.starts_with("mode="))
    })
}

/// Inserts the shadow differences `records` carry into `tx`, as part of `operation`.
async fn insert_shadow_differences(
    tx: &mut SqliteConnection,
    records: &[AuditRecord],
    operation: &'static str,
) -> StoreResult<()> {
    for record in records {
        let Some(row) = ShadowColumns::of(record)? else {
            continue;
        };
        sqlx::query(sql::INSERT_SHADOW)
            .bind(row.decision_id)
            .bind(row.at)
            .bind(row.kind)
            .bind(row.transition)
            .bind(row.active_revision)
            .bind(row.shadow_revision)
            .bind(row.principal_id)
            .bind(row.capability)
            .bind(row.tool)
            .bind(row.active_outcome)
            .bind(row.active_code)
            .bind(row.active_path)
            .bind(row.active_account)
            .bind(row.active_limit_calls)
            .bind(row.active_limit_per)
            .bind(row.shadow_outcome)
            .bind(row.shadow_code)
            .bind(row.shadow_path)
            .bind(row.shadow_account)
            .bind(row.shadow_limit_calls)
            .bind(row.shadow_limit_per)
            .bind(row.gained)
            .bind(row.lost)
            .execute(&mut *tx)
            .await
            .during(operation)?;
    }
    Ok(())
}

/// Inserts audit entries into `tx`, as `append_audit` describes, as part of `operation`.
async fn insert_audit(
    tx: &mut SqliteConnection,
    records: &[AuditRecord],
    remembered: &[RememberedEntry],
    operation: &'static str,
) -> StoreResult<()> {
    let values = records
        .iter()
        .map(AuditValues::of)
        .collect::<StoreResult<Vec<_>>>()?;
    // Several rows per statement, inside one transaction: SQLite runs in-process, but sqlx runs
    // each statement on the connection's own thread, so a statement is a hand-off between threads
    // each way, and one per row was most of an append (docs/benchmarks.md, "SQLite's append
    // ceiling"); the transaction makes the batch durable with one sync.
    for chunk in chunks(&values) {
        let mut query = sqlx::query(insert_audit_rows(chunk.len()));
        for row in chunk {
            query = query
                .bind(row.decision_id)
                .bind(row.at)
                .bind(row.request_id)
                .bind(row.gateway)
                .bind(row.kind)
                .bind(row.outcome)
                .bind(row.code)
                .bind(row.path)
                .bind(row.principal_id)
                .bind(row.issuer)
                .bind(row.subject)
                .bind(row.capability)
                .bind(row.tool)
                .bind(row.account_id)
                .bind(row.limit_calls)
                .bind(row.limit_per)
                .bind(row.usage_calls)
                .bind(row.policy_version)
                .bind(row.policy_revision)
                .bind(row.visible_count)
                .bind(row.visible.as_deref())
                .bind(row.door)
                .bind(row.first_decision_id)
                .bind(row.arguments_digest)
                .bind(row.arguments)
                .bind(row.arguments_omitted)
                .bind(row.attributes);
        }
        query.execute(&mut *tx).await.during(operation)?;
    }
    insert_shadow_differences(tx, records, operation).await?;
    for (gateway, request_id, answer) in remembered {
        sqlx::query(
            "INSERT INTO remembered_responses (gateway, request_id, decision_id, response, at, fingerprint) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT DO NOTHING",
        )
        .bind(gateway)
        .bind(request_id)
        .bind(&answer.decision_id)
        .bind(&answer.response)
        .bind(answer.at_ms)
        .bind(answer.fingerprint.as_ref().map(|fingerprint| &fingerprint[..]))
        .execute(&mut *tx)
        .await
        .during(operation)?;
    }
    Ok(())
}

/// Counts `asks` in order against their counters, read in one statement and
/// written back in one, per chunk of at most [`COUNTER_CHUNK`] keys. SQLite runs
/// in-process, but sqlx runs each statement on the connection's own thread, so
/// a statement is a hand-off between threads each way: one per key read and one
/// per key written made a batch of 64 capped calls on as many counters 128 of
/// them (docs/benchmarks.md, "Round 3").
async fn count_in(tx: &mut SqliteConnection, asks: &[CounterAsk]) -> Result<Vec<Tally>, sqlx::Error> {
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    let (keys, positions) = counting::counter_keys(asks);
    let mut rows = Vec::with_capacity(keys.len());
    for chunk in chunks(&keys) {
        let statement = read_counters(chunk.len());
        let mut query = sqlx::query_as::<_, (String, String, i64, i64)>(statement);
        for (principal, capability) in chunk {
            query = query.bind(*principal).bind(*capability);
        }
        rows.extend(query.fetch_all(&mut *tx).await?);
    }
    let mut counters = counting::readings(&keys, rows);
    let before = counters.clone();
    let tallies = counting::count(asks, &positions, &mut counters);
    let changed: Vec<((&str, &str), CounterReading)> = keys
        .iter()
        .zip(counters.iter().zip(&before))
        .filter_map(|(key, (now, was))| now.filter(|now| Some(*now) != *was).map(|now| (*key, now)))
        .collect();
    for chunk in chunks(&changed) {
        let statement = write_counters(chunk.len());
        let mut query = sqlx::query(statement);
        for ((principal, capability), now) in chunk {
            query = query
                .bind(*principal)
                .bind(*capability)
                .bind(now.window_start_ms)
                .bind(sql::saturating_bigint(now.calls));
        }
        query.execute(&mut *tx).await?;
    }
    Ok(tallies)
}

/// The statement that reads `keys` counters, their keys bound as `$1, $2, …` in pairs.
///
/// A join from the keys, not `(principal_id, capability) IN (VALUES …)`: the bundled SQLite
/// searches the primary key for either, but SQLite 3.40 (Debian 12's) plans the `IN` form as a
/// scan of the whole table once there are two keys. `CROSS JOIN` keeps the keys the outer loop,
/// so each is one search of the primary key (`tests::counters_are_read_by_their_key`).
fn read_counters(keys: usize) -> AssertSqlSafe<String> {
    // INVARIANT: the text is fixed but for numbered placeholders; every value is bound.
    AssertSqlSafe(format!(
        "SELECT c.principal_id, c.capability, c.calls, c.window_start \
         FROM (VALUES {}) AS k CROSS JOIN usage_counters AS c \
         ON c.principal_id = k.column1 AND c.capability = k.column2",
        placeholders(keys, 2)
    ))
}

/// The statement that appends `rows` audit records (`rows` a size [`chunks`] makes), bound in
/// [`AUDIT_COLUMNS`]' order ([`AuditValues`]' fields, as `insert_audit` binds them), row after
/// row. Built once per size: at 64 rows, 1,728 placeholders. They are anonymous (`?`), not numbered: sqlx asks SQLite each numbered
/// parameter's name, which SQLite finds by walking a list of them all, so binding `$1 … $1728`
/// took time in the square of their count and made this statement slower than one per row.
fn insert_audit_rows(rows: usize) -> &'static str {
    static STATEMENTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        (0..=COUNTER_CHUNK.ilog2())
            .map(|power| {
                // INVARIANT: the text is fixed but for anonymous placeholders; every value is bound.
                format!(
                    "INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES {} ON CONFLICT DO NOTHING",
                    anonymous_placeholders(1 << power, AUDIT_COLUMNS.split(',').count())
                )
            })
            .collect()
    });
    debug_assert!(rows.is_power_of_two() && rows <= COUNTER_CHUNK, "{rows} rows");
    &STATEMENTS[rows.ilog2() as usize]
}

/// The statement that writes `keys` counters back, bound as `$1, $2, …` in fours (principal,
/// capability, window start, calls).
fn write_counters(keys: usize) -> AssertSqlSafe<String> {
    // INVARIANT: as above, placeholders only.
    AssertSqlSafe(format!(
        "INSERT INTO usage_counters (principal_id, capability, window_start, calls) VALUES {} \
         ON CONFLICT (principal_id, capability) DO UPDATE SET \
             window_start = excluded.window_start, calls = excluded.calls",
        placeholders(keys, 4)
    ))
}

/// The most counters one statement reads or writes, and the most audit rows one statement
/// appends: 64 keys are 256 parameters, 64 rows 1,728, below SQLite's limit (32 766).
const COUNTER_CHUNK: usize = 64;

/// `items` in chunks whose sizes are powers of two up to [`COUNTER_CHUNK`]: 37 keys go as 32, 4
/// and 1. So the statements built for them come in seven sizes, and sqlx's cache of prepared
/// statements keeps them all.
fn chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        // The largest power of two not above what is left, at most a whole chunk.
        let (chunk, rest) = items.split_at(COUNTER_CHUNK.min(1 << items.len().ilog2()));
        items = rest;
        Some(chunk)
    })
}

/// `rows` tuples of `columns` numbered parameters: `($1, $2), ($3, $4)`.
fn placeholders(rows: usize, columns: usize) -> String {
    let tuples: Vec<String> = (0..rows)
        .map(|row| {
            let numbers: Vec<String> = (1..=columns)
                .map(|column| format!("${}", row * columns + column))
                .collect();
            format!("({})", numbers.join(", "))
        })
        .collect();
    tuples.join(", ")
}

/// `rows` tuples of `columns` anonymous parameters: `(?, ?), (?, ?)`, bound in order.
fn anonymous_placeholders(rows: usize, columns: usize) -> String {
    let tuple = format!("({})", vec!["?"; columns].join(", "));
    vec![tuple; rows].join(", ")
}

/// Whether SQLite refused the values it was sent, rather than failed: a
/// constraint (`SQLITE_CONSTRAINT` and its extended codes, a trigger's
/// `RAISE(ABORT, …)` among them), a value too big (`SQLITE_TOOBIG`) or of the
/// wrong type (`SQLITE_MISMATCH`). SQLite holds U+0000 in text, so a NUL is
/// not one of them. See [`StoreError::is_data_error`].
pub(super) fn refuses_data(error: &sqlx::Error) -> bool {
    const SQLITE_TOOBIG: i32 = 18;
    const SQLITE_CONSTRAINT: i32 = 19;
    const SQLITE_MISMATCH: i32 = 20;
    let Some(error) = error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<SqliteError>())
    else {
        return false;
    };
    // sqlx reports the extended result code; its low byte is the primary one.
    let primary = error
        .code()
        .and_then(|code| code.parse::<i32>().ok())
        .map(|code| code & 0xff);
    matches!(primary, Some(SQLITE_TOOBIG | SQLITE_CONSTRAINT | SQLITE_MISMATCH))
}

/// The active revision, read inside a `BEGIN IMMEDIATE` transaction (which
/// already holds the write lock).
async fn active_revision(connection: &mut SqliteConnection) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT revision FROM active_policy")
        .fetch_one(connection)
        .await
}

/// Records that `to` became active (from `from`), as part of `operation`'s transaction, and
/// retires the shadow version if it is `to`'s artifact and catalog (docs/decisions/0035).
async fn record_activation(
    connection: &mut SqliteConnection,
    by: &Actor,
    kind: ActivationKind,
    from: Option<u64>,
    to: u64,
    operation: &'static str,
) -> StoreResult<()> {
    sqlx::query(sql::INSERT_ACTIVATION)
        .bind(by.at_ms)
        .bind(&by.name)
        .bind(kind.as_str())
        .bind(
            from.map(|revision| sql::to_bigint(revision, "from_revision"))
                .transpose()?,
        )
        .bind(sql::to_bigint(to, "to_revision")?)
        .execute(&mut *connection)
        .await
        .during(operation)?;
    sqlx::query(sql::RETIRE_SHADOW)
        .bind(sql::to_bigint(to, "to_revision")?)
        .bind(by.at_ms)
        .bind(&by.name)
        .execute(connection)
        .await
        .during(operation)?;
    Ok(())
}

/// Points the active pointer at `revision`, as part of `operation`.
async fn point_active_at(
    connection: &mut SqliteConnection,
    revision: u64,
    operation: &'static str,
) -> StoreResult<()> {
    sqlx::query("UPDATE active_policy SET revision = $1")
        .bind(sql::to_bigint(revision, "revision")?)
        .execute(connection)
        .await
        .during(operation)?;
    Ok(())
}

impl Store for SqliteStore {
    async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.pool).await.map_err(StoreError::Migration)
    }

    async fn active_policy(&self) -> StoreResult<Option<StoredPolicy>> {
        sqlx::query_as::<_, PolicyRow>(
            "SELECT p.revision, p.version, p.artifact, p.catalog, p.author, p.comment, p.created_at \
             FROM active_policy a JOIN policy_versions p ON p.revision = a.revision",
        )
        .fetch_optional(&self.pool)
        .await
        .during("active_policy")?
        .map(PolicyRow::into_policy)
        .transpose()
    }

    async fn publish(&self, new: NewPolicy, expected: ExpectedRevision) -> StoreResult<PublishOutcome> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.during("publish")?;
        let active = match active_revision(&mut tx).await.during("publish")? {
            Some(revision) => Self::policy_in(&mut *tx, revision, "publish").await?,
            None => None,
        };
        let active_before = active.as_ref().map(|policy| policy.revision);
        match sql::plan_publish(active, &new, expected) {
            PublishPlan::Unchanged(active) => {
                tx.rollback().await.during("publish")?;
                Ok(PublishOutcome::Unchanged(active))
            }
            PublishPlan::Conflict { active } => {
                tx.rollback().await.during("publish")?;
                Ok(PublishOutcome::Conflict { active })
            }
            PublishPlan::Insert => {
                let NewPolicy {
                    version,
                    artifact,
                    catalog,
                    author,
                    comment,
                    created_at_ms,
                } = new;
                let stored = sqlx::query_as::<_, PolicyRow>(sql::INSERT_POLICY)
                    .bind(version)
                    .bind(artifact)
                    .bind(catalog)
                    .bind(author)
                    .bind(comment)
                    .bind(created_at_ms)
                    .fetch_one(&mut *tx)
                    .await
                    .during("publish")?
                    .into_policy()?;
                point_active_at(&mut tx, stored.revision, "publish").await?;
                let by = Actor {
                    name: stored.author.clone(),
                    at_ms: stored.created_at_ms,
                };
                record_activation(
                    &mut tx,
                    &by,
                    ActivationKind::Publish,
                    active_before,
                    stored.revision,
                    "publish",
                )
                .await?;
                tx.commit().await.during("publish")?;
                Ok(PublishOutcome::Activated(stored))
            }
        }
    }

    async fn activate(
        &self,
        revision: u64,
        expected: ExpectedRevision,
        by: &Actor,
    ) -> StoreResult<ActivateOutcome> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.during("activate")?;
        let active = active_revision(&mut tx)
            .await
            .during("activate")?
            .map(sql::to_revision)
            .transpose()?;
        let plan = sql::plan_activate(active, revision, expected);
        if let ActivatePlan::Conflict { active } = plan {
            tx.rollback().await.during("activate")?;
            return Ok(ActivateOutcome::Conflict { active });
        }
        let target = match i64::try_from(revision) {
            Ok(revision) => Self::policy_in(&mut *tx, revision, "activate").await?,
            Err(_) => None,
        };
        let Some(policy) = target else {
            tx.rollback().await.during("activate")?;
            return Ok(ActivateOutcome::NotFound);
        };
        if let ActivatePlan::Switch = plan {
            point_active_at(&mut tx, policy.revision, "activate").await?;
            record_activation(
                &mut tx,
                by,
                ActivationKind::Rollback,
                active,
                policy.revision,
                "activate",
            )
            .await?;
        }
        tx.commit().await.during("activate")?;
        Ok(ActivateOutcome::Activated(policy))
    }

    async fn activations(&self, limit: u32) -> StoreResult<Vec<Activation>> {
        sqlx::query_as::<_, ActivationRow>(sql::ACTIVATIONS)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .during("activations")?
            .into_iter()
            .map(ActivationRow::into_activation)
            .collect()
    }

    async fn policy(&self, revision: u64) -> StoreResult<Option<StoredPolicy>> {
        match i64::try_from(revision) {
            Ok(revision) => Self::policy_in(&self.pool, revision, "policy").await,
            Err(_) => Ok(None),
        }
    }

    async fn shadow_policy(&self) -> StoreResult<Option<Shadow>> {
        sqlx::query_as::<_, ShadowPolicyRow>(sql::SHADOW_POLICY)
            .fetch_optional(&self.pool)
            .await
            .during("shadow_policy")?
            .map(ShadowPolicyRow::into_shadow)
            .transpose()
    }

    async fn set_shadow(&self, revision: Option<u64>, by: &Actor) -> StoreResult<bool> {
        let _turn = self.write_turn().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .during("set_shadow")?;
        let revision = match revision {
            None => None,
            Some(revision) => match i64::try_from(revision) {
                Ok(revision) if Self::policy_in(&mut *tx, revision, "set_shadow").await?.is_some() => {
                    Some(revision)
                }
                _ => {
                    tx.rollback().await.during("set_shadow")?;
                    return Ok(false);
                }
            },
        };
        sqlx::query(sql::SET_SHADOW)
            .bind(revision)
            .bind(by.at_ms)
            .bind(&by.name)
            .execute(&mut *tx)
            .await
            .during("set_shadow")?;
        tx.commit().await.during("set_shadow")?;
        Ok(true)
    }

    async fn publish_shadow(&self, new: NewPolicy) -> StoreResult<StoredPolicy> {
        let _turn = self.write_turn().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .during("publish_shadow")?;
        let stored = sqlx::query_as::<_, PolicyRow>(sql::INSERT_POLICY)
            .bind(new.version)
            .bind(new.artifact)
            .bind(new.catalog)
            .bind(new.author)
            .bind(new.comment)
            .bind(new.created_at_ms)
            .fetch_one(&mut *tx)
            .await
            .during("publish_shadow")?
            .into_policy()?;
        sqlx::query(sql::SET_SHADOW)
            .bind(sql::to_bigint(stored.revision, "revision")?)
            .bind(stored.created_at_ms)
            .bind(&stored.author)
            .execute(&mut *tx)
            .await
            .during("publish_shadow")?;
        tx.commit().await.during("publish_shadow")?;
        Ok(stored)
    }

    async fn shadow_differences(&self, filter: &ShadowFilter) -> StoreResult<Vec<AuditRecord>> {
        sql::shadow_query::<Sqlite>(filter)
            .build_query_as::<ShadowRow>()
            .fetch_all(&self.pool)
            .await
            .during("shadow_differences")?
            .into_iter()
            .map(ShadowRow::into_record)
            .collect()
    }

    async fn shadow_counts(&self, filter: &ShadowFilter) -> StoreResult<Vec<ShadowCount>> {
        sql::shadow_counts_query::<Sqlite>(filter)
            .build_query_as::<ShadowCountRow>()
            .fetch_all(&self.pool)
            .await
            .during("shadow_counts")?
            .into_iter()
            .map(ShadowCountRow::into_count)
            .collect()
    }

    async fn prune_shadow(&self, before_ms: i64) -> StoreResult<u64> {
        let _turn = self.write_turn().await;
        let done = sqlx::query(sql::PRUNE_SHADOW)
            .bind(before_ms)
            .execute(&self.pool)
            .await
            .during("prune_shadow")?;
        Ok(done.rows_affected())
    }

    async fn list_policies(&self, limit: u32) -> StoreResult<Vec<StoredPolicy>> {
        sqlx::query_as::<_, PolicyRow>(
            "SELECT revision, version, artifact, catalog, author, comment, created_at \
             FROM policy_versions ORDER BY revision DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .during("list_policies")?
        .into_iter()
        .map(PolicyRow::into_policy)
        .collect()
    }

    async fn policy_changed(&self) -> StoreResult<()> {
        std::future::pending().await
    }

    async fn read_usage(&self, key: CounterKey<'_>) -> StoreResult<Option<CounterReading>> {
        sqlx::query_as::<_, CounterRow>(
            "SELECT calls, window_start FROM usage_counters WHERE principal_id = $1 AND capability = $2",
        )
        .bind(key.principal_id)
        .bind(key.capability)
        .fetch_optional(&self.pool)
        .await
        .during("read_usage")?
        .map(CounterRow::into_reading)
        .transpose()
    }

    async fn counters(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<StoredCounter>> {
        sqlx::query_as::<_, StoredCounterRow>(sql::COUNTERS)
            .bind(principal_id)
            .bind(capability)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .during("counters")?
            .into_iter()
            .map(StoredCounterRow::into_counter)
            .collect()
    }

    async fn reset_usage(&self, key: CounterKey<'_>, by: &Actor) -> StoreResult<Option<CounterReading>> {
        let _turn = self.write_turn().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .during("reset_usage")?;
        let Some(row) = sqlx::query_as::<_, CounterRow>(sql::DELETE_COUNTER)
            .bind(key.principal_id)
            .bind(key.capability)
            .fetch_optional(&mut *tx)
            .await
            .during("reset_usage")?
        else {
            tx.rollback().await.during("reset_usage")?;
            return Ok(None);
        };
        let reading = row.into_reading()?;
        sqlx::query(sql::INSERT_RESET)
            .bind(by.at_ms)
            .bind(&by.name)
            .bind(key.principal_id)
            .bind(key.capability)
            .bind(sql::to_bigint(reading.calls, "calls")?)
            .bind(reading.window_start_ms)
            .execute(&mut *tx)
            .await
            .during("reset_usage")?;
        tx.commit().await.during("reset_usage")?;
        Ok(Some(reading))
    }

    async fn usage_resets(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<UsageReset>> {
        sqlx::query_as::<_, ResetRow>(sql::RESETS)
            .bind(principal_id)
            .bind(capability)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .during("usage_resets")?
            .into_iter()
            .map(ResetRow::into_reset)
            .collect()
    }

    async fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> StoreResult<()> {
        if records.is_empty() && remembered.is_empty() {
            return Ok(());
        }
        let _turn = self.write_turn().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .during("append_audit")?;
        insert_audit(&mut tx, records, remembered, "append_audit").await?;
        tx.commit().await.during("append_audit")
    }

    async fn commit_batch(
        &self,
        asks: &[CounterAsk],
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        settle: Settle<'_>,
        gate: &CommitGate,
    ) -> StoreResult<Vec<Tally>> {
        // One writer at a time, and `BEGIN IMMEDIATE` takes the write lock
        // before anything is read: the counters cannot change between the
        // reads below and the writes.
        let _turn = self.write_turn().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .during("commit_batch")?;
        let tallies = count_in(&mut tx, asks).await.during(COUNT_USAGE)?;
        insert_audit(&mut tx, records, remembered, "commit_batch").await?;
        if !asks.is_empty() {
            let (settled, settled_remembered) = settle(&tallies);
            insert_audit(&mut tx, &settled, &settled_remembered, "commit_batch").await?;
        }
        if !gate.commit() {
            tx.rollback().await.during("commit_batch")?;
            return Err(StoreError::Abandoned);
        }
        tx.commit().await.during("commit_batch")?;
        Ok(tallies)
    }

    async fn remembered(&self, gateway: &str, request_id: &str) -> StoreResult<Option<Remembered>> {
        Ok(sqlx::query_as::<_, RememberedRow>(sql::REMEMBERED)
            .bind(gateway)
            .bind(request_id)
            .fetch_optional(&self.pool)
            .await
            .during("remembered")?
            .map(RememberedRow::into_remembered))
    }

    async fn claim_request(
        &self,
        gateway: &str,
        request_id: &str,
        fingerprint: &Fingerprint,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> StoreResult<Claim> {
        // A claim need not survive a crash: lost, a copy of the request decides again, as before
        // claims existed (docs/decisions/0016; PostgreSQL commits it without flushing its WAL).
        // So it goes through `claims`, whose commit appends to the log without syncing it; the
        // next audit commit's sync (FULL, every other connection) takes it to the disk too, since
        // the log is one file written in order. Same visibility to every other connection.
        let won = {
            let _turn = self.write_turn().await;
            sqlx::query(sql::claim_request!(""))
                .bind(gateway)
                .bind(request_id)
                .bind(now_ms)
                .bind(stale_before_ms)
                .bind(&fingerprint[..])
                .fetch_optional(&self.claims)
                .await
                .during("claim_request")?
        };
        let holder = async {
            sqlx::query_scalar::<_, Option<Vec<u8>>>(sql::CLAIM_FINGERPRINT)
                .bind(gateway)
                .bind(request_id)
                .fetch_optional(&self.pool)
                .await
                .during("claim_request")
        };
        sql::claimed(won.is_some(), self.remembered(gateway, request_id), holder).await
    }

    async fn request_key(&self, candidate: &[u8; 32]) -> StoreResult<[u8; 32]> {
        {
            let _turn = self.write_turn().await;
            sqlx::query("INSERT INTO request_key (id, key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING")
                .bind(&candidate[..])
                .execute(&self.pool)
                .await
                .during("request_key")?;
        }
        let stored: Vec<u8> = sqlx::query_scalar(sql::REQUEST_KEY)
            .fetch_one(&self.pool)
            .await
            .during("request_key")?;
        sql::request_key(stored)
    }

    async fn forget_requests(&self, before_ms: i64) -> StoreResult<u64> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool.begin().await.during("forget_requests")?;
        let answers = sqlx::query(sql::FORGET_ANSWERS)
            .bind(before_ms)
            .execute(&mut *tx)
            .await
            .during("forget_requests")?;
        let claims = sqlx::query(sql::FORGET_CLAIMS)
            .bind(before_ms)
            .execute(&mut *tx)
            .await
            .during("forget_requests")?;
        tx.commit().await.during("forget_requests")?;
        Ok(answers.rows_affected() + claims.rows_affected())
    }

    async fn query_audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        sql::audit_query::<Sqlite>(filter)
            .build_query_as::<AuditRow>()
            .fetch_all(&self.pool)
            .await
            .during("query_audit")?
            .into_iter()
            .map(AuditRow::into_record)
            .collect()
    }

    async fn audit_groups(&self, filter: &AuditFilter, keys: &[GroupKey]) -> StoreResult<Vec<AuditGroup>> {
        // SQLite compares text bytewise by default, as PostgreSQL's `COLLATE "C"` does.
        sql::audit_groups_query::<Sqlite>(filter, keys, "")
            .build()
            .fetch_all(&self.pool)
            .await
            .during("audit_groups")?
            .iter()
            .map(|row| sql::audit_group(row, keys.len()))
            .collect()
    }

    async fn note_decision(&self, note: &DecisionNote) -> StoreResult<bool> {
        let DecisionNote {
            decision_id,
            gateway,
            kind,
            detail,
            at_ms,
        } = note;
        let Some((from, until)) = sql::decided_around(decision_id) else {
            return Ok(false);
        };
        let found: i64 = sqlx::query_scalar(sql::NOTED_ALLOW)
            .bind(decision_id)
            .bind(gateway)
            .bind(from)
            .bind(until)
            .fetch_one(&self.pool)
            .await
            .during("note_decision")?;
        if found == 0 {
            return Ok(false);
        }
        let _turn = self.write_turn().await;
        sqlx::query(sql::INSERT_NOTE)
            .bind(decision_id)
            .bind(kind.as_str())
            .bind(at_ms)
            .bind(gateway)
            .bind(detail)
            .execute(&self.pool)
            .await
            .during("note_decision")?;
        Ok(true)
    }

    async fn correct_lost_answer(&self, lost: &LostAnswer) -> StoreResult<bool> {
        let Some((from, until)) = sql::decided_around(&lost.decision_id) else {
            return Ok(false);
        };
        let (outcome, code) = match &lost.received {
            Some((outcome, code)) => (outcome.as_str(), code.as_str()),
            None => ("", ""),
        };
        let _turn = self.write_turn().await;
        let inserted = sqlx::query(sql::INSERT_CORRECTION)
            .bind(&lost.decision_id)
            .bind(lost.at_ms)
            .bind(&lost.gateway)
            .bind(lost.detail())
            .bind(from)
            .bind(until)
            .bind(outcome)
            .bind(code)
            .execute(&self.pool)
            .await
            .during("correct_lost_answer")?;
        Ok(inserted.rows_affected() > 0)
    }

    async fn decision_notes(&self, decision_ids: &[String]) -> StoreResult<Vec<DecisionNote>> {
        if decision_ids.is_empty() {
            return Ok(Vec::new());
        }
        sql::notes_query::<Sqlite>(decision_ids)
            .build_query_as::<NoteRow>()
            .fetch_all(&self.pool)
            .await
            .during("decision_notes")?
            .into_iter()
            .map(NoteRow::into_note)
            .collect()
    }

    async fn prepare_audit_periods(&self, _now_ms: i64) -> StoreResult<()> {
        Ok(())
    }

    async fn prune_audit(&self, before_ms: i64, dry_run: bool) -> StoreResult<Vec<PrunedPeriod>> {
        let Some(cutoff) = retention::prune_cutoff(before_ms) else {
            return Ok(Vec::new());
        };
        // A dry run reads in one snapshot; a prune deletes period by period,
        // each in batches of their own transactions (see `delete_period`).
        let mut snapshot = if dry_run {
            Some(self.pool.begin().await.during("prune_audit")?)
        } else {
            None
        };
        let mut pruned = Vec::new();
        let mut from = i64::MIN;
        loop {
            // The oldest record left before the cutoff names the next period
            // that holds any (`audit_log_at` answers in one probe).
            let oldest_query = sqlx::query_scalar::<_, Option<i64>>(
                "SELECT min(at) FROM audit_log WHERE at >= $1 AND at < $2",
            )
            .bind(from)
            .bind(cutoff);
            let oldest = match &mut snapshot {
                Some(tx) => oldest_query.fetch_one(&mut **tx).await.during("prune_audit")?,
                None => oldest_query.fetch_one(&self.pool).await.during("prune_audit")?,
            };
            let Some(oldest) = oldest else { break };
            let period = Period::containing(oldest);
            // Always bounded: the record is before the cutoff, which starts a
            // period, so its period ends at or before the cutoff.
            let Some(until) = period.end_ms() else { break };
            let start = period.start_ms().unwrap_or(i64::MIN);
            let records = match &mut snapshot {
                Some(tx) => {
                    let counted: i64 =
                        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE at >= $1 AND at < $2")
                            .bind(start)
                            .bind(until)
                            .fetch_one(&mut **tx)
                            .await
                            .during("prune_audit")?;
                    u64::try_from(counted).unwrap_or(0)
                }
                None => self.delete_period(start, until).await?,
            };
            pruned.push(PrunedPeriod {
                name: period.name(),
                from_ms: period.start_ms(),
                until_ms: until,
                records,
            });
            from = until;
        }
        match snapshot {
            Some(tx) => tx.rollback().await.during("prune_audit")?,
            None => {
                if let Some(until) = pruned.iter().map(|period| period.until_ms).max() {
                    let _turn = self.write_turn().await;
                    sqlx::query(sql::FORGET_NOTES)
                        .bind(until)
                        .execute(&self.pool)
                        .await
                        .during("prune_audit")?;
                }
            }
        }
        Ok(pruned)
    }
}

impl SqliteStore {
    /// Deletes the records in `[start, until)`, oldest first, at most
    /// [`PRUNE_BATCH`] per transaction; returns how many it deleted. Each
    /// batch commits on its own, so an interrupted prune leaves everything
    /// before some instant deleted and everything after it whole — the next
    /// prune finishes the job.
    async fn delete_period(&self, start: i64, until: i64) -> StoreResult<u64> {
        let mut deleted = 0;
        loop {
            let _turn = self.write_turn().await;
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .during("prune_audit")?;
            let batch = sqlx::query(
                "DELETE FROM audit_log WHERE rowid IN \
                     (SELECT rowid FROM audit_log WHERE at >= $1 AND at < $2 ORDER BY at LIMIT $3)",
            )
            .bind(start)
            .bind(until)
            .bind(PRUNE_BATCH)
            .execute(&mut *tx)
            .await
            .during("prune_audit")?
            .rows_affected();
            tx.commit().await.during("prune_audit")?;
            deleted += batch;
            if batch < PRUNE_BATCH.unsigned_abs() {
                return Ok(deleted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_go_in_chunks_of_powers_of_two() {
        let sizes = |count: usize| -> Vec<(usize, usize)> {
            let items: Vec<usize> = (0..count).collect();
            chunks(&items).map(|chunk| (chunk[0], chunk.len())).collect()
        };
        assert_eq!(sizes(0), []);
        assert_eq!(sizes(1), [(0, 1)]);
        assert_eq!(sizes(37), [(0, 32), (32, 4), (36, 1)]);
        assert_eq!(sizes(64), [(0, 64)]);
        assert_eq!(sizes(200), [(0, 64), (64, 64), (128, 64), (192, 8)]);
        // Every item once, in order, whatever the count.
        for count in 0..300 {
            let items: Vec<usize> = (0..count).collect();
            let seen: Vec<usize> = chunks(&items).flatten().copied().collect();
            assert_eq!(seen, items);
        }
    }

    /// Audit commits sync the log (the durability invariant); claims, which may be lost, do not,
    /// and are still seen at once by every other connection.
    #[tokio::test]
    async fn only_claims_commit_without_syncing_the_log() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", directory.path().join("claims.db").display());
        let store = SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        async fn synchronous(pool: &SqlitePool) -> i64 {
            sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .expect("pragma")
        }
        // SQLite's codes: 1 NORMAL, 2 FULL.
        assert_eq!(synchronous(&store.pool).await, 2, "audit and counters");
        assert_eq!(synchronous(&store.claims).await, 1, "claims");

        let claim = store
            .claim_request("gw", "r-1", &[7; 32], 1_000, 0)
            .await
            .expect("claim");
        assert!(matches!(claim, Claim::Won), "{claim:?}");
        // Written on the claims connection (its one connection counts the row it changed)...
        let changed: i64 = sqlx::query_scalar("SELECT total_changes()")
            .fetch_one(&store.claims)
            .await
            .expect("total_changes");
        assert_eq!(changed, 1, "the claim went through the claims connection");
        // ...and seen at once on the others.
        let holder: Option<Vec<u8>> = sqlx::query_scalar(sql::CLAIM_FINGERPRINT)
            .bind("gw")
            .bind("r-1")
            .fetch_one(&store.pool)
            .await
            .expect("the claim, read on the audit pool");
        assert_eq!(holder.as_deref(), Some(&[7; 32][..]));
        let again = store
            .claim_request("gw", "r-1", &[7; 32], 1_001, 0)
            .await
            .expect("claim again");
        assert!(matches!(again, Claim::Taken { .. }), "{again:?}");
    }

    #[tokio::test]
    async fn counters_are_read_by_their_key() {
        let mut connection = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        MIGRATOR.run(&mut connection).await.expect("migrate");
        for keys in [1, 2, 64] {
            let AssertSqlSafe(statement) = read_counters(keys);
            let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(AssertSqlSafe(format!(
                "EXPLAIN QUERY PLAN {statement}"
            )));
            for n in 0..keys {
                query = query.bind(format!("p{n}")).bind("cap");
            }
            let plan: Vec<String> = query
                .fetch_all(&mut connection)
                .await
                .expect("plan")
                .into_iter()
                .map(|(_, _, _, detail)| detail)
                .collect();
            assert!(
                plan.iter()
                    .any(|step| step.starts_with("SEARCH c USING PRIMARY KEY")),
                "{keys} key(s): {plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.starts_with("SCAN c")),
                "{keys} key(s): {plan:?}"
            );
        }
    }

    /// The steps of SQLite's plan for the audit query of `filter`, on the migrated schema.
    async fn audit_plan(connection: &mut SqliteConnection, filter: &AuditFilter) -> Vec<String> {
        use sqlx::Execute;
        let mut built = sql::audit_query::<Sqlite>(filter);
        let mut query = built.build();
        let arguments = query.take_arguments().expect("arguments").expect("bound values");
        let text = format!("EXPLAIN QUERY PLAN {}", query.sql().as_str());
        sqlx::query_as_with::<_, (i64, i64, i64, String), _>(AssertSqlSafe(text), arguments)
            .fetch_all(connection)
            .await
            .expect("plan")
            .into_iter()
            .map(|(_, _, _, detail)| detail)
            .collect()
    }

    /// The outcome and code indexes leave allows out (migration 0011), and SQLite uses such an index
    /// only when the query states its condition: a search for denials or for a code other than
    /// `granted` goes through them, one for allows does not (it cannot).
    #[tokio::test]
    async fn audit_queries_use_the_partial_indexes() {
        let mut connection = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        MIGRATOR.run(&mut connection).await.expect("migrate");
        let filter = |outcome: Option<&str>, code: Option<&str>| AuditFilter {
            outcome: outcome.map(str::to_owned),
            code: code.map(str::to_owned),
            since_ms: Some(0),
            limit: 50,
            ..AuditFilter::default()
        };
        for (outcome, code, index) in [
            (Some("deny"), None, "audit_log_outcome_at"),
            (Some("request_id_reused"), None, "audit_log_outcome_at"),
            (None, Some("limit_exhausted"), "audit_log_code_at"),
            (None, Some("no_grant_matches"), "audit_log_code_at"),
        ] {
            let plan = audit_plan(&mut connection, &filter(outcome, code)).await;
            assert!(
                plan.iter()
                    .any(|step| step.starts_with(&format!("SEARCH audit_log USING INDEX {index} ("))),
                "{outcome:?} {code:?}: {plan:?}"
            );
        }
        for (outcome, code) in [(Some("allow"), None), (None, Some("granted"))] {
            let plan = audit_plan(&mut connection, &filter(outcome, code)).await;
            assert!(
                !plan
                    .iter()
                    .any(|step| step.contains("_outcome_at") || step.contains("_code_at")),
                "{outcome:?} {code:?}: {plan:?}"
            );
        }
    }

    #[test]
    fn placeholders_are_numbered_row_by_row() {
        assert_eq!(placeholders(1, 2), "($1, $2)");
        assert_eq!(placeholders(2, 4), "($1, $2, $3, $4), ($5, $6, $7, $8)");
    }
}
