//! One capped call counted the way the server counts it: a batch of one ask and no audit
//! entries through `Store::commit_batch`.

use capgate::store::{CommitGate, CounterAsk, CounterKey, CounterReading, Store, Tally};

/// What counting one call made of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// Counted; the counter now reads this.
    Taken(CounterReading),
    /// The window was full: nothing counted.
    Refused,
}

/// Counts one call of `key` at `at_ms` under a ceiling of `limit` calls per `window_ms`.
pub async fn consume<S: Store>(
    store: &S,
    key: CounterKey<'_>,
    at_ms: i64,
    window_ms: u64,
    limit: u64,
) -> Consumed {
    let ask = CounterAsk {
        principal_id: key.principal_id.to_owned(),
        capability: key.capability.to_owned(),
        at_ms,
        window_ms,
        limit,
    };
    let nothing = |_: &[Tally]| (Vec::new(), Vec::new());
    let tallies = store
        .commit_batch(&[ask], &[], &[], &nothing, &CommitGate::default())
        .await
        .expect("count one call");
    match tallies.as_slice() {
        [Tally::Taken(now)] => Consumed::Taken(*now),
        [Tally::Refused(_)] => Consumed::Refused,
        other => panic!("one ask, {} tallies", other.len()),
    }
}
