//! `request_id` idempotency (docs/service.md): a retry of a request with the same
//! `(gateway, request_id)` gets the answer its original got, and consumes nothing, whichever
//! replica it reaches — and only a retry: a request that reuses the id for anything else (another
//! caller, target or input) is refused (docs/decisions/0027-a-request-id-answers-only-its-request.md).
//!
//! What "the same request" is, is its [`fingerprint`]: a keyed digest of the door, the gateway,
//! the caller as presented, the target and the door's own facts. On one replica, a retry racing
//! its original waits for its turn ([`Turns`]); across replicas, the first copy claims the id in
//! the store with its fingerprint and the others wait for its answer ([`claim`]). The original's
//! encoded answer is stored with its audit record and read back from the store.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ring::hmac;

use crate::identity::Presented;
use crate::service::identify::Asked;
use crate::service::State;
use crate::store::{Claim, Door, Fingerprint, Remembered, Store};
use crate::telemetry::{throttle, Throttle};

use super::{Ask, Refusal, Target};

/// How long a remembered response answers a retry with the same `request_id`.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// How long a claim holds off other copies of its request before it counts as abandoned: far
/// longer than any decision takes to be answered (a counter, an audit commit, an identity
/// provider's keys), short enough that a retry after a replica died mid-decision is answered.
pub const CLAIM_LEASE_MS: i64 = 30_000;

/// The key a request id is remembered under: as given through capgate's own door (as it always
/// was), prefixed with the door's name through any other, whose answers are encoded differently.
pub(super) fn key(door: Door, request_id: &str) -> Cow<'_, str> {
    match door {
        Door::Capgate => Cow::Borrowed(request_id),
        other => Cow::Owned(format!("{}:{request_id}", other.as_str())),
    }
}

/// A request with a `request_id`, as the store knows it: the door-scoped key and the request's
/// fingerprint.
pub(super) struct Keyed {
    pub key: String,
    pub fingerprint: Fingerprint,
}

/// What this replica keeps for idempotency: the per-key turns and the deployment's fingerprint
/// key (the same on every replica: it is read from the store at start).
pub struct Idempotency {
    turns: Turns,
    key: hmac::Key,
}

impl Idempotency {
    /// `key`: the deployment's 32-byte fingerprint key (`Store::request_key`).
    pub fn new(key: &[u8; 32]) -> Idempotency {
        Idempotency {
            turns: Turns::default(),
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// The request `ask` for `target`, keyed for the store. `arguments`: the digest of the call's
    /// arguments, when the door was given them (`arguments.rs`).
    pub(super) fn keyed(
        &self,
        ask: &Ask<'_>,
        request_id: &str,
        target: Target<'_>,
        arguments: Option<&str>,
    ) -> Keyed {
        Keyed {
            key: key(ask.door, request_id).into_owned(),
            fingerprint: fingerprint(&self.key, ask, target, arguments),
        }
    }
}

/// The fingerprint of a request: HMAC-SHA256 under the deployment's key of every part that makes
/// it this request (docs/decisions/0027 §1), each part length-prefixed so that no two different
/// requests encode alike. The credential enters only the digest; nothing of it is kept.
///
/// The call's arguments enter as the digest of their canonical JSON, so that a retry must carry
/// the same arguments (in any member order) and the same id with other arguments is another
/// request. They are the last part, and only when there are any: a request without arguments
/// encodes as it did before arguments existed, so ids claimed by an older build still match.
fn fingerprint(key: &hmac::Key, ask: &Ask<'_>, target: Target<'_>, arguments: Option<&str>) -> Fingerprint {
    let mut digest = Parts(hmac::Context::with_key(key));
    digest.text("capgate request v1");
    digest.text(ask.door.as_str());
    digest.text(&ask.gateway.name);
    match &ask.caller {
        Asked::Principal(asserted) => {
            digest.text("principal");
            digest.text(asserted.issuer);
            digest.text(asserted.subject);
            // The order attributes are given in means nothing.
            let mut attributes = asserted.attributes.clone();
            attributes.sort_unstable();
            digest.count(attributes.len());
            for (name, value) in attributes {
                digest.text(name);
                digest.text(value);
            }
        }
        Asked::Credential { presented, hint } => {
            digest.text("credential");
            digest.presented(*presented);
            digest.optional(*hint);
        }
        Asked::CredentialOf {
            presented,
            hint,
            subject,
        } => {
            digest.text("credential of");
            digest.presented(*presented);
            digest.optional(*hint);
            digest.text(subject);
        }
    }
    match target {
        Target::Tool(name) => {
            digest.text("tool");
            digest.text(name);
        }
        Target::Capability(id) => {
            digest.text("capability");
            digest.text(id);
        }
    }
    digest.count(ask.retry_facts.len());
    for (name, value) in &ask.retry_facts {
        digest.text(name);
        digest.text(value);
    }
    // INVARIANT: the last part. The facts before it are counted, so what follows them is told
    // apart from them.
    if let Some(arguments) = arguments {
        digest.text("arguments");
        digest.text(arguments);
    }
    let tag = digest.0.sign();
    let mut fingerprint = [0; 32];
    fingerprint.copy_from_slice(tag.as_ref());
    fingerprint
}

/// The digest being fed, one length-prefixed part at a time.
struct Parts(hmac::Context);

impl Parts {
    fn count(&mut self, count: usize) {
        self.0.update(&(count as u64).to_be_bytes());
    }

    fn text(&mut self, text: &str) {
        self.count(text.len());
        self.0.update(text.as_bytes());
    }

    fn optional(&mut self, text: Option<&str>) {
        match text {
            None => self.text("none"),
            Some(text) => {
                self.text("some");
                self.text(text);
            }
        }
    }

    fn presented(&mut self, presented: Option<Presented<'_>>) {
        let (kind, text) = match presented {
            None => ("no credential", ""),
            Some(Presented::BearerToken(text)) => ("bearer token", text),
            Some(Presented::ApiKey(text)) => ("api key", text),
            Some(Presented::ClientCertificate(text)) => ("client certificate", text),
        };
        self.text(kind);
        self.text(text);
    }
}

/// What a decision with a `request_id` should do.
pub(super) enum Turn {
    /// Decide: this call holds the claim, or the store could not say (see [`claim`]).
    Decide,
    /// The same request was answered: answer with what the original was answered.
    Replay(Remembered),
    /// The id belongs to another request: refuse. The decision it belongs to, once known.
    Reused { first: Option<String> },
}

/// Every request meets a store outage: its line is written at most every [`throttle::EVERY`].
static CLAIMS_FAILING: Throttle = Throttle::every(throttle::EVERY);

/// Claims the request id in the store, shared by every replica, so that one decision is taken
/// for it whichever replica each copy reached (docs/decisions/0016-idempotency-across-replicas.md),
/// and only for the request that claimed it first (docs/decisions/0027). A copy that finds the
/// claim taken by the same request waits for the holder's answer. A store that does not answer
/// means a fresh decision: with the store down a capped decision cannot consume anyway (it denies
/// `usage_unknown`), so at most one call is consumed still.
pub(super) async fn claim<S: Store>(state: &State<S>, gateway: &str, keyed: &Keyed) -> Result<Turn, Refusal> {
    let now = crate::clock::now();
    let claimed = tokio::time::timeout(
        state.store_timeout,
        state.store.claim_request(
            gateway,
            &keyed.key,
            &keyed.fingerprint,
            now,
            now.saturating_sub(CLAIM_LEASE_MS),
        ),
    )
    .await;
    match claimed {
        Ok(Ok(Claim::Won)) => Ok(Turn::Decide),
        Ok(Ok(Claim::Answered(answer))) => Ok(answered(answer, keyed)),
        Ok(Ok(Claim::Taken { fingerprint })) if same(fingerprint.as_ref(), &keyed.fingerprint) => {
            wait_for_answer(state, gateway, keyed).await
        }
        Ok(Ok(Claim::Taken { .. })) => Ok(Turn::Reused { first: None }),
        Ok(Err(error)) => {
            if let Some(held_back) = CLAIMS_FAILING.check() {
                tracing::warn!(%error, requests_not_logged = held_back, "cannot claim the request id; deciding afresh");
            }
            Ok(Turn::Decide)
        }
        Err(_) => {
            if let Some(held_back) = CLAIMS_FAILING.check() {
                tracing::warn!(
                    requests_not_logged = held_back,
                    "claiming the request id did not answer in time; deciding afresh"
                );
            }
            Ok(Turn::Decide)
        }
    }
}

/// Whether a stored fingerprint is this request's; one stored before fingerprints existed is
/// nobody's.
fn same(stored: Option<&Fingerprint>, fingerprint: &Fingerprint) -> bool {
    stored.is_some_and(|stored| subtle::ConstantTimeEq::ct_eq(&stored[..], &fingerprint[..]).into())
}

/// What a remembered answer means for this request. An answer older than the retention window
/// answers nothing and holds the id for nobody: the request is decided afresh.
fn answered(answer: Remembered, keyed: &Keyed) -> Turn {
    if crate::clock::now().saturating_sub(answer.at_ms) > IDEMPOTENCY_RETENTION_MS {
        Turn::Decide
    } else if same(answer.fingerprint.as_ref(), &keyed.fingerprint) {
        Turn::Replay(answer)
    } else {
        Turn::Reused {
            first: Some(answer.decision_id),
        }
    }
}

/// Another replica holds the claim for this request: poll for its answer, backing off, for as
/// long as a decision can take to be answered. Past that the caller is told to retry, never
/// given a second decision.
async fn wait_for_answer<S: Store>(state: &State<S>, gateway: &str, keyed: &Keyed) -> Result<Turn, Refusal> {
    let deadline = tokio::time::Instant::now() + state.claim_wait;
    let mut pause = Duration::from_millis(2);
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
        let found =
            tokio::time::timeout(state.store_timeout, state.store.remembered(gateway, &keyed.key)).await;
        if let Ok(Ok(Some(answer))) = found {
            return Ok(answered(answer, keyed));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Refusal::Unavailable(
                "a call with this request_id is still being decided; retry with the same request_id to \
                 get its answer"
                    .to_owned(),
            ));
        }
    }
}

impl Idempotency {
    /// Waits for this replica's turn on `(gateway, key)`.
    pub(super) async fn turn(&self, gateway: &str, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.turns.turn(gateway, key).await
    }
}

/// Per-key turns: a retry that arrives while its original is still being decided waits for it,
/// then finds its remembered response.
#[derive(Default)]
struct Turns {
    keys: std::sync::Mutex<HashMap<TurnKey, Weak<tokio::sync::Mutex<()>>>>,
}

/// `(gateway, request_id)`.
type TurnKey = (String, String);

impl Turns {
    async fn turn(&self, gateway: &str, request_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
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
    use crate::service::auth::Gateway;
    use crate::service::identify::AssertedCaller;

    #[test]
    fn request_ids_are_scoped_by_door() {
        // capgate's own keys stay as stored before doors existed.
        assert_eq!(key(Door::Capgate, "r-1"), "r-1");
        assert_eq!(key(Door::ExtAuthz, "r-1"), "ext_authz:r-1");
        assert_ne!(key(Door::Authzen, "r-1"), key(Door::ExtMcp, "r-1"));
    }

    fn gateway(name: &str) -> Gateway {
        Gateway {
            name: name.to_owned(),
            admin: false,
            may_assert: true,
        }
    }

    fn ask<'a>(gateway: &'a Gateway, caller: Asked<'a>) -> Ask<'a> {
        Ask {
            gateway,
            caller,
            request_id: Some("r-1"),
            door: Door::Capgate,
            retry_facts: Vec::new(),
            arguments: None,
            replayable: super::super::every_answer,
        }
    }

    fn principal<'a>(subject: &'a str, attributes: &[(&'a str, &'a str)]) -> Asked<'a> {
        Asked::Principal(AssertedCaller {
            issuer: "staff",
            subject,
            attributes: attributes.to_vec(),
        })
    }

    fn key_of(byte: u8) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &[byte; 32])
    }

    #[test]
    fn the_same_request_has_the_same_fingerprint_and_any_other_another() {
        let key = key_of(7);
        let edge = gateway("edge");
        let other_gateway = gateway("other");
        let read = Target::Tool("helpdesk__get_ticket");
        let ana = || principal("ana", &[("dept", "support"), ("level", "senior")]);
        let original = fingerprint(&key, &ask(&edge, ana()), read, None);
        // The same request, its attributes in another order: the same request.
        let reordered = principal("ana", &[("level", "senior"), ("dept", "support")]);
        assert_eq!(fingerprint(&key, &ask(&edge, reordered), read, None), original);

        let api_key = |text| Asked::Credential {
            presented: Some(Presented::ApiKey(text)),
            hint: None,
        };
        let mut others = vec![
            ("another door", {
                let mut asked = ask(&edge, ana());
                asked.door = Door::Authzen;
                fingerprint(&key, &asked, read, None)
            }),
            (
                "another gateway",
                fingerprint(&key, &ask(&other_gateway, ana()), read, None),
            ),
            (
                "another subject",
                fingerprint(&key, &ask(&edge, principal("sam", &[])), read, None),
            ),
            (
                "another attribute value",
                fingerprint(
                    &key,
                    &ask(
                        &edge,
                        principal("ana", &[("dept", "support"), ("level", "intern")]),
                    ),
                    read,
                    None,
                ),
            ),
            (
                "fewer attributes",
                fingerprint(
                    &key,
                    &ask(&edge, principal("ana", &[("dept", "support")])),
                    read,
                    None,
                ),
            ),
            (
                "another tool",
                fingerprint(&key, &ask(&edge, ana()), Target::Tool("helpdesk__comment"), None),
            ),
            (
                "a capability of the tool's name",
                fingerprint(
                    &key,
                    &ask(&edge, ana()),
                    Target::Capability("helpdesk__get_ticket"),
                    None,
                ),
            ),
            (
                "an API key",
                fingerprint(&key, &ask(&edge, api_key("k-1")), read, None),
            ),
            (
                "another API key",
                fingerprint(&key, &ask(&edge, api_key("k-2")), read, None),
            ),
            (
                "the key as a bearer token",
                fingerprint(
                    &key,
                    &ask(
                        &edge,
                        Asked::Credential {
                            presented: Some(Presented::BearerToken("k-1")),
                            hint: None,
                        },
                    ),
                    read,
                    None,
                ),
            ),
            (
                "with an issuer hint",
                fingerprint(
                    &key,
                    &ask(
                        &edge,
                        Asked::Credential {
                            presented: Some(Presented::ApiKey("k-1")),
                            hint: Some("nightly"),
                        },
                    ),
                    read,
                    None,
                ),
            ),
            (
                "no credential",
                fingerprint(
                    &key,
                    &ask(
                        &edge,
                        Asked::Credential {
                            presented: None,
                            hint: None,
                        },
                    ),
                    read,
                    None,
                ),
            ),
            (
                "the key claimed for a subject",
                fingerprint(
                    &key,
                    &ask(
                        &edge,
                        Asked::CredentialOf {
                            presented: Some(Presented::ApiKey("k-1")),
                            hint: None,
                            subject: "ana",
                        },
                    ),
                    read,
                    None,
                ),
            ),
            (
                "with arguments",
                fingerprint(&key, &ask(&edge, ana()), read, Some("sha256:01")),
            ),
            (
                "with other arguments",
                fingerprint(&key, &ask(&edge, ana()), read, Some("sha256:02")),
            ),
            ("arguments and a door fact", {
                let mut asked = ask(&edge, ana());
                asked.retry_facts.push(("received", "1.5".to_owned()));
                fingerprint(&key, &asked, read, Some("sha256:01"))
            }),
            ("a door fact that reads like arguments", {
                let mut asked = ask(&edge, ana());
                asked.retry_facts.push(("arguments", "sha256:01".to_owned()));
                fingerprint(&key, &asked, read, None)
            }),
            ("another door fact", {
                let mut asked = ask(&edge, ana());
                asked.retry_facts.push(("received", "1.5".to_owned()));
                fingerprint(&key, &asked, read, None)
            }),
            (
                "another deployment's key",
                fingerprint(&key_of(8), &ask(&edge, ana()), read, None),
            ),
        ];
        others.push(("the original", original));
        for (i, (what, one)) in others.iter().enumerate() {
            for (other, two) in &others[i + 1..] {
                assert_ne!(one, two, "{what} and {other} have one fingerprint");
            }
        }
    }

    #[test]
    fn parts_cannot_run_into_each_other() {
        // Without the lengths, ("ab", "c") and ("a", "bc") would be fed as the same bytes.
        let key = key_of(1);
        let edge = gateway("edge");
        let one = Asked::Principal(AssertedCaller {
            issuer: "ab",
            subject: "c",
            attributes: Vec::new(),
        });
        let two = Asked::Principal(AssertedCaller {
            issuer: "a",
            subject: "bc",
            attributes: Vec::new(),
        });
        let target = Target::Capability("x");
        assert_ne!(
            fingerprint(&key, &ask(&edge, one), target, None),
            fingerprint(&key, &ask(&edge, two), target, None)
        );
    }

    #[test]
    fn only_a_stored_fingerprint_equal_to_the_request_s_is_the_same_request() {
        let mine = [3; 32];
        let mut theirs = mine;
        theirs[31] ^= 1;
        assert!(same(Some(&mine), &mine));
        assert!(!same(Some(&theirs), &mine));
        // Stored before fingerprints existed: nobody's.
        assert!(!same(None, &mine));
    }
}
