//! What a verified credential says, turned into raw attributes (docs/reference.md
//! #issuers-and-attribute-mappings): JWT claims for `oidc` issuers, distinguished-name components for
//! `mtls` issuers. Signature checks and key material live at the edge; this
//! module only reads what the edge already verified, so it stays pure.

use super::{normalize, AuthProblem, Issuer, IssuerKind, Resolution};

/// A JWT claim's value, as JSON has it. Numbers are kept as the `f64` an
/// ECMAScript parser would produce, so their text form matches `String(n)`.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimValue {
    String(String),
    Number(f64),
    Bool(bool),
    Array(Vec<ClaimValue>),
    /// An object or `null`: never an attribute.
    Other,
}

impl ClaimValue {
    /// The attribute value a claim becomes, if any (upstream decision 0024):
    /// a non-empty string is itself, a number or boolean its plain text, an
    /// array of exactly one element that element; everything else none.
    pub fn attribute_value(&self) -> Option<String> {
        match self {
            ClaimValue::String(text) if text.is_empty() => None,
            ClaimValue::String(text) => Some(text.clone()),
            ClaimValue::Number(number) => Some(ryu_js::Buffer::new().format(*number).to_owned()),
            ClaimValue::Bool(flag) => Some(flag.to_string()),
            ClaimValue::Array(items) if items.len() == 1 => items[0].attribute_value(),
            ClaimValue::Array(_) | ClaimValue::Other => None,
        }
    }
}

/// An `oidc` issuer's principal from a verified token's subject and
/// top-level claims: each `name: claim:<claim>` mapping copies that claim
/// when it converts to a value.
pub fn from_claims<'c, F>(issuer: &Issuer, subject: &str, claim: F) -> Result<Resolution, AuthProblem>
where
    F: Fn(&str) -> Option<&'c ClaimValue>,
{
    let attributes = issuer.attributes.iter().filter_map(|(name, mapping)| {
        let claim_name = mapping.strip_prefix("claim:")?;
        let value = claim(claim_name)?.attribute_value()?;
        Some((name.clone(), value))
    });
    normalize(Some(issuer), subject, attributes.collect::<Vec<_>>())
}

/// A static-key issuer's principal: its declared subject and literal
/// attribute values, once the presented key has matched its key.
pub fn from_static_key(issuer: &Issuer) -> Result<Resolution, AuthProblem> {
    if issuer.kind != IssuerKind::StaticKey {
        return Err(AuthProblem::IssuerUnknown);
    }
    let subject = issuer.subject.as_deref().ok_or(AuthProblem::IssuerUnknown)?;
    let attributes: Vec<(String, String)> = issuer
        .literal_attributes()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    normalize(Some(issuer), subject, attributes)
}

/// An `mtls` issuer's principal from the client certificate's identity as a
/// TLS terminator forwarded it: an Envoy `x-forwarded-client-cert` value or
/// a bare distinguished name.
pub fn from_client_certificate(issuer: &Issuer, forwarded: &str) -> Result<Resolution, AuthProblem> {
    if forwarded.trim().is_empty() {
        return Err(AuthProblem::CredentialMissing);
    }
    let dn = subject_dn(forwarded)?;
    let components = DistinguishedName::parse(&dn);
    let subject = components.single("cn").ok_or(AuthProblem::CredentialInvalid)?;
    let attributes: Vec<(String, String)> = issuer
        .attributes
        .iter()
        .filter_map(|(name, mapping)| {
            let component = mapping.strip_prefix("dn:")?;
            let value = components.single(&component.to_ascii_lowercase())?;
            Some((name.clone(), value.to_owned()))
        })
        .collect();
    normalize(Some(issuer), subject, attributes)
}

/// The keys an Envoy XFCC element may carry. A value whose top-level
/// `;`-separated parts start with one of them is read as XFCC.
const XFCC_KEYS: [&str; 7] = ["by", "hash", "cert", "chain", "subject", "uri", "dns"];

/// The distinguished name in a forwarded value. XFCC: the `Subject` entry
/// with its outer quoting undone; an XFCC value with several elements (a
/// chain of proxies) or without a `Subject` is refused rather than guessed
/// from. Anything else is a bare DN.
fn subject_dn(forwarded: &str) -> Result<String, AuthProblem> {
    let parts = split_unquoted(forwarded, ';');
    let is_xfcc = parts.iter().any(|part| {
        part.split_once('=')
            .is_some_and(|(key, _)| XFCC_KEYS.contains(&key.trim().to_ascii_lowercase().as_str()))
    });
    if !is_xfcc {
        return Ok(forwarded.to_owned());
    }
    if split_unquoted(forwarded, ',').len() > 1 {
        return Err(AuthProblem::CredentialInvalid);
    }
    let mut subjects = parts.iter().filter_map(|part| {
        let (key, value) = part.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("subject")
            .then(|| unquote(value.trim()))
    });
    match (subjects.next(), subjects.next()) {
        (Some(subject), None) => Ok(subject),
        _ => Err(AuthProblem::CredentialInvalid),
    }
}

/// Splits on `separator` outside double quotes (a backslash escapes the next
/// character inside quotes).
fn split_unquoted(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    for (index, ch) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if ch == '\\' && quoted {
            escaped = true;
        } else if ch == '"' {
            quoted = !quoted;
        } else if ch == separator && !quoted {
            parts.push(&text[start..index]);
            start = index + ch.len_utf8();
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Undoes XFCC's outer quoting: `"…"` without the quotes, `\"` and `\\`
/// unescaped. The DN's own escapes stay for the DN parser.
fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => match chars.next() {
                Some(next @ ('"' | '\\')) => out.push(next),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            other => out.push(other),
        }
    }
    out
}

/// A DN's components: lower-cased keys, unescaped values, in order; a key
/// may repeat.
struct DistinguishedName {
    components: Vec<(String, String)>,
}

impl DistinguishedName {
    /// Splits on unescaped commas; each part `key=value` is trimmed, the key
    /// lower-cased, backslash escapes removed from the value; parts with an
    /// empty key or value are skipped.
    fn parse(dn: &str) -> Self {
        let mut components = Vec::new();
        let mut part = String::new();
        let mut chars = dn.chars();
        let mut parts = Vec::new();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => {
                    part.push('\\');
                    if let Some(next) = chars.next() {
                        part.push(next);
                    }
                }
                ',' => parts.push(std::mem::take(&mut part)),
                other => part.push(other),
            }
        }
        parts.push(part);
        for part in parts {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let value = unescape_dn_value(value.trim());
            if !key.is_empty() && !value.is_empty() {
                components.push((key, value));
            }
        }
        DistinguishedName { components }
    }

    /// The value of a component that appears exactly once.
    fn single(&self, key: &str) -> Option<&str> {
        let mut found = self.components.iter().filter(|(name, _)| name == key);
        match (found.next(), found.next()) {
            (Some((_, value)), None) => Some(value),
            _ => None,
        }
    }
}

/// Removes backslash escapes: `\,` is `,`, `\\` is `\`.
fn unescape_dn_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(ch) = chars.next() {
        if ch == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn issuer(kind: IssuerKind, attributes: &[(&str, &str)]) -> Issuer {
        Issuer {
            id: "corp".into(),
            kind,
            attributes: attributes
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            subject: Some("batch-runner".into()),
            discovery: None,
            audience: None,
            secret_ref: Some("env://KEY".into()),
            path: "/principals/issuers/0".into(),
        }
    }

    fn attributes(resolution: &Resolution) -> Vec<(&str, &str)> {
        resolution
            .principal
            .attributes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn claims_convert_by_the_multi_valued_rule() {
        let check = |value: ClaimValue, expected: Option<&str>| {
            assert_eq!(value.attribute_value().as_deref(), expected, "{value:?}");
        };
        check(ClaimValue::String("ops".into()), Some("ops"));
        check(ClaimValue::String(String::new()), None);
        check(ClaimValue::Number(3.0), Some("3"));
        check(ClaimValue::Number(1.5), Some("1.5"));
        check(ClaimValue::Number(1e21), Some("1e+21"));
        check(ClaimValue::Bool(true), Some("true"));
        check(
            ClaimValue::Array(vec![ClaimValue::Array(vec![ClaimValue::Bool(false)])]),
            Some("false"),
        );
        check(ClaimValue::Array(vec![]), None);
        check(
            ClaimValue::Array(vec![
                ClaimValue::String("a".into()),
                ClaimValue::String("b".into()),
            ]),
            None,
        );
        check(ClaimValue::Other, None);
    }

    #[test]
    fn only_mapped_top_level_claims_become_attributes() {
        let corp = issuer(
            IssuerKind::Oidc,
            &[
                ("team", "claim:team"),
                ("dotted", "claim:a.b"),
                ("groups", "claim:groups"),
            ],
        );
        let claims: BTreeMap<&str, ClaimValue> = [
            ("team", ClaimValue::String("billing".into())),
            ("a.b", ClaimValue::Number(7.0)),
            (
                "groups",
                ClaimValue::Array(vec![ClaimValue::Other, ClaimValue::Other]),
            ),
            ("email", ClaimValue::String("ana@example.com".into())),
        ]
        .into_iter()
        .collect();
        let resolution = from_claims(&corp, "ana", |name| claims.get(name)).unwrap();
        assert_eq!(resolution.principal.id, "corp:ana");
        assert_eq!(attributes(&resolution), [("dotted", "7"), ("team", "billing")]);
        assert_eq!(
            from_claims(&corp, "  ", |name| claims.get(name)).unwrap_err(),
            AuthProblem::CredentialMissing
        );
    }

    #[test]
    fn a_static_key_gives_the_declared_subject_and_literals() {
        let key = issuer(IssuerKind::StaticKey, &[("role", "batch")]);
        let resolution = from_static_key(&key).unwrap();
        assert_eq!(resolution.principal.id, "corp:batch-runner");
        assert_eq!(attributes(&resolution), [("role", "batch")]);
        let mut no_subject = key.clone();
        no_subject.subject = None;
        assert_eq!(
            from_static_key(&no_subject).unwrap_err(),
            AuthProblem::IssuerUnknown
        );
        assert_eq!(
            from_static_key(&issuer(IssuerKind::Oidc, &[])).unwrap_err(),
            AuthProblem::IssuerUnknown
        );
    }

    fn mtls() -> Issuer {
        issuer(
            IssuerKind::Mtls,
            &[("unit", "dn:OU"), ("org", "dn:o"), ("country", "dn:C")],
        )
    }

    #[test]
    fn a_bare_dn_gives_cn_and_mapped_components() {
        let resolution = from_client_certificate(&mtls(), "CN=svc-a, OU=payments ,O=Acme\\, Inc.").unwrap();
        assert_eq!(resolution.principal.id, "corp:svc-a");
        assert_eq!(
            attributes(&resolution),
            [("org", "Acme, Inc."), ("unit", "payments")]
        );
    }

    #[test]
    fn repeated_components_give_no_attribute_and_cn_must_be_single() {
        let resolution = from_client_certificate(&mtls(), "CN=svc-a,OU=a,OU=b,O=acme").unwrap();
        assert_eq!(attributes(&resolution), [("org", "acme")]);
        for bad in ["OU=a,O=b", "CN=a,cn=b", "CN=,OU=a", "no equals sign"] {
            assert_eq!(
                from_client_certificate(&mtls(), bad).unwrap_err(),
                AuthProblem::CredentialInvalid,
                "{bad}"
            );
        }
        assert_eq!(
            from_client_certificate(&mtls(), " ").unwrap_err(),
            AuthProblem::CredentialMissing
        );
    }

    #[test]
    fn an_xfcc_value_uses_its_subject_with_outer_quoting_undone() {
        let xfcc = r#"By=spiffe://cluster.local/ns/default/sa/capgate;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="CN=svc-b,OU=ops\\, eu,O=\"Acme\",C=ES";URI=spiffe://cluster.local/ns/default/sa/svc-b"#;
        let resolution = from_client_certificate(&mtls(), xfcc).unwrap();
        assert_eq!(resolution.principal.subject, "svc-b");
        assert_eq!(
            attributes(&resolution),
            [("country", "ES"), ("org", "\"Acme\""), ("unit", "ops, eu")]
        );
        let subject_only = r#"Subject="CN=svc-c""#;
        assert_eq!(
            from_client_certificate(&mtls(), subject_only)
                .unwrap()
                .principal
                .subject,
            "svc-c"
        );
    }

    #[test]
    fn ambiguous_xfcc_values_are_refused() {
        let two_elements = r#"By=a;Subject="CN=one",By=b;Subject="CN=two""#;
        let no_subject = "By=spiffe://x;Hash=abc;URI=spiffe://y";
        let two_subjects = r#"Subject="CN=one";Subject="CN=two""#;
        for bad in [two_elements, no_subject, two_subjects] {
            assert_eq!(
                from_client_certificate(&mtls(), bad).unwrap_err(),
                AuthProblem::CredentialInvalid,
                "{bad}"
            );
        }
    }
}
