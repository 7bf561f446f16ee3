//! Exposed tool names (docs/reference.md#upstreams-tools-and-exposed-names): always `<upstream>__<tool>`.
//! Upstream ids cannot contain `_`, so the first `__` splits unambiguously
//! even when the tool name itself contains `__`.

/// The name a client sees for a tool.
pub fn exposed_name(upstream: &str, tool: &str) -> String {
    format!("{upstream}__{tool}")
}

/// Splits an exposed name at its first `__` into (upstream, tool).
pub fn split_exposed_name(exposed: &str) -> Option<(&str, &str)> {
    exposed.split_once("__")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_the_first_separator() {
        assert_eq!(
            exposed_name("helpdesk-legacy", "fetch_case"),
            "helpdesk-legacy__fetch_case"
        );
        assert_eq!(split_exposed_name("a__b__c"), Some(("a", "b__c")));
        assert_eq!(split_exposed_name("plain"), None);
    }
}
