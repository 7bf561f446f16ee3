//! `duplicate_tool` (error, ours): a tool name repeated within one upstream.
//! Upstream lets the two mappings collide silently; two capabilities would
//! then share one exposed name.

use super::Findings;
use crate::capabilities::ToolMapping;
use crate::policy::Code;

/// `earlier` are the same upstream's tools before `tool`.
pub(super) fn check(findings: &mut Findings<'_>, earlier: &[ToolMapping], tool: &ToolMapping) {
    if let Some(first) = earlier.iter().find(|other| other.name == tool.name) {
        findings.error(
            Code::DuplicateTool,
            format!("{}/name", tool.path),
            format!(
                "the tool `{}` is mapped twice in the upstream `{}`",
                tool.name, tool.upstream
            ),
            &[(&format!("{}/name", first.path), "first declaration")],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn same_name_in_one_upstream_but_not_across_upstreams() {
        let artifact = "version: 1\ncapabilities: [{ id: a }, { id: b }]\nupstreams:\n  - id: u\n    transport: { kind: mcp-http, url: \"https://x\" }\n    tools:\n      - { name: t, capability: a }\n      - { name: t, capability: nope }\n  - id: v\n    transport: { kind: mcp-http, url: \"https://y\" }\n    tools:\n      - { name: t, capability: b }\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
        check(
            artifact,
            &[
                ("unknown_capability_in_tool", "/upstreams/0/tools/1/capability"),
                ("duplicate_tool", "/upstreams/0/tools/1/name"),
            ],
        );
    }
}
