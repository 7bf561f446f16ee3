//! Helpers shared by the integration tests that talk to the decision service
//! or its store: fresh PostgreSQL databases, `capgate serve` child processes,
//! requests and policies, a TCP proxy that can cut a connection, a local OIDC
//! provider, and an OTLP receiver with a Prometheus scraper for what `serve`
//! exports.
//!
//! A test file takes them with `mod support;`. Every test binary compiles
//! the whole module and uses part of it, so unused items are expected here.

#![allow(dead_code)]
pub mod client;
pub mod cluster;
pub mod counting;
pub mod doors;
pub mod oidc;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod proxy;

/// Runs each scenario `async fn name(kind: Kind)` of the test file once per store, as
/// `sqlite::name` and `postgres::name` (the latter does nothing without a PostgreSQL server; see
/// `postgres::server_url`). The file declares `enum Kind { Sqlite, Postgres }` and invokes
/// `crate::on_both_stores! { name, … }`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Kind::Sqlite).await;
                }
            )*
        }

        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if super::support::postgres::server_url().is_some() {
                        super::$name(super::Kind::Postgres).await;
                    }
                }
            )*
        }
    };
}

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Unique across the tests of this process and across processes: a name for
/// a database or a file.
pub fn unique() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    format!(
        "{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
