//! `request_id` idempotency (service.md §4): a retry with the same `(gateway, request_id)` gets
//! the answer its original got, and consumes nothing. On one replica, a retry racing its original
//! waits for its turn ([`Turns`]); the original's encoded answer is stored with its audit record
//! and read back from the store ([`remembered`]).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::service::State;
use crate::store::{Remembered, Store};

/// How long a remembered response answers a retry with the same `request_id`.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The encoded answer first returned for this request id, while it is retained. A store that
/// does not answer means a fresh decision: with the store down a capped decision cannot consume
/// anyway (it denies `usage_unknown`).
pub(super) async fn remembered<S: Store>(
    state: &State<S>,
    gateway: &str,
    request_id: &str,
) -> Option<Vec<u8>> {
    let found = tokio::time::timeout(state.store_timeout, state.store.remembered(gateway, request_id)).await;
    let Remembered {
        decision_id: _,
        response,
        at_ms,
    } = match found {
        Ok(Ok(Some(found))) => found,
        Ok(Ok(None)) => return None,
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot read remembered responses; deciding afresh");
            return None;
        }
        Err(_) => {
            tracing::warn!("remembered responses did not answer in time; deciding afresh");
            return None;
        }
    };
    if crate::clock::now().saturating_sub(at_ms) > IDEMPOTENCY_RETENTION_MS {
        return None;
    }
    Some(response)
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
