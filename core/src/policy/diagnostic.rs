//! Diagnostics: plain data (code, severity, pointer, position, related).
//! Renderers — text with a source snippet, JSON — live in the periphery.

use std::collections::BTreeMap;

use super::Position;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// The closed set of diagnostic codes: upstream's 14, our 2 more of the compiler's, and one the
/// service reports about a version it accepted ([`Code::from_the_compiler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    YamlSyntax,
    SchemaViolation,
    DuplicateId,
    UnknownCapabilityInTool,
    DuplicateTool,
    ClaimMappingExpected,
    DnMappingExpected,
    UnknownIssuerInGrant,
    AttributeNotDeclared,
    UnknownCapabilityInGrant,
    UnknownAccountInGrant,
    AmbiguousGrant,
    CapabilityNotRealized,
    UnusedAccount,
    ToolNotInCatalog,
    CatalogToolUnmapped,
    /// An `account` with `upstreams:` is used for a tool of another upstream (ours, 0030).
    AccountNotForUpstream,
    /// Conditions (`when`) in an artifact of version 1, whose readers would ignore them (ours, 0034).
    ConditionsNeedVersion2,
    /// A time condition's zone is not in the IANA database compiled in (ours, 0034).
    UnknownTimeZone,
    /// A condition's argument is not in a tool's declared `inputSchema` (ours, 0034).
    ArgumentNotInSchema,
    /// A condition compares an argument with a value of another kind than the tool's
    /// `inputSchema` gives it, or than another condition on it does (ours, 0034).
    ConditionTypeMismatch,
    /// No call meets all of a grant's conditions (ours, 0034).
    ConditionUnsatisfiable,
    /// A secret the server must read itself (a `static-key` issuer's key) cannot be read where
    /// the version was published: the service's warning, never the compiler's.
    SecretUnreadable,
}

impl Code {
    pub const ALL: [Code; 23] = [
        Code::YamlSyntax,
        Code::SchemaViolation,
        Code::DuplicateId,
        Code::UnknownCapabilityInTool,
        Code::DuplicateTool,
        Code::ClaimMappingExpected,
        Code::DnMappingExpected,
        Code::UnknownIssuerInGrant,
        Code::AttributeNotDeclared,
        Code::UnknownCapabilityInGrant,
        Code::UnknownAccountInGrant,
        Code::AmbiguousGrant,
        Code::CapabilityNotRealized,
        Code::UnusedAccount,
        Code::ToolNotInCatalog,
        Code::CatalogToolUnmapped,
        Code::AccountNotForUpstream,
        Code::ConditionsNeedVersion2,
        Code::UnknownTimeZone,
        Code::ArgumentNotInSchema,
        Code::ConditionTypeMismatch,
        Code::ConditionUnsatisfiable,
        Code::SecretUnreadable,
    ];

    /// Whether the compiler reports it; the others come from the service, which reads what the
    /// pure core cannot.
    pub fn from_the_compiler(self) -> bool {
        self != Code::SecretUnreadable
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::YamlSyntax => "yaml_syntax",
            Code::SchemaViolation => "schema_violation",
            Code::DuplicateId => "duplicate_id",
            Code::UnknownCapabilityInTool => "unknown_capability_in_tool",
            Code::DuplicateTool => "duplicate_tool",
            Code::ClaimMappingExpected => "claim_mapping_expected",
            Code::DnMappingExpected => "dn_mapping_expected",
            Code::UnknownIssuerInGrant => "unknown_issuer_in_grant",
            Code::AttributeNotDeclared => "attribute_not_declared",
            Code::UnknownCapabilityInGrant => "unknown_capability_in_grant",
            Code::UnknownAccountInGrant => "unknown_account_in_grant",
            Code::AmbiguousGrant => "ambiguous_grant",
            Code::CapabilityNotRealized => "capability_not_realized",
            Code::UnusedAccount => "unused_account",
            Code::ToolNotInCatalog => "tool_not_in_catalog",
            Code::CatalogToolUnmapped => "catalog_tool_unmapped",
            Code::AccountNotForUpstream => "account_not_for_upstream",
            Code::ConditionsNeedVersion2 => "conditions_need_version_2",
            Code::UnknownTimeZone => "unknown_time_zone",
            Code::ArgumentNotInSchema => "argument_not_in_schema",
            Code::ConditionTypeMismatch => "condition_type_mismatch",
            Code::ConditionUnsatisfiable => "condition_unsatisfiable",
            Code::SecretUnreadable => "secret_unreadable",
        }
    }
}

/// A location a diagnostic also concerns ("first declaration", …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    pub path: String,
    pub position: Option<Position>,
    pub note: String,
}

/// One finding of the compiler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: Code,
    pub message: String,
    /// RFC 6901 pointer; `""` for `yaml_syntax`.
    pub path: String,
    pub position: Option<Position>,
    pub related: Vec<Related>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Whether any diagnostic blocks compilation.
pub fn has_errors(diagnostics: &[Diagnostic]) -> bool {
    diagnostics.iter().any(Diagnostic::is_error)
}

/// How many diagnostics an answer carries at most ([`bounded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Diagnostics of one code (per severity), in emission order.
    pub per_code: usize,
    /// The text of all of them together: messages, pointers, related locations.
    pub bytes: usize,
}

/// `diagnostics` cut to `bounds`, each code's omitted ones summed up in one final diagnostic of
/// that code and severity: "… and K more like this". Emission order is kept; the summaries come
/// last, in the order their codes were first cut.
///
/// A compilation reports everything it finds: a 100,000-tool catalog that no mapping covers is
/// 100,000 `catalog_tool_unmapped` warnings, 14 MB on the wire. An answer sent over the network
/// carries these bounds instead; `capgate validate` on the same files still lists every one.
pub fn bounded(diagnostics: Vec<Diagnostic>, bounds: Bounds) -> Vec<Diagnostic> {
    let mut kept = Vec::new();
    let mut bytes = 0;
    // (severity, code) → (omitted, the first omitted one), in the order codes are first cut.
    let mut cut: Vec<((Severity, Code), usize, Diagnostic)> = Vec::new();
    let mut per_code: BTreeMap<(Severity, Code), usize> = BTreeMap::new();
    for diagnostic in diagnostics {
        let key = (diagnostic.severity, diagnostic.code);
        let count = per_code.entry(key).or_default();
        let size = text_size(&diagnostic);
        if *count < bounds.per_code && bytes + size <= bounds.bytes {
            *count += 1;
            bytes += size;
            kept.push(diagnostic);
        } else {
            match cut.iter_mut().find(|(seen, _, _)| *seen == key) {
                Some((_, omitted, _)) => *omitted += 1,
                None => cut.push((key, 1, diagnostic)),
            }
        }
    }
    kept.extend(cut.into_iter().map(|((severity, code), omitted, first)| {
        let noun = match (severity, omitted) {
            (Severity::Error, 1) => "error",
            (Severity::Error, _) => "errors",
            (Severity::Warning, 1) => "warning",
            (Severity::Warning, _) => "warnings",
        };
        // The first omitted one's location, unless it is itself too big to carry.
        let (path, position) = if first.path.len() <= MAX_SUMMARY_PATH {
            (first.path, first.position)
        } else {
            (String::new(), None)
        };
        Diagnostic {
            severity,
            code,
            message: format!(
                "… and {omitted} more `{}` {noun} like this, not listed here (the first at this \
                 location); `capgate validate` lists every one",
                code.as_str()
            ),
            path,
            position,
            related: Vec::new(),
        }
    }));
    kept
}

/// The longest pointer a summary repeats.
const MAX_SUMMARY_PATH: usize = 1024;

/// The text a diagnostic carries, which is what its size on any wire grows with.
fn text_size(diagnostic: &Diagnostic) -> usize {
    let related: usize = diagnostic
        .related
        .iter()
        .map(|related| related.path.len() + related.note.len())
        .sum();
    diagnostic.message.len() + diagnostic.path.len() + related
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warning(code: Code, n: usize) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            code,
            message: format!("finding {n}"),
            path: format!("/upstreams/{n}"),
            position: None,
            related: Vec::new(),
        }
    }

    #[test]
    fn each_code_keeps_its_first_ones_and_sums_up_the_rest() {
        let mut all: Vec<Diagnostic> = (0..5).map(|n| warning(Code::CatalogToolUnmapped, n)).collect();
        all.insert(2, warning(Code::UnusedAccount, 99));
        let cut = bounded(
            all,
            Bounds {
                per_code: 2,
                bytes: usize::MAX,
            },
        );
        let shown: Vec<(&str, &str)> = cut.iter().map(|d| (d.code.as_str(), d.path.as_str())).collect();
        assert_eq!(
            shown,
            [
                ("catalog_tool_unmapped", "/upstreams/0"),
                ("catalog_tool_unmapped", "/upstreams/1"),
                ("unused_account", "/upstreams/99"),
                // The summary points at the first one it stands for.
                ("catalog_tool_unmapped", "/upstreams/2"),
            ]
        );
        assert!(
            cut[3]
                .message
                .starts_with("… and 3 more `catalog_tool_unmapped` warnings like this"),
            "{}",
            cut[3].message
        );
        assert_eq!(cut[3].severity, Severity::Warning);
    }

    #[test]
    fn nothing_is_cut_within_the_bounds() {
        let all: Vec<Diagnostic> = (0..3).map(|n| warning(Code::UnusedAccount, n)).collect();
        let bounds = Bounds {
            per_code: 3,
            bytes: 1 << 20,
        };
        assert_eq!(bounded(all.clone(), bounds), all);
    }

    #[test]
    fn the_byte_bound_holds_whatever_one_diagnostic_carries() {
        let mut huge = warning(Code::ToolNotInCatalog, 0);
        huge.message = "m".repeat(10_000);
        huge.path = format!("/upstreams/{}", "p".repeat(10_000));
        let all = vec![huge, warning(Code::ToolNotInCatalog, 1)];
        let cut = bounded(
            all,
            Bounds {
                per_code: 10,
                bytes: 1_000,
            },
        );
        // The small one fits; the huge one is summed up, without its overlong pointer.
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[0].path, "/upstreams/1");
        assert!(cut[1]
            .message
            .starts_with("… and 1 more `tool_not_in_catalog` warning like"));
        assert_eq!(cut[1].path, "");
        assert!(cut.iter().map(text_size).sum::<usize>() < 1_000 + 200);
    }
}
