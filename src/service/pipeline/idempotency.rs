//! `request_id` idempotency (docs/service.md): a retry with the same `(gateway, request_id)` gets
//! the answer its original got, and consumes nothing, whichever replica it reaches. On one
//! replica, a retry racing its original waits for its turn ([`Turns`]); across replicas, the
//! first copy claims the id in the store and the others wait for its answer ([`claim`]). The
//! original's encoded answer is stored with its audit record and read back from the store.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::service::State;
use crate::store::{Claim, Door, Remembered, Store};

use super::Refusal;

/// How long a remembered response answers a retry with the same `request_id`.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The key a request id is remembered under: as given through capgate's own door (as it always
/// was), prefixed with the door's name through any other, whose answers are encoded differently.
pub(super) fn key(door: Door, request_id: &str) -> Cow<'_, str> {
    match door {
        Door::Capgate => Cow::Borrowed(request_id),
        other => Cow::Owned(format!("{}:{request_id}", other.as_str())),
    }
}

/// How long a claim holds off other copies of its request before it counts as abandoned: far
/// longer than any decision takes to be answered (a counter, an audit commit, an identity
/// provider's keys), short enough that a retry after a replica died mid-decision is answered.
pub const CLAIM_LEASE_MS: i64 = 30_000;

/// What a decision with a `request_id` should do.
pub(super) enum Turn {
    /// Decide: this call holds the claim, or the store could not say (see [`claim`]).
    Decide,
    /// Answer with what the original was answered.
    Replay(Vec<u8>),
}

/// Claims the request id in the store, shared by every replica, so that one decision is taken
/// for it whichever replica each copy reached (docs/decisions/0016-idempotency-across-replicas.md).
/// A copy that finds the claim taken waits for the holder's answer. A store that does not answer
/// means a fresh decision: with the store down a capped decision cannot consume anyway (it denies
/// `usage_unknown`), so at most one call is consumed still.
pub(super) async fn claim<S: Store>(
    state: &State<S>,
    gateway: &str,
    request_id: &str,
) -> Result<Turn, Refusal> {
    let now = crate::clock::now();
    let claimed = tokio::time::timeout(
        state.store_timeout,
        state
            .store
            .claim_request(gateway, request_id, now, now.saturating_sub(CLAIM_LEASE_MS)),
    )
    .await;
    match claimed {
        Ok(Ok(Claim::Won)) => Ok(Turn::Decide),
        Ok(Ok(Claim::Answered(answer))) => Ok(replay_if_retained(answer)),
        Ok(Ok(Claim::Taken)) => wait_for_answer(state, gateway, request_id).await,
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot claim the request id; deciding afresh");
            Ok(Turn::Decide)
        }
        Err(_) => {
            tracing::warn!("claiming the request id did not answer in time; deciding afresh");
            Ok(Turn::Decide)
        }
    }
}

/// An answer older than the retention window answers nothing: the request is decided afresh.
fn replay_if_retained(answer: Remembered) -> Turn {
    if crate::clock::now().saturating_sub(answer.at_ms) > IDEMPOTENCY_RETENTION_MS {
        Turn::Decide
    } else {
        Turn::Replay(answer.response)
    }
}

/// Another replica holds the claim: poll for its answer, backing off, for as long as a decision
/// can take to be answered. Past that the caller is told to retry, never given a second decision.
async fn wait_for_answer<S: Store>(
    state: &State<S>,
    gateway: &str,
    request_id: &str,
) -> Result<Turn, Refusal> {
    let deadline = tokio::time::Instant::now() + state.claim_wait;
    let mut pause = Duration::from_millis(2);
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
        let found =
            tokio::time::timeout(state.store_timeout, state.store.remembered(gateway, request_id)).await;
        if let Ok(Ok(Some(answer))) = found {
            return Ok(replay_if_retained(answer));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Refusal::Unavailable(format!(
                "a call with request_id `{request_id}` is still being decided; retry with the same \
                 request_id to get its answer"
            )));
        }
    }
}

/// Per-key turns: a retry that arrives while its original is still being decided waits for it,
/// then finds its remembered response.
#[derive(Default)]
pub struct Turns {
    keys: std::sync::Mutex<HashMap<TurnKey, Weak<tokio::sync::Mutex<()>>>>,
}

/// `(gateway, request_id)`.
type TurnKey = (String, String);

impl Turns {
    pub async fn turn(&self, gateway: &str, request_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut keys = self
                .keys
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let key = (gateway.to_owned(), request_id.to_owned());
            match keys.get(&key).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    if keys.len() >= 1024 {
                        keys.retain(|_, lock| lock.strong_count() > 0);
                    }
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    keys.insert(key, Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_scoped_by_door() {
        // capgate's own keys stay as stored before doors existed.
        assert_eq!(key(Door::Capgate, "r-1"), "r-1");
        assert_eq!(key(Door::ExtAuthz, "r-1"), "ext_authz:r-1");
        assert_ne!(key(Door::Authzen, "r-1"), key(Door::ExtMcp, "r-1"));
    }
}
