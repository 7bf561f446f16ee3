//! OIDC bearer tokens: verifying a compact JWS against a JWK set, offline.
//!
//! Everything here is synchronous and reads neither the network nor the clock: the key set comes
//! in parsed ([`parse_jwks`], from a discovery fetch in `jwks.rs` or from the CLI's local file), and
//! the decision instant comes in as `at_ms`. The checks, in the order they run:
//!
//! 1. the token is at most [`MAX_TOKEN_BYTES`] long, three base64url segments, with a JSON object
//!    header carrying an `alg` from the allow-list ([`Alg`]: RSA PKCS#1 v1.5 and PSS, ECDSA P-256 and
//!    P-384, Ed25519) and no `crit` parameter. `none` and every HMAC algorithm are refused: an
//!    issuer's public keys must never double as a shared secret.
//! 2. the key: by `kid` when the header has one; without `kid`, only when exactly one key of the set
//!    suits the algorithm (an ambiguous set is refused rather than tried key by key). A key suits an
//!    algorithm when its type and curve match the algorithm's family, its `alg` (when present) is the
//!    header's `alg` exactly, and its `use`/`key_ops` (when present) allow signature verification.
//!    Header parameters that carry or point at keys (`jwk`, `jku`, `x5u`, `x5c`) are ignored: keys
//!    only ever come from the issuer's own set.
//! 3. the signature, with `ring`'s verifiers (RSA PKCS#1 v1.5 and PSS from the modulus and exponent,
//!    ECDSA over the uncompressed point with fixed-size `r || s` signatures, Ed25519 over the raw
//!    key), whose key material is decoded and assembled once, when the set is parsed.
//! 4. the claims: `iss` equals the expected issuer exactly; `aud` (a string or an array) contains the
//!    expected audience when one is configured; `exp` is required and `exp`/`nbf` are compared with
//!    `at_ms` with a [`LEEWAY_MS`] allowance for clock skew; `sub` is a string (an empty one passes:
//!    the core turns it into `credential_missing`, docs/reference.md#normalisation). `iat` is not checked.
//!
//! No error message carries the token or a claim value: they are logged and returned to callers.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self as ring_signature, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{Map, Value};

use capgate_core::principals::AuthProblem;

/// The longest token accepted, checked before anything is decoded. Real ID and access tokens are
/// one to four kilobytes; 16 KiB leaves room for generous claims while bounding the work an
/// unauthenticated caller can ask for.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The allowance for clock skew between the issuer and this service, applied to `exp` and `nbf`:
/// a token is still accepted up to 30 s after its `exp`, and from 30 s before its `nbf`. The
/// boundaries are exact: expired when `at_ms >= exp_ms + LEEWAY_MS`, not yet valid when
/// `at_ms < nbf_ms - LEEWAY_MS`.
pub const LEEWAY_MS: i64 = 30_000;

/// The signing algorithms accepted (RFC 7518 names). Everything else — `none`, `HS*`, `PS384`,
/// `PS512`, unknown names — is [`JwtError::AlgorithmRefused`].
#[allow(clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    RS256,
    RS384,
    RS512,
    PS256,
    ES256,
    ES384,
    EdDSA,
}

impl Alg {
    /// Every accepted algorithm, in the order above.
    pub const ALL: [Alg; 7] = [
        Alg::RS256,
        Alg::RS384,
        Alg::RS512,
        Alg::PS256,
        Alg::ES256,
        Alg::ES384,
        Alg::EdDSA,
    ];

    /// The algorithm a JOSE `alg` value names, if it is on the allow-list (case-sensitive).
    pub fn parse(name: &str) -> Option<Alg> {
        Alg::ALL.into_iter().find(|alg| alg.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::PS256 => "PS256",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
        }
    }

    /// The only kind of key that can verify this algorithm.
    fn key_kind(self) -> KeyKind {
        match self {
            Alg::RS256 | Alg::RS384 | Alg::RS512 | Alg::PS256 => KeyKind::Rsa,
            Alg::ES256 => KeyKind::P256,
            Alg::ES384 => KeyKind::P384,
            Alg::EdDSA => KeyKind::Ed25519,
        }
    }

    /// The RSA padding and digest of an RSA algorithm (RFC 7518 §3.3, §3.5: PSS with MGF1 and a
    /// salt as long as the digest); `None` for the others, whose verifier is fixed by the key.
    fn rsa_parameters(self) -> Option<&'static ring_signature::RsaParameters> {
        match self {
            Alg::RS256 => Some(&ring_signature::RSA_PKCS1_2048_8192_SHA256),
            Alg::RS384 => Some(&ring_signature::RSA_PKCS1_2048_8192_SHA384),
            Alg::RS512 => Some(&ring_signature::RSA_PKCS1_2048_8192_SHA512),
            Alg::PS256 => Some(&ring_signature::RSA_PSS_2048_8192_SHA256),
            Alg::ES256 | Alg::ES384 | Alg::EdDSA => None,
        }
    }
}

impl fmt::Display for Alg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The issuer identifier, compared with `iss` exactly (the discovery document's `issuer`).
    pub issuer: &'a str,
    /// When set, `aud` must be this string or an array containing it; when `None`, `aud` is not read.
    pub audience: Option<&'a str>,
    /// The decision instant, milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// A token that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The `sub` claim, as written (possibly empty: the core decides what an empty subject means).
    pub subject: String,
    /// Every claim of the payload, for the issuer's `claim:` attribute mapping (docs/reference.md#issuers-and-attribute-mappings).
    pub claims: Map<String, Value>,
}

/// Why a token was refused. Messages are lowercase and never include the token or a claim value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("the token is not a well-formed compact JWS")]
    Malformed,
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    Oversized,
    #[error("the token's signing algorithm is not accepted for its key")]
    AlgorithmRefused,
    #[error("no key in the issuer's key set matches the token")]
    NoSuchKey,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token was issued by another issuer")]
    WrongIssuer,
    #[error("the token is not meant for this audience")]
    WrongAudience,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token has no `exp` claim")]
    MissingExpiry,
    #[error("the token has no `sub` string claim")]
    MissingSubject,
}

impl JwtError {
    /// The authentication problem a caller is told about (docs/reference.md#normalisation). Only an expired token
    /// is `credential_expired`; an unknown key is `credential_invalid` too, because the key set was
    /// refreshed before the token was refused (jwks.rs).
    pub fn problem(&self) -> AuthProblem {
        match self {
            JwtError::Expired => AuthProblem::CredentialExpired,
            JwtError::Malformed
            | JwtError::Oversized
            | JwtError::AlgorithmRefused
            | JwtError::NoSuchKey
            | JwtError::BadSignature
            | JwtError::WrongIssuer
            | JwtError::WrongAudience
            | JwtError::NotYetValid
            | JwtError::MissingExpiry
            | JwtError::MissingSubject => AuthProblem::CredentialInvalid,
        }
    }
}

/// What can be read from a token before it is verified, to choose the issuer and the key.
/// Nothing here is authenticated: it must not be used for anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeked {
    /// The header's `alg`, already checked against the allow-list.
    pub alg: Alg,
    /// The header's `kid`, if any.
    pub kid: Option<String>,
    /// The payload's `iss`, if it is a string. Unverified.
    pub issuer: Option<String>,
}

/// Reads a token's header and unverified `iss`. Refuses what [`verify`] would refuse from the
/// token's shape alone (size, encoding, algorithm), so that a key set is never fetched for a token
/// that cannot pass.
pub fn peek(token: &str) -> Result<Peeked, JwtError> {
    let parts = Parts::split(token)?;
    let header = Header::decode(parts.header)?;
    let payload = decode_object(parts.payload)?;
    let issuer = match payload.get("iss") {
        Some(Value::String(iss)) => Some(iss.clone()),
        _ => None,
    };
    Ok(Peeked {
        alg: header.alg,
        kid: header.kid,
        issuer,
    })
}

/// Verifies `token` against `keys` and `expected` (the module documentation lists the checks).
pub fn verify(token: &str, keys: &Jwks, expected: &Expected<'_>) -> Result<Verified, JwtError> {
    let parts = Parts::split(token)?;
    let header = Header::decode(parts.header)?;
    let key = keys.select(header.kid.as_deref(), header.alg)?;

    let signature = URL_SAFE_NO_PAD
        .decode(parts.signature)
        .map_err(|_| JwtError::Malformed)?;
    if !key.verifies(header.alg, parts.signing_input.as_bytes(), &signature) {
        return Err(JwtError::BadSignature);
    }

    let claims = decode_object(parts.payload)?;
    check_claims(&claims, expected)?;
    let subject = match claims.get("sub") {
        Some(Value::String(sub)) => sub.clone(),
        _ => return Err(JwtError::MissingSubject),
    };
    Ok(Verified { subject, claims })
}

fn check_claims(claims: &Map<String, Value>, expected: &Expected<'_>) -> Result<(), JwtError> {
    match claims.get("iss") {
        Some(Value::String(iss)) if iss == expected.issuer => {}
        _ => return Err(JwtError::WrongIssuer),
    }

    if let Some(audience) = expected.audience {
        let listed = match claims.get("aud") {
            Some(Value::String(aud)) => aud == audience,
            Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(audience)),
            _ => false,
        };
        if !listed {
            return Err(JwtError::WrongAudience);
        }
    }

    let exp_ms = match claims.get("exp") {
        Some(Value::Number(exp)) => numeric_date_ms(exp, Rounding::Down),
        Some(_) => return Err(JwtError::Malformed),
        None => return Err(JwtError::MissingExpiry),
    };
    if expected.at_ms >= exp_ms.saturating_add(LEEWAY_MS) {
        return Err(JwtError::Expired);
    }

    match claims.get("nbf") {
        None => {}
        Some(Value::Number(nbf)) => {
            let nbf_ms = numeric_date_ms(nbf, Rounding::Up);
            if expected.at_ms < nbf_ms.saturating_sub(LEEWAY_MS) {
                return Err(JwtError::NotYetValid);
            }
        }
        Some(_) => return Err(JwtError::Malformed),
    }
    Ok(())
}

/// Which way a fractional NumericDate is rounded to whole milliseconds: towards refusal, so
/// `exp` rounds down and `nbf` rounds up.
#[derive(Clone, Copy)]
enum Rounding {
    Down,
    Up,
}

/// A NumericDate (seconds since the epoch, RFC 7519 §2) in milliseconds, saturating at the ends
/// of `i64` instead of overflowing.
fn numeric_date_ms(seconds: &serde_json::Number, rounding: Rounding) -> i64 {
    if let Some(whole) = seconds.as_i64() {
        return whole.saturating_mul(1000);
    }
    if seconds.as_u64().is_some() {
        return i64::MAX;
    }
    let millis = seconds.as_f64().unwrap_or(0.0) * 1000.0;
    let rounded = match rounding {
        Rounding::Down => millis.floor(),
        Rounding::Up => millis.ceil(),
    };
    // `as` saturates for floats out of range; JSON has no NaN or infinities.
    rounded as i64
}

/// The three segments of a compact JWS, not yet decoded.
struct Parts<'t> {
    header: &'t str,
    payload: &'t str,
    signature: &'t str,
    /// `header.payload`, what the signature covers.
    signing_input: &'t str,
}

impl<'t> Parts<'t> {
    fn split(token: &'t str) -> Result<Parts<'t>, JwtError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Oversized);
        }
        let (signing_input, signature) = token.rsplit_once('.').ok_or(JwtError::Malformed)?;
        let (header, payload) = signing_input.split_once('.').ok_or(JwtError::Malformed)?;
        if payload.contains('.') || header.is_empty() || payload.is_empty() || signature.is_empty() {
            return Err(JwtError::Malformed);
        }
        Ok(Parts {
            header,
            payload,
            signature,
            signing_input,
        })
    }
}

/// The JOSE header fields this module reads.
struct Header {
    alg: Alg,
    kid: Option<String>,
}

impl Header {
    fn decode(segment: &str) -> Result<Header, JwtError> {
        let header = decode_object(segment)?;
        // RFC 7515 §4.1.11: extensions listed as critical must be understood; we understand none.
        if header.contains_key("crit") {
            return Err(JwtError::Malformed);
        }
        let alg = match header.get("alg") {
            Some(Value::String(alg)) => Alg::parse(alg).ok_or(JwtError::AlgorithmRefused)?,
            _ => return Err(JwtError::Malformed),
        };
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(kid)) => Some(kid.clone()),
            Some(_) => return Err(JwtError::Malformed),
        };
        Ok(Header { alg, kid })
    }
}

/// A base64url segment holding a JSON object.
fn decode_object(segment: &str) -> Result<Map<String, Value>, JwtError> {
    let bytes = URL_SAFE_NO_PAD.decode(segment).map_err(|_| JwtError::Malformed)?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(object)) => Ok(object),
        _ => Err(JwtError::Malformed),
    }
}

// ---------------------------------------------------------------------------------------------------
// Key sets
// ---------------------------------------------------------------------------------------------------

/// A parsed JWK set (RFC 7517): the public keys this module can use, in the order published.
#[derive(Clone, Default)]
pub struct Jwks {
    keys: Vec<Jwk>,
    skipped: usize,
}

/// One usable public key.
#[derive(Clone)]
struct Jwk {
    kid: Option<String>,
    /// The key's own `alg`, when it names one; a token must then use exactly that algorithm.
    alg: Option<String>,
    kind: KeyKind,
    /// `false` when `use` or `key_ops` rule out verifying signatures. Such a key is kept so that a
    /// token naming it is told `AlgorithmRefused` rather than `NoSuchKey`, but it never verifies.
    for_signatures: bool,
    material: KeyMaterial,
}

/// A key as `ring` verifies with it, decoded and assembled when the set is parsed, so that verifying
/// a token decodes nothing of the key. (`ring` 0.17 has no public type for an already validated
/// public key: inside each `verify` it still checks these bytes — modulus and exponent ranges, the
/// point on its curve — and that is part of the figures in docs/benchmarks.md.)
#[derive(Clone)]
enum KeyMaterial {
    /// Modulus and exponent, big-endian without leading zeros; the padding and digest come from the
    /// token's algorithm (RS256/384/512, PS256).
    Rsa(RsaPublicKeyComponents<Vec<u8>>),
    /// The uncompressed SEC1 point `0x04 || x || y` with ECDSA P-256/SHA-256 or P-384/SHA-384 (JWS
    /// signatures are the fixed-size `r || s`), or the raw 32-byte Ed25519 key with Ed25519: the
    /// key's curve fixes the algorithm.
    Fixed(UnparsedPublicKey<Vec<u8>>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

impl Jwk {
    fn suits(&self, alg: Alg) -> bool {
        self.for_signatures
            && self.kind == alg.key_kind()
            && self.alg.as_deref().is_none_or(|own| own == alg.as_str())
    }

    /// Whether `signature` (decoded) is this key's signature of `message` under `alg`. A key `ring`
    /// refuses (a point off the curve, an exponent out of range) verifies nothing.
    fn verifies(&self, alg: Alg, message: &[u8], signature: &[u8]) -> bool {
        // `select` only hands out keys that suit `alg`; checked again so that a mismatch can only
        // ever refuse.
        if self.kind != alg.key_kind() {
            return false;
        }
        match (&self.material, alg.rsa_parameters()) {
            (KeyMaterial::Rsa(components), Some(parameters)) => {
                components.verify(parameters, message, signature).is_ok()
            }
            (KeyMaterial::Fixed(key), None) => key.verify(message, signature).is_ok(),
            _ => false,
        }
    }
}

impl Jwks {
    /// The number of usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many entries of the published set were skipped (unsupported type or curve, symmetric
    /// keys, RSA moduli outside 2048–4096 bits, malformed members).
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Whether some key carries this `kid`: jwks.rs refetches the set when one does not.
    pub fn contains_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|key| key.kid.as_deref() == Some(kid))
    }

    /// The key that verifies a token with this header (module documentation, step 2).
    fn select(&self, kid: Option<&str>, alg: Alg) -> Result<&Jwk, JwtError> {
        match kid {
            Some(kid) => {
                let mut named = self
                    .keys
                    .iter()
                    .filter(|key| key.kid.as_deref() == Some(kid))
                    .peekable();
                if named.peek().is_none() {
                    return Err(JwtError::NoSuchKey);
                }
                named.find(|key| key.suits(alg)).ok_or(JwtError::AlgorithmRefused)
            }
            None => {
                let mut suitable = self.keys.iter().filter(|key| key.suits(alg));
                match (suitable.next(), suitable.next()) {
                    (Some(only), None) => Ok(only),
                    _ => Err(JwtError::NoSuchKey),
                }
            }
        }
    }
}

impl fmt::Debug for Jwks {
    /// Key ids and kinds only: public keys are not secret, but they make logs unreadable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jwks")
            .field(
                "keys",
                &self
                    .keys
                    .iter()
                    .map(|key| (key.kid.as_deref().unwrap_or("-"), key.kind))
                    .collect::<Vec<_>>(),
            )
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Why a key set could not be read at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    #[error("the key set is not a JSON object with a `keys` array")]
    Malformed,
}

/// Parses a JWK set. Entries this module cannot use are skipped and counted, never an error: an
/// issuer may publish encryption keys or key types we do not support next to its signing keys.
/// A set with no usable key at all parses to an empty [`Jwks`] (every token then fails with
/// `NoSuchKey`); callers that want to warn about it look at [`Jwks::is_empty`].
pub fn parse_jwks(json: &[u8]) -> Result<Jwks, JwksError> {
    let document: Value = serde_json::from_slice(json).map_err(|_| JwksError::Malformed)?;
    let entries = match document.get("keys") {
        Some(Value::Array(entries)) => entries,
        _ => return Err(JwksError::Malformed),
    };
    let mut jwks = Jwks::default();
    for entry in entries {
        match entry.as_object().and_then(parse_jwk) {
            Some(key) => jwks.keys.push(key),
            None => jwks.skipped += 1,
        }
    }
    Ok(jwks)
}

/// One JWK, or `None` when it is not a public signing key of a supported kind.
fn parse_jwk(entry: &Map<String, Value>) -> Option<Jwk> {
    let kid = optional_string(entry, "kid")?;
    let alg = optional_string(entry, "alg")?;
    let usage = optional_string(entry, "use")?;
    let key_ops = match entry.get("key_ops") {
        None => None,
        Some(Value::Array(ops)) => Some(ops.iter().any(|op| op.as_str() == Some("verify"))),
        Some(_) => return None,
    };
    let for_signatures = usage.as_deref().is_none_or(|usage| usage == "sig") && key_ops.unwrap_or(true);

    let (kind, material) = match entry.get("kty")?.as_str()? {
        "RSA" => {
            let n = strip_leading_zeros(member_bytes(entry, "n")?);
            let e = strip_leading_zeros(member_bytes(entry, "e")?);
            // RFC 7518 §3.3 asks for 2048 bits or more (as `ring`'s `*_2048_8192_*` parameters do);
            // above 4096 bits we refuse too, which bounds the work one unauthenticated token can ask
            // for. `ring` takes the exponent without leading zeros, and only odd ones from 3 to
            // 2^33 - 1: a larger one stays in the set and verifies nothing.
            let bits = n.len() * 8 - n.first().map_or(8, |top| top.leading_zeros() as usize);
            if !(2048..=4096).contains(&bits) || e.is_empty() || e.len() > 8 {
                return None;
            }
            (KeyKind::Rsa, KeyMaterial::Rsa(RsaPublicKeyComponents { n, e }))
        }
        "EC" => {
            let (kind, size, algorithm) = match entry.get("crv")?.as_str()? {
                "P-256" => (KeyKind::P256, 32, &ring_signature::ECDSA_P256_SHA256_FIXED),
                "P-384" => (KeyKind::P384, 48, &ring_signature::ECDSA_P384_SHA384_FIXED),
                _ => return None,
            };
            let x = member_bytes(entry, "x")?;
            let y = member_bytes(entry, "y")?;
            if x.len() != size || y.len() != size {
                return None;
            }
            // The uncompressed SEC1 point `ring` reads; whether it is on the curve, `ring` checks.
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            (kind, KeyMaterial::Fixed(UnparsedPublicKey::new(algorithm, point)))
        }
        "OKP" => {
            if entry.get("crv")?.as_str()? != "Ed25519" {
                return None;
            }
            // Exactly 32 bytes (RFC 8037 §2); another length is skipped here rather than kept as a
            // key that can never verify.
            let x = member_bytes(entry, "x")?;
            if x.len() != ring_signature::ED25519_PUBLIC_KEY_LEN {
                return None;
            }
            (
                KeyKind::Ed25519,
                KeyMaterial::Fixed(UnparsedPublicKey::new(&ring_signature::ED25519, x)),
            )
        }
        // `oct` (a shared secret) and everything else: never a key an issuer verifies with.
        _ => return None,
    };
    Some(Jwk {
        kid,
        alg,
        kind,
        for_signatures,
        material,
    })
}

/// `Some(None)` when absent, `Some(Some(s))` when a string, `None` (skip the key) otherwise.
fn optional_string(entry: &Map<String, Value>, name: &str) -> Option<Option<String>> {
    match entry.get(name) {
        None => Some(None),
        Some(Value::String(value)) => Some(Some(value.clone())),
        Some(_) => None,
    }
}

/// A base64url member (RFC 7518 writes them unpadded; trailing `=` is tolerated).
fn member_bytes(entry: &Map<String, Value>, name: &str) -> Option<Vec<u8>> {
    let text = entry.get(name)?.as_str()?.trim_end_matches('=');
    URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .filter(|bytes| !bytes.is_empty())
}

fn strip_leading_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|byte| **byte == 0).count();
    bytes.drain(..zeros);
    bytes
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use jsonwebtoken::{Algorithm, EncodingKey};
    use proptest::prelude::*;
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    use rsa::traits::PublicKeyParts;
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://issuer.example";
    const AUDIENCE: &str = "capgate";
    /// The decision instant of every test, and the `exp`/`nbf` seconds around it.
    const AT_MS: i64 = 1_760_000_000_000;
    const AT_S: i64 = AT_MS / 1000;

    /// A private key that signs, and the public JWK (without `kid`) that verifies it.
    struct TestKey {
        alg: Algorithm,
        encoding: EncodingKey,
        jwk: Value,
    }

    struct Keys {
        rsa: TestKey,
        rsa_public_pem: String,
        p256: TestKey,
        p384: TestKey,
        ed25519: TestKey,
    }

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn ec_key(alg: &'static rcgen::SignatureAlgorithm, jose: Algorithm, crv: &str) -> TestKey {
        let pair = rcgen::KeyPair::generate_for(alg).expect("generate an EC key");
        let raw = pair.public_key_raw();
        let size = (raw.len() - 1) / 2;
        TestKey {
            alg: jose,
            encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk: json!({"kty": "EC", "crv": crv, "x": b64(&raw[1..=size]), "y": b64(&raw[1 + size..])}),
        }
    }

    /// Generated once per test binary: a 2048-bit RSA key takes a moment.
    fn keys() -> &'static Keys {
        static KEYS: OnceLock<Keys> = OnceLock::new();
        KEYS.get_or_init(|| {
            let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("generate RSA");
            let public = private.to_public_key();
            let der = private.to_pkcs1_der().expect("PKCS#1");
            let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("generate Ed25519");
            Keys {
                rsa: TestKey {
                    alg: Algorithm::RS256,
                    encoding: EncodingKey::from_rsa_der(der.as_bytes()),
                    jwk: json!({"kty": "RSA", "n": b64(&public.n().to_bytes_be()), "e": b64(&public.e().to_bytes_be())}),
                },
                rsa_public_pem: public.to_public_key_pem(LineEnding::LF).expect("PEM"),
                p256: ec_key(&rcgen::PKCS_ECDSA_P256_SHA256, Algorithm::ES256, "P-256"),
                p384: ec_key(&rcgen::PKCS_ECDSA_P384_SHA384, Algorithm::ES384, "P-384"),
                ed25519: TestKey {
                    alg: Algorithm::EdDSA,
                    encoding: EncodingKey::from_ed_der(&ed.serialize_der()),
                    jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": b64(ed.public_key_raw())}),
                },
            }
        })
    }

    /// `jwk` with these members added (a `kid`, an `alg`, a `use`, …).
    fn with(jwk: &Value, extra: Value) -> Value {
        let mut jwk = jwk.clone();
        for (name, value) in extra.as_object().expect("an object") {
            jwk[name] = value.clone();
        }
        jwk
    }

    /// The set most tests verify against: one key of each kind, each with a `kid`, and two RSA
    /// entries that must not verify RS256 tokens (an `alg` of RS384, and `use: enc`).
    fn set() -> Jwks {
        let k = keys();
        let document = json!({"keys": [
            with(&k.rsa.jwk, json!({"kid": "rsa"})),
            with(&k.p256.jwk, json!({"kid": "p256", "use": "sig"})),
            with(&k.p384.jwk, json!({"kid": "p384"})),
            with(&k.ed25519.jwk, json!({"kid": "ed", "alg": "EdDSA"})),
            with(&k.rsa.jwk, json!({"kid": "rsa-384", "alg": "RS384"})),
            with(&k.rsa.jwk, json!({"kid": "rsa-enc", "use": "enc"})),
        ]});
        parse_jwks(document.to_string().as_bytes()).expect("a valid set")
    }

    fn claims() -> Value {
        json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": AT_S + 300, "iat": AT_S - 10})
    }

    /// A compact JWS with exactly this header and payload, signed by `alg` with `key`.
    fn sign_raw(header: &Value, claims: &Value, key: &EncodingKey, alg: Algorithm) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), key, alg).expect("sign");
        format!("{input}.{signature}")
    }

    fn token(key: &TestKey, kid: Option<&str>, claims: &Value) -> String {
        let mut header = json!({"typ": "JWT", "alg": format!("{:?}", key.alg)});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        sign_raw(&header, claims, &key.encoding, key.alg)
    }

    fn expected() -> Expected<'static> {
        Expected {
            issuer: ISSUER,
            audience: Some(AUDIENCE),
            at_ms: AT_MS,
        }
    }

    fn check(token: &str) -> Result<Verified, JwtError> {
        verify(token, &set(), &expected())
    }

    fn check_at(token: &str, at_ms: i64) -> Result<Verified, JwtError> {
        verify(token, &set(), &Expected { at_ms, ..expected() })
    }

    #[test]
    fn each_accepted_algorithm_verifies() {
        let k = keys();
        let rsa = |alg| TestKey {
            alg,
            encoding: k.rsa.encoding.clone(),
            jwk: Value::Null,
        };
        let cases = [
            (rsa(Algorithm::RS256), "rsa"),
            (rsa(Algorithm::RS384), "rsa"),
            (rsa(Algorithm::RS512), "rsa"),
            (rsa(Algorithm::PS256), "rsa"),
            (rsa(Algorithm::RS384), "rsa-384"),
        ];
        for (key, kid) in &cases {
            let verified = check(&token(key, Some(kid), &claims())).expect("verifies");
            assert_eq!(verified.subject, "alice", "{:?} {kid}", key.alg);
        }
        for (key, kid) in [(&k.p256, "p256"), (&k.p384, "p384"), (&k.ed25519, "ed")] {
            let verified = check(&token(key, Some(kid), &claims())).expect("verifies");
            assert_eq!(verified.subject, "alice");
            assert_eq!(verified.claims.get("aud"), Some(&json!(AUDIENCE)), "{kid}");
        }
    }

    #[test]
    fn alg_none_is_refused() {
        for alg in ["none", "None", "NONE"] {
            let header = json!({"alg": alg, "kid": "rsa"});
            let unsigned = format!(
                "{}.{}.",
                b64(header.to_string().as_bytes()),
                b64(claims().to_string().as_bytes())
            );
            let with_junk = format!("{unsigned}AAAA");
            assert_eq!(peek(&with_junk), Err(JwtError::AlgorithmRefused), "{alg}");
            assert_eq!(check(&with_junk), Err(JwtError::AlgorithmRefused), "{alg}");
            // An empty signature segment is malformed before its algorithm is read.
            assert_eq!(check(&unsigned), Err(JwtError::Malformed), "{alg}");
        }
    }

    #[test]
    fn hmac_signed_with_the_public_key_is_refused() {
        let k = keys();
        // The classic confusion: the RSA public key's PEM (or its raw modulus) as the HMAC secret.
        for secret in [
            k.rsa_public_pem.as_bytes().to_vec(),
            k.rsa.jwk["n"].to_string().into_bytes(),
        ] {
            for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
                for kid in [Some("rsa"), None] {
                    let mut header = json!({"alg": format!("{alg:?}")});
                    if let Some(kid) = kid {
                        header["kid"] = json!(kid);
                    }
                    let forged = sign_raw(&header, &claims(), &EncodingKey::from_secret(&secret), alg);
                    assert_eq!(check(&forged), Err(JwtError::AlgorithmRefused), "{alg:?} {kid:?}");
                }
            }
        }
    }

    #[test]
    fn an_algorithm_of_another_family_than_the_key_is_refused() {
        let k = keys();
        // An ES256 token that names the RSA key, and an RS256 token that names the EC key.
        let es_on_rsa = sign_raw(
            &json!({"alg": "ES256", "kid": "rsa"}),
            &claims(),
            &k.p256.encoding,
            Algorithm::ES256,
        );
        assert_eq!(check(&es_on_rsa), Err(JwtError::AlgorithmRefused));
        let rs_on_ec = sign_raw(
            &json!({"alg": "RS256", "kid": "p256"}),
            &claims(),
            &k.rsa.encoding,
            Algorithm::RS256,
        );
        assert_eq!(check(&rs_on_ec), Err(JwtError::AlgorithmRefused));
        // ES384 with the P-256 key: same family, wrong curve.
        let es384_on_p256 = sign_raw(
            &json!({"alg": "ES384", "kid": "p256"}),
            &claims(),
            &k.p384.encoding,
            Algorithm::ES384,
        );
        assert_eq!(check(&es384_on_p256), Err(JwtError::AlgorithmRefused));
        // PS384 is not on the allow-list at all.
        let ps384 = sign_raw(
            &json!({"alg": "PS384", "kid": "rsa"}),
            &claims(),
            &k.rsa.encoding,
            Algorithm::PS384,
        );
        assert_eq!(check(&ps384), Err(JwtError::AlgorithmRefused));
    }

    #[test]
    fn a_jwk_whose_alg_differs_from_the_header_is_refused() {
        let rs256 = TestKey {
            alg: Algorithm::RS256,
            encoding: keys().rsa.encoding.clone(),
            jwk: Value::Null,
        };
        assert_eq!(
            check(&token(&rs256, Some("rsa-384"), &claims())),
            Err(JwtError::AlgorithmRefused)
        );
    }

    #[test]
    fn a_jwk_not_for_signatures_is_refused() {
        assert_eq!(
            check(&token(&keys().rsa, Some("rsa-enc"), &claims())),
            Err(JwtError::AlgorithmRefused)
        );
        let k = keys();
        let ops = json!({"keys": [with(&k.rsa.jwk, json!({"kid": "rsa", "key_ops": ["encrypt"]}))]});
        let ops = parse_jwks(ops.to_string().as_bytes()).expect("a set");
        assert_eq!(
            verify(&token(&k.rsa, Some("rsa"), &claims()), &ops, &expected()),
            Err(JwtError::AlgorithmRefused)
        );
        let ops = json!({"keys": [with(&k.rsa.jwk, json!({"kid": "rsa", "key_ops": ["verify"]}))]});
        let ops = parse_jwks(ops.to_string().as_bytes()).expect("a set");
        assert!(verify(&token(&k.rsa, Some("rsa"), &claims()), &ops, &expected()).is_ok());
    }

    #[test]
    fn a_tampered_token_is_refused() {
        let valid = token(&keys().rsa, Some("rsa"), &claims());
        let (header, rest) = valid.split_once('.').expect("three parts");
        let (_, signature) = rest.split_once('.').expect("three parts");
        let mut other = claims();
        other["sub"] = json!("mallory");
        let tampered = format!("{header}.{}.{signature}", b64(other.to_string().as_bytes()));
        assert_eq!(check(&tampered), Err(JwtError::BadSignature));
        // A signature from another key of the same kind.
        let foreign = token(&keys().p384, Some("p384"), &claims());
        let foreign_signature = foreign.rsplit_once('.').expect("three parts").1;
        let p384 = format!("{}.{foreign_signature}", valid.rsplit_once('.').expect("parts").0);
        assert_eq!(check(&p384), Err(JwtError::BadSignature));
    }

    #[test]
    fn an_unknown_kid_is_no_such_key() {
        assert_eq!(
            check(&token(&keys().rsa, Some("other"), &claims())),
            Err(JwtError::NoSuchKey)
        );
        assert_eq!(
            check(&token(&keys().rsa, Some(""), &claims())),
            Err(JwtError::NoSuchKey)
        );
    }

    #[test]
    fn without_kid_only_a_single_suitable_key_is_used() {
        let k = keys();
        // In `set()` one key suits RS256 (the RS384-only and the encryption entries do not).
        assert!(check(&token(&k.rsa, None, &claims())).is_ok());
        assert!(check(&token(&k.ed25519, None, &claims())).is_ok());
        let two =
            json!({"keys": [with(&k.rsa.jwk, json!({"kid": "a"})), with(&k.rsa.jwk, json!({"kid": "b"}))]});
        let two = parse_jwks(two.to_string().as_bytes()).expect("a set");
        assert_eq!(
            verify(&token(&k.rsa, None, &claims()), &two, &expected()),
            Err(JwtError::NoSuchKey)
        );
        assert!(verify(&token(&k.rsa, Some("b"), &claims()), &two, &expected()).is_ok());
    }

    #[test]
    fn expiry_and_not_before_are_checked_against_the_given_instant_with_leeway() {
        let rsa = &keys().rsa;
        let exp = AT_S + 300;
        let valid = token(rsa, Some("rsa"), &claims());
        let exp_ms = exp * 1000;
        assert!(
            check_at(&valid, exp_ms + LEEWAY_MS - 1).is_ok(),
            "inside the leeway"
        );
        assert_eq!(
            check_at(&valid, exp_ms + LEEWAY_MS),
            Err(JwtError::Expired),
            "at the boundary"
        );
        assert_eq!(check_at(&valid, i64::MAX), Err(JwtError::Expired));

        let mut expired = claims();
        expired["exp"] = json!(AT_S - 60);
        assert_eq!(check(&token(rsa, Some("rsa"), &expired)), Err(JwtError::Expired));
        assert_eq!(JwtError::Expired.problem(), AuthProblem::CredentialExpired);

        let nbf = AT_S + 100;
        let mut future = claims();
        future["nbf"] = json!(nbf);
        let future = token(rsa, Some("rsa"), &future);
        assert_eq!(check(&future), Err(JwtError::NotYetValid));
        assert_eq!(
            check_at(&future, nbf * 1000 - LEEWAY_MS - 1),
            Err(JwtError::NotYetValid)
        );
        assert!(
            check_at(&future, nbf * 1000 - LEEWAY_MS).is_ok(),
            "at the boundary"
        );
        assert_eq!(JwtError::NotYetValid.problem(), AuthProblem::CredentialInvalid);
    }

    #[test]
    fn fractional_and_extreme_numeric_dates_round_towards_refusal() {
        let rsa = &keys().rsa;
        let mut fractional = claims();
        fractional["exp"] = json!(AT_S as f64 + 0.0015);
        fractional["nbf"] = json!(AT_S as f64 - 0.0015);
        let fractional = token(rsa, Some("rsa"), &fractional);
        // exp = AT_MS + 1.5 ms rounds down to AT_MS + 1.
        assert!(check_at(&fractional, AT_MS + LEEWAY_MS).is_ok());
        assert_eq!(
            check_at(&fractional, AT_MS + LEEWAY_MS + 1),
            Err(JwtError::Expired)
        );
        // nbf = AT_MS - 1.5 ms rounds up to AT_MS - 1.
        assert!(check_at(&fractional, AT_MS - 1 - LEEWAY_MS).is_ok());
        assert_eq!(
            check_at(&fractional, AT_MS - 2 - LEEWAY_MS),
            Err(JwtError::NotYetValid)
        );

        let mut huge = claims();
        huge["exp"] = json!(u64::MAX);
        huge["nbf"] = json!(-1e300);
        assert!(check(&token(rsa, Some("rsa"), &huge)).is_ok());
        let mut far = claims();
        far["nbf"] = json!(1e300);
        assert_eq!(check(&token(rsa, Some("rsa"), &far)), Err(JwtError::NotYetValid));
    }

    #[test]
    fn exp_is_required_and_numeric() {
        let rsa = &keys().rsa;
        let mut missing = claims();
        missing.as_object_mut().expect("object").remove("exp");
        assert_eq!(
            check(&token(rsa, Some("rsa"), &missing)),
            Err(JwtError::MissingExpiry)
        );
        let mut text = claims();
        text["exp"] = json!((AT_S + 300).to_string());
        assert_eq!(check(&token(rsa, Some("rsa"), &text)), Err(JwtError::Malformed));
        let mut text = claims();
        text["nbf"] = json!("0");
        assert_eq!(check(&token(rsa, Some("rsa"), &text)), Err(JwtError::Malformed));
    }

    #[test]
    fn the_issuer_must_match_exactly() {
        let rsa = &keys().rsa;
        for iss in [
            json!("https://issuer.example/"),
            json!("https://ISSUER.example"),
            json!([ISSUER]),
            json!(null),
        ] {
            let mut other = claims();
            other["iss"] = iss.clone();
            assert_eq!(
                check(&token(rsa, Some("rsa"), &other)),
                Err(JwtError::WrongIssuer),
                "{iss}"
            );
        }
        let mut missing = claims();
        missing.as_object_mut().expect("object").remove("iss");
        assert_eq!(
            check(&token(rsa, Some("rsa"), &missing)),
            Err(JwtError::WrongIssuer)
        );
    }

    #[test]
    fn the_audience_may_be_a_string_or_an_array() {
        let rsa = &keys().rsa;
        let with_aud = |aud: Value| {
            let mut claims = claims();
            claims["aud"] = aud;
            token(rsa, Some("rsa"), &claims)
        };
        assert!(check(&with_aud(json!(["other", AUDIENCE]))).is_ok());
        assert_eq!(
            check(&with_aud(json!(["other", "more"]))),
            Err(JwtError::WrongAudience)
        );
        assert_eq!(check(&with_aud(json!([]))), Err(JwtError::WrongAudience));
        assert_eq!(check(&with_aud(json!("other"))), Err(JwtError::WrongAudience));
        assert_eq!(
            check(&with_aud(json!([[AUDIENCE]]))),
            Err(JwtError::WrongAudience)
        );
        let mut missing = claims();
        missing.as_object_mut().expect("object").remove("aud");
        let missing = token(rsa, Some("rsa"), &missing);
        assert_eq!(check(&missing), Err(JwtError::WrongAudience));
        // No audience configured: `aud` is not read at all.
        let any = Expected {
            audience: None,
            ..expected()
        };
        assert!(verify(&missing, &set(), &any).is_ok());
        assert!(verify(&with_aud(json!("other")), &set(), &any).is_ok());
    }

    #[test]
    fn the_subject_must_be_a_string_and_may_be_empty() {
        let rsa = &keys().rsa;
        let mut missing = claims();
        missing.as_object_mut().expect("object").remove("sub");
        assert_eq!(
            check(&token(rsa, Some("rsa"), &missing)),
            Err(JwtError::MissingSubject)
        );
        for sub in [json!(42), json!(null), json!(["alice"])] {
            let mut odd = claims();
            odd["sub"] = sub;
            assert_eq!(
                check(&token(rsa, Some("rsa"), &odd)),
                Err(JwtError::MissingSubject)
            );
        }
        let mut empty = claims();
        empty["sub"] = json!("");
        assert_eq!(
            check(&token(rsa, Some("rsa"), &empty)).map(|v| v.subject),
            Ok(String::new())
        );
    }

    #[test]
    fn oversized_tokens_are_refused_before_parsing() {
        let mut big = claims();
        big["pad"] = json!("x".repeat(MAX_TOKEN_BYTES));
        let big = token(&keys().ed25519, Some("ed"), &big);
        assert_eq!(peek(&big), Err(JwtError::Oversized));
        assert_eq!(check(&big), Err(JwtError::Oversized));
        assert_eq!(check(&"a".repeat(MAX_TOKEN_BYTES + 1)), Err(JwtError::Oversized));
        // Just under the bound, the size check lets it through.
        assert_eq!(check(&"a".repeat(MAX_TOKEN_BYTES)), Err(JwtError::Malformed));
    }

    #[test]
    fn malformed_shapes_and_critical_headers_are_refused() {
        let valid = token(&keys().ed25519, Some("ed"), &claims());
        let (input, signature) = valid.rsplit_once('.').expect("parts");
        for bad in [
            String::new(),
            ".".into(),
            "..".into(),
            "a.b".into(),
            format!("{valid}.x"),
            input.to_string(),
            format!("{input}.{signature}="),
            format!("{input}.{signature}!"),
            format!("{}.{}", b64(b"[1]"), &valid[valid.find('.').expect("dot") + 1..]),
            format!(" {valid}"),
        ] {
            assert_eq!(check(&bad), Err(JwtError::Malformed), "{bad:?}");
        }
        let crit = sign_raw(
            &json!({"alg": "EdDSA", "kid": "ed", "crit": ["exp"], "exp": 1}),
            &claims(),
            &keys().ed25519.encoding,
            Algorithm::EdDSA,
        );
        assert_eq!(check(&crit), Err(JwtError::Malformed));
        let numeric_kid = sign_raw(
            &json!({"alg": "EdDSA", "kid": 7}),
            &claims(),
            &keys().ed25519.encoding,
            Algorithm::EdDSA,
        );
        assert_eq!(check(&numeric_kid), Err(JwtError::Malformed));
        let payload_not_object = sign_raw(
            &json!({"alg": "EdDSA", "kid": "ed"}),
            &json!("x"),
            &keys().ed25519.encoding,
            Algorithm::EdDSA,
        );
        assert_eq!(check(&payload_not_object), Err(JwtError::Malformed));
    }

    #[test]
    fn peek_reads_the_header_and_the_unverified_issuer() {
        let peeked = peek(&token(&keys().p256, Some("p256"), &claims())).expect("peek");
        assert_eq!(
            peeked,
            Peeked {
                alg: Alg::ES256,
                kid: Some("p256".into()),
                issuer: Some(ISSUER.into())
            }
        );
        let mut odd = claims();
        odd["iss"] = json!(1);
        let peeked = peek(&token(&keys().rsa, None, &odd)).expect("peek");
        assert_eq!(
            peeked,
            Peeked {
                alg: Alg::RS256,
                kid: None,
                issuer: None
            }
        );
    }

    #[test]
    fn parse_jwks_skips_what_it_cannot_use() {
        let k = keys();
        let n = k.rsa.jwk["n"].as_str().expect("n");
        let document = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            {"kty": "OKP", "crv": "X25519", "x": k.ed25519.jwk["x"]},
            {"kty": "OKP", "crv": "Ed25519", "x": b64(&[7; 31]), "kid": "short"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "no-x"},
            {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"},
            {"kty": "EC", "crv": "P-256", "x": k.p384.jwk["x"], "y": k.p384.jwk["y"]},
            {"kty": "RSA", "n": b64(&[0xff; 128]), "e": "AQAB", "kid": "rsa-1024"},
            {"kty": "RSA", "n": b64(&[0xff; 520]), "e": "AQAB", "kid": "rsa-4160"},
            {"kty": "RSA", "n": n, "e": "AQAB", "kid": 3},
            {"kty": "RSA", "n": "not base64!", "e": "AQAB"},
            {"kty": "RSA", "n": n, "e": "AQAB", "key_ops": "verify"},
            {"n": n, "e": "AQAB"},
            "not an object",
            with(&k.rsa.jwk, json!({"kid": "kept", "x5c": ["ignored"]})),
            with(&k.ed25519.jwk, json!({"kid": "padded", "x": format!("{}=", k.ed25519.jwk["x"].as_str().expect("x"))})),
        ]});
        let jwks = parse_jwks(document.to_string().as_bytes()).expect("a set");
        assert_eq!((jwks.len(), jwks.skipped()), (2, 13), "{jwks:?}");
        assert!(jwks.contains_kid("kept") && jwks.contains_kid("padded") && !jwks.contains_kid("short"));
        assert!(verify(&token(&k.ed25519, Some("padded"), &claims()), &jwks, &expected()).is_ok());
        assert_eq!(
            verify(&token(&k.ed25519, Some("short"), &claims()), &jwks, &expected()),
            Err(JwtError::NoSuchKey)
        );

        let empty = parse_jwks(br#"{"keys": []}"#).expect("an empty set");
        assert!(empty.is_empty());
        for bad in [&b""[..], b"[]", b"{}", br#"{"keys": {}}"#, b"\xff"] {
            assert_eq!(parse_jwks(bad).map(|_| ()), Err(JwksError::Malformed));
        }
    }

    #[test]
    fn only_expiry_is_credential_expired() {
        use JwtError::*;
        for error in [
            Malformed,
            Oversized,
            AlgorithmRefused,
            NoSuchKey,
            BadSignature,
            WrongIssuer,
            WrongAudience,
            NotYetValid,
            MissingExpiry,
            MissingSubject,
        ] {
            assert_eq!(error.problem(), AuthProblem::CredentialInvalid, "{error:?}");
            assert!(
                error.to_string().starts_with(|c: char| c.is_lowercase()),
                "{error}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text never panics either function.
        #[test]
        fn arbitrary_input_never_panics(input in ".{0,300}", dots in proptest::collection::vec(".{0,40}", 0..5)) {
            let joined = dots.join(".");
            for candidate in [&input, &joined] {
                let _ = peek(candidate);
                let _ = verify(candidate, &set(), &expected());
            }
        }

        /// Any truncation, and any one-character change, of a valid token is refused without panicking.
        #[test]
        fn mutated_tokens_never_verify(cut in 0usize..2000, at in 0usize..2000, replacement in proptest::char::any()) {
            let valid = token(&keys().ed25519, Some("ed"), &claims());
            let cut = cut % valid.len();
            let _ = peek(&valid[..cut]);
            prop_assert!(verify(&valid[..cut], &set(), &expected()).is_err());

            let at = at % valid.len();
            let mut mutated: Vec<char> = valid.chars().collect();
            prop_assume!(mutated[at] != replacement);
            mutated[at] = replacement;
            let mutated: String = mutated.into_iter().collect();
            let _ = peek(&mutated);
            prop_assert!(verify(&mutated, &set(), &expected()).is_err());
        }
    }
}
