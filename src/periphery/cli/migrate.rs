//! `capgate migrate [--database-url URL]`: applies the schema in
//! `migrations/` to the store (`serve` does the same at start-up). Exit 0
//! when the store is up to date, 3 when it cannot be opened or migrated.

use crate::periphery::store::{self, AnyStore, Store};

use super::remote::{runtime, Database};
use super::{Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub database: Database,
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    runtime()?.block_on(async {
        let migrated = match args.database.open().await? {
            AnyStore::Postgres(store) => store.migrate().await,
            AnyStore::Sqlite(store) => store.migrate().await,
        };
        migrated.map_err(|error| Failure::Input(error.to_string()))
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
