//! OIDC key discovery and token verification end to end, at module level: `identity::jwks` fetching
//! from the local provider of `support::oidc` (real HTTP and HTTPS on 127.0.0.1), and
//! `identity::jwt` verifying its tokens against what was fetched. The service-level tests build on
//! the same provider.
//!
//! Every check here was seen to fail once, by a deliberate sabotage of the code it guards (listed in
//! the report of issue 4; each test's comment names its sabotage).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use capgate::identity::jwks::{KeysError, OidcDirectory, OidcSettings};
use capgate::identity::jwt::{self, Expected, JwtError, Verified};
use capgate_core::principals::AuthProblem;
use jsonwebtoken::Algorithm;
use serde_json::json;

use support::oidc::{
    hmac_token, now_ms, unsigned_token, Behaviour, Endpoint, KeyType, OidcProvider, AUDIENCE,
};

/// Test settings: the defaults with a shorter fetch timeout, so failure cases stay quick.
fn settings() -> OidcSettings {
    OidcSettings {
        fetch_timeout: Duration::from_millis(1500),
        ..OidcSettings::default()
    }
}

fn directory(settings: OidcSettings) -> OidcDirectory {
    OidcDirectory::new(settings).expect("an OIDC directory")
}

/// What the service does with a bearer token: peek for the kid, get keys, verify.
async fn authenticate(
    directory: &OidcDirectory,
    idp: &OidcProvider,
    token: &str,
) -> Result<Verified, Outcome> {
    let peeked = jwt::peek(token).map_err(Outcome::Token)?;
    let (issuer, keys) = directory
        .keys(&idp.discovery_url(), peeked.kid.as_deref())
        .await
        .map_err(Outcome::Keys)?;
    let expected = Expected {
        issuer: &issuer,
        audience: Some(AUDIENCE),
        at_ms: now_ms(),
    };
    jwt::verify(token, &keys, &expected).map_err(Outcome::Token)
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Token(JwtError),
    Keys(KeysError),
}

fn refused(outcome: Result<Verified, Outcome>) -> JwtError {
    match outcome {
        Err(Outcome::Token(error)) => error,
        other => panic!("expected a token refusal, got {other:?}"),
    }
}

fn unavailable(outcome: Result<Verified, Outcome>) -> String {
    match outcome {
        Err(Outcome::Keys(KeysError::Unavailable { reason })) => reason,
        other => panic!("expected unavailable keys, got {other:?}"),
    }
}

// Sabotage: `verify` returned `BadSignature` for EdDSA keys (the `suits` check compared with the wrong
// kind) — the EdDSA case failed.
#[tokio::test]
async fn valid_tokens_of_each_algorithm_verify_and_the_keys_are_cached() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    for key_type in KeyType::ALL {
        let token = idp.mint(&idp.kid(key_type), &idp.claims("alice"));
        let verified = authenticate(&directory, &idp, &token)
            .await
            .expect("a valid token");
        assert_eq!(verified.subject, "alice", "{key_type:?}");
        assert_eq!(verified.claims["iss"], json!(idp.issuer()));
    }
    let without_kid = idp.mint_without_kid(&idp.kid(KeyType::P256), &idp.claims("bob"));
    assert_eq!(
        authenticate(&directory, &idp, &without_kid)
            .await
            .expect("kid-less")
            .subject,
        "bob"
    );
    assert_eq!(idp.requests(Endpoint::Discovery), 1);
    assert_eq!(
        idp.requests(Endpoint::Jwks),
        1,
        "one fetch serves every later token"
    );
}

// Sabotage: the `exp` comparison was removed from `check_claims`.
#[tokio::test]
async fn an_expired_token_is_credential_expired() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let mut claims = idp.claims("alice");
    claims["exp"] = json!(now_ms() / 1000 - 120);
    let error = refused(authenticate(&directory, &idp, &idp.mint(&idp.kid(KeyType::Rsa), &claims)).await);
    assert_eq!(error, JwtError::Expired);
    assert_eq!(error.problem(), AuthProblem::CredentialExpired);
}

// Sabotage: the `nbf` comparison was removed from `check_claims`.
#[tokio::test]
async fn a_token_not_yet_valid_is_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let mut claims = idp.claims("alice");
    claims["nbf"] = json!(now_ms() / 1000 + 120);
    let error = refused(authenticate(&directory, &idp, &idp.mint(&idp.kid(KeyType::Ed25519), &claims)).await);
    assert_eq!(error, JwtError::NotYetValid);
    assert_eq!(error.problem(), AuthProblem::CredentialInvalid);
}

// Sabotage: the audience check was skipped (`if let Some(audience) = None::<&str>`).
#[tokio::test]
async fn a_token_for_another_audience_is_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let mut claims = idp.claims("alice");
    claims["aud"] = json!(["someone-else", "another"]);
    let token = idp.mint(&idp.kid(KeyType::P256), &claims);
    assert_eq!(
        refused(authenticate(&directory, &idp, &token).await),
        JwtError::WrongAudience
    );
}

// Sabotage: the `iss` comparison accepted any string.
#[tokio::test]
async fn a_token_from_another_issuer_is_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let mut claims = idp.claims("alice");
    claims["iss"] = json!("http://127.0.0.1:1");
    let token = idp.mint(&idp.kid(KeyType::Rsa), &claims);
    assert_eq!(
        refused(authenticate(&directory, &idp, &token).await),
        JwtError::WrongIssuer
    );
}

// Sabotage: `select` fell back to any suitable key when no key had the token's kid.
#[tokio::test]
async fn an_unknown_kid_is_refetched_once_then_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let key = idp.key(&idp.kid(KeyType::Rsa));
    authenticate(&directory, &idp, &key.mint(&idp.claims("alice")))
        .await
        .expect("warm");
    // Signed by a published key, but naming a kid that is not.
    let token = key.mint_with_header(
        &json!({"alg": "RS256", "kid": "not-published"}),
        &idp.claims("alice"),
    );
    let error = refused(authenticate(&directory, &idp, &token).await);
    assert_eq!(error, JwtError::NoSuchKey);
    assert_eq!(error.problem(), AuthProblem::CredentialInvalid);
    assert_eq!(
        idp.requests(Endpoint::Jwks),
        2,
        "the set was refetched for the unknown kid"
    );
    // Within the refetch interval, the same kid is refused without asking again.
    assert_eq!(
        refused(authenticate(&directory, &idp, &token).await),
        JwtError::NoSuchKey
    );
    assert_eq!(
        (idp.requests(Endpoint::Discovery), idp.requests(Endpoint::Jwks)),
        (1, 2)
    );
}

// Sabotage: `verify` skipped the signature (`Ok(true) | Ok(false) | Err(_) => {}`).
#[tokio::test]
async fn a_tampered_token_is_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let token = idp.mint(&idp.kid(KeyType::P256), &idp.claims("alice"));
    let mut forged = idp.claims("admin");
    forged["exp"] = json!(now_ms() / 1000 + 86_400);
    let forged = idp.mint(&idp.kid(KeyType::P256), &forged);
    // Alice's header and signature around the forged payload.
    let parts: Vec<&str> = token.split('.').collect();
    let forged_payload = forged.split('.').nth(1).expect("a payload");
    let tampered = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
    assert_eq!(
        refused(authenticate(&directory, &idp, &tampered).await),
        JwtError::BadSignature
    );
}

// Sabotage: `Alg::parse` accepted `none` (mapped to RS256) and `verify` skipped the signature for it.
#[tokio::test]
async fn an_unsigned_token_is_refused_before_any_fetch() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let kid = idp.kid(KeyType::Rsa);
    // With an empty signature segment the shape is already wrong; with any signature, the algorithm.
    for (signature, expected) in [("", JwtError::Malformed), ("c2ln", JwtError::AlgorithmRefused)] {
        let token = unsigned_token(Some(&kid), &idp.claims("alice"), signature);
        assert_eq!(refused(authenticate(&directory, &idp, &token).await), expected);
    }
    assert_eq!(
        idp.requests(Endpoint::Jwks),
        0,
        "peek refuses `none` before keys are fetched"
    );
}

// Sabotage: HS256 was added to the allow-list, verifying with the selected key's bytes as secret.
#[tokio::test]
async fn a_token_signed_with_the_public_key_as_hmac_secret_is_refused() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let kid = idp.kid(KeyType::Rsa);
    let pem = idp
        .key(&kid)
        .public_key_pem()
        .expect("an RSA key has a PEM")
        .to_owned();
    let n = idp.key(&kid).jwk["n"].as_str().expect("n").to_owned();
    for secret in [pem.as_bytes(), n.as_bytes()] {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let token = hmac_token(alg, Some(&kid), secret, &idp.claims("admin"));
            assert_eq!(
                refused(authenticate(&directory, &idp, &token).await),
                JwtError::AlgorithmRefused
            );
        }
    }
}

// Sabotage: `keys` returned the cached set without refetching when the kid was unknown.
#[tokio::test]
async fn a_rotated_key_is_picked_up_without_restart() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    let old_kid = idp.kid(KeyType::Rsa);
    let before = idp.mint(&old_kid, &idp.claims("alice"));
    authenticate(&directory, &idp, &before)
        .await
        .expect("valid before rotation");
    assert_eq!(idp.requests(Endpoint::Jwks), 1);

    let new_kid = idp.rotate(KeyType::Rsa);
    let after = idp.mint(&new_kid, &idp.claims("alice"));
    authenticate(&directory, &idp, &after)
        .await
        .expect("valid after rotation");
    assert_eq!(idp.requests(Endpoint::Jwks), 2, "one refetch for the new kid");
    assert_eq!(
        idp.requests(Endpoint::Discovery),
        1,
        "the discovery document is kept"
    );

    // The retired key is gone from the refetched set (and its refetch is rate-limited).
    assert_eq!(
        refused(authenticate(&directory, &idp, &before).await),
        JwtError::NoSuchKey
    );
    assert_eq!(idp.requests(Endpoint::Jwks), 2);
}

// Sabotage: the rate limit was removed (`if false`), and separately the single-flight check
// (`replaced` forced to false): the flood then fetched once per caller.
#[tokio::test]
async fn a_flood_of_unknown_kids_refetches_at_most_once_per_interval() {
    let idp = OidcProvider::start().await;
    let interval = Duration::from_millis(1500);
    let directory = Arc::new(directory(OidcSettings {
        refetch_interval: interval,
        ..settings()
    }));
    let key = idp.key(&idp.kid(KeyType::Ed25519));
    authenticate(&directory, &idp, &idp.mint(&key.kid, &idp.claims("alice")))
        .await
        .expect("warm the cache");
    assert_eq!(idp.requests(Endpoint::Jwks), 1);
    let started = Instant::now();
    let url = idp.discovery_url();
    flood(&directory, &url, &key.kid, 1).await;
    flood(&directory, &url, &key.kid, 2).await;
    // Still within the interval of the refetch the first flood made.
    if started.elapsed() < interval {
        assert_eq!(idp.requests(Endpoint::Jwks), 2, "100 unknown kids, one refetch");
    }
    tokio::time::sleep(interval).await;
    flood(&directory, &url, &key.kid, 3).await;
    assert_eq!(
        idp.requests(Endpoint::Jwks),
        3,
        "one more refetch in the next interval"
    );
    assert_eq!(idp.requests(Endpoint::Discovery), 1);
}

/// 50 concurrent callers, each with a kid nobody published; each still gets the cached set (which
/// holds `known`).
async fn flood(directory: &Arc<OidcDirectory>, url: &str, known: &str, round: usize) {
    let mut callers = tokio::task::JoinSet::new();
    for n in 0..50 {
        let (directory, url) = (directory.clone(), url.to_owned());
        callers.spawn(async move { directory.keys(&url, Some(&format!("made-up-{round}-{n}"))).await });
    }
    while let Some(answer) = callers.join_next().await {
        let (_, keys) = answer.expect("a caller").expect("the cached keys");
        assert!(keys.contains_kid(known));
    }
}

// Sabotage: the single-flight check was removed (`replaced` forced to false, retry interval zero).
#[tokio::test]
async fn concurrent_callers_on_a_cold_cache_share_one_fetch() {
    let idp = OidcProvider::start().await;
    let directory = Arc::new(directory(OidcSettings {
        retry_interval: Duration::ZERO,
        refetch_interval: Duration::ZERO,
        ..settings()
    }));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (directory, url) = (directory.clone(), idp.discovery_url());
        callers.spawn(async move { directory.keys(&url, None).await });
    }
    while let Some(answer) = callers.join_next().await {
        let (issuer, _) = answer.expect("a caller").expect("keys");
        assert_eq!(issuer, idp.issuer());
    }
    assert_eq!(
        (idp.requests(Endpoint::Discovery), idp.requests(Endpoint::Jwks)),
        (1, 1)
    );
}

// Sabotage: a failed fetch cleared the cached snapshot (`*current = None` in `record`).
#[tokio::test]
async fn a_provider_down_with_a_warm_cache_still_verifies_known_keys() {
    let idp = OidcProvider::start().await;
    let directory = directory(OidcSettings {
        refetch_interval: Duration::ZERO,
        retry_interval: Duration::ZERO,
        ..settings()
    });
    let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("alice"));
    authenticate(&directory, &idp, &token).await.expect("warm");

    idp.set_behaviour(Endpoint::Discovery, Behaviour::Fail(500));
    idp.set_behaviour(Endpoint::Jwks, Behaviour::Fail(503));
    directory.refresh_all().await;
    assert_eq!(
        (idp.requests(Endpoint::Discovery), idp.requests(Endpoint::Jwks)),
        (2, 1),
        "refreshed, failed"
    );
    authenticate(&directory, &idp, &token)
        .await
        .expect("the last good keys still verify");

    // A kid the failing provider cannot be asked about: unavailable, not invalid.
    let new_kid = idp.add_key(KeyType::P256);
    let reason = unavailable(authenticate(&directory, &idp, &idp.mint(&new_kid, &idp.claims("bob"))).await);
    assert!(reason.contains("503"), "{reason}");
    // Back up: the same token now verifies.
    idp.set_behaviour(Endpoint::Jwks, Behaviour::Serve);
    authenticate(&directory, &idp, &idp.mint(&new_kid, &idp.claims("bob")))
        .await
        .expect("after recovery");
}

// Sabotage: `keys` returned an empty key set instead of `Unavailable` when nothing was fetched.
#[tokio::test]
async fn a_provider_down_with_a_cold_cache_is_unavailable() {
    let idp = OidcProvider::start().await;
    let directory = directory(settings());
    idp.set_behaviour(Endpoint::Discovery, Behaviour::Fail(500));
    let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("alice"));
    let reason = unavailable(authenticate(&directory, &idp, &token).await);
    assert!(
        reason.contains(&idp.discovery_url()) && reason.contains("500"),
        "{reason}"
    );
    assert!(!reason.contains(&token), "{reason}");
    // Within the retry interval, callers get the same answer without a new request.
    unavailable(authenticate(&directory, &idp, &token).await);
    assert_eq!(idp.requests(Endpoint::Discovery), 1);

    // A JWK set that fails (discovery fine) is the same.
    let idp = OidcProvider::start().await;
    idp.set_behaviour(Endpoint::Jwks, Behaviour::Fail(404));
    let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("alice"));
    let reason = unavailable(authenticate(&directory, &idp, &token).await);
    assert!(
        reason.contains(&idp.jwks_url()) && reason.contains("404"),
        "{reason}"
    );
}

// Sabotage: the `timeout` around the fetch and the waiters' deadline were removed (the test's own
// outer timeout then failed it).
#[tokio::test]
async fn a_hanging_provider_is_unavailable_within_the_timeout() {
    let bound = Duration::from_millis(500);
    let margin = Duration::from_millis(750);
    for endpoint in [Endpoint::Discovery, Endpoint::Jwks] {
        let idp = OidcProvider::start().await;
        idp.set_behaviour(endpoint, Behaviour::Hang);
        let directory = Arc::new(directory(OidcSettings {
            fetch_timeout: bound,
            ..settings()
        }));
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let (directory, url) = (directory.clone(), idp.discovery_url());
            callers.spawn(async move {
                let started = Instant::now();
                let answer = directory.keys(&url, None).await;
                (answer, started.elapsed())
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(10), async {
            let mut answers = Vec::new();
            while let Some(answer) = callers.join_next().await {
                answers.push(answer.expect("a caller"));
            }
            answers
        })
        .await
        .expect("every caller answered");
        for (answer, elapsed) in all {
            assert!(
                matches!(answer, Err(KeysError::Unavailable { .. })),
                "{endpoint:?}: {answer:?}"
            );
            assert!(elapsed < bound + margin, "{endpoint:?}: waited {elapsed:?}");
        }
    }
}

// Sabotage: `usable` ignored `max_staleness`.
#[tokio::test]
async fn keys_older_than_the_staleness_bound_are_not_used() {
    let idp = OidcProvider::start().await;
    let directory = directory(OidcSettings {
        max_staleness: Duration::from_millis(300),
        retry_interval: Duration::ZERO,
        ..settings()
    });
    let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("alice"));
    authenticate(&directory, &idp, &token).await.expect("fresh");
    idp.set_behaviour(Endpoint::Discovery, Behaviour::Fail(500));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reason = unavailable(authenticate(&directory, &idp, &token).await);
    assert!(reason.contains("older than"), "{reason}");
    idp.set_behaviour(Endpoint::Discovery, Behaviour::Serve);
    authenticate(&directory, &idp, &token)
        .await
        .expect("refetched in full");
    assert_eq!(idp.requests(Endpoint::Discovery), 3);
}

// Sabotage: `refresh_all` did nothing.
#[tokio::test]
async fn the_scheduled_refresh_picks_up_new_keys_before_they_are_asked_for() {
    let idp = OidcProvider::start().await;
    let directory = Arc::new(directory(OidcSettings {
        refresh_interval: Duration::from_millis(200),
        refetch_interval: Duration::ZERO,
        ..settings()
    }));
    directory.keys(&idp.discovery_url(), None).await.expect("warm");
    let refresher = directory.spawn_refresher();
    let new_kid = idp.rotate(KeyType::Ed25519);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let fetched = idp.requests(Endpoint::Jwks);
    assert!(fetched >= 2, "refreshed on schedule ({fetched} fetches)");
    assert!(
        idp.requests(Endpoint::Discovery) >= 2,
        "the refresh refetches discovery too"
    );
    let (_, keys) = directory
        .keys(&idp.discovery_url(), Some(&new_kid))
        .await
        .expect("keys");
    assert!(keys.contains_kid(&new_kid));
    drop(directory);
    tokio::time::timeout(Duration::from_secs(2), refresher)
        .await
        .expect("the refresher ends with the directory")
        .expect("no panic");
}

// Sabotage: the extra root was not added to the store (`with_roots` ignored `extra_roots`).
#[tokio::test]
async fn https_discovery_is_verified_against_the_trusted_roots() {
    let idp = OidcProvider::start_tls().await;
    assert!(idp.discovery_url().starts_with("https://127.0.0.1:"));
    let token = idp.mint(&idp.kid(KeyType::P256), &idp.claims("alice"));

    let trusting =
        OidcDirectory::with_roots(settings(), vec![idp.ca_certificate().expect("a CA")]).expect("dir");
    assert_eq!(
        authenticate(&trusting, &idp, &token)
            .await
            .expect("over TLS")
            .subject,
        "alice"
    );

    let system_only = directory(settings());
    let reason = unavailable(authenticate(&system_only, &idp, &token).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
}

// Sabotage: `check_url` accepted any http host, and `redirect_target` any scheme.
#[tokio::test]
async fn plain_http_is_refused_except_to_loopback_including_after_redirects() {
    let directory = directory(settings());
    let started = Instant::now();
    let remote = directory
        .keys("http://idp.example/.well-known/openid-configuration", None)
        .await;
    let Err(KeysError::Unavailable { reason }) = remote else {
        panic!("{remote:?}")
    };
    assert!(reason.contains("loopback"), "{reason}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused without a request"
    );

    // A loopback provider may redirect to another loopback provider…
    let idp = OidcProvider::start().await;
    let other = OidcProvider::start().await;
    idp.set_behaviour(Endpoint::Discovery, Behaviour::Redirect(other.discovery_url()));
    let (issuer, _) = directory
        .keys(&idp.discovery_url(), None)
        .await
        .expect("followed");
    assert_eq!(issuer, other.issuer());
    // …but not to a plain-http host that is not loopback.
    let idp = OidcProvider::start().await;
    idp.set_behaviour(
        Endpoint::Jwks,
        Behaviour::Redirect("http://idp.example/jwks".into()),
    );
    let reason = unavailable(
        authenticate(
            &directory,
            &idp,
            &idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("a")),
        )
        .await,
    );
    assert!(reason.contains("redirect"), "{reason}");
    // An HTTPS provider may not redirect to plain http, not even on loopback.
    let tls = OidcProvider::start_tls().await;
    let plain = OidcProvider::start().await;
    tls.set_behaviour(Endpoint::Discovery, Behaviour::Redirect(plain.discovery_url()));
    let trusting =
        OidcDirectory::with_roots(settings(), vec![tls.ca_certificate().expect("CA")]).expect("dir");
    let reason = unavailable(
        authenticate(
            &trusting,
            &tls,
            &tls.mint(&tls.kid(KeyType::Rsa), &tls.claims("a")),
        )
        .await,
    );
    assert!(reason.contains("plain http"), "{reason}");
    assert_eq!(plain.requests(Endpoint::Discovery), 0);
}

// Sabotage: the body was collected without `Limited`.
#[tokio::test]
async fn oversized_and_malformed_documents_are_unavailable() {
    let directory = directory(OidcSettings {
        max_response_bytes: 16 * 1024,
        ..settings()
    });
    let idp = OidcProvider::start().await;
    let mut big = idp.jwks();
    big["padding"] = json!("x".repeat(32 * 1024));
    idp.set_jwks(Some(big));
    let reason = unavailable(
        authenticate(
            &directory,
            &idp,
            &idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("a")),
        )
        .await,
    );
    assert!(reason.contains("more than 16384 bytes"), "{reason}");

    for (discovery, expected) in [
        (json!({"issuer": "x"}), "jwks_uri"),
        (json!({"jwks_uri": "http://127.0.0.1:1/jwks"}), "issuer"),
        (
            json!({"issuer": "x", "jwks_uri": "http://idp.example/jwks"}),
            "loopback",
        ),
        (json!([1]), "issuer"),
    ] {
        let idp = OidcProvider::start().await;
        idp.set_discovery(Some(discovery));
        let reason = unavailable(
            authenticate(
                &directory,
                &idp,
                &idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("a")),
            )
            .await,
        );
        assert!(reason.contains(expected), "{reason}");
    }
    let idp = OidcProvider::start().await;
    idp.set_jwks(Some(json!({"keys": "none"})));
    let reason = unavailable(
        authenticate(
            &directory,
            &idp,
            &idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("a")),
        )
        .await,
    );
    assert!(reason.contains("`keys` array"), "{reason}");
}
