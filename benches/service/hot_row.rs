//! The hot-row baseline: the store's old per-call conditional statement on one counter row, looped
//! by concurrent writers, each on a connection of its own, each statement its own autocommit
//! transaction. Before consumption moved into the audit batch's transaction, every capped call on
//! one key ran this statement alone, so its rate is the ceiling a hot key had then: the figure
//! `capped-hot` is held against (issue 14: "one hot key … ≥ 3× the raw hot-row baseline"), the
//! statement pgbench would loop, run here with the same SQL so that no second tool is needed.
//!
//! It works on the run's own database (`database` makes it; the server's start, or `drive` for an
//! external server, has migrated it by then), outside the store port: the port need not keep this
//! statement, and must not grow one for a benchmark. It counts on a key of its own, with a ceiling
//! no run reaches, so the scenarios' counters are untouched.
//!
//! PostgreSQL: one connection per writer, at most [`MAX_CONNECTIONS`], so that the server's own pool
//! still fits in the default `max_connections` of 100; the row lock queues the writers. SQLite: one
//! connection per writer on the run's file, opened as the store opens its own (WAL, `FULL` sync),
//! and the writers queue in the process for their turn, as the store's writers do: SQLite admits
//! one writer at a time, and its busy handler's sleeps would measure the handler, not the statement.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, PgConnection, SqliteConnection};
use tokio::sync::Mutex;

use crate::callers::{now_ms, Tally, Window};

/// The store's per-call consumption, word for word (`c.` names the row before the update).
const CONSUME: &str = "INSERT INTO usage_counters AS c (principal_id, capability, window_start, calls) \
     VALUES ($1, $2, $3, 1) \
     ON CONFLICT (principal_id, capability) DO UPDATE SET \
         window_start = CASE WHEN c.window_start <= $4 THEN excluded.window_start \
                             ELSE c.window_start END, \
         calls = CASE WHEN c.window_start <= $4 THEN 1 ELSE c.calls + 1 END \
     WHERE c.window_start <= $4 OR c.calls < $5 \
     RETURNING calls, window_start";

/// The baseline's own key: no scenario's principal.
const PRINCIPAL: &str = "hot-row-baseline";
const CAPABILITY: &str = "bench.metered.call";
/// The window the bench policy's capped grant has (`per: 1d`): it never expires during a run.
const WINDOW_MS: i64 = 86_400_000;
/// A ceiling no run reaches.
const CEILING: i64 = i64::MAX;

/// The most connections the baseline opens (PostgreSQL's default `max_connections` is 100).
pub const MAX_CONNECTIONS: usize = 64;

/// How long one statement may take: the callers' deadline per call, so that a database that stops
/// answering still ends the measurement.
const DEADLINE: Duration = Duration::from_secs(60);

/// Where the run's database is, for connections outside the store's pool.
pub enum Location {
    Postgres(Box<PgConnectOptions>),
    Sqlite(Box<SqliteConnectOptions>),
}

impl Location {
    /// The SQLite file at `path`, opened as the store opens it.
    pub fn sqlite(path: &Path) -> Location {
        Location::Sqlite(Box::new(
            SqliteConnectOptions::new()
                .filename(path)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5))
                .synchronous(SqliteSynchronous::Full),
        ))
    }

    /// The report's label at `callers` concurrent callers.
    pub fn label(&self, callers: usize) -> String {
        let writers = writers(callers);
        let capped = if writers < callers { " (cap)" } else { "" };
        match self {
            Location::Postgres(_) => format!("hot row ×{writers} conn{capped} (baseline)"),
            Location::Sqlite(_) => format!("hot row ×{writers}, 1 writer (baseline)"),
        }
    }
}

/// How many writers stand for `callers` callers.
pub fn writers(callers: usize) -> usize {
    callers.clamp(1, MAX_CONNECTIONS)
}

/// One writer's connection; SQLite's writers share their turn.
enum Writer {
    Postgres(PgConnection),
    Sqlite(SqliteConnection, Arc<Mutex<()>>),
}

impl Writer {
    /// One consumption at `at_ms`, in its own transaction: whether the ceiling let it through.
    async fn consume(&mut self, at_ms: i64) -> Result<bool, sqlx::Error> {
        let expired = at_ms - WINDOW_MS;
        let counted = match self {
            Writer::Postgres(connection) => sqlx::query(CONSUME)
                .bind(PRINCIPAL)
                .bind(CAPABILITY)
                .bind(at_ms)
                .bind(expired)
                .bind(CEILING)
                .fetch_optional(connection)
                .await?
                .is_some(),
            Writer::Sqlite(connection, turn) => {
                let _turn = turn.lock().await;
                sqlx::query(CONSUME)
                    .bind(PRINCIPAL)
                    .bind(CAPABILITY)
                    .bind(at_ms)
                    .bind(expired)
                    .bind(CEILING)
                    .fetch_optional(connection)
                    .await?
                    .is_some()
            }
        };
        Ok(counted)
    }

    async fn close(self) {
        // A connection that does not close cleanly is dropped all the same.
        let _ = match self {
            Writer::Postgres(connection) => connection.close().await,
            Writer::Sqlite(connection, _) => connection.close().await,
        };
    }
}

/// The writers for `callers` callers, connected before the window opens so that connecting is not
/// counted, then looping the statement until it closes.
pub async fn measure(location: &Location, callers: usize, warmup: Duration, duration: Duration) -> Tally {
    let mut connected = Vec::with_capacity(writers(callers));
    let turn = Arc::new(Mutex::new(()));
    for _ in 0..writers(callers) {
        let writer = match location {
            Location::Postgres(options) => PgConnection::connect_with(options).await.map(Writer::Postgres),
            Location::Sqlite(options) => SqliteConnection::connect_with(options)
                .await
                .map(|connection| Writer::Sqlite(connection, Arc::clone(&turn))),
        };
        match writer {
            Ok(writer) => connected.push(writer),
            Err(error) => {
                let mut tally = Tally::default();
                tally.failed(format!("cannot connect a hot-row writer: {error}"));
                for writer in connected {
                    writer.close().await;
                }
                return tally;
            }
        }
    }
    let window = Window::after(warmup, duration);
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|writer| tokio::spawn(write(writer, window)))
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(error) => total.failed(format!("a hot-row writer failed: {error}")),
        }
    }
    total
}

/// One writer: the statement back to back until the window closes.
async fn write(mut writer: Writer, window: Window) -> Tally {
    let mut tally = Tally::default();
    loop {
        let started = Instant::now();
        if window.closed(started) {
            break;
        }
        let consumed = tokio::time::timeout(DEADLINE, writer.consume(now_ms())).await;
        let finished = Instant::now();
        match consumed {
            Ok(Ok(true)) if window.counts(started, finished) => tally.answered(finished - started),
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tally.failed("the hot row's ceiling refused a call".to_owned());
                break;
            }
            Ok(Err(error)) => {
                tally.failed(error.to_string());
                // A failing database is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => {
                // The statement was abandoned mid-flight: the connection cannot be trusted again.
                tally.failed(format!("a statement took longer than {} s", DEADLINE.as_secs()));
                return tally;
            }
        }
    }
    writer.close().await;
    tally
}
