//! A fresh PostgreSQL database per test, on the server in `DATABASE_URL`.
//!
//! With `CAPGATE_TEST_POOLER_URL` set as well (a PgBouncer in front of that
//! server: scripts/pgbouncer.sh), the stores under test reach the database
//! through it instead, with that URL's `pooler=` setting; the database is
//! still created, migrated and dropped on the server itself.
//!
//! Without `DATABASE_URL` a PostgreSQL test says it was skipped and passes —
//! unless `CAPGATE_REQUIRE_POSTGRES=1` (scripts/test.sh sets it), where the
//! absence fails it. The database is dropped when its [`TestDatabase`] is,
//! also when the test panics; `WITH (FORCE)` ends the connections servers and
//! pools may still hold.

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use capgate::store::{PostgresStore, Store, StoreOptions};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// The server in `DATABASE_URL`, or `None` (after saying so) when it is not
/// set — a failure instead when `CAPGATE_REQUIRE_POSTGRES=1`.
pub fn server_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CAPGATE_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("CAPGATE_REQUIRE_POSTGRES=1 but DATABASE_URL is not set")
        }
        _ => {
            eprintln!(
                "skipped: the PostgreSQL variant needs DATABASE_URL \
                 (e.g. postgres://postgres@127.0.0.1:5432/postgres)"
            );
            None
        }
    }
}

/// A database `capgate_test_…` that exists until this value is dropped.
pub struct TestDatabase {
    pub name: String,
    /// How to connect to it.
    pub options: PgConnectOptions,
    /// `DATABASE_URL` as given.
    server_url: String,
    server: PgConnectOptions,
}

impl TestDatabase {
    /// Creates a fresh, empty database (not migrated); `None` when the
    /// PostgreSQL tests are skipped.
    pub async fn create() -> Option<TestDatabase> {
        let server_url = server_url()?;
        let server = PgConnectOptions::from_str(&server_url).expect("DATABASE_URL is a PostgreSQL URL");
        let name = format!("capgate_test_{}", super::unique());
        let mut admin = PgConnection::connect_with(&server)
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        Some(TestDatabase {
            options: server.clone().database(&name),
            name,
            server_url,
            server,
        })
    }

    /// The database as a URL, for `--database-url`: `DATABASE_URL` with its
    /// path replaced (the query, if any, kept).
    pub fn url(&self) -> String {
        with_database(&self.server_url, &self.name)
    }

    /// How the stores under test reach the database: through the pooler in
    /// `CAPGATE_TEST_POOLER_URL` when it is set, else as [`TestDatabase::url`].
    pub fn store_url(&self) -> String {
        match pooler_url() {
            Some(pooler) => with_database(&pooler, &self.name),
            None => self.url(),
        }
    }

    /// [`TestDatabase::url`] with its host and port replaced by `addr` (a
    /// proxy in front of the server), for a `capgate serve` to reach it through.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let url = self.url();
        let authority_start = url.find("://").map_or(0, |at| at + 3);
        let authority_end = url[authority_start..]
            .find(['/', '?'])
            .map_or(url.len(), |end| authority_start + end);
        let host_start = url[authority_start..authority_end]
            .rfind('@')
            .map_or(authority_start, |at| authority_start + at + 1);
        format!("{}{addr}{}", &url[..host_start], &url[authority_end..])
    }

    /// Where the PostgreSQL server listens (what a proxy forwards to).
    pub fn server_addr(&self) -> SocketAddr {
        (self.server.get_host(), self.server.get_port())
            .to_socket_addrs()
            .expect("resolve the PostgreSQL host")
            .next()
            .expect("the PostgreSQL host has an address")
    }

    /// The connection options of this database, reached through `addr`
    /// instead (a proxy in front of the server).
    pub fn options_via(&self, addr: SocketAddr) -> PgConnectOptions {
        self.options
            .clone()
            .host(&addr.ip().to_string())
            .port(addr.port())
    }

    /// A store on this database, migrated, reached as [`TestDatabase::store_url`] says.
    pub async fn store(&self) -> PostgresStore {
        self.migrate().await.expect("migrate the test database");
        let store = PostgresStore::connect(&self.store_url(), &StoreOptions::default())
            .await
            .expect("open the test database");
        // Through a transaction pooler this only checks that the schema is current.
        store.migrate().await.expect("the schema is current");
        store
    }

    /// Migrates the database on the server itself: through a pooler in transaction mode,
    /// `capgate migrate` refuses to run (it holds a session's advisory lock).
    pub async fn migrate(&self) -> Result<(), capgate::store::StoreError> {
        PostgresStore::connect_with(self.options.clone(), &StoreOptions::default())
            .await?
            .migrate()
            .await
    }
}

/// `CAPGATE_TEST_POOLER_URL`, when set and not empty.
pub fn pooler_url() -> Option<String> {
    std::env::var("CAPGATE_TEST_POOLER_URL")
        .ok()
        .filter(|url| !url.is_empty())
}

/// Whether the stores under test reach their database through a pooler in
/// transaction mode, where they do not listen for notifications.
pub fn through_transaction_pooler() -> bool {
    pooler_url().is_some_and(|url| url.contains("pooler=transaction"))
}

/// `url` with its path (the database) replaced by `name`, its query kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let server = self.server.clone();
        let name = self.name.clone();
        // On a thread of its own with its own runtime: drop may run inside
        // an async test (which must not block on a future) or outside one.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect_with(&server)
                    .await
                    .map_err(|error| error.to_string())?;
                admin
                    .execute(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .map_err(|error| error.to_string())?;
                let _ = admin.close().await;
                Ok::<_, String>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            // Never a panic in drop: the test's own failure, if any, matters more.
            Ok(Err(error)) => eprintln!("could not drop the test database {}: {error}", self.name),
            Err(_) => eprintln!("could not drop the test database {}", self.name),
        }
    }
}
