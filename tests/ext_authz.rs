//! Envoy's ext_authz door (issue 11): the real `capgate serve` binary, called with the
//! `envoy.service.auth.v3.Authorization` client generated from Envoy's own proto (the
//! `envoy-types` crate), over a fresh PostgreSQL database each. Every reason code a tool call can
//! get, each credential kind, each method class, each place the target can come from, a body
//! that disagrees with its headers, oversize fields, a bad token and an idempotent retry; the
//! audit rows (`door = ext_authz`) and the metrics are read back, and no credential or secret
//! comes back in an answer or a log line.

mod support;

use std::collections::HashMap;

use capgate::store::{AuditFilter, AuditRecord, Door, RecordOutcome, Store};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
    HttpRequest, Peer, Request as HttpAttributes,
};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest, CheckResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as ProtoValue};
use serde_json::{json, Value};
use support::oidc::{KeyType, OidcProvider, AUDIENCE};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Strings that must never come back.
const STATIC_KEY: &str = "sentinel-extauthz-static-key-41c2";
const ACCOUNT_SECRET: &str = "sentinel-extauthz-account-secret-77aa";
const GATEWAY_TOKEN: &str = "sentinel-extauthz-gateway-token-0b0b";
const TRUSTED_TOKEN: &str = "sentinel-extauthz-trusted-token-1c1c";

/// One issuer of each kind; a grant per reason code a tool call can get.
fn policy(discovery: &str) -> String {
    format!(
        r#"version: 1
capabilities:
  - id: billing.refund.create
  - id: docs.page.search
  - id: deploy.release.approve
  - id: ops.restart.run
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
  - id: ops
    transport: {{ kind: mcp-http, url: "https://ops.example.net/mcp" }}
    tools:
      - {{ name: restart, capability: ops.restart.run }}
accounts:
  - id: billing-svc
    secret: {{ ref: "env://EXTAUTHZ_ACCOUNT_SECRET" }}
  - id: docs-svc
    secret: {{ ref: "env://EXTAUTHZ_ACCOUNT_SECRET" }}
  - id: release-robot
    disabled: true
    secret: {{ ref: "env://EXTAUTHZ_ACCOUNT_SECRET" }}
  - id: ops-a
    secret: {{ ref: "env://EXTAUTHZ_ACCOUNT_SECRET" }}
principals:
  issuers:
    - id: corp
      kind: oidc
      discovery: "{discovery}"
      audience: {AUDIENCE}
      attributes: {{ team: "claim:team" }}
    - id: batch
      kind: static-key
      subject: nightly
      secret: {{ ref: "env://EXTAUTHZ_STATIC_KEY" }}
      attributes: {{ role: batch, env: prod }}
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
    limits: {{ calls: 2, per: 1h }}
  - to: {{ issuer: corp }}
    capabilities: [deploy.release.approve]
    using: release-robot
  - to: {{ issuer: batch, attributes: {{ role: batch }} }}
    capabilities: [ops.restart.run]
    using: ops-a
  - to: {{ issuer: batch }}
    capabilities: [docs.page.search]
    using: docs-svc
  - to: {{ issuer: edge, attributes: {{ unit: payments }} }}
    capabilities: [billing.refund.create]
    using: billing-svc
"#
    )
}

/// A server over a fresh PostgreSQL database, with a plain gateway token and a trusted one.
struct World {
    idp: OidcProvider,
    serve: Serve,
    database: TestDatabase,
    _dir: tempfile::TempDir,
}

impl World {
    /// `None` when the PostgreSQL tests are skipped (no `DATABASE_URL`).
    async fn start(extra: &[&str]) -> Option<World> {
        let database = TestDatabase::create().await?;
        let idp = OidcProvider::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy_file = dir.path().join("policy.yaml");
        std::fs::write(&policy_file, policy(&idp.discovery_url())).expect("write the policy");
        let url = database.url();
        let mut args = vec![
            "--database-url",
            &url,
            "--policy",
            policy_file.to_str().expect("a UTF-8 path"),
            "--gateway-token",
            "envoy=env://EXTAUTHZ_GATEWAY_TOKEN",
            "--asserting-gateway-token",
            "istio-ingress=env://EXTAUTHZ_TRUSTED_TOKEN",
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let serve = Serve::start_with_env(
            &args,
            &[
                ("CAPGATE_LOG", "debug"),
                ("EXTAUTHZ_STATIC_KEY", STATIC_KEY),
                ("EXTAUTHZ_ACCOUNT_SECRET", ACCOUNT_SECRET),
                ("EXTAUTHZ_GATEWAY_TOKEN", GATEWAY_TOKEN),
                ("EXTAUTHZ_TRUSTED_TOKEN", TRUSTED_TOKEN),
            ],
        )
        .await;
        Some(World {
            idp,
            serve,
            database,
            _dir: dir,
        })
    }

    async fn client(&self) -> AuthorizationClient<Channel> {
        AuthorizationClient::new(self.serve.channel().await)
    }

    /// `Check` as the plain gateway (`envoy`).
    async fn check(&self, request: CheckRequest) -> CheckResponse {
        self.check_as(request, GATEWAY_TOKEN).await
    }

    async fn check_as(&self, request: CheckRequest, token: &str) -> CheckResponse {
        self.client()
            .await
            .check(as_gateway(request, token))
            .await
            .expect("an answered Check")
            .into_inner()
    }

    fn token(&self, subject: &str, team: &str) -> String {
        let mut claims = self.idp.claims(subject);
        claims["team"] = json!(team);
        self.idp.mint(&self.idp.kid(KeyType::Rsa), &claims)
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        self.database
            .store()
            .await
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail")
    }

    async fn record(&self, decision_id: &str) -> AuditRecord {
        self.audit()
            .await
            .into_iter()
            .find(|record| record.decision_id == decision_id)
            .unwrap_or_else(|| panic!("no audit record {decision_id}"))
    }

    async fn decisions_counted(&self, labels: &[(&str, &str)]) -> f64 {
        let (status, text) = http_get(metrics_addr(&self.serve), "/metrics").await;
        assert_eq!(status, 200, "{text}");
        prometheus_value(&text, "capgate_decisions_total", labels).unwrap_or(0.0)
    }
}

fn as_gateway<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    request
}

/// A forwarded HTTP request with these headers (names lower-case, as Envoy sends them).
fn forwarded(headers: &[(&str, &str)]) -> CheckRequest {
    forwarded_with(headers, "", HashMap::new(), None)
}

fn forwarded_with(
    headers: &[(&str, &str)],
    body: &str,
    context_extensions: HashMap<String, String>,
    metadata_context: Option<Metadata>,
) -> CheckRequest {
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer::default()),
            request: Some(HttpAttributes {
                http: Some(HttpRequest {
                    method: "POST".into(),
                    path: "/mcp".into(),
                    host: "mcp.example.net".into(),
                    headers: headers
                        .iter()
                        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                        .collect(),
                    body: body.to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            context_extensions,
            metadata_context,
            ..Default::default()
        }),
    }
}

/// A `tools/call` of `tool` with the caller's `authorization`.
fn call(tool: &str, authorization: &str) -> CheckRequest {
    forwarded(&[
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
        ("authorization", authorization),
    ])
}

/// What a `CheckResponse` says, read as Envoy reads it.
#[derive(Debug)]
struct Seen {
    grpc: i32,
    /// 200 for an allow, else the denied response's status.
    http: i32,
    /// Headers for the upstream (allow) or the client (deny), and headers added to the response.
    headers: HashMap<String, String>,
    response_headers: HashMap<String, String>,
    body: Value,
    metadata: HashMap<String, Value>,
}

fn seen(response: &CheckResponse) -> Seen {
    let grpc = response.status.as_ref().map_or(-1, |status| status.code);
    let pairs = |options: &[envoy_types::pb::envoy::config::core::v3::HeaderValueOption]| {
        options
            .iter()
            .filter_map(|option| option.header.as_ref())
            .map(|header| (header.key.clone(), header.value.clone()))
            .collect::<HashMap<_, _>>()
    };
    let (http, headers, response_headers, body) = match &response.http_response {
        Some(HttpResponse::OkResponse(ok)) => (
            200,
            pairs(&ok.headers),
            pairs(&ok.response_headers_to_add),
            Value::Null,
        ),
        Some(HttpResponse::DeniedResponse(denied)) => (
            denied.status.as_ref().map_or(-1, |status| status.code),
            pairs(&denied.headers),
            HashMap::new(),
            serde_json::from_str(&denied.body).expect("a JSON body"),
        ),
        _ => (-1, HashMap::new(), HashMap::new(), Value::Null),
    };
    let metadata = response
        .dynamic_metadata
        .as_ref()
        .map(|metadata| {
            metadata
                .fields
                .iter()
                .map(|(key, value)| (key.clone(), plain(value)))
                .collect()
        })
        .unwrap_or_default();
    Seen {
        grpc,
        http,
        headers,
        response_headers,
        body,
        metadata,
    }
}

fn plain(value: &ProtoValue) -> Value {
    match &value.kind {
        Some(Kind::StringValue(text)) => json!(text),
        Some(Kind::NumberValue(number)) => json!(number),
        Some(Kind::BoolValue(flag)) => json!(flag),
        _ => Value::Null,
    }
}

fn text(value: &str) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StringValue(value.to_owned())),
    }
}

/// What Envoy's MCP filter writes for a `tools/call` of `name`, under the namespace Envoy 1.38
/// and later use.
fn mcp_filter_metadata(method: &str, name: &str) -> Metadata {
    mcp_filter_metadata_in("envoy.filters.http.mcp", method, name, 9.0)
}

/// The same under `namespace`, with the request's JSON-RPC id.
fn mcp_filter_metadata_in(namespace: &str, method: &str, name: &str, id: f64) -> Metadata {
    let params = Struct {
        fields: [("name".to_owned(), text(name))].into_iter().collect(),
    };
    let fields = Struct {
        fields: [
            ("method".to_owned(), text(method)),
            (
                "id".to_owned(),
                ProtoValue {
                    kind: Some(Kind::NumberValue(id)),
                },
            ),
            (
                "params".to_owned(),
                ProtoValue {
                    kind: Some(Kind::StructValue(params)),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    Metadata {
        filter_metadata: [(namespace.to_owned(), fields)].into_iter().collect(),
        ..Default::default()
    }
}

/// The decision id a denial's JSON-RPC error carries (checked against the metadata's).
fn denied_decision(seen: &Seen) -> String {
    let id = seen.body["error"]["data"]["decision_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a decision id in {seen:?}"))
        .to_owned();
    assert_eq!(seen.metadata["decision_id"], json!(id), "{seen:?}");
    id
}

#[tokio::test]
async fn every_reason_code_and_credential_kind_is_answered_as_envoy_expects_and_audited() {
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let billing = format!("Bearer {}", world.token("ana", "billing"));
    let docs = format!("Bearer {}", world.token("dee", "docs"));

    // granted, bearer token: OK, the decision id and the account for the upstream hop, and the
    // dynamic metadata for the access log.
    let allowed = seen(&world.check(call("payments__refund", &billing)).await);
    assert_eq!((allowed.grpc, allowed.http), (0, 200), "{allowed:?}");
    let decision_id = allowed.headers["x-capgate-decision-id"].clone();
    assert_eq!(allowed.headers["x-capgate-account"], "billing-svc");
    assert_eq!(allowed.metadata["decision_id"], json!(decision_id));
    assert_eq!(allowed.metadata["code"], json!("granted"));
    assert_eq!(allowed.metadata["pointer"], json!("/grants/0"));
    assert_eq!(allowed.metadata["account"], json!("billing-svc"));
    assert!(allowed.metadata["policy_version"].is_string(), "{allowed:?}");
    assert!(
        allowed.response_headers.is_empty(),
        "no ceiling, no RateLimit: {allowed:?}"
    );
    let record = world.record(&decision_id).await;
    assert_eq!(record.door, Door::ExtAuthz);
    assert_eq!(record.gateway, "envoy");
    assert_eq!(record.outcome, RecordOutcome::Allow);
    assert_eq!(record.tool.as_deref(), Some("payments__refund"));
    assert_eq!(record.issuer.as_deref(), Some("corp"));
    assert_eq!(record.account_id.as_deref(), Some("billing-svc"));

    // no_grant_matches: 403 with a JSON-RPC error carrying code, pointer and decision id.
    let denied = seen(&world.check(call("payments__refund", &docs)).await);
    assert_eq!(
        (denied.grpc, denied.http),
        (Code::PermissionDenied as i32, 403),
        "{denied:?}"
    );
    assert_eq!(denied.body["jsonrpc"], "2.0");
    assert_eq!(denied.body["error"]["code"], -32001);
    assert_eq!(denied.body["error"]["data"]["code"], "no_grant_matches");
    assert_eq!(denied.headers["content-type"], "application/json");
    let id = denied_decision(&denied);
    let record = world.record(&id).await;
    assert_eq!(
        (record.door, record.outcome),
        (Door::ExtAuthz, RecordOutcome::Deny)
    );

    // account_disabled.
    let disabled = seen(&world.check(call("knowledge__approve", &docs)).await);
    assert_eq!(disabled.http, 403);
    assert_eq!(disabled.body["error"]["data"]["code"], "account_disabled");
    assert_eq!(disabled.body["error"]["data"]["pointer"], "/grants/2");
    assert_eq!(disabled.metadata["code"], json!("account_disabled"));
    denied_decision(&disabled);

    // An API key in the default `x-api-key` header. (`ambiguous_grant` cannot be reached: the
    // compiler refuses a policy where two grants can match one principal with two accounts.)
    let keyed_response = world
        .check(forwarded(&[
            ("mcp-method", "tools/call"),
            ("mcp-name", "ops__restart"),
            ("x-api-key", STATIC_KEY),
        ]))
        .await;
    // The key is capgate's to check, not the upstream's to see.
    let Some(HttpResponse::OkResponse(ok)) = &keyed_response.http_response else {
        panic!("not allowed: {keyed_response:?}");
    };
    assert_eq!(ok.headers_to_remove, ["x-api-key"]);
    let keyed = seen(&keyed_response);
    assert_eq!(keyed.http, 200, "{keyed:?}");
    assert_eq!(keyed.headers["x-capgate-account"], "ops-a");
    let record = world.record(&keyed.headers["x-capgate-decision-id"]).await;
    assert_eq!(record.issuer.as_deref(), Some("batch"));

    // A ceiling: RateLimit headers for the client while calls are left, then 429 + Retry-After.
    for left in [1, 0] {
        let capped = seen(&world.check(call("knowledge__search", &docs)).await);
        assert_eq!(capped.http, 200, "{capped:?}");
        assert_eq!(
            capped.response_headers["ratelimit-policy"],
            "\"capgate\";q=2;w=3600"
        );
        let limit = &capped.response_headers["ratelimit"];
        assert!(limit.starts_with(&format!("\"capgate\";r={left};t=")), "{limit}");
    }
    let exhausted = seen(&world.check(call("knowledge__search", &docs)).await);
    assert_eq!(
        (exhausted.grpc, exhausted.http),
        (Code::ResourceExhausted as i32, 429),
        "{exhausted:?}"
    );
    // The seconds until the window that opened at the first counted call ends.
    let retry: u64 = exhausted.headers["retry-after"].parse().unwrap();
    assert!((3500..=3600).contains(&retry), "{exhausted:?}");
    assert_eq!(exhausted.body["error"]["data"]["code"], "limit_exhausted");
    assert_eq!(exhausted.body["error"]["data"]["pointer"], "/grants/1");
    let record = world.record(&denied_decision(&exhausted)).await;
    assert_eq!(record.usage_calls, Some(2));

    // A client certificate from the TLS terminator: only a gateway trusted to assert may forward it.
    let xfcc = r#"Hash=ab;Subject="CN=svc-pay,OU=payments,O=Acme""#;
    let certified = forwarded(&[
        ("mcp-method", "tools/call"),
        ("mcp-name", "payments__refund"),
        ("x-forwarded-client-cert", xfcc),
    ]);
    let trusted = seen(&world.check_as(certified.clone(), TRUSTED_TOKEN).await);
    assert_eq!(trusted.http, 200, "{trusted:?}");
    let record = world.record(&trusted.headers["x-capgate-decision-id"]).await;
    assert_eq!(record.gateway, "istio-ingress");
    assert_eq!(record.issuer.as_deref(), Some("edge"));
    let untrusted = seen(&world.check(certified).await);
    assert_eq!(
        (untrusted.grpc, untrusted.http),
        (Code::PermissionDenied as i32, 403),
        "{untrusted:?}"
    );
    assert!(
        untrusted.body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("--asserting-gateway-token")),
        "{untrusted:?}"
    );

    // The peer certificate itself, as Envoy sends it with `include_peer_certificate`
    // (URL-encoded PEM in `source.certificate`): its subject is read as the DN above.
    let pem = {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationalUnitName, "payments");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc-peer");
        params.self_signed(&key).unwrap().pem()
    };
    let peer = |pem: &str| {
        let mut request = forwarded(&[("mcp-method", "tools/call"), ("mcp-name", "payments__refund")]);
        let source = request.attributes.as_mut().unwrap().source.as_mut().unwrap();
        source.certificate =
            percent_encoding::utf8_percent_encode(pem, percent_encoding::NON_ALPHANUMERIC).to_string();
        source.principal = "spiffe://acme/ns/pay/sa/peer".into();
        request
    };
    let whole = seen(&world.check_as(peer(&pem), TRUSTED_TOKEN).await);
    assert_eq!(whole.http, 200, "{whole:?}");
    let record = world.record(&whole.headers["x-capgate-decision-id"]).await;
    assert_eq!(
        (record.issuer.as_deref(), record.subject.as_deref()),
        (Some("edge"), Some("svc-peer"))
    );
    let mangled = pem.replacen("MII", "MIX", 1);
    let mangled = seen(&world.check_as(peer(&mangled), TRUSTED_TOKEN).await);
    assert_eq!(mangled.http, 401, "{mangled:?}");
    assert_eq!(mangled.body["error"]["data"]["code"], "credential_invalid");

    // An unknown tool: MCP's own "Invalid params".
    let unknown = seen(&world.check(call("payments__void", &billing)).await);
    assert_eq!(unknown.http, 403, "{unknown:?}");
    assert_eq!(unknown.body["error"]["code"], -32602);
    let record = world.record(&denied_decision(&unknown)).await;
    assert_eq!(record.outcome, RecordOutcome::UnknownTool);

    // No credential, and a bad one: 401 with a Bearer challenge, audited as unauthenticated.
    let missing = seen(
        &world
            .check(forwarded(&[
                ("mcp-method", "tools/call"),
                ("mcp-name", "payments__refund"),
            ]))
            .await,
    );
    assert_eq!(
        (missing.grpc, missing.http),
        (Code::Unauthenticated as i32, 401),
        "{missing:?}"
    );
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    assert_eq!(missing.body["error"]["data"]["code"], "credential_missing");
    let forged = format!("{}x", world.token("ana", "billing"));
    let bad = seen(
        &world
            .check(call("payments__refund", &format!("Bearer {forged}")))
            .await,
    );
    assert_eq!(bad.http, 401, "{bad:?}");
    assert!(
        bad.headers["www-authenticate"].starts_with("Bearer error=\"invalid_token\""),
        "{bad:?}"
    );
    let record = world.record(&denied_decision(&bad)).await;
    assert_eq!(record.outcome, RecordOutcome::Unauthenticated);

    // Every record of this door says so; the metrics count them under `door="ext_authz"`.
    let audit = world.audit().await;
    assert_eq!(audit.len(), 13, "{audit:#?}");
    assert!(
        audit.iter().all(|record| record.door == Door::ExtAuthz),
        "{audit:#?}"
    );
    let allows = world
        .decisions_counted(&[("door", "ext_authz"), ("outcome", "allow"), ("code", "granted")])
        .await;
    assert_eq!(allows, 6.0);
    let exhausted = world
        .decisions_counted(&[("door", "ext_authz"), ("code", "limit_exhausted")])
        .await;
    assert_eq!(exhausted, 1.0);

    // Nothing secret in the audit trail or the logs.
    let everything = format!("{audit:?}\n{}", world.serve.logs());
    for secret in [
        STATIC_KEY,
        ACCOUNT_SECRET,
        GATEWAY_TOKEN,
        TRUSTED_TOKEN,
        forged.as_str(),
    ] {
        assert!(!everything.contains(secret), "a secret leaked");
    }
}

#[tokio::test]
async fn the_target_comes_from_headers_the_mcp_filter_kuadrant_or_the_body_and_must_agree() {
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let billing = format!("Bearer {}", world.token("ana", "billing"));
    let authorization = ("authorization", billing.as_str());
    let allowed_tool = |seen: &Seen| {
        assert_eq!(seen.http, 200, "{seen:?}");
        seen.headers["x-capgate-decision-id"].clone()
    };

    // Envoy's MCP filter metadata.
    let from_metadata = forwarded_with(
        &[authorization],
        "",
        HashMap::new(),
        Some(mcp_filter_metadata("tools/call", "payments__refund")),
    );
    let id = allowed_tool(&seen(&world.check(from_metadata).await));
    assert_eq!(world.record(&id).await.tool.as_deref(), Some("payments__refund"));
    // … as Envoy before 1.38 names its namespace; and a denial echoes the id the filter read,
    // though no body was forwarded.
    let older = forwarded_with(
        &[authorization],
        "",
        HashMap::new(),
        Some(mcp_filter_metadata_in(
            "mcp_proxy",
            "tools/call",
            "payments__refund",
            3.0,
        )),
    );
    allowed_tool(&seen(&world.check(older).await));
    let unknown = forwarded_with(
        &[authorization],
        "",
        HashMap::new(),
        Some(mcp_filter_metadata_in(
            "envoy.filters.http.mcp",
            "tools/call",
            "payments__nothing",
            12.0,
        )),
    );
    let unknown = seen(&world.check(unknown).await);
    assert_eq!(
        (unknown.http, unknown.body["id"].clone()),
        (403, json!(12)),
        "{unknown:?}"
    );

    // Kuadrant's router: an un-prefixed tool and `<namespace>/<server>`.
    let kuadrant = forwarded(&[
        authorization,
        ("x-mcp-method", "tools/call"),
        ("x-mcp-toolname", "refund"),
        ("x-mcp-servername", "team-a/payments"),
    ]);
    let id = allowed_tool(&seen(&world.check(kuadrant).await));
    assert_eq!(world.record(&id).await.tool.as_deref(), Some("payments__refund"));

    // The route names the server in `context_extensions`; it wins over the header.
    let routed = forwarded_with(
        &[
            authorization,
            ("mcp-method", "tools/call"),
            ("mcp-name", "refund"),
            ("x-mcp-servername", "knowledge"),
        ],
        "",
        [("mcp_server".to_owned(), "payments".to_owned())]
            .into_iter()
            .collect(),
        None,
    );
    let id = allowed_tool(&seen(&world.check(routed).await));
    assert_eq!(world.record(&id).await.tool.as_deref(), Some("payments__refund"));

    // The JSON-RPC body alone.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "payments__refund", "arguments": {"amount": 5}}})
    .to_string();
    let id = allowed_tool(&seen(
        &world
            .check(forwarded_with(&[authorization], &body, HashMap::new(), None))
            .await,
    ));
    assert_eq!(world.record(&id).await.tool.as_deref(), Some("payments__refund"));

    // A body and headers that agree, and one that does not: refused, with the body's id echoed.
    let agreeing = forwarded_with(
        &[
            authorization,
            ("mcp-method", "tools/call"),
            ("mcp-name", "payments__refund"),
        ],
        &body,
        HashMap::new(),
        None,
    );
    allowed_tool(&seen(&world.check(agreeing).await));
    let before = world.audit().await.len();
    for (headers, field) in [
        (
            vec![
                authorization,
                ("mcp-method", "tools/call"),
                ("mcp-name", "knowledge__search"),
            ],
            "mcp-name",
        ),
        (vec![authorization, ("mcp-method", "tools/list")], "mcp-method"),
    ] {
        let disagreeing = seen(
            &world
                .check(forwarded_with(&headers, &body, HashMap::new(), None))
                .await,
        );
        assert_eq!(
            (disagreeing.grpc, disagreeing.http),
            (Code::InvalidArgument as i32, 400),
            "{disagreeing:?}"
        );
        assert_eq!(disagreeing.body["id"], 7);
        let message = disagreeing.body["error"]["message"].as_str().expect("a message");
        assert!(message.contains(&format!("`{field}`")), "{message}");
    }

    // A body that is not JSON-RPC, or was cut by Envoy: refused, naming the body.
    let not_json = seen(
        &world
            .check(forwarded_with(
                &[authorization],
                "{\"jsonrpc\":",
                HashMap::new(),
                None,
            ))
            .await,
    );
    assert_eq!(not_json.http, 400, "{not_json:?}");
    assert_eq!(not_json.body["error"]["code"], -32700);
    let cut = forwarded_with(
        &[authorization, ("x-envoy-auth-partial-body", "true")],
        &body,
        HashMap::new(),
        None,
    );
    let cut = seen(&world.check(cut).await);
    assert_eq!(cut.http, 413, "{cut:?}");
    assert!(cut.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("max_request_bytes"));
    // None of these took a decision.
    assert_eq!(world.audit().await.len(), before);
}

#[tokio::test]
async fn methods_fail_closed_listing_and_lifecycle_pass_without_a_decision() {
    let Some(world) = World::start(&["--ext-authz-allow-method", "resources/read"]).await else {
        return;
    };
    let billing = format!("Bearer {}", world.token("ana", "billing"));
    for method in [
        "initialize",
        "server/discover",
        "ping",
        "tools/list",
        "notifications/initialized",
        "resources/read",
    ] {
        let passed = seen(
            &world
                .check(forwarded(&[("mcp-method", method), ("authorization", &billing)]))
                .await,
        );
        assert_eq!((passed.grpc, passed.http), (0, 200), "{method}: {passed:?}");
        assert!(
            passed.headers.is_empty() && passed.metadata.is_empty(),
            "{method}: {passed:?}"
        );
    }
    let refused = seen(
        &world
            .check(forwarded(&[
                ("mcp-method", "prompts/get"),
                ("authorization", &billing),
            ]))
            .await,
    );
    assert_eq!(
        (refused.grpc, refused.http),
        (Code::PermissionDenied as i32, 403),
        "{refused:?}"
    );
    assert!(refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("prompts/get"));
    let no_method = seen(&world.check(forwarded(&[("authorization", &billing)])).await);
    assert_eq!(no_method.http, 403, "{no_method:?}");
    let no_name = seen(
        &world
            .check(forwarded(&[
                ("mcp-method", "tools/call"),
                ("authorization", &billing),
            ]))
            .await,
    );
    assert_eq!(no_name.http, 400, "{no_name:?}");
    assert!(no_name.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("`mcp-name`"));
    assert!(world.audit().await.is_empty(), "no decision, no record");
}

#[tokio::test]
async fn oversize_fields_are_refused_by_name_and_a_bad_gateway_token_is_unauthenticated() {
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let billing = format!("Bearer {}", world.token("ana", "billing"));
    let long_tool = "t".repeat(513);
    let long_token = format!("Bearer {}", "a".repeat(16 * 1024 + 1));
    let long_id = "r".repeat(129);
    for (headers, field) in [
        (
            vec![
                ("mcp-method", "tools/call"),
                ("mcp-name", long_tool.as_str()),
                ("authorization", billing.as_str()),
            ],
            "mcp-name",
        ),
        (
            vec![
                ("mcp-method", "tools/call"),
                ("mcp-name", "payments__refund"),
                ("authorization", long_token.as_str()),
            ],
            "authorization",
        ),
        (
            vec![
                ("mcp-method", "tools/call"),
                ("mcp-name", "payments__refund"),
                ("authorization", billing.as_str()),
                ("x-request-id", long_id.as_str()),
            ],
            "x-request-id",
        ),
    ] {
        let refused = seen(&world.check(forwarded(&headers)).await);
        assert_eq!(
            (refused.grpc, refused.http),
            (Code::InvalidArgument as i32, 400),
            "{field}: {refused:?}"
        );
        let message = refused.body["error"]["message"].as_str().expect("a message");
        assert!(message.starts_with(&format!("`{field}`: ")), "{message}");
        assert!(!message.contains("aaaa"), "the value is never quoted: {message}");
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "payments__refund", "arguments": {"blob": "x".repeat(1024 * 1024)}}})
    .to_string();
    let big = seen(
        &world
            .check(forwarded_with(
                &[("authorization", &billing)],
                &body,
                HashMap::new(),
                None,
            ))
            .await,
    );
    assert_eq!(big.http, 413, "{big:?}");
    assert!(big.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .starts_with("`request.http.body`"));
    assert!(world.audit().await.is_empty());

    // The gateway's own token is checked first, as on Decide.
    let status = world
        .client()
        .await
        .check(as_gateway(
            call("payments__refund", &billing),
            "not-a-gateway-token",
        ))
        .await
        .expect_err("an unknown gateway");
    assert_eq!(status.code(), Code::Unauthenticated);
}

/// `CheckRequest` as raw fields, to send what Envoy's types cannot hold: a header value that is
/// not UTF-8 (protobuf `string`s must be), or a field of the wrong wire type.
mod raw {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Header {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Http {
        #[prost(message, repeated, tag = "3")]
        pub headers: Vec<Header>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(message, optional, tag = "2")]
        pub http: Option<Http>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Attributes {
        #[prost(message, optional, tag = "4")]
        pub request: Option<Request>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Check {
        #[prost(message, optional, tag = "1")]
        pub attributes: Option<Attributes>,
    }
    /// `attributes` as a number: the wrong wire type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Garbage {
        #[prost(uint64, tag = "1")]
        pub attributes: u64,
    }
}

/// Sends `message` as a `CheckRequest` to `Authorization/Check`.
async fn check_raw<M: prost::Message + Send + Sync + 'static>(
    world: &World,
    message: M,
    token: &str,
) -> Result<CheckResponse, tonic::Status> {
    let mut client = tonic::client::Grpc::new(world.serve.channel().await);
    client.ready().await.expect("ready");
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/envoy.service.auth.v3.Authorization/Check");
    client
        .unary(
            as_gateway(message, token),
            path,
            tonic_prost::ProstCodec::<M, CheckResponse>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_request_that_does_not_decode_is_an_answered_denial_never_a_grpc_error() {
    // Under `failure_mode_allow: true` Envoy lets a request through on any gRPC error: a header
    // byte that is not UTF-8 must not be a way past the check.
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let not_utf8 = raw::Check {
        attributes: Some(raw::Attributes {
            request: Some(raw::Request {
                http: Some(raw::Http {
                    headers: vec![
                        raw::Header {
                            key: "mcp-method".into(),
                            value: b"tools/call".to_vec(),
                        },
                        raw::Header {
                            key: "mcp-name".into(),
                            value: b"knowledge__search\xff".to_vec(),
                        },
                    ],
                }),
            }),
        }),
    };
    let oversized = raw::Check {
        attributes: Some(raw::Attributes {
            request: Some(raw::Request {
                http: Some(raw::Http {
                    headers: vec![raw::Header {
                        key: "x-padding".into(),
                        value: vec![b'x'; capgate::service::bounds::MAX_MESSAGE_BYTES],
                    }],
                }),
            }),
        }),
    };
    for (what, answer) in [
        (
            "a header that is not UTF-8",
            check_raw(&world, not_utf8, GATEWAY_TOKEN).await,
        ),
        (
            "the wrong wire type",
            check_raw(&world, raw::Garbage { attributes: 7 }, GATEWAY_TOKEN).await,
        ),
        // Refused by tonic before the door saw it, as `OUT_OF_RANGE`, until issue 28.
        (
            "a message over the bound",
            check_raw(&world, oversized, GATEWAY_TOKEN).await,
        ),
    ] {
        let answer = answer.unwrap_or_else(|status| panic!("{what}: a gRPC error: {status:?}"));
        let denied = seen(&answer);
        assert_eq!(
            (denied.grpc, denied.http),
            (Code::InvalidArgument as i32, 400),
            "{what}: {denied:?}"
        );
        let message = denied.body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("cannot be read"), "{what}: {message}");
    }
    // The gateway's token still comes first.
    let status = check_raw(&world, raw::Garbage { attributes: 7 }, "not-a-token")
        .await
        .expect_err("an unknown gateway");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(world.audit().await.is_empty(), "nothing was decided");
}

#[tokio::test]
async fn a_retry_with_the_same_x_request_id_gets_the_same_answer_and_consumes_once() {
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let docs = format!("Bearer {}", world.token("dee", "docs"));
    let with_id = |id: &str| {
        forwarded(&[
            ("mcp-method", "tools/call"),
            ("mcp-name", "knowledge__search"),
            ("authorization", docs.as_str()),
            ("x-request-id", id),
        ])
    };
    let first = seen(&world.check(with_id("envoy-req-1")).await);
    let again = seen(&world.check(with_id("envoy-req-1")).await);
    assert_eq!(first.http, 200, "{first:?}");
    assert_eq!(first.headers, again.headers);
    assert_eq!(
        first.response_headers["ratelimit"],
        again.response_headers["ratelimit"]
    );
    // One call consumed: the next request still has one left.
    let next = seen(&world.check(with_id("envoy-req-2")).await);
    assert!(
        next.response_headers["ratelimit"].starts_with("\"capgate\";r=0;"),
        "{next:?}"
    );
    // Two decisions, and the retry recorded as a replay of the first.
    let audit = world.audit().await;
    assert_eq!(audit.len(), 3, "{audit:#?}");
    let replays: Vec<_> = audit
        .iter()
        .filter(|record| record.outcome == RecordOutcome::Replayed)
        .collect();
    assert_eq!(replays.len(), 1, "{audit:#?}");
    assert_eq!(
        replays[0].first_decision_id.as_deref(),
        Some(first.headers["x-capgate-decision-id"].as_str())
    );
    assert_eq!(
        world
            .record(&first.headers["x-capgate-decision-id"])
            .await
            .request_id
            .as_deref(),
        Some("envoy-req-1")
    );
}

#[tokio::test]
async fn a_counter_that_cannot_be_read_is_usage_unknown_503() {
    // The counters' table gone from under the server: every counter read fails, so a capped
    // call's usage is unknown. (A zero `--store-timeout` is not a sure failure: a read that
    // answers before the timer's first tick still counts.)
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let admin = sqlx::PgPool::connect(&world.database.url())
        .await
        .expect("connect");
    sqlx::query("DROP TABLE usage_counters")
        .execute(&admin)
        .await
        .expect("drop the counters");
    admin.close().await;
    let docs = format!("Bearer {}", world.token("dee", "docs"));
    let unknown = seen(&world.check(call("knowledge__search", &docs)).await);
    assert_eq!(
        (unknown.grpc, unknown.http),
        (Code::Unavailable as i32, 503),
        "{unknown:?}"
    );
    assert_eq!(unknown.headers["retry-after"], "1");
    assert_eq!(unknown.body["error"]["data"]["code"], "usage_unknown");
    let record = world.record(&denied_decision(&unknown)).await;
    assert_eq!(record.door, Door::ExtAuthz);
}

/// `request` with `extra` more forwarded headers, in the `headers` map or, as Envoy sends them
/// with `encode_raw_headers`, in `header_map`.
fn with_filler_headers(mut request: CheckRequest, extra: usize, raw: bool) -> CheckRequest {
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    let http = request
        .attributes
        .as_mut()
        .and_then(|attributes| attributes.request.as_mut())
        .and_then(|request| request.http.as_mut())
        .expect("a forwarded HTTP request");
    let filler = (0..extra).map(|index| (format!("x-filler-{index}"), "v".to_owned()));
    if raw {
        let headers = http
            .headers
            .drain()
            .chain(filler)
            .map(|(key, value)| HeaderValue {
                key,
                value: String::new(),
                raw_value: value.into_bytes(),
            })
            .collect();
        http.header_map = Some(HeaderMap { headers });
    } else {
        http.headers.extend(filler);
    }
    request
}

#[tokio::test]
async fn a_request_with_more_headers_than_a_gateway_forwards_is_refused_by_name() {
    // Issue 28: 100,000 forwarded headers took 33.7 s. Envoy forwards at most
    // `max_headers_count` (100 by default); past 1024 the request is refused, counted before any
    // header is read.
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let billing = format!("Bearer {}", world.token("ana", "billing"));
    for raw in [false, true] {
        // Three headers of the call itself, and the rest up to the limit: decided.
        let at_limit = seen(
            &world
                .check(with_filler_headers(call("payments__refund", &billing), 1021, raw))
                .await,
        );
        assert_eq!(at_limit.http, 200, "raw {raw}: {at_limit:?}");
        let field = if raw {
            "request.http.header_map"
        } else {
            "request.http.headers"
        };
        for extra in [1022, 100_000] {
            let started = std::time::Instant::now();
            let refused = seen(
                &world
                    .check(with_filler_headers(
                        call("payments__refund", &billing),
                        extra,
                        raw,
                    ))
                    .await,
            );
            let took = started.elapsed();
            assert_eq!(
                (refused.grpc, refused.http),
                (Code::InvalidArgument as i32, 431),
                "raw {raw}, {extra} more: {refused:?}"
            );
            let message = refused.body["error"]["message"].as_str().expect("a message");
            assert_eq!(
                message,
                format!("`{field}`: {} headers, more than the limit of 1024", extra + 3),
                "raw {raw}"
            );
            // Generous for a loaded 2-core machine running a debug build: the issue's 33.7 s
            // was a hundred times this.
            assert!(
                took < std::time::Duration::from_secs(10),
                "raw {raw}, {extra} more: {took:?}"
            );
        }
    }
    // Two allows were decided; the refusals were not.
    assert_eq!(world.audit().await.len(), 2);
}

/// A forwarded `tools/call` JSON-RPC body with these `params`.
fn tools_call_body(params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}).to_string()
}

#[tokio::test]
async fn a_forwarded_body_carries_the_arguments_a_grants_conditions_read() {
    use support::doors::{
        refund, Conditional, AMOUNT_CONDITION, CONDITIONAL_TOKEN, CURRENCY_CONDITION, DESK_KEY, REFUND,
        RELEASE,
    };
    let Some(world) = Conditional::start().await else {
        return;
    };
    let key = ("x-api-key", DESK_KEY);
    let check = |request: CheckRequest| {
        let mut client = world.doors.ext_authz.clone();
        async move {
            seen(
                &client
                    .check(as_gateway(request, CONDITIONAL_TOKEN))
                    .await
                    .expect("an answered Check")
                    .into_inner(),
            )
        }
    };
    // The body alone names the method and the tool; its `params.arguments` are the arguments.
    let with_body = |arguments: Value| {
        forwarded_with(
            &[key],
            &tools_call_body(json!({"name": REFUND, "arguments": arguments})),
            HashMap::new(),
            None,
        )
    };

    // Arguments that meet every condition: allowed by the conditional grant.
    let allowed = check(with_body(refund(100.0, "EUR"))).await;
    assert_eq!((allowed.grpc, allowed.http), (0, 200), "{allowed:?}");
    assert_eq!(allowed.metadata["pointer"], json!("/grants/0"));
    assert_eq!(allowed.headers["x-capgate-account"], "support-payments");

    // Arguments that fail a condition: a policy denial (403, PERMISSION_DENIED, -32001) naming
    // the condition that failed, in the body and the metadata, and so recorded.
    for (arguments, pointer) in [
        (refund(100.5, "EUR"), AMOUNT_CONDITION),
        (refund(20.0, "GBP"), CURRENCY_CONDITION),
        (
            json!({"paymentId": "pay-1", "amount": "20", "currency": "EUR"}),
            AMOUNT_CONDITION,
        ),
    ] {
        let denied = check(with_body(arguments.clone())).await;
        assert_eq!(
            (denied.grpc, denied.http),
            (Code::PermissionDenied as i32, 403),
            "{arguments}: {denied:?}"
        );
        assert_eq!(denied.body["id"], 7, "{denied:?}");
        assert_eq!(denied.body["error"]["code"], -32001, "{denied:?}");
        assert_eq!(
            denied.body["error"]["data"]["code"], "condition_failed",
            "{denied:?}"
        );
        assert_eq!(denied.body["error"]["data"]["pointer"], pointer, "{denied:?}");
        assert_eq!(denied.metadata["code"], json!("condition_failed"));
        assert_eq!(denied.metadata["pointer"], json!(pointer));
        let record = world.record(&denied_decision(&denied)).await;
        assert_eq!(record.outcome, RecordOutcome::Deny);
        assert_eq!(record.code.map(|code| code.as_str()), Some("condition_failed"));
        assert_eq!(record.path.as_deref(), Some(pointer));
    }

    // Arguments not forwarded — no body (the target from the headers), or a body whose
    // `tools/call` has no `arguments` — deny `arguments_missing`, naming the first condition
    // that reads one: a policy denial like any other.
    let headers_only = forwarded(&[("mcp-method", "tools/call"), ("mcp-name", REFUND), key]);
    let no_arguments = forwarded_with(
        &[key],
        &tools_call_body(json!({"name": REFUND})),
        HashMap::new(),
        None,
    );
    for request in [headers_only, no_arguments] {
        let missing = check(request).await;
        assert_eq!(
            (missing.grpc, missing.http),
            (Code::PermissionDenied as i32, 403),
            "{missing:?}"
        );
        assert_eq!(
            missing.body["error"]["data"]["code"], "arguments_missing",
            "{missing:?}"
        );
        assert_eq!(
            missing.body["error"]["data"]["pointer"], AMOUNT_CONDITION,
            "{missing:?}"
        );
        let record = world.record(&denied_decision(&missing)).await;
        assert_eq!(record.code.map(|code| code.as_str()), Some("arguments_missing"));
    }

    // `raw_body` (`pack_as_bytes`) is read as `body` is.
    let mut raw = forwarded(&[key]);
    if let Some(http) = raw
        .attributes
        .as_mut()
        .and_then(|attributes| attributes.request.as_mut()?.http.as_mut())
    {
        http.raw_body =
            tools_call_body(json!({"name": REFUND, "arguments": refund(5.0, "USD")})).into_bytes();
    }
    let allowed = check(raw).await;
    assert_eq!(allowed.http, 200, "{allowed:?}");

    // A body whose arguments are not an object is not a `tools/call`: refused unread, nothing
    // decided; and a body Envoy cut is refused whole, never read for arguments.
    let bad = check(forwarded_with(
        &[key],
        &tools_call_body(json!({"name": REFUND, "arguments": [100, "EUR"]})),
        HashMap::new(),
        None,
    ))
    .await;
    assert_eq!(
        (bad.grpc, bad.http, bad.body["error"]["code"].clone()),
        (Code::InvalidArgument as i32, 400, json!(-32600)),
        "{bad:?}"
    );
    assert!(
        bad.body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("`params.arguments`")),
        "{bad:?}"
    );
    let cut = check(forwarded_with(
        &[key, ("x-envoy-auth-partial-body", "true")],
        &tools_call_body(json!({"name": REFUND, "arguments": refund(5.0, "USD")})),
        HashMap::new(),
        None,
    ))
    .await;
    assert_eq!(cut.http, 413, "{cut:?}");

    // A grant whose only condition is on the instant needs no arguments.
    let release = check(forwarded(&[
        ("mcp-method", "tools/call"),
        ("mcp-name", RELEASE),
        key,
    ]))
    .await;
    assert_eq!(release.http, 200, "{release:?}");
    assert_eq!(release.headers["x-capgate-account"], "release-robot");

    // The arguments' values are the caller's business: none is logged.
    assert!(!world.serve.logs().contains("pay-1"), "an argument was logged");
}
