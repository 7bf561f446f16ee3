//! capgate's own door: `capgate.v1.DecisionService` (`Decide`, `ListVisible`; docs/service.md),
//! a thin adapter over the decision pipeline. It authenticates the gateway from the call's
//! metadata, checks the input bounds, converts the request into an [`Ask`], and the pipeline's
//! answer into the response message. The decision itself is taken in `pipeline/`.

use std::collections::HashSet;
use std::sync::Arc;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::identity::Presented;
use crate::service::auth::Role;
use crate::service::bounds;
use crate::service::identify::{Asked, AssertedCaller};
use crate::service::pipeline::{self, Answer, Ask, Listing, Remember, Replied, Target, Verdict};
use crate::service::State;
use crate::store::{DecisionNote, Door, Note, Store};
use crate::telemetry::{throttle, Throttle};
use crate::wire::convert;
use crate::wire::proto::{
    self, credential, decide_request, decide_response, decision_service_server::DecisionService,
    list_visible_request, list_visible_response, AssertedPrincipal, Credential, DecideRequest,
    DecideResponse, ListVisibleRequest, ListVisibleResponse, NoteDecisionRequest, NoteDecisionResponse,
    NoteKind, PolicyRevision, Unauthenticated, UnknownTool, Visible, VisibleCapability, WatchPolicyRequest,
};

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
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        bounds::decide(&request)?;
        let DecideRequest {
            caller,
            target,
            request_id,
            arguments_json,
        } = &request;
        // Read only when sent: a call without arguments pays nothing for them.
        let arguments = arguments_json
            .as_deref()
            .map(bounds::arguments)
            .transpose()?
            .map(Arc::new);
        let active = pipeline::current(&self.state).map_err(super::status)?;
        let target = match target {
            Some(decide_request::Target::Tool(name)) => Target::Tool(name),
            Some(decide_request::Target::Capability(capability)) => Target::Capability(capability),
            // `bounds::decide` refused this already.
            None => return Err(Status::invalid_argument("`target`: required")),
        };
        let caller = match caller {
            Some(decide_request::Caller::Principal(principal)) => asserted(principal),
            Some(decide_request::Caller::Credential(credential)) => presented(credential),
            None => return Err(Status::invalid_argument("`caller`: required")),
        };
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id: (!request_id.is_empty()).then_some(request_id.as_str()),
            door: Door::Capgate,
            retry_facts: Vec::new(),
            arguments,
            replayable: pipeline::every_answer,
        };
        let encode: Remember = Arc::new(|answer: &Answer<'_>| response(answer).encode_to_vec());
        let replied = pipeline::decide(&self.state, &active, ask, target, &encode)
            .await
            .map_err(super::status)?;
        match replied {
            Replied::Fresh(answer) => Ok(Response::new(response(&answer))),
            Replied::Replayed(bytes) => DecideResponse::decode(bytes.as_slice())
                .map(Response::new)
                .map_err(|error| {
                    tracing::error!(%error, "a remembered response does not decode");
                    Status::internal("the remembered answer to this request_id cannot be read")
                }),
        }
    }

    async fn list_visible(
        &self,
        request: Request<ListVisibleRequest>,
    ) -> Result<Response<ListVisibleResponse>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        bounds::list_visible(&request)?;
        let active = pipeline::current(&self.state).map_err(super::status)?;
        let ListVisibleRequest { caller, request_id } = &request;
        let caller = match caller {
            Some(list_visible_request::Caller::Principal(principal)) => asserted(principal),
            Some(list_visible_request::Caller::Credential(credential)) => presented(credential),
            None => return Err(Status::invalid_argument("`caller`: required")),
        };
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id: (!request_id.is_empty()).then_some(request_id.as_str()),
            door: Door::Capgate,
            retry_facts: Vec::new(),
            arguments: None,
            replayable: pipeline::every_answer,
        };
        let listing = pipeline::list(&self.state, &active, ask)
            .await
            .map_err(super::status)?;
        Ok(Response::new(listed(&listing)))
    }

    type WatchPolicyStream = ReceiverStream<Result<PolicyRevision, Status>>;

    /// The active version now (once there is one) and at every installation. A watcher that
    /// falls behind gets the latest version, not every one in between; the stream ends when
    /// the watcher goes away or the server stops.
    async fn watch_policy(
        &self,
        request: Request<WatchPolicyRequest>,
    ) -> Result<Response<Self::WatchPolicyStream>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let mut installed = self.state.active.subscribe();
        let mut stopping = self.state.stopping.clone();
        let (sender, receiver) = mpsc::channel(1);
        tokio::spawn(async move {
            let mut sent: Option<u64> = None;
            loop {
                let current = installed.borrow_and_update().clone();
                if let Some(active) = current.filter(|active| sent != Some(active.revision)) {
                    sent = Some(active.revision);
                    let revision = PolicyRevision {
                        policy_revision: active.revision,
                        policy_version: active.version.clone(),
                        installed_at: Some(convert::timestamp(active.installed_at_ms)),
                    };
                    tokio::select! {
                        delivered = sender.send(Ok(revision)) => if delivered.is_err() { return },
                        _ = stopping.wait_for(|stop| *stop) => return,
                    }
                }
                tokio::select! {
                    changed = installed.changed() => if changed.is_err() { return },
                    () = sender.closed() => return,
                    _ = stopping.wait_for(|stop| *stop) => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn note_decision(
        &self,
        request: Request<NoteDecisionRequest>,
    ) -> Result<Response<NoteDecisionResponse>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        bounds::note_decision(&request)?;
        let NoteDecisionRequest {
            decision_id,
            kind,
            detail,
        } = request;
        let kind = match NoteKind::try_from(kind) {
            Ok(NoteKind::CredentialFailed) => Note::CredentialFailed,
            Ok(NoteKind::UpstreamFailed) => Note::UpstreamFailed,
            // `bounds::note_decision` refused this already.
            Ok(NoteKind::Unspecified) | Err(_) => return Err(Status::invalid_argument("`kind`: required")),
        };
        let note = DecisionNote {
            decision_id,
            gateway: gateway.name,
            kind,
            detail,
            at_ms: crate::clock::now(),
        };
        match tokio::time::timeout(self.state.store_timeout, self.state.store.note_decision(&note)).await {
            Ok(Ok(true)) => Ok(Response::new(NoteDecisionResponse {})),
            Ok(Ok(false)) => Err(Status::not_found(
                "`decision_id`: no allow with this id was given to this gateway",
            )),
            Ok(Err(error)) => {
                static FAILED: Throttle = Throttle::every(throttle::EVERY);
                if let Some(held_back) = FAILED.check() {
                    tracing::warn!(%error, notes_not_logged = held_back, "a decision note could not be stored");
                }
                Err(Status::unavailable(
                    "the audit store did not take the note; retry",
                ))
            }
            Err(_) => Err(Status::unavailable(
                "the audit store did not answer in time; retry",
            )),
        }
    }
}

fn asserted(principal: &AssertedPrincipal) -> Asked<'_> {
    let AssertedPrincipal {
        issuer,
        subject,
        attributes,
    } = principal;
    Asked::Principal(AssertedCaller {
        issuer,
        subject,
        attributes: attributes
            .iter()
            .flat_map(|attribute| {
                attribute
                    .values
                    .iter()
                    .map(|value| (attribute.name.as_str(), value.as_str()))
            })
            .collect(),
    })
}

fn presented(credential: &Credential) -> Asked<'_> {
    let Credential { kind, issuer } = credential;
    Asked::Credential {
        presented: kind.as_ref().map(|kind| match kind {
            credential::Kind::BearerToken(token) => Presented::BearerToken(token),
            credential::Kind::ApiKey(key) => Presented::ApiKey(key),
            credential::Kind::ClientCertificate(forwarded) => Presented::ClientCertificate(forwarded),
        }),
        hint: (!issuer.is_empty()).then_some(issuer.as_str()),
    }
}

/// The answer as `DecideResponse`.
fn response(answer: &Answer<'_>) -> DecideResponse {
    let Answer {
        decision_id,
        at_ms,
        active,
        verdict,
    } = answer;
    let result = match verdict {
        Verdict::Unauthenticated(problem) => decide_response::Result::Unauthenticated(Unauthenticated {
            problem: convert::auth_problem(*problem).into(),
            message: problem.describe().to_owned(),
        }),
        Verdict::UnknownTool(name) => decide_response::Result::UnknownTool(UnknownTool {
            name: name.clone(),
            message: convert::unknown_tool_message(name, &answer.active.policy.tools),
        }),
        Verdict::Decided(decided) => decide_response::Result::Decision(convert::decision(
            &decided.decision,
            active.document(),
            decided.secret_ref.map_or("", |secret_ref| secret_ref.as_str()),
            decided.standing,
            decided
                .tool
                .map(|(tool, transport)| convert::tool(tool, transport)),
            decided.resets_at,
        )),
    };
    DecideResponse {
        decision_id: decision_id.clone(),
        policy_version: active.version.clone(),
        policy_revision: active.revision,
        at: Some(convert::timestamp(*at_ms)),
        result: Some(result),
    }
}

/// The listing as `ListVisibleResponse`.
///
/// Every capability carries the listing's one `decision_id`: the record that says what was
/// visible (docs/service.md, "The audit trail").
fn listed(listing: &Listing<'_>) -> ListVisibleResponse {
    let Listing {
        decision_id,
        at_ms,
        active,
        seen,
    } = listing;
    let result = match seen {
        Err(problem) => list_visible_response::Result::Unauthenticated(Unauthenticated {
            problem: convert::auth_problem(*problem).into(),
            message: problem.describe().to_owned(),
        }),
        Ok(seen) => {
            // A tool is conditional when its capability is: every grant that shows it has
            // conditions, which a listing does not evaluate.
            let conditional: HashSet<&str> = seen
                .capabilities
                .iter()
                .filter(|item| item.conditional)
                .map(|item| item.capability.id.as_str())
                .collect();
            list_visible_response::Result::Visible(Visible {
                capabilities: seen
                    .capabilities
                    .iter()
                    .map(|item| VisibleCapability {
                        capability: item.capability.id.clone(),
                        account: Some(proto::Account {
                            id: item.account.id.clone(),
                            secret_ref: active
                                .policy
                                .account(&item.account.id)
                                .map_or(String::new(), |account| account.secret_ref.as_str().to_owned()),
                        }),
                        limits: item.limits.map(convert::ceiling),
                        path: item.path.to_owned(),
                        decision_id: decision_id.clone(),
                        conditional: item.conditional,
                    })
                    .collect(),
                tools: seen
                    .tools
                    .iter()
                    .map(|tool| convert::visible_tool(tool, conditional.contains(tool.capability.as_str())))
                    .collect(),
            })
        }
    };
    ListVisibleResponse {
        policy_version: active.version.clone(),
        policy_revision: active.revision,
        at: Some(convert::timestamp(*at_ms)),
        result: Some(result),
    }
}
