//! `DecisionService`: `Decide` and `ListVisible` (service.md §3–§5).
//!
//! A decision, step by step: capture `at` once → identify the caller (an
//! asserted principal from a trusted gateway, or the caller's own
//! credential, `identify.rs`) → resolve the tool → evaluate with the pure core → for an allow
//! whose winning grant has a ceiling, read the counter and consume one call
//! atomically → write the audit record (durable) → answer. Denials and
//! uncapped allows never touch the counter store: the first evaluation does
//! not consult usage, and usage can only turn an allow into a deny.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use prost::Message;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::store::{AuditRecord, Consumed, CounterKey, Remembered, Store};
use crate::telemetry;
use capgate_core::access::{evaluate, visible, Decision, Limits, Reason, ReasonCode, Usage};
use capgate_core::capabilities::ToolDescriptor;
use capgate_core::principals::Principal;

use super::active::Active;
use super::auth::{Caller, Role};
use super::identify::{identify, Asked};
use super::{bounds, State};
use crate::clock::now as now_ms;
use crate::wire::convert::{self, Standing};
use crate::wire::proto::{
    decide_request, decide_response, decision_service_server::DecisionService, list_visible_request,
    list_visible_response, DecideRequest, DecideResponse, ListVisibleRequest, ListVisibleResponse,
    Unauthenticated, UnknownTool, Visible, VisibleCapability,
};

/// How long a remembered response answers a retry with the same `request_id`.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// How many times a refused consumption is re-read and re-evaluated before
/// the answer is `limit_exhausted` regardless (the window keeps filling).
const CONSUME_ATTEMPTS: usize = 3;

/// The decision service over a store.
pub struct Decisions<S: Store> {
    state: Arc<State<S>>,
}

impl<S: Store> Decisions<S> {
    pub fn new(state: Arc<State<S>>) -> Self {
        Decisions { state }
    }
}

#[tonic::async_trait]
impl<S: Store> DecisionService for Decisions<S> {
    async fn decide(&self, request: Request<DecideRequest>) -> Result<Response<DecideResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        bounds::decide(&request)?;
        let active = self.state.current()?;
        if request.request_id.is_empty() {
            return decide(&self.state, &caller, &active, request)
                .await
                .map(Response::new);
        }
        // One decision per (gateway, request_id) at a time on this replica,
        // so that a retry racing its original waits for it and gets its answer.
        let _turn = self
            .state
            .idempotency
            .turn(&caller.name, &request.request_id)
            .await;
        if let Some(original) = remembered(&self.state, &caller.name, &request.request_id).await {
            return Ok(Response::new(original));
        }
        decide(&self.state, &caller, &active, request)
            .await
            .map(Response::new)
    }

    async fn list_visible(
        &self,
        request: Request<ListVisibleRequest>,
    ) -> Result<Response<ListVisibleResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        bounds::list_visible(&request)?;
        let active = self.state.current()?;
        list(&self.state, &caller, &active, request)
            .await
            .map(Response::new)
    }
}

/// The response first returned for this request id, while it is retained.
/// A store that does not answer means a fresh decision: with the store down
/// a capped decision cannot consume anyway (it denies `usage_unknown`).
async fn remembered<S: Store>(state: &State<S>, gateway: &str, request_id: &str) -> Option<DecideResponse> {
    let found = tokio::time::timeout(state.store_timeout, state.store.remembered(gateway, request_id)).await;
    let Remembered {
        decision_id,
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
    if now_ms().saturating_sub(at_ms) > IDEMPOTENCY_RETENTION_MS {
        return None;
    }
    match DecideResponse::decode(response.as_slice()) {
        Ok(original) => Some(original),
        Err(error) => {
            tracing::warn!(%decision_id, %error, "a remembered response does not decode; deciding afresh");
            None
        }
    }
}

/// The record every Decide writes, before its outcome is known.
fn base_record(caller: &Caller, active: &Active, at: i64, request_id: &str, kind: &str) -> AuditRecord {
    AuditRecord {
        decision_id: Uuid::now_v7().to_string(),
        at_ms: at,
        request_id: (!request_id.is_empty()).then(|| request_id.to_owned()),
        gateway: caller.name.clone(),
        kind: kind.to_owned(),
        policy_version: Some(active.version.clone()),
        policy_revision: Some(active.revision),
        ..AuditRecord::default()
    }
}

async fn decide<S: Store>(
    state: &State<S>,
    caller: &Caller,
    active: &Active,
    request: DecideRequest,
) -> Result<DecideResponse, Status> {
    let at = now_ms();
    let asked = match &request.caller {
        Some(decide_request::Caller::Principal(principal)) => Asked::Principal(principal),
        Some(decide_request::Caller::Credential(credential)) => Asked::Credential(credential),
        // `bounds::decide` refused this already.
        None => return Err(Status::invalid_argument("`caller`: required")),
    };
    let identity = identify(&state.oidc, active, caller, asked, at).await?;
    let mut record = base_record(caller, active, at, &request.request_id, "decide");
    record.issuer = identity.issuer;
    record.subject = identity.subject;
    let mut response = DecideResponse {
        decision_id: record.decision_id.clone(),
        policy_version: active.version.clone(),
        policy_revision: active.revision,
        at: Some(convert::timestamp(at)),
        result: None,
    };

    let principal = match identity.outcome {
        Ok(principal) => principal,
        Err(problem) => {
            record.outcome = "unauthenticated".to_owned();
            record.code = Some(problem.as_str().to_owned());
            response.result = Some(decide_response::Result::Unauthenticated(Unauthenticated {
                problem: convert::auth_problem(problem).into(),
            }));
            return finish(state, caller, &request.request_id, record, response).await;
        }
    };
    record.principal_id = Some(principal.id.clone());

    let (capability, tool): (String, Option<&ToolDescriptor>) = match &request.target {
        Some(decide_request::Target::Tool(name)) => {
            record.tool = Some(name.clone());
            match active.policy.tools.resolve(name) {
                Some(tool) => (tool.capability.clone(), Some(tool)),
                None => {
                    record.outcome = "unknown_tool".to_owned();
                    response.result = Some(decide_response::Result::UnknownTool(UnknownTool {
                        name: name.clone(),
                    }));
                    return finish(state, caller, &request.request_id, record, response).await;
                }
            }
        }
        Some(decide_request::Target::Capability(capability)) => (capability.clone(), None),
        None => return Err(Status::invalid_argument("`target`: required")),
    };
    record.capability = Some(capability.clone());

    let counted = evaluate_counted(state, active, &principal, &capability, at).await;
    let decision = &counted.decision;
    let Reason {
        code,
        path,
        subject: _,
    } = decision.reason();
    record.outcome = decision.outcome().to_owned();
    record.code = Some(code.as_str().to_owned());
    record.path = Some((*path).to_owned());
    record.limit_calls = counted.ceiling.map(|limits| limits.calls);
    record.limit_per = counted.ceiling.map(|limits| limits.per.clone());
    record.usage_calls = counted.usage_calls;

    let mut secret_ref = "";
    let mut tool_message = None;
    if let Decision::Allow(allow) = decision {
        record.account_id = Some(allow.account.id.clone());
        secret_ref = active
            .policy
            .account(&allow.account.id)
            .map_or("", |account| account.secret_ref.as_str());
        tool_message = tool.map(|tool| {
            let transport = active
                .policy
                .upstreams
                .iter()
                .find(|upstream| upstream.id == tool.upstream)
                .map(|upstream| &upstream.transport);
            convert::tool(tool, transport)
        });
    }
    response.result = Some(decide_response::Result::Decision(convert::decision(
        decision,
        active.document(),
        secret_ref,
        counted.standing,
        tool_message,
    )));
    finish(state, caller, &request.request_id, record, response).await
}

/// Writes the record (and the response to remember), then answers.
async fn finish<S: Store>(
    state: &State<S>,
    caller: &Caller,
    request_id: &str,
    record: AuditRecord,
    response: DecideResponse,
) -> Result<DecideResponse, Status> {
    let remembered = if request_id.is_empty() {
        Vec::new()
    } else {
        vec![(
            caller.name.clone(),
            request_id.to_owned(),
            Remembered {
                decision_id: response.decision_id.clone(),
                response: response.encode_to_vec(),
                at_ms: record.at_ms,
            },
        )]
    };
    telemetry::rpc::decided(&record);
    tracing::debug!(
        decision_id = %record.decision_id,
        outcome = %record.outcome,
        code = record.code.as_deref().unwrap_or(""),
        "decided"
    );
    state
        .audit
        .write(vec![record], remembered)
        .await
        .map_err(|_| Status::unavailable("the audit trail cannot be written, so no decision is returned"))?;
    Ok(response)
}

/// A decision with what the counter said.
struct Counted<'a> {
    decision: Decision<'a>,
    /// The winning grant's ceiling, when one applies.
    ceiling: Option<&'a Limits>,
    /// After a consumption: calls left and when the window ends.
    standing: Option<Standing>,
    /// The count the ceiling was checked against: the window's calls
    /// including this one on an allow, the calls found on `limit_exhausted`.
    usage_calls: Option<u64>,
}

async fn evaluate_counted<'a, S: Store>(
    state: &State<S>,
    active: &'a Active,
    principal: &Principal,
    capability: &'a str,
    at: i64,
) -> Counted<'a> {
    let ruleset = &active.policy.ruleset;
    let first = evaluate(ruleset, principal, capability, at, Usage::NotConsulted);
    let (path, ceiling) = match &first {
        Decision::Allow(allow) => match allow.limits {
            Some(ceiling) => (allow.reason.path, ceiling),
            None => {
                return Counted {
                    decision: first,
                    ceiling: None,
                    standing: None,
                    usage_calls: None,
                }
            }
        },
        Decision::Deny(_) => {
            return Counted {
                decision: first,
                ceiling: None,
                standing: None,
                usage_calls: None,
            }
        }
    };
    let key = CounterKey {
        principal_id: &principal.id,
        capability,
    };
    let timeout = state.store_timeout;
    for _ in 0..CONSUME_ATTEMPTS {
        let usage = read_usage(&state.store, key, at, timeout).await;
        let decision = evaluate(ruleset, principal, capability, at, usage);
        let found = match usage {
            Usage::Counted { calls, window_start } => {
                let expired = i128::from(at) - i128::from(window_start) >= i128::from(ceiling.window_ms);
                Some(if expired { 0 } else { calls })
            }
            Usage::Unknown | Usage::NotConsulted => None,
        };
        if !decision.is_allow() {
            return Counted {
                decision,
                ceiling: Some(ceiling),
                standing: None,
                usage_calls: found,
            };
        }
        let consumed = telemetry::counter_store(
            "consume",
            tokio::time::timeout(
                timeout,
                state.store.consume(key, at, ceiling.window_ms, ceiling.calls),
            ),
        )
        .await;
        match consumed {
            Ok(Ok(Consumed::Taken(now))) => {
                let window = i64::try_from(ceiling.window_ms).unwrap_or(i64::MAX);
                return Counted {
                    decision,
                    ceiling: Some(ceiling),
                    standing: Some(Standing {
                        remaining: ceiling.calls.saturating_sub(now.calls),
                        resets_at_ms: now.window_start_ms.saturating_add(window),
                    }),
                    usage_calls: Some(now.calls),
                };
            }
            // Another request took the last call: read again and decide again.
            Ok(Ok(Consumed::Refused)) => continue,
            Ok(Err(error)) => {
                tracing::warn!(%error, "the counter store failed to consume; usage unknown");
                return unknown(ruleset, principal, capability, at, ceiling);
            }
            Err(_) => {
                tracing::warn!("the counter store did not consume in time; usage unknown");
                return unknown(ruleset, principal, capability, at, ceiling);
            }
        }
    }
    // Refused every time: whatever the reads said, the window is full.
    Counted {
        decision: Decision::Deny(Reason {
            code: ReasonCode::LimitExhausted,
            path,
            subject: capability,
        }),
        ceiling: Some(ceiling),
        standing: None,
        usage_calls: Some(ceiling.calls),
    }
}

fn unknown<'a>(
    ruleset: &'a capgate_core::access::Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: i64,
    ceiling: &'a Limits,
) -> Counted<'a> {
    Counted {
        decision: evaluate(ruleset, principal, capability, at, Usage::Unknown),
        ceiling: Some(ceiling),
        standing: None,
        usage_calls: None,
    }
}

/// The counter as usage: no row is a fresh window at `at`; a failure or a
/// timeout is `Unknown` (never zero).
async fn read_usage<S: Store>(store: &S, key: CounterKey<'_>, at: i64, timeout: Duration) -> Usage {
    match telemetry::counter_store("read", tokio::time::timeout(timeout, store.read_usage(key))).await {
        Ok(Ok(Some(counted))) => Usage::Counted {
            calls: counted.calls,
            window_start: counted.window_start_ms,
        },
        Ok(Ok(None)) => Usage::Counted {
            calls: 0,
            window_start: at,
        },
        Ok(Err(error)) => {
            tracing::warn!(%error, "the counter store failed to read; usage unknown");
            Usage::Unknown
        }
        Err(_) => {
            tracing::warn!("the counter store did not answer in time; usage unknown");
            Usage::Unknown
        }
    }
}

async fn list<S: Store>(
    state: &State<S>,
    caller: &Caller,
    active: &Active,
    request: ListVisibleRequest,
) -> Result<ListVisibleResponse, Status> {
    let at = now_ms();
    let ListVisibleRequest {
        caller: asked,
        request_id,
    } = request;
    let asked = match &asked {
        Some(list_visible_request::Caller::Principal(principal)) => Asked::Principal(principal),
        Some(list_visible_request::Caller::Credential(credential)) => Asked::Credential(credential),
        None => return Err(Status::invalid_argument("`caller`: required")),
    };
    let identity = identify(&state.oidc, active, caller, asked, at).await?;
    let mut response = ListVisibleResponse {
        policy_version: active.version.clone(),
        policy_revision: active.revision,
        at: Some(convert::timestamp(at)),
        result: None,
    };
    let principal = match identity.outcome {
        Ok(principal) => principal,
        Err(problem) => {
            // Not in the spec's list (one allow per visible capability), but
            // every request is recorded: a refused listing says who tried.
            let mut record = base_record(caller, active, at, &request_id, "list");
            record.outcome = "unauthenticated".to_owned();
            record.code = Some(problem.as_str().to_owned());
            record.issuer = identity.issuer;
            record.subject = identity.subject;
            write(state, vec![record]).await?;
            response.result = Some(list_visible_response::Result::Unauthenticated(Unauthenticated {
                problem: convert::auth_problem(problem).into(),
            }));
            telemetry::rpc::listed(&response);
            return Ok(response);
        }
    };

    let seen = visible(&active.policy.ruleset, &principal, at);
    let mut records = Vec::with_capacity(seen.len());
    let mut capabilities = Vec::with_capacity(seen.len());
    for item in &seen {
        let mut record = base_record(caller, active, at, &request_id, "list");
        record.outcome = "allow".to_owned();
        record.code = Some(ReasonCode::Granted.as_str().to_owned());
        record.path = Some(item.path.to_owned());
        record.principal_id = Some(principal.id.clone());
        record.issuer = Some(principal.issuer.clone());
        record.subject = Some(principal.subject.clone());
        record.capability = Some(item.capability.id.clone());
        record.account_id = Some(item.account.id.clone());
        record.limit_calls = item.limits.map(|limits| limits.calls);
        record.limit_per = item.limits.map(|limits| limits.per.clone());
        capabilities.push(VisibleCapability {
            capability: item.capability.id.clone(),
            account: Some(crate::wire::proto::Account {
                id: item.account.id.clone(),
                secret_ref: active
                    .policy
                    .account(&item.account.id)
                    .map_or(String::new(), |account| account.secret_ref.as_str().to_owned()),
            }),
            limits: item.limits.map(convert::ceiling),
            path: item.path.to_owned(),
            decision_id: record.decision_id.clone(),
        });
        records.push(record);
    }
    let allowed: HashMap<&str, ()> = seen
        .iter()
        .map(|item| (item.capability.id.as_str(), ()))
        .collect();
    let tools = active
        .policy
        .tools
        .realizing(|capability| allowed.contains_key(capability))
        .map(convert::visible_tool)
        .collect();
    if !records.is_empty() {
        write(state, records).await?;
    }
    response.result = Some(list_visible_response::Result::Visible(Visible {
        capabilities,
        tools,
    }));
    telemetry::rpc::listed(&response);
    Ok(response)
}

async fn write<S: Store>(state: &State<S>, records: Vec<AuditRecord>) -> Result<(), Status> {
    state
        .audit
        .write(records, Vec::new())
        .await
        .map(|_| ())
        .map_err(|_| Status::unavailable("the audit trail cannot be written, so no answer is returned"))
}

/// Per-key turns: a retry that arrives while its original is still being
/// decided waits for it, then finds its remembered response.
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
