//! Normalisation: from an authenticated issuer, subject and raw attributes to
//! the `Principal` the policy sees (docs/reference.md#normalisation), and the multi-valued
//! rule shared by claims, DN components and repeated `--attr` (§1.9).

use std::collections::BTreeMap;

use super::{Issuer, Principal};

/// Why an identity did not become a principal. Never a decision reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthProblem {
    CredentialMissing,
    CredentialInvalid,
    CredentialExpired,
    IssuerUnknown,
}

impl AuthProblem {
    pub const ALL: [AuthProblem; 4] = [
        AuthProblem::CredentialMissing,
        AuthProblem::CredentialInvalid,
        AuthProblem::CredentialExpired,
        AuthProblem::IssuerUnknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuthProblem::CredentialMissing => "credential_missing",
            AuthProblem::CredentialInvalid => "credential_invalid",
            AuthProblem::CredentialExpired => "credential_expired",
            AuthProblem::IssuerUnknown => "issuer_unknown",
        }
    }

    /// One line of prose for a person (never quoting the credential).
    pub fn describe(self) -> &'static str {
        match self {
            AuthProblem::IssuerUnknown => "the issuer is not declared in the policy",
            AuthProblem::CredentialMissing => "no credential was presented, or it names no subject",
            AuthProblem::CredentialInvalid => "the credential is not valid",
            AuthProblem::CredentialExpired => "the credential has expired",
        }
    }
}

/// A normalised principal and the attribute names that were dropped because
/// the issuer does not declare them (sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub principal: Principal,
    pub discarded: Vec<String>,
}

/// The multi-valued rule: a name given once keeps its value; a name given two
/// or more times yields no attribute (`None`). Names keep first-seen order.
pub fn reduce_multi_valued<'a, I>(pairs: I) -> Vec<(String, Option<String>)>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut reduced: Vec<(String, Option<String>)> = Vec::new();
    for (name, value) in pairs {
        match reduced.iter_mut().find(|(seen, _)| seen == name) {
            Some((_, slot)) => *slot = None,
            None => reduced.push((name.to_owned(), Some(value.to_owned()))),
        }
    }
    reduced
}

/// Turns an identity into a principal.
///
/// * an undeclared issuer is `issuer_unknown`;
/// * an empty or whitespace-only subject is `credential_missing` (whitespace
///   as ECMAScript's `trim` sees it, for compatibility);
/// * attributes the issuer does not declare are discarded and reported.
pub fn normalize<I>(issuer: Option<&Issuer>, subject: &str, attributes: I) -> Result<Resolution, AuthProblem>
where
    I: IntoIterator<Item = (String, String)>,
{
    let issuer = issuer.ok_or(AuthProblem::IssuerUnknown)?;
    if subject.chars().all(is_js_whitespace) {
        return Err(AuthProblem::CredentialMissing);
    }
    let mut kept = BTreeMap::new();
    let mut discarded = Vec::new();
    for (name, value) in attributes {
        if issuer.declares(&name) {
            kept.insert(name, value);
        } else {
            discarded.push(name);
        }
    }
    discarded.sort_by(|a, b| utf16_order(a, b));
    discarded.dedup();
    Ok(Resolution {
        principal: Principal {
            id: format!("{}:{subject}", issuer.id),
            issuer: issuer.id.clone(),
            subject: subject.to_owned(),
            attributes: kept,
        },
        discarded,
    })
}

/// Resolves a principal asserted as (issuer, subject, attribute pairs) where a
/// name may repeat (a multi-valued attribute, which yields no attribute).
///
/// With `literal_defaults`, a `static-key` issuer's declared literal values
/// are defaults: a name given once replaces the literal, a name given several
/// times removes it (cli.md `--attr`). Repeated names are not reported as
/// discarded.
pub fn resolve_asserted(
    issuer: Option<&Issuer>,
    subject: &str,
    pairs: &[(&str, &str)],
    literal_defaults: bool,
) -> Result<Resolution, AuthProblem> {
    let reduced = reduce_multi_valued(pairs.iter().copied());
    let mut attributes: Vec<(String, String)> = Vec::new();
    if literal_defaults {
        if let Some(issuer) = issuer {
            for (name, value) in issuer.literal_attributes() {
                if !reduced.iter().any(|(given, _)| given == name) {
                    attributes.push((name.to_owned(), value.to_owned()));
                }
            }
        }
    }
    attributes.extend(
        reduced
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name, value))),
    );
    normalize(issuer, subject, attributes)
}

/// ECMAScript's `WhiteSpace` and `LineTerminator` (what `String.prototype.trim` removes).
fn is_js_whitespace(ch: char) -> bool {
    matches!(
        ch,
        '\u{9}'
            | '\u{b}'
            | '\u{c}'
            | ' '
            | '\u{a0}'
            | '\u{feff}'
            | '\n'
            | '\r'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// Orders strings by UTF-16 code units, as ECMAScript's default sort does.
pub(crate) fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principals::IssuerKind;

    fn issuer(kind: IssuerKind, attributes: &[(&str, &str)]) -> Issuer {
        Issuer {
            id: "corp".into(),
            kind,
            attributes: attributes
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            subject: None,
            discovery: None,
            audience: None,
            secret_ref: None,
            path: "/principals/issuers/0".into(),
        }
    }

    fn attrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn undeclared_issuer_and_blank_subject_are_problems() {
        assert_eq!(
            normalize(None, "ana", attrs(&[])),
            Err(AuthProblem::IssuerUnknown)
        );
        let corp = issuer(IssuerKind::Oidc, &[]);
        assert_eq!(
            normalize(Some(&corp), " \t\u{feff}", attrs(&[])),
            Err(AuthProblem::CredentialMissing)
        );
        // U+0085 is whitespace to Rust but not to ECMAScript's trim.
        assert!(normalize(Some(&corp), "\u{85}", attrs(&[])).is_ok());
    }

    #[test]
    fn keeps_declared_attributes_and_reports_the_rest_sorted() {
        let corp = issuer(IssuerKind::Oidc, &[("team", "claim:team")]);
        let resolution = normalize(
            Some(&corp),
            "ana",
            attrs(&[("zeta", "1"), ("team", "a"), ("alpha", "2")]),
        )
        .unwrap();
        assert_eq!(resolution.principal.id, "corp:ana");
        assert_eq!(resolution.principal.attributes.len(), 1);
        assert_eq!(resolution.discarded, ["alpha", "zeta"]);
    }

    #[test]
    fn multi_valued_names_give_no_attribute() {
        let reduced = reduce_multi_valued([("a", "1"), ("b", "2"), ("a", "3")]);
        assert_eq!(
            reduced,
            vec![("a".to_owned(), None), ("b".to_owned(), Some("2".to_owned()))]
        );
    }

    #[test]
    fn literal_defaults_are_replaced_or_removed() {
        let key = issuer(IssuerKind::StaticKey, &[("role", "batch"), ("env", "prod")]);
        let given = resolve_asserted(Some(&key), "runner", &[("role", "ops")], true).unwrap();
        assert_eq!(
            given.principal.attributes.get("role").map(String::as_str),
            Some("ops")
        );
        assert_eq!(
            given.principal.attributes.get("env").map(String::as_str),
            Some("prod")
        );
        let removed = resolve_asserted(
            Some(&key),
            "runner",
            &[("env", "a"), ("env", "b"), ("x", "1"), ("y", "1"), ("y", "2")],
            true,
        )
        .unwrap();
        assert!(!removed.principal.attributes.contains_key("env"));
        assert_eq!(removed.discarded, ["x"]);
        let no_defaults = resolve_asserted(Some(&key), "runner", &[], false).unwrap();
        assert!(no_defaults.principal.attributes.is_empty());
    }

    #[test]
    fn utf16_order_differs_from_byte_order_for_astral_characters() {
        // U+FF61 sorts after U+10000 in UTF-8 byte order is false; in UTF-16 it is true.
        assert_eq!(utf16_order("\u{ff61}", "\u{10000}"), std::cmp::Ordering::Greater);
        assert_eq!("\u{ff61}".cmp("\u{10000}"), std::cmp::Ordering::Less);
    }
}
