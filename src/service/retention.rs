//! Audit partitions made ahead of time (docs/decisions/0009-audit-partitioning.md):
//! the server prepares the current and the coming months' partitions at
//! start-up and then every [`PREPARE_INTERVAL`], so that a month never
//! begins without its partition. Should one still be missing (a server that
//! slept through a month, a clock far off), the store creates it when an
//! insert needs it; this task only keeps that off the hot path.
//!
//! The same round forgets the `request_id` answers and claims older than the
//! idempotency retention (24 hours): past it they answer nothing, and kept
//! they would grow by a row per request id for ever; and the shadow differences older than
//! `serve --shadow-retention` (docs/decisions/0035).

use std::time::Duration;

use crate::service::pipeline::IDEMPOTENCY_RETENTION_MS;
use crate::store::Store;

use crate::clock::now as now_ms;

/// How often the server makes sure the coming months have partitions. With
/// two months prepared ahead, any interval far below a month will do.
pub const PREPARE_INTERVAL: Duration = Duration::from_secs(3600);

/// Prepares the coming periods and forgets expired request ids every
/// `interval`, forever (the server aborts the task when it stops). The first
/// round of preparing is the caller's, at start-up.
pub async fn prepare_periodically<S: Store>(store: S, interval: Duration, shadow_retention: Duration) {
    let shadow_retention_ms = i64::try_from(shadow_retention.as_millis()).unwrap_or(i64::MAX);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate, and start-up has just prepared.
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(error) = store.prepare_audit_periods(now_ms()).await {
            tracing::warn!(
                %error,
                "cannot prepare the coming months' audit partitions; inserts will create them when needed"
            );
        }
        match store.forget_requests(now_ms() - IDEMPOTENCY_RETENTION_MS).await {
            Ok(forgotten) => tracing::debug!(forgotten, "expired request ids forgotten"),
            Err(error) => tracing::warn!(%error, "cannot forget expired request ids; retrying next round"),
        }
        match store
            .prune_shadow(now_ms().saturating_sub(shadow_retention_ms))
            .await
        {
            Ok(pruned) => tracing::debug!(pruned, "expired shadow differences deleted"),
            Err(error) => {
                tracing::warn!(%error, "cannot delete expired shadow differences; retrying next round")
            }
        }
    }
}
