//! Identity at the service (issue 4): the real `capgate serve` binary
//! authenticates callers' own credentials against the policy's issuers — a
//! local OIDC provider over loopback HTTP for `oidc`, keys by `env://` and
//! `file://` for `static-key`, forwarded DNs for `mtls` — and never lets a
//! presented credential or a secret reach audit rows, logs, traces, metrics,
//! responses or errors (docs/reference.md#decisions property 7): the sentinel test runs the
//! server with OTLP export to a real receiver (tests/support/otlp.rs) and
//! Prometheus text on.

mod support;

use std::time::{Duration, Instant};

use capgate::store::{AuditFilter, AuditRecord, SqliteStore, Store, StoreOptions};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{
    credential, decide_request, decide_response, list_visible_request, list_visible_response, AuthProblem,
    Credential, DecideRequest, DecideResponse, ListVisibleRequest, Outcome, ReasonCode,
};
use serde_json::{json, Value};
use support::client::principal;
use support::oidc::{Behaviour, Endpoint, KeyType, OidcProvider, AUDIENCE};
use support::otlp::{
    eventually, http_get, int, leaks, metrics_addr, prometheus_value, sum_value, text, Receiver, DECIDE_SPAN,
    LIST_SPAN,
};
use support::process::Serve;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Unique strings that must never leave the places they were put.
const STATIC_KEY: &str = "sentinel-static-key-7f3a9c";
const FILE_KEY: &str = "sentinel-file-key-2b81d4";
const ACCOUNT_SECRET: &str = "sentinel-account-secret-c0ffee";
const GATEWAY_TOKEN: &str = "sentinel-gateway-token-9e9e";
const TRUSTED_TOKEN: &str = "sentinel-trusted-token-5d5d";

/// `--otlp-interval` of [`World::observed`]: how often metrics are exported,
/// and the longest a finished span waits.
const EXPORT_EVERY: &str = "200ms";
/// How long what is exported that often may take to arrive.
const ARRIVES_WITHIN: Duration = Duration::from_secs(20);

/// A policy with one issuer of each kind (and a second static key), all
/// granted something.
fn policy(discovery: &str, key_file: &std::path::Path) -> String {
    format!(
        r#"version: 1
capabilities:
  - id: billing.refund.create
  - id: docs.page.search
  - id: deploy.release.approve
upstreams:
  - id: payments
    transport: {{ kind: mcp-http, url: "https://payments.example.net/mcp" }}
    tools:
      - {{ name: refund, capability: billing.refund.create }}
  - id: knowledge
    transport: {{ kind: mcp-http, url: "https://knowledge.example.net/mcp" }}
    tools:
      - {{ name: search, capability: docs.page.search }}
      - {{ name: approve, capability: deploy.release.approve }}
accounts:
  - id: billing-svc
    secret: {{ ref: "env://CAPGATE_TEST_ACCOUNT_SECRET" }}
  - id: docs-svc
    secret: {{ ref: "env://CAPGATE_TEST_DOCS_SECRET" }}
principals:
  issuers:
    - id: corp
      kind: oidc
      discovery: "{discovery}"
      audience: {AUDIENCE}
      attributes: {{ team: "claim:team", level: "claim:level" }}
    - id: partner
      kind: oidc
      discovery: "{discovery}"
      audience: partner-app
      attributes: {{ team: "claim:team" }}
    - id: batch
      kind: static-key
      subject: nightly
      secret: {{ ref: "env://CAPGATE_TEST_STATIC_KEY" }}
      attributes: {{ role: batch }}
    - id: filed
      kind: static-key
      subject: cron
      secret: {{ ref: "file://{key_file}" }}
      attributes: {{ role: cron }}
    - id: edge
      kind: mtls
      attributes: {{ unit: "dn:OU" }}
grants:
  - to: {{ issuer: corp, attributes: {{ team: billing }} }}
    capabilities: [billing.refund.create]
    using: billing-svc
  - to: {{ issuer: corp }}
    capabilities: [docs.page.search]
    using: docs-svc
  - to: {{ issuer: batch, attributes: {{ role: batch }} }}
    capabilities: [docs.page.search]
    using: docs-svc
  - to: {{ issuer: filed }}
    capabilities: [deploy.release.approve]
    using: docs-svc
  - to: {{ issuer: edge, attributes: {{ unit: payments }} }}
    capabilities: [billing.refund.create]
    using: billing-svc
"#,
        key_file = key_file.display()
    )
}

/// A server over a fresh SQLite file with the policy above, a plain gateway
/// token, a trusted (asserting) one, and the static key in its environment.
struct World {
    idp: OidcProvider,
    serve: Serve,
    database: String,
    /// With [`World::observed`]: the OTLP receiver the server exports to.
    otlp: Option<Receiver>,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        World::launch(None).await
    }

    /// As [`World::start`], with every telemetry output on: traces and
    /// metrics exported over OTLP every [`EXPORT_EVERY`] to a receiver here,
    /// and Prometheus text on a loopback port ([`support::otlp::metrics_addr`]).
    async fn observed() -> World {
        World::launch(Some(Receiver::start(None).await)).await
    }

    async fn launch(otlp: Option<Receiver>) -> World {
        let idp = OidcProvider::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key_file = dir.path().join("filed.key");
        std::fs::write(&key_file, format!("{FILE_KEY}\n")).expect("write the key file");
        let policy_file = dir.path().join("policy.yaml");
        std::fs::write(&policy_file, policy(&idp.discovery_url(), &key_file)).expect("write the policy");
        let database = format!("sqlite://{}", dir.path().join("capgate.db").display());
        let endpoint = otlp.as_ref().map(Receiver::endpoint);
        let mut args = vec![
            "--database-url",
            &database,
            "--policy",
            policy_file.to_str().expect("utf-8 path"),
            "--gateway-token",
            "edge-gw=env://CAPGATE_TEST_GATEWAY_TOKEN",
            "--asserting-gateway-token",
            "trusted-gw=env://CAPGATE_TEST_TRUSTED_TOKEN",
        ];
        if let Some(endpoint) = &endpoint {
            args.extend([
                "--otlp-endpoint",
                endpoint,
                "--otlp-interval",
                EXPORT_EVERY,
                "--metrics-listen",
                "127.0.0.1:0",
            ]);
        }
        let serve = Serve::start_with_env(
            &args,
            &[
                ("CAPGATE_LOG", "debug"),
                ("CAPGATE_TEST_STATIC_KEY", STATIC_KEY),
                ("CAPGATE_TEST_ACCOUNT_SECRET", ACCOUNT_SECRET),
                ("CAPGATE_TEST_DOCS_SECRET", ACCOUNT_SECRET),
                ("CAPGATE_TEST_GATEWAY_TOKEN", GATEWAY_TOKEN),
                ("CAPGATE_TEST_TRUSTED_TOKEN", TRUSTED_TOKEN),
            ],
        )
        .await;
        World {
            idp,
            serve,
            database,
            otlp,
            _dir: dir,
        }
    }

    async fn client(&self) -> DecisionServiceClient<Channel> {
        DecisionServiceClient::new(self.serve.channel().await)
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        SqliteStore::connect(&self.database, &StoreOptions::default())
            .await
            .expect("open the database")
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .expect("read the audit trail")
    }

    /// A valid token from the provider for `subject` with extra claims.
    fn token(&self, key_type: KeyType, subject: &str, extra: Value) -> String {
        let mut claims = self.idp.claims(subject);
        if let (Some(claims), Value::Object(extra)) = (claims.as_object_mut(), extra) {
            claims.extend(extra);
        }
        self.idp.mint(&self.idp.kid(key_type), &claims)
    }
}

fn as_gateway<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    request
}

fn ask(kind: credential::Kind, issuer: &str, capability: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Credential(Credential {
            kind: Some(kind),
            issuer: issuer.to_owned(),
        })),
        target: Some(decide_request::Target::Capability(capability.to_owned())),
        request_id: String::new(),
        arguments_json: None,
    }
}

fn bearer(token: &str) -> credential::Kind {
    credential::Kind::BearerToken(token.to_owned())
}

/// What a Decide answered: the outcome and code, or the problem.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Decided(Outcome, ReasonCode),
    Unauthenticated(AuthProblem),
    UnknownTool,
}

fn answer(response: &DecideResponse) -> Answer {
    match response.result.as_ref().expect("a result") {
        decide_response::Result::Decision(decision) => Answer::Decided(
            decision.outcome(),
            decision.reason.as_ref().expect("a reason").code(),
        ),
        decide_response::Result::Unauthenticated(refused) => Answer::Unauthenticated(refused.problem()),
        decide_response::Result::UnknownTool(_) => Answer::UnknownTool,
    }
}

async fn decide(client: &mut DecisionServiceClient<Channel>, request: DecideRequest) -> DecideResponse {
    client
        .decide(as_gateway(request, GATEWAY_TOKEN))
        .await
        .expect("an answer")
        .into_inner()
}

const ALLOW: Answer = Answer::Decided(Outcome::Allow, ReasonCode::Granted);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_tokens_are_verified_with_every_algorithm_and_their_claims_decide() {
    let world = World::start().await;
    let mut client = world.client().await;
    for key_type in KeyType::ALL {
        let token = world.token(key_type, "ana", json!({"team": "billing", "level": 3}));
        let response = decide(&mut client, ask(bearer(&token), "", "billing.refund.create")).await;
        assert_eq!(answer(&response), ALLOW, "{key_type:?}");
        // With the hint, the same.
        let hinted = decide(&mut client, ask(bearer(&token), "corp", "billing.refund.create")).await;
        assert_eq!(answer(&hinted), ALLOW, "{key_type:?} with the hint");
    }
    // Another team's token is decided on, and denied, by its claims.
    let support = world.token(KeyType::Rsa, "bo", json!({"team": ["support"]}));
    let denied = decide(&mut client, ask(bearer(&support), "", "billing.refund.create")).await;
    assert_eq!(
        answer(&denied),
        Answer::Decided(Outcome::Deny, ReasonCode::NoGrantMatches)
    );
    // A multi-valued claim gives no attribute: the team grant does not match.
    let two_teams = world.token(KeyType::Rsa, "cy", json!({"team": ["billing", "support"]}));
    let multi = decide(&mut client, ask(bearer(&two_teams), "", "billing.refund.create")).await;
    assert_eq!(
        answer(&multi),
        Answer::Decided(Outcome::Deny, ReasonCode::NoGrantMatches)
    );

    let audit = world.audit().await;
    let record = audit
        .iter()
        .find(|record| record.subject.as_deref() == Some("bo"))
        .expect("bo's record");
    assert_eq!(record.principal_id.as_deref(), Some("corp:bo"));
    assert_eq!(record.issuer.as_deref(), Some("corp"));
    assert_eq!(record.gateway, "edge-gw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_with_the_right_problem_and_audited() {
    let world = World::start().await;
    let mut client = world.client().await;
    let idp = &world.idp;
    let rsa = idp.kid(KeyType::Rsa);
    let now = support::oidc::now_ms() / 1000;
    let with = |changes: Value| {
        let mut claims = idp.claims("ana");
        let claims_map = claims.as_object_mut().expect("an object");
        for (name, value) in changes.as_object().expect("an object") {
            if value.is_null() {
                claims_map.remove(name);
            } else {
                claims_map.insert(name.clone(), value.clone());
            }
        }
        claims
    };
    let valid = idp.mint(&rsa, &with(json!({})));
    let mut tampered = valid.clone();
    {
        // Flip a payload character: the signature no longer matches.
        let dot = tampered.find('.').expect("a dot") + 3;
        let replacement = if &tampered[dot..=dot] == "A" { "B" } else { "A" };
        tampered.replace_range(dot..=dot, replacement);
    }
    let public_pem = idp
        .key(&rsa)
        .public_key_pem()
        .expect("an RSA key has a PEM")
        .to_owned();
    let cases: Vec<(&str, String, AuthProblem)> = vec![
        (
            "expired",
            idp.mint(&rsa, &with(json!({"exp": now - 3600}))),
            AuthProblem::CredentialExpired,
        ),
        (
            "not yet valid",
            idp.mint(&rsa, &with(json!({"nbf": now + 3600}))),
            AuthProblem::CredentialInvalid,
        ),
        (
            "wrong audience",
            idp.mint(&rsa, &with(json!({"aud": "someone-else"}))),
            AuthProblem::CredentialInvalid,
        ),
        (
            "unknown issuer",
            idp.mint(&rsa, &with(json!({"iss": "https://elsewhere.example.com"}))),
            AuthProblem::IssuerUnknown,
        ),
        (
            "unknown kid",
            support::oidc::SigningKey::generate(KeyType::P256, "stranger-1").mint(&with(json!({}))),
            AuthProblem::CredentialInvalid,
        ),
        ("tampered", tampered, AuthProblem::CredentialInvalid),
        (
            "alg none",
            support::oidc::unsigned_token(Some(&rsa), &with(json!({})), ""),
            AuthProblem::CredentialInvalid,
        ),
        (
            "HMAC with the public key",
            support::oidc::hmac_token(
                jsonwebtoken::Algorithm::HS256,
                Some(&rsa),
                public_pem.as_bytes(),
                &with(json!({})),
            ),
            AuthProblem::CredentialInvalid,
        ),
        (
            "not a JWT",
            "not-a-jwt".to_owned(),
            AuthProblem::CredentialInvalid,
        ),
        ("empty", String::new(), AuthProblem::CredentialMissing),
        (
            "no subject",
            idp.mint(&rsa, &with(json!({"sub": null}))),
            AuthProblem::CredentialInvalid,
        ),
    ];
    for (name, token, problem) in &cases {
        let response = decide(&mut client, ask(bearer(token), "", "docs.page.search")).await;
        assert_eq!(answer(&response), Answer::Unauthenticated(*problem), "{name}");
    }
    // A token of issuer corp presented with the hint of another oidc issuer
    // (same provider, another audience), and of a static-key issuer.
    let hinted = decide(&mut client, ask(bearer(&valid), "partner", "docs.page.search")).await;
    assert_eq!(
        answer(&hinted),
        Answer::Unauthenticated(AuthProblem::CredentialInvalid)
    );
    // A declared issuer of another kind: known, but it takes no token (`issuer_unknown` would
    // tell the caller's operator the issuer is not declared, which is false).
    let other_kind = decide(&mut client, ask(bearer(&valid), "batch", "docs.page.search")).await;
    assert_eq!(
        answer(&other_kind),
        Answer::Unauthenticated(AuthProblem::CredentialInvalid)
    );
    let undeclared = decide(&mut client, ask(bearer(&valid), "nobody", "docs.page.search")).await;
    assert_eq!(
        answer(&undeclared),
        Answer::Unauthenticated(AuthProblem::IssuerUnknown)
    );

    let audit = world.audit().await;
    let refused: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| r.outcome.as_str() == "unauthenticated")
        .collect();
    assert_eq!(refused.len(), cases.len() + 3, "every refusal is audited");
    let expired = refused
        .iter()
        .find(|r| r.code.map(|code| code.as_str()) == Some("credential_expired"))
        .expect("the expired token's record");
    assert_eq!(expired.issuer.as_deref(), Some("corp"));
    assert_eq!(expired.principal_id, None);
    // No token, whole or in part, is in the trail.
    let trail = format!("{audit:?}");
    for (name, token, _) in &cases {
        if let Some(signature) = token.rsplit('.').next().filter(|s| s.len() > 8) {
            assert!(
                !trail.contains(signature),
                "{name}'s signature is in the audit trail"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_are_picked_up_without_a_restart() {
    let world = World::start().await;
    let mut client = world.client().await;
    let first = world.token(KeyType::P256, "ana", json!({}));
    assert_eq!(
        answer(&decide(&mut client, ask(bearer(&first), "", "docs.page.search")).await),
        ALLOW
    );
    let fetched = world.idp.requests(Endpoint::Jwks);
    let new_kid = world.idp.rotate(KeyType::P256);
    let rotated = world.idp.mint(&new_kid, &world.idp.claims("ana"));
    assert_eq!(
        answer(&decide(&mut client, ask(bearer(&rotated), "", "docs.page.search")).await),
        ALLOW
    );
    assert_eq!(
        world.idp.requests(Endpoint::Jwks),
        fetched + 1,
        "one refetch for the new kid"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_provider_fails_closed_within_the_bound() {
    let world = World::start().await;
    let mut client = world.client().await;
    world.idp.set_behaviour(Endpoint::Discovery, Behaviour::Hang);
    world.idp.set_behaviour(Endpoint::Jwks, Behaviour::Hang);
    // The start-up prefetch may have warmed the cache: a new kid forces a fetch.
    let stranger = world.idp.add_key(KeyType::Ed25519);
    let token = world.idp.mint(&stranger, &world.idp.claims("ana"));
    let started = Instant::now();
    let status = client
        .decide(as_gateway(
            ask(bearer(&token), "", "docs.page.search"),
            GATEWAY_TOKEN,
        ))
        .await;
    let elapsed = started.elapsed();
    match status {
        // A warm cache that cannot learn the new kid, or a cold one: no decision either way.
        Err(status) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            // corp and partner share the provider: either may be named.
            let names_issuer = ["`corp`", "`partner`"]
                .iter()
                .any(|id| status.message().contains(id));
            assert!(names_issuer, "{}", status.message());
            assert!(!status.message().contains(&token));
        }
        Ok(response) => panic!("answered {:?} without the keys", answer(response.get_ref())),
    }
    // The documented bound: the fetch timeout (2 s) plus scheduling.
    assert!(elapsed < Duration::from_millis(4500), "took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_keys_and_client_certificates_authenticate() {
    let world = World::start().await;
    let mut client = world.client().await;
    let key = |value: &str| credential::Kind::ApiKey(value.to_owned());
    let dn = |value: &str| credential::Kind::ClientCertificate(value.to_owned());
    let cases: Vec<(&str, DecideRequest, Answer)> = vec![
        ("env key", ask(key(STATIC_KEY), "", "docs.page.search"), ALLOW),
        (
            "env key, hinted",
            ask(key(STATIC_KEY), "batch", "docs.page.search"),
            ALLOW,
        ),
        (
            "file key",
            ask(key(FILE_KEY), "", "deploy.release.approve"),
            ALLOW,
        ),
        (
            "a key for another issuer's hint",
            ask(key(STATIC_KEY), "filed", "docs.page.search"),
            Answer::Unauthenticated(AuthProblem::CredentialInvalid),
        ),
        (
            "an unknown key",
            ask(key("no-such-key"), "", "docs.page.search"),
            Answer::Unauthenticated(AuthProblem::CredentialInvalid),
        ),
        (
            "a DN",
            ask(dn("CN=svc-pay,OU=payments,O=Acme"), "", "billing.refund.create"),
            ALLOW,
        ),
        (
            "an XFCC value with escapes",
            ask(
                dn(
                    r#"By=spiffe://c/ns/a/sa/gw;Hash=abc;Subject="CN=svc-pay,OU=payments,O=Acme\\, Inc.";URI=spiffe://c/ns/a/sa/pay"#,
                ),
                "edge",
                "billing.refund.create",
            ),
            ALLOW,
        ),
        (
            "a repeated OU gives no attribute",
            ask(dn("CN=svc-pay,OU=payments,OU=ops"), "", "billing.refund.create"),
            Answer::Decided(Outcome::Deny, ReasonCode::NoGrantMatches),
        ),
        (
            "no CN",
            ask(dn("OU=payments"), "", "billing.refund.create"),
            Answer::Unauthenticated(AuthProblem::CredentialInvalid),
        ),
        (
            "no credential at all",
            DecideRequest {
                caller: Some(decide_request::Caller::Credential(Credential::default())),
                target: Some(decide_request::Target::Capability("docs.page.search".into())),
                request_id: String::new(),
                arguments_json: None,
            },
            Answer::Unauthenticated(AuthProblem::CredentialMissing),
        ),
    ];
    for (name, request, expected) in cases {
        // Only the TLS terminator, trusted to assert, may forward a certificate
        // (`a_plain_gateway_may_not_forward_a_client_certificate`).
        let token = if forwards_certificate(&request) {
            TRUSTED_TOKEN
        } else {
            GATEWAY_TOKEN
        };
        let response = client
            .decide(as_gateway(request, token))
            .await
            .expect("an answer")
            .into_inner();
        assert_eq!(answer(&response), expected, "{name}");
    }
    let audit = world.audit().await;
    assert!(audit
        .iter()
        .any(|r| r.principal_id.as_deref() == Some("batch:nightly") && r.outcome.as_str() == "allow"));
    assert!(audit
        .iter()
        .any(|r| r.principal_id.as_deref() == Some("edge:svc-pay") && r.outcome.as_str() == "allow"));
    assert!(audit
        .iter()
        .any(|r| r.principal_id.as_deref() == Some("filed:cron") && r.outcome.as_str() == "allow"));
}

fn forwards_certificate(request: &DecideRequest) -> bool {
    matches!(
        &request.caller,
        Some(decide_request::Caller::Credential(Credential {
            kind: Some(credential::Kind::ClientCertificate(_)),
            ..
        }))
    )
}

/// A DN in a request is only a claim: the service never saw the handshake. A plain gateway
/// forwarding one could become any `mtls` principal, so it is refused, and told why; the
/// trusted gateway (the TLS terminator) is answered. Nothing is recorded for the refused calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_gateway_may_not_forward_a_client_certificate() {
    let world = World::start().await;
    let mut client = world.client().await;
    let forged = ask(
        credential::Kind::ClientCertificate("CN=svc-pay,OU=payments,O=Acme".to_owned()),
        "",
        "billing.refund.create",
    );
    let refused = client
        .decide(as_gateway(forged.clone(), GATEWAY_TOKEN))
        .await
        .expect_err("a plain gateway may not vouch for a certificate");
    assert_eq!(refused.code(), Code::PermissionDenied, "{}", refused.message());
    assert!(refused.message().contains("edge-gw"), "{}", refused.message());
    assert!(
        refused.message().contains("--asserting-gateway-token"),
        "the refusal says how to fix it: {}",
        refused.message()
    );
    let listing = ListVisibleRequest {
        caller: Some(list_visible_request::Caller::Credential(Credential {
            kind: Some(credential::Kind::ClientCertificate("CN=svc-pay".to_owned())),
            issuer: String::new(),
        })),
        request_id: String::new(),
    };
    let refused = client
        .list_visible(as_gateway(listing, GATEWAY_TOKEN))
        .await
        .expect_err("nor list for one");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        !world
            .audit()
            .await
            .iter()
            .any(|record| record.principal_id.as_deref() == Some("edge:svc-pay")),
        "a refused forgery is no principal's record"
    );
    let trusted = client
        .decide(as_gateway(forged, TRUSTED_TOKEN))
        .await
        .expect("the TLS terminator may forward it")
        .into_inner();
    assert_eq!(answer(&trusted), ALLOW);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_trusted_gateways_may_assert_a_principal() {
    let world = World::start().await;
    let mut client = world.client().await;
    let asserted = DecideRequest {
        caller: Some(decide_request::Caller::Principal(principal(
            "corp",
            "ana",
            &[("team", &["billing"])],
        ))),
        target: Some(decide_request::Target::Capability("billing.refund.create".into())),
        request_id: String::new(),
        arguments_json: None,
    };
    let refused = client
        .decide(as_gateway(asserted.clone(), GATEWAY_TOKEN))
        .await
        .expect_err("a plain gateway may not assert");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let trusted = client
        .decide(as_gateway(asserted, TRUSTED_TOKEN))
        .await
        .expect("a trusted gateway may assert")
        .into_inner();
    assert_eq!(answer(&trusted), ALLOW);
    // Listings follow the same rule, and take credentials too.
    let listing = |caller| ListVisibleRequest {
        caller: Some(caller),
        request_id: String::new(),
    };
    let refused = client
        .list_visible(as_gateway(
            listing(list_visible_request::Caller::Principal(principal(
                "corp",
                "ana",
                &[],
            ))),
            GATEWAY_TOKEN,
        ))
        .await
        .expect_err("a plain gateway may not assert a listing");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let token = world.token(KeyType::Ed25519, "ana", json!({"team": "billing"}));
    let listed = client
        .list_visible(as_gateway(
            listing(list_visible_request::Caller::Credential(Credential {
                kind: Some(bearer(&token)),
                issuer: String::new(),
            })),
            GATEWAY_TOKEN,
        ))
        .await
        .expect("a listing")
        .into_inner();
    let Some(list_visible_response::Result::Visible(visible)) = listed.result else {
        panic!("not a listing: {listed:?}");
    };
    let mut capabilities: Vec<&str> = visible
        .capabilities
        .iter()
        .map(|c| c.capability.as_str())
        .collect();
    capabilities.sort_unstable();
    assert_eq!(capabilities, ["billing.refund.create", "docs.page.search"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_credentials_are_invalid_arguments_naming_the_field() {
    let world = World::start().await;
    let mut client = world.client().await;
    let huge = "x".repeat(17 * 1024);
    let status = client
        .decide(as_gateway(
            ask(bearer(&huge), "", "docs.page.search"),
            GATEWAY_TOKEN,
        ))
        .await
        .expect_err("over the bound");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("credential.bearer_token"),
        "{}",
        status.message()
    );
    assert!(!status.message().contains(&huge[..64]));
}

/// Policy-core §5 property 7: unique secrets — static keys (from the
/// environment and a file), presented tokens and keys, the account secret
/// behind a reference, gateway tokens — never appear in audit rows, logs
/// (at debug), traces and metrics (every raw OTLP export, and the Prometheus
/// text), responses or errors; the account id does.
///
/// The telemetry check is not vacuous: a span arrives for every call; an
/// answered `Decide`'s span carries its outcome and code (`unauthenticated`
/// and the problem for a refused credential), a failed call's span its gRPC
/// status; and the metrics count the refused credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_secrets_never_leave_their_place() {
    let mut world = World::observed().await;
    let mut client = world.client().await;
    let token = world.token(KeyType::Rsa, "ana", json!({"team": "billing"}));
    let expired = {
        let mut claims = world.idp.claims("ana");
        claims["exp"] = json!(1);
        world.idp.mint(&world.idp.kid(KeyType::Rsa), &claims)
    };
    let mut seen = String::new();
    // Answered: (request, the outcome and code its span must carry).
    let requests = vec![
        (
            ask(bearer(&token), "", "billing.refund.create"),
            "allow",
            "granted",
        ),
        (
            ask(bearer(&expired), "", "billing.refund.create"),
            "unauthenticated",
            "credential_expired",
        ),
        (
            ask(
                credential::Kind::ApiKey(STATIC_KEY.into()),
                "",
                "docs.page.search",
            ),
            "allow",
            "granted",
        ),
        (
            ask(
                credential::Kind::ApiKey(FILE_KEY.into()),
                "",
                "deploy.release.approve",
            ),
            "allow",
            "granted",
        ),
        (
            ask(
                credential::Kind::ApiKey(format!("{STATIC_KEY}-wrong")),
                "",
                "docs.page.search",
            ),
            "unauthenticated",
            "credential_invalid",
        ),
    ];
    let mut decided = Vec::new();
    for (request, outcome, code) in requests {
        let response = client
            .decide(as_gateway(request, GATEWAY_TOKEN))
            .await
            .expect("an answer")
            .into_inner();
        seen.push_str(&format!("{response:?}\n"));
        decided.push((response.decision_id, outcome, code));
    }
    // A listing for the presented token.
    let listed = client
        .list_visible(as_gateway(
            ListVisibleRequest {
                caller: Some(list_visible_request::Caller::Credential(Credential {
                    kind: Some(bearer(&token)),
                    issuer: String::new(),
                })),
                request_id: String::new(),
            },
            GATEWAY_TOKEN,
        ))
        .await
        .expect("a listing")
        .into_inner();
    seen.push_str(&format!("{listed:?}\n"));
    // Errors: a wrong gateway token, an asserting gateway, an oversized key.
    let mut refused = Vec::new();
    for (request, gateway) in [
        (
            ask(bearer(&token), "", "docs.page.search"),
            format!("{GATEWAY_TOKEN}x"),
        ),
        (
            DecideRequest {
                caller: Some(decide_request::Caller::Principal(principal(
                    "batch",
                    STATIC_KEY,
                    &[],
                ))),
                target: Some(decide_request::Target::Capability("docs.page.search".into())),
                request_id: String::new(),
                arguments_json: None,
            },
            GATEWAY_TOKEN.to_owned(),
        ),
        (
            ask(
                credential::Kind::ApiKey(STATIC_KEY.repeat(1000)),
                "",
                "docs.page.search",
            ),
            GATEWAY_TOKEN.to_owned(),
        ),
    ] {
        let status = client
            .decide(as_gateway(request, &gateway))
            .await
            .expect_err("refused");
        seen.push_str(&format!("{status:?}\n"));
        refused.push(i64::from(status.code() as i32));
    }
    refused.sort_unstable();

    // ── What telemetry saw: first, that it saw the calls ──
    let otlp = world.otlp.as_ref().expect("an observed world");
    eventually("a span for every answered Decide", ARRIVES_WITHIN, || {
        decided
            .iter()
            .all(|(id, ..)| otlp.decision_span(id).is_some())
            .then_some(())
    })
    .await;
    for (id, outcome, code) in &decided {
        let (_, span) = otlp.decision_span(id).expect("its span");
        assert_eq!(span.name, DECIDE_SPAN);
        assert_eq!(
            text(&span.attributes, "capgate.outcome").as_deref(),
            Some(*outcome),
            "{span:?}"
        );
        assert_eq!(
            text(&span.attributes, "capgate.code").as_deref(),
            Some(*code),
            "{span:?}"
        );
    }
    // The refused calls have spans too: their status, and no decision.
    eventually("a span for every refused Decide", ARRIVES_WITHIN, || {
        let mut statuses: Vec<i64> = otlp
            .spans()
            .iter()
            .filter(|(_, span)| {
                span.name == DECIDE_SPAN && text(&span.attributes, "capgate.decision_id").is_none()
            })
            .filter_map(|(_, span)| int(&span.attributes, "rpc.grpc.status_code"))
            .collect();
        statuses.sort_unstable();
        (statuses == refused).then_some(())
    })
    .await;
    eventually("the listing's span", ARRIVES_WITHIN, || {
        otlp.spans().into_iter().find(|(_, span)| {
            span.name == LIST_SPAN && text(&span.attributes, "capgate.outcome").as_deref() == Some("allow")
        })
    })
    .await;
    fn unauthenticated(code: &str) -> [(&str, &str); 2] {
        [("outcome", "unauthenticated"), ("code", code)]
    }
    eventually("the refusals counted", ARRIVES_WITHIN, || {
        let (_, decisions) = otlp.latest_metric("capgate.decisions")?;
        let counted = |code| sum_value(&decisions, &unauthenticated(code));
        (counted("credential_expired") == Some(1) && counted("credential_invalid") == Some(1)).then_some(())
    })
    .await;
    let (status, scraped) = http_get(metrics_addr(&world.serve), "/metrics").await;
    assert_eq!(status, 200, "{scraped}");
    assert_eq!(
        prometheus_value(
            &scraped,
            "capgate_decisions_total",
            &unauthenticated("credential_expired")
        ),
        Some(1.0),
        "{scraped}"
    );
    // Stopped: whatever it still held is flushed, and the exports are complete.
    world.serve.terminate();
    assert!(world.serve.wait(Duration::from_secs(30)).await.success());
    let (exported, exported_text) = otlp.everything();
    assert!(!exported.is_empty());

    let audit = format!("{:?}", world.audit().await);
    let logs = world.serve.logs();
    assert!(seen.contains("billing-svc"), "the account id is answered: {seen}");
    assert!(audit.contains("billing-svc"), "the account id is audited");
    let signature = token.rsplit('.').next().expect("a signature");
    let expired_signature = expired.rsplit('.').next().expect("a signature");
    for (name, secret) in [
        ("the env static key", STATIC_KEY),
        ("the file static key", FILE_KEY),
        ("the account secret", ACCOUNT_SECRET),
        ("the gateway token", GATEWAY_TOKEN),
        ("the trusted gateway token", TRUSTED_TOKEN),
        ("the presented token", token.as_str()),
        ("the token's signature", signature),
        ("the expired token's signature", expired_signature),
    ] {
        assert!(!audit.contains(secret), "{name} is in the audit trail");
        assert!(!logs.contains(secret), "{name} is in the logs:\n{logs}");
        // The asserted subject equal to the static key is the caller's own
        // doing, refused before any answer: nothing else may echo a secret.
        assert!(
            !seen.contains(secret),
            "{name} is in a response or an error:\n{seen}"
        );
        assert!(
            !leaks(&exported, secret),
            "{name} was exported over OTLP:\n{exported_text}"
        );
        assert!(
            !exported_text.contains(secret),
            "{name} is in the decoded OTLP exports"
        );
        assert!(!scraped.contains(secret), "{name} is in /metrics:\n{scraped}");
    }
}

// ── The dry run: the same credentials, offline ───────────────────────────

/// Runs `capgate ARGS` with `env`; returns (exit code, stdout, stderr).
fn capgate(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run capgate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A policy and a local key set on disk, as a policy author has them: the
/// discovery URL names an issuer that is not reachable from here.
struct Offline {
    dir: tempfile::TempDir,
    key: support::oidc::SigningKey,
}

const OFFLINE_ISSUER: &str = "https://id.example.com/realms/corp";

impl Offline {
    fn new() -> Offline {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key_file = dir.path().join("filed.key");
        std::fs::write(&key_file, FILE_KEY).expect("write the key file");
        let discovery = format!("{OFFLINE_ISSUER}/.well-known/openid-configuration");
        std::fs::write(dir.path().join("policy.yaml"), policy(&discovery, &key_file))
            .expect("write the policy");
        let key = support::oidc::SigningKey::generate(KeyType::Ed25519, "offline-1");
        std::fs::write(
            dir.path().join("jwks.json"),
            json!({ "keys": [key.jwk.clone()] }).to_string(),
        )
        .expect("write the key set");
        Offline { dir, key }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn token(&self, claims: Value) -> String {
        let now = support::oidc::now_ms() / 1000;
        let mut base = json!({"iss": OFFLINE_ISSUER, "sub": "ana", "aud": AUDIENCE, "exp": now + 300});
        if let (Some(base), Value::Object(claims)) = (base.as_object_mut(), claims) {
            base.extend(claims);
        }
        self.key.mint(&base)
    }

    fn explain(&self, credential: &[&str], capability: &str, env: &[(&str, &str)]) -> (i32, Value, String) {
        let policy = self.path("policy.yaml");
        let mut args = vec!["explain", policy.as_str(), "--capability", capability, "--json"];
        args.extend_from_slice(credential);
        let (code, stdout, stderr) = capgate(&args, env);
        let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        (code, json, stderr)
    }
}

#[test]
fn explain_checks_a_real_token_against_a_local_key_set() {
    let offline = Offline::new();
    let jwks = offline.path("jwks.json");
    let token = offline.token(json!({"team": "billing"}));
    let (code, json, stderr) = offline.explain(
        &["--caller-token", &token, "--jwks", &jwks],
        "billing.refund.create",
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["principal"]["id"], "corp:ana", "{json}");
    assert_eq!(json["decision"]["outcome"], "allow", "{json}");
    assert!(!stderr.contains(&token) && !json.to_string().contains(&token));

    // Checked at `--at`: the same token an hour later has expired.
    let later = offline.explain(
        &[
            "--caller-token",
            &token,
            "--jwks",
            &jwks,
            "--at",
            "2999-01-01T00:00:00Z",
        ],
        "billing.refund.create",
        &[],
    );
    assert_eq!(later.1["problem"], "credential_expired", "{}", later.1);
    // Wrong audience; a key set without the token's key; no key set at all.
    let other = offline.token(json!({"aud": "someone-else"}));
    let wrong = offline.explain(
        &["--caller-token", &other, "--jwks", &jwks],
        "docs.page.search",
        &[],
    );
    assert_eq!(wrong.1["problem"], "credential_invalid", "{}", wrong.1);
    let empty = offline.path("empty.json");
    std::fs::write(&empty, r#"{"keys": []}"#).expect("write");
    let unknown = offline.explain(
        &["--caller-token", &token, "--jwks", &empty],
        "docs.page.search",
        &[],
    );
    assert_eq!(unknown.1["problem"], "credential_invalid", "{}", unknown.1);
    let (code, _, stderr) = offline.explain(&["--caller-token", &token], "docs.page.search", &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--jwks"), "{stderr}");
}

#[test]
fn explain_and_visible_take_api_keys_and_client_certificates() {
    let offline = Offline::new();
    let env = [("CAPGATE_TEST_STATIC_KEY", STATIC_KEY)];
    let (code, json, stderr) = offline.explain(&["--api-key", STATIC_KEY], "docs.page.search", &env);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["principal"]["id"], "batch:nightly", "{json}");
    assert_eq!(json["decision"]["outcome"], "allow", "{json}");
    let (_, json, _) = offline.explain(&["--api-key", FILE_KEY], "deploy.release.approve", &env);
    assert_eq!(json["principal"]["id"], "filed:cron", "{json}");
    let (_, json, stderr) = offline.explain(&["--api-key", "nope"], "docs.page.search", &env);
    assert_eq!(json["problem"], "credential_invalid", "{json}");
    assert!(!stderr.contains(STATIC_KEY), "{stderr}");
    // Without the key in this environment, the issuer's key is unreadable.
    let (_, json, stderr) = offline.explain(&["--api-key", STATIC_KEY], "docs.page.search", &[]);
    assert_eq!(json["problem"], "credential_invalid", "{json}");
    assert!(stderr.contains("`batch`"), "{stderr}");

    let (_, json, _) = offline.explain(
        &["--client-dn", r#"Hash=ab;Subject="CN=svc-pay,OU=payments""#],
        "billing.refund.create",
        &[],
    );
    assert_eq!(json["principal"]["id"], "edge:svc-pay", "{json}");
    assert_eq!(json["decision"]["outcome"], "allow", "{json}");

    let policy = offline.path("policy.yaml");
    let (code, stdout, stderr) = capgate(
        &[
            "visible",
            &policy,
            "--client-dn",
            "CN=svc-pay,OU=payments",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let listing: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(listing["principal"]["id"], "edge:svc-pay", "{listing}");
    assert!(listing.to_string().contains("billing.refund.create"), "{listing}");
    // A credential and a subject together are a usage error.
    let (code, _, _) = capgate(
        &[
            "visible",
            &policy,
            "--client-dn",
            "CN=a",
            "--subject",
            "b",
            "--issuer",
            "edge",
        ],
        &[],
    );
    assert_eq!(code, 2);
}
