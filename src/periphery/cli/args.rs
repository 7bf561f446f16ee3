//! Arguments shared by several subcommands and the parsers for the values the
//! spec constrains (`--attr`, `--at`, `--usage`, `--window-start`). A value
//! that does not parse is a clap error, hence a usage error (exit 2) printed
//! in the one shape every usage error has.

use std::path::PathBuf;

use crate::access::Instant;
use crate::policy::CompiledPolicy;
use crate::principals::{resolve_asserted, AuthProblem, Resolution};

use super::instant;

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

/// The asserted principal of `explain` and `visible`.
#[derive(Debug, clap::Args)]
pub struct Asserted {
    /// The issuer id, as declared under `principals.issuers`.
    #[arg(long, value_name = "I")]
    pub issuer: String,
    /// The subject, used as given.
    #[arg(long, value_name = "S")]
    pub subject: String,
    /// A principal attribute `k=v`; repeating a key makes it multi-valued (no attribute).
    #[arg(long = "attr", value_name = "K=V", value_parser = parse_attr)]
    pub attrs: Vec<Attr>,
}

impl Asserted {
    /// Resolves the principal as the dry run does: the issuer only has to be
    /// declared, and a static-key issuer's literal attributes are defaults.
    pub fn resolve(&self, policy: &CompiledPolicy) -> Result<Resolution, AuthProblem> {
        let pairs: Vec<(&str, &str)> = self
            .attrs
            .iter()
            .map(|attr| (attr.key.as_str(), attr.value.as_str()))
            .collect();
        resolve_asserted(policy.issuer(&self.issuer), &self.subject, &pairs, true)
    }
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
    instant::parse(text)
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
