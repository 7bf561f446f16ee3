//! The semantic checks (docs/reference.md#diagnostics): one file per diagnostic code, each
//! holding its check, its doc and its tests. This module fixes the emission
//! order, which is part of the contract.

mod account_not_for_upstream;
mod ambiguous_grant;
mod argument_not_in_schema;
mod attribute_not_declared;
mod capability_not_realized;
mod catalog_tool_unmapped;
mod claim_mapping_expected;
mod condition_type_mismatch;
mod condition_unsatisfiable;
mod conditions_need_version_2;
mod dn_mapping_expected;
mod duplicate_id;
mod duplicate_tool;
mod tool_not_in_catalog;
mod unknown_account_in_grant;
mod unknown_capability_in_grant;
mod unknown_capability_in_tool;
mod unknown_issuer_in_grant;
mod unknown_time_zone;
mod unused_account;

use super::document::Document;
use super::model::Declared;
use super::{Code, Diagnostic, Related, Severity};
use crate::capabilities::Catalog;

/// Collects diagnostics, resolving every pointer to a position.
pub(crate) struct Findings<'d> {
    document: &'d Document,
    pub diagnostics: Vec<Diagnostic>,
}

impl<'d> Findings<'d> {
    pub fn new(document: &'d Document) -> Self {
        Findings {
            document,
            diagnostics: Vec::new(),
        }
    }

    fn add(
        &mut self,
        severity: Severity,
        code: Code,
        path: String,
        message: String,
        related: &[(&str, &str)],
    ) {
        self.diagnostics.push(Diagnostic {
            severity,
            code,
            position: self.document.resolve(&path),
            message,
            path,
            related: related
                .iter()
                .map(|(path, note)| Related {
                    path: (*path).to_owned(),
                    position: self.document.resolve(path),
                    note: (*note).to_owned(),
                })
                .collect(),
        });
    }

    pub fn error(&mut self, code: Code, path: String, message: String, related: &[(&str, &str)]) {
        self.add(Severity::Error, code, path, message, related);
    }

    pub fn warning(&mut self, code: Code, path: String, message: String) {
        self.add(Severity::Warning, code, path, message, &[]);
    }
}

/// Runs every semantic check in the spec's emission order.
pub(crate) fn run(declared: &Declared, catalog: Option<&Catalog>, findings: &mut Findings<'_>) {
    // 1. Repeated capability ids.
    duplicate_id::check(
        findings,
        "capability",
        declared.capabilities.iter().map(|c| (&c.id, &c.path)),
    );
    // 2, 2b. Per tool: an undeclared capability, then a repeated name.
    for upstream in &declared.upstreams {
        for (index, tool) in upstream.tools.iter().enumerate() {
            unknown_capability_in_tool::check(findings, declared, tool);
            duplicate_tool::check(findings, &upstream.tools[..index], tool);
        }
    }
    // 3, 4. Repeated upstream and account ids.
    duplicate_id::check(
        findings,
        "upstream",
        declared.upstreams.iter().map(|u| (&u.id, &u.path)),
    );
    duplicate_id::check(
        findings,
        "account",
        declared.accounts.iter().map(|a| (&a.id, &a.path)),
    );
    // 5, 5b. Attribute mappings of oidc and mtls issuers, in one loop.
    for issuer in &declared.issuers {
        for (name, source) in &issuer.attributes {
            claim_mapping_expected::check(findings, issuer, name, source);
            dn_mapping_expected::check(findings, issuer, name, source);
        }
    }
    // 6. Repeated issuer ids.
    duplicate_id::check(
        findings,
        "issuer",
        declared.issuers.iter().map(|i| (&i.id, &i.path)),
    );
    // 7–10. Per grant: issuer, each selector key, each capability, the account.
    for grant in &declared.grants {
        match declared
            .issuers
            .iter()
            .rev()
            .find(|issuer| issuer.id == grant.issuer)
        {
            None => unknown_issuer_in_grant::check(findings, declared, grant),
            Some(issuer) => attribute_not_declared::check(findings, issuer, grant),
        }
        unknown_capability_in_grant::check(findings, declared, grant);
        unknown_account_in_grant::check(findings, declared, grant);
        // 10b (ours, 0034). Its conditions: the version, each zone, each argument against
        // the tools' schemas and the other conditions, then whether any call meets them.
        if grant.conditions.is_empty() && grant.unreadable.is_empty() {
            continue;
        }
        conditions_need_version_2::check(findings, declared.version, grant);
        unknown_time_zone::check(findings, grant);
        let schemas = argument_not_in_schema::schemas(declared, catalog, grant);
        let absent = argument_not_in_schema::check(findings, &schemas, grant);
        let integers = condition_type_mismatch::check(findings, &schemas, grant);
        if let (false, Some(integers), true) = (absent, integers, grant.unreadable.is_empty()) {
            condition_unsatisfiable::check(findings, grant, &integers);
        }
    }
    // 11. Grants that could give one principal two accounts.
    ambiguous_grant::check(findings, &declared.grants);
    // 11b. Accounts used for upstreams their `upstreams:` do not name (ours).
    account_not_for_upstream::check(findings, declared);
    // 12, 13. Warnings that do not block compilation.
    capability_not_realized::check(findings, declared);
    unused_account::check(findings, declared);
    // 14, 15. Against the declared catalog.
    if let Some(catalog) = catalog {
        tool_not_in_catalog::check(findings, declared, catalog);
        catalog_tool_unmapped::check(findings, declared, catalog);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! `check(artifact, expected)`: compile and compare (code, path) pairs.

    use crate::capabilities::{Catalog, CatalogTool};
    use crate::policy::compile;

    /// The codes and paths an artifact compiles to, in emission order.
    pub fn findings(artifact: &str) -> Vec<(String, String)> {
        findings_with_catalog(artifact, None)
    }

    pub fn findings_with_catalog(artifact: &str, catalog: Option<&[(&str, &str)]>) -> Vec<(String, String)> {
        let catalog = catalog.map(|entries| {
            Catalog::new(entries.iter().map(|(upstream, name)| CatalogTool {
                upstream: (*upstream).to_owned(),
                name: (*name).to_owned(),
                description: None,
                input_schema: None,
            }))
        });
        compile(artifact.as_bytes(), catalog.as_ref())
            .diagnostics
            .into_iter()
            .map(|d| (d.code.as_str().to_owned(), d.path))
            .collect()
    }

    /// Asserts the exact diagnostics (code, path) of an artifact.
    pub fn check(artifact: &str, expected: &[(&str, &str)]) {
        let found = findings(artifact);
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(c, p)| ((*c).to_owned(), (*p).to_owned()))
            .collect();
        assert_eq!(found, expected, "artifact:\n{artifact}");
    }

    /// A small coherent artifact; `grants` and extra sections are appended.
    pub fn artifact(rest: &str) -> String {
        format!(
            "version: 1
capabilities:
  - id: crm.contact.read
upstreams:
  - id: crm
    transport: {{ kind: mcp-stdio, command: crm-server }}
    tools:
      - name: get_contact
        capability: crm.contact.read
accounts:
  - id: crm-ro
    secret: {{ ref: \"env://CRM_RO\" }}
principals:
  issuers:
    - id: ci
      kind: static-key
      attributes:
        role: automation
{rest}"
        )
    }
}
