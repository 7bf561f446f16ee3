//! `account_not_for_upstream` (error, ours: docs/decisions/0030): an account that says which
//! upstreams its secret is for (`upstreams:`) is used by a grant for a capability that a tool of
//! another upstream realises — the gateway would hand that upstream a credential meant for
//! another. Also an `upstreams:` entry that names no declared upstream. Accounts without
//! `upstreams:` (mcpizer's format) are not checked.

use super::Findings;
use crate::policy::model::Declared;
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared) {
    for account in &declared.accounts {
        let Some(upstreams) = &account.upstreams else {
            continue;
        };
        for (index, upstream) in upstreams.iter().enumerate() {
            if !declared.upstreams.iter().any(|declared| declared.id == *upstream) {
                findings.error(
                    Code::AccountNotForUpstream,
                    format!("{}/upstreams/{index}", account.path),
                    format!(
                        "the account `{}` is for the upstream `{upstream}`, which is not declared{}",
                        account.id,
                        did_you_mean(upstream, declared.upstreams.iter().map(|u| u.id.as_str()))
                    ),
                    &[("/upstreams", "declared upstreams")],
                );
            }
        }
    }
    for grant in &declared.grants {
        let Some(account) = declared.accounts.iter().find(|account| account.id == grant.using) else {
            continue;
        };
        let Some(allowed) = &account.upstreams else {
            continue;
        };
        let allowed_path = format!("{}/upstreams", account.path);
        for capability in &grant.capabilities {
            for tool in declared.mappings().filter(|tool| tool.capability == *capability) {
                if allowed.contains(&tool.upstream) {
                    continue;
                }
                findings.error(
                    Code::AccountNotForUpstream,
                    format!("{}/using", grant.path),
                    format!(
                        "the grant runs `{capability}` as the account `{}`, which is for {}; the tool \
                         `{}` of the upstream `{}` realises it and would get that account's credential",
                        account.id,
                        list(allowed),
                        tool.name,
                        tool.upstream
                    ),
                    &[
                        (tool.path.as_str(), "the tool"),
                        (allowed_path.as_str(), "the account's upstreams"),
                    ],
                );
            }
        }
    }
}

/// "`a` only", "`a` and `b` only", "`a`, `b` and `c` only"; "no upstream" when empty.
fn list(upstreams: &[String]) -> String {
    match upstreams {
        [] => "no upstream".to_owned(),
        [one] => format!("`{one}` only"),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(|id| format!("`{id}`")).collect();
            format!("{} and `{last}` only", init.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    /// The shared artifact with a second upstream whose tool realises the same capability, and
    /// the CRM account bound to `upstreams`.
    fn with_infra(upstreams: &str) -> String {
        artifact(
            "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n",
        )
        .replace(
            "    secret: { ref: \"env://CRM_RO\" }\n",
            &format!("    secret: {{ ref: \"env://CRM_RO\" }}\n    upstreams: {upstreams}\n"),
        )
        .replace(
            "accounts:\n",
            "  - id: infra\n    transport: { kind: mcp-stdio, command: infra-server }\n    tools:\n      - name: read_contact_mirror\n        capability: crm.contact.read\naccounts:\n",
        )
    }

    #[test]
    fn an_account_used_for_another_upstreams_tool() {
        check(
            &with_infra("[crm]"),
            &[("account_not_for_upstream", "/grants/0/using")],
        );
    }

    #[test]
    fn an_account_for_every_upstream_that_realises_it_is_fine() {
        check(&with_infra("[crm, infra]"), &[]);
    }

    #[test]
    fn an_account_without_upstreams_is_not_checked() {
        check(
            &artifact(
                "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n",
            ),
            &[],
        );
    }

    #[test]
    fn an_upstream_nobody_declared() {
        check(
            &with_infra("[crm, infar]"),
            &[
                ("account_not_for_upstream", "/accounts/0/upstreams/1"),
                ("account_not_for_upstream", "/grants/0/using"),
            ],
        );
    }
}
