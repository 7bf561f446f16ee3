//! The compile pipeline (docs/reference.md#compilation): parse → schema → semantic checks.
//! A YAML error stops before the schema; a schema error stops before the
//! semantic checks; any error means no evaluable policy. The parsed document
//! is kept either way so that pointers resolve to positions.

use super::checks::{self, Findings};
use super::document::Document;
use super::model::{CompiledPolicy, Declared};
use super::{has_errors, schema, version_label, Code, Diagnostic, Severity};
use crate::capabilities::{Catalog, ToolIndex};

/// What compiling an artifact yields.
#[derive(Debug, Clone)]
pub struct Compilation {
    /// `sha256:<hex>` of the artifact's bytes.
    pub version: String,
    /// The parsed document, when the YAML parsed.
    pub document: Option<Document>,
    /// The evaluable policy, when no diagnostic is an error.
    pub policy: Option<CompiledPolicy>,
    /// Every diagnostic, in emission order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Compilation {
    pub fn ok(&self) -> bool {
        !has_errors(&self.diagnostics)
    }
}

/// Compiles an artifact, optionally against a declared catalog.
pub fn compile(artifact: &[u8], catalog: Option<&Catalog>) -> Compilation {
    let version = version_label(artifact);
    let document = match Document::parse_bytes(artifact) {
        Ok(document) => document,
        Err(errors) => {
            return Compilation {
                version,
                document: None,
                policy: None,
                diagnostics: errors
                    .into_iter()
                    .map(|error| Diagnostic {
                        severity: Severity::Error,
                        code: Code::YamlSyntax,
                        message: error.message,
                        path: String::new(),
                        position: Some(error.position),
                        related: Vec::new(),
                    })
                    .collect(),
            }
        }
    };

    let violations = schema::validate(&document);
    if !violations.is_empty() {
        return Compilation {
            version,
            document: Some(document),
            policy: None,
            diagnostics: violations,
        };
    }

    let declared = Declared::read(&document);
    let mut findings = Findings::new(&document);
    checks::run(&declared, catalog, &mut findings);
    let diagnostics = findings.diagnostics;

    let policy = (!has_errors(&diagnostics)).then(|| {
        let tools = match catalog {
            Some(catalog) => ToolIndex::new(catalog, declared.mappings()),
            None => ToolIndex::new(&Catalog::from_mappings(declared.mappings()), declared.mappings()),
        };
        // With a catalog, "realized" is what the catalog covers; since a
        // mapping missing from it is an error, it equals the mapping flag.
        let covered: Option<std::collections::HashSet<String>> =
            catalog.map(|_| tools.all().iter().map(|tool| tool.capability.clone()).collect());
        declared.into_policy(version.clone(), tools, covered.as_ref())
    });

    Compilation {
        version,
        document: Some(document),
        policy,
        diagnostics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &[u8] = include_bytes!("../../../examples/policy.yaml");

    #[test]
    fn the_example_compiles_without_findings() {
        let result = compile(EXAMPLE, None);
        assert_eq!(result.diagnostics, []);
        let policy = result.policy.expect("compiles");
        assert_eq!(policy.ruleset.grants().len(), 12);
        assert_eq!(policy.version, result.version);
        assert!(result.version.starts_with("sha256:") && result.version.len() == 71);
    }

    #[test]
    fn yaml_errors_stop_before_the_schema() {
        let result = compile(b"version: 1\ncapabilities: [\n", None);
        assert!(result.document.is_none());
        assert!(result
            .diagnostics
            .iter()
            .all(|d| d.code == Code::YamlSyntax && d.path.is_empty()));
        assert!(result.diagnostics[0].position.is_some_and(|p| p.line > 0));
    }

    #[test]
    fn schema_errors_stop_before_the_semantic_checks() {
        let result = compile(
            b"version: 1\ncapabilities: [{ id: a }, { id: a }]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\nextra: 1\n",
            None,
        );
        let codes: Vec<_> = result.diagnostics.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::SchemaViolation]);
        assert_eq!(result.diagnostics[0].path, "");
        assert!(result.policy.is_none());
    }

    #[test]
    fn warnings_do_not_block() {
        let result = compile(
            b"version: 1\ncapabilities: [{ id: a }]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n",
            None,
        );
        assert_eq!(result.diagnostics.len(), 1);
        assert!(result.policy.is_some());
    }
}
