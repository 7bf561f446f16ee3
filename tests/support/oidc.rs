//! A local OpenID Connect provider for tests: an HTTP server on `127.0.0.1:0` (or HTTPS with a
//! certificate authority made per run) serving a discovery document and a JWK set, with signing
//! keys generated per run, so no key material is checked in.
//!
//! ```ignore
//! let idp = OidcProvider::start().await;
//! let token = idp.mint(&idp.kid(KeyType::Rsa), &idp.claims("alice"));
//! // … point an `oidc` issuer's `discovery` at `idp.discovery_url()` …
//! idp.set_behaviour(Endpoint::Jwks, Behaviour::Fail(500));
//! assert_eq!(idp.requests(Endpoint::Jwks), 1);
//! ```
//!
//! Each provider starts with one key of each [`KeyType`] (kids `rsa-1`, `p256-1`, `ed25519-1`).
//! [`OidcProvider::rotate`] replaces a type's published key by a new one (`rsa-2`, …); retired keys
//! can still mint, to make tokens the provider no longer vouches for. Endpoints can be told to fail,
//! hang or redirect, and every request is counted per endpoint. The server stops when the provider
//! is dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The path of the discovery document (OpenID Connect Discovery §4).
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// The path of the JWK set the discovery document points at.
pub const JWKS_PATH: &str = "/jwks";
/// The `aud` of the tokens [`OidcProvider::claims`] makes.
pub const AUDIENCE: &str = "capgate-test";
/// How long tokens from [`OidcProvider::claims`] are valid, in seconds.
pub const LIFETIME_S: i64 = 300;

/// The kinds of signing key a provider holds, each with the one algorithm it signs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// RSA 2048, RS256.
    Rsa,
    /// ECDSA P-256, ES256.
    P256,
    /// Ed25519, EdDSA.
    Ed25519,
}

impl KeyType {
    pub const ALL: [KeyType; 3] = [KeyType::Rsa, KeyType::P256, KeyType::Ed25519];

    pub fn algorithm(self) -> Algorithm {
        match self {
            KeyType::Rsa => Algorithm::RS256,
            KeyType::P256 => Algorithm::ES256,
            KeyType::Ed25519 => Algorithm::EdDSA,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            KeyType::Rsa => "rsa",
            KeyType::P256 => "p256",
            KeyType::Ed25519 => "ed25519",
        }
    }
}

/// The provider's two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Discovery,
    Jwks,
}

/// How an endpoint answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 with the current document (the default).
    Serve,
    /// This status code and an empty body.
    Fail(u16),
    /// Never answers (the connection stays open until the provider is dropped).
    Hang,
    /// 302 to this location.
    Redirect(String),
}

/// A signing key: private half to mint, public JWK to publish.
#[derive(Clone)]
pub struct SigningKey {
    pub kid: String,
    pub key_type: KeyType,
    /// The public JWK as published (with `kid`, `alg` and `use`).
    pub jwk: Value,
    encoding: EncodingKey,
    /// The RSA public key as PEM ("SubjectPublicKeyInfo"), for HMAC confusion tests.
    public_pem: Option<String>,
}

impl SigningKey {
    /// A fresh key of this type (RSA keys come from a per-process pool: generating one takes a while).
    pub fn generate(key_type: KeyType, kid: &str) -> SigningKey {
        match key_type {
            KeyType::Rsa => {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let private = rsa_key(NEXT.fetch_add(1, Ordering::Relaxed));
                let public = private.to_public_key();
                let der = private.to_pkcs1_der().expect("PKCS#1 DER");
                SigningKey {
                    kid: kid.to_owned(),
                    key_type,
                    jwk: json!({
                        "kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
                        "n": b64(&public.n().to_bytes_be()), "e": b64(&public.e().to_bytes_be()),
                    }),
                    encoding: EncodingKey::from_rsa_der(der.as_bytes()),
                    public_pem: Some(public.to_public_key_pem(LineEnding::LF).expect("PEM")),
                }
            }
            KeyType::P256 => {
                let pair = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a P-256 key");
                let point = pair.public_key_raw();
                SigningKey {
                    kid: kid.to_owned(),
                    key_type,
                    jwk: json!({
                        "kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
                        "x": b64(&point[1..33]), "y": b64(&point[33..65]),
                    }),
                    encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
                    public_pem: None,
                }
            }
            KeyType::Ed25519 => {
                let pair = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("an Ed25519 key");
                SigningKey {
                    kid: kid.to_owned(),
                    key_type,
                    jwk: json!({
                        "kty": "OKP", "crv": "Ed25519", "kid": kid, "alg": "EdDSA", "use": "sig",
                        "x": b64(pair.public_key_raw()),
                    }),
                    encoding: EncodingKey::from_ed_der(&pair.serialize_der()),
                    public_pem: None,
                }
            }
        }
    }

    /// A token with header `{"typ": "JWT", "alg": <this key's>, "kid": <this key's>}`.
    pub fn mint(&self, claims: &Value) -> String {
        self.mint_with_header(
            &json!({"typ": "JWT", "alg": format!("{:?}", self.key_type.algorithm()), "kid": self.kid}),
            claims,
        )
    }

    /// A token with exactly this header, signed with this key's algorithm (whatever the header says).
    pub fn mint_with_header(&self, header: &Value, claims: &Value) -> String {
        sign_with(header, claims, &self.encoding, self.key_type.algorithm())
    }

    pub fn public_key_pem(&self) -> Option<&str> {
        self.public_pem.as_deref()
    }
}

/// `header.claims.signature`, signed by `alg` with `key`, whatever the header claims.
pub fn sign_with(header: &Value, claims: &Value, key: &EncodingKey, alg: Algorithm) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = jsonwebtoken::crypto::sign(input.as_bytes(), key, alg).expect("sign");
    format!("{input}.{signature}")
}

/// An `alg: none` token (empty signature segment unless `signature` is given).
pub fn unsigned_token(kid: Option<&str>, claims: &Value, signature: &str) -> String {
    let mut header = json!({"alg": "none", "typ": "JWT"});
    if let Some(kid) = kid {
        header["kid"] = json!(kid);
    }
    format!(
        "{}.{}.{signature}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// An HMAC token "signed" with `secret` (say, an RSA public key's PEM): the algorithm-confusion attack.
pub fn hmac_token(alg: Algorithm, kid: Option<&str>, secret: &[u8], claims: &Value) -> String {
    let mut header = json!({"alg": format!("{alg:?}"), "typ": "JWT"});
    if let Some(kid) = kid {
        header["kid"] = json!(kid);
    }
    sign_with(&header, claims, &EncodingKey::from_secret(secret), alg)
}

/// Milliseconds since the epoch, now: the `at_ms` to verify minted tokens at.
pub fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970");
    i64::try_from(since.as_millis()).expect("in range")
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The `index`th RSA key of this process, generated on first use.
fn rsa_key(index: usize) -> rsa::RsaPrivateKey {
    static POOL: OnceLock<Mutex<Vec<rsa::RsaPrivateKey>>> = OnceLock::new();
    // A small pool reused round-robin: keys of different kids may share material, which no test
    // relies on either way.
    const POOL_SIZE: usize = 3;
    let pool = POOL.get_or_init(|| Mutex::new(Vec::new()));
    let mut pool = pool.lock().expect("the RSA pool");
    let index = index % POOL_SIZE;
    while pool.len() <= index {
        pool.push(rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("an RSA key"));
    }
    pool[index].clone()
}

/// What the server reads on every request.
struct State {
    issuer: String,
    /// Every key ever made, published or retired, by kid.
    keys: Mutex<HashMap<String, SigningKey>>,
    /// The kids published in the JWK set, in order.
    published: Mutex<Vec<String>>,
    /// Next serial number per key type (kids are `<type>-<n>`).
    serials: Mutex<HashMap<KeyType, usize>>,
    /// Documents served as given instead of the generated ones.
    jwks_override: Mutex<Option<Value>>,
    discovery_override: Mutex<Option<Value>>,
    behaviour: Mutex<HashMap<Endpoint, Behaviour>>,
    discovery_requests: AtomicUsize,
    jwks_requests: AtomicUsize,
}

/// A running provider (module documentation).
pub struct OidcProvider {
    state: Arc<State>,
    addr: SocketAddr,
    ca: Option<CertificateDer<'static>>,
    server: JoinHandle<()>,
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every open connection (hung
        // answers included).
        self.server.abort();
    }
}

impl OidcProvider {
    /// A provider over plain HTTP on 127.0.0.1 (allowed because the host is loopback).
    pub async fn start() -> OidcProvider {
        OidcProvider::launch(false).await
    }

    /// A provider over HTTPS on 127.0.0.1, with a certificate for `127.0.0.1` and `localhost` from a
    /// certificate authority made for it: trust [`ca_certificate`](Self::ca_certificate).
    pub async fn start_tls() -> OidcProvider {
        OidcProvider::launch(true).await
    }

    async fn launch(tls: bool) -> OidcProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let scheme = if tls { "https" } else { "http" };
        let state = Arc::new(State {
            issuer: format!("{scheme}://{addr}"),
            keys: Mutex::default(),
            published: Mutex::default(),
            serials: Mutex::default(),
            jwks_override: Mutex::default(),
            discovery_override: Mutex::default(),
            behaviour: Mutex::default(),
            discovery_requests: AtomicUsize::new(0),
            jwks_requests: AtomicUsize::new(0),
        });
        let (acceptor, ca) = if tls {
            let (config, ca) = tls_config();
            (Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))), Some(ca))
        } else {
            (None, None)
        };
        let server = tokio::spawn(serve(listener, state.clone(), acceptor));
        let provider = OidcProvider {
            state,
            addr,
            ca,
            server,
        };
        for key_type in KeyType::ALL {
            provider.add_key(key_type);
        }
        provider
    }

    /// `http://127.0.0.1:<port>` (or `https://…`): the discovery document's `issuer`, and the `iss`
    /// of minted tokens.
    pub fn issuer(&self) -> &str {
        &self.state.issuer
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn discovery_url(&self) -> String {
        format!("{}{DISCOVERY_PATH}", self.state.issuer)
    }

    pub fn jwks_url(&self) -> String {
        format!("{}{JWKS_PATH}", self.state.issuer)
    }

    /// The certificate authority of a [`start_tls`](Self::start_tls) provider.
    pub fn ca_certificate(&self) -> Option<CertificateDer<'static>> {
        self.ca.clone()
    }

    /// Claims of a valid token for `subject`: `iss`, `sub`, `aud` ([`AUDIENCE`]), `iat` now, and
    /// `exp` [`LIFETIME_S`] from now. Change or remove members for other cases.
    pub fn claims(&self, subject: &str) -> Value {
        let now = now_ms() / 1000;
        json!({"iss": self.issuer(), "sub": subject, "aud": AUDIENCE, "iat": now, "exp": now + LIFETIME_S})
    }

    /// The kid of the published key of this type (the newest when several are).
    pub fn kid(&self, key_type: KeyType) -> String {
        let keys = self.state.keys.lock().expect("keys");
        let published = self.state.published.lock().expect("published");
        published
            .iter()
            .rev()
            .find(|kid| keys.get(*kid).is_some_and(|key| key.key_type == key_type))
            .cloned()
            .expect("a published key of that type")
    }

    /// The key with this kid, published or retired.
    pub fn key(&self, kid: &str) -> SigningKey {
        self.state
            .keys
            .lock()
            .expect("keys")
            .get(kid)
            .cloned()
            .expect("a known kid")
    }

    /// A token over `claims`, signed by the key `kid` (its own algorithm and kid in the header).
    pub fn mint(&self, kid: &str, claims: &Value) -> String {
        self.key(kid).mint(claims)
    }

    /// A token signed by the key `kid` but with no `kid` in its header.
    pub fn mint_without_kid(&self, kid: &str, claims: &Value) -> String {
        let key = self.key(kid);
        key.mint_with_header(
            &json!({"typ": "JWT", "alg": format!("{:?}", key.key_type.algorithm())}),
            claims,
        )
    }

    /// Makes a new key of this type and publishes it next to the others; returns its kid.
    pub fn add_key(&self, key_type: KeyType) -> String {
        let serial = {
            let mut serials = self.state.serials.lock().expect("serials");
            let serial = serials.entry(key_type).or_insert(0);
            *serial += 1;
            *serial
        };
        let kid = format!("{}-{serial}", key_type.prefix());
        let key = SigningKey::generate(key_type, &kid);
        self.state.keys.lock().expect("keys").insert(kid.clone(), key);
        self.state.published.lock().expect("published").push(kid.clone());
        kid
    }

    /// Key rotation: a new key of this type replaces the published one(s) of that type; the old
    /// ones are retired (they still mint, but no longer verify). Returns the new kid.
    pub fn rotate(&self, key_type: KeyType) -> String {
        let old: Vec<String> = {
            let keys = self.state.keys.lock().expect("keys");
            let published = self.state.published.lock().expect("published");
            published
                .iter()
                .filter(|kid| keys.get(*kid).is_some_and(|key| key.key_type == key_type))
                .cloned()
                .collect()
        };
        let kid = self.add_key(key_type);
        self.state
            .published
            .lock()
            .expect("published")
            .retain(|kid| !old.contains(kid));
        kid
    }

    /// The JWK set as currently served (generated unless overridden).
    pub fn jwks(&self) -> Value {
        self.state.jwks()
    }

    /// Serves this document at the JWK set's path instead of the generated one (`None`: back to it).
    pub fn set_jwks(&self, document: Option<Value>) {
        *self.state.jwks_override.lock().expect("jwks override") = document;
    }

    /// Serves this document as the discovery document instead of the generated one (`None`: back to it).
    pub fn set_discovery(&self, document: Option<Value>) {
        *self.state.discovery_override.lock().expect("discovery override") = document;
    }

    pub fn set_behaviour(&self, endpoint: Endpoint, behaviour: Behaviour) {
        self.state
            .behaviour
            .lock()
            .expect("behaviour")
            .insert(endpoint, behaviour);
    }

    /// Requests received so far at this endpoint (whatever it answered).
    pub fn requests(&self, endpoint: Endpoint) -> usize {
        match endpoint {
            Endpoint::Discovery => self.state.discovery_requests.load(Ordering::SeqCst),
            Endpoint::Jwks => self.state.jwks_requests.load(Ordering::SeqCst),
        }
    }
}

impl State {
    fn jwks(&self) -> Value {
        if let Some(document) = self.jwks_override.lock().expect("jwks override").clone() {
            return document;
        }
        let keys = self.keys.lock().expect("keys");
        let published = self.published.lock().expect("published");
        let jwks: Vec<Value> = published
            .iter()
            .filter_map(|kid| keys.get(kid))
            .map(|key| key.jwk.clone())
            .collect();
        json!({ "keys": jwks })
    }

    fn discovery(&self) -> Value {
        if let Some(document) = self
            .discovery_override
            .lock()
            .expect("discovery override")
            .clone()
        {
            return document;
        }
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}{JWKS_PATH}", self.issuer),
            "id_token_signing_alg_values_supported": ["RS256", "ES256", "EdDSA"],
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
        })
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let endpoint = match request.uri().path() {
            DISCOVERY_PATH => {
                self.discovery_requests.fetch_add(1, Ordering::SeqCst);
                Endpoint::Discovery
            }
            JWKS_PATH => {
                self.jwks_requests.fetch_add(1, Ordering::SeqCst);
                Endpoint::Jwks
            }
            _ => return status(StatusCode::NOT_FOUND),
        };
        let behaviour = self
            .behaviour
            .lock()
            .expect("behaviour")
            .get(&endpoint)
            .cloned()
            .unwrap_or(Behaviour::Serve);
        match behaviour {
            Behaviour::Serve => {
                let document = match endpoint {
                    Endpoint::Discovery => self.discovery(),
                    Endpoint::Jwks => self.jwks(),
                };
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(document.to_string())))
                    .expect("a response")
            }
            Behaviour::Fail(code) => status(StatusCode::from_u16(code).expect("a status code")),
            Behaviour::Hang => std::future::pending().await,
            Behaviour::Redirect(location) => Response::builder()
                .status(StatusCode::FOUND)
                .header(header::LOCATION, location)
                .body(Full::default())
                .expect("a response"),
        }
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::default())
        .expect("a response")
}

/// Accepts connections until aborted; each connection is served in a task of `connections`.
async fn serve(listener: TcpListener, state: Arc<State>, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (state, tls) = (state.clone(), tls.clone());
        connections.spawn(async move {
            let service = service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.answer(request).await) }
            });
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
                None => {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
        // Reap finished connections so the set does not grow with every request.
        while connections.try_join_next().is_some() {}
    }
}

/// A server configuration for `127.0.0.1`/`localhost` and the CA that signed its certificate.
fn tls_config() -> (rustls::ServerConfig, CertificateDer<'static>) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "capgate test OIDC CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("a CA key")).expect("a CA");

    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("leaf parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, "capgate test OIDC provider");
    let key = KeyPair::generate().expect("a leaf key");
    let cert = params.signed_by(&key, &ca).expect("sign the leaf");

    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("a server certificate");
    (config, ca.der().clone())
}
