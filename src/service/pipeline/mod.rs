//! The decision pipeline: one place where a caller's question becomes an audited answer, whatever
//! door it came through (capgate's gRPC `DecisionService` today; Envoy ext_authz, agentgateway's
//! ExtMCP and AuthZEN over HTTP are adapters over the same two functions).
//!
//! A decision, step by step ([`decide`]): capture `at` once → identify the caller (an asserted
//! principal from a trusted gateway, or the caller's own credential; `identify.rs`) → resolve the
//! tool → evaluate with the pure core → write the audit record (durable; built in `record.rs`) →
//! answer. An allow whose winning grant has a ceiling is counted by the audit writer in the
//! transaction that stores its record, and decided again with what counting found
//! (`metering.rs`, docs/decisions/0025). A listing ([`list`]) is the same function per capability, without counters.
//!
//! Everything here speaks domain types: an [`Ask`] in, an [`Answer`] or a [`Listing`] out, a
//! [`Refusal`] when there is no answer to give. A door converts its protocol's request into an
//! `Ask` and the answer into its protocol's response, and adds nothing else.

mod arguments;
mod idempotency;
mod metering;
mod record;
mod shadow;

use std::collections::HashSet;
use std::sync::Arc;

use capgate_core::access::{visible, CapabilityRule, Decision, Limits, Standing, Usage, VisibleCapability};
use capgate_core::accounts::SecretRef;
use capgate_core::capabilities::{ToolDescriptor, Transport};
use capgate_core::principals::{AuthProblem, Principal};

use crate::store::{AuditRecord, Door, Fingerprint, Remembered, RememberedEntry, Store, Tally};
use crate::telemetry;

use super::active::Active;
use super::audit::Meter;
use super::auth::Gateway;
use super::identify::{identify, Asked};
use super::State;

use arguments::Recorded;
pub use idempotency::{Idempotency, CLAIM_LEASE_MS, IDEMPOTENCY_RETENTION_MS};
use idempotency::{Keyed, Turn};

/// A caller's question, as every door asks it.
pub struct Ask<'a> {
    /// The gateway that asks, as authenticated by the door.
    pub gateway: &'a Gateway,
    /// Who the call is for: asserted by the gateway, or the caller's own credential.
    pub caller: Asked<'a>,
    /// The gateway's own id for this request: a retry with the same id gets the same answer.
    pub request_id: Option<&'a str>,
    /// The protocol the request came through: recorded, and the scope of `request_id` (the
    /// same id through two doors is two requests, each answered in its own encoding).
    pub door: Door,
    /// What else tells this request from another that carries the same `request_id`, as the
    /// door knows it: `(name, value)` facts that enter the request's fingerprint and nothing
    /// else (docs/decisions/0027 §1). ext_authz: when Envoy received the request, and the
    /// JSON-RPC id its answer echoes. Empty on the other doors.
    pub retry_facts: Vec<(&'static str, String)>,
    /// The tool call's arguments, as the door received them; `None` when the door was not
    /// given them (a grant whose conditions read one then does not apply: docs/decisions/0034).
    pub arguments: Option<Arc<CallArguments>>,
    /// Whether a remembered answer (as the door encoded it) may be given to a retry:
    /// [`every_answer`] on every door but forward-auth, which replays denials only
    /// (docs/decisions/0029 §5).
    pub replayable: fn(&[u8]) -> bool,
}

/// A tool call's `arguments` object.
pub type CallArguments = serde_json::Map<String, serde_json::Value>;

/// Every remembered answer may be given again: the gateway executes a call once, whatever number
/// of times it asked.
pub fn every_answer(_remembered: &[u8]) -> bool {
    true
}

/// What the caller wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// An exposed tool name (`<upstream>__<tool>`), resolved through the active catalog.
    Tool(&'a str),
    /// A capability id, asked for directly.
    Capability(&'a str),
}

/// Why there is no answer at all (as opposed to a denial, which is an answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The gateway may not ask this way (an assertion from a gateway not trusted to assert).
    #[error("{0}")]
    PermissionDenied(String),
    /// The service cannot answer now: no active version, an identity provider or the audit trail
    /// out of reach. The caller may retry.
    #[error("{0}")]
    Unavailable(String),
    /// The request's `request_id` belongs to another request (docs/decisions/0027): nothing was
    /// decided or consumed. A door words it with [`reused`], naming the field the id came in.
    #[error("{}", reused("request_id", request_id, *reuse))]
    RequestIdReused { request_id: String, reuse: Reuse },
}

/// How a request id was reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// For another request: another caller, target or input.
    OtherRequest,
    /// For the same request, after an allow that the door does not give twice: a proxy that
    /// forwards the request on every allow would run the call again, past its ceiling.
    AllowGiven,
}

/// The words a reused request id is refused with, naming `field`, where the door read it.
pub fn reused(field: &str, request_id: &str, reuse: Reuse) -> String {
    match reuse {
        Reuse::OtherRequest => format!(
            "`{field}` `{request_id}` was already used for another request (another caller, target or \
             input): a retry must repeat its request exactly, and a new request needs a new id"
        ),
        Reuse::AllowGiven => format!(
            "`{field}` `{request_id}` already let a request through: this door allows a request id \
             once, so each request needs a new id"
        ),
    }
}

/// A decision, taken on the version `active` holds; it borrows from that version.
pub struct Answer<'a> {
    /// UUIDv7, the audit record's key.
    pub decision_id: String,
    /// The decision's instant, milliseconds since the Unix epoch.
    pub at_ms: i64,
    pub active: &'a Active,
    pub verdict: Verdict<'a>,
}

/// What was decided.
pub enum Verdict<'a> {
    /// The caller could not be identified: no decision was taken.
    Unauthenticated(AuthProblem),
    /// The tool asked for is not in the active catalog.
    UnknownTool(String),
    /// The core's decision, with what the service adds to an allow.
    Decided(Decided<'a>),
}

/// The core's decision and, on an allow, what the gateway needs to execute the call.
pub struct Decided<'a> {
    pub decision: Decision<'a>,
    /// On an allow: the execution account's secret reference (never the secret).
    pub secret_ref: Option<&'a SecretRef>,
    /// On an allow under a ceiling: calls left and when the window ends, after this call.
    pub standing: Option<Standing>,
    /// On an allow asked for by tool name: the tool and the transport that reaches it.
    pub tool: Option<(&'a ToolDescriptor, Option<&'a Transport>)>,
    /// On `limit_exhausted` (always set then): when the full window ends, the earliest a retry
    /// can be allowed.
    pub resets_at: Option<i64>,
}

/// How a door encodes an answer to remember it for a retry with the same `request_id`. Shared,
/// because a capped call's answer is made, and remembered, inside the audit batch that counts it.
pub type Remember = Arc<dyn Fn(&Answer<'_>) -> Vec<u8> + Send + Sync>;

/// A decision's answer: fresh, or the one a retry's original got.
pub enum Replied<'a> {
    Fresh(Answer<'a>),
    /// The encoded answer the door remembered for this `request_id` the first time.
    Replayed(Vec<u8>),
}

/// A listing: what the caller may see, on the version `active` holds.
pub struct Listing<'a> {
    /// UUIDv7 of the listing's one audit record.
    pub decision_id: String,
    pub at_ms: i64,
    pub active: &'a Active,
    pub seen: Result<Seen<'a>, AuthProblem>,
}

/// The visible capabilities and the tools realising them.
pub struct Seen<'a> {
    /// In declaration order.
    pub capabilities: Vec<VisibleCapability<'a>>,
    /// Visible tools, in catalog order.
    pub tools: Vec<&'a ToolDescriptor>,
}

/// Decides one call and returns once its audit record is durable. `remember` encodes the answer
/// as the door will want it back for a retry with the same `request_id`; it is stored in the
/// same commit as the record. A request that reuses a `request_id` of another request is
/// refused ([`Refusal::RequestIdReused`]), recorded, and decides nothing.
pub async fn decide<'a, S: Store>(
    state: &State<S>,
    active: &'a Arc<Active>,
    ask: Ask<'_>,
    target: Target<'a>,
    remember: &Remember,
) -> Result<Replied<'a>, Refusal> {
    // Made once per request: the fingerprint and every record of the request take the digest.
    let arguments = ask
        .arguments
        .as_deref()
        .map(|arguments| Recorded::of(arguments, &state.audit_arguments));
    let arguments = arguments.as_ref();
    let Some(request_id) = ask.request_id else {
        return decide_once(state, active, &ask, target, arguments, None, remember)
            .await
            .map(Replied::Fresh);
    };
    let digest = arguments.map(|arguments| arguments.digest.as_str());
    let keyed = state.idempotency.keyed(&ask, request_id, target, digest);
    // One decision per (gateway, request_id) at a time on this replica, so that a retry racing
    // its original waits for it here rather than polling the store.
    let _turn = state.idempotency.turn(&ask.gateway.name, &keyed.key).await;
    match idempotency::claim(state, &ask.gateway.name, &keyed).await? {
        Turn::Decide => decide_once(state, active, &ask, target, arguments, Some(&keyed), remember)
            .await
            .map(Replied::Fresh),
        Turn::Replay(original) if !(ask.replayable)(&original.response) => {
            reused_id(state, active, &ask, target, arguments, Some(original.decision_id)).await?;
            Err(Refusal::RequestIdReused {
                request_id: request_id.to_owned(),
                reuse: Reuse::AllowGiven,
            })
        }
        Turn::Replay(original) => {
            let record = record::Base::new(&ask, active, crate::clock::now(), arguments)
                .replayed(target, &original.decision_id);
            write(state, record).await?;
            telemetry::rpc::request_id(ask.door, telemetry::rpc::RequestIdUse::Replayed);
            Ok(Replied::Replayed(original.response))
        }
        Turn::Reused { first } => {
            reused_id(state, active, &ask, target, arguments, first).await?;
            Err(Refusal::RequestIdReused {
                request_id: request_id.to_owned(),
                reuse: Reuse::OtherRequest,
            })
        }
    }
}

/// Records a request refused for reusing another request's `request_id`: who tried (identified as
/// any caller is, but decided nothing), what they asked for, and the decision the id belongs to.
async fn reused_id<S: Store>(
    state: &State<S>,
    active: &Arc<Active>,
    ask: &Ask<'_>,
    target: Target<'_>,
    arguments: Option<&Recorded>,
    first: Option<String>,
) -> Result<(), Refusal> {
    let at_ms = crate::clock::now();
    let identified = match identify(&state.oidc, active, ask.gateway, &ask.caller, at_ms).await {
        Ok(identified) => Some(identified),
        // The gateway may not ask this way at all: that refusal comes first, as for any request.
        Err(refusal @ Refusal::PermissionDenied(_)) => return Err(refusal),
        // Who it was cannot be told now (an identity provider out of reach): recorded as asked.
        Err(_) => None,
    };
    let record = record::Base::new(ask, active, at_ms, arguments).reused(identified.as_ref(), target, first);
    write(state, record).await?;
    telemetry::rpc::request_id(ask.door, telemetry::rpc::RequestIdUse::Reused);
    Ok(())
}

async fn decide_once<'a, S: Store>(
    state: &State<S>,
    active: &'a Arc<Active>,
    ask: &Ask<'_>,
    target: Target<'a>,
    arguments: Option<&Recorded>,
    keyed: Option<&Keyed>,
    remember: &Remember,
) -> Result<Answer<'a>, Refusal> {
    let at_ms = crate::clock::now();
    let identified = identify(&state.oidc, active, ask.gateway, &ask.caller, at_ms).await?;
    let mut record = record::Base::new(ask, active, at_ms, arguments).decide(&identified, target);
    let principal = match identified.outcome {
        Ok(principal) => principal,
        Err(problem) => {
            let answer = Answer {
                decision_id: record.decision_id.clone(),
                at_ms,
                active,
                verdict: Verdict::Unauthenticated(problem),
            };
            record::unauthenticated(&mut record, problem);
            return finish(state, ask, keyed, record, answer, remember).await;
        }
    };
    record::principal(&mut record, &principal);

    let (capability, tool): (&str, Option<&'a ToolDescriptor>) = match target {
        Target::Tool(name) => match active.policy.tools.resolve(name) {
            Some(tool) => (tool.capability.as_str(), Some(tool)),
            None => {
                record::unknown_tool(&mut record);
                if let Some(shadow) = state.active.shadow() {
                    let arguments = ask.arguments.as_deref();
                    record.shadow = shadow::decided(
                        &record,
                        &shadow,
                        &principal,
                        Some(name),
                        "",
                        arguments,
                        Usage::NotConsulted,
                    );
                }
                let answer = Answer {
                    decision_id: record.decision_id.clone(),
                    at_ms,
                    active,
                    verdict: Verdict::UnknownTool(name.to_owned()),
                };
                return finish(state, ask, keyed, record, answer, remember).await;
            }
        },
        Target::Capability(capability) => (capability, None),
    };

    let prepared = active.policy.ruleset.prepare(&principal);
    let arguments = ask.arguments.as_deref();
    let ask_to_count = match metering::first(&prepared, &principal.id, capability, at_ms, arguments) {
        metering::First::Final(metered) => {
            let answer = answered(active, &mut record, capability, tool, metered);
            if let Some(shadow) = state.active.shadow() {
                let asked_tool = match target {
                    Target::Tool(name) => Some(name),
                    Target::Capability(_) => None,
                };
                record.shadow = shadow::decided(
                    &record,
                    &shadow,
                    &principal,
                    asked_tool,
                    capability,
                    arguments,
                    Usage::NotConsulted,
                );
            }
            return finish(state, ask, keyed, record, answer, remember).await;
        }
        metering::First::Capped(ask_to_count) => ask_to_count,
    };
    // The record is made inside the batch's transaction, once the call is counted, by the
    // same function the answer is made by below.
    let capped = Arc::new(Capped {
        active: active.clone(),
        principal,
        capability: capability.to_owned(),
        target_tool: match target {
            Target::Tool(name) => Some(name.to_owned()),
            Target::Capability(_) => None,
        },
        record,
        arguments: ask.arguments.clone(),
        shadow: state.active.shadow(),
        remembered: keyed.map(|keyed| (ask.gateway.name.clone(), keyed.key.clone(), keyed.fingerprint)),
        remember: remember.clone(),
    });
    let settling = capped.clone();
    let meter = Meter {
        ask: ask_to_count,
        settle: Arc::new(move |tally| settling.entries(tally)),
    };
    let (_, tally) = state.audit.count(meter).await.map_err(|_| {
        Refusal::Unavailable("the audit trail cannot be written, so no decision is returned".to_owned())
    })?;
    let mut record = capped.record.clone();
    let prepared = active.policy.ruleset.prepare(&capped.principal);
    let metered = metering::settled(&prepared, capability, at_ms, arguments, tally);
    let answer = answered(active, &mut record, capability, tool, metered);
    // As the writer made it in the batch: the same inputs give the same shadow side.
    record.shadow = capped.shadow_side(&record, tally);
    decided_log(&record);
    Ok(answer)
}

/// A capped call, owned, so that the audit writer can finish its record inside the batch's
/// transaction once the call is counted.
struct Capped {
    active: Arc<Active>,
    principal: Principal,
    capability: String,
    /// The tool asked for, when asked for by tool name (resolved on `active`).
    target_tool: Option<String>,
    /// The record as far as it is known before counting.
    record: AuditRecord,
    /// The call's arguments, which the decision is taken again on.
    arguments: Option<Arc<CallArguments>>,
    /// The shadow version when the call was asked, evaluated beside the active one.
    shadow: Option<Arc<Active>>,
    /// `(gateway, request key, fingerprint)` when the answer is remembered for retries.
    remembered: Option<(String, String, Fingerprint)>,
    remember: Remember,
}

impl Capped {
    /// The record and the remembered answer of this call, counted as `tally` says.
    fn entries(&self, tally: Option<Tally>) -> (Vec<AuditRecord>, Vec<RememberedEntry>) {
        let active = &self.active;
        let tool = self
            .target_tool
            .as_deref()
            .and_then(|name| active.policy.tools.resolve(name));
        let prepared = active.policy.ruleset.prepare(&self.principal);
        let arguments = self.arguments.as_deref();
        let metered = metering::settled(&prepared, &self.capability, self.record.at_ms, arguments, tally);
        let mut record = self.record.clone();
        let answer = answered(active, &mut record, &self.capability, tool, metered);
        record.shadow = self.shadow_side(&record, tally);
        let remembered = self.remembered.iter().map(|(gateway, key, fingerprint)| {
            (
                gateway.clone(),
                key.clone(),
                Remembered {
                    decision_id: answer.decision_id.clone(),
                    response: (self.remember)(&answer),
                    at_ms: answer.at_ms,
                    fingerprint: Some(*fingerprint),
                },
            )
        });
        let remembered = remembered.collect();
        (vec![record], remembered)
    }
}

impl Capped {
    /// The shadow's side of this call, counted as `tally` says, when a shadow decides otherwise
    /// than `record` (complete) says the active version did.
    fn shadow_side(
        &self,
        record: &AuditRecord,
        tally: Option<Tally>,
    ) -> Option<Box<crate::store::ShadowSide>> {
        let shadow = self.shadow.as_deref()?;
        shadow::decided(
            record,
            shadow,
            &self.principal,
            self.target_tool.as_deref(),
            &self.capability,
            self.arguments.as_deref(),
            metering::usage_of(tally),
        )
    }
}

/// The answer to a decided call, and its record completed.
fn answered<'a>(
    active: &'a Active,
    record: &mut AuditRecord,
    capability: &'a str,
    tool: Option<&'a ToolDescriptor>,
    metered: Metered<'a>,
) -> Answer<'a> {
    record::decided(record, capability, &metered);
    let decision = metered.decision;
    let mut decided = Decided {
        decision,
        secret_ref: None,
        standing: None,
        tool: None,
        resets_at: metered.resets_at,
    };
    if let Decision::Allow(allow) = decision {
        decided.secret_ref = active
            .policy
            .account(&allow.account.id)
            .map(|account| &account.secret_ref);
        decided.standing = metered.standing;
        decided.tool = tool.map(|tool| (tool, route(active, tool)));
    }
    Answer {
        decision_id: record.decision_id.clone(),
        at_ms: record.at_ms,
        active,
        verdict: Verdict::Decided(decided),
    }
}

/// The transport of the upstream that serves `tool`.
fn route<'a>(active: &'a Active, tool: &ToolDescriptor) -> Option<&'a Transport> {
    active
        .policy
        .upstreams
        .iter()
        .find(|upstream| upstream.id == tool.upstream)
        .map(|upstream| &upstream.transport)
}

/// Writes the record (and the answer to remember), then answers.
async fn finish<'a, S: Store>(
    state: &State<S>,
    ask: &Ask<'_>,
    keyed: Option<&Keyed>,
    record: crate::store::AuditRecord,
    answer: Answer<'a>,
    remember: &Remember,
) -> Result<Answer<'a>, Refusal> {
    let remembered = match keyed {
        None => Vec::new(),
        Some(keyed) => vec![(
            ask.gateway.name.clone(),
            keyed.key.clone(),
            Remembered {
                decision_id: answer.decision_id.clone(),
                response: remember(&answer),
                at_ms: record.at_ms,
                fingerprint: Some(keyed.fingerprint),
            },
        )],
    };
    decided_log(&record);
    state.audit.write(vec![record], remembered).await.map_err(|_| {
        Refusal::Unavailable("the audit trail cannot be written, so no decision is returned".to_owned())
    })?;
    Ok(answer)
}

/// Counts and logs a decision that is being answered.
fn decided_log(record: &AuditRecord) {
    telemetry::rpc::decided(record);
    shadow::count(record);
    tracing::debug!(
        decision_id = %record.decision_id,
        outcome = record.outcome.as_str(),
        code = record.code.map_or("", |code| code.as_str()),
        "decided"
    );
}

/// Lists what the caller may see and returns once the listing's audit record is durable: one
/// record per listing, whatever it shows — how many capabilities and which (bounded, `record.rs`),
/// or who tried when the caller could not be identified. A record per visible capability made
/// a listing of a big grant set one transaction of as many rows, past the audit deadline
/// (docs/decisions/0015-bounded-listing-and-publish.md).
pub async fn list<'a, S: Store>(
    state: &State<S>,
    active: &'a Active,
    ask: Ask<'_>,
) -> Result<Listing<'a>, Refusal> {
    let at_ms = crate::clock::now();
    let identified = identify(&state.oidc, active, ask.gateway, &ask.caller, at_ms).await?;
    // A listing is about no call: it has no arguments.
    let mut record = record::Base::new(&ask, active, at_ms, None).list(&identified);
    let decision_id = record.decision_id.clone();
    let principal = match &identified.outcome {
        Ok(principal) => principal,
        Err(problem) => {
            let problem = *problem;
            // Every request is recorded: a refused listing says who tried.
            record::unauthenticated(&mut record, problem);
            write(state, record).await?;
            telemetry::rpc::listed(active.revision, &active.version, Err(problem));
            return Ok(Listing {
                decision_id,
                at_ms,
                active,
                seen: Err(problem),
            });
        }
    };

    let capabilities = visible(&active.policy.ruleset, principal, at_ms);
    record::listed(&mut record, principal, &capabilities);
    if let Some(shadow) = state.active.shadow() {
        record.shadow = shadow::listed(&record, &shadow, principal, &capabilities);
        shadow::count(&record);
    }
    let allowed: HashSet<&'a str> = capabilities
        .iter()
        .map(|item| {
            let capability: &'a CapabilityRule = item.capability;
            capability.id.as_str()
        })
        .collect();
    let tools: Vec<&ToolDescriptor> = active
        .policy
        .tools
        .realizing(move |capability| allowed.contains(capability))
        .collect();
    write(state, record).await?;
    telemetry::rpc::listed(active.revision, &active.version, Ok(capabilities.len()));
    Ok(Listing {
        decision_id,
        at_ms,
        active,
        seen: Ok(Seen { capabilities, tools }),
    })
}

async fn write<S: Store>(state: &State<S>, record: crate::store::AuditRecord) -> Result<(), Refusal> {
    state
        .audit
        .write(vec![record], Vec::new())
        .await
        .map(|_| ())
        .map_err(|_| {
            Refusal::Unavailable("the audit trail cannot be written, so no answer is returned".to_owned())
        })
}

/// A decision with what the counter said (`metering.rs` fills it, `record.rs` reads it).
struct Metered<'a> {
    pub decision: Decision<'a>,
    /// The winning grant's ceiling, when one applies.
    pub ceiling: Option<&'a Limits>,
    /// After a consumption: calls left and when the window ends.
    pub standing: Option<Standing>,
    /// The count the ceiling was checked against: the window's calls including this one on an
    /// allow, the calls found on `limit_exhausted`.
    pub usage_calls: Option<u64>,
    /// On `limit_exhausted`: when the full window ends.
    pub resets_at: Option<i64>,
}

/// The version to decide on; fail closed without one.
pub fn current<S: Store>(state: &State<S>) -> Result<Arc<Active>, Refusal> {
    state
        .active
        .current()
        .ok_or_else(|| Refusal::Unavailable("no policy version is active: publish one first".to_owned()))
}
