//! Arguments shared by several subcommands and the parsers for the values the
//! spec constrains (`--attr`, `--at`, `--usage`, `--window-start`). A value
//! that does not parse is a clap error, hence a usage error (exit 2) printed
//! in the one shape every usage error has.

use std::path::PathBuf;

use crate::identity::{self, jwt, KeyedIssuer, Presented, StaticKeys};
use capgate_core::access::Instant;
use capgate_core::policy::CompiledPolicy;
use capgate_core::principals::{resolve_asserted, AuthProblem, IssuerKind, Resolution};

use super::Failure;
use crate::clock;

/// `--catalog` and `--json`, which every dry-run command but `schema` takes.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// A declared catalog file: adds the catalog checks and supplies tool descriptors.
    #[arg(long, value_name = "FILE")]
    pub catalog: Option<PathBuf>,
    /// Print the JSON document instead of the human report.
    #[arg(long)]
    pub json: bool,
}

/// Who asks, for `explain` and `visible`: a principal given by its parts, or
/// a credential checked as the service would, offline.
#[derive(Debug, clap::Args)]
pub struct Asserted {
    /// The issuer id, as declared under `principals.issuers`. With a credential, the optional issuer
    /// hint.
    #[arg(long, value_name = "I", required_unless_present_any = ["token", "api_key", "client_dn"])]
    pub issuer: Option<String>,
    /// The subject, used as given.
    #[arg(
        long,
        value_name = "S",
        required_unless_present_any = ["token", "api_key", "client_dn"],
        conflicts_with_all = ["token", "api_key", "client_dn"]
    )]
    pub subject: Option<String>,
    /// A principal attribute `k=v`; repeating a key makes it multi-valued (no attribute).
    #[arg(long = "attr", value_name = "K=V", value_parser = parse_attr, conflicts_with_all = ["token", "api_key", "client_dn"])]
    pub attrs: Vec<Attr>,
    /// The caller's bearer JWT, of an `oidc` issuer. `explain` and `visible` verify it against
    /// `--jwks` (signature, `iss`, `aud`, `exp`, `nbf` at `--at`); `decide` sends it, and the server
    /// verifies it. Not the token this command calls a server with (`--token-file`).
    #[arg(
        long = "caller-token",
        alias = "token",
        value_name = "JWT",
        conflicts_with_all = ["api_key", "client_dn"]
    )]
    pub token: Option<String>,
    /// The caller's key, of a `static-key` issuer. `explain` and `visible` compare it with the keys
    /// the issuers' `env://` and `file://` references hold on this machine; `decide` sends it, and
    /// the server compares it.
    #[arg(long, value_name = "KEY", conflicts_with = "client_dn")]
    pub api_key: Option<String>,
    /// A client certificate's DN or an Envoy `x-forwarded-client-cert` value, for an `mtls` issuer.
    #[arg(long, value_name = "DN")]
    pub client_dn: Option<String>,
}

/// `--jwks`, for the commands that check a `--caller-token` offline (`explain`,
/// `visible`; `decide` sends the token to the server instead).
#[derive(Debug, clap::Args)]
pub struct LocalKeys {
    /// The issuer's key set (a JWKS JSON file) to verify `--caller-token` with, offline.
    #[arg(long, value_name = "FILE", requires = "token")]
    pub jwks: Option<PathBuf>,
}

impl Asserted {
    /// Resolves the principal as the dry run does. Given by its parts, the
    /// issuer only has to be declared and a static-key issuer's literal
    /// attributes are defaults. Given a credential, it is authenticated as
    /// the service would at `at`; only reading `--jwks` can fail the command.
    pub fn resolve(
        &self,
        policy: &CompiledPolicy,
        at: Instant,
        keys: &LocalKeys,
    ) -> Result<Result<Resolution, AuthProblem>, Failure> {
        let hint = self.issuer.as_deref();
        if let Some(token) = &self.token {
            let Some(path) = keys.jwks.as_deref() else {
                return Err(Failure::Usage(
                    "`--caller-token` needs `--jwks FILE`: the issuer's key set to verify it with, offline"
                        .to_owned(),
                ));
            };
            let bytes = std::fs::read(path).map_err(|error| {
                Failure::Input(format!("cannot read `{}`: {}", path.display(), error.kind()))
            })?;
            let keys = jwt::parse_jwks(&bytes).map_err(|error| {
                Failure::Input(format!("`{}` is not a usable JWK set: {error}", path.display()))
            })?;
            return Ok(offline_bearer(policy, hint, token, &keys, at));
        }
        if let Some(key) = &self.api_key {
            let presented = Presented::ApiKey(key);
            if let Err(problem) = presented.check() {
                return Ok(Err(problem));
            }
            let keys = StaticKeys::resolve(&policy.issuers, identity::read_reference, |issuer, problem| {
                eprintln!("warning: the key of issuer `{issuer}` cannot be read here: {problem}");
            });
            return Ok(keys.authenticate(&policy.issuers, hint, key));
        }
        if let Some(forwarded) = &self.client_dn {
            if let Err(problem) = Presented::ClientCertificate(forwarded).check() {
                return Ok(Err(problem));
            }
            return Ok(identity::client_certificate(&policy.issuers, hint, forwarded));
        }
        let pairs: Vec<(&str, &str)> = self
            .attrs
            .iter()
            .map(|attr| (attr.key.as_str(), attr.value.as_str()))
            .collect();
        let issuer = hint.and_then(|id| policy.issuer(id));
        Ok(resolve_asserted(
            issuer,
            self.subject.as_deref().unwrap_or_default(),
            &pairs,
            true,
        ))
    }
}

/// A bearer token checked against a local key set: the issuer is the hint,
/// or the `oidc` issuers whose issuer URL (the discovery URL without
/// `/.well-known/openid-configuration`) is the token's `iss`.
pub(crate) fn offline_bearer(
    policy: &CompiledPolicy,
    hint: Option<&str>,
    token: &str,
    keys: &jwt::Jwks,
    at: Instant,
) -> Result<Resolution, AuthProblem> {
    Presented::BearerToken(token).check()?;
    let claimed = jwt::peek(token).map_err(|error| error.problem())?.issuer;
    let candidates = identity::candidates(&policy.issuers, IssuerKind::Oidc, hint)?;
    let keyed: Vec<KeyedIssuer<'_, &jwt::Jwks>> = candidates
        .into_iter()
        .filter_map(|issuer| {
            let issuer_url = identity::issuer_url_of(issuer.discovery.as_deref()?)?.to_owned();
            (hint.is_some() || claimed.as_deref() == Some(issuer_url.as_str())).then_some(KeyedIssuer {
                issuer,
                issuer_url,
                keys,
            })
        })
        .collect();
    identity::verify_bearer(&keyed, token, at).1
}

/// One `--attr k=v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub key: String,
    pub value: String,
}

/// Splits at the first `=`; the key must not be empty, the value may be.
pub fn parse_attr(text: &str) -> Result<Attr, String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err("expected `KEY=VALUE`, found no `=`".to_owned());
    };
    if key.is_empty() {
        return Err("the attribute name before `=` is empty".to_owned());
    }
    Ok(Attr {
        key: key.to_owned(),
        value: value.to_owned(),
    })
}

/// `--at` and `--window-start`.
pub fn parse_instant(text: &str) -> Result<Instant, String> {
    clock::parse(text)
}

/// `--usage N|unknown|none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageArg {
    Counted(u64),
    Unknown,
    NotConsulted,
}

pub fn parse_usage(text: &str) -> Result<UsageArg, String> {
    match text {
        "unknown" => Ok(UsageArg::Unknown),
        "none" => Ok(UsageArg::NotConsulted),
        digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits
            .parse()
            .map(UsageArg::Counted)
            .map_err(|_| "the call count does not fit in 64 bits".to_owned()),
        _ => Err("expected a call count (digits), `unknown` or `none`".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_split_at_the_first_equals_sign() {
        let attr = |key: &str, value: &str| {
            Ok(Attr {
                key: key.into(),
                value: value.into(),
            })
        };
        assert_eq!(parse_attr("dept=support"), attr("dept", "support"));
        assert_eq!(parse_attr("k=a=b"), attr("k", "a=b"));
        assert_eq!(parse_attr("k="), attr("k", ""));
        assert_eq!(parse_attr(" k = v "), attr(" k ", " v "));
        assert!(parse_attr("=v").is_err());
        assert!(parse_attr("=").is_err());
        assert!(parse_attr("dept").is_err());
        assert!(parse_attr("").is_err());
    }

    #[test]
    fn usage_is_a_count_unknown_or_none() {
        assert_eq!(parse_usage("0"), Ok(UsageArg::Counted(0)));
        assert_eq!(parse_usage("007"), Ok(UsageArg::Counted(7)));
        assert_eq!(
            parse_usage("18446744073709551615"),
            Ok(UsageArg::Counted(u64::MAX))
        );
        assert!(parse_usage("18446744073709551616").is_err());
        assert_eq!(parse_usage("unknown"), Ok(UsageArg::Unknown));
        assert_eq!(parse_usage("none"), Ok(UsageArg::NotConsulted));
        for bad in ["", "+1", "-1", "1.0", " 1", "Unknown", "NONE", "1e3", "٣"] {
            assert!(parse_usage(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
