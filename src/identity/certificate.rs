//! A client certificate forwarded whole, as PEM, read down to the distinguished name the core's
//! `mtls` issuers match (`from_client_certificate`).
//!
//! Some terminators forward the certificate rather than its subject: Envoy's ext_authz
//! `source.certificate` (URL-encoded PEM, with `include_peer_certificate`), nginx's
//! `$ssl_client_escaped_cert`, an XFCC `Cert=` element. The certificate is *read*, not verified:
//! as with a forwarded DN, the terminator checked it against its CA when the TLS session was made,
//! and only a gateway trusted to forward certificates may present one (decision 0016).

use capgate_core::principals::AuthProblem;
use x509_parser::objects::{oid2abbrev, oid_registry};
use x509_parser::pem::parse_x509_pem;

/// Whether a forwarded value is a PEM document rather than an XFCC value or a DN.
pub fn is_pem(forwarded: &str) -> bool {
    forwarded.trim_start().starts_with("-----BEGIN")
}

/// The subject of the first certificate in `pem` as `CN=…,OU=…,O=…` (RDN order as encoded;
/// `\` and `,` in a value escaped with a backslash). Anything that is not one well-formed
/// X.509 certificate is `credential_invalid`, as a malformed DN would be.
pub fn subject_dn(pem: &str) -> Result<String, AuthProblem> {
    let (_, document) = parse_x509_pem(pem.trim().as_bytes()).map_err(|_| AuthProblem::CredentialInvalid)?;
    if document.label != "CERTIFICATE" {
        return Err(AuthProblem::CredentialInvalid);
    }
    let certificate = document
        .parse_x509()
        .map_err(|_| AuthProblem::CredentialInvalid)?;
    let registry = oid_registry();
    let mut dn = String::new();
    for attribute in certificate.subject().iter_attributes() {
        // A value that is not a string (a BMPString, raw bytes) names nothing a policy can match.
        let Ok(value) = attribute.as_str() else {
            continue;
        };
        let oid = attribute.attr_type();
        let key = oid2abbrev(oid, registry)
            .map(str::to_owned)
            .unwrap_or_else(|_| oid.to_id_string());
        if !dn.is_empty() {
            dn.push(',');
        }
        dn.push_str(&key);
        dn.push('=');
        for ch in value.chars() {
            if matches!(ch, '\\' | ',') {
                dn.push('\\');
            }
            dn.push(ch);
        }
    }
    Ok(dn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(names: &[(rcgen::DnType, &str)]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in names {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn the_subject_is_read_with_its_components_escaped() {
        let pem = certificate(&[
            (rcgen::DnType::OrganizationName, "Acme, Inc"),
            (rcgen::DnType::OrganizationalUnitName, "billing"),
            (rcgen::DnType::CommonName, "batch-runner"),
        ]);
        assert!(is_pem(&pem));
        assert_eq!(
            subject_dn(&pem).unwrap(),
            r"O=Acme\, Inc,OU=billing,CN=batch-runner"
        );
    }

    #[test]
    fn anything_but_one_certificate_is_invalid() {
        let pem = certificate(&[(rcgen::DnType::CommonName, "a")]);
        let truncated = &pem[..pem.len() / 2];
        assert_eq!(subject_dn(truncated), Err(AuthProblem::CredentialInvalid));
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert_eq!(subject_dn(key), Err(AuthProblem::CredentialInvalid));
        assert_eq!(subject_dn("CN=a"), Err(AuthProblem::CredentialInvalid));
        assert!(!is_pem("CN=a,O=b"));
    }
}
