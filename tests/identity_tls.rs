//! An identity provider behind HTTPS with a private certificate authority:
//! `capgate serve --oidc-ca FILE` trusts it; without the flag its keys
//! cannot be fetched and a bearer token is answered UNAVAILABLE (fail
//! closed), never allowed.

mod support;

use base64::Engine as _;
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{credential, decide_request, decide_response, Credential, DecideRequest, Outcome};
use support::oidc::{KeyType, OidcProvider, AUDIENCE};
use support::process::Serve;
use tonic::Code;

fn policy(discovery: &str) -> String {
    format!(
        r#"version: 1
capabilities:
  - id: docs.page.search
upstreams:
  - id: knowledge
    transport: {{ kind: mcp-http, url: "https://knowledge.example.net/mcp" }}
    tools:
      - {{ name: search, capability: docs.page.search }}
accounts:
  - id: docs-svc
    secret: {{ ref: "env://DOCS" }}
principals:
  issuers:
    - id: corp
      kind: oidc
      discovery: "{discovery}"
      audience: {AUDIENCE}
grants:
  - to: {{ issuer: corp }}
    capabilities: [docs.page.search]
    using: docs-svc
"#
    )
}

async fn serve(dir: &std::path::Path, idp: &OidcProvider, ca: Option<&std::path::Path>) -> Serve {
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, policy(&idp.discovery_url())).expect("write the policy");
    let database = format!(
        "sqlite://{}",
        dir.join(format!("{}.db", support::unique())).display()
    );
    let mut args = vec![
        "--database-url".to_owned(),
        database,
        "--policy".to_owned(),
        policy_file.display().to_string(),
        "--oidc-fetch-timeout".to_owned(),
        "1s".to_owned(),
    ];
    if let Some(ca) = ca {
        args.extend(["--oidc-ca".to_owned(), ca.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(&args).await
}

fn ask(token: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Credential(Credential {
            kind: Some(credential::Kind::BearerToken(token.to_owned())),
            issuer: String::new(),
        })),
        target: Some(decide_request::Target::Capability("docs.page.search".into())),
        request_id: String::new(),
        arguments_json: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_only_when_given() {
    let idp = OidcProvider::start_tls().await;
    assert!(idp.discovery_url().starts_with("https://"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ca = idp.ca_certificate().expect("a TLS provider has a CA");
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::engine::general_purpose::STANDARD.encode(ca.as_ref())
    );
    let ca_file = dir.path().join("idp-ca.pem");
    std::fs::write(&ca_file, pem).expect("write the CA");
    let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("ana"));

    let trusting = serve(dir.path(), &idp, Some(&ca_file)).await;
    let mut client = DecisionServiceClient::new(trusting.channel().await);
    let answer = client.decide(ask(&token)).await.expect("an answer").into_inner();
    match answer.result {
        Some(decide_response::Result::Decision(decision)) => assert_eq!(decision.outcome(), Outcome::Allow),
        other => panic!("not a decision: {other:?}"),
    }

    let distrusting = serve(dir.path(), &idp, None).await;
    let mut client = DecisionServiceClient::new(distrusting.channel().await);
    let status = client
        .decide(ask(&token))
        .await
        .expect_err("the provider is not trusted");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    // A file that holds no certificate is refused at start-up.
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(["serve", "--oidc-ca", not_pem.to_str().expect("utf-8")])
        .output()
        .expect("run capgate");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("no certificate"));
}
