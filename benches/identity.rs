//! What verifying an OIDC bearer token costs, in two groups.
//!
//! `jwt_verify`: one token with a warm key set (`identity::jwt::verify`: parse, key selection,
//! signature, claims), per algorithm, against two baselines measured in the same run: `jwt::peek` on
//! the same token (the parsing the service does anyway to choose the issuer) and a SHA-256 of the
//! token's bytes (the cost of touching it at all).
//!
//! `decide_identity`: what a bearer token adds to one `Decide`, as the service runs it
//! — through the service's own `service::identify::identify`. Baseline: a trusted gateway asserting
//! the issuer, subject and attributes the token carries. Credential path: the token with the issuer
//! hint (`bearer/…`) and without it (`bearer_no_hint/…`, the issuer found from `iss`): peek, the
//! candidates, a warm-cache key-set hit, verify, then the claims mapped through the core. The discovery document and key set are served once over loopback HTTP by the
//! test provider of `tests/support/oidc.rs`; every measured call is a cache hit (asserted after the
//! group). Both paths run as futures on a tokio current-thread runtime (`b.to_async`), with an empty
//! future as a third baseline for the harness itself.
//!
//! ```sh
//! cargo bench --bench identity -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Medians are in `target/criterion/{jwt_verify,decide_identity}/*/new/estimates.json`.

#[path = "../tests/support/oidc.rs"]
#[allow(dead_code)]
mod oidc;

use std::hint::black_box;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use std::sync::Arc;

use capgate::identity::jwks::{OidcDirectory, OidcSettings};
use capgate::identity::jwt::{self, Expected, Jwks};
use capgate::identity::Presented;
use capgate::service::active::Active;
use capgate::service::auth::Gateway;
use capgate::service::identify::{identify, Asked, AssertedCaller};
use capgate_core::policy::compile;
use capgate_core::principals::Principal;
use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::{Algorithm, EncodingKey};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::traits::PublicKeyParts;
use serde_json::json;
use sha2::{Digest, Sha256};

const ISSUER: &str = "https://idp.example.com/realms/agents";
const AUDIENCE: &str = "capgate";
/// A fixed decision instant; the tokens expire an hour later.
const AT_MS: i64 = 1_760_000_000_000;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// One token per algorithm, and the set with all three public keys (plus two unrelated ones, as an
/// issuer mid-rotation would publish).
fn fixture() -> (Vec<(&'static str, String)>, Jwks) {
    let rsa = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("an RSA key");
    let rsa_public = rsa.to_public_key();
    let rsa_der = rsa.to_pkcs1_der().expect("PKCS#1");
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a P-256 key");
    let p256_point = p256.public_key_raw();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("an Ed25519 key");
    let old_ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("an Ed25519 key");

    let set = json!({"keys": [
        {"kty": "OKP", "crv": "Ed25519", "kid": "old-ed", "use": "sig", "x": b64(old_ed.public_key_raw())},
        {"kty": "RSA", "kid": "rsa", "alg": "RS256", "use": "sig",
         "n": b64(&rsa_public.n().to_bytes_be()), "e": b64(&rsa_public.e().to_bytes_be())},
        {"kty": "EC", "crv": "P-256", "kid": "p256", "alg": "ES256", "use": "sig",
         "x": b64(&p256_point[1..33]), "y": b64(&p256_point[33..65])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA", "use": "sig", "x": b64(ed.public_key_raw())},
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": b64(&rsa_public.n().to_bytes_be()), "e": "AQAB"},
    ]});
    let jwks = jwt::parse_jwks(set.to_string().as_bytes()).expect("a key set");

    // Claims of a typical access token.
    let claims = json!({
        "iss": ISSUER, "sub": "agent-7f3c9a", "aud": [AUDIENCE, "account"], "azp": "agent-runner",
        "exp": AT_MS / 1000 + 3600, "iat": AT_MS / 1000 - 60, "nbf": AT_MS / 1000 - 60,
        "jti": "0b6c1a0e-3c55-4d4e-9f5e-8a7c2e1d9b41", "scope": "openid mcp:tools",
        "team": "billing", "groups": ["agents"], "tier": 2,
    });
    let sign = |kid: &str, alg: Algorithm, key: EncodingKey| {
        let header = json!({"typ": "JWT", "alg": format!("{alg:?}"), "kid": kid});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key, alg).expect("sign");
        format!("{input}.{signature}")
    };
    let tokens = vec![
        (
            "RS256",
            sign(
                "rsa",
                Algorithm::RS256,
                EncodingKey::from_rsa_der(rsa_der.as_bytes()),
            ),
        ),
        (
            "ES256",
            sign(
                "p256",
                Algorithm::ES256,
                EncodingKey::from_ec_der(&p256.serialize_der()),
            ),
        ),
        (
            "EdDSA",
            sign(
                "ed",
                Algorithm::EdDSA,
                EncodingKey::from_ed_der(&ed.serialize_der()),
            ),
        ),
    ];
    (tokens, jwks)
}

fn verification(c: &mut Criterion) {
    let (tokens, jwks) = fixture();
    let expected = Expected {
        issuer: ISSUER,
        audience: Some(AUDIENCE),
        at_ms: AT_MS,
    };
    for (name, token) in &tokens {
        let verified = jwt::verify(token, &jwks, &expected).expect("the benchmark's tokens verify");
        assert_eq!(verified.subject, "agent-7f3c9a", "{name}");
    }

    let mut group = c.benchmark_group("jwt_verify");
    for (name, token) in &tokens {
        group.bench_function(*name, |b| {
            b.iter(|| jwt::verify(black_box(token), &jwks, &expected))
        });
    }
    // Baselines, on the RS256 token (all three are within a few bytes of each other).
    let token = &tokens[0].1;
    group.bench_function("baseline_peek", |b| b.iter(|| jwt::peek(black_box(token))));
    group.bench_function("baseline_sha256", |b| {
        b.iter(|| Sha256::digest(black_box(token.as_bytes())))
    });
    group.finish();
}

/// The bench policy: an `oidc` issuer whose keys the provider serves, and an `mtls` issuer that is
/// never a candidate for a token.
fn bench_policy(discovery: &str) -> String {
    format!(
        r#"version: 1
capabilities: [{{ id: docs.page.search }}]
accounts: []
principals:
  issuers:
    - id: edge
      kind: mtls
      attributes: {{ team: "dn:ou" }}
    - id: agents
      kind: oidc
      discovery: "{discovery}"
      audience: {AUDIENCE}
      attributes: {{ team: "claim:team", tier: "claim:tier", groups: "claim:groups" }}
grants: []
"#
    )
}

/// Who `Decide` finds for `asked`, through the service's own `identify`.
async fn principal_of(
    directory: &Arc<OidcDirectory>,
    active: &Active,
    gateway: &Gateway,
    asked: &Asked<'_>,
) -> Option<Principal> {
    identify(directory, active, gateway, asked, AT_MS)
        .await
        .ok()
        .and_then(|identity| identity.outcome.ok())
}

fn decide_identity(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The provider's server task runs on `rt`, whenever `rt` is driven (the warm-up fetch below).
    let idp = rt.block_on(oidc::OidcProvider::start());
    let directory = Arc::new(OidcDirectory::new(OidcSettings::default()).expect("an OIDC directory"));
    let compiled = compile(bench_policy(&idp.discovery_url()).as_bytes(), None);
    let (Some(policy), Some(document)) = (compiled.policy, compiled.document) else {
        panic!("the bench policy does not compile: {:?}", compiled.diagnostics);
    };
    let active = Active::new(1, "bench".into(), policy, document, None);
    let gateway = Gateway {
        name: "gw".into(),
        admin: false,
        may_assert: true,
    };

    // The same access-token claims as the `jwt_verify` group, from this provider.
    let claims = json!({
        "iss": idp.issuer(), "sub": "agent-7f3c9a", "aud": [AUDIENCE, "account"], "azp": "agent-runner",
        "exp": AT_MS / 1000 + 3600, "iat": AT_MS / 1000 - 60, "nbf": AT_MS / 1000 - 60,
        "jti": "0b6c1a0e-3c55-4d4e-9f5e-8a7c2e1d9b41", "scope": "openid mcp:tools",
        "team": "billing", "groups": ["agents"], "tier": 2,
    });
    // Per algorithm: the token with the issuer hint, and without it (the issuer found from `iss`).
    let minted: Vec<(&str, String)> = [
        ("RS256", oidc::KeyType::Rsa),
        ("ES256", oidc::KeyType::P256),
        ("EdDSA", oidc::KeyType::Ed25519),
    ]
    .into_iter()
    .map(|(name, key_type)| (name, idp.mint(&idp.kid(key_type), &claims)))
    .collect();
    let credential = |token: &'static str, hint: Option<&'static str>| Asked::Credential {
        presented: Some(Presented::BearerToken(token)),
        hint,
    };
    let tokens: Vec<(&str, Asked<'static>, Asked<'static>)> = minted
        .into_iter()
        .map(|(name, token)| {
            // The bench runs to the end of the process: leaking one token per algorithm is fine.
            let token: &'static str = Box::leak(token.into_boxed_str());
            (name, credential(token, Some("agents")), credential(token, None))
        })
        .collect();
    // What a trusted gateway would assert for the same caller.
    let asserted = Asked::Principal(AssertedCaller {
        issuer: "agents",
        subject: "agent-7f3c9a",
        attributes: vec![("team", "billing"), ("tier", "2"), ("groups", "agents")],
    });

    // Warm the cache (one discovery and one key-set fetch), and check that every path agrees.
    let expected = rt
        .block_on(principal_of(&directory, &active, &gateway, &asserted))
        .expect("the asserted principal");
    assert_eq!(expected.attributes.len(), 3, "{expected:?}");
    for (name, hinted, found) in &tokens {
        for credential in [hinted, found] {
            let principal = rt.block_on(principal_of(&directory, &active, &gateway, credential));
            assert_eq!(principal.as_ref(), Some(&expected), "{name}");
        }
    }
    let fetches = (
        idp.requests(oidc::Endpoint::Discovery),
        idp.requests(oidc::Endpoint::Jwks),
    );
    assert_eq!(fetches, (1, 1), "one fetch warms the cache");

    let mut group = c.benchmark_group("decide_identity");
    let (directory, active, gateway) = (&directory, &active, &gateway);
    group.bench_function("baseline_empty_future", |b| {
        b.to_async(&rt).iter(|| async { black_box(()) })
    });
    group.bench_function("asserted", |b| {
        b.to_async(&rt)
            .iter(|| async { principal_of(directory, active, gateway, black_box(&asserted)).await })
    });
    for (name, hinted, found) in &tokens {
        group.bench_function(format!("bearer/{name}"), |b| {
            b.to_async(&rt)
                .iter(|| async move { principal_of(directory, active, gateway, black_box(hinted)).await })
        });
        group.bench_function(format!("bearer_no_hint/{name}"), |b| {
            b.to_async(&rt)
                .iter(|| async move { principal_of(directory, active, gateway, black_box(found)).await })
        });
    }
    group.finish();
    assert_eq!(
        (
            idp.requests(oidc::Endpoint::Discovery),
            idp.requests(oidc::Endpoint::Jwks)
        ),
        fetches,
        "every measured call was a cache hit"
    );
    drop(idp);
}

criterion_group!(benches, verification, decide_identity);
criterion_main!(benches);
