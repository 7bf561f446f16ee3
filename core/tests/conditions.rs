//! Conditions (docs/reference.md#conditions, docs/decisions/0034):
//!
//! * the worked example, examples/refunds.yaml, decided at fixed instants;
//! * step 6 as the reference states it — among the grants that match, those whose
//!   conditions all hold apply; the most restrictive ceiling among them wins; when none
//!   applies, the first condition (in file order of grants) whose argument is missing,
//!   else the first failing condition — written here as a plain scan, against `evaluate_call`
//!   on generated policies and arguments;
//! * listing ≡ decision, restated for conditions: a capability is listed for a principal iff
//!   some arguments and some instant exist under which a call of it is allowed (ceilings not
//!   consulted). The compiler refuses a grant no call can satisfy, so for a compiled policy
//!   the witness of any matching grant's conditions is such a call.

use std::collections::BTreeMap;

use capgate_core::access::{
    evaluate_call, first_failing, visible, witness, Decision, Grant, Instant, Outcome, ReasonCode, Ruleset,
    Usage,
};
use capgate_core::policy::{compile, load_catalog, CompiledPolicy, Severity};
use capgate_core::principals::Principal;
use proptest::prelude::*;
use serde_json::{Map, Value};

fn refunds() -> CompiledPolicy {
    let catalog = load_catalog(include_bytes!("../../examples/refunds.catalog.yaml"))
        .expect("the example catalog loads");
    let artifact = include_bytes!("../../examples/refunds.yaml");
    let compiled = compile(artifact, Some(&catalog));
    assert!(compiled.diagnostics.is_empty(), "{:?}", compiled.diagnostics);
    compiled.policy.expect("it compiles")
}

fn staff(dept: &str) -> Principal {
    Principal::new(
        "staff",
        &format!("{dept}-1"),
        BTreeMap::from([("dept".to_owned(), dept.to_owned())]),
    )
}

fn args(json: &str) -> Map<String, Value> {
    serde_json::from_str(json).expect("an object")
}

/// 2026-07-06 (a Monday) 08:30 UTC, 10:30 in Madrid; the same day 17:00 UTC, 19:00 in Madrid.
const MONDAY_MORNING: Instant = 1_783_326_600_000;
const MONDAY_EVENING: Instant = MONDAY_MORNING + 8 * 3_600_000 + 30 * 60_000;

#[test]
fn a_call_reads_its_arguments_when_a_matching_grant_has_a_condition_on_one() {
    let policy = refunds();
    let rules = &policy.ruleset;
    // Support's refund grant tests `amount` and `currency`; finance's has no condition.
    assert!(rules
        .prepare(&staff("support"))
        .reads_arguments("billing.refund.create"));
    assert!(!rules
        .prepare(&staff("finance"))
        .reads_arguments("billing.refund.create"));
    // Engineering's release grant tests `environment`; nobody else's grant names it.
    assert!(rules
        .prepare(&staff("engineering"))
        .reads_arguments("deploy.release.approve"));
    assert!(!rules
        .prepare(&staff("support"))
        .reads_arguments("deploy.release.approve"));
    assert!(!rules.prepare(&staff("support")).reads_arguments("not.declared"));
    // A grant with only a time condition reads no argument.
    let timed = String::from_utf8_lossy(include_bytes!("../../examples/refunds.yaml")).replace(
        "      - argument: amount               # /grants/0/when/0\n        at_most: 100\n      - argument: currency             # /grants/0/when/1\n        in: [EUR, USD]\n",
        "",
    );
    assert!(
        !timed.contains("argument: amount"),
        "the example's conditions moved"
    );
    let compiled = compile(timed.as_bytes(), None).policy.expect("it compiles");
    assert!(!compiled
        .ruleset
        .prepare(&staff("support"))
        .reads_arguments("billing.refund.create"));
}

#[test]
fn the_refunds_example_decides_as_the_guide_says() {
    let policy = refunds();
    let rules = &policy.ruleset;
    let decide = |dept: &str, capability: &str, at: Instant, arguments: Option<&Map<String, Value>>| {
        let decision = evaluate_call(
            rules,
            &staff(dept),
            capability,
            at,
            Usage::NotConsulted,
            arguments,
        );
        let reason = decision.reason();
        let account = match &decision {
            Decision::Allow(allow) => allow.account.id.clone(),
            Decision::Deny(_) => String::new(),
        };
        (
            reason.code,
            reason.path.to_owned(),
            reason.subject.to_owned(),
            account,
        )
    };
    let refund = "billing.refund.create";
    let small = args(r#"{"paymentId": "p-1", "amount": 50, "currency": "EUR"}"#);
    let large = args(r#"{"paymentId": "p-1", "amount": 150, "currency": "EUR"}"#);
    let pounds = args(r#"{"paymentId": "p-1", "amount": 50, "currency": "GBP"}"#);
    let no_amount = args(r#"{"paymentId": "p-1", "currency": "EUR"}"#);
    let cases = [
        (
            ("support", MONDAY_MORNING, Some(&small)),
            (
                ReasonCode::Granted,
                "/grants/0",
                "billing.refund.create",
                "support-payments",
            ),
        ),
        (
            ("support", MONDAY_MORNING, Some(&large)),
            (ReasonCode::ConditionFailed, "/grants/0/when/0", "amount", ""),
        ),
        (
            ("support", MONDAY_MORNING, Some(&pounds)),
            (ReasonCode::ConditionFailed, "/grants/0/when/1", "currency", ""),
        ),
        (
            ("support", MONDAY_EVENING, Some(&small)),
            (ReasonCode::ConditionFailed, "/grants/0/when/2", "time", ""),
        ),
        (
            ("support", MONDAY_MORNING, Some(&no_amount)),
            (ReasonCode::ArgumentsMissing, "/grants/0/when/0", "amount", ""),
        ),
        (
            ("support", MONDAY_MORNING, None),
            (ReasonCode::ArgumentsMissing, "/grants/0/when/0", "amount", ""),
        ),
        (
            ("finance", MONDAY_EVENING, Some(&large)),
            (
                ReasonCode::Granted,
                "/grants/1",
                "billing.refund.create",
                "finance-payments",
            ),
        ),
        (
            ("finance", MONDAY_EVENING, None),
            (
                ReasonCode::Granted,
                "/grants/1",
                "billing.refund.create",
                "finance-payments",
            ),
        ),
        (
            ("sales", MONDAY_MORNING, Some(&small)),
            (ReasonCode::NoGrantMatches, "/grants", "billing.refund.create", ""),
        ),
    ];
    for ((dept, at, arguments), (code, path, subject, account)) in cases {
        assert_eq!(
            decide(dept, refund, at, arguments),
            (code, path.to_owned(), subject.to_owned(), account.to_owned()),
            "{dept} at {at} with {arguments:?}"
        );
    }
    let approve = "deploy.release.approve";
    let staging = args(r#"{"release": "r1", "environment": "staging"}"#);
    let production = args(r#"{"release": "r1", "environment": "production"}"#);
    assert_eq!(
        decide("engineering", approve, 0, Some(&staging)).0,
        ReasonCode::Granted
    );
    assert_eq!(
        decide("engineering", approve, 0, Some(&production)),
        (
            ReasonCode::ConditionFailed,
            "/grants/2/when/0".to_owned(),
            "environment".to_owned(),
            String::new()
        )
    );

    // The listing does not evaluate conditions: support sees refunds, marked conditional;
    // finance sees them unmarked.
    let listed = |dept: &str| -> Vec<(String, bool)> {
        visible(rules, &staff(dept), MONDAY_EVENING)
            .iter()
            .map(|v| (v.capability.id.clone(), v.conditional))
            .collect()
    };
    assert_eq!(listed("support"), [(refund.to_owned(), true)]);
    assert_eq!(listed("finance"), [(refund.to_owned(), false)]);
}

// ── Generated policies ──────────────────────────────────────────────────────

/// The conditions a generated grant draws from: over `amount` (a number), `region` (a
/// string), `urgent` (a boolean) and the time; some pairs contradict each other.
const POOL: [&str; 12] = [
    "{ argument: amount, at_most: 100 }",
    "{ argument: amount, at_least: 50 }",
    "{ argument: amount, below: 10 }",
    "{ argument: amount, above: 500 }",
    "{ argument: region, equals: eu }",
    "{ argument: region, in: [eu, us] }",
    "{ argument: region, starts_with: u }",
    "{ argument: urgent, equals: true }",
    "{ argument: order.id, starts_with: \"ord-\" }",
    "time: { zone: Europe/Madrid, days: [mon, tue, wed, thu, fri], from: \"09:00\", until: \"18:00\" }",
    "time: { zone: America/New_York, days: [sat, sun] }",
    "time: { zone: UTC, from: \"12:00\", until: \"13:00\" }",
];

/// Argument sets a decision is taken with.
fn argument_sets() -> Vec<Option<Map<String, Value>>> {
    let mut sets = vec![None];
    for json in [
        "{}",
        r#"{"amount": 5, "region": "eu", "urgent": true, "order": {"id": "ord-1"}}"#,
        r#"{"amount": 75, "region": "us"}"#,
        r#"{"amount": 1000, "region": "uk", "urgent": false, "order": {"id": "x"}}"#,
        r#"{"amount": "75", "region": 3, "urgent": "yes"}"#,
        r#"{"region": "eu"}"#,
    ] {
        sets.push(Some(args(json)));
    }
    sets
}

/// Instants: a Monday morning and evening in Madrid, a Saturday, a Monday 12:30 UTC.
const INSTANTS: [Instant; 4] = [
    MONDAY_MORNING,
    MONDAY_EVENING,
    MONDAY_MORNING + 5 * 86_400_000,
    MONDAY_MORNING + 4 * 3_600_000,
];

/// A drawn grant: team selector (or none), capabilities (indices), account, ceiling (index),
/// conditions (indices into `POOL`).
type DrawnGrant = (Option<usize>, Vec<usize>, usize, Option<usize>, Vec<usize>);

#[derive(Debug, Clone)]
struct Drawn {
    grants: Vec<DrawnGrant>,
}

const TEAMS: [&str; 2] = ["support", "finance"];
const CEILINGS: [&str; 3] = [
    "{ calls: 10, per: 1h }",
    "{ calls: 5, per: 1m }",
    "{ calls: 0, per: 1d }",
];

fn artifact(drawn: &Drawn) -> String {
    let mut out = String::from(
        "version: 2\ncapabilities:\n  - id: pay.refund\n  - id: pay.read\n  - id: pay.void\n\
         upstreams:\n  - id: pay\n    transport: { kind: mcp-stdio, command: pay }\n    tools:\n\
         \x20     - { name: refund, capability: pay.refund }\n      - { name: read, capability: pay.read }\n\
         \x20     - { name: void, capability: pay.void }\n\
         accounts:\n  - { id: acct-0, secret: { ref: \"env://A0\" } }\n  - { id: acct-1, secret: { ref: \"env://A1\" } }\n\
         principals:\n  issuers:\n    - { id: corp, kind: static-key, attributes: { team: support } }\n\
         grants:\n",
    );
    let capabilities = ["pay.refund", "pay.read", "pay.void"];
    for (team, named, account, ceiling, conditions) in &drawn.grants {
        out.push_str("  - to: { issuer: corp");
        if let Some(team) = team {
            out.push_str(&format!(", attributes: {{ team: {} }}", TEAMS[*team]));
        }
        out.push_str(" }\n");
        let named: Vec<&str> = named.iter().map(|&c| capabilities[c]).collect();
        out.push_str(&format!(
            "    capabilities: [{}]\n    using: acct-{account}\n",
            named.join(", ")
        ));
        if let Some(ceiling) = ceiling {
            out.push_str(&format!("    limits: {}\n", CEILINGS[*ceiling]));
        }
        if !conditions.is_empty() {
            out.push_str("    when:\n");
            for &c in conditions {
                out.push_str(&format!("      - {}\n", POOL[c]));
            }
        }
    }
    out
}

fn drawn() -> impl Strategy<Value = Drawn> {
    // One account per policy keeps ambiguous_grant out of the way; the account is drawn per
    // policy, the rest per grant.
    (
        0usize..2,
        prop::collection::vec(
            (
                prop::option::of(0usize..2),
                prop::collection::btree_set(0usize..3, 1..3),
                prop::option::of(0usize..3),
                prop::collection::vec(0usize..POOL.len(), 0..4),
            ),
            1..6,
        ),
    )
        .prop_map(|(account, grants)| Drawn {
            grants: grants
                .into_iter()
                .map(|(team, named, ceiling, conditions)| {
                    (team, named.into_iter().collect(), account, ceiling, conditions)
                })
                .collect(),
        })
}

/// Compiles a drawn policy; `None` when the compiler refused it (an unsatisfiable grant).
fn compiled(drawn: &Drawn) -> Result<Option<CompiledPolicy>, String> {
    let text = artifact(drawn);
    let compilation = compile(text.as_bytes(), None);
    let errors: Vec<&str> = compilation
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.code.as_str())
        .collect();
    if errors.is_empty() {
        return compilation.policy.map(Some).ok_or_else(|| "no policy".to_owned());
    }
    if errors.iter().all(|code| *code == "condition_unsatisfiable") {
        return Ok(None);
    }
    Err(format!("{errors:?}\n{text}"))
}

/// Step 6 as the reference states it, by a plain scan: the reason code and pointer, and the
/// winning grant's index for an allow.
fn reference(
    grants: &[Grant],
    principal: &Principal,
    capability: &str,
    at: Instant,
    arguments: Option<&Map<String, Value>>,
) -> (ReasonCode, String) {
    let matching: Vec<(usize, &Grant)> = grants
        .iter()
        .enumerate()
        .filter(|(_, g)| g.matches(principal) && g.names(capability))
        .collect();
    if matching.is_empty() {
        return (ReasonCode::NoGrantMatches, "/grants".to_owned());
    }
    let applying: Vec<&(usize, &Grant)> = matching
        .iter()
        .filter(|(_, g)| first_failing(&g.conditions, arguments, at).is_none())
        .collect();
    if applying.is_empty() {
        let failures: Vec<(Outcome, String)> = matching
            .iter()
            .filter_map(|(_, g)| first_failing(&g.conditions, arguments, at))
            .map(|(condition, outcome)| (outcome, condition.path.clone()))
            .collect();
        let missing = failures.iter().find(|(outcome, _)| *outcome == Outcome::Missing);
        return match missing {
            Some((_, path)) => (ReasonCode::ArgumentsMissing, path.clone()),
            None => (ReasonCode::ConditionFailed, failures[0].1.clone()),
        };
    }
    // The most restrictive ceiling (calls per window, no ceiling least), ties to the earliest.
    let rate = |g: &Grant| g.limits.as_ref().map(|l| (l.calls as f64) / (l.window_ms as f64));
    let mut winner = applying[0];
    for candidate in &applying[1..] {
        let more = match (rate(candidate.1), rate(winner.1)) {
            (Some(a), Some(b)) => a < b,
            (Some(_), None) => true,
            _ => false,
        };
        if more {
            winner = candidate;
        }
    }
    (ReasonCode::Granted, winner.1.path.clone())
}

fn principals() -> Vec<Principal> {
    vec![
        Principal::new(
            "corp",
            "a",
            BTreeMap::from([("team".to_owned(), "support".to_owned())]),
        ),
        Principal::new("corp", "b", BTreeMap::new()),
        Principal::new(
            "corp",
            "c",
            BTreeMap::from([("team".to_owned(), "finance".to_owned())]),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn step_6_decides_as_the_reference_states_it(drawn in drawn()) {
        let Some(policy) = compiled(&drawn).map_err(TestCaseError::fail)? else {
            return Ok(());
        };
        let rules = &policy.ruleset;
        for principal in principals() {
            for capability in ["pay.refund", "pay.read", "pay.void"] {
                for at in INSTANTS {
                    for arguments in argument_sets() {
                        let decision = evaluate_call(rules, &principal, capability, at, Usage::NotConsulted, arguments.as_ref());
                        let found = (decision.reason().code, decision.reason().path.to_owned());
                        let expected = reference(rules.grants(), &principal, capability, at, arguments.as_ref());
                        prop_assert_eq!(&found, &expected, "{:?} {} at {} with {:?}\n{}", principal, capability, at, arguments, artifact(&drawn));
                    }
                }
            }
        }
    }

    #[test]
    fn listed_iff_some_call_is_allowed(drawn in drawn()) {
        let Some(policy) = compiled(&drawn).map_err(TestCaseError::fail)? else {
            return Ok(());
        };
        listing_agrees(&policy.ruleset).map_err(|e| TestCaseError::fail(format!("{e}\n{}", artifact(&drawn))))?;
    }
}

/// For every principal and capability: listed iff some call is allowed, trying every call we
/// can think of — the drawn argument sets at the drawn instants, and each matching grant's
/// witness.
fn listing_agrees(rules: &Ruleset) -> Result<(), String> {
    for principal in principals() {
        let listed: Vec<&str> = visible(rules, &principal, 0)
            .iter()
            .map(|v| v.capability.id.as_str())
            .collect();
        for capability in ["pay.refund", "pay.read", "pay.void"] {
            let mut calls: Vec<(Option<Map<String, Value>>, Instant)> = argument_sets()
                .into_iter()
                .flat_map(|arguments| INSTANTS.map(|at| (arguments.clone(), at)))
                .collect();
            for grant in rules
                .grants()
                .iter()
                .filter(|g| g.matches(&principal) && g.names(capability))
            {
                if let Some((arguments, at)) = witness(&grant.conditions, &[]) {
                    calls.push((Some(arguments), at));
                }
            }
            let allowed = calls.iter().any(|(arguments, at)| {
                evaluate_call(
                    rules,
                    &principal,
                    capability,
                    *at,
                    Usage::NotConsulted,
                    arguments.as_ref(),
                )
                .is_allow()
            });
            if listed.contains(&capability) != allowed {
                return Err(format!(
                    "{principal:?} {capability}: listed {listed:?}, some call allowed: {allowed}"
                ));
            }
        }
    }
    Ok(())
}

/// The property above fails when the compiler lets an unsatisfiable grant through: a listing
/// then shows a capability no call can use. The compiler refuses `amount below 10` with
/// `amount above 500`; the same grant put in a ruleset directly breaks the property.
#[test]
fn an_unsatisfiable_grant_would_list_what_no_call_can_use() {
    let contradiction = Drawn {
        grants: vec![(None, vec![0], 0, None, vec![2, 3])],
    };
    assert_eq!(
        compiled(&contradiction).map(|p| p.is_none()),
        Ok(true),
        "the compiler refuses it"
    );
    let text = artifact(&contradiction);
    let refused: Vec<String> = compile(text.as_bytes(), None)
        .diagnostics
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| format!("{} {}", d.code.as_str(), d.path))
        .collect();
    assert_eq!(refused, ["condition_unsatisfiable /grants/0/when"]);

    let satisfiable = Drawn {
        grants: vec![(None, vec![0], 0, None, vec![2])],
    };
    let policy = compiled(&satisfiable).expect("compiles").expect("satisfiable");
    assert_eq!(listing_agrees(&policy.ruleset), Ok(()));
    let mut grants = policy.ruleset.grants().to_vec();
    let above = compiled(&Drawn {
        grants: vec![(None, vec![0], 0, None, vec![3])],
    })
    .expect("compiles")
    .expect("satisfiable")
    .ruleset
    .grants()[0]
        .conditions[0]
        .clone();
    grants[0].conditions.push(above);
    let bypassed = Ruleset::new(policy.ruleset.capabilities().to_vec(), grants);
    assert!(listing_agrees(&bypassed).is_err());
}
