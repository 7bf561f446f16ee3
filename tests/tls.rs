//! TLS and mutual TLS on a real `capgate serve` process (docs/service.md):
//! `--tls-cert`/`--tls-key` serve TLS, `--tls-client-ca` requires a client
//! certificate signed by that CA. The certificates are made here, per test:
//! a CA that signs the server's certificate and a client's, and another CA
//! that nobody trusts.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::ReasonCode;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_check_response::ServingStatus;

use support::client::{code, health, uncapped, CATALOG, POLICY};
use support::process::Serve;

/// A certificate authority.
struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        Authority {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses), for a server or a client.
    fn sign(&self, common_name: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf parameters");
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign the leaf");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// The certificates of one test, written to files for the server's flags.
struct Pki {
    ca: Authority,
    other_ca: Authority,
    client: Leaf,
    stranger: Leaf,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let ca = Authority::new("capgate test CA");
        let other_ca = Authority::new("someone else's CA");
        let server = ca.sign(
            "capgate",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = ca.sign("edge-gw", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let stranger = other_ca.sign("edge-gw", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        write("ca.pem", &ca.pem());
        write("server.pem", &server.cert);
        write("server.key", &server.key);
        write("policy.yaml", POLICY);
        write("catalog.yaml", CATALOG);
        Pki {
            ca,
            other_ca,
            client,
            stranger,
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        path_text(&self.dir.path().join(name))
    }

    /// `capgate serve` with TLS, over SQLite, with the example policy active.
    async fn serve(&self, mutual: bool) -> Serve {
        let database = format!("sqlite://{}", self.path("capgate.db"));
        let (policy, catalog) = (self.path("policy.yaml"), self.path("catalog.yaml"));
        let (cert, key, ca) = (
            self.path("server.pem"),
            self.path("server.key"),
            self.path("ca.pem"),
        );
        let mut args = vec![
            "--database-url",
            &database,
            "--policy",
            &policy,
            "--catalog",
            &catalog,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        if mutual {
            args.extend(["--tls-client-ca", ca.as_str()]);
        }
        Serve::start(&args).await
    }

    /// A client that trusts the test CA and presents no certificate.
    fn trusting(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.pem()))
            .domain_name("localhost")
    }
}

fn path_text(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// Connects (TLS when `tls` is given), asks for health and one decision.
/// `Err` says where it failed.
async fn call(addr: SocketAddr, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .expect("an endpoint")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| format!("tls: {error:?}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| format!("connect: {error:?}"))?;
    let status = health(&channel)
        .await
        .map_err(|status| format!("health: {status:?}"))?;
    assert_eq!(status, ServingStatus::Serving);
    let answer = DecisionServiceClient::new(channel)
        .decide(uncapped())
        .await
        .map_err(|status| format!("decide: {status:?}"))?
        .into_inner();
    assert_eq!(code(&answer), ReasonCode::Granted);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_its_ca() {
    let pki = Pki::new();
    let serve = pki.serve(false).await;

    call(serve.addr, Some(pki.trusting()))
        .await
        .expect("a client that trusts the CA is served");

    let plaintext = call(serve.addr, None).await;
    assert!(plaintext.is_err(), "a plaintext client was served");

    let distrustful = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.other_ca.pem()))
        .domain_name("localhost");
    let refused = call(serve.addr, Some(distrustful)).await;
    assert!(
        refused.is_err(),
        "a client that does not trust the server's CA connected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_only_clients_with_a_certificate_from_the_client_ca() {
    let pki = Pki::new();
    let serve = pki.serve(true).await;

    let anonymous = call(serve.addr, Some(pki.trusting())).await;
    assert!(anonymous.is_err(), "a client without a certificate was served");

    let known = pki
        .trusting()
        .identity(Identity::from_pem(&pki.client.cert, &pki.client.key));
    call(serve.addr, Some(known))
        .await
        .expect("a client with a certificate from the client CA is served");

    let stranger = pki
        .trusting()
        .identity(Identity::from_pem(&pki.stranger.cert, &pki.stranger.key));
    let refused = call(serve.addr, Some(stranger)).await;
    assert!(
        refused.is_err(),
        "a client with a certificate from another CA was served"
    );

    let plaintext = call(serve.addr, None).await;
    assert!(plaintext.is_err(), "a plaintext client was served");
}
