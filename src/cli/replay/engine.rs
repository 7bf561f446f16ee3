//! The replay itself: every record of a window of the audit trail decided again under a
//! candidate policy, and the differences counted in `crate::changes`' vocabulary (the one the
//! shadow versions report in).
//!
//! [`replay`] pages through the store oldest first, on the keyset (`at`, `decision_id`), one
//! page at a time read while the previous one is decided; [`Replayer`] decides one record at a
//! time and keeps only counts. What it holds grows with the number of distinct principals and
//! targets a change touched (their counts), never with the number of records read: the pages in
//! flight are bounded, the examples are `examples` per transition, and the prepared principals
//! are a cache of at most [`PRINCIPALS_CACHED`].
//!
//! A record is decided again only from what it holds; what cannot be, is counted by [`Cause`],
//! never guessed.

use std::collections::{BTreeMap, HashMap};

use capgate_core::access::{evaluate_prepared_call, visible, Decision, Prepared, ReasonCode, Usage};
use capgate_core::policy::CompiledPolicy;
use capgate_core::principals::Principal;
use serde_json::{Map, Value};

use crate::changes::{listing_change, transition, Side, Transition};
use crate::store::{AuditCursor, AuditFilter, AuditRecord, RecordKind, RecordOutcome, Store, StoreResult};

/// How many records one query reads.
pub const PAGE: u32 = 5_000;

/// How many principals stay prepared: records of one caller tend to come together, and a cache
/// this size holds a busy hour's callers, in a few MiB.
pub const PRINCIPALS_CACHED: usize = 10_000;

/// The records replayed: `since` inclusive, `until` exclusive, milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since_ms: i64,
    pub until_ms: i64,
}

/// Why a record cannot be decided again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// A retry answered with an earlier answer (`replayed`) or a refused reuse of a request id
    /// (`request_id_reused`): nothing was decided.
    NotADecision,
    /// The caller was never identified: there is no principal to decide on.
    Unauthenticated,
    /// Written before records kept the principal's attributes.
    BeforePrincipals,
    /// Its attributes or kept arguments are not the JSON object a record holds (written behind
    /// the store's back).
    Unreadable,
    /// A listing whose record holds only the first of the capabilities it showed.
    ListingTruncated,
    /// A call whose arguments were forwarded but not kept (only their digest), where the
    /// candidate's decision reads an argument.
    ArgumentsNotKept,
}

impl Cause {
    pub const ALL: [Cause; 6] = [
        Cause::NotADecision,
        Cause::Unauthenticated,
        Cause::BeforePrincipals,
        Cause::Unreadable,
        Cause::ListingTruncated,
        Cause::ArgumentsNotKept,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::NotADecision => "not_a_decision",
            Cause::Unauthenticated => "unauthenticated",
            Cause::BeforePrincipals => "recorded_before_principals",
            Cause::Unreadable => "unreadable",
            Cause::ListingTruncated => "listing_truncated",
            Cause::ArgumentsNotKept => "arguments_not_kept",
        }
    }

    /// How the human report says it.
    pub fn label(self) -> &'static str {
        match self {
            Cause::NotADecision => "not a decision (a retry answered again, or a reused request id)",
            Cause::Unauthenticated => "unauthenticated: no principal to decide on",
            Cause::BeforePrincipals => "recorded before principals were kept",
            Cause::Unreadable => "attributes or arguments not readable",
            Cause::ListingTruncated => "listing recorded in part (compare impossible)",
            Cause::ArgumentsNotKept => "arguments not kept, and the candidate reads them",
        }
    }

    fn index(self) -> usize {
        Cause::ALL.iter().position(|cause| *cause == self).unwrap_or(0)
    }
}

/// One side of a changed decision, owned: what a gateway acts on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub code: Option<String>,
    pub path: Option<String>,
    pub account: Option<String>,
    /// Calls and window, as written.
    pub ceiling: Option<(u64, String)>,
}

impl Outcome {
    fn of(side: &Side<'_>) -> Outcome {
        Outcome {
            allowed: side.allowed,
            code: side.code.map(str::to_owned),
            path: side.path.map(str::to_owned),
            account: side.account.map(str::to_owned),
            ceiling: side.ceiling.map(|(calls, per)| (calls, per.to_owned())),
        }
    }
}

/// What changed in an example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Decision {
        before: Outcome,
        after: Outcome,
    },
    /// The capability ids the listing shows now and did not, and those it no longer shows.
    Listing {
        gained: Vec<String>,
        lost: Vec<String>,
    },
}

/// A record whose decision changed, to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub decision_id: String,
    pub at_ms: i64,
    pub principal_id: String,
    pub tool: Option<String>,
    pub capability: Option<String>,
    pub changed: Changed,
}

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Records in the window.
    pub read: u64,
    /// Records decided again.
    pub replayed: u64,
    /// Of those, decided as recorded.
    pub unchanged: u64,
    /// Per transition, in `Transition::ALL`'s order.
    pub transitions: [u64; 8],
    /// Per transition: the first records (oldest first) it was found on.
    pub examples: [Vec<Example>; 8],
    /// Per cause, in `Cause::ALL`'s order.
    pub not_replayable: [u64; 6],
    /// Replayed with a counted usage read off the record (or `unknown`, as recorded).
    pub ceilings_against_recorded_usage: u64,
    /// Replayed decisions under a ceiling of the candidate where the record had no usage reading
    /// (none applied when it was decided): checked against 0 calls.
    pub ceilings_without_recorded_usage: u64,
    /// Changed records per principal id.
    pub principals: HashMap<String, u64>,
    /// Changed records per tool (a call asked by tool name), capability (asked directly) or
    /// capability gained or lost by a listing.
    pub targets: HashMap<String, u64>,
}

impl Report {
    pub fn count(&self, transition: Transition) -> u64 {
        self.transitions[transition_index(transition)]
    }

    pub fn examples_of(&self, transition: Transition) -> &[Example] {
        &self.examples[transition_index(transition)]
    }

    pub fn not_replayable(&self, cause: Cause) -> u64 {
        self.not_replayable[cause.index()]
    }

    pub fn not_replayable_total(&self) -> u64 {
        self.not_replayable.iter().sum()
    }

    pub fn changed(&self) -> u64 {
        self.transitions.iter().sum()
    }

    /// Whether a transition that may widen access was found.
    pub fn widens(&self) -> bool {
        Transition::ALL
            .into_iter()
            .any(|transition| transition.widens() && self.count(transition) > 0)
    }

    /// The `top` most affected principals, most changed records first, then by id.
    pub fn top_principals(&self, top: usize) -> Vec<(&str, u64)> {
        most(&self.principals, top)
    }

    /// The `top` most affected tools and capabilities.
    pub fn top_targets(&self, top: usize) -> Vec<(&str, u64)> {
        most(&self.targets, top)
    }
}

fn most(counts: &HashMap<String, u64>, top: usize) -> Vec<(&str, u64)> {
    // Sorted into a deterministic order before anything is printed.
    let mut sorted: Vec<(&str, u64)> = counts.iter().map(|(key, count)| (key.as_str(), *count)).collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    sorted.truncate(top);
    sorted
}

fn transition_index(transition: Transition) -> usize {
    Transition::ALL
        .iter()
        .position(|candidate| *candidate == transition)
        .unwrap_or(0)
}

/// A principal as recorded, prepared on the candidate.
struct Cached<'p> {
    issuer: String,
    subject: String,
    attributes: String,
    principal: Principal,
    prepared: Prepared<'p>,
    /// The candidate declares the principal's issuer.
    declared: bool,
}

/// Decides records again under a candidate, one at a time, and counts.
pub struct Replayer<'p> {
    policy: &'p CompiledPolicy,
    examples: usize,
    /// By principal id. Cleared when full: bounded, and records of one caller come together.
    cache: HashMap<String, Cached<'p>>,
    report: Report,
}

impl<'p> Replayer<'p> {
    /// `examples`: how many records to keep per transition.
    pub fn new(policy: &'p CompiledPolicy, examples: usize) -> Self {
        Replayer {
            policy,
            examples,
            cache: HashMap::new(),
            report: Report::default(),
        }
    }

    pub fn finish(self) -> Report {
        self.report
    }

    /// Decides `record` again and counts what came of it.
    pub fn record(&mut self, record: &AuditRecord) {
        self.report.read += 1;
        if let Err(cause) = self.replay(record) {
            self.report.not_replayable[cause.index()] += 1;
        }
    }

    fn replay(&mut self, record: &AuditRecord) -> Result<(), Cause> {
        if matches!(
            record.outcome,
            RecordOutcome::Replayed | RecordOutcome::RequestIdReused
        ) {
            return Err(Cause::NotADecision);
        }
        let (Some(principal_id), Some(issuer), Some(subject), false) = (
            record.principal_id.as_deref(),
            record.issuer.as_deref(),
            record.subject.as_deref(),
            record.outcome == RecordOutcome::Unauthenticated,
        ) else {
            return Err(Cause::Unauthenticated);
        };
        let Some(attributes) = record.attributes.as_deref() else {
            return Err(Cause::BeforePrincipals);
        };
        let listing = record.kind == RecordKind::List;
        if listing
            && record
                .visible_count
                .is_none_or(|count| (record.visible.len() as u64) < count)
        {
            return Err(Cause::ListingTruncated);
        }
        self.prepare(principal_id, issuer, subject, attributes)?;
        let Replayer {
            policy,
            cache,
            report,
            examples,
        } = self;
        let cached = &cache[principal_id];
        if listing {
            let shown: Vec<&str> = if cached.declared {
                visible(&policy.ruleset, &cached.principal, record.at_ms)
                    .into_iter()
                    .map(|seen| seen.capability.id.as_str())
                    .collect()
            } else {
                // The candidate does not know the issuer: the caller is not identified, and sees
                // nothing.
                Vec::new()
            };
            let change = listing_change(record.visible.iter().map(String::as_str), shown);
            report.replayed += 1;
            let Some(transition) = change.transition() else {
                report.unchanged += 1;
                return Ok(());
            };
            let changed = Changed::Listing {
                gained: change.gained.iter().map(|id| (*id).to_owned()).collect(),
                lost: change.lost.iter().map(|id| (*id).to_owned()).collect(),
            };
            let targets = change.gained.iter().chain(&change.lost).copied();
            count(
                report,
                *examples,
                record,
                principal_id,
                transition,
                targets,
                changed,
            );
            return Ok(());
        }
        let before = recorded(record);
        let target = record.tool.as_deref().or(record.capability.as_deref());
        let Some(target) = target else {
            return Err(Cause::Unreadable);
        };
        let capability = match &record.tool {
            Some(tool) => policy.tools.resolve(tool).map(|tool| tool.capability.as_str()),
            None => record.capability.as_deref(),
        };
        let decision;
        let after = match (cached.declared, capability) {
            (false, _) => Side {
                allowed: false,
                code: Some("issuer_unknown"),
                ..NOTHING
            },
            (true, None) => UNKNOWN_TOOL,
            (true, Some(capability)) => {
                let arguments = arguments(record, &cached.prepared, capability)?;
                let (usage, reading) = usage(record);
                decision = evaluate_prepared_call(
                    &cached.prepared,
                    capability,
                    record.at_ms,
                    usage,
                    arguments.as_ref(),
                );
                let ceiling = match &decision {
                    Decision::Allow(allow) => allow.limits.is_some(),
                    Decision::Deny(reason) => reason.code == ReasonCode::LimitExhausted,
                };
                if reading {
                    report.ceilings_against_recorded_usage += u64::from(ceiling);
                } else {
                    report.ceilings_without_recorded_usage += u64::from(ceiling);
                }
                side(&decision)
            }
        };
        report.replayed += 1;
        let Some(transition) = transition(&before, &after) else {
            report.unchanged += 1;
            return Ok(());
        };
        let changed = Changed::Decision {
            before: Outcome::of(&before),
            after: Outcome::of(&after),
        };
        count(
            report,
            *examples,
            record,
            principal_id,
            transition,
            [target],
            changed,
        );
        Ok(())
    }

    /// Makes sure the cache holds the principal as this record has it.
    fn prepare(&mut self, id: &str, issuer: &str, subject: &str, attributes: &str) -> Result<(), Cause> {
        let fresh = self.cache.get(id).is_none_or(|cached| {
            cached.issuer != issuer || cached.subject != subject || cached.attributes != attributes
        });
        if !fresh {
            return Ok(());
        }
        let parsed: BTreeMap<String, String> =
            serde_json::from_str(attributes).map_err(|_| Cause::Unreadable)?;
        let mut principal = Principal::new(issuer, subject, parsed);
        // The recorded id, which counters and who-can key on, whatever the parts say.
        id.clone_into(&mut principal.id);
        let prepared = self.policy.ruleset.prepare(&principal);
        let declared = self.policy.issuer(issuer).is_some();
        if self.cache.len() >= PRINCIPALS_CACHED && !self.cache.contains_key(id) {
            self.cache.clear();
        }
        self.cache.insert(
            id.to_owned(),
            Cached {
                issuer: issuer.to_owned(),
                subject: subject.to_owned(),
                attributes: attributes.to_owned(),
                principal,
                prepared,
                declared,
            },
        );
        Ok(())
    }
}

/// Counts a changed record, and keeps it as an example while there is room.
fn count<'a>(
    report: &mut Report,
    examples: usize,
    record: &AuditRecord,
    principal_id: &str,
    transition: Transition,
    targets: impl IntoIterator<Item = &'a str>,
    changed: Changed,
) {
    let index = transition_index(transition);
    report.transitions[index] += 1;
    bump(&mut report.principals, principal_id);
    for target in targets {
        bump(&mut report.targets, target);
    }
    if report.examples[index].len() < examples {
        report.examples[index].push(Example {
            decision_id: record.decision_id.clone(),
            at_ms: record.at_ms,
            principal_id: principal_id.to_owned(),
            tool: record.tool.clone(),
            capability: record.capability.clone(),
            changed,
        });
    }
}

fn bump(counts: &mut HashMap<String, u64>, key: &str) {
    match counts.get_mut(key) {
        Some(count) => *count += 1,
        None => {
            counts.insert(key.to_owned(), 1);
        }
    }
}

const NOTHING: Side<'static> = Side {
    allowed: false,
    code: None,
    path: None,
    account: None,
    ceiling: None,
};

/// A call of a tool the catalog does not have: the service answers `unknown_tool` and decides
/// nothing, and so does the replay.
const UNKNOWN_TOOL: Side<'static> = Side {
    code: Some("unknown_tool"),
    ..NOTHING
};

/// The decision as the record has it.
fn recorded(record: &AuditRecord) -> Side<'_> {
    if record.outcome == RecordOutcome::UnknownTool {
        return UNKNOWN_TOOL;
    }
    let allowed = record.outcome == RecordOutcome::Allow;
    Side {
        allowed,
        code: record.code.map(|code| code.as_str()),
        path: record.path.as_deref(),
        account: record.account_id.as_deref().filter(|_| allowed),
        ceiling: match (record.limit_calls, record.limit_per.as_deref()) {
            (Some(calls), Some(per)) if allowed => Some((calls, per)),
            _ => None,
        },
    }
}

/// The candidate's decision, as compared.
fn side<'d>(decision: &'d Decision<'d>) -> Side<'d> {
    match decision {
        Decision::Allow(allow) => Side {
            allowed: true,
            code: Some(allow.reason.code.as_str()),
            path: Some(allow.reason.path),
            account: Some(allow.account.id.as_str()),
            ceiling: allow.limits.map(|limits| (limits.calls, limits.per.as_str())),
        },
        Decision::Deny(reason) => Side {
            code: Some(reason.code.as_str()),
            path: Some(reason.path),
            ..NOTHING
        },
    }
}

/// The arguments to decide with: none when none were forwarded, the kept ones when kept. When
/// only their digest was kept, none — unless the candidate's decision reads an argument, which
/// then cannot be replayed.
fn arguments(
    record: &AuditRecord,
    prepared: &Prepared<'_>,
    capability: &str,
) -> Result<Option<Map<String, Value>>, Cause> {
    match (&record.arguments_digest, &record.arguments) {
        (None, _) => Ok(None),
        (Some(_), Some(kept)) => serde_json::from_str(kept)
            .map(Some)
            .map_err(|_| Cause::Unreadable),
        (Some(_), None) if prepared.reads_arguments(capability) => Err(Cause::ArgumentsNotKept),
        (Some(_), None) => Ok(None),
    }
}

/// The usage the record was decided with, and whether the record had a reading. `usage_calls` is
/// the window's calls including this one on an allow, the calls found on a denial
/// (src/service/pipeline/metering.rs); the call is decided on the calls before it, in a window
/// opened at its instant so that any candidate window still holds them. A record with no reading
/// (no ceiling applied) is decided on 0 calls.
fn usage(record: &AuditRecord) -> (Usage, bool) {
    let at = record.at_ms;
    if record
        .code
        .is_some_and(|code| code.as_str() == ReasonCode::UsageUnknown.as_str())
    {
        return (Usage::Unknown, true);
    }
    match record.usage_calls {
        Some(calls) => {
            let before = if record.outcome == RecordOutcome::Allow {
                calls.saturating_sub(1)
            } else {
                calls
            };
            (
                Usage::Counted {
                    calls: before,
                    window_start: at,
                },
                true,
            )
        }
        None => (
            Usage::Counted {
                calls: 0,
                window_start: at,
            },
            false,
        ),
    }
}

/// Replays every record of `window` in `store` under `policy`: pages read oldest first, each
/// while the one before is decided.
pub async fn replay<S: Store>(
    store: &S,
    policy: &CompiledPolicy,
    window: Window,
    examples: usize,
) -> StoreResult<Report> {
    // One page decided, one read, one waiting: memory stays three pages whatever the window.
    let (pages, mut received) = tokio::sync::mpsc::channel(1);
    let reader = tokio::spawn(read(store.clone(), window, pages));
    let mut replayer = Replayer::new(policy, examples);
    while let Some(page) = received.recv().await {
        let page: Vec<AuditRecord> = page?;
        for record in &page {
            replayer.record(record);
        }
    }
    // The reader sent its last page, or its error, and ended; a panic in it is a bug to show.
    if let Err(error) = reader.await {
        std::panic::resume_unwind(error.into_panic());
    }
    Ok(replayer.finish())
}

/// Sends the window's records, a page at a time, until the last page or an error.
async fn read<S: Store>(
    store: S,
    window: Window,
    pages: tokio::sync::mpsc::Sender<StoreResult<Vec<AuditRecord>>>,
) {
    let mut after: Option<AuditCursor> = None;
    loop {
        let filter = AuditFilter {
            since_ms: Some(window.since_ms),
            until_ms: Some(window.until_ms),
            after: after.clone(),
            oldest_first: true,
            limit: PAGE,
            ..AuditFilter::default()
        };
        let page = store.query_audit(&filter).await;
        let last = match &page {
            Ok(records) if records.len() as u64 == u64::from(PAGE) => {
                records.last().map(|last| AuditCursor {
                    at_ms: last.at_ms,
                    decision_id: last.decision_id.clone(),
                })
            }
            _ => None,
        };
        // The receiver gone (it failed on a page): nothing more to read for.
        if pages.send(page).await.is_err() {
            return;
        }
        match last {
            Some(cursor) => after = Some(cursor),
            None => return,
        }
    }
}
