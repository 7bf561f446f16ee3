//! Arguments shared by several subcommands and the parsers for the values the
//! spec constrains (`--attr`, `--at`, `--usage`, `--window-start`, `--arg`). A value
//! that does not parse is a clap error, hence a usage error (exit 2) printed
//! in the one shape every usage error has; `--args-json`, which may name a file, is
//! read after parsing, its errors usage errors too (a file that cannot be read: exit 3).

use std::path::PathBuf;

use serde_json::{Map, Value};

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

/// The tool call's arguments, for `explain` and `decide`: what a grant's conditions read.
#[derive(Debug, clap::Args)]
pub struct CallArguments {
    /// An argument of the call, `PATH=VALUE` (repeatable): VALUE is read as JSON when it parses
    /// (`amount=50` is a number, `flag=true` a boolean), else taken as a string (`currency=EUR`); a
    /// dotted PATH nests (`order.total=10`). Applied in order over `--args-json`: the last wins.
    #[arg(long = "arg", value_name = "PATH=VALUE", value_parser = parse_call_arg)]
    pub args: Vec<CallArg>,
    /// The call's arguments as one JSON object, or `@FILE` to read it from FILE. Without this and
    /// `--arg`, the arguments are not given: a condition on one is `arguments_missing`.
    #[arg(long, value_name = "OBJECT|@FILE")]
    pub args_json: Option<String>,
}

impl CallArguments {
    /// The arguments object, `None` when neither flag is given. `--args-json` that is not JSON
    /// or not an object is a usage error naming the flag; a file it names that cannot be read
    /// is an input error.
    pub fn resolve(&self) -> Result<Option<Map<String, Value>>, Failure> {
        let mut arguments = match &self.args_json {
            None if self.args.is_empty() => return Ok(None),
            None => Map::new(),
            Some(text) => object_from(text)?,
        };
        for CallArg { path, value } in &self.args {
            capgate_core::access::set_argument(&mut arguments, path, value.clone());
        }
        Ok(Some(arguments))
    }
}

/// `--args-json`'s object, from the text or from `@FILE`.
fn object_from(text: &str) -> Result<Map<String, Value>, Failure> {
    let (read, origin) = match text.strip_prefix('@') {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|error| {
                Failure::Input(format!(
                    "`--args-json`: cannot read `{path}`: {}",
                    super::input::describe(&error)
                ))
            })?;
            (
                String::from_utf8_lossy(&bytes).into_owned(),
                format!(" (in `{path}`)"),
            )
        }
        None => (text.to_owned(), String::new()),
    };
    match serde_json::from_str::<Value>(&read) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(Failure::Usage(format!(
            "`--args-json` must be a JSON object{origin}, not {}",
            kind_of(&other)
        ))),
        Err(error) => Err(Failure::Usage(format!(
            "`--args-json` is not JSON{origin}: {error}"
        ))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One `--arg PATH=VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallArg {
    /// The member names, outermost first.
    pub path: Vec<String>,
    pub value: Value,
}

/// Splits at the first `=`; the path is dotted member names, none empty; the value is JSON
/// if it parses as JSON, else the text itself.
pub fn parse_call_arg(text: &str) -> Result<CallArg, String> {
    let Some((path, value)) = text.split_once('=') else {
        return Err("expected `PATH=VALUE`, found no `=`".to_owned());
    };
    if path.is_empty() {
        return Err("the argument path before `=` is empty".to_owned());
    }
    let path: Vec<String> = path.split('.').map(str::to_owned).collect();
    if path.iter().any(String::is_empty) {
        return Err("the argument path has an empty member name (`..`, or a dot at an end)".to_owned());
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok(CallArg { path, value })
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
    fn call_arguments_are_json_values_else_strings_at_dotted_paths() {
        let arg = |text: &str| parse_call_arg(text).map(|arg| (arg.path.join("/"), arg.value));
        assert_eq!(arg("amount=50"), Ok(("amount".into(), serde_json::json!(50))));
        assert_eq!(
            arg("currency=EUR"),
            Ok(("currency".into(), serde_json::json!("EUR")))
        );
        assert_eq!(arg("flag=true"), Ok(("flag".into(), serde_json::json!(true))));
        assert_eq!(arg("id=\"50\""), Ok(("id".into(), serde_json::json!("50"))));
        assert_eq!(arg("note="), Ok(("note".into(), serde_json::json!(""))));
        assert_eq!(arg("a=b=c"), Ok(("a".into(), serde_json::json!("b=c"))));
        assert_eq!(
            arg("order.total=1.5"),
            Ok(("order/total".into(), serde_json::json!(1.5)))
        );
        for bad in ["amount", "=1", "a..b=1", ".a=1", "a.=1"] {
            assert!(parse_call_arg(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn args_json_and_args_merge_with_the_args_winning() {
        let given = |json: Option<&str>, args: &[&str]| CallArguments {
            args: args.iter().map(|text| parse_call_arg(text).unwrap()).collect(),
            args_json: json.map(str::to_owned),
        };
        assert_eq!(given(None, &[]).resolve(), Ok(None));
        let merged = given(
            Some(r#"{"amount": 500, "currency": "EUR", "order": {"id": "o-1"}}"#),
            &["amount=50", "order.total=10", "order.id.x=1"],
        )
        .resolve();
        assert_eq!(
            merged.map(|m| m.map(Value::Object)),
            Ok(Some(serde_json::json!({
                "amount": 50, "currency": "EUR", "order": {"id": {"x": 1}, "total": 10}
            })))
        );
        for (bad, says) in [
            ("[1]", "`--args-json` must be a JSON object, not an array"),
            ("{\"a\": ", "`--args-json` is not JSON: "),
            ("EUR", "`--args-json` is not JSON: "),
        ] {
            match given(Some(bad), &[]).resolve() {
                Err(Failure::Usage(message)) => assert!(message.starts_with(says), "{message}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
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
