//! The audit writer (service.md, "The audit trail"): no answer leaves before
//! its record is durable, and records from concurrent requests are committed
//! together. This file is the writer task; `isolate.rs` appends a batch so
//! that an entry the store refuses fails alone; `spool.rs` is the local spool
//! the writer falls back on.
//!
//! Requests hand their records to one writer task and wait for its
//! acknowledgement. The task takes whatever is queued (up to a batch size),
//! commits it in one store transaction, then acknowledges every waiter —
//! one commit for many requests under load, no waiting when idle. Up to
//! [`AuditOptions::in_flight`] such transactions run at once (`--audit-in-flight`,
//! 1 by default), so that the next batch can commit while the last waits for
//! its flush; they are to the store what the batches of separate replicas
//! are, and a capped call is counted under its counter row's lock either way. A batch the
//! store refuses for its values is split until the request holding the bad
//! value is found: that request alone fails (`UNAVAILABLE`), logged with its
//! decision ids and counted; every other one is stored.
//!
//! With `--audit-spool DIR`, a request waits for the store at most
//! [`AuditOptions::spool_after`] (the server's `--store-timeout`). A batch the
//! store has not committed by then — the store down, frozen or slow — is
//! appended to a local file, one JSON line per entry, fsynced, and its
//! waiters are acknowledged; its transaction goes on in the background, up
//! to `--audit-timeout`. From then until the store takes a transaction again
//! the store is *failing*: batches go to the spool at once, and the store is
//! tried again by replaying the spool, every replay interval, in the
//! background. So during an outage an answer waits for the store's deadline
//! once at most, never for `--audit-timeout` (docs/decisions/0014). Once the
//! store answers, the spool is replayed chunk after chunk; the store skips
//! decision ids it already has, so a replay interrupted half-way is simply
//! repeated, and a record that was both committed late and spooled is stored
//! once. A spooled entry the store refuses is set aside in the spool's
//! `rejected/` and the replay goes on.
//!
//! Without a spool the store is the only durable target: a batch waits for
//! its transaction, and when that fails or passes `--audit-timeout` its
//! requests fail with `UNAVAILABLE` (docs/decisions/0006-audit-spool.md).
//!
//! A capped call is counted in its batch's transaction ([`AuditWriter::count`],
//! docs/decisions/0025): its record is made once the count is known, inside
//! the transaction, so the call is counted exactly when its record is stored.
//! It never goes to the spool as counted: when the batch is abandoned at the
//! spool deadline (the store then never commits it, [`CommitGate`]) or fails,
//! the call's usage is unknown and that record is what is spooled. Once the
//! batch is committing, the deadline no longer abandons it: its capped calls
//! wait for the commit's outcome, and a commit whose outcome is lost (it may
//! have counted the call) answers `usage_unknown` — a ceiling is never
//! exceeded, at worst a call is counted and denied.
//!
//! A commit whose outcome is lost may have stored records that say something
//! other than what their callers then received (`usage_unknown`, or
//! `UNAVAILABLE` without a spool). Each such answer is a [`LostAnswer`], kept
//! with the spooled records (or, without a spool, in memory until the store
//! answers) and stored as an `answer_lost` note beside a record that says
//! otherwise (docs/decisions/0031), so that the trail tells what the caller got.
//! A request's wait for the store starts when its batch's transaction does, not
//! when it queued behind the one before.

mod isolate;
mod spool;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use crate::store::{AuditRecord, CommitGate, LostAnswer, RecordOutcome, Store, Tally};
use crate::telemetry::{metrics, throttle, AuditPath, Throttle};

use isolate::{Appended, Batch, Fate};
pub use isolate::{Meter, Settler};
use spool::{Chunk, Spool};

pub use crate::store::RememberedEntry;

/// Where a batch ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// Committed to the store.
    Stored,
    /// Fsynced to the local spool, to be replayed into the store.
    Spooled,
}

/// Neither the store nor the spool took the records, or the store refused
/// them for their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail cannot be written")]
pub struct AuditUnavailable;

/// How the writer behaves.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// At most this many records per store transaction.
    pub batch: usize,
    /// At most this many batch transactions at once (at least 1). More than one lets the next
    /// batch commit while the last waits for its flush, as batches of separate replicas do; a
    /// spool replay or stored corrections still run alone.
    pub in_flight: usize,
    /// How long a transaction may take, its splitting included, before it is
    /// abandoned (and its batch spooled, or failed without a spool).
    pub timeout: Duration,
    /// The spool directory, if any.
    pub spool: Option<PathBuf>,
    /// With a spool: how long a request waits for the store before its
    /// records are spooled instead.
    pub spool_after: Duration,
    /// How often spooled files are retried while the store does not answer.
    pub replay_interval: Duration,
}

/// Where a request's entries went and, for a capped call, what counting it
/// made of it (`None`: it could not be counted; its usage is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    durable: Durable,
    tally: Option<Tally>,
}

/// Where a request's acknowledgement goes.
type Ack = oneshot::Sender<Result<Written, AuditUnavailable>>;

struct Job {
    records: Vec<AuditRecord>,
    remembered: Vec<RememberedEntry>,
    /// A capped call to count (its entries are made once it is).
    meter: Option<Meter>,
    ack: Ack,
    /// When the request handed it over.
    arrived: Instant,
}

impl Job {
    /// The entries to spool: a capped call's as uncounted.
    fn into_spooled(self) -> (Vec<AuditRecord>, Vec<RememberedEntry>, Ack) {
        match self.meter {
            Some(meter) => {
                let (records, remembered) = (meter.settle)(None);
                (records, remembered, self.ack)
            }
            None => (self.records, self.remembered, self.ack),
        }
    }
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
        let writer = Writer {
            store,
            options,
            spool,
            waiting: VecDeque::new(),
            commits: VecDeque::new(),
            busy: None,
            failing: false,
            outage_logged: false,
            replay_now: true,
            replay_turn: false,
            outages: Throttle::every(throttle::OUTAGE_EVERY),
            replay_failures: Throttle::every(throttle::OUTAGE_EVERY),
            lost_commits: Throttle::default(),
            unspooled: Throttle::default(),
            spool_failures: Throttle::default(),
            lost: Vec::new(),
        };
        let task = tokio::spawn(writer.run(queue));
        Ok((AuditWriter { jobs }, task))
    }

    /// Returns once the records are durable (in the store or the spool).
    pub async fn write(
        &self,
        records: Vec<AuditRecord>,
        remembered: Vec<RememberedEntry>,
    ) -> Result<Durable, AuditUnavailable> {
        self.send(records, remembered, None)
            .await
            .map(|written| written.durable)
    }

    /// Counts a capped call in the next batch and returns once the entries
    /// `meter` makes of the count are durable, with the count: `None` when the
    /// call could not be counted (the entries made of `None` were written).
    pub async fn count(&self, meter: Meter) -> Result<(Durable, Option<Tally>), AuditUnavailable> {
        self.send(Vec::new(), Vec::new(), Some(meter))
            .await
            .map(|written| (written.durable, written.tally))
    }

    async fn send(
        &self,
        records: Vec<AuditRecord>,
        remembered: Vec<RememberedEntry>,
        meter: Option<Meter>,
    ) -> Result<Written, AuditUnavailable> {
        let (ack, acked) = oneshot::channel();
        self.jobs
            .send(Job {
                records,
                remembered,
                meter,
                ack,
                arrived: Instant::now(),
            })
            .await
            .map_err(|_| AuditUnavailable)?;
        acked.await.unwrap_or(Err(AuditUnavailable))
    }
}

type SharedSpool = Arc<Mutex<Spool>>;

fn lock(spool: &Mutex<Spool>) -> std::sync::MutexGuard<'_, Spool> {
    // A panic while holding the lock leaves the spool's bookkeeping as it
    // was; the files themselves are append-only, so carrying on is safe.
    spool.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writer task's state.
struct Writer<S> {
    store: S,
    options: AuditOptions,
    spool: Option<SharedSpool>,
    /// Jobs handed over and not yet in a transaction.
    waiting: VecDeque<Job>,
    /// The batch transactions under way, oldest first, at most
    /// [`AuditOptions::in_flight`]. Each runs in a task of its own, so that
    /// jobs keep being taken (and spooled) while the store is slow.
    commits: VecDeque<Commit>,
    /// A spool replay or corrections under way: only while no commit is.
    busy: Option<Busy>,
    /// The last store operation failed or did not answer in time, and none
    /// has succeeded in time since.
    failing: bool,
    /// The start of this outage was logged, so its end is too.
    outage_logged: bool,
    /// Replay the next spooled chunk as soon as the store is free, rather
    /// than at the next tick: the last store operation succeeded.
    replay_now: bool,
    /// The next store operation replays a chunk even if jobs wait, so that a
    /// busy replica still drains its spool: replays and commits alternate.
    replay_turn: bool,
    outages: Throttle,
    replay_failures: Throttle,
    /// The lines every failed batch would write: a commit lost its answer, no spool, the spool
    /// failing too.
    lost_commits: Throttle,
    unspooled: Throttle,
    spool_failures: Throttle,
    /// Answers lost without a spool to keep them: stored as notes once the store answers
    /// ([`Writer::start_corrections`]), at most [`MAX_LOST_ANSWERS`].
    lost: Vec<LostAnswer>,
}

/// At most this many lost answers wait in memory for the store (a replica without a spool
/// during a long outage); past it, the next ones are logged, not kept.
const MAX_LOST_ANSWERS: usize = 100_000;
/// At most this many lost answers are stored per store operation, between commits.
const CORRECTIONS_PER_TURN: usize = 64;

enum Busy {
    Replay(JoinHandle<Replayed>),
    /// Lost answers being stored; yields the ones that were not.
    Corrections(JoinHandle<Vec<LostAnswer>>),
}

/// A batch of jobs in a transaction.
struct Commit {
    task: JoinHandle<Appended>,
    batch: Arc<Batch>,
    /// One per unit (job) of `batch`; `None` once it was spooled and
    /// acknowledged while the transaction went on.
    acks: Vec<Option<Ack>>,
    /// Decides between the transaction's commit and the spool deadline.
    gate: Arc<CommitGate>,
    /// When the transaction started: its requests' wait for the store starts then.
    started: Instant,
    /// The spool deadline passed: what could be spooled was.
    overdue: bool,
}

/// How a store operation ended.
enum Finished {
    /// The commit at this index of [`Writer::commits`].
    Commit(usize, Result<Appended, JoinError>),
    Replay(Result<Replayed, JoinError>),
    Corrections(Result<Vec<LostAnswer>, JoinError>),
}

/// What one replay step did.
enum Replayed {
    /// Nothing waits for replay.
    Empty,
    /// A chunk is in the store, the entries it refused set aside.
    Done,
    /// The store failed or did not answer; the chunk is tried again later.
    StoreFailed(String),
    /// The spool could not be read or updated.
    SpoolFailed(std::io::Error),
}

impl<S: Store> Writer<S> {
    async fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        let mut tick = tokio::time::interval(self.options.replay_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        loop {
            self.start_work(open).await;
            if !open && self.waiting.is_empty() && self.busy.is_none() && self.commits.is_empty() {
                if self.lost.is_empty() || self.failing {
                    break;
                }
                self.start_corrections();
                continue;
            }
            let spool_at = self.spool_at();
            let idle = self.busy.is_none() && self.commits.is_empty();
            let replay_due = open && idle && !self.replay_now && self.spool_pending();
            tokio::select! {
                biased;
                finished = finish(&mut self.busy, &mut self.commits), if !idle => self.finished(finished).await,
                // Before new jobs, so that a steady stream of them cannot hold it back.
                () = sleep_until(spool_at), if spool_at.is_some() => self.spool_unacknowledged().await,
                job = queue.recv(), if open => match job {
                    Some(job) => {
                        self.waiting.push_back(job);
                        while let Ok(job) = queue.try_recv() {
                            self.waiting.push_back(job);
                        }
                    }
                    None => open = false,
                },
                _ = tick.tick(), if replay_due => self.start_replay(),
            }
        }
        if !self.lost.is_empty() {
            let decision_ids: Vec<&str> = self.lost.iter().map(|lost| lost.decision_id.as_str()).collect();
            tracing::error!(
                lost_answers = decision_ids.len(),
                decision_ids = %decision_ids.join(","),
                "stopping with lost answers the store never took: these decisions' records may say \
                 allow where the caller got no decision"
            );
        }
        tracing::debug!("audit writer stopped: every queued record is durable");
    }

    /// Spools what waits while the store is failing, and starts store
    /// operations: the next replay chunk or corrections when due, alone once
    /// the commits under way have ended; otherwise commits of what waits, up
    /// to [`AuditOptions::in_flight`] at once (one while the store is failing:
    /// that commit is the one that tries it).
    async fn start_work(&mut self, open: bool) {
        // While the spool's replay keeps trying the store, new jobs need not:
        // they go to the spool. With nothing to replay, the next commit is
        // the one that tries.
        if self.failing && !self.waiting.is_empty() && self.spool_pending() {
            let (mut records, mut remembered, mut acks) = (Vec::new(), Vec::new(), Vec::new());
            for job in self.waiting.drain(..) {
                let (job_records, job_remembered, ack) = job.into_spooled();
                records.extend(job_records);
                remembered.extend(job_remembered);
                acks.push(ack);
            }
            self.spool_and_acknowledge(records, remembered, Vec::new(), acks)
                .await;
        }
        if self.busy.is_some() {
            return;
        }
        let replay =
            open && self.replay_now && (self.waiting.is_empty() || self.replay_turn) && self.spool_pending();
        let corrections =
            !self.failing && !self.lost.is_empty() && (self.waiting.is_empty() || self.replay_turn);
        if replay || corrections {
            // Alone: no new commit starts until those under way have ended.
            if self.commits.is_empty() {
                if replay {
                    self.start_replay();
                } else {
                    self.start_corrections();
                }
            }
            return;
        }
        let limit = if self.failing {
            1
        } else {
            self.options.in_flight.max(1)
        };
        while !self.waiting.is_empty() && self.commits.len() < limit {
            self.start_commit();
        }
    }

    /// Stores up to [`CORRECTIONS_PER_TURN`] lost answers, in a task of its own.
    fn start_corrections(&mut self) {
        self.replay_turn = false;
        let take = self.lost.len().min(CORRECTIONS_PER_TURN);
        let lost: Vec<LostAnswer> = self.lost.drain(..take).collect();
        let (store, timeout) = (self.store.clone(), self.options.timeout);
        self.busy = Some(Busy::Corrections(tokio::spawn(async move {
            let deadline = Instant::now() + timeout;
            let mut left = lost.into_iter();
            while let Some(answer) = left.next() {
                match tokio::time::timeout_at(deadline, store.correct_lost_answer(&answer)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) | Err(_) => return std::iter::once(answer).chain(left).collect(),
                }
            }
            Vec::new()
        })));
    }

    /// Keeps answers lost without a spool for the store, up to [`MAX_LOST_ANSWERS`].
    fn keep_lost(&mut self, lost: Vec<LostAnswer>) {
        let room = MAX_LOST_ANSWERS.saturating_sub(self.lost.len());
        if lost.len() > room {
            let dropped: Vec<&str> = lost[room..]
                .iter()
                .map(|lost| lost.decision_id.as_str())
                .collect();
            tracing::error!(
                decision_ids = %dropped.join(","),
                "too many lost answers wait for the store; these are not kept: their records may \
                 say allow where the caller got no decision"
            );
        }
        self.lost.extend(lost.into_iter().take(room));
    }

    /// Commits up to a batch of the waiting jobs, in a task of its own.
    fn start_commit(&mut self) {
        let mut batch = Batch::default();
        let mut acks = Vec::new();
        while acks.is_empty() || batch.records.len() + batch.units() < self.options.batch {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            match job.meter {
                Some(meter) => batch.push_metered(meter),
                None => batch.push(job.records, job.remembered),
            }
            acks.push(Some(job.ack));
        }
        let batch = Arc::new(batch);
        let gate = Arc::new(CommitGate::default());
        let (store, shared, timeout) = (self.store.clone(), batch.clone(), self.options.timeout);
        let shared_gate = gate.clone();
        self.commits.push_back(Commit {
            task: tokio::spawn(async move { isolate::append(&store, &shared, timeout, &shared_gate).await }),
            batch,
            acks,
            gate,
            started: Instant::now(),
            overdue: false,
        });
    }

    fn start_replay(&mut self) {
        let Some(spool) = self.spool.clone() else {
            return;
        };
        self.replay_turn = false;
        let store = self.store.clone();
        let (size, timeout) = (self.options.batch, self.options.timeout);
        self.busy = Some(Busy::Replay(tokio::spawn(replay_chunk(
            store, spool, size, timeout,
        ))));
    }

    /// Whether the spool holds anything to replay. Never waits for the lock:
    /// the replay under way holds it while it reads a file, and that replay
    /// is itself replaying something.
    fn spool_pending(&self) -> bool {
        let Some(spool) = &self.spool else {
            return false;
        };
        match spool.try_lock() {
            Ok(spool) => spool.pending(),
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().pending(),
        }
    }

    /// With a spool: when the oldest transaction under way has taken
    /// `spool_after`, or, with none under way in time (a replay, or those
    /// past their deadline), when the earliest waiting job has waited that long.
    fn spool_at(&self) -> Option<Instant> {
        self.spool.as_ref()?;
        let since = match self.commits.iter().find(|commit| !commit.overdue) {
            Some(commit) => commit.started,
            None => self.waiting.front()?.arrived,
        };
        Some(since + self.options.spool_after)
    }

    /// The store did not commit in time: everything not yet acknowledged is
    /// spooled, and the store is failing. The transactions under way go on.
    async fn spool_unacknowledged(&mut self) {
        let (mut records, mut remembered, mut acks) = (Vec::new(), Vec::new(), Vec::new());
        for commit in &mut self.commits {
            if !commit.overdue {
                commit.overdue = true;
                // Abandoned, the transaction will not commit: its capped calls
                // are uncounted. Committing, they wait for its outcome.
                let abandoned = !commit.batch.metered() || commit.gate.abandon();
                for (unit, ack) in commit.acks.iter_mut().enumerate() {
                    let (unit_records, unit_remembered) = match commit.batch.meter(unit) {
                        Some(_) if !abandoned => continue,
                        Some(meter) => (meter.settle)(None),
                        None => {
                            let (unit_records, unit_remembered) = commit.batch.entries(unit..unit + 1);
                            (unit_records.to_vec(), unit_remembered.to_vec())
                        }
                    };
                    if let Some(ack) = ack.take() {
                        records.extend(unit_records);
                        remembered.extend(unit_remembered);
                        acks.push(ack);
                    }
                }
            }
        }
        for job in self.waiting.drain(..) {
            let (job_records, job_remembered, ack) = job.into_spooled();
            records.extend(job_records);
            remembered.extend(job_remembered);
            acks.push(ack);
        }
        let problem = format!("no commit within {} ms", self.options.spool_after.as_millis());
        self.store_fails(&problem);
        self.spool_and_acknowledge(records, remembered, Vec::new(), acks)
            .await;
    }

    /// A store operation under way ended: a commit of `commits`, or what is in `busy`.
    async fn finished(&mut self, finished: Finished) {
        match finished {
            Finished::Commit(index, appended) => {
                // `finish` names a commit under way, and nothing removed one since.
                if let Some(commit) = self.commits.remove(index) {
                    let appended = appended.unwrap_or_else(|error| Appended {
                        fates: vec![Fate::Unstored; commit.batch.units()],
                        tallies: vec![None; commit.batch.units()],
                        failure: Some(format!("the audit commit task failed: {error}")),
                    });
                    self.committed(commit, appended).await;
                }
            }
            Finished::Replay(replayed) => {
                self.busy = None;
                self.replayed(replayed);
            }
            Finished::Corrections(left) => {
                self.busy = None;
                // A task that failed wrote what it could; the notes it held are lost with it.
                let left = left.unwrap_or_default();
                if !left.is_empty() {
                    self.store_fails("the lost answers could not be stored");
                    let mut kept = left;
                    kept.append(&mut self.lost);
                    self.lost = kept;
                }
            }
        }
    }

    /// A transaction ended: its waiters (unless spooled already) learn what
    /// became of their records.
    async fn committed(&mut self, commit: Commit, appended: Appended) {
        let Appended {
            fates,
            tallies,
            failure,
        } = appended;
        // Spooled and acknowledged already: an entry the store refused is set
        // aside when the spool is replayed. A late success does not end the
        // outage: the store answered, but slower than a request may wait, and
        // the next replay tells whether it is back.
        if commit.overdue {
            if let Some(problem) = &failure {
                self.store_fails(problem);
            }
        }
        if commit.acks.iter().all(Option::is_none) {
            return;
        }
        // A failure after a commit began (a split batch's earlier part, or the
        // `COMMIT` itself) may have stored records, and counted calls, that it
        // reports as not stored: the answers it gives are then lost answers.
        let in_doubt = failure.is_some() && !commit.gate.abandon();
        let acks = commit.acks;
        if !commit.overdue {
            match &failure {
                None => {
                    self.store_answers();
                    self.replay_turn = true;
                }
                Some(problem) => self.store_fails(problem),
            }
        }
        let (mut records, mut remembered, mut unstored) = (Vec::new(), Vec::new(), Vec::new());
        // Per unstored record in doubt: what its caller receives if the spool takes it (a capped
        // call's `usage_unknown`; `None` for a record spooled as it was committed, which is
        // then what its caller receives: nothing was lost).
        let mut lost: Vec<(LostAnswer, Option<(RecordOutcome, String)>)> = Vec::new();
        for (unit, ((fate, tally), ack)) in fates.into_iter().zip(tallies).zip(acks).enumerate() {
            let Some(ack) = ack else {
                continue;
            };
            let meter = commit.batch.meter(unit);
            let (unit_records, unit_remembered) = match meter {
                Some(meter) if fate != Fate::Stored => {
                    let (records, remembered) = (meter.settle)(None);
                    (Cow::Owned(records), Cow::Owned(remembered))
                }
                _ => {
                    let (records, remembered) = commit.batch.entries(unit..unit + 1);
                    (Cow::Borrowed(records), Cow::Borrowed(remembered))
                }
            };
            match fate {
                Fate::Stored => {
                    // A waiter that went away (client cancelled) still had its record written.
                    let _ = ack.send(Ok(Written {
                        durable: Durable::Stored,
                        tally,
                    }));
                }
                Fate::Refused(error) => {
                    for (entry, decision_id) in decision_ids(&unit_records, &unit_remembered) {
                        tracing::error!(
                            decision_id,
                            entry,
                            %error,
                            "audit record refused by the store; its call fails"
                        );
                    }
                    metrics().audit_rejected(AuditPath::Write, unit_records.len() + unit_remembered.len());
                    let _ = ack.send(Err(AuditUnavailable));
                }
                Fate::Unstored => {
                    if in_doubt {
                        let now = crate::clock::now();
                        lost.extend(unit_records.iter().map(|record| {
                            let spooled = meter.map(|_| {
                                (
                                    record.outcome,
                                    record
                                        .code
                                        .map(|code| code.as_str())
                                        .unwrap_or_default()
                                        .to_owned(),
                                )
                            });
                            let answer = LostAnswer {
                                decision_id: record.decision_id.clone(),
                                gateway: record.gateway.clone(),
                                at_ms: now,
                                received: None,
                            };
                            (answer, spooled)
                        }));
                    }
                    records.extend_from_slice(&unit_records);
                    remembered.extend_from_slice(&unit_remembered);
                    unstored.push(ack);
                }
            }
        }
        if unstored.is_empty() {
            return;
        }
        if in_doubt {
            if let Some(held_back) = self.lost_commits.check() {
                tracing::warn!(
                    records = lost.len(),
                    first_decision_id = lost.first().map(|(answer, _)| answer.decision_id.as_str()),
                    batches_not_logged = held_back,
                    "a commit lost its answer: its records may be stored while their callers are \
                     answered otherwise (usage_unknown, or UNAVAILABLE); each is noted as answer_lost"
                );
            }
        }
        if self.spool.is_some() {
            let spooled_lost: Vec<LostAnswer> = lost
                .iter()
                .filter_map(|(answer, spooled)| {
                    let received = spooled.clone()?;
                    Some(LostAnswer {
                        received: Some(received),
                        ..answer.clone()
                    })
                })
                .collect();
            if self
                .spool_and_acknowledge(records, remembered, spooled_lost, unstored)
                .await
            {
                return;
            }
        } else {
            let problem = failure.unwrap_or_default();
            if let Some(held_back) = self.unspooled.check() {
                tracing::error!(
                    %problem,
                    batches_not_logged = held_back,
                    "audit store unavailable and no spool configured: calls fail UNAVAILABLE"
                );
            }
            for ack in unstored {
                let _ = ack.send(Err(AuditUnavailable));
            }
        }
        // Their callers got no decision.
        self.keep_lost(lost.into_iter().map(|(answer, _)| answer).collect());
    }

    fn replayed(&mut self, replayed: Result<Replayed, JoinError>) {
        match replayed {
            Ok(Replayed::Done) => {
                self.store_answers();
                self.replay_failures.reset();
            }
            Ok(Replayed::Empty) => self.replay_now = false,
            Ok(Replayed::StoreFailed(problem)) => {
                self.store_fails(&problem);
                if let Some(unlogged) = self.replay_failures.check() {
                    tracing::warn!(
                        %problem,
                        failures_not_logged = unlogged,
                        "cannot replay the audit spool into the store; retrying every poll interval"
                    );
                }
            }
            Ok(Replayed::SpoolFailed(error)) => {
                self.replay_now = false;
                if let Some(unlogged) = self.replay_failures.check() {
                    tracing::error!(%error, failures_not_logged = unlogged, "cannot read or update the audit spool");
                }
            }
            Err(error) => {
                self.replay_now = false;
                tracing::error!(%error, "the audit spool replay task failed");
            }
        }
    }

    /// A store operation succeeded in time.
    fn store_answers(&mut self) {
        if std::mem::take(&mut self.outage_logged) {
            tracing::info!("audit store answers again; replaying the spool");
        }
        self.failing = false;
        self.replay_now = true;
    }

    /// A store operation failed or did not answer in time. With a spool, the
    /// start of an outage is logged (at most once a minute: a store that is
    /// merely slow may come and go).
    fn store_fails(&mut self, problem: &str) {
        if !self.failing && self.spool.is_some() {
            if let Some(unlogged) = self.outages.check() {
                tracing::warn!(
                    %problem,
                    outages_not_logged = unlogged,
                    "audit store unavailable; spooling audit records until it answers"
                );
                self.outage_logged = true;
            }
        }
        self.failing = true;
        self.replay_now = false;
    }

    /// Appends entries to the spool and fsyncs them, then acknowledges their
    /// waiters: spooled, or unavailable when the spool fails too.
    async fn spool_and_acknowledge(
        &self,
        records: Vec<AuditRecord>,
        remembered: Vec<RememberedEntry>,
        lost: Vec<LostAnswer>,
        acks: Vec<Ack>,
    ) -> bool {
        let outcome = match &self.spool {
            // Nothing to write (every unit was a capped call still waiting): nothing is spooled.
            Some(_) if records.is_empty() && remembered.is_empty() && lost.is_empty() => Ok(Durable::Spooled),
            Some(spool) => {
                let spool = spool.clone();
                let count = records.len();
                let written =
                    tokio::task::spawn_blocking(move || lock(&spool).append(&records, &remembered, &lost))
                        .await
                        .unwrap_or_else(|error| Err(std::io::Error::other(error)));
                match written {
                    Ok(()) => {
                        tracing::debug!(records = count, "audit batch spooled");
                        Ok(Durable::Spooled)
                    }
                    Err(error) => {
                        if let Some(held_back) = self.spool_failures.check() {
                            tracing::error!(
                                spool_error = %error,
                                batches_not_logged = held_back,
                                "audit store and spool both failed: calls fail UNAVAILABLE"
                            );
                        }
                        Err(AuditUnavailable)
                    }
                }
            }
            None => Err(AuditUnavailable),
        };
        let spooled = outcome.is_ok();
        for ack in acks {
            let written = outcome.clone().map(|durable| Written { durable, tally: None });
            let _ = ack.send(written);
        }
        spooled
    }
}

/// Waits for the first of the store operations under way to end (never
/// resolves without one).
async fn finish(busy: &mut Option<Busy>, commits: &mut VecDeque<Commit>) -> Finished {
    std::future::poll_fn(|context| {
        for (index, commit) in commits.iter_mut().enumerate() {
            if let Poll::Ready(appended) = Pin::new(&mut commit.task).poll(context) {
                return Poll::Ready(Finished::Commit(index, appended));
            }
        }
        match busy {
            Some(Busy::Replay(task)) => Pin::new(task).poll(context).map(Finished::Replay),
            Some(Busy::Corrections(task)) => Pin::new(task).poll(context).map(Finished::Corrections),
            None => Poll::Pending,
        }
    })
    .await
}

/// Sleeps until `at` (forever without one).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Replays the next chunk of the spool. Entries the store refuses are set
/// aside in `rejected/` (logged and counted) and the chunk counts as done.
async fn replay_chunk<S: Store>(store: S, spool: SharedSpool, size: usize, timeout: Duration) -> Replayed {
    let shared = spool.clone();
    let chunk = match tokio::task::spawn_blocking(move || lock(&shared).next_chunk(size)).await {
        Ok(Ok(Some(chunk))) => chunk,
        Ok(Ok(None)) => return Replayed::Empty,
        Ok(Err(error)) => return Replayed::SpoolFailed(error),
        Err(error) => return Replayed::SpoolFailed(std::io::Error::other(error)),
    };
    let Chunk {
        file,
        records,
        remembered,
        lost,
    } = chunk;
    // Each entry is a unit of its own: a spool line knows no request.
    let mut batch = Batch::default();
    for record in records {
        batch.push(vec![record], Vec::new());
    }
    for entry in remembered {
        batch.push(Vec::new(), vec![entry]);
    }
    let gate = CommitGate::default();
    let Appended { fates, failure, .. } = isolate::append(&store, &batch, timeout, &gate).await;
    if let Some(problem) = failure {
        return Replayed::StoreFailed(problem);
    }
    // After the records: a lost answer is noted only beside a stored record that says otherwise.
    for answer in &lost {
        match tokio::time::timeout(timeout, store.correct_lost_answer(answer)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Replayed::StoreFailed(error.to_string()),
            Err(_) => return Replayed::StoreFailed(format!("no answer within {} ms", timeout.as_millis())),
        }
    }
    let mut rejected = Batch::default();
    let mut reasons = Vec::new();
    for (unit, fate) in fates.into_iter().enumerate() {
        if let Fate::Refused(reason) = fate {
            let (records, remembered) = batch.entries(unit..unit + 1);
            rejected.push(records.to_vec(), remembered.to_vec());
            reasons.push(reason);
        }
    }
    let replayed = batch.records.len();
    let done = tokio::task::spawn_blocking(move || {
        let mut spool = lock(&spool);
        let quarantined = match rejected.units() {
            0 => None,
            _ => Some(spool.quarantine(&file, &rejected.records, &rejected.remembered)?),
        };
        let finished = spool.chunk_done()?;
        Ok::<_, std::io::Error>((rejected, quarantined, finished))
    })
    .await;
    match done {
        Ok(Ok((rejected, quarantine, finished))) => {
            let quarantine = quarantine
                .map(|path| path.display().to_string())
                .unwrap_or_default();
            for (unit, error) in reasons.iter().enumerate() {
                let (records, remembered) = rejected.entries(unit..unit + 1);
                for (entry, decision_id) in decision_ids(records, remembered) {
                    tracing::error!(
                        decision_id,
                        entry,
                        %error,
                        %quarantine,
                        "spooled audit entry refused by the store; quarantined"
                    );
                }
            }
            if rejected.units() > 0 {
                metrics().audit_rejected(
                    AuditPath::Replay,
                    rejected.records.len() + rejected.remembered.len(),
                );
            }
            tracing::info!(
                records = replayed,
                file_done = finished,
                "spooled audit records replayed"
            );
            Replayed::Done
        }
        Ok(Err(error)) => Replayed::SpoolFailed(error),
        Err(error) => Replayed::SpoolFailed(std::io::Error::other(error)),
    }
}

/// The decision id of each entry, and which kind of entry it is, for the log
/// line that sets it aside (an entry holds no credential to leak).
fn decision_ids<'a>(
    records: &'a [AuditRecord],
    remembered: &'a [RememberedEntry],
) -> impl Iterator<Item = (&'static str, &'a str)> + 'a {
    let records = records
        .iter()
        .map(|record| ("record", record.decision_id.as_str()));
    let remembered = remembered
        .iter()
        .map(|(_, _, answer)| ("remembered", answer.decision_id.as_str()));
    records.chain(remembered)
}
