//! Identity at the service: turning a caller's own credential — a bearer
//! JWT, a static API key, or a client-certificate DN forwarded by a TLS
//! terminator — into the principal the core evaluates (docs/reference.md#issuers-and-attribute-mappings
//! and #normalisation).
//!
//! This module picks the issuer and reads what a verified credential says;
//! `jwt` checks signatures and standard claims against a key set, `jwks`
//! fetches and caches the key sets of `oidc` issuers (service only). The
//! service and the dry-run CLI share everything here, so `capgate explain
//! --token` answers what the service would.
//!
//! Nothing here ever writes a presented credential anywhere: not in an
//! error, a log line or a returned value. Static keys are kept as SHA-256
//! digests and compared in constant time.

pub mod certificate;
pub mod jwks;
pub mod jwt;

use sha2::{Digest, Sha256};

use capgate_core::principals::credential::{self, ClaimValue};
use capgate_core::principals::{AuthProblem, Issuer, IssuerKind, Resolution};

/// The largest credential accepted (a JWT with many claims, an XFCC value
/// with a certificate): 16 KiB.
pub const MAX_CREDENTIAL_BYTES: usize = 16 * 1024;

/// The suffix OpenID Connect Discovery appends to an issuer URL (§4).
pub const DISCOVERY_SUFFIX: &str = "/.well-known/openid-configuration";

/// A credential as presented, with the caller's optional issuer hint.
#[derive(Clone, Copy)]
pub enum Presented<'a> {
    /// A compact JWS from an `oidc` issuer.
    BearerToken(&'a str),
    /// A `static-key` issuer's key.
    ApiKey(&'a str),
    /// An Envoy XFCC value, a bare DN or a PEM certificate from the TLS terminator.
    ClientCertificate(&'a str),
}

impl Presented<'_> {
    fn text(&self) -> &str {
        match self {
            Presented::BearerToken(text) | Presented::ApiKey(text) | Presented::ClientCertificate(text) => {
                text
            }
        }
    }

    /// The checks every credential passes first: something presented, and
    /// not more than [`MAX_CREDENTIAL_BYTES`].
    pub fn check(&self) -> Result<(), AuthProblem> {
        let text = self.text();
        if text.trim().is_empty() {
            Err(AuthProblem::CredentialMissing)
        } else if text.len() > MAX_CREDENTIAL_BYTES {
            Err(AuthProblem::CredentialInvalid)
        } else {
            Ok(())
        }
    }
}

// The Debug form never shows the credential.
impl std::fmt::Debug for Presented<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Presented::BearerToken(_) => "BearerToken",
            Presented::ApiKey(_) => "ApiKey",
            Presented::ClientCertificate(_) => "ClientCertificate",
        };
        write!(f, "{kind}(<redacted>)")
    }
}

/// The issuers a credential of `kind` may belong to, in declaration order.
///
/// With a hint, exactly that issuer: undeclared, or unable to authenticate
/// anything (docs/reference.md#normalisation step 1), is `issuer_unknown`; declared but of
/// another kind (an API key sent for an `oidc` issuer) is `credential_invalid`:
/// the issuer exists, the credential is not one it accepts.
/// Without one, every declared issuer of that kind that can authenticate;
/// none is `issuer_unknown`.
pub fn candidates<'p>(
    issuers: &'p [Issuer],
    kind: IssuerKind,
    hint: Option<&str>,
) -> Result<Vec<&'p Issuer>, AuthProblem> {
    let usable = |issuer: &&Issuer| issuer.kind == kind && issuer.can_authenticate();
    let found: Vec<&Issuer> = match hint {
        Some(hint) => {
            let named: Vec<&Issuer> = issuers.iter().filter(|issuer| issuer.id == hint).collect();
            if !named.is_empty() && named.iter().all(|issuer| issuer.kind != kind) {
                return Err(AuthProblem::CredentialInvalid);
            }
            named.into_iter().filter(usable).collect()
        }
        None => issuers.iter().filter(usable).collect(),
    };
    if found.is_empty() {
        Err(AuthProblem::IssuerUnknown)
    } else {
        Ok(found)
    }
}

/// A client certificate's principal, from an XFCC value, a bare DN or the
/// certificate itself as PEM ([`certificate`]). Without a hint there must be exactly
/// one `mtls` issuer: a DN carries no issuer of its own, and choosing among
/// several would be a guess (`issuer_unknown`; send the hint).
pub fn client_certificate(
    issuers: &[Issuer],
    hint: Option<&str>,
    forwarded: &str,
) -> Result<Resolution, AuthProblem> {
    let found = candidates(issuers, IssuerKind::Mtls, hint)?;
    let [issuer] = found.as_slice() else {
        return Err(AuthProblem::IssuerUnknown);
    };
    if certificate::is_pem(forwarded) {
        credential::from_client_certificate(issuer, &certificate::subject_dn(forwarded)?)
    } else {
        credential::from_client_certificate(issuer, forwarded)
    }
}

/// The keys of a policy version's `static-key` issuers, read once when the
/// version is activated and kept as SHA-256 digests.
#[derive(Default)]
pub struct StaticKeys {
    /// Per issuer id: the key's digest, or `None` when the reference could
    /// not be read (then every key presented for it is `credential_invalid`).
    digests: Vec<(String, Option<[u8; 32]>)>,
}

impl StaticKeys {
    /// Reads every authenticating `static-key` issuer's `secret.ref` with
    /// `read`. A reference that cannot be read is reported through `failed`
    /// with the issuer id and the reason (never the value).
    pub fn resolve<R, F>(issuers: &[Issuer], read: R, mut failed: F) -> Self
    where
        R: Fn(&str) -> Result<Vec<u8>, String>,
        F: FnMut(&str, &str),
    {
        let digests = issuers
            .iter()
            .filter(|issuer| issuer.kind == IssuerKind::StaticKey && issuer.can_authenticate())
            .map(|issuer| {
                let reference = issuer.secret_ref.as_deref().unwrap_or_default();
                let digest = match read(reference) {
                    Ok(value) if !value.is_empty() => Some(Sha256::digest(&value).into()),
                    Ok(_) => {
                        failed(&issuer.id, "the key is empty");
                        None
                    }
                    Err(reason) => {
                        failed(&issuer.id, &reason);
                        None
                    }
                };
                (issuer.id.clone(), digest)
            })
            .collect();
        StaticKeys { digests }
    }

    /// The principal whose issuer's key is `presented`. Every candidate's
    /// key is compared, in constant time, whatever matched; a key matching no
    /// candidate — or, by a misconfiguration, several — is
    /// `credential_invalid`, never a guess.
    pub fn authenticate(
        &self,
        issuers: &[Issuer],
        hint: Option<&str>,
        presented: &str,
    ) -> Result<Resolution, AuthProblem> {
        use subtle::ConstantTimeEq;
        let candidates = candidates(issuers, IssuerKind::StaticKey, hint)?;
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut matched: Vec<&Issuer> = Vec::new();
        for issuer in candidates {
            let digest = self
                .digests
                .iter()
                .find(|(id, _)| *id == issuer.id)
                .and_then(|(_, digest)| digest.as_ref());
            if let Some(digest) = digest {
                if bool::from(digest.ct_eq(&presented)) {
                    matched.push(issuer);
                }
            }
        }
        match matched.as_slice() {
            [issuer] => credential::from_static_key(issuer),
            _ => Err(AuthProblem::CredentialInvalid),
        }
    }

    /// Whether a key presented for `issuer` can authenticate anyone: its key was read and no
    /// other issuer shares it.
    pub fn can_authenticate(&self, issuer: &str) -> bool {
        let readable = self
            .digests
            .iter()
            .any(|(id, digest)| id == issuer && digest.is_some());
        readable && !self.shared().iter().any(|(a, b)| *a == issuer || *b == issuer)
    }

    /// Issuer ids that share one key (each such key authenticates nobody).
    pub fn shared(&self) -> Vec<(&str, &str)> {
        let mut shared = Vec::new();
        for (index, (first, digest)) in self.digests.iter().enumerate() {
            for (second, other) in &self.digests[index + 1..] {
                if digest.is_some() && digest == other {
                    shared.push((first.as_str(), second.as_str()));
                }
            }
        }
        shared
    }
}

/// The issuer URL an `oidc` issuer's tokens carry as `iss`, as far as it can
/// be known without the network: the discovery URL without OpenID Connect
/// Discovery's suffix (which the discovery document must then repeat).
pub fn issuer_url_of(discovery: &str) -> Option<&str> {
    discovery.strip_suffix(DISCOVERY_SUFFIX)
}

/// The principal a verified token names, for `issuer`.
pub fn from_verified(issuer: &Issuer, verified: &jwt::Verified) -> Result<Resolution, AuthProblem> {
    let claims: Vec<(&str, ClaimValue)> = issuer
        .attributes
        .iter()
        .filter_map(|(_, mapping)| mapping.strip_prefix("claim:"))
        .filter_map(|name| verified.claims.get(name).map(|value| (name, claim_value(value))))
        .collect();
    credential::from_claims(issuer, &verified.subject, |name| {
        claims
            .iter()
            .find(|(claim, _)| *claim == name)
            .map(|(_, value)| value)
    })
}

/// An `oidc` issuer with what its tokens are checked against: the `iss`
/// they must carry and its key set.
pub struct KeyedIssuer<'p, K> {
    pub issuer: &'p Issuer,
    pub issuer_url: String,
    pub keys: K,
}

/// Verifies a bearer token against the issuers it may belong to (already
/// narrowed by the hint or the token's `iss`). It must verify for exactly
/// one: several declared issuers over one identity provider are told apart
/// by their audience, and a token valid for more than one would make the
/// choice a guess (`credential_invalid`). Returns the issuer id checked
/// against, for the audit record, with the outcome.
pub fn verify_bearer<'p, K: std::ops::Deref<Target = jwt::Jwks>>(
    keyed: &[KeyedIssuer<'p, K>],
    token: &str,
    at_ms: i64,
) -> (Option<&'p str>, Result<Resolution, AuthProblem>) {
    let mut verified: Vec<(&'p Issuer, jwt::Verified)> = Vec::new();
    let mut first_error: Option<(&'p Issuer, jwt::JwtError)> = None;
    for KeyedIssuer {
        issuer,
        issuer_url,
        keys,
    } in keyed
    {
        let expected = jwt::Expected {
            issuer: issuer_url,
            audience: issuer.audience.as_deref(),
            at_ms,
        };
        match jwt::verify(token, keys, &expected) {
            Ok(token) => verified.push((issuer, token)),
            Err(error) => {
                first_error.get_or_insert((issuer, error));
            }
        }
    }
    match (verified.as_slice(), first_error) {
        ([(issuer, token)], _) => (Some(issuer.id.as_str()), from_verified(issuer, token)),
        ([], Some((issuer, error))) => (Some(issuer.id.as_str()), Err(error.problem())),
        ([], None) => (None, Err(AuthProblem::IssuerUnknown)),
        _ => (None, Err(AuthProblem::CredentialInvalid)),
    }
}

/// A JSON value as a claim; numbers as the `f64` ECMAScript would parse.
fn claim_value(value: &serde_json::Value) -> ClaimValue {
    use serde_json::Value;
    match value {
        Value::String(text) => ClaimValue::String(text.clone()),
        Value::Number(number) => number.as_f64().map_or(ClaimValue::Other, ClaimValue::Number),
        Value::Bool(flag) => ClaimValue::Bool(*flag),
        Value::Array(items) => ClaimValue::Array(items.iter().map(claim_value).collect()),
        Value::Object(_) | Value::Null => ClaimValue::Other,
    }
}

// The Debug form shows which issuers have a key, never a digest.
impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.digests.iter().map(|(id, digest)| (id, digest.is_some())))
            .finish()
    }
}

/// Reads a secret reference the service and the CLI resolve themselves:
/// `env://NAME` or `file:///path` (a file's trailing line break is not part
/// of the value). Errors name the variable or path, never the value.
pub fn read_reference(reference: &str) -> Result<Vec<u8>, String> {
    if let Some(variable) = reference.strip_prefix("env://") {
        std::env::var(variable)
            .map(String::into_bytes)
            .map_err(|_| format!("the environment variable `{variable}` is not set"))
    } else if let Some(path) = reference.strip_prefix("file://") {
        let mut bytes =
            std::fs::read(path).map_err(|error| format!("cannot read `{path}`: {}", error.kind()))?;
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Ok(bytes)
    } else {
        Err("only `env://` and `file://` references can be read here".to_owned())
    }
}

/// Reads the static keys a version's issuers reference (`env://`,
/// `file://`). One that cannot be read authenticates nobody; the log names
/// the issuer and why, never a value.
pub fn read_static_keys(issuers: &[Issuer], revision: u64) -> StaticKeys {
    let keys = StaticKeys::resolve(issuers, read_reference, |issuer, problem| {
        tracing::warn!(
            revision,
            issuer,
            problem,
            "a static key cannot be read; its keys are refused"
        );
    });
    for (first, second) in keys.shared() {
        tracing::warn!(
            revision,
            first,
            second,
            "two static-key issuers share one key; that key authenticates neither without an issuer hint"
        );
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(id: &str, kind: IssuerKind, secret: Option<&str>) -> Issuer {
        Issuer {
            id: id.into(),
            kind,
            attributes: vec![("role".into(), "batch".into())],
            subject: Some(format!("{id}-runner")),
            discovery: None,
            audience: None,
            secret_ref: secret.map(str::to_owned),
            path: "/principals/issuers/0".into(),
        }
    }

    fn keys(issuers: &[Issuer]) -> StaticKeys {
        StaticKeys::resolve(
            issuers,
            |reference| match reference {
                "env://A" => Ok(b"key-a".to_vec()),
                "env://B" => Ok(b"key-b".to_vec()),
                "env://SAME" => Ok(b"key-a".to_vec()),
                _ => Err("not set".to_owned()),
            },
            |_, _| {},
        )
    }

    #[test]
    fn a_static_key_finds_its_issuer_and_nothing_else() {
        let issuers = [
            issuer("a", IssuerKind::StaticKey, Some("env://A")),
            issuer("b", IssuerKind::StaticKey, Some("env://B")),
            issuer("gone", IssuerKind::StaticKey, Some("env://MISSING")),
        ];
        let keys = keys(&issuers);
        let found = keys.authenticate(&issuers, None, "key-b").unwrap();
        assert_eq!(found.principal.id, "b:b-runner");
        assert_eq!(
            found.principal.attributes.get("role").map(String::as_str),
            Some("batch")
        );
        assert_eq!(
            keys.authenticate(&issuers, None, "key-c"),
            Err(AuthProblem::CredentialInvalid)
        );
        // The hint narrows: b's key presented for a is not a's key.
        assert_eq!(
            keys.authenticate(&issuers, Some("a"), "key-b"),
            Err(AuthProblem::CredentialInvalid)
        );
        assert_eq!(
            keys.authenticate(&issuers, Some("zzz"), "key-b"),
            Err(AuthProblem::IssuerUnknown)
        );
        // An unreadable key authenticates nobody.
        assert_eq!(
            keys.authenticate(&issuers, Some("gone"), ""),
            Err(AuthProblem::CredentialInvalid)
        );
    }

    #[test]
    fn a_key_shared_by_two_issuers_authenticates_nobody() {
        let issuers = [
            issuer("a", IssuerKind::StaticKey, Some("env://A")),
            issuer("twin", IssuerKind::StaticKey, Some("env://SAME")),
        ];
        let keys = keys(&issuers);
        assert_eq!(keys.shared(), [("a", "twin")]);
        assert_eq!(
            keys.authenticate(&issuers, None, "key-a"),
            Err(AuthProblem::CredentialInvalid)
        );
        assert!(keys.authenticate(&issuers, Some("a"), "key-a").is_ok());
    }

    #[test]
    fn issuers_that_cannot_authenticate_are_unknown() {
        let issuers = [
            issuer("nokey", IssuerKind::StaticKey, None),
            issuer("corp", IssuerKind::Oidc, None),
            issuer("edge", IssuerKind::Mtls, None),
            issuer("edge2", IssuerKind::Mtls, None),
        ];
        assert_eq!(
            candidates(&issuers, IssuerKind::StaticKey, None),
            Err(AuthProblem::IssuerUnknown)
        );
        assert_eq!(
            candidates(&issuers, IssuerKind::Oidc, Some("corp")),
            Err(AuthProblem::IssuerUnknown)
        );
        // Two mtls issuers and no hint: a DN says nothing about which.
        assert_eq!(
            client_certificate(&issuers, None, "CN=svc"),
            Err(AuthProblem::IssuerUnknown)
        );
        assert_eq!(
            client_certificate(&issuers, Some("edge2"), "CN=svc")
                .unwrap()
                .principal
                .id,
            "edge2:svc"
        );
        // A hint naming a declared issuer of another kind: the issuer is known, the credential
        // is not one it takes (the proto's `issuer_unknown` means "not declared").
        assert_eq!(
            client_certificate(&issuers, Some("nokey"), "CN=svc"),
            Err(AuthProblem::CredentialInvalid)
        );
        assert_eq!(
            candidates(&issuers, IssuerKind::StaticKey, Some("corp")),
            Err(AuthProblem::CredentialInvalid)
        );
        assert_eq!(
            candidates(&issuers, IssuerKind::StaticKey, Some("nobody")),
            Err(AuthProblem::IssuerUnknown)
        );
    }

    #[test]
    fn presented_credentials_are_bounded_and_never_printed() {
        assert_eq!(
            Presented::ApiKey(" ").check(),
            Err(AuthProblem::CredentialMissing)
        );
        let long = "x".repeat(MAX_CREDENTIAL_BYTES + 1);
        assert_eq!(
            Presented::BearerToken(&long).check(),
            Err(AuthProblem::CredentialInvalid)
        );
        assert!(Presented::ApiKey("k").check().is_ok());
        assert_eq!(
            format!("{:?}", Presented::ApiKey("sentinel-123")),
            "ApiKey(<redacted>)"
        );
    }

    #[test]
    fn the_issuer_url_comes_from_the_discovery_url() {
        assert_eq!(
            issuer_url_of("https://id.example.com/realms/a/.well-known/openid-configuration"),
            Some("https://id.example.com/realms/a")
        );
        assert_eq!(issuer_url_of("https://id.example.com/discovery.json"), None);
    }
}
