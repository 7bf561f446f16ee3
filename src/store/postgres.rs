//! The PostgreSQL store: production, and every deployment with more than one
//! replica (docs/service.md).
//!
//! Replicas share nothing but this database, so every rule that must hold
//! across them is enforced here, by the database: the active pointer is one
//! row that every change locks (`SELECT … FOR UPDATE`), a counter is consumed
//! by one conditional upsert, and replicas learn of a new active version
//! through `NOTIFY capgate_policy`, sent inside the transaction that changed
//! it (so it is delivered exactly when the change commits).
//!
//! `audit_log` is partitioned by month of `at` (migration 0002,
//! docs/decisions/0009-audit-partitioning.md). The server creates the coming
//! months' partitions ahead of time; an insert that still finds none creates
//! the missing ones and is retried, so no record is refused for want of a
//! partition. Retention drops whole partitions.
//!
//! Behind a pooler that lends server sessions per transaction (`pooler=transaction` in the URL,
//! [`url`]), nothing may outlive a transaction: every statement runs unnamed inside an explicit
//! transaction, no session setting is made, policy changes are polled for instead of listened
//! to, and migrations are only checked
//! (docs/decisions/0033-behind-a-pooler-and-a-failover.md).

mod url;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgDatabaseError, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, Postgres, Row, Transaction};
use tokio::sync::Mutex;

use super::counting::{self, COUNT_USAGE};
use super::retention::{self, Period, RangeBounds};
use super::sql::{
    self, ActivatePlan, ActivationRow, AuditRow, AuditValues, CounterRow, During, NoteRow, PolicyRow,
    PublishPlan, RememberedRow, ResetRow, ShadowColumns, ShadowCountRow, ShadowPolicyRow, ShadowRow,
    StoredCounterRow,
};
use super::{
    ActivateOutcome, Activation, ActivationKind, Actor, AuditFilter, AuditGroup, AuditRecord, Claim,
    CommitGate, CounterAsk, CounterKey, CounterReading, DecisionNote, ExpectedRevision, Fingerprint,
    GroupKey, LostAnswer, NewPolicy, PrunedPeriod, PublishOutcome, Remembered, RememberedEntry, Settle,
    Shadow, ShadowCount, ShadowFilter, Store, StoreError, StoreOptions, StoreResult, StoredCounter,
    StoredPolicy, Tally, UsageReset,
};

pub use url::{Pooling, SessionAttrs, UrlProblem};

static MIGRATOR: Migrator = sqlx::migrate!("migrations/postgres");

/// The channel replicas listen on; the payload is the new active revision.
pub const POLICY_CHANNEL: &str = "capgate_policy";

/// Enough for a 2-core box: decisions hold a connection for one short
/// statement at a time, and audit writes are batched by the server.
const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// The advisory lock that serialises the creation of audit partitions
/// across replicas (`"capgate" 0x01`).
const PARTITION_LOCK: i64 = 0x6361_7067_6174_6501;

/// The advisory lock one prune holds, so that two prunes do not race to drop
/// the same partitions (`"capgate" 0x02`).
const PRUNE_LOCK: i64 = 0x6361_7067_6174_6502;

/// How long a prune waits for a lock before giving up and trying again.
/// Dropping a partition needs `audit_log` to itself for an instant, and
/// every writer that arrives while the drop waits queues behind it: the
/// bound keeps that queue well under the server's `--audit-timeout` (1 s).
const PRUNE_LOCK_TIMEOUT: Duration = Duration::from_millis(300);

/// How many times a prune tries before it reports that the table is busy.
const PRUNE_ATTEMPTS: u32 = 5;

/// A pool on one PostgreSQL database, and the notification subscription its
/// clones share.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The options without the pool's per-connection settings: migrations run
    /// on a connection of their own, free of `statement_timeout`.
    options: Arc<PgConnectOptions>,
    /// How the connections reach PostgreSQL's sessions.
    pooling: Pooling,
    /// Whether statements are prepared once per connection and kept (sqlx's
    /// `persistent`): not when the server session changes between transactions.
    persistent: bool,
    session_attrs: SessionAttrs,
    subscription: Arc<Mutex<Subscription>>,
}

/// The `LISTEN` side: a pool of one connection, opened only when the server
/// first asks, and the listener on it (`None` before that and after a loss).
struct Subscription {
    pool: PgPool,
    listener: Option<PgListener>,
}

impl PostgresStore {
    /// Opens a pool on `url` (`postgres://…`, with capgate's own parameters
    /// `pooler` and `target_session_attrs`, [`url`]). Errors may quote sqlx's
    /// message but never the URL, except the URL's own refusal, which holds it
    /// redacted; [`super::connect`] adds the redacted URL to the others.
    pub async fn connect(url: &str, options: &StoreOptions) -> StoreResult<Self> {
        let parsed = url::parse(url).map_err(|problem| StoreError::UnsupportedUrlSetting {
            url: super::redact(url),
            problem,
        })?;
        let connect_options = PgConnectOptions::from_str(&parsed.for_sqlx).during("connect")?;
        Self::connect_through(connect_options, parsed.pooling, parsed.session_attrs, options).await
    }

    /// Opens a pool with explicit connection options, straight to a server
    /// that takes writes (the tests use this to point at a fresh database).
    pub async fn connect_with(
        connect_options: PgConnectOptions,
        options: &StoreOptions,
    ) -> StoreResult<Self> {
        Self::connect_through(connect_options, Pooling::Session, SessionAttrs::Any, options).await
    }

    /// Opens a pool with explicit connection options, through `pooling`, on a
    /// server `session_attrs` accepts.
    pub async fn connect_through(
        connect_options: PgConnectOptions,
        pooling: Pooling,
        session_attrs: SessionAttrs,
        options: &StoreOptions,
    ) -> StoreResult<Self> {
        // sqlx asks for `extra_float_digits` at startup, a parameter PgBouncer
        // refuses unless told to ignore it; capgate stores no floating-point
        // value, and PostgreSQL 12 and later print floats exactly by default.
        let connect_options = connect_options.extra_float_digits(None);
        // One plain connection first: a wrong host, database or password
        // then fails at once with its cause, where the pool would retry
        // until `acquire_timeout` and report only that it timed out. A
        // server of the wrong kind fails here too.
        let mut first = PgConnection::connect_with(&connect_options)
            .await
            .during("connect")?;
        if let Some(found) = wrong_server(&mut first, session_attrs).await.during("connect")? {
            let _ = first.close().await;
            return Err(StoreError::WrongServer {
                address: format!("{}:{}", connect_options.get_host(), connect_options.get_port()),
                found,
                wanted: session_attrs.as_str(),
            });
        }
        first.close().await.during("connect")?;
        // Through a transaction pooler a session setting would stay with
        // whichever server session ran it, for other clients to inherit: the
        // statement timeout is then the role's (docs/operations.md).
        let statement_timeout = options
            .statement_timeout
            .filter(|_| pooling == Pooling::Session)
            .map(|timeout| timeout.as_millis().to_string());
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS))
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |connection, _metadata| {
                let statement_timeout = statement_timeout.clone();
                Box::pin(async move {
                    // A connection opened after a failover may reach a server
                    // that is now a standby: refused, the operation fails and
                    // the next one connects again.
                    refuse_wrong_server(connection, session_attrs).await?;
                    // `set_config` rather than a startup parameter, which
                    // connection poolers such as PgBouncer may refuse.
                    if let Some(milliseconds) = statement_timeout {
                        sqlx::query("SELECT set_config('statement_timeout', $1, false)")
                            .bind(milliseconds)
                            .execute(connection)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(connect_options.clone());
        // A notification connection idles for as long as the server runs, so
        // it neither expires nor is reaped.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .after_connect(move |connection, _metadata| {
                Box::pin(async move { refuse_wrong_server(connection, session_attrs).await })
            })
            .connect_lazy_with(connect_options.clone());
        Ok(PostgresStore {
            pool,
            options: Arc::new(connect_options),
            pooling,
            persistent: pooling == Pooling::Session,
            session_attrs,
            subscription: Arc::new(Mutex::new(Subscription {
                pool: listen_pool,
                listener: None,
            })),
        })
    }

    /// A connection for one operation that takes no transaction of its own.
    async fn session(&self) -> Result<Session, sqlx::Error> {
        Ok(match self.pooling {
            Pooling::Session => Session::Own(self.pool.acquire().await?),
            Pooling::Transaction => Session::Lent(self.pool.begin().await?),
        })
    }

    /// Through a transaction pooler, where migrations cannot run: whether the
    /// schema is this build's, every migration applied and none changed.
    async fn check_schema(&self) -> StoreResult<()> {
        let mut session = self.session().await.during("migrate")?;
        let applied: Vec<(i64, Vec<u8>)> = match sqlx::query_as(
            "SELECT version, checksum FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .persistent(false)
        .fetch_all(&mut *session)
        .await
        {
            Ok(applied) => {
                session.end().await.during("migrate")?;
                applied
            }
            // A database nothing has migrated yet.
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|error| error.code())
                    .as_deref()
                    == Some("42P01") =>
            {
                Vec::new()
            }
            Err(error) => return Err(StoreError::database("migrate", error)),
        };
        let known: Vec<_> = MIGRATOR
            .iter()
            .filter(|migration| !migration.migration_type.is_down_migration())
            .collect();
        let pending = known
            .iter()
            .filter(|migration| !applied.iter().any(|(version, _)| *version == migration.version))
            .map(|migration| migration.version.to_string())
            .collect::<Vec<_>>();
        let changed = known
            .iter()
            .filter(|migration| {
                applied.iter().any(|(version, checksum)| {
                    *version == migration.version && checksum[..] != migration.checksum[..]
                })
            })
            .map(|migration| migration.version.to_string())
            .collect::<Vec<_>>();
        let unknown = applied
            .iter()
            .filter(|(version, _)| !known.iter().any(|migration| migration.version == *version))
            .map(|(version, _)| version.to_string())
            .collect::<Vec<_>>();
        let mut problems = Vec::new();
        for (what, versions) in [
            ("not applied", pending),
            ("changed since applied", changed),
            ("applied but unknown to this build", unknown),
        ] {
            if !versions.is_empty() {
                problems.push(format!("migrations {} {what}", versions.join(", ")));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::SchemaNotCurrent {
                detail: problems.join("; "),
            })
        }
    }

    /// The policy at `revision`, read as part of `operation`.
    async fn policy_in(
        executor: impl Executor<'_, Database = Postgres>,
        revision: i64,
        operation: &'static str,
        persistent: bool,
    ) -> StoreResult<Option<StoredPolicy>> {
        sqlx::query_as::<_, PolicyRow>(
            "SELECT revision, version, artifact, catalog, author, comment, created_at \
             FROM policy_versions WHERE revision = $1",
        )
        .bind(revision)
        .persistent(persistent)
        .fetch_optional(executor)
        .await
        .during(operation)?
        .map(PolicyRow::into_policy)
        .transpose()
    }
}

/// A connection for one operation that takes no transaction of its own: the
/// pool's connection, or, through a transaction pooler, a transaction around
/// the operation. There the server session is this client's only from `BEGIN`
/// to `COMMIT`, and sqlx sends a statement in two exchanges (parse, then bind
/// and execute) that must reach the same server session.
enum Session {
    Own(PoolConnection<Postgres>),
    Lent(Transaction<'static, Postgres>),
}

impl Session {
    /// Ends the operation: commits the transaction around it, if any.
    async fn end(self) -> Result<(), sqlx::Error> {
        match self {
            Session::Own(_) => Ok(()),
            Session::Lent(transaction) => transaction.commit().await,
        }
    }
}

impl Deref for Session {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Session::Own(connection) => connection,
            Session::Lent(transaction) => transaction,
        }
    }
}

impl DerefMut for Session {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Session::Own(connection) => connection,
            Session::Lent(transaction) => transaction,
        }
    }
}

/// What makes the server `connection` reached unfit for `wanted`, if anything.
async fn wrong_server(
    connection: &mut PgConnection,
    wanted: SessionAttrs,
) -> Result<Option<&'static str>, sqlx::Error> {
    if wanted == SessionAttrs::Any {
        return Ok(None);
    }
    // The simple protocol: one exchange, which any pooler carries, and nothing prepared.
    let row = sqlx::raw_sql("SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')")
        .fetch_one(connection)
        .await?;
    let in_recovery = row.try_get::<String, _>(0)? == "true";
    let read_only = row.try_get::<String, _>(1)? == "on";
    Ok(match wanted {
        _ if in_recovery => Some("is a standby (in recovery)"),
        SessionAttrs::ReadWrite if read_only => Some("is read-only (`transaction_read_only` is on)"),
        _ => None,
    })
}

/// Refuses a pooled connection that reached a server unfit for `wanted`.
async fn refuse_wrong_server(connection: &mut PgConnection, wanted: SessionAttrs) -> Result<(), sqlx::Error> {
    match wrong_server(connection, wanted).await? {
        None => Ok(()),
        Some(found) => Err(sqlx::Error::Configuration(
            format!(
                "the server {found}, and the URL asks for `target_session_attrs={}`",
                wanted.as_str()
            )
            .into(),
        )),
    }
}

/// Tells every listening replica, once the surrounding transaction commits.
async fn notify(connection: &mut PgConnection, revision: u64, persistent: bool) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(POLICY_CHANNEL)
        .bind(revision.to_string())
        .persistent(persistent)
        .execute(connection)
        .await?;
    Ok(())
}

/// Records that `to` became active (from `from`), as part of `operation`'s transaction, and
/// retires the shadow version if it is `to`'s artifact and catalog (docs/decisions/0035).
async fn record_activation(
    connection: &mut PgConnection,
    by: &Actor,
    kind: ActivationKind,
    from: Option<u64>,
    to: u64,
    operation: &'static str,
    persistent: bool,
) -> StoreResult<()> {
    sqlx::query(sql::INSERT_ACTIVATION)
        .persistent(persistent)
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
        .persistent(persistent)
        .bind(sql::to_bigint(to, "to_revision")?)
        .bind(by.at_ms)
        .bind(&by.name)
        .execute(connection)
        .await
        .during(operation)?;
    Ok(())
}

/// Locks the active pointer until the transaction ends; every change of the
/// active version takes this lock first, so changes are serialised across
/// replicas and a compare-and-set sees the latest committed state.
async fn lock_active(connection: &mut PgConnection, persistent: bool) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT revision FROM active_policy FOR UPDATE")
        .persistent(persistent)
        .fetch_one(connection)
        .await
}

impl Store for PostgresStore {
    async fn migrate(&self) -> StoreResult<()> {
        if self.pooling == Pooling::Transaction {
            return self.check_schema().await;
        }
        // A pool of one, on the options without `statement_timeout`: a
        // migration may legitimately run long. The migrator takes an advisory
        // lock, so replicas starting together apply each migration once.
        let session_attrs = self.session_attrs;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .after_connect(move |connection, _metadata| {
                Box::pin(async move { refuse_wrong_server(connection, session_attrs).await })
            })
            .connect_with((*self.options).clone())
            .await
            .during("migrate")?;
        let migrated = MIGRATOR.run(&pool).await;
        pool.close().await;
        migrated.map_err(StoreError::Migration)
    }

    async fn active_policy(&self) -> StoreResult<Option<StoredPolicy>> {
        let mut session = self.session().await.during("active_policy")?;
        let active = sqlx::query_as::<_, PolicyRow>(
            "SELECT p.revision, p.version, p.artifact, p.catalog, p.author, p.comment, p.created_at \
             FROM active_policy a JOIN policy_versions p ON p.revision = a.revision",
        )
        .persistent(self.persistent)
        .fetch_optional(&mut *session)
        .await
        .during("active_policy")?;
        session.end().await.during("active_policy")?;
        active.map(PolicyRow::into_policy).transpose()
    }

    async fn publish(&self, new: NewPolicy, expected: ExpectedRevision) -> StoreResult<PublishOutcome> {
        let mut tx = self.pool.begin().await.during("publish")?;
        let active = match lock_active(&mut tx, self.persistent).await.during("publish")? {
            Some(revision) => Self::policy_in(&mut *tx, revision, "publish", self.persistent).await?,
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
                    .persistent(self.persistent)
                    .fetch_one(&mut *tx)
                    .await
                    .during("publish")?
                    .into_policy()?;
                sqlx::query("UPDATE active_policy SET revision = $1")
                    .bind(sql::to_bigint(stored.revision, "revision")?)
                    .persistent(self.persistent)
                    .execute(&mut *tx)
                    .await
                    .during("publish")?;
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
                    self.persistent,
                )
                .await?;
                notify(&mut tx, stored.revision, self.persistent)
                    .await
                    .during("publish")?;
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
        let mut tx = self.pool.begin().await.during("activate")?;
        let active = lock_active(&mut tx, self.persistent)
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
            Ok(revision) => Self::policy_in(&mut *tx, revision, "activate", self.persistent).await?,
            Err(_) => None,
        };
        let Some(policy) = target else {
            tx.rollback().await.during("activate")?;
            return Ok(ActivateOutcome::NotFound);
        };
        if let ActivatePlan::Switch = plan {
            sqlx::query("UPDATE active_policy SET revision = $1")
                .bind(sql::to_bigint(policy.revision, "revision")?)
                .persistent(self.persistent)
                .execute(&mut *tx)
                .await
                .during("activate")?;
            record_activation(
                &mut tx,
                by,
                ActivationKind::Rollback,
                active,
                policy.revision,
                "activate",
                self.persistent,
            )
            .await?;
            notify(&mut tx, policy.revision, self.persistent)
                .await
                .during("activate")?;
        }
        tx.commit().await.during("activate")?;
        Ok(ActivateOutcome::Activated(policy))
    }

    async fn activations(&self, limit: u32) -> StoreResult<Vec<Activation>> {
        let mut session = self.session().await.during("activations")?;
        let rows = sqlx::query_as::<_, ActivationRow>(sql::ACTIVATIONS)
            .bind(i64::from(limit))
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("activations")?;
        session.end().await.during("activations")?;
        rows.into_iter().map(ActivationRow::into_activation).collect()
    }

    async fn policy(&self, revision: u64) -> StoreResult<Option<StoredPolicy>> {
        match i64::try_from(revision) {
            Ok(revision) => {
                let mut session = self.session().await.during("policy")?;
                let policy = Self::policy_in(&mut *session, revision, "policy", self.persistent).await?;
                session.end().await.during("policy")?;
                Ok(policy)
            }
            Err(_) => Ok(None),
        }
    }

    async fn shadow_policy(&self) -> StoreResult<Option<Shadow>> {
        let mut session = self.session().await.during("shadow_policy")?;
        let shadow = sqlx::query_as::<_, ShadowPolicyRow>(sql::SHADOW_POLICY)
            .persistent(self.persistent)
            .fetch_optional(&mut *session)
            .await
            .during("shadow_policy")?;
        session.end().await.during("shadow_policy")?;
        shadow.map(ShadowPolicyRow::into_shadow).transpose()
    }

    async fn set_shadow(&self, revision: Option<u64>, by: &Actor) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await.during("set_shadow")?;
        // Serialised with publishes and activations, which lock the same row first.
        let active = lock_active(&mut tx, self.persistent).await.during("set_shadow")?;
        let revision = match revision {
            None => None,
            Some(revision) => match i64::try_from(revision) {
                Ok(revision)
                    if Self::policy_in(&mut *tx, revision, "set_shadow", self.persistent)
                        .await?
                        .is_some() =>
                {
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
            .persistent(self.persistent)
            .execute(&mut *tx)
            .await
            .during("set_shadow")?;
        // Replicas re-read both pointers on any notification; the payload names the active one.
        notify(&mut tx, active.map_or(Ok(0), sql::to_revision)?, self.persistent)
            .await
            .during("set_shadow")?;
        tx.commit().await.during("set_shadow")?;
        Ok(true)
    }

    async fn publish_shadow(&self, new: NewPolicy) -> StoreResult<StoredPolicy> {
        let mut tx = self.pool.begin().await.during("publish_shadow")?;
        let active = lock_active(&mut tx, self.persistent)
            .await
            .during("publish_shadow")?;
        let stored = sqlx::query_as::<_, PolicyRow>(sql::INSERT_POLICY)
            .bind(new.version)
            .bind(new.artifact)
            .bind(new.catalog)
            .bind(new.author)
            .bind(new.comment)
            .bind(new.created_at_ms)
            .persistent(self.persistent)
            .fetch_one(&mut *tx)
            .await
            .during("publish_shadow")?
            .into_policy()?;
        sqlx::query(sql::SET_SHADOW)
            .bind(sql::to_bigint(stored.revision, "revision")?)
            .bind(stored.created_at_ms)
            .bind(&stored.author)
            .persistent(self.persistent)
            .execute(&mut *tx)
            .await
            .during("publish_shadow")?;
        notify(&mut tx, active.map_or(Ok(0), sql::to_revision)?, self.persistent)
            .await
            .during("publish_shadow")?;
        tx.commit().await.during("publish_shadow")?;
        Ok(stored)
    }

    async fn shadow_differences(&self, filter: &ShadowFilter) -> StoreResult<Vec<AuditRecord>> {
        let mut session = self.session().await.during("shadow_differences")?;
        let rows = sql::shadow_query::<Postgres>(filter)
            .build_query_as::<ShadowRow>()
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("shadow_differences")?;
        session.end().await.during("shadow_differences")?;
        rows.into_iter().map(ShadowRow::into_record).collect()
    }

    async fn shadow_counts(&self, filter: &ShadowFilter) -> StoreResult<Vec<ShadowCount>> {
        let mut session = self.session().await.during("shadow_counts")?;
        let rows = sql::shadow_counts_query::<Postgres>(filter)
            .build_query_as::<ShadowCountRow>()
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("shadow_counts")?;
        session.end().await.during("shadow_counts")?;
        rows.into_iter().map(ShadowCountRow::into_count).collect()
    }

    async fn prune_shadow(&self, before_ms: i64) -> StoreResult<u64> {
        let mut session = self.session().await.during("prune_shadow")?;
        let done = sqlx::query(sql::PRUNE_SHADOW)
            .bind(before_ms)
            .persistent(self.persistent)
            .execute(&mut *session)
            .await
            .during("prune_shadow")?;
        session.end().await.during("prune_shadow")?;
        Ok(done.rows_affected())
    }

    async fn list_policies(&self, limit: u32) -> StoreResult<Vec<StoredPolicy>> {
        let mut session = self.session().await.during("list_policies")?;
        let rows = sqlx::query_as::<_, PolicyRow>(
            "SELECT revision, version, artifact, catalog, author, comment, created_at \
             FROM policy_versions ORDER BY revision DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .persistent(self.persistent)
        .fetch_all(&mut *session)
        .await
        .during("list_policies")?;
        session.end().await.during("list_policies")?;
        rows.into_iter().map(PolicyRow::into_policy).collect()
    }

    async fn policy_changed(&self) -> StoreResult<()> {
        if self.pooling == Pooling::Transaction {
            // A `LISTEN` holds its server session, which a transaction pooler
            // lends to another client once the statement is done: the server
            // learns of changes by polling alone, as on SQLite.
            return std::future::pending().await;
        }
        let mut subscription = self.subscription.lock().await;
        let Subscription { pool, listener } = &mut *subscription;
        let Some(active) = listener else {
            let mut fresh = PgListener::connect_with(pool).await.during("policy_changed")?;
            // Reconnecting quietly would lose what was sent in between;
            // reporting the loss lets the server read the active version
            // again, and the next call subscribes again.
            fresh.eager_reconnect(false);
            fresh.listen(POLICY_CHANNEL).await.during("policy_changed")?;
            *listener = Some(fresh);
            // Anything may have changed before the subscription existed.
            return Ok(());
        };
        match active.try_recv().await {
            Ok(Some(_notification)) => Ok(()),
            Ok(None) => {
                *listener = None;
                Err(StoreError::NotificationsLost)
            }
            Err(error) => {
                *listener = None;
                Err(StoreError::database("policy_changed", error))
            }
        }
    }

    async fn read_usage(&self, key: CounterKey<'_>) -> StoreResult<Option<CounterReading>> {
        let mut session = self.session().await.during("read_usage")?;
        let row = sqlx::query_as::<_, CounterRow>(
            "SELECT calls, window_start FROM usage_counters WHERE principal_id = $1 AND capability = $2",
        )
        .bind(key.principal_id)
        .bind(key.capability)
        .persistent(self.persistent)
        .fetch_optional(&mut *session)
        .await
        .during("read_usage")?;
        session.end().await.during("read_usage")?;
        row.map(CounterRow::into_reading).transpose()
    }

    async fn counters(
        &self,
        principal_id: &str,
        capability: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<StoredCounter>> {
        let mut session = self.session().await.during("counters")?;
        let rows = sqlx::query_as::<_, StoredCounterRow>(sql::COUNTERS)
            .bind(principal_id)
            .bind(capability)
            .bind(i64::from(limit))
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("counters")?;
        session.end().await.during("counters")?;
        rows.into_iter().map(StoredCounterRow::into_counter).collect()
    }

    async fn reset_usage(&self, key: CounterKey<'_>, by: &Actor) -> StoreResult<Option<CounterReading>> {
        // The delete locks the row, so a consumption waits for the reset and then opens a fresh
        // window; the reset's record commits with it.
        let mut tx = self.pool.begin().await.during("reset_usage")?;
        let Some(row) = sqlx::query_as::<_, CounterRow>(sql::DELETE_COUNTER)
            .bind(key.principal_id)
            .bind(key.capability)
            .persistent(self.persistent)
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
            .persistent(self.persistent)
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
        let mut session = self.session().await.during("usage_resets")?;
        let rows = sqlx::query_as::<_, ResetRow>(sql::RESETS)
            .bind(principal_id)
            .bind(capability)
            .bind(i64::from(limit))
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("usage_resets")?;
        session.end().await.during("usage_resets")?;
        rows.into_iter().map(ResetRow::into_reset).collect()
    }

    async fn commit_batch(
        &self,
        asks: &[CounterAsk],
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        settle: Settle<'_>,
        gate: &CommitGate,
    ) -> StoreResult<Vec<Tally>> {
        match self
            .try_commit_batch(asks, records, remembered, settle, gate)
            .await
        {
            // As in `append_audit`: create the partitions the batch needs, then once more.
            Err(StoreError::Database { source, .. }) if lacks_partition(&source) => {
                let periods = records
                    .iter()
                    .map(|record| record.at_ms)
                    .chain(asks.iter().map(|ask| ask.at_ms))
                    .map(Period::containing)
                    .collect();
                self.create_partitions(&periods).await.during("commit_batch")?;
                self.try_commit_batch(asks, records, remembered, settle, gate)
                    .await
            }
            committed => committed,
        }
    }

    async fn append_audit(
        &self,
        records: &[AuditRecord],
        remembered: &[(String, String, Remembered)],
    ) -> StoreResult<()> {
        if records.is_empty() && remembered.is_empty() {
            return Ok(());
        }
        match self.append_in_one_transaction(records, remembered).await {
            // A record whose month has no partition (a replay of old records,
            // a clock far off, a database no server prepared): create the
            // partitions the batch needs and try once more. Only then, so the
            // usual batch pays nothing for it. Once, whoever created them:
            // another replica may have been first, and a second failure is
            // reported as it is.
            Err(StoreError::Database { source, .. }) if lacks_partition(&source) => {
                let periods = records
                    .iter()
                    .map(|record| Period::containing(record.at_ms))
                    .collect();
                self.create_partitions(&periods).await.during("append_audit")?;
                self.append_in_one_transaction(records, remembered).await
            }
            inserted => inserted,
        }
    }

    async fn remembered(&self, gateway: &str, request_id: &str) -> StoreResult<Option<Remembered>> {
        let mut session = self.session().await.during("remembered")?;
        let row = sqlx::query_as::<_, RememberedRow>(sql::REMEMBERED)
            .bind(gateway)
            .bind(request_id)
            .persistent(self.persistent)
            .fetch_optional(&mut *session)
            .await
            .during("remembered")?;
        session.end().await.during("remembered")?;
        Ok(row.map(RememberedRow::into_remembered))
    }

    async fn claim_request(
        &self,
        gateway: &str,
        request_id: &str,
        fingerprint: &Fingerprint,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> StoreResult<Claim> {
        // A claim need not survive a crash of the database: lost, a copy of the request decides
        // again, as it did before claims existed. So its commit does not wait for the WAL to reach
        // the disk — `set_config(…, true)` holds for the statement's own implicit transaction, in
        // the same round trip — and a claim costs a round trip instead of a disk flush (one flush
        // per call was 4x slower at 16 callers). It is visible to other sessions at once either way.
        // Through a transaction pooler the statement has a transaction of its own, and the setting
        // holds for that one.
        let mut session = self.session().await.during("claim_request")?;
        let won = sqlx::query(sql::claim_request!(
            "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed"
        ))
        .bind(gateway)
        .bind(request_id)
        .bind(now_ms)
        .bind(stale_before_ms)
        .bind(&fingerprint[..])
        .persistent(self.persistent)
        .fetch_optional(&mut *session)
        .await
        .during("claim_request")?;
        session.end().await.during("claim_request")?;
        let holder = async {
            let mut session = self.session().await.during("claim_request")?;
            let holder = sqlx::query_scalar::<_, Option<Vec<u8>>>(sql::CLAIM_FINGERPRINT)
                .bind(gateway)
                .bind(request_id)
                .persistent(self.persistent)
                .fetch_optional(&mut *session)
                .await
                .during("claim_request")?;
            session.end().await.during("claim_request")?;
            Ok(holder)
        };
        sql::claimed(won.is_some(), self.remembered(gateway, request_id), holder).await
    }

    async fn request_key(&self, candidate: &[u8; 32]) -> StoreResult<[u8; 32]> {
        let mut session = self.session().await.during("request_key")?;
        sqlx::query("INSERT INTO request_key (id, key) VALUES (TRUE, $1) ON CONFLICT (id) DO NOTHING")
            .bind(&candidate[..])
            .persistent(self.persistent)
            .execute(&mut *session)
            .await
            .during("request_key")?;
        let stored: Vec<u8> = sqlx::query_scalar(sql::REQUEST_KEY)
            .persistent(self.persistent)
            .fetch_one(&mut *session)
            .await
            .during("request_key")?;
        session.end().await.during("request_key")?;
        sql::request_key(stored)
    }

    async fn forget_requests(&self, before_ms: i64) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await.during("forget_requests")?;
        let answers = sqlx::query(sql::FORGET_ANSWERS)
            .bind(before_ms)
            .persistent(self.persistent)
            .execute(&mut *tx)
            .await
            .during("forget_requests")?;
        let claims = sqlx::query(sql::FORGET_CLAIMS)
            .bind(before_ms)
            .persistent(self.persistent)
            .execute(&mut *tx)
            .await
            .during("forget_requests")?;
        tx.commit().await.during("forget_requests")?;
        Ok(answers.rows_affected() + claims.rows_affected())
    }

    async fn query_audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        let mut session = self.session().await.during("query_audit")?;
        let rows = sql::audit_query::<Postgres>(filter)
            .build_query_as::<AuditRow>()
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("query_audit")?;
        session.end().await.during("query_audit")?;
        rows.into_iter().map(AuditRow::into_record).collect()
    }

    async fn audit_groups(&self, filter: &AuditFilter, keys: &[GroupKey]) -> StoreResult<Vec<AuditGroup>> {
        // Bytewise, as SQLite compares, whatever the database's collation.
        let mut session = self.session().await.during("audit_groups")?;
        let rows = sql::audit_groups_query::<Postgres>(filter, keys, " COLLATE \"C\"")
            .build()
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("audit_groups")?;
        session.end().await.during("audit_groups")?;
        rows.iter().map(|row| sql::audit_group(row, keys.len())).collect()
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
        let mut session = self.session().await.during("note_decision")?;
        let found: i64 = sqlx::query_scalar(sql::NOTED_ALLOW)
            .bind(decision_id)
            .bind(gateway)
            .bind(from)
            .bind(until)
            .persistent(self.persistent)
            .fetch_one(&mut *session)
            .await
            .during("note_decision")?;
        if found > 0 {
            sqlx::query(sql::INSERT_NOTE)
                .bind(decision_id)
                .bind(kind.as_str())
                .bind(at_ms)
                .bind(gateway)
                .bind(detail)
                .persistent(self.persistent)
                .execute(&mut *session)
                .await
                .during("note_decision")?;
        }
        session.end().await.during("note_decision")?;
        Ok(found > 0)
    }

    async fn correct_lost_answer(&self, lost: &LostAnswer) -> StoreResult<bool> {
        let Some((from, until)) = sql::decided_around(&lost.decision_id) else {
            return Ok(false);
        };
        let (outcome, code) = match &lost.received {
            Some((outcome, code)) => (outcome.as_str(), code.as_str()),
            None => ("", ""),
        };
        let mut session = self.session().await.during("correct_lost_answer")?;
        let inserted = sqlx::query(sql::INSERT_CORRECTION)
            .bind(&lost.decision_id)
            .bind(lost.at_ms)
            .bind(&lost.gateway)
            .bind(lost.detail())
            .bind(from)
            .bind(until)
            .bind(outcome)
            .bind(code)
            .persistent(self.persistent)
            .execute(&mut *session)
            .await
            .during("correct_lost_answer")?;
        session.end().await.during("correct_lost_answer")?;
        Ok(inserted.rows_affected() > 0)
    }

    async fn decision_notes(&self, decision_ids: &[String]) -> StoreResult<Vec<DecisionNote>> {
        if decision_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut session = self.session().await.during("decision_notes")?;
        let rows = sql::notes_query::<Postgres>(decision_ids)
            .build_query_as::<NoteRow>()
            .persistent(self.persistent)
            .fetch_all(&mut *session)
            .await
            .during("decision_notes")?;
        session.end().await.during("decision_notes")?;
        rows.into_iter().map(NoteRow::into_note).collect()
    }

    async fn prepare_audit_periods(&self, now_ms: i64) -> StoreResult<()> {
        let wanted: BTreeSet<Period> = retention::periods_from(now_ms).into_iter().collect();
        let mut session = self.session().await.during("prepare_audit_periods")?;
        let existing = partitions(&mut *session, self.persistent)
            .await
            .during("prepare_audit_periods")?;
        session.end().await.during("prepare_audit_periods")?;
        if wanted
            .iter()
            .all(|period| existing.iter().any(|partition| partition.name == period.name()))
        {
            return Ok(());
        }
        let created = self
            .create_partitions(&wanted)
            .await
            .during("prepare_audit_periods")?;
        if created > 0 {
            tracing::info!(created, "audit partitions created ahead of time");
        }
        Ok(())
    }

    async fn prune_audit(&self, before_ms: i64, dry_run: bool) -> StoreResult<Vec<PrunedPeriod>> {
        let mut attempt = 1;
        loop {
            match self.try_prune(before_ms, dry_run).await {
                Ok(Some(pruned)) => return Ok(pruned),
                Ok(None) => return Err(StoreError::PruneRunning),
                Err(error) if is_busy(&error) && attempt < PRUNE_ATTEMPTS => {
                    tokio::time::sleep(PRUNE_LOCK_TIMEOUT * attempt).await;
                    attempt += 1;
                }
                Err(error) if is_busy(&error) => {
                    return Err(StoreError::PruneBusy {
                        attempts: PRUNE_ATTEMPTS,
                        lock_wait_ms: u64::try_from(PRUNE_LOCK_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
                        source: error,
                    })
                }
                Err(error) => return Err(StoreError::database("prune_audit", error)),
            }
        }
    }
}

impl PostgresStore {
    /// `append_audit` in one transaction.
    async fn append_in_one_transaction(
        &self,
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
    ) -> StoreResult<()> {
        let columns = AuditArrays::of(records)?;
        let mut tx = self.pool.begin().await.during("append_audit")?;
        insert_audit(&mut tx, columns, remembered, None, self.persistent)
            .await
            .during("append_audit")?;
        tx.commit().await.during("append_audit")
    }

    /// `commit_batch` in one transaction, without the partition retry.
    async fn try_commit_batch(
        &self,
        asks: &[CounterAsk],
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        settle: Settle<'_>,
        gate: &CommitGate,
    ) -> StoreResult<Vec<Tally>> {
        let mut tx = self.pool.begin().await.during("commit_batch")?;
        let (tallies, counters) = if asks.is_empty() {
            (Vec::new(), None)
        } else {
            let (keys, positions) = counting::counter_keys(asks);
            let rows = match lock_counters(&mut tx, &keys, Lock::Existing, self.persistent)
                .await
                .during(COUNT_USAGE)?
            {
                Some(rows) => rows,
                // A counter with no row yet (its first call ever, or after a reset): start
                // again, creating the rows as they are locked. Not in this transaction, whose
                // locks were taken in one pass: a second pass would take more out of order.
                None => {
                    tx.rollback().await.during(COUNT_USAGE)?;
                    tx = self.pool.begin().await.during("commit_batch")?;
                    lock_counters(&mut tx, &keys, Lock::Creating, self.persistent)
                        .await
                        .during(COUNT_USAGE)?
                        .unwrap_or_default()
                }
            };
            let (tallies, counters) = count_locked(asks, &keys, &positions, rows);
            (tallies, Some(counters))
        };
        let (settled, settled_remembered) = if asks.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            settle(&tallies)
        };
        let columns = if settled.is_empty() {
            AuditArrays::of(records)?
        } else {
            AuditArrays::of(&[records, &settled].concat())?
        };
        let remembered = if settled_remembered.is_empty() {
            Cow::Borrowed(remembered)
        } else {
            Cow::Owned([remembered, &settled_remembered].concat())
        };
        insert_audit(&mut tx, columns, &remembered, counters, self.persistent)
            .await
            .during("commit_batch")?;
        if !gate.commit() {
            tx.rollback().await.during("commit_batch")?;
            return Err(StoreError::Abandoned);
        }
        tx.commit().await.during("commit_batch")?;
        Ok(tallies)
    }

    /// Creates the partitions of `periods` that do not exist yet; returns how
    /// many it created. Replicas take turns (an advisory lock), so a period
    /// two of them miss at once is created once.
    ///
    /// Each partition is made as a plain table and then attached: attaching
    /// locks `audit_log` only against other schema changes (`SHARE UPDATE
    /// EXCLUSIVE`), where `CREATE TABLE … PARTITION OF` would lock out every
    /// writer and reader for the moment it takes.
    async fn create_partitions(&self, periods: &BTreeSet<Period>) -> Result<usize, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PARTITION_LOCK)
            .persistent(self.persistent)
            .execute(&mut *tx)
            .await?;
        let existing = partitions(&mut *tx, self.persistent).await?;
        let mut created = 0;
        for period in periods {
            let name = period.name();
            if existing.iter().any(|partition| partition.name == name) {
                continue;
            }
            let bound =
                |ms: Option<i64>, unbounded: &str| ms.map_or(unbounded.to_owned(), |ms| ms.to_string());
            // INVARIANT: `name` is `[a-z0-9_]` (retention.rs) and the bounds
            // are integers, so the text is safe to run.
            let statements = format!(
                "CREATE TABLE \"{name}\" (LIKE audit_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS); \
                 ALTER TABLE audit_log ATTACH PARTITION \"{name}\" FOR VALUES FROM ({}) TO ({})",
                bound(period.start_ms(), "MINVALUE"),
                bound(period.end_ms(), "MAXVALUE"),
            );
            sqlx::raw_sql(AssertSqlSafe(statements)).execute(&mut *tx).await?;
            created += 1;
        }
        tx.commit().await?;
        Ok(created)
    }

    /// One attempt at a prune, in one transaction: every partition that ends
    /// at or before `before_ms` is locked against writes, counted and
    /// dropped, or (dry run) only counted, in one snapshot. `None` when
    /// another prune holds the prune lock.
    async fn try_prune(
        &self,
        before_ms: i64,
        dry_run: bool,
    ) -> Result<Option<Vec<PrunedPeriod>>, sqlx::Error> {
        let mut tx = if dry_run {
            self.pool
                .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .await?
        } else {
            self.pool.begin().await?
        };
        // Counting a month of records may take longer than the pool's
        // statement timeout allows; waiting for a lock may not take long.
        sqlx::query(
            "SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', $1, true)",
        )
        .bind(PRUNE_LOCK_TIMEOUT.as_millis().to_string())
        .persistent(self.persistent)
        .execute(&mut *tx)
        .await?;
        if !dry_run {
            let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
                .bind(PRUNE_LOCK)
                .persistent(self.persistent)
                .fetch_one(&mut *tx)
                .await?;
            if !ours {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let mut doomed: Vec<Partition> = partitions(&mut *tx, self.persistent)
            .await?
            .into_iter()
            .filter(|partition| partition.bounds.is_some_and(|bounds| bounds.ends_by(before_ms)))
            .collect();
        doomed.sort_by_key(|partition| partition.bounds.map(|bounds| (bounds.until_ms, bounds.from_ms)));
        if doomed.is_empty() {
            tx.rollback().await?;
            return Ok(Some(Vec::new()));
        }
        let targets = doomed
            .iter()
            .map(|partition| partition.qualified.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if !dry_run {
            // Writers to these partitions (a replay of old records) wait
            // until the drop commits, so that the counts are what is dropped.
            // INVARIANT: every target is quoted by PostgreSQL's `format('%I')`.
            sqlx::raw_sql(AssertSqlSafe(format!("LOCK TABLE {targets} IN SHARE MODE")))
                .execute(&mut *tx)
                .await?;
        }
        let mut pruned = Vec::with_capacity(doomed.len());
        for partition in &doomed {
            // Always there: `ends_by` holds only for a bounded range.
            let Some(RangeBounds {
                from_ms,
                until_ms: Some(until_ms),
            }) = partition.bounds
            else {
                continue;
            };
            let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {}",
                partition.qualified
            )))
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
            pruned.push(PrunedPeriod {
                name: partition.name.clone(),
                from_ms,
                until_ms,
                records: u64::try_from(count).unwrap_or(0),
            });
        }
        if dry_run {
            tx.rollback().await?;
        } else {
            sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {targets}")))
                .execute(&mut *tx)
                .await?;
            if let Some(until) = pruned.iter().map(|period| period.until_ms).max() {
                sqlx::query(sql::FORGET_NOTES)
                    .bind(until)
                    .persistent(self.persistent)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        Ok(Some(pruned))
    }
}

/// A partition of `audit_log` as the catalog has it.
struct Partition {
    /// `relname`.
    name: String,
    /// `schema.name`, quoted as PostgreSQL quotes identifiers.
    qualified: String,
    /// `None` when the bounds are not a range this store understands (it
    /// then never drops the partition).
    bounds: Option<RangeBounds>,
}

/// The partitions of `audit_log` (those being detached left out).
async fn partitions(
    executor: impl Executor<'_, Database = Postgres>,
    persistent: bool,
) -> Result<Vec<Partition>, sqlx::Error> {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT c.relname::text, format('%I.%I', n.nspname, c.relname), pg_get_expr(c.relpartbound, c.oid) \
         FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE i.inhparent = 'audit_log'::regclass AND NOT i.inhdetachpending",
    )
    .persistent(persistent)
    .fetch_all(executor)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, qualified, bound)| Partition {
            name,
            qualified,
            bounds: bound.as_deref().and_then(retention::parse_range_bounds),
        })
        .collect())
}

/// The audit insert: one array per column, `$1` to `$27`. Without a conflict
/// target: the primary key is `(decision_id, at)` since the table is
/// partitioned (migration 0002), and a replayed record carries the `at` it
/// was made with, so it conflicts and is skipped.
macro_rules! insert_audit_rows {
    () => {
        "INSERT INTO audit_log (decision_id, at, request_id, gateway, kind, outcome, code, path, \
             principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, \
             usage_calls, policy_version, policy_revision, visible_count, visible, door, \
             first_decision_id, arguments_digest, arguments, arguments_omitted, attributes) \
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
             $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], \
             $12::text[], $13::text[], $14::text[], $15::bigint[], $16::text[], $17::bigint[], \
             $18::text[], $19::bigint[], $20::bigint[], $21::text[], $22::text[], $23::text[], \
             $24::text[], $25::text[], $26::bigint[], $27::text[]) \
         ON CONFLICT DO NOTHING"
    };
}

/// Writes back a batch's counters (`$28` to `$31`, the changed ones) ([`WriteBack`]); the start
/// of a statement, a `WITH` clause.
///
/// An upsert rather than `UPDATE … FROM UNNEST(…)`: every row is there (locked), and the conflict
/// check finds each by the primary key, where the `UPDATE`'s join was planned as a scan of the
/// whole table (see [`LOCK_EXISTING`]; `plans::counters_are_found_by_their_key`).
///
/// No join may enter this statement: it runs for every counted batch, and a join makes its plan
/// depend on the arrays' lengths, so that PostgreSQL keeps planning it afresh for each batch
/// instead of reusing one plan (`plans::the_batch_statements_are_planned_once`). The emptied rows
/// are therefore deleted by a statement of their own, [`DELETE_EMPTIED`].
macro_rules! write_back_counters {
    () => {
        "WITH written AS (INSERT INTO usage_counters AS c (principal_id, capability, calls, window_start) \
             SELECT * FROM UNNEST($28::text[], $29::text[], $30::bigint[], $31::bigint[]) \
             ON CONFLICT (principal_id, capability) DO UPDATE \
                 SET calls = excluded.calls, window_start = excluded.window_start) "
    };
}

/// The audit insert, after writing back a batch's counters in the same statement: a round trip
/// fewer per counted batch.
const WRITE_BACK_AND_INSERT_AUDIT: &str = concat!(write_back_counters!(), insert_audit_rows!());

/// Deletes the rows of the keys `$1`, `$2` left with no call: rows inserted only to be locked
/// ([`Lock::Creating`]) for calls that were then refused, which no row says better. Rare, so run
/// only when there are some, apart from the statement every counted batch runs: its join is
/// planned for the keys at hand, which is fine once in a while.
const DELETE_EMPTIED: &str =
    "DELETE FROM usage_counters AS c USING UNNEST($1::text[], $2::text[]) AS u(p, cap) \
     WHERE c.principal_id = u.p AND c.capability = u.cap AND c.calls = 0";

/// Inserts a batch's shadow differences: one statement whatever their number, the rows travelling
/// as one array per column, as the audit rows do. A shadow that differs on most calls (a change
/// under review) then costs a statement per batch, not one per call.
const INSERT_SHADOW_ROWS: &str = "INSERT INTO shadow_differences (decision_id, at, kind, transition, \
     active_revision, shadow_revision, principal_id, capability, tool, active_outcome, active_code, \
     active_path, active_account, active_limit_calls, active_limit_per, shadow_outcome, shadow_code, \
     shadow_path, shadow_account, shadow_limit_calls, shadow_limit_per, gained, lost) \
     SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], \
     $6::bigint[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], \
     $13::text[], $14::bigint[], $15::text[], $16::text[], $17::text[], $18::text[], $19::text[], \
     $20::bigint[], $21::text[], $22::text[], $23::text[]) \
     ON CONFLICT DO NOTHING";

async fn insert_shadow(
    tx: &mut PgConnection,
    rows: Vec<ShadowColumns>,
    persistent: bool,
) -> Result<(), sqlx::Error> {
    // One vector per column, filled in one pass.
    macro_rules! columns {
        ($($column:ident),* $(,)?) => {{
            $(let mut $column = Vec::with_capacity(rows.len());)*
            for row in rows {
                $($column.push(row.$column);)*
            }
            sqlx::query(INSERT_SHADOW_ROWS)$(.bind($column))*
        }};
    }
    let query = columns!(
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
    );
    query.persistent(persistent).execute(&mut *tx).await?;
    Ok(())
}

/// Inserts an audit batch into `tx`, as `append_audit` describes, writing
/// back `counters` in the same statement when there are any (their emptied
/// rows, if any, deleted by one of its own first).
async fn insert_audit(
    tx: &mut PgConnection,
    mut columns: AuditArrays,
    remembered: &[RememberedEntry],
    counters: Option<WriteBack<'_>>,
    persistent: bool,
) -> Result<(), sqlx::Error> {
    let shadow = std::mem::take(&mut columns.shadow);
    // Rare, and disjoint from the keys written back below: a key is either.
    if let Some(counters) = counters
        .as_ref()
        .filter(|counters| !counters.emptied_principals.is_empty())
    {
        sqlx::query(DELETE_EMPTIED)
            .bind(&counters.emptied_principals)
            .bind(&counters.emptied_capabilities)
            .persistent(persistent)
            .execute(&mut *tx)
            .await?;
    }
    // One statement per table, whatever the batch size: the rows travel
    // as one array per column, which keeps the statement text (and its
    // prepared plan) the same for every batch.
    if !columns.decision_id.is_empty() || counters.is_some() {
        let query = match &counters {
            Some(_) => sqlx::query(WRITE_BACK_AND_INSERT_AUDIT),
            None => sqlx::query(insert_audit_rows!()),
        };
        let query = query
            .bind(columns.decision_id)
            .bind(columns.at)
            .bind(columns.request_id)
            .bind(columns.gateway)
            .bind(columns.kind)
            .bind(columns.outcome)
            .bind(columns.code)
            .bind(columns.path)
            .bind(columns.principal_id)
            .bind(columns.issuer)
            .bind(columns.subject)
            .bind(columns.capability)
            .bind(columns.tool)
            .bind(columns.account_id)
            .bind(columns.limit_calls)
            .bind(columns.limit_per)
            .bind(columns.usage_calls)
            .bind(columns.policy_version)
            .bind(columns.policy_revision)
            .bind(columns.visible_count)
            .bind(columns.visible)
            .bind(columns.door)
            .bind(columns.first_decision_id)
            .bind(columns.arguments_digest)
            .bind(columns.arguments)
            .bind(columns.arguments_omitted)
            .bind(columns.attributes);
        let query = match counters {
            Some(counters) => query
                .bind(counters.principals)
                .bind(counters.capabilities)
                .bind(counters.calls)
                .bind(counters.window_starts),
            None => query,
        };
        query.persistent(persistent).execute(&mut *tx).await?;
    }
    if !shadow.is_empty() {
        insert_shadow(tx, shadow, persistent).await?;
    }
    if !remembered.is_empty() {
        let mut gateways = Vec::with_capacity(remembered.len());
        let mut request_ids = Vec::with_capacity(remembered.len());
        let mut decision_ids = Vec::with_capacity(remembered.len());
        let mut responses = Vec::with_capacity(remembered.len());
        let mut ats = Vec::with_capacity(remembered.len());
        let mut fingerprints = Vec::with_capacity(remembered.len());
        for (gateway, request_id, answer) in remembered {
            gateways.push(gateway.clone());
            request_ids.push(request_id.clone());
            decision_ids.push(answer.decision_id.clone());
            responses.push(answer.response.clone());
            ats.push(answer.at_ms);
            fingerprints.push(answer.fingerprint.map(|fingerprint| fingerprint.to_vec()));
        }
        sqlx::query(
            "INSERT INTO remembered_responses (gateway, request_id, decision_id, response, at, fingerprint) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[], $6::bytea[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(gateways)
        .bind(request_ids)
        .bind(decision_ids)
        .bind(responses)
        .bind(ats)
        .bind(fingerprints)
        .persistent(persistent)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// What a batch's count changed in its counters: the counters whose calls or
/// window changed, written back by the audit insert's statement
/// ([`WRITE_BACK_AND_INSERT_AUDIT`]), and the rows left empty (inserted only to
/// be locked, or with no call), which no row says better ([`DELETE_EMPTIED`]).
#[derive(Debug, Default)]
struct WriteBack<'a> {
    principals: Vec<&'a str>,
    capabilities: Vec<&'a str>,
    calls: Vec<i64>,
    window_starts: Vec<i64>,
    emptied_principals: Vec<&'a str>,
    emptied_capabilities: Vec<&'a str>,
}

/// How [`count_in`] locks a batch's counter rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// `SELECT … FOR UPDATE`: a row lock and no new row version; a key with
    /// no row makes the count give up (`None`). Every key of a steady load
    /// has its row, so this is the usual case.
    Existing,
    /// An empty row inserted where there is none, so that there is a row to
    /// lock; an existing row is locked by a no-op `DO UPDATE`, which writes a
    /// new version of it.
    Creating,
}

/// One locked counter row: principal, capability, calls, window start.
type LockedCounter = (String, String, i64, i64);

/// Locks the rows of the keys `$1`, `$2` (principals, capabilities) that exist.
///
/// One search of the primary key per key, whatever the planner thinks of the table: a plain join
/// of the keys with `usage_counters` is planned, prepared once with the arrays unknown, as a hash
/// join over a sequential scan of the whole table (the planner guesses 10 keys and, while the
/// table is small, a thousand counters here, finds the scan cheaper), which made each counted
/// batch read every counter: 0.37 ms against 0.14 ms for 33 keys (docs/benchmarks.md, "Round
/// 3"). The `LATERAL` subquery with `OFFSET 0` is not flattened into a join, so it runs once per
/// key, by the index, and locks that key's row as the keys come: in the order the function emits
/// them, the order `WITH ORDINALITY` numbers (`plans::counters_are_found_by_their_key`).
const LOCK_EXISTING: &str = "SELECT c.principal_id, c.capability, c.calls, c.window_start \
     FROM UNNEST($1::text[], $2::text[]) WITH ORDINALITY AS k(p, cap, n) \
     CROSS JOIN LATERAL (SELECT * FROM usage_counters AS c \
         WHERE c.principal_id = k.p AND c.capability = k.cap OFFSET 0) AS c \
     ORDER BY k.n FOR UPDATE OF c";

/// Locks the rows of the keys `$1`, `$2`, inserting an empty one where there is none; the
/// conflict check finds each existing row by the primary key.
const LOCK_CREATING: &str =
    "INSERT INTO usage_counters AS c (principal_id, capability, window_start, calls) \
     SELECT k.p, k.cap, 0, 0 FROM UNNEST($1::text[], $2::text[]) WITH ORDINALITY AS k(p, cap, n) \
     ORDER BY k.n \
     ON CONFLICT (principal_id, capability) DO UPDATE SET calls = c.calls \
     RETURNING principal_id, capability, calls, window_start";

/// Locks the counter rows of `keys` (sorted and distinct,
/// [`counting::counter_keys`]) in one statement whatever their number, and
/// returns them. `None` when, with [`Lock::Existing`], a key has no row.
async fn lock_counters(
    tx: &mut PgConnection,
    keys: &[(&str, &str)],
    lock: Lock,
    persistent: bool,
) -> Result<Option<Vec<LockedCounter>>, sqlx::Error> {
    let (principals, capabilities): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
    // INVARIANT: either way the rows are locked in `keys` order (`k.n`, the
    // position in the arrays; not `ORDER BY` the columns, whose collation may
    // sort otherwise), the same on every replica, so two batches sharing
    // counters queue instead of deadlocking. `Existing` locks in the lateral
    // subquery, key by key as the function emits them, which is the order
    // `WITH ORDINALITY` numbers; `Creating` inserts (or locks) the rows in
    // the `ORDER BY k.n` it selects them in. A row lock reads the row's
    // latest committed version, whatever the snapshot.
    let statement = match lock {
        Lock::Existing => LOCK_EXISTING,
        Lock::Creating => LOCK_CREATING,
    };
    let found: Vec<LockedCounter> = sqlx::query_as(statement)
        .bind(&principals)
        .bind(&capabilities)
        .persistent(persistent)
        .fetch_all(&mut *tx)
        .await?;
    // Distinct keys: as many rows as keys when every key has one.
    Ok((lock == Lock::Creating || found.len() == keys.len()).then_some(found))
}

/// Counts `asks` in arrival order on their locked counter `rows`, and says
/// what to write back.
fn count_locked<'a>(
    asks: &[CounterAsk],
    keys: &[(&'a str, &'a str)],
    positions: &[usize],
    found: Vec<LockedCounter>,
) -> (Vec<Tally>, WriteBack<'a>) {
    let mut counters = counting::readings(keys, found);
    let before = counters.clone();
    let tallies = counting::count(asks, positions, &mut counters);
    let mut write = WriteBack::default();
    for ((&(principal, capability), now), was) in keys.iter().zip(&counters).zip(&before) {
        match now {
            Some(now) if now.calls > 0 => {
                if Some(*now) != *was {
                    write.principals.push(principal);
                    write.capabilities.push(capability);
                    write.calls.push(sql::saturating_bigint(now.calls));
                    write.window_starts.push(now.window_start_ms);
                }
            }
            // The empty row inserted to lock it, or one with no call: no row says the same.
            _ => {
                write.emptied_principals.push(principal);
                write.emptied_capabilities.push(capability);
            }
        }
    }
    (tallies, write)
}

/// Whether an insert failed because no partition takes one of its rows
/// (SQLSTATE 23514 with no constraint named: a violated `CHECK` names one).
fn lacks_partition(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.code().as_deref() == Some("23514") && error.constraint().is_none())
}

/// Whether PostgreSQL refused the values it was sent, rather than failed or
/// could not be reached: a data exception (class 22, such as 22021 for a
/// U+0000 in text) or an integrity constraint violation (class 23), except a
/// row that no partition takes (see [`lacks_partition`]), which is about the
/// table, not the row. See [`StoreError::is_data_error`].
pub(super) fn refuses_data(error: &sqlx::Error) -> bool {
    let Some(error) = error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<PgDatabaseError>())
    else {
        return false;
    };
    let code = error.code();
    let no_partition = code == "23514" && error.constraint().is_none();
    code.starts_with("22") || (code.starts_with("23") && !no_partition)
}

/// Whether a prune gave up waiting for a lock (`lock_timeout`) or was chosen
/// to break a deadlock: worth another attempt.
fn is_busy(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| code == "55P03" || code == "40P01")
}

/// A batch of audit records turned into one array per column, for `UNNEST`.
struct AuditArrays {
    decision_id: Vec<String>,
    at: Vec<i64>,
    request_id: Vec<Option<String>>,
    gateway: Vec<String>,
    kind: Vec<&'static str>,
    outcome: Vec<&'static str>,
    code: Vec<Option<&'static str>>,
    path: Vec<Option<String>>,
    principal_id: Vec<Option<String>>,
    issuer: Vec<Option<String>>,
    subject: Vec<Option<String>>,
    capability: Vec<Option<String>>,
    tool: Vec<Option<String>>,
    account_id: Vec<Option<String>>,
    limit_calls: Vec<Option<i64>>,
    limit_per: Vec<Option<String>>,
    usage_calls: Vec<Option<i64>>,
    policy_version: Vec<Option<String>>,
    policy_revision: Vec<Option<i64>>,
    visible_count: Vec<Option<i64>>,
    visible: Vec<Option<String>>,
    door: Vec<&'static str>,
    first_decision_id: Vec<Option<String>>,
    arguments_digest: Vec<Option<String>>,
    arguments: Vec<Option<String>>,
    arguments_omitted: Vec<Option<i64>>,
    attributes: Vec<Option<String>>,
    /// The shadow differences the records carry, one row each.
    shadow: Vec<ShadowColumns>,
}

impl AuditArrays {
    fn of(records: &[AuditRecord]) -> StoreResult<Self> {
        let n = records.len();
        let mut columns = AuditArrays {
            decision_id: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            request_id: Vec::with_capacity(n),
            gateway: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            outcome: Vec::with_capacity(n),
            code: Vec::with_capacity(n),
            path: Vec::with_capacity(n),
            principal_id: Vec::with_capacity(n),
            issuer: Vec::with_capacity(n),
            subject: Vec::with_capacity(n),
            capability: Vec::with_capacity(n),
            tool: Vec::with_capacity(n),
            account_id: Vec::with_capacity(n),
            limit_calls: Vec::with_capacity(n),
            limit_per: Vec::with_capacity(n),
            usage_calls: Vec::with_capacity(n),
            policy_version: Vec::with_capacity(n),
            policy_revision: Vec::with_capacity(n),
            visible_count: Vec::with_capacity(n),
            visible: Vec::with_capacity(n),
            door: Vec::with_capacity(n),
            first_decision_id: Vec::with_capacity(n),
            arguments_digest: Vec::with_capacity(n),
            arguments: Vec::with_capacity(n),
            arguments_omitted: Vec::with_capacity(n),
            attributes: Vec::with_capacity(n),
            shadow: Vec::new(),
        };
        for record in records {
            columns.shadow.extend(ShadowColumns::of(record)?);
            let row = AuditValues::of(record)?;
            columns.decision_id.push(row.decision_id.to_owned());
            columns.at.push(row.at);
            columns.request_id.push(row.request_id.map(str::to_owned));
            columns.gateway.push(row.gateway.to_owned());
            columns.kind.push(row.kind);
            columns.outcome.push(row.outcome);
            columns.code.push(row.code);
            columns.path.push(row.path.map(str::to_owned));
            columns.principal_id.push(row.principal_id.map(str::to_owned));
            columns.issuer.push(row.issuer.map(str::to_owned));
            columns.subject.push(row.subject.map(str::to_owned));
            columns.capability.push(row.capability.map(str::to_owned));
            columns.tool.push(row.tool.map(str::to_owned));
            columns.account_id.push(row.account_id.map(str::to_owned));
            columns.limit_calls.push(row.limit_calls);
            columns.limit_per.push(row.limit_per.map(str::to_owned));
            columns.usage_calls.push(row.usage_calls);
            columns.policy_version.push(row.policy_version.map(str::to_owned));
            columns.policy_revision.push(row.policy_revision);
            columns.visible_count.push(row.visible_count);
            columns.visible.push(row.visible);
            columns.door.push(row.door);
            columns
                .first_decision_id
                .push(row.first_decision_id.map(str::to_owned));
            columns
                .arguments_digest
                .push(row.arguments_digest.map(str::to_owned));
            columns.arguments.push(row.arguments.map(str::to_owned));
            columns.arguments_omitted.push(row.arguments_omitted);
            columns.attributes.push(row.attributes.map(str::to_owned));
        }
        Ok(columns)
    }
}

/// The counters' statements as PostgreSQL plans them when prepared with the arrays unknown (a
/// generic plan, which a pooled connection settles on after five runs): each key is found by the
/// primary key, never by reading the whole table. On the server in `DATABASE_URL`, in a temporary
/// table of 1 000 counters that shadows `usage_counters` for one rolled-back transaction; skipped
/// without `DATABASE_URL` unless `CAPGATE_REQUIRE_POSTGRES=1`.
#[cfg(test)]
mod plans {
    use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

    /// The plan of `statement` prepared with `types`, executed with `arguments`, one line a row.
    async fn plan(
        connection: &mut PgConnection,
        statement: &str,
        types: &str,
        arguments: &str,
    ) -> Vec<String> {
        let text = format!("PREPARE planned({types}) AS {statement}; EXPLAIN EXECUTE planned({arguments}); DEALLOCATE planned");
        sqlx::raw_sql(AssertSqlSafe(text))
            .fetch_all(&mut *connection)
            .await
            .expect("explain")
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect()
    }

    /// `part` of a plan (`whole`, shown on failure) finds rows by the primary key and reads no
    /// table whole.
    fn assert_by_key(part: &[String], whole: &[String], what: &str) {
        assert!(
            part.iter().any(|line| line.contains("usage_counters_pkey")),
            "{what}\n{whole:#?}"
        );
        assert!(
            !part.iter().any(|line| line.contains("Seq Scan")),
            "{what}\n{whole:#?}"
        );
    }

    /// A connection to the server in `DATABASE_URL`; `None` (the test skipped) without one,
    /// unless `CAPGATE_REQUIRE_POSTGRES=1`.
    async fn connect() -> Option<PgConnection> {
        let Ok(url) = std::env::var("DATABASE_URL") else {
            assert_ne!(
                std::env::var("CAPGATE_REQUIRE_POSTGRES").as_deref(),
                Ok("1"),
                "CAPGATE_REQUIRE_POSTGRES=1 but DATABASE_URL is not set"
            );
            eprintln!("skipped: needs DATABASE_URL");
            return None;
        };
        Some(
            PgConnection::connect(&url)
                .await
                .expect("connect to DATABASE_URL"),
        )
    }

    /// A temporary `usage_counters` (as migration 0001 makes it) of `rows` counters `p1`, `p2`, …
    /// on `tickets.read`, which shadows the real one for the rest of `connection`'s transaction
    /// (the tests roll it back, which drops it).
    async fn shadow_counters(connection: &mut PgConnection, rows: u32) {
        sqlx::query(
            "CREATE TEMPORARY TABLE usage_counters (principal_id TEXT NOT NULL, capability TEXT NOT NULL, \
                 window_start BIGINT NOT NULL, calls BIGINT NOT NULL CHECK (calls >= 0), \
                 PRIMARY KEY (principal_id, capability)) WITH (fillfactor = 70)",
        )
        .execute(&mut *connection)
        .await
        .expect("a table of counters");
        sqlx::query(
            "INSERT INTO usage_counters SELECT 'p' || n, 'tickets.read', 0, 1 FROM generate_series(1, $1) AS n",
        )
        .bind(i64::from(rows))
        .execute(&mut *connection)
        .await
        .expect("counters");
    }

    /// The statements every counted batch runs are planned once per connection and then reused,
    /// as PostgreSQL does for a prepared statement whose generic plan costs no more than planning
    /// it for each batch's arrays: five plans for the first five runs, then one for the rest. A
    /// join between the keys and the counters defeats that (planned for the keys at hand, it is
    /// estimated cheaper than the generic plan), and cost every batch a planning, on the writer's
    /// path, with a table of counters the size a deployment has. Temporary tables shadow the
    /// real ones for one rolled-back transaction: 100 000 counters, analysed as autovacuum would.
    #[tokio::test]
    async fn the_batch_statements_are_planned_once() {
        let Some(mut connection) = connect().await else {
            return;
        };
        let mut tx = connection.begin().await.expect("begin");
        shadow_counters(&mut tx, 100_000).await;
        sqlx::raw_sql(
            "ANALYZE usage_counters; \
             CREATE TEMPORARY TABLE audit_log (decision_id TEXT NOT NULL, at BIGINT NOT NULL, request_id TEXT, \
                 gateway TEXT NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, code TEXT, path TEXT, \
                 principal_id TEXT, issuer TEXT, subject TEXT, capability TEXT, tool TEXT, account_id TEXT, \
                 limit_calls BIGINT, limit_per TEXT, usage_calls BIGINT, policy_version TEXT, \
                 policy_revision BIGINT, visible_count BIGINT, visible TEXT, door TEXT NOT NULL, \
                 first_decision_id TEXT, arguments_digest TEXT, arguments TEXT, arguments_omitted BIGINT, \
                 attributes TEXT, PRIMARY KEY (decision_id, at))",
        )
        .execute(&mut *tx)
        .await
        .expect("a table of records");
        const RUNS: i64 = 10;
        for run in 0..RUNS {
            // A batch of 64 capped calls, each on a counter of its own.
            let principals: Vec<String> = (0..64).map(|n| format!("p{}", 1 + run * 64 + n)).collect();
            let keys: Vec<(&str, &str)> = principals.iter().map(|p| (p.as_str(), "tickets.read")).collect();
            let locked = super::lock_counters(&mut tx, &keys, super::Lock::Existing, true)
                .await
                .expect("lock")
                .expect("every counter has its row");
            assert_eq!(locked.len(), keys.len());
            let records: Vec<crate::store::AuditRecord> = principals
                .iter()
                .map(|principal| crate::store::AuditRecord {
                    decision_id: format!("{principal}-{run}"),
                    at_ms: run,
                    principal_id: Some(principal.clone()),
                    ..Default::default()
                })
                .collect();
            let write = super::WriteBack {
                principals: keys.iter().map(|key| key.0).collect(),
                capabilities: keys.iter().map(|key| key.1).collect(),
                calls: vec![2; keys.len()],
                window_starts: vec![run; keys.len()],
                ..Default::default()
            };
            let columns = super::AuditArrays::of(&records).expect("records");
            super::insert_audit(&mut tx, columns, &[], Some(write), true)
                .await
                .expect("write back and insert");
        }
        let plans: Vec<(String, i64, i64)> =
            sqlx::query_as("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
                .fetch_all(&mut *tx)
                .await
                .expect("the connection's prepared statements");
        for statement in [super::LOCK_EXISTING, super::WRITE_BACK_AND_INSERT_AUDIT] {
            let found = plans.iter().find(|(text, ..)| text == statement);
            let Some((_, generic, custom)) = found else {
                panic!("not prepared: {statement}\n{plans:#?}");
            };
            // Five custom plans at most: none where the server forces generic plans.
            assert!(
                *custom <= 5 && *generic == RUNS - *custom,
                "(generic plans, custom plans) of {statement}: ({generic}, {custom}), not ({}, 5)",
                RUNS - 5
            );
        }
        tx.rollback().await.expect("rollback");
    }

    #[tokio::test]
    async fn counters_are_found_by_their_key() {
        let Some(mut connection) = connect().await else {
            return;
        };
        let mut tx = connection.begin().await.expect("begin");
        shadow_counters(&mut tx, 1_000).await;
        sqlx::raw_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            .execute(&mut *tx)
            .await
            .expect("generic plans");
        let keys = "ARRAY['p1', 'p2'], ARRAY['tickets.read', 'tickets.read']";
        for statement in [super::LOCK_EXISTING, super::LOCK_CREATING] {
            let lines = plan(&mut tx, statement, "text[], text[]", keys).await;
            assert_by_key(&lines, &lines, statement);
        }
        // The write-back: 27 parameters of the audit insert unused here, then the counters'.
        let types = format!("{}text[], text[], bigint[], bigint[]", "int, ".repeat(27));
        let arguments = format!(
            "{}{keys}, ARRAY[2, 2]::bigint[], ARRAY[0, 0]::bigint[]",
            "0, ".repeat(27)
        );
        let lines = plan(
            &mut tx,
            concat!(write_back_counters!(), "SELECT 1"),
            &types,
            &arguments,
        )
        .await;
        assert_by_key(&lines, &lines, "the write-back");
        tx.rollback().await.expect("rollback");
    }

    /// The outcome and code indexes leave allows out (migration 0012). A generic plan, which a
    /// pooled connection settles on, knows nothing of the bound value; the store's audit query
    /// states the index's condition, so a search for denials or for a code other than `granted`
    /// still goes through them, on every partition. In a schema of its own, migrated, with
    /// 2 000 allows and 20 denials in each of two partitions, for one rolled-back transaction.
    #[tokio::test]
    async fn audit_queries_use_the_partial_indexes() {
        let Some(mut connection) = connect().await else {
            return;
        };
        let mut tx = connection.begin().await.expect("begin");
        let schema = format!("capgate_plans_{}", std::process::id());
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE SCHEMA {schema}; SET LOCAL search_path = {schema}"
        )))
        .execute(&mut *tx)
        .await
        .expect("a schema of its own");
        super::MIGRATOR.run(&mut *tx).await.expect("migrate");
        sqlx::raw_sql(
            "CREATE TABLE audit_log_p_old PARTITION OF audit_log FOR VALUES FROM (MINVALUE) TO (10000); \
             CREATE TABLE audit_log_p_new PARTITION OF audit_log FOR VALUES FROM (10000) TO (MAXVALUE); \
             INSERT INTO audit_log (decision_id, at, gateway, kind, outcome, code, door) \
             SELECT 'd' || n || '-' || at, at, 'gw', 'decide', \
                 CASE WHEN n % 100 = 0 THEN 'deny' ELSE 'allow' END, \
                 CASE WHEN n % 100 = 0 THEN 'limit_exhausted' ELSE 'granted' END, 'capgate' \
             FROM generate_series(1, 2020) AS n, unnest(ARRAY[n, 20000 + n]) AS at; \
             ANALYZE audit_log; \
             SET LOCAL plan_cache_mode = force_generic_plan",
        )
        .execute(&mut *tx)
        .await
        .expect("records");
        for (outcome, code, index) in [
            (Some("deny"), None, "_outcome_at"),
            (None, Some("limit_exhausted"), "_code_at"),
        ] {
            let filter = crate::store::AuditFilter {
                outcome: outcome.map(str::to_owned),
                code: code.map(str::to_owned),
                since_ms: Some(0),
                limit: 50,
                ..Default::default()
            };
            let mut built = super::sql::audit_query::<sqlx::Postgres>(&filter);
            let statement = sqlx::Execute::sql(built.build());
            let value = outcome.or(code).unwrap_or_default();
            let lines = plan(
                &mut tx,
                statement.as_str(),
                "text, bigint, bigint",
                &format!("'{value}', 0, 50"),
            )
            .await;
            let scans: Vec<&String> = lines
                .iter()
                .filter(|line| line.contains(" on audit_log_p"))
                .collect();
            assert!(
                !scans.is_empty() && scans.iter().all(|line| line.contains(index)),
                "{outcome:?} {code:?}: {lines:#?}"
            );
        }
        tx.rollback().await.expect("rollback");
    }
}
