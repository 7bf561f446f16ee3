//! The reverse question (cli.md `who-can`): which grants reach a capability,
//! whatever their account state or ceiling. "Who can issue refunds?"

use super::{Grant, Ruleset};

/// Every grant naming a capability, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach<'a> {
    pub declared: bool,
    pub realized: bool,
    /// (grant index, grant).
    pub grants: Vec<(usize, &'a Grant)>,
}

pub fn who_can<'a>(ruleset: &'a Ruleset, capability: &str) -> Reach<'a> {
    let declared = ruleset.capability(capability);
    Reach {
        declared: declared.is_some(),
        realized: declared.is_some_and(|(_, rule)| rule.realized),
        grants: ruleset
            .grants()
            .iter()
            .enumerate()
            .filter(|(_, grant)| grant.names(capability))
            .collect(),
    }
}
