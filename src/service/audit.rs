//! The audit writer (service.md §5): no answer leaves before its record is
//! durable, and records from concurrent requests are committed together.
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

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::store::{AuditRecord, Remembered, Store};
use crate::telemetry::{metrics, CallResult};

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

// ── The spool ──────────────────────────────────────────────────────────────

/// Append-only JSON-lines files in one directory. The file being appended to
/// is closed (rotated) before it is replayed, so a file is never appended to
/// and replayed at once; all of it runs in the writer task.
struct Spool {
    dir: PathBuf,
    /// The file batches are appended to now.
    current: Option<(PathBuf, File)>,
    /// Closed files waiting for replay, oldest first.
    closed: VecDeque<PathBuf>,
    /// The file being replayed: its entries and how far the store has them.
    replaying: Option<Replay>,
    sequence: u64,
}

struct Replay {
    path: PathBuf,
    records: Vec<AuditRecord>,
    remembered: Vec<RememberedEntry>,
    next: usize,
    /// Size of the chunk handed out and not yet confirmed.
    taken: usize,
}

/// A chunk to replay.
struct Chunk {
    records: Vec<AuditRecord>,
    remembered: Vec<RememberedEntry>,
}

const SPOOL_PREFIX: &str = "audit-";
const SPOOL_SUFFIX: &str = ".jsonl";

impl Spool {
    /// Opens the directory (creating it) and queues the files a previous run
    /// left for replay.
    fn open(dir: &Path) -> std::io::Result<Spool> {
        std::fs::create_dir_all(dir)?;
        let mut closed: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(SPOOL_PREFIX) && name.ends_with(SPOOL_SUFFIX))
            })
            .collect();
        closed.sort();
        if !closed.is_empty() {
            tracing::warn!(files = closed.len(), dir = %dir.display(), "audit spool holds records to replay");
        }
        Ok(Spool {
            dir: dir.to_owned(),
            current: None,
            closed: closed.into(),
            replaying: None,
            sequence: 0,
        })
    }

    fn pending(&self) -> bool {
        self.current.is_some() || !self.closed.is_empty() || self.replaying.is_some()
    }

    /// Appends a batch and fsyncs it.
    fn append(&mut self, records: &[AuditRecord], remembered: &[RememberedEntry]) -> std::io::Result<()> {
        let mut text = String::new();
        for record in records {
            text.push_str(&json!({ "record": record_json(record) }).to_string());
            text.push('\n');
        }
        for entry in remembered {
            text.push_str(&json!({ "remembered": remembered_json(entry) }).to_string());
            text.push('\n');
        }
        if self.current.is_none() {
            self.sequence += 1;
            let name = format!(
                "{SPOOL_PREFIX}{:020}-{:06}{SPOOL_SUFFIX}",
                crate::clock::now().max(0),
                self.sequence
            );
            let path = self.dir.join(name);
            let file = OpenOptions::new().create_new(true).append(true).open(&path)?;
            // The new name must survive a crash too.
            File::open(&self.dir)?.sync_all()?;
            self.current = Some((path, file));
        }
        let Some((_, file)) = &mut self.current else {
            return Ok(());
        };
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }

    /// The next chunk of at most `size` records to replay, rotating the
    /// current file when nothing older waits.
    fn next_chunk(&mut self, size: usize) -> std::io::Result<Option<Chunk>> {
        if self.replaying.is_none() {
            if self.closed.is_empty() {
                if let Some((path, _file)) = self.current.take() {
                    self.closed.push_back(path);
                }
            }
            let Some(path) = self.closed.pop_front() else {
                return Ok(None);
            };
            let (records, remembered) = read_spool_file(&path)?;
            self.replaying = Some(Replay {
                path,
                records,
                remembered,
                next: 0,
                taken: 0,
            });
        }
        let Some(replay) = &mut self.replaying else {
            return Ok(None);
        };
        let end = (replay.next + size.max(1)).min(replay.records.len());
        let records = replay.records[replay.next..end].to_vec();
        // Remembered responses go with the file's last chunk: by then every
        // record they belong to is in the store.
        let remembered = if end == replay.records.len() {
            replay.remembered.clone()
        } else {
            Vec::new()
        };
        replay.taken = end - replay.next;
        Ok(Some(Chunk { records, remembered }))
    }

    /// The chunk handed out is in the store. Returns whether that finished
    /// its file (which is then removed).
    fn chunk_done(&mut self) -> std::io::Result<bool> {
        let Some(replay) = &mut self.replaying else {
            return Ok(false);
        };
        replay.next += replay.taken;
        replay.taken = 0;
        if replay.next < replay.records.len() {
            return Ok(false);
        }
        let path = replay.path.clone();
        self.replaying = None;
        std::fs::remove_file(&path)?;
        File::open(&self.dir)?.sync_all()?;
        Ok(true)
    }
}

/// Reads a spool file. A line that does not parse is skipped with a
/// warning: only the last line can be torn (a crash mid-append), and its
/// batch was never acknowledged.
fn read_spool_file(path: &Path) -> std::io::Result<(Vec<AuditRecord>, Vec<RememberedEntry>)> {
    let reader = BufReader::new(File::open(path)?);
    let mut records = Vec::new();
    let mut remembered = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Option<Value> = serde_json::from_str(&line).ok();
        let entry = parsed.as_ref().and_then(Value::as_object);
        if let Some(record) = entry
            .and_then(|entry| entry.get("record"))
            .and_then(record_from_json)
        {
            records.push(record);
        } else if let Some(entry) = entry
            .and_then(|entry| entry.get("remembered"))
            .and_then(remembered_from_json)
        {
            remembered.push(entry);
        } else {
            tracing::warn!(file = %path.display(), line = number + 1, "skipping an unreadable spool line");
        }
    }
    Ok((records, remembered))
}

// ── Records as JSON (the spool, and `capgate audit --json`) ────────────────

/// An audit record as a JSON object, columns in table order.
pub fn record_json(record: &AuditRecord) -> Value {
    let AuditRecord {
        decision_id,
        at_ms,
        request_id,
        gateway,
        kind,
        outcome,
        code,
        path,
        principal_id,
        issuer,
        subject,
        capability,
        tool,
        account_id,
        limit_calls,
        limit_per,
        usage_calls,
        policy_version,
        policy_revision,
    } = record;
    json!({
        "decision_id": decision_id,
        "at_ms": at_ms,
        "request_id": request_id,
        "gateway": gateway,
        "kind": kind,
        "outcome": outcome,
        "code": code,
        "path": path,
        "principal_id": principal_id,
        "issuer": issuer,
        "subject": subject,
        "capability": capability,
        "tool": tool,
        "account_id": account_id,
        "limit_calls": limit_calls,
        "limit_per": limit_per,
        "usage_calls": usage_calls,
        "policy_version": policy_version,
        "policy_revision": policy_revision,
    })
}

fn record_from_json(value: &Value) -> Option<AuditRecord> {
    let object = value.as_object()?;
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
    let number = |key: &str| object.get(key).and_then(Value::as_u64);
    Some(AuditRecord {
        decision_id: text("decision_id")?,
        at_ms: object.get("at_ms").and_then(Value::as_i64)?,
        request_id: text("request_id"),
        gateway: text("gateway")?,
        kind: text("kind")?,
        outcome: text("outcome")?,
        code: text("code"),
        path: text("path"),
        principal_id: text("principal_id"),
        issuer: text("issuer"),
        subject: text("subject"),
        capability: text("capability"),
        tool: text("tool"),
        account_id: text("account_id"),
        limit_calls: number("limit_calls"),
        limit_per: text("limit_per"),
        usage_calls: number("usage_calls"),
        policy_version: text("policy_version"),
        policy_revision: number("policy_revision"),
    })
}

fn remembered_json(entry: &RememberedEntry) -> Value {
    let (gateway, request_id, remembered) = entry;
    let Remembered {
        decision_id,
        response,
        at_ms,
    } = remembered;
    let mut object = Map::new();
    object.insert("gateway".into(), json!(gateway));
    object.insert("request_id".into(), json!(request_id));
    object.insert("decision_id".into(), json!(decision_id));
    object.insert("at_ms".into(), json!(at_ms));
    object.insert("response_hex".into(), json!(hex(response)));
    Value::Object(object)
}

fn remembered_from_json(value: &Value) -> Option<RememberedEntry> {
    let object = value.as_object()?;
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
    Some((
        text("gateway")?,
        text("request_id")?,
        Remembered {
            decision_id: text("decision_id")?,
            response: unhex(object.get("response_hex")?.as_str()?)?,
            at_ms: object.get("at_ms").and_then(Value::as_i64)?,
        },
    ))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> AuditRecord {
        AuditRecord {
            decision_id: id.into(),
            at_ms: 1_795_910_400_000,
            request_id: Some("r-1".into()),
            gateway: "gw".into(),
            kind: "decide".into(),
            outcome: "allow".into(),
            code: Some("granted".into()),
            path: Some("/grants/0".into()),
            principal_id: Some("staff:ana".into()),
            issuer: Some("staff".into()),
            subject: Some("ana".into()),
            capability: Some("tickets.issue.read".into()),
            tool: None,
            account_id: Some("helpdesk-reader".into()),
            limit_calls: Some(600),
            limit_per: Some("1h".into()),
            usage_calls: Some(1),
            policy_version: Some("sha256:00".into()),
            policy_revision: Some(1),
        }
    }

    #[test]
    fn records_and_responses_round_trip_through_json() {
        let original = record("0192");
        assert_eq!(record_from_json(&record_json(&original)), Some(original));
        let entry = (
            "gw".to_owned(),
            "r-1".to_owned(),
            Remembered {
                decision_id: "0192".into(),
                response: vec![0, 1, 0xfe, 0xff],
                at_ms: 5,
            },
        );
        assert_eq!(remembered_from_json(&remembered_json(&entry)), Some(entry));
    }

    #[test]
    fn the_spool_replays_what_it_took_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool.append(&[record("a"), record("b")], &[]).unwrap();
        spool.append(&[record("c")], &[]).unwrap();
        // A crash in the middle of an append.
        let (path, file) = spool.current.as_mut().unwrap();
        file.write_all(b"{\"record\": {\"decision_id\"").unwrap();
        let path = path.clone();

        // A new process finds the file.
        let mut reopened = Spool::open(dir.path()).unwrap();
        assert!(reopened.pending());
        let first = reopened.next_chunk(2).unwrap().unwrap();
        assert_eq!(first.records.len(), 2);
        assert!(!reopened.chunk_done().unwrap());
        let second = reopened.next_chunk(2).unwrap().unwrap();
        assert_eq!(second.records[0].decision_id, "c");
        assert!(reopened.chunk_done().unwrap());
        assert!(!path.exists());
        assert!(!reopened.pending());
    }

    #[test]
    fn an_unconfirmed_chunk_is_handed_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool.append(&[record("a")], &[]).unwrap();
        let once = spool.next_chunk(10).unwrap().unwrap();
        let again = spool.next_chunk(10).unwrap().unwrap();
        assert_eq!(once.records, again.records);
    }
}
