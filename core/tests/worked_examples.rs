//! The worked examples of docs/reference.md#worked-examples, row by row, against
//! `examples/policy.yaml` + `examples/catalog.yaml`, and the "edits that would
//! trigger each compile diagnostic" listed at the bottom of the example.
//!
//! Each row is one `check(principal, capability, usage, expected)` line written
//! in the spec's own notation, so the table and this file can be compared by
//! eye: `staff{dept:support}`, `U(600)`, `NC`, `unknown`, `any`.

use capgate_core::access::{evaluate, evaluate_linear, visible, Decision, Instant, Usage};
use capgate_core::capabilities::Catalog;
use capgate_core::policy::{compile, load_catalog, CompiledPolicy, Severity};
use capgate_core::principals::{resolve_asserted, Principal};

const POLICY: &str = include_str!("../../examples/policy.yaml");
const CATALOG: &[u8] = include_bytes!("../../examples/catalog.yaml");

/// Any instant will do: `U(n)` opens its window at `at`.
const AT: Instant = 1_700_000_000_000;

fn catalog() -> Catalog {
    load_catalog(CATALOG).expect("the example catalog loads")
}

fn policy() -> CompiledPolicy {
    let result = compile(POLICY.as_bytes(), Some(&catalog()));
    result.policy.expect("the example compiles with its catalog")
}

/// `issuer{name:value, name:value}` — the table's principal notation. The
/// principal is resolved like an asserted one (undeclared names dropped), with
/// no static-key defaults: the table lists every attribute it means.
fn principal(policy: &CompiledPolicy, notation: &str) -> Principal {
    let (issuer, rest) = notation.split_once('{').expect("issuer{…}");
    let body = rest.strip_suffix('}').expect("closing brace");
    let pairs: Vec<(&str, &str)> = body
        .split(", ")
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once(':').expect("name:value"))
        .collect();
    let resolution =
        resolve_asserted(policy.issuer(issuer), "someone", &pairs, false).expect("declared issuer");
    assert!(
        resolution.discarded.is_empty(),
        "{notation}: every attribute is declared"
    );
    resolution.principal
}

/// `U(n)`, `NC`, `unknown`; `any` is every one of them (see `check`).
fn usages(notation: &str) -> Vec<Usage> {
    let counted = |calls| Usage::Counted {
        calls,
        window_start: AT,
    };
    match notation {
        "NC" => vec![Usage::NotConsulted],
        "unknown" => vec![Usage::Unknown],
        "any" => vec![
            Usage::NotConsulted,
            Usage::Unknown,
            counted(0),
            counted(1_000_000),
        ],
        other => {
            let calls = other
                .strip_prefix("U(")
                .and_then(|n| n.strip_suffix(')'))
                .and_then(|n| n.parse().ok())
                .expect("U(n)");
            vec![counted(calls)]
        }
    }
}

/// One line per decision: `allow granted /grants/0 tickets.issue.read helpdesk-reader 600/1h=3600000ms`
/// or `deny limit_exhausted /grants/0 tickets.issue.read`.
fn render(decision: &Decision<'_>) -> String {
    let reason = decision.reason();
    let mut line = format!(
        "{} {} {} {}",
        decision.outcome(),
        reason.code.as_str(),
        reason.path,
        reason.subject
    );
    if let Decision::Allow(allow) = decision {
        assert!(
            !allow.account.disabled,
            "an allow never runs as a disabled account"
        );
        line.push(' ');
        line.push_str(&allow.account.id);
        match allow.limits {
            Some(limits) => line.push_str(&format!(
                " {}/{}={}ms",
                limits.calls, limits.per, limits.window_ms
            )),
            None => line.push_str(" none"),
        }
    }
    line
}

#[track_caller]
fn check(who: &str, capability: &str, usage: &str, expected: &str) {
    let policy = policy();
    let principal = principal(&policy, who);
    for usage in usages(usage) {
        let indexed = evaluate(&policy.ruleset, &principal, capability, AT, usage);
        let linear = evaluate_linear(&policy.ruleset, &principal, capability, AT, usage);
        assert_eq!(
            indexed, linear,
            "{who} {capability} {usage:?}: the index and the scan disagree"
        );
        assert_eq!(render(&indexed), expected, "{who} {capability} {usage:?}");
    }
}

// ── §4.11, one row each, in the table's order ───────────────────────────────

/// One line per row, so that the table and this module read alike.
#[rustfmt::skip]
mod table {
    use super::check;

    #[test]
    fn support_reads_tickets_under_its_ceiling() { check("staff{dept:support}", "tickets.issue.read", "U(0)", "allow granted /grants/0 tickets.issue.read helpdesk-reader 600/1h=3600000ms"); }

    #[test]
    fn support_exhausts_its_ticket_ceiling() { check("staff{dept:support}", "tickets.issue.read", "U(600)", "deny limit_exhausted /grants/0 tickets.issue.read"); }

    #[test]
    fn support_may_not_write_tickets() { check("staff{dept:support}", "tickets.issue.write", "U(0)", "deny no_grant_matches /grants tickets.issue.write"); }

    #[test]
    fn senior_support_writes_tickets_with_one_call_left() { check("staff{dept:support, level:senior}", "tickets.issue.write", "U(99)", "allow granted /grants/1 tickets.issue.write helpdesk-agent 100/1h=3600000ms"); }

    #[test]
    fn unknown_usage_does_not_matter_without_a_ceiling() { check("staff{}", "docs.page.search", "unknown", "allow granted /grants/2 docs.page.search docs-reader none"); }

    #[test]
    fn any_ceiling_beats_no_ceiling() { check("staff{dept:support, level:senior}", "docs.page.search", "U(0)", "allow granted /grants/3 docs.page.search docs-reader 2400/1d=86400000ms"); }

    #[test]
    fn equal_rate_goes_to_the_shorter_window() { check("staff{dept:support, level:intern}", "docs.page.search", "U(0)", "allow granted /grants/4 docs.page.search docs-reader 100/1h=3600000ms"); }

    #[test]
    fn a_suspended_grant_is_listed() { check("staff{dept:finance}", "billing.refund.create", "NC", "allow granted /grants/10 billing.refund.create payments-bot 0/1d=86400000ms"); }

    #[test]
    fn a_suspended_grant_denies_every_counted_call() { check("staff{dept:finance}", "billing.refund.create", "U(0)", "deny limit_exhausted /grants/10 billing.refund.create"); }

    #[test]
    fn a_disabled_account_denies_with_the_account_as_subject() { check("nightly{role:batch, env:prod}", "deploy.release.approve", "U(0)", "deny account_disabled /grants/11 release-robot"); }

    #[test]
    fn an_unanswered_counter_is_an_exhausted_ceiling() { check("mesh{org:Acme Corp, unit:payments}", "billing.refund.create", "unknown", "deny usage_unknown /grants/7 payments-bot"); }

    #[test]
    fn the_last_call_under_a_per_minute_ceiling() { check("mesh{org:Acme Corp, unit:sre}", "metrics.dashboard-view", "U(29)", "allow granted /grants/8 metrics.dashboard-view metrics-viewer 30/1m=60000ms"); }

    #[test]
    fn an_undeclared_capability_whatever_the_usage() { check("staff{dept:support}", "crm.contact.read", "any", "deny capability_not_declared /capabilities crm.contact.read"); }

    #[test]
    fn a_missing_attribute_never_matches() { check("mesh{unit:payments}", "billing.refund.create", "U(0)", "deny no_grant_matches /grants billing.refund.create"); }
}

// ── The listing ─────────────────────────────────────────────────────────────

/// Exposed names a principal sees, in catalog order (§4.10).
fn listing(policy: &CompiledPolicy, principal: &Principal) -> Vec<String> {
    let allowed: Vec<&str> = visible(&policy.ruleset, principal, AT)
        .iter()
        .map(|visible| visible.capability.id.as_str())
        .collect();
    policy
        .tools
        .realizing(|capability| allowed.contains(&capability))
        .map(|tool| tool.exposed_name.clone())
        .collect()
}

#[test]
fn listing_for_senior_support() {
    let policy = policy();
    let senior = principal(&policy, "staff{dept:support, level:senior}");
    let names = listing(&policy, &senior);
    assert_eq!(
        names,
        [
            "helpdesk__comment_ticket",
            "helpdesk__get_ticket",
            "helpdesk__list_tickets",
            "helpdesk-legacy__fetch_case",
            "knowledge__search_pages",
            "knowledge__semantic_search",
        ]
    );
}

#[test]
fn an_unmapped_catalog_tool_is_never_listed() {
    let policy = policy();
    for who in [
        "staff{dept:support, level:senior}",
        "staff{dept:finance}",
        "nightly{role:batch, env:prod}",
        "mesh{org:Acme Corp, unit:payments}",
        "mesh{org:Acme Corp, unit:sre}",
    ] {
        let names = listing(&policy, &principal(&policy, who));
        assert!(
            !names
                .iter()
                .any(|n| n == "helpdesk__delete_ticket" || n == "payments__void_payment"),
            "{who}: {names:?}"
        );
    }
    // The suspended grant still lists its tool, and the disabled account hides its own.
    let finance = listing(&policy, &principal(&policy, "staff{dept:finance}"));
    assert!(
        finance.contains(&"payments__issue_refund".to_owned()),
        "{finance:?}"
    );
    let nightly = listing(&policy, &principal(&policy, "nightly{role:batch, env:prod}"));
    assert!(
        !nightly.contains(&"releases__approve_release".to_owned()),
        "{nightly:?}"
    );
    assert!(
        nightly.contains(&"helpdesk__get_ticket".to_owned()),
        "{nightly:?}"
    );
}

// ── Compiling the example, and the edits listed at its bottom ───────────────

/// (severity, code, path, related paths) of a compilation, in emission order.
fn diagnostics(text: &str, catalog: Option<&Catalog>) -> Vec<String> {
    compile(text.as_bytes(), catalog)
        .diagnostics
        .iter()
        .map(|d| {
            let severity = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let mut line = format!("{severity} {} {}", d.code.as_str(), d.path);
            assert!(
                d.position.is_some() || d.path == "/upstreams",
                "{line}: the example resolves every pointer"
            );
            for related in &d.related {
                line.push_str(&format!(" (related {})", related.path));
            }
            line
        })
        .collect()
}

#[test]
fn the_example_compiles_cleanly_and_with_its_catalog_warns_twice() {
    assert_eq!(diagnostics(POLICY, None), Vec::<String>::new());
    assert_eq!(
        diagnostics(POLICY, Some(&catalog())),
        [
            // At the upstream each unmapped tool belongs to: helpdesk, payments.
            "warning catalog_tool_unmapped /upstreams/0",
            "warning catalog_tool_unmapped /upstreams/3"
        ]
    );
    let result = compile(POLICY.as_bytes(), Some(&catalog()));
    let messages: Vec<&str> = result.diagnostics.iter().map(|d| d.message.as_str()).collect();
    assert!(
        messages[0].contains("delete_ticket") && messages[1].contains("void_payment"),
        "{messages:?}"
    );
}

/// The example with one textual edit: `from` must occur exactly once.
fn edited(from: &str, to: &str) -> String {
    assert_eq!(
        POLICY.matches(from).count(),
        1,
        "the edit anchor `{from}` is not unique"
    );
    POLICY.replacen(from, to, 1)
}

/// The example with a grant appended at the end of `grants`.
fn with_grant(grant: &str) -> String {
    format!("{POLICY}\n{grant}")
}

#[test]
fn edit_duplicate_the_docs_reader_account() {
    let text = edited(
        "  - id: payments-bot ",
        "  - id: docs-reader\n    secret: { ref: \"env://DOCS_READER_TOKEN_2\" }\n  - id: payments-bot ",
    );
    // The duplicate is inserted at index 3; the later occurrence is reported.
    assert_eq!(
        diagnostics(&text, None),
        ["error duplicate_id /accounts/3 (related /accounts/2)"]
    );
    let appended = edited(
        "# ── Principals",
        "  - id: docs-reader\n    secret: { ref: \"env://DOCS_READER_TOKEN_2\" }\n\n# ── Principals",
    );
    assert_eq!(
        diagnostics(&appended, None),
        ["error duplicate_id /accounts/6 (related /accounts/2)"]
    );
}

#[test]
fn edit_map_a_tool_to_an_undeclared_capability() {
    let text = edited(
        "      # delete_ticket exists upstream",
        "      - name: close_ticket\n        capability: tickets.issue.close\n      # delete_ticket exists upstream",
    );
    assert_eq!(
        diagnostics(&text, None),
        ["error unknown_capability_in_tool /upstreams/0/tools/3/capability"]
    );
}

#[test]
fn edit_a_literal_attribute_on_the_oidc_issuer() {
    let text = edited(
        "        level: claim:job_level\n",
        "        level: claim:job_level\n        team: engineering\n",
    );
    assert_eq!(
        diagnostics(&text, None),
        ["error claim_mapping_expected /principals/issuers/0/attributes/team"]
    );
}

#[test]
fn edit_grant_to_an_undeclared_issuer() {
    let text = with_grant(
        "  - to: { issuer: partners }\n    capabilities: [docs.page.search]\n    using: docs-reader\n",
    );
    assert_eq!(
        diagnostics(&text, None),
        ["error unknown_issuer_in_grant /grants/12/to/issuer (related /principals/issuers)"]
    );
}

#[test]
fn edit_select_on_an_undeclared_attribute() {
    let text = with_grant("  - to: { issuer: staff, attributes: { region: eu } }\n    capabilities: [docs.page.search]\n    using: docs-reader\n");
    assert_eq!(
        diagnostics(&text, None),
        ["error attribute_not_declared /grants/12/to/attributes/region (related /principals/issuers/0/attributes)"]
    );
}

#[test]
fn edit_run_as_an_undeclared_account() {
    let text = with_grant("  - to: { issuer: staff, attributes: { dept: sre } }\n    capabilities: [metrics.dashboard-view]\n    using: docs-writer\n");
    // Selecting exactly the principals of /grants/9 with another account is also
    // ambiguous: the rule is syntactic and never asks whether the account exists.
    assert_eq!(
        diagnostics(&text, None),
        [
            "error unknown_account_in_grant /grants/12/using (related /accounts)",
            "error ambiguous_grant /grants/9 (related /grants/12)",
        ]
    );
    let alone = with_grant(
        "  - to: { issuer: nightly }\n    capabilities: [metrics.dashboard-view]\n    using: docs-writer\n",
    );
    assert_eq!(
        diagnostics(&alone, None),
        ["error unknown_account_in_grant /grants/12/using (related /accounts)"]
    );
}

#[test]
fn edit_grant_3_runs_as_the_helpdesk_reader() {
    let text = edited(
        "    capabilities: [docs.page.search]\n    using: docs-reader\n    limits: { calls: 2400, per: 1d }",
        "    capabilities: [docs.page.search]\n    using: helpdesk-reader\n    limits: { calls: 2400, per: 1d }",
    );
    assert_eq!(
        diagnostics(&text, None),
        [
            "error ambiguous_grant /grants/2 (related /grants/3)",
            "error ambiguous_grant /grants/3 (related /grants/4)",
        ]
    );
}

#[test]
fn edit_declare_a_capability_no_tool_realizes() {
    let text = edited(
        "  - id: deploy.release.approve ",
        "  - id: deploy.release.approve\n  - id: tickets.issue.archive ",
    );
    assert_eq!(
        diagnostics(&text, None),
        ["warning capability_not_realized /capabilities/6"]
    );
    assert!(
        compile(text.as_bytes(), None).policy.is_some(),
        "warnings never block"
    );
}

#[test]
fn edit_declare_an_account_no_grant_uses() {
    let text = edited(
        "# ── Principals",
        "  - id: spare\n    secret: { ref: \"env://SPARE\" }\n\n# ── Principals",
    );
    assert_eq!(diagnostics(&text, None), ["warning unused_account /accounts/6"]);
}

#[test]
fn edit_rename_a_mapped_tool_the_catalog_still_lists() {
    let text = edited("      - name: get_ticket\n", "      - name: fetch_ticket\n");
    assert_eq!(
        diagnostics(&text, Some(&catalog())),
        [
            "error tool_not_in_catalog /upstreams/0/tools/0/name",
            "warning catalog_tool_unmapped /upstreams/0",
            "warning catalog_tool_unmapped /upstreams/0",
            "warning catalog_tool_unmapped /upstreams/3",
        ]
    );
    // Without the catalog the rename is invisible to the compiler.
    assert_eq!(diagnostics(&text, None), Vec::<String>::new());
}
