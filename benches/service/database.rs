//! The database a run works on, made for it and removed after it: a fresh SQLite file, or a fresh
//! `capgate_bench_<unique>` database on the PostgreSQL server `--database-url` names.
//!
//! The store is opened through the product's store port, as `capgate serve` opens it. Creating and
//! dropping the PostgreSQL database is the one thing done with raw SQL here: the port has no such
//! operation (a service never creates its own database), and it must not grow one for a benchmark.

use std::path::PathBuf;
use std::str::FromStr;

use capgate::cli::Failure;
use capgate::store::{self, AnyStore, PostgresStore, StoreOptions};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

use crate::hot_row::Location;

/// A database made for this run, removed by [`Database::remove`].
pub struct Database {
    pub store: AnyStore,
    /// `postgres` or `sqlite`, for the report.
    pub kind: &'static str,
    /// Which database, for the report.
    pub description: String,
    cleanup: Cleanup,
}

enum Cleanup {
    /// Drop this database, connecting to the server as `admin`.
    Postgres {
        admin: Box<PgConnectOptions>,
        name: String,
    },
    /// Remove this file and SQLite's companions.
    Sqlite(PathBuf),
}

impl Database {
    pub async fn open(url: Option<&str>, options: &StoreOptions) -> Result<Database, Failure> {
        match url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Self::postgres(url, options).await
            }
            Some(url) if url.starts_with("sqlite:") => {
                let path = url
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:")
                    .split('?')
                    .next()
                    .unwrap_or_default();
                let path = PathBuf::from(path);
                if path.as_os_str().is_empty() || path.exists() {
                    return Err(Failure::Usage(format!(
                        "`--database-url {url}`: the bench needs a file that does not exist yet \
                         (it publishes its own policy, and removes the file after)"
                    )));
                }
                Self::sqlite(path, options).await
            }
            Some(url) => Err(Failure::Usage(format!(
                "`--database-url {}`: expected `postgres://…` or `sqlite://PATH`",
                store::redact(url)
            ))),
            None => {
                let path = std::env::temp_dir().join(format!("capgate-bench-{}.db", unique()));
                Self::sqlite(path, options).await
            }
        }
    }

    /// A fresh database on the server `url` names, created with raw SQL (outside the store port,
    /// which has no such operation), then opened through the port.
    async fn postgres(url: &str, options: &StoreOptions) -> Result<Database, Failure> {
        let input = Failure::Input;
        let admin =
            PgConnectOptions::from_str(url).map_err(|error| input(format!("`--database-url`: {error}")))?;
        let name = format!("capgate_bench_{}", unique());
        // Outside the port: one plain connection to the server, only to create the database.
        let mut connection = PgConnection::connect_with(&admin)
            .await
            .map_err(|error| input(format!("cannot connect to `{}`: {error}", store::redact(url))))?;
        connection
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .map_err(|error| input(format!("cannot create the database `{name}`: {error}")))?;
        let _ = connection.close().await;
        // The port's own entry for a database given as options rather than a URL (the store tests
        // open their fresh databases the same way): the caller's URL keeps every parameter it set,
        // with only the database changed, and no URL is rewritten by hand.
        let opened = PostgresStore::connect_with(admin.clone().database(&name), options)
            .await
            .map_err(|error| error.to_string());
        let cleanup = Cleanup::Postgres {
            admin: Box::new(admin),
            name: name.clone(),
        };
        match opened {
            Ok(store) => Ok(Database {
                store: AnyStore::Postgres(store),
                kind: "postgres",
                description: format!("fresh database {name} (dropped after)"),
                cleanup,
            }),
            Err(error) => {
                let _ = cleanup.run().await;
                Err(input(format!("cannot open the database `{name}`: {error}")))
            }
        }
    }

    /// A fresh SQLite file, opened as `capgate serve --database-url sqlite://…` opens it.
    async fn sqlite(path: PathBuf, options: &StoreOptions) -> Result<Database, Failure> {
        let url = format!("sqlite://{}", path.display());
        let opened = store::connect(&url, options).await;
        let cleanup = Cleanup::Sqlite(path.clone());
        match opened {
            Ok(store) => Ok(Database {
                store,
                kind: "sqlite",
                description: format!("fresh file {} (removed after)", path.display()),
                cleanup,
            }),
            Err(error) => {
                let _ = cleanup.run().await;
                // The port's message already names the (redacted) URL.
                Err(Failure::Input(error.to_string()))
            }
        }
    }

    /// Where the hot-row baseline's own connections go: this database, outside the store's pool.
    pub fn hot_row(&self) -> Location {
        match &self.cleanup {
            Cleanup::Postgres { admin, name } => {
                Location::Postgres(Box::new((**admin).clone().database(name)))
            }
            Cleanup::Sqlite(path) => Location::sqlite(path),
        }
    }

    pub async fn remove(self) -> Result<(), Failure> {
        let Database { store, cleanup, .. } = self;
        // The pools go first; `DROP DATABASE … WITH (FORCE)` ends any
        // connection still closing.
        drop(store);
        cleanup.run().await
    }
}

impl Cleanup {
    async fn run(self) -> Result<(), Failure> {
        match self {
            Cleanup::Postgres { admin, name } => {
                // Outside the port, as the creation: the store cannot drop its own database.
                let mut connection = PgConnection::connect_with(&admin)
                    .await
                    .map_err(|error| Failure::Input(format!("cannot drop `{name}`: {error}")))?;
                connection
                    .execute(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .map_err(|error| Failure::Input(format!("cannot drop `{name}`: {error}")))?;
                let _ = connection.close().await;
                Ok(())
            }
            Cleanup::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    // Absent companions are expected.
                    let _ = std::fs::remove_file(file);
                }
                Ok(())
            }
        }
    }
}

/// Unique across runs: the process id and the clock.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    format!("{}_{nanos}", std::process::id())
}
