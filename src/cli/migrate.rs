//! `capgate migrate [--database-url URL]`: applies the schema in
//! `migrations/` to the store and prepares the coming months' audit
//! partitions (`serve` does the same at start-up). Exit 0 when the store is
//! up to date, 3 when it cannot be opened or migrated.

use crate::store::{self, Store, StoreError};

use super::remote::{runtime, Database};
use super::{Exit, Failure, Outcome};
use crate::clock;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub database: Database,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    runtime()?.block_on(async {
        let now = clock::now();
        let store = args.database.open().await?;
        migrate(&store, now)
            .await
            .map_err(|error| Failure::Input(error.to_string()))
    })?;
    Ok(Outcome {
        stdout: format!(
            "{}: migrated, the schema is up to date\n",
            store::redact(&args.database.database_url)
        ),
        stderr: String::new(),
        exit: Exit::Done,
    })
}

async fn migrate<S: Store>(store: &S, now: i64) -> Result<(), StoreError> {
    store.migrate().await?;
    store.prepare_audit_periods(now).await
}
