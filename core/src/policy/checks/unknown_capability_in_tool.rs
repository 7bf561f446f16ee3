//! `unknown_capability_in_tool` (error): a tool mapping names a capability
//! that is not declared.

use super::Findings;
use crate::capabilities::ToolMapping;
use crate::policy::model::Declared;
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, tool: &ToolMapping) {
    if !declared.declares_capability(&tool.capability) {
        findings.error(
            Code::UnknownCapabilityInTool,
            format!("{}/capability", tool.path),
            format!(
                "the tool `{}` is mapped to the capability `{}`, which is not declared{}",
                tool.name,
                tool.capability,
                did_you_mean(
                    &tool.capability,
                    declared.capabilities.iter().map(|c| c.id.as_str())
                )
            ),
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn points_at_the_mapping_capability() {
        let artifact = "version: 1\ncapabilities: []\nupstreams:\n  - id: u\n    transport: { kind: mcp-http, url: \"https://x\" }\n    tools:\n      - { name: t, capability: nope }\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
        check(
            artifact,
            &[("unknown_capability_in_tool", "/upstreams/0/tools/0/capability")],
        );
    }
}
