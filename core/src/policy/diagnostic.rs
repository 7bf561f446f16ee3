//! Diagnostics: plain data (code, severity, pointer, position, related).
//! Renderers — text with a source snippet, JSON — live in the periphery.

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

/// The closed set of diagnostic codes: upstream's 14 plus our 2.
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
}

impl Code {
    pub const ALL: [Code; 16] = [
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
    ];

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
