//! The audit writer (service.md §5): no answer leaves before its record is
//! durable, and records from concurrent requests are committed together.
//! This file is the writer task and its commit loop; `spool.rs` is the local
//! spool it falls back on.
//!
//! Requests hand their records to one writer task and wait for its
//! acknowledgement. The task takes whatever is queued (up to a batch size),
//! commits it in one store transaction, then acknowledges every waiter —
//! one commit for many requests under load, no waiting when idle.
//!
//! When the store cannot take a batch (down, or slower than
//! `--audit-timeout`) and `--audit-spool DIR` is set, the batch is appended
//! to a local file instead, one JSON line per record, and fsynced before the
//! waiters are acknowledged. The same task replays spooled files into the
//! store once it answers again; the store skips decision ids it already has,
//! so a replay interrupted half-way is simply repeated. Only when neither
//! the store nor the spool takes a batch do its requests fail with
//! `UNAVAILABLE` (docs/decisions/0006-audit-spool.md).

mod spool;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::store::{AuditRecord, Remembered, Store};
use crate::telemetry::{metrics, CallResult};

use spool::Spool;

/// A response to remember for an idempotent retry: `(gateway, request_id, response)`.
pub type RememberedEntry = (String, String, Remembered);

/// Where a batch ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// Committed to the store.
    Stored,
    /// Fsynced to the local spool, to be replayed into the store.
    Spooled,
}

/// Neither the store nor the spool took the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail cannot be written")]
pub struct AuditUnavailable;

/// How the writer behaves.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// At most this many records per store transaction.
    pub batch: usize,
    /// How long a commit may take before the batch goes to the spool.
    pub timeout: Duration,
    /// The spool directory, if any.
    pub spool: Option<PathBuf>,
    /// How often spooled files are retried while the store does not answer.
    pub replay_interval: Duration,
}

struct Job {
    records: Vec<AuditRecord>,
    remembered: Vec<RememberedEntry>,
    ack: oneshot::Sender<Result<Durable, AuditUnavailable>>,
}

/// The handle requests write through. Cheap to clone; the writer task ends
/// (after committing everything queued) when the last handle is dropped.
#[derive(Clone)]
pub struct AuditWriter {
    jobs: mpsc::Sender<Job>,
}

impl AuditWriter {
    /// Starts the writer task. Fails when the spool directory cannot be
    /// created or read.
    pub fn start<S: Store>(
        store: S,
        options: AuditOptions,
    ) -> std::io::Result<(AuditWriter, JoinHandle<()>)> {
        let spool = match &options.spool {
            Some(dir) => Some(Arc::new(Mutex::new(Spool::open(dir)?))),
            None => None,
        };
        let (jobs, queue) = mpsc::channel(4096);
        let task = tokio::spawn(run(store, options, spool, queue));
        Ok((AuditWriter { jobs }, task))
    }

    /// Returns once the records are durable (in the store or the spool).
    pub async fn write(
        &self,
        records: Vec<AuditRecord>,
        remembered: Vec<RememberedEntry>,
    ) -> Result<Durable, AuditUnavailable> {
        let (ack, acked) = oneshot::channel();
        self.jobs
            .send(Job {
                records,
                remembered,
                ack,
            })
            .await
            .map_err(|_| AuditUnavailable)?;
        acked.await.unwrap_or(Err(AuditUnavailable))
    }
}

async fn run<S: Store>(
    store: S,
    options: AuditOptions,
    spool: Option<Arc<Mutex<Spool>>>,
    mut queue: mpsc::Receiver<Job>,
) {
    let mut tick = tokio::time::interval(options.replay_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Replay chunk after chunk while the store keeps taking them.
    let mut replay_hot = true;
    loop {
        let pending = spool.as_ref().is_some_and(|spool| lock(spool).pending());
        tokio::select! {
            biased;
            job = queue.recv() => {
                let Some(job) = job else { break };
                let mut batch = vec![job];
                let mut size = batch[0].records.len();
                while size < options.batch {
                    match queue.try_recv() {
                        Ok(job) => {
                            size += job.records.len();
                            batch.push(job);
                        }
                        Err(_) => break,
                    }
                }
                let stored = commit(&store, &options, spool.as_ref(), batch).await;
                replay_hot = replay_hot || stored;
            }
            _ = async {
                if !replay_hot {
                    tick.tick().await;
                }
            }, if pending => {
                let Some(spool) = &spool else { continue };
                replay_hot = replay_chunk(&store, &options, spool).await;
            }
        }
    }
    tracing::debug!("audit writer stopped: every queued record is durable");
}

fn lock(spool: &Mutex<Spool>) -> std::sync::MutexGuard<'_, Spool> {
    // A panic while holding the lock leaves the spool's bookkeeping as it
    // was; the files themselves are append-only, so carrying on is safe.
    spool.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Commits one batch and acknowledges its waiters. Returns whether the
/// store took it.
async fn commit<S: Store>(
    store: &S,
    options: &AuditOptions,
    spool: Option<&Arc<Mutex<Spool>>>,
    batch: Vec<Job>,
) -> bool {
    let mut records = Vec::new();
    let mut remembered = Vec::new();
    let mut acks = Vec::with_capacity(batch.len());
    for job in batch {
        records.extend(job.records);
        remembered.extend(job.remembered);
        acks.push(job.ack);
    }
    let started = std::time::Instant::now();
    let committed = tokio::time::timeout(options.timeout, store.append_audit(&records, &remembered)).await;
    let result = match &committed {
        Ok(Ok(())) => CallResult::Ok,
        Ok(Err(_)) => CallResult::Error,
        Err(_) => CallResult::Timeout,
    };
    metrics().audit_commit(records.len(), result, started.elapsed());
    let outcome = match committed {
        Ok(Ok(())) => Ok(Durable::Stored),
        failed => {
            let problem = match failed {
                Ok(Err(error)) => error.to_string(),
                _ => format!("no answer within {} ms", options.timeout.as_millis()),
            };
            match spool {
                Some(spool) => {
                    let spool = spool.clone();
                    let count = records.len();
                    let written =
                        tokio::task::spawn_blocking(move || lock(&spool).append(&records, &remembered)).await;
                    match written {
                        Ok(Ok(())) => {
                            tracing::warn!(records = count, %problem, "audit store unavailable; batch spooled");
                            Ok(Durable::Spooled)
                        }
                        Ok(Err(error)) => {
                            tracing::error!(%problem, spool_error = %error, "audit store and spool both failed");
                            Err(AuditUnavailable)
                        }
                        Err(_) => Err(AuditUnavailable),
                    }
                }
                None => {
                    tracing::error!(%problem, "audit store unavailable and no spool configured");
                    Err(AuditUnavailable)
                }
            }
        }
    };
    let stored = outcome == Ok(Durable::Stored);
    for ack in acks {
        // A waiter that went away (client cancelled) still had its record written.
        let _ = ack.send(outcome.clone());
    }
    stored
}

/// Replays the next chunk of spooled records. Returns whether the store
/// took it and more may follow at once.
async fn replay_chunk<S: Store>(store: &S, options: &AuditOptions, spool: &Arc<Mutex<Spool>>) -> bool {
    let shared = spool.clone();
    let batch = options.batch;
    let chunk = match tokio::task::spawn_blocking(move || lock(&shared).next_chunk(batch)).await {
        Ok(Ok(Some(chunk))) => chunk,
        Ok(Ok(None)) => return false,
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot read the audit spool");
            return false;
        }
        Err(_) => return false,
    };
    match tokio::time::timeout(
        options.timeout,
        store.append_audit(&chunk.records, &chunk.remembered),
    )
    .await
    {
        Ok(Ok(())) => {
            let shared = spool.clone();
            let count = chunk.records.len();
            match tokio::task::spawn_blocking(move || lock(&shared).chunk_done()).await {
                Ok(Ok(finished)) => {
                    tracing::info!(
                        records = count,
                        file_done = finished,
                        "spooled audit records replayed"
                    );
                    true
                }
                Ok(Err(error)) => {
                    tracing::error!(%error, "cannot remove a replayed spool file");
                    false
                }
                Err(_) => false,
            }
        }
        _ => false,
    }
}
