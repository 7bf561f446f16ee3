//! The properties of docs/reference.md#decisions (1–6), on generated artifacts and
//! generated principals, plus "the index agrees with the scan".
//!
//! Artifacts are generated as a small model (issuers of the three kinds with
//! declared attributes, capabilities, upstream tool mappings, accounts some
//! disabled, grants with random selectors, capabilities, accounts and
//! ceilings) and rendered to YAML text, which is what gets compiled. Grants
//! are repaired so that most artifacts compile (an ambiguous grant takes the
//! account it would clash with, or drops the clashing capability); the
//! unrepaired models feed the order-independence of the compile verdict and
//! rulesets built directly, where ambiguity reaches the evaluator.
//!
//! Every property is a function taking what it checks — an evaluator, a
//! listing, a compiler or a verdict — and returning `Err` with a reason. Each
//! runs with the real implementation over generated cases (must pass) and
//! with a deliberately wrong one on a known input (must fail): a property
//! that cannot fail verifies nothing.

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use capgate_core::access::{
    evaluate, evaluate_linear, visible, Allow, CapabilityRule, Decision, Grant, Instant, Limits, Reason,
    ReasonCode, Ruleset, Usage,
};
use capgate_core::accounts::AccountRef;
use capgate_core::capabilities::{Catalog, CatalogTool};
use capgate_core::policy::syntax::window_ms;
use capgate_core::policy::{compile, Compilation, CompiledPolicy, Diagnostic};
use capgate_core::principals::Principal;
use proptest::prelude::*;
use proptest::sample::Index;

// ── The model and its YAML ──────────────────────────────────────────────────

const CAPABILITY_POOL: [&str; 6] = [
    "crm.contact.read",
    "crm.contact.write",
    "docs.page.search",
    "billing.refund-create",
    "a",
    "m.x-y",
];
const UPSTREAM_POOL: [&str; 3] = ["crm", "docs", "pay-2"];
const TOOL_POOL: [&str; 4] = ["get", "list", "a__b", "put"];
const ACCOUNT_POOL: [&str; 4] = ["acct-a", "acct-b", "acct-c", "acct-d"];
const ISSUER_POOL: [&str; 3] = ["corp", "key", "mesh"];
/// Names with `/` and `~` exercise pointer escaping.
const ATTRIBUTE_POOL: [&str; 5] = ["team", "role", "env", "a/b", "x~y"];
const VALUE_POOL: [&str; 2] = ["a", "b"];
/// Ceilings chosen to tie: 1/1m = 60/1h = 60/60m, 100/1h = 2400/1d = 2400/24h,
/// and two suspensions of different windows.
const LIMIT_POOL: [(u64, &str); 10] = [
    (0, "1h"),
    (0, "1d"),
    (1, "1m"),
    (60, "1h"),
    (60, "60m"),
    (100, "1h"),
    (2400, "1d"),
    (2400, "24h"),
    (1, "1s"),
    (2, "2h"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Oidc,
    StaticKey,
    Mtls,
}

#[derive(Debug, Clone)]
struct IssuerM {
    id: String,
    kind: Kind,
    attributes: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
struct UpstreamM {
    id: String,
    http: bool,
    tools: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GrantM {
    issuer: String,
    selector: Vec<(String, String)>,
    capabilities: Vec<String>,
    using: String,
    limits: Option<(u64, &'static str)>,
}

#[derive(Debug, Clone)]
struct Model {
    capabilities: Vec<String>,
    upstreams: Vec<UpstreamM>,
    /// Whether an empty upstream list is written at all (it is optional).
    write_empty_upstreams: bool,
    accounts: Vec<(String, bool)>,
    issuers: Vec<IssuerM>,
    grants: Vec<GrantM>,
    /// `None`: compile without a catalog. Otherwise the catalog's entries.
    catalog: Option<Vec<(String, String)>>,
}

fn q(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

impl Model {
    fn mappings(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.upstreams.iter().flat_map(|u| {
            u.tools
                .iter()
                .map(move |(name, capability)| (u.id.as_str(), name.as_str(), capability.as_str()))
        })
    }

    fn render(&self) -> String {
        let mut out = String::from("version: 1\ncapabilities:\n");
        for capability in &self.capabilities {
            out.push_str(&format!("  - id: {}\n", q(capability)));
        }
        if !self.upstreams.is_empty() {
            out.push_str("upstreams:\n");
        } else if self.write_empty_upstreams {
            out.push_str("upstreams: []\n");
        }
        for upstream in &self.upstreams {
            out.push_str(&format!("  - id: {}\n", q(&upstream.id)));
            if upstream.http {
                out.push_str("    transport: { kind: mcp-http, url: \"https://up.example/mcp\" }\n");
            } else {
                out.push_str("    transport:\n      kind: mcp-stdio\n      command: server\n      args: [\"--flag\"]\n");
            }
            if upstream.tools.is_empty() {
                out.push_str("    tools: []\n");
            } else {
                out.push_str("    tools:\n");
                for (name, capability) in &upstream.tools {
                    out.push_str(&format!(
                        "      - name: {}\n        capability: {}\n",
                        q(name),
                        q(capability)
                    ));
                }
            }
        }
        out.push_str(if self.accounts.is_empty() {
            "accounts: []\n"
        } else {
            "accounts:\n"
        });
        for (id, disabled) in &self.accounts {
            out.push_str(&format!("  - id: {}\n", q(id)));
            if *disabled {
                out.push_str("    disabled: true\n");
            }
            out.push_str(&format!(
                "    secret: {{ ref: {} }}\n",
                q(&format!("env://{}", id.to_uppercase().replace('-', "_")))
            ));
        }
        out.push_str("principals:\n  issuers:\n");
        for issuer in &self.issuers {
            let kind = match issuer.kind {
                Kind::Oidc => "oidc\n      discovery: https://login.example/.well-known/openid-configuration",
                Kind::StaticKey => "static-key\n      subject: runner\n      secret: { ref: \"env://KEY\" }",
                Kind::Mtls => "mtls",
            };
            out.push_str(&format!("    - id: {}\n      kind: {kind}\n", q(&issuer.id)));
            if !issuer.attributes.is_empty() {
                out.push_str("      attributes:\n");
                for (name, value) in &issuer.attributes {
                    out.push_str(&format!("        {}: {}\n", q(name), q(value)));
                }
            }
        }
        out.push_str(if self.grants.is_empty() {
            "grants: []\n"
        } else {
            "grants:\n"
        });
        for grant in &self.grants {
            out.push_str(&format!("  - to:\n      issuer: {}\n", q(&grant.issuer)));
            if !grant.selector.is_empty() {
                let pairs: Vec<String> = grant
                    .selector
                    .iter()
                    .map(|(k, v)| format!("{}: {}", q(k), q(v)))
                    .collect();
                out.push_str(&format!("      attributes: {{ {} }}\n", pairs.join(", ")));
            }
            let capabilities: Vec<String> = grant.capabilities.iter().map(|c| q(c)).collect();
            out.push_str(&format!(
                "    capabilities: [{}]\n    using: {}\n",
                capabilities.join(", "),
                q(&grant.using)
            ));
            if let Some((calls, per)) = grant.limits {
                out.push_str(&format!("    limits: {{ calls: {calls}, per: {per} }}\n"));
            }
        }
        out
    }

    fn catalog(&self) -> Option<Catalog> {
        self.catalog.as_ref().map(|entries| {
            Catalog::new(entries.iter().map(|(upstream, name)| CatalogTool {
                upstream: upstream.clone(),
                name: name.clone(),
                description: None,
                input_schema: None,
            }))
        })
    }

    fn reversed(&self) -> Model {
        let mut reversed = self.clone();
        reversed.grants.reverse();
        reversed
    }

    /// A ruleset built straight from the model, without compiling: grants
    /// may be ambiguous, the first capability is declared a second time with
    /// the opposite realization, and `nobody` is an unresolved account
    /// (projected as disabled, §2.5).
    fn raw_ruleset(&self) -> Ruleset {
        let realized = |id: &str| self.mappings().any(|(_, _, capability)| capability == id);
        let mut capabilities: Vec<CapabilityRule> = self
            .capabilities
            .iter()
            .enumerate()
            .map(|(i, id)| CapabilityRule {
                id: id.clone(),
                realized: realized(id),
                path: format!("/capabilities/{i}"),
            })
            .collect();
        if let Some(first) = capabilities.first().cloned() {
            capabilities.push(CapabilityRule {
                realized: !first.realized,
                path: format!("/capabilities/{}", capabilities.len()),
                ..first
            });
        }
        let grants = self
            .grants
            .iter()
            .enumerate()
            .map(|(g, grant)| Grant {
                issuer: grant.issuer.clone(),
                selector: grant.selector.clone(),
                capabilities: grant.capabilities.clone(),
                account: AccountRef {
                    id: grant.using.clone(),
                    disabled: self
                        .accounts
                        .iter()
                        .find(|(id, _)| *id == grant.using)
                        .is_none_or(|(_, disabled)| *disabled),
                },
                limits: grant.limits.map(|(calls, per)| Limits {
                    calls,
                    per: per.to_owned(),
                    window_ms: window_ms(per)
                        .and_then(|w| u64::try_from(w).ok())
                        .expect("pool durations are small"),
                }),
                conditions: Vec::new(),
                path: format!("/grants/{g}"),
            })
            .collect();
        Ruleset::new(capabilities, grants)
    }
}

/// §2.4: selectors overlap unless the issuers differ or a key present in
/// both has different values.
fn overlap(a: &GrantM, b: &GrantM) -> bool {
    a.issuer == b.issuer
        && a.selector.iter().all(|(name, value)| {
            b.selector
                .iter()
                .find(|(other, _)| other == name)
                .is_none_or(|(_, v)| v == value)
        })
}

/// Makes the grants unambiguous: a grant takes the account of the earlier
/// overlapping grants it shares a capability with, and drops any capability
/// that would still clash (and itself, if none is left). An unresolved
/// account becomes the first declared one.
fn repair(mut model: Model) -> Model {
    let mut kept: Vec<GrantM> = Vec::new();
    for mut grant in std::mem::take(&mut model.grants) {
        if !model.accounts.iter().any(|(id, _)| *id == grant.using) {
            grant.using = model.accounts[0].0.clone();
        }
        let clashes = |grant: &GrantM, capability: &String| -> BTreeSet<String> {
            kept.iter()
                .filter(|earlier| overlap(earlier, grant) && earlier.capabilities.contains(capability))
                .map(|earlier| earlier.using.clone())
                .collect()
        };
        if let Some(account) = grant
            .capabilities
            .iter()
            .find_map(|c| clashes(&grant, c).into_iter().next())
        {
            grant.using = account;
        }
        let keep: Vec<String> = grant
            .capabilities
            .iter()
            .filter(|c| clashes(&grant, c).iter().all(|account| *account == grant.using))
            .cloned()
            .collect();
        grant.capabilities = keep;
        if !grant.capabilities.is_empty() {
            kept.push(grant);
        }
    }
    model.grants = kept;
    model
}

type GrantSeed = (Index, Vec<(Index, Index)>, Vec<Index>, Index, Option<Index>);

fn grant_seed() -> impl Strategy<Value = GrantSeed> {
    (
        any::<Index>(),
        prop::collection::vec((any::<Index>(), any::<Index>()), 0..3),
        prop::collection::vec(any::<Index>(), 1..4),
        any::<Index>(),
        prop::option::weighted(0.6, any::<Index>()),
    )
}

/// A model as written by someone who has not run the compiler yet: grants
/// may be ambiguous or run as an undeclared account (`nobody`).
fn raw_model() -> impl Strategy<Value = Model> {
    (
        prop::sample::subsequence(CAPABILITY_POOL.to_vec(), 1..=5).prop_shuffle(),
        prop::sample::subsequence(UPSTREAM_POOL.to_vec(), 0..=3),
        prop::collection::vec(
            (
                any::<bool>(),
                prop::sample::subsequence(TOOL_POOL.to_vec(), 0..=3),
                prop::collection::vec(any::<Index>(), 3),
            ),
            3,
        ),
        prop::sample::subsequence(ACCOUNT_POOL.to_vec(), 1..=4),
        prop::collection::vec(prop::bool::weighted(0.25), 4),
        prop::sample::subsequence(ISSUER_POOL.to_vec(), 1..=3),
        prop::collection::vec(
            (
                0u8..3,
                prop::sample::subsequence(ATTRIBUTE_POOL.to_vec(), 0..=3),
                any::<Index>(),
            ),
            3,
        ),
        prop::collection::vec(grant_seed(), 0..=7),
        any::<bool>(),
        prop::option::weighted(0.7, prop::collection::vec(any::<u32>(), 16)),
    )
        .prop_map(
            |(
                capabilities,
                upstream_ids,
                upstream_seeds,
                account_ids,
                disabled,
                issuer_ids,
                issuer_seeds,
                grant_seeds,
                write_empty,
                catalog_keys,
            )| {
                let capabilities: Vec<String> = capabilities.into_iter().map(str::to_owned).collect();
                let upstreams: Vec<UpstreamM> = upstream_ids
                    .into_iter()
                    .zip(upstream_seeds)
                    .map(|(id, (http, names, picks))| UpstreamM {
                        id: id.to_owned(),
                        http,
                        tools: names
                            .into_iter()
                            .zip(picks)
                            .map(|(name, pick)| (name.to_owned(), pick.get(&capabilities).clone()))
                            .collect(),
                    })
                    .collect();
                let accounts: Vec<(String, bool)> = account_ids
                    .into_iter()
                    .zip(disabled)
                    .map(|(id, off)| (id.to_owned(), off))
                    .collect();
                let issuers: Vec<IssuerM> = issuer_ids
                    .into_iter()
                    .zip(issuer_seeds)
                    .map(|(id, (kind, names, value))| {
                        let kind = [Kind::Oidc, Kind::StaticKey, Kind::Mtls][usize::from(kind)];
                        let attributes = names
                            .into_iter()
                            .map(|name| {
                                let source = match kind {
                                    Kind::Oidc => format!("claim:{name}"),
                                    Kind::Mtls => "dn:OU".to_owned(),
                                    Kind::StaticKey => value.get(&VALUE_POOL).to_string(),
                                };
                                (name.to_owned(), source)
                            })
                            .collect();
                        IssuerM {
                            id: id.to_owned(),
                            kind,
                            attributes,
                        }
                    })
                    .collect();
                let mut account_choices: Vec<String> = accounts.iter().map(|(id, _)| id.clone()).collect();
                account_choices.push("nobody".to_owned());
                let grants = grant_seeds
                    .into_iter()
                    .map(|(issuer, selector, picks, account, limits)| {
                        let issuer: &IssuerM = issuer.get(&issuers);
                        let mut chosen: Vec<(String, String)> = Vec::new();
                        if !issuer.attributes.is_empty() {
                            for (name, value) in selector {
                                let name = name.get(&issuer.attributes).0.clone();
                                if !chosen.iter().any(|(seen, _)| *seen == name) {
                                    chosen.push((name, value.get(&VALUE_POOL).to_string()));
                                }
                            }
                        }
                        GrantM {
                            issuer: issuer.id.clone(),
                            selector: chosen,
                            capabilities: picks.iter().map(|pick| pick.get(&capabilities).clone()).collect(),
                            using: account.get(&account_choices).clone(),
                            limits: limits.map(|pick| *pick.get(&LIMIT_POOL)),
                        }
                    })
                    .collect();
                let mut model = Model {
                    capabilities,
                    upstreams,
                    write_empty_upstreams: write_empty,
                    accounts,
                    issuers,
                    grants,
                    catalog: None,
                };
                model.catalog = catalog_keys.map(|keys| {
                    // Every mapping (so that no `tool_not_in_catalog`), two tools no
                    // mapping covers, one repeated entry, in a random order.
                    let mut entries: Vec<(String, String)> = model
                        .mappings()
                        .map(|(u, n, _)| (u.to_owned(), n.to_owned()))
                        .collect();
                    entries.push(("crm".into(), "unmapped".into()));
                    entries.push(("ghost".into(), "haunt".into()));
                    if let Some(first) = entries.first().cloned() {
                        entries.push(first);
                    }
                    let mut keyed: Vec<(u32, (String, String))> = entries
                        .into_iter()
                        .enumerate()
                        .map(|(i, e)| (keys[i % keys.len()], e))
                        .collect();
                    keyed.sort_by_key(|(key, _)| *key);
                    keyed.into_iter().map(|(_, entry)| entry).collect()
                });
                model
            },
        )
}

fn model() -> impl Strategy<Value = Model> {
    raw_model().prop_map(repair)
}

/// Principals of the model's issuers (and of one it lacks), with attributes
/// declared or not, values that match selectors or not.
fn principals() -> impl Strategy<Value = Vec<Principal>> {
    let principal = (
        prop::sample::select(vec!["corp", "key", "mesh", "ghost"]),
        prop::sample::subsequence(ATTRIBUTE_POOL.to_vec(), 0..=4),
        prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 4),
    )
        .prop_map(|(issuer, names, values)| {
            let attributes: BTreeMap<String, String> = names
                .into_iter()
                .zip(values)
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect();
            Principal::new(issuer, "someone", attributes)
        });
    prop::collection::vec(principal, 1..6)
}

// ── A world: an artifact compiled, and the questions asked of it ────────────

const AT: Instant = 1_700_000_000_000;

/// Not consulted, unknown, and counted around each window's edge (expired
/// exactly at the window, a start in the future never expired).
const USAGES: [Usage; 9] = [
    Usage::NotConsulted,
    Usage::Unknown,
    Usage::Counted {
        calls: 0,
        window_start: AT,
    },
    Usage::Counted {
        calls: 1,
        window_start: AT,
    },
    Usage::Counted {
        calls: 1,
        window_start: AT - 59_999,
    },
    Usage::Counted {
        calls: 60,
        window_start: AT - 60_000,
    },
    Usage::Counted {
        calls: 100,
        window_start: AT - 1_800_000,
    },
    Usage::Counted {
        calls: 2400,
        window_start: AT - 3_600_000,
    },
    Usage::Counted {
        calls: 5,
        window_start: AT + 5_000,
    },
];

struct World {
    text: String,
    catalog: Option<Catalog>,
    compilation: Compilation,
    principals: Vec<Principal>,
    /// Every declared capability, and one that is not.
    requests: Vec<String>,
}

impl World {
    fn new(model: &Model, principals: Vec<Principal>) -> World {
        World::from_text(model.render(), model.catalog(), principals)
    }

    fn from_text(text: String, catalog: Option<Catalog>, principals: Vec<Principal>) -> World {
        let compilation = compile(text.as_bytes(), catalog.as_ref());
        let mut requests: Vec<String> = compilation
            .policy
            .iter()
            .flat_map(|p| p.capabilities.iter().map(|c| c.id.clone()))
            .collect();
        requests.push("nope.undeclared".to_owned());
        World {
            text,
            catalog,
            compilation,
            principals,
            requests,
        }
    }

    fn policy(&self) -> &CompiledPolicy {
        self.compilation
            .policy
            .as_ref()
            .unwrap_or_else(|| panic!("compiles: {:#?}\n{}", self.compilation.diagnostics, self.text))
    }

    fn ruleset(&self) -> &Ruleset {
        &self.policy().ruleset
    }

    /// Every (principal, capability, usage) question.
    fn questions(&self) -> impl Iterator<Item = (&Principal, &str, Usage)> {
        self.principals.iter().flat_map(move |p| {
            self.requests
                .iter()
                .flat_map(move |c| USAGES.iter().map(move |u| (p, c.as_str(), *u)))
        })
    }
}

/// An evaluator: `evaluate`, `evaluate_linear`, or a broken one.
trait Evaluator: for<'a> Fn(&'a Ruleset, &Principal, &'a str, Instant, Usage) -> Decision<'a> {}
impl<F> Evaluator for F where F: for<'a> Fn(&'a Ruleset, &Principal, &'a str, Instant, Usage) -> Decision<'a> {}

type Outcome = Result<(), String>;

fn show(decision: &Decision<'_>) -> String {
    let reason = decision.reason();
    let mut line = format!(
        "{} {} {} {}",
        decision.outcome(),
        reason.code.as_str(),
        reason.path,
        reason.subject
    );
    if let Decision::Allow(allow) = decision {
        line.push_str(&format!(
            " {} {:?}",
            allow.account.id,
            allow.limits.map(|l| (l.calls, &l.per, l.window_ms))
        ));
    }
    line
}

// ── Independent facts, computed by the test from the compiled declarations ──

/// Selector matching written out again (§3.1), not `Grant::matches`.
fn selects(grant: &Grant, principal: &Principal) -> bool {
    grant.issuer == principal.issuer
        && grant
            .selector
            .iter()
            .all(|(k, v)| principal.attributes.get(k) == Some(v))
}

fn matching<'r>(ruleset: &'r Ruleset, principal: &Principal, capability: &str) -> Vec<(usize, &'r Grant)> {
    ruleset
        .grants()
        .iter()
        .enumerate()
        .filter(|(_, g)| selects(g, principal) && g.capabilities.iter().any(|c| c == capability))
        .collect()
}

// ── Property 1: fail-closed ─────────────────────────────────────────────────

fn property_fail_closed(eval: impl Evaluator, world: &World) -> Outcome {
    let policy = world.policy();
    let ruleset = &policy.ruleset;
    for (principal, capability, usage) in world.questions() {
        let decision = eval(ruleset, principal, capability, AT, usage);
        let context = || format!("{principal:?} {capability} {usage:?} → {}", show(&decision));
        let declared = policy.capabilities.iter().find(|c| c.id == capability);
        let realized = policy
            .upstreams
            .iter()
            .flat_map(|u| &u.tools)
            .any(|t| t.capability == capability);
        let matching = matching(ruleset, principal, capability);
        if let Decision::Allow(allow) = &decision {
            if declared.is_none() || !realized {
                return Err(format!(
                    "allowed an undeclared or unrealized capability: {}",
                    context()
                ));
            }
            let Some((_, by)) = matching.iter().find(|(_, g)| g.account.id == allow.account.id) else {
                return Err(format!(
                    "allowed without a matching grant for that account: {}",
                    context()
                ));
            };
            let account = policy.accounts.iter().rev().find(|a| a.id == by.account.id);
            if account.is_none_or(|a| a.disabled) || allow.account.disabled {
                return Err(format!(
                    "allowed as a disabled or undeclared account: {}",
                    context()
                ));
            }
            if usage == Usage::Unknown && matching.iter().any(|(_, g)| g.limits.is_some()) {
                return Err(format!("an unknown usage under a ceiling allowed: {}", context()));
            }
            if allow.reason.code != ReasonCode::Granted {
                return Err(format!("an allow whose code is not `granted`: {}", context()));
            }
        }
        if ruleset.grants().is_empty() && decision.is_allow() {
            return Err(format!("allowed with no grants at all: {}", context()));
        }
        let reason = decision.reason();
        if declared.is_none() && reason.code != ReasonCode::CapabilityNotDeclared {
            return Err(format!(
                "an undeclared capability must be capability_not_declared: {}",
                context()
            ));
        }
        let granted_anywhere = ruleset
            .grants()
            .iter()
            .any(|g| g.capabilities.iter().any(|c| c == capability));
        if declared.is_some()
            && realized
            && !granted_anywhere
            && (reason.code, reason.path) != (ReasonCode::NoGrantMatches, "/grants")
        {
            return Err(format!(
                "a declared, ungranted capability must be no_grant_matches at /grants: {}",
                context()
            ));
        }
    }
    Ok(())
}

// ── Property 2: listing ≡ decision ──────────────────────────────────────────

/// A listed tool: (upstream, name, capability).
type Listed = (String, String, String);

/// The real listing (§4.10): `visible`, then the catalog's tools for it.
fn listing(policy: &CompiledPolicy, principal: &Principal) -> Vec<Listed> {
    let shown: Vec<String> = visible(&policy.ruleset, principal, AT)
        .iter()
        .map(|v| v.capability.id.clone())
        .collect();
    policy
        .tools
        .realizing(|capability| shown.iter().any(|c| c == capability))
        .map(|tool| (tool.upstream.clone(), tool.name.clone(), tool.capability.clone()))
        .collect()
}

fn property_listing_is_the_decision(
    list: impl Fn(&CompiledPolicy, &Principal) -> Vec<Listed>,
    world: &World,
) -> Outcome {
    let policy = world.policy();
    let catalog: Vec<(String, String)> = match &world.catalog {
        Some(catalog) => catalog
            .tools
            .iter()
            .map(|t| (t.upstream.clone(), t.name.clone()))
            .collect(),
        None => policy
            .upstreams
            .iter()
            .flat_map(|u| &u.tools)
            .map(|t| (t.upstream.clone(), t.name.clone()))
            .collect(),
    };
    for principal in &world.principals {
        let listed = list(policy, principal);
        for capability in &policy.capabilities {
            let allows = evaluate(
                &policy.ruleset,
                principal,
                &capability.id,
                AT,
                Usage::NotConsulted,
            )
            .is_allow();
            let appears = listed.iter().any(|(_, _, c)| *c == capability.id);
            if allows != appears {
                return Err(format!(
                    "{principal:?} {}: allows={allows}, listed={appears}: {listed:?}",
                    capability.id
                ));
            }
        }
        let mut last = None;
        for (upstream, name, capability) in &listed {
            let mapped = policy
                .upstreams
                .iter()
                .flat_map(|u| &u.tools)
                .any(|t| t.upstream == *upstream && t.name == *name && t.capability == *capability);
            if !mapped {
                return Err(format!("{principal:?}: unmapped tool {upstream}/{name} listed"));
            }
            let at = catalog.iter().position(|(u, n)| u == upstream && n == name);
            if at.is_none() || at <= last {
                return Err(format!(
                    "{principal:?}: {upstream}/{name} is not in catalog order: {listed:?}"
                ));
            }
            last = at;
        }
    }
    Ok(())
}

// ── Property 3: explainability ──────────────────────────────────────────────

const CODES: [&str; 8] = [
    "granted",
    "capability_not_declared",
    "capability_not_realized",
    "no_grant_matches",
    "ambiguous_grant",
    "account_disabled",
    "usage_unknown",
    "limit_exhausted",
];

fn grant_index(path: &str) -> Option<usize> {
    let digits = path.strip_prefix("/grants/")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

fn property_explainable(eval: impl Evaluator, world: &World) -> Outcome {
    let ruleset = world.ruleset();
    let document = world
        .compilation
        .document
        .as_ref()
        .ok_or("a compiled artifact keeps its document")?;
    for (principal, capability, usage) in world.questions() {
        let decision = eval(ruleset, principal, capability, AT, usage);
        let reason = decision.reason();
        let context = || format!("{principal:?} {capability} {usage:?} → {}", show(&decision));
        if !CODES.contains(&reason.code.as_str()) {
            return Err(format!("a code outside the vocabulary: {}", context()));
        }
        if reason.path.is_empty() || reason.subject.is_empty() {
            return Err(format!("an empty pointer or subject: {}", context()));
        }
        if decision.is_allow() {
            let grant = grant_index(reason.path).and_then(|g| ruleset.grants().get(g));
            if !grant.is_some_and(|g| selects(g, principal) && g.capabilities.iter().any(|c| c == capability))
            {
                return Err(format!("an allow must point at a matching grant: {}", context()));
            }
        }
        match document.resolve(reason.path) {
            Some(at) if at.line > 0 && at.column > 0 => {}
            other => return Err(format!("the pointer resolves to {other:?}: {}", context())),
        }
    }
    Ok(())
}

// ── Property 4: determinism ─────────────────────────────────────────────────

fn property_deterministic(eval: impl Evaluator, world: &World) -> Outcome {
    let again = compile(world.text.as_bytes(), world.catalog.as_ref());
    let fresh = &again
        .policy
        .as_ref()
        .ok_or("the same text compiles the same way")?
        .ruleset;
    for (principal, capability, usage) in world.questions() {
        let first = eval(world.ruleset(), principal, capability, AT, usage);
        let second = eval(world.ruleset(), principal, capability, AT, usage);
        let recompiled = eval(fresh, &principal.clone(), capability, AT, usage);
        if first != second || first != recompiled {
            return Err(format!(
                "{principal:?} {capability} {usage:?}: {} / {} / {}",
                show(&first),
                show(&second),
                show(&recompiled)
            ));
        }
    }
    Ok(())
}

// ── Property 5: order independence ──────────────────────────────────────────

/// What reordering grants may not change: outcome, code, account, calls, window.
fn summary(decision: &Decision<'_>) -> (bool, ReasonCode, Option<String>, Option<(u64, u64)>) {
    match decision {
        Decision::Allow(allow) => (
            true,
            allow.reason.code,
            Some(allow.account.id.clone()),
            allow.limits.map(|l| (l.calls, l.window_ms)),
        ),
        Decision::Deny(reason) => (false, reason.code, None, None),
    }
}

fn property_order_independent(eval: impl Evaluator, world: &World, reversed: &World) -> Outcome {
    if world.compilation.policy.is_some() != reversed.compilation.policy.is_some() {
        return Err("the compile verdict changed when the grants were reversed".into());
    }
    if world.compilation.policy.is_none() {
        return Ok(());
    }
    for (principal, capability, usage) in world.questions() {
        let before = eval(world.ruleset(), principal, capability, AT, usage);
        let after = eval(reversed.ruleset(), principal, capability, AT, usage);
        if summary(&before) != summary(&after) {
            return Err(format!(
                "{principal:?} {capability} {usage:?}: {} became {}",
                show(&before),
                show(&after)
            ));
        }
    }
    Ok(())
}

/// The compile verdict (error-free or not) does not depend on grant order.
fn property_verdict_order_independent(verdict: impl Fn(&Model) -> bool, model: &Model) -> Outcome {
    let (before, after) = (verdict(model), verdict(&model.reversed()));
    if before == after {
        Ok(())
    } else {
        Err(format!(
            "compiles={before}, reversed compiles={after}\n{}",
            model.render()
        ))
    }
}

fn compiles(model: &Model) -> bool {
    compile(model.render().as_bytes(), model.catalog().as_ref())
        .policy
        .is_some()
}

// ── Property 6: diagnostics resolve ─────────────────────────────────────────

/// Line lengths in characters; `\r\n`, `\r` and `\n` end a line, and the text
/// after the last break (possibly empty) is a line too.
fn line_lengths(text: &str) -> Vec<usize> {
    let mut lengths = vec![0];
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\r' | '\n' => {
                if ch == '\r' && chars.peek() == Some(&'\n') {
                    chars.next();
                }
                lengths.push(0);
            }
            _ => *lengths.last_mut().expect("never empty") += 1,
        }
    }
    lengths
}

fn property_diagnostics_resolve(
    compiler: impl Fn(&[u8], Option<&Catalog>) -> Compilation,
    text: &str,
    catalog: Option<&Catalog>,
) -> Outcome {
    let compilation = compiler(text.as_bytes(), catalog);
    let lines = line_lengths(text);
    let on_a_line = |position: capgate_core::policy::Position| {
        position.line >= 1
            && position.column >= 1
            && lines
                .get(position.line - 1)
                .is_some_and(|&length| position.column <= length + 1)
    };
    // Documented exceptions (§2.3, §4.5): an empty document has nothing to
    // point at; `/upstreams` may be absent; an empty (null) value has no
    // position; a related pointer may designate nothing (an issuer without
    // an attributes map).
    let Some(document) = compilation
        .document
        .as_ref()
        .map_or(Some(None), |d| d.root().map(|_| Some(d)))
    else {
        return Ok(());
    };
    let designates_empty = |path: &str| {
        document
            .and_then(|d| d.lookup(path))
            .is_some_and(|node| node.position().is_none())
    };
    let absent = |path: &str| document.is_some_and(|d| d.lookup(path).is_none());
    for diagnostic in &compilation.diagnostics {
        let context = || format!("{diagnostic:?}\n{text}");
        match diagnostic.position {
            Some(position) if on_a_line(position) => {}
            Some(_) => return Err(format!("a position off the text: {}", context())),
            None if diagnostic.path == "/upstreams" && absent("/upstreams") => {}
            None if designates_empty(&diagnostic.path) => {}
            None => return Err(format!("no position: {}", context())),
        }
        for related in &diagnostic.related {
            match related.position {
                Some(position) if on_a_line(position) => {}
                Some(_) => return Err(format!("a related position off the text: {}", context())),
                None if absent(&related.path) || designates_empty(&related.path) => {}
                None => return Err(format!("a related pointer without position: {}", context())),
            }
        }
    }
    Ok(())
}

/// Small breakages of a rendered artifact: lines deleted, repeated, swapped,
/// YAML punctuation spliced in.
#[derive(Debug, Clone)]
enum Breakage {
    DeleteLine(Index),
    RepeatLine(Index),
    SwapLines(Index, Index),
    Splice(Index, &'static str),
}

fn breakage() -> impl Strategy<Value = Breakage> {
    prop_oneof![
        any::<Index>().prop_map(Breakage::DeleteLine),
        any::<Index>().prop_map(Breakage::RepeatLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Breakage::SwapLines(a, b)),
        (
            any::<Index>(),
            prop::sample::select(vec![
                ":", "- ", "  ", "{", "}", "[", "\"", "'", "&a ", "*a", "!x ", "#", "\t", "x", "~", "\n",
                "1", "é"
            ])
        )
            .prop_map(|(at, token)| Breakage::Splice(at, token)),
    ]
}

fn break_text(text: &str, breakages: &[Breakage]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for breakage in breakages {
        if lines.is_empty() {
            break;
        }
        match breakage {
            Breakage::DeleteLine(i) => {
                lines.remove(i.index(lines.len()));
            }
            Breakage::RepeatLine(i) => {
                let at = i.index(lines.len());
                lines.insert(at, lines[at].clone());
            }
            Breakage::SwapLines(a, b) => {
                let (a, b) = (a.index(lines.len()), b.index(lines.len()));
                lines.swap(a, b);
            }
            Breakage::Splice(at, token) => {
                let line = at.index(lines.len());
                let chars: Vec<char> = lines[line].chars().collect();
                let column = at.index(chars.len() + 1);
                let mut spliced: String = chars[..column].iter().collect();
                spliced.push_str(token);
                spliced.extend(&chars[column..]);
                lines[line] = spliced;
            }
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

// ── The index agrees with the scan ──────────────────────────────────────────

fn property_index_is_the_scan(
    indexed: impl Evaluator,
    ruleset: &Ruleset,
    principals: &[Principal],
) -> Outcome {
    let mut requests: Vec<&str> = ruleset.capabilities().iter().map(|c| c.id.as_str()).collect();
    requests.push("nope.undeclared");
    for principal in principals {
        for &capability in &requests {
            for usage in USAGES {
                let fast = indexed(ruleset, principal, capability, AT, usage);
                let slow = evaluate_linear(ruleset, principal, capability, AT, usage);
                if fast != slow {
                    return Err(format!(
                        "{principal:?} {capability} {usage:?}: index {} / scan {}",
                        show(&fast),
                        show(&slow)
                    ));
                }
            }
        }
    }
    Ok(())
}

// ── A reference evaluator, spelled out from §4.2, with injectable bugs ──────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// Step 7 skipped whatever the usage.
    IgnoresUsage,
    /// No matching grant is an allow.
    AllowsUnmatched,
    /// Complete ties go to the latest grant instead of the earliest.
    LastOnTies,
    /// Equal rates go to the latest grant, whatever the window.
    RateOnlyTies,
    /// An allow points at the capability, not at the grant.
    AllowPointsAtCapability,
}

static NOBODY: AccountRef = AccountRef {
    id: String::new(),
    disabled: false,
};

/// `a` is a strictly lower rate than `b` (`None`: no ceiling, +∞), exactly.
fn rate(a: Option<&Limits>, b: Option<&Limits>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => (u128::from(a.calls) * u128::from(b.window_ms))
            .cmp(&(u128::from(b.calls) * u128::from(a.window_ms))),
    }
}

fn window(limits: Option<&Limits>) -> u128 {
    limits.map_or(u128::MAX, |l| u128::from(l.window_ms))
}

fn replaces(bug: Bug, candidate: Option<&Limits>, incumbent: Option<&Limits>) -> bool {
    let strictly = |a, b| match rate(a, b) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => window(a) < window(b),
    };
    match bug {
        Bug::LastOnTies => !strictly(incumbent, candidate),
        Bug::RateOnlyTies => rate(candidate, incumbent) != Ordering::Greater,
        _ => strictly(candidate, incumbent),
    }
}

fn reference<'a>(
    bug: Bug,
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let deny = |code, path, subject| Decision::Deny(Reason { code, path, subject });
    // 1. Declared?
    let Some(declared) = ruleset.capabilities().iter().find(|c| c.id == capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, "/capabilities", capability);
    };
    // 2. Realized?
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, capability);
    }
    // 3. Matching grants, in file order.
    let grants = ruleset.grants();
    let matching: Vec<usize> = matching(ruleset, principal, capability)
        .into_iter()
        .map(|(g, _)| g)
        .collect();
    let Some(&first) = matching.first() else {
        if bug == Bug::AllowsUnmatched {
            let reason = Reason {
                code: ReasonCode::Granted,
                path: "/grants",
                subject: capability,
            };
            return Decision::Allow(Allow {
                reason,
                account: &NOBODY,
                limits: None,
                grant: 0,
                conditional: false,
            });
        }
        return deny(ReasonCode::NoGrantMatches, "/grants", capability);
    };
    // 4. Ambiguity guard.
    if matching
        .iter()
        .any(|&g| grants[g].account.id != grants[first].account.id)
    {
        return deny(ReasonCode::AmbiguousGrant, &grants[first].path, capability);
    }
    // 5. Disabled account.
    if let Some(&g) = matching.iter().find(|&&g| grants[g].account.disabled) {
        return deny(
            ReasonCode::AccountDisabled,
            &grants[g].path,
            &grants[g].account.id,
        );
    }
    // 6. The most restrictive grant.
    let mut winner = first;
    for &g in &matching[1..] {
        if replaces(bug, grants[g].limits.as_ref(), grants[winner].limits.as_ref()) {
            winner = g;
        }
    }
    let grant = &grants[winner];
    // 7. Its ceiling, unless not consulted.
    if let (Some(limits), false) = (&grant.limits, bug == Bug::IgnoresUsage) {
        match usage {
            Usage::NotConsulted => {}
            Usage::Unknown => return deny(ReasonCode::UsageUnknown, &grant.path, &grant.account.id),
            Usage::Counted { calls, window_start } => {
                let expired = i128::from(at) - i128::from(window_start) >= i128::from(limits.window_ms);
                if (if expired { 0 } else { calls }) >= limits.calls {
                    return deny(ReasonCode::LimitExhausted, &grant.path, capability);
                }
            }
        }
    }
    // 8. Allow.
    let path = if bug == Bug::AllowPointsAtCapability {
        &declared.path
    } else {
        &grant.path
    };
    let reason = Reason {
        code: ReasonCode::Granted,
        path,
        subject: capability,
    };
    Decision::Allow(Allow {
        reason,
        account: &grant.account,
        limits: grant.limits.as_ref(),
        grant: winner,
        conditional: false,
    })
}

fn correct<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    reference(Bug::None, r, p, c, at, u)
}
fn ignores_usage<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    reference(Bug::IgnoresUsage, r, p, c, at, u)
}
fn allows_unmatched<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    reference(Bug::AllowsUnmatched, r, p, c, at, u)
}
fn last_on_ties<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    reference(Bug::LastOnTies, r, p, c, at, u)
}
fn rate_only_ties<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    reference(Bug::RateOnlyTies, r, p, c, at, u)
}
fn allow_points_at_capability<'a>(
    r: &'a Ruleset,
    p: &Principal,
    c: &'a str,
    at: Instant,
    u: Usage,
) -> Decision<'a> {
    reference(Bug::AllowPointsAtCapability, r, p, c, at, u)
}

thread_local! {
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// Remembers how often it was called, and every other answer is a denial.
fn forgetful<'a>(r: &'a Ruleset, p: &Principal, c: &'a str, at: Instant, u: Usage) -> Decision<'a> {
    let n = CALLS.with(|calls| {
        calls.set(calls.get() + 1);
        calls.get()
    });
    if n % 2 == 0 {
        Decision::Deny(Reason {
            code: ReasonCode::NoGrantMatches,
            path: "/grants",
            subject: c,
        })
    } else {
        evaluate(r, p, c, at, u)
    }
}

/// The spec-literal reference and the core agree on every question.
fn property_matches_reference(eval: impl Evaluator, world: &World) -> Outcome {
    for (principal, capability, usage) in world.questions() {
        let core = eval(world.ruleset(), principal, capability, AT, usage);
        let spec = correct(world.ruleset(), principal, capability, AT, usage);
        if core != spec {
            return Err(format!(
                "{principal:?} {capability} {usage:?}: core {} / reference {}",
                show(&core),
                show(&spec)
            ));
        }
    }
    Ok(())
}

// ── Generated cases: the real implementations must pass ─────────────────────

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fail_closed(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_fail_closed(evaluate, &world).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn listing_is_the_decision(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_listing_is_the_decision(listing, &world).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn explainable(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_explainable(evaluate, &world).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn deterministic(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_deterministic(evaluate, &world).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn order_independent(model in model(), principals in principals()) {
        let world = World::new(&model, principals.clone());
        let reversed = World::new(&model.reversed(), principals);
        property_order_independent(evaluate, &world, &reversed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn compile_verdict_order_independent(model in raw_model()) {
        property_verdict_order_independent(compiles, &model).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn diagnostics_resolve(model in raw_model(), breakages in prop::collection::vec(breakage(), 0..4)) {
        let text = break_text(&model.render(), &breakages);
        property_diagnostics_resolve(compile, &text, None).map_err(TestCaseError::fail)?;
        property_diagnostics_resolve(compile, &text, model.catalog().as_ref()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn index_is_the_scan_on_compiled_policies(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_index_is_the_scan(evaluate, world.ruleset(), &world.principals).map_err(TestCaseError::fail)?;
    }

    /// Ambiguous grants, a capability declared twice, an unresolved account:
    /// what a compiled policy never holds, the two evaluators still agree on.
    #[test]
    fn index_is_the_scan_on_raw_rulesets(model in raw_model(), principals in principals()) {
        property_index_is_the_scan(evaluate, &model.raw_ruleset(), &principals).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn core_is_the_spec_reference(model in model(), principals in principals()) {
        let world = World::new(&model, principals);
        prop_assume!(world.compilation.policy.is_some());
        property_matches_reference(evaluate, &world).map_err(TestCaseError::fail)?;
    }
}

// ── Known inputs: the deliberately wrong implementations must fail ──────────

fn grant(
    issuer: &str,
    selector: &[(&str, &str)],
    capabilities: &[&str],
    using: &str,
    limits: Option<(u64, &'static str)>,
) -> GrantM {
    GrantM {
        issuer: issuer.to_owned(),
        selector: selector
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
        using: using.to_owned(),
        limits,
    }
}

/// Two capabilities realized by `crm`, one declared only; accounts `ro`
/// (enabled) and `off` (disabled); an oidc issuer `corp` with `team`.
fn known(grants: Vec<GrantM>) -> Model {
    Model {
        capabilities: vec!["crm.read".into(), "crm.write".into(), "crm.unrealized".into()],
        upstreams: vec![UpstreamM {
            id: "crm".into(),
            http: true,
            tools: vec![
                ("get".into(), "crm.read".into()),
                ("put".into(), "crm.write".into()),
            ],
        }],
        write_empty_upstreams: false,
        accounts: vec![("ro".into(), false), ("off".into(), true)],
        issuers: vec![IssuerM {
            id: "corp".into(),
            kind: Kind::Oidc,
            attributes: vec![("team".into(), "claim:team".into())],
        }],
        grants,
        catalog: Some(vec![
            ("crm".into(), "get".into()),
            ("crm".into(), "hidden".into()),
            ("crm".into(), "put".into()),
        ]),
    }
}

fn team(value: &str) -> Vec<Principal> {
    vec![
        Principal::new(
            "corp",
            "ana",
            BTreeMap::from([("team".to_owned(), value.to_owned())]),
        ),
        Principal::new("corp", "bo", BTreeMap::new()),
    ]
}

#[test]
fn fail_closed_catches_an_allow_without_a_grant_and_a_blind_ceiling() {
    let world = World::new(
        &known(vec![grant(
            "corp",
            &[("team", "a")],
            &["crm.read"],
            "ro",
            Some((5, "1h")),
        )]),
        team("a"),
    );
    property_fail_closed(evaluate, &world).unwrap();
    property_fail_closed(correct, &world).unwrap();
    assert!(property_fail_closed(allows_unmatched, &world).is_err());
    assert!(property_fail_closed(ignores_usage, &world).is_err());
}

#[test]
fn empty_grants_and_an_empty_artifact_deny_everything() {
    let world = World::new(&known(vec![]), team("a"));
    property_fail_closed(evaluate, &world).unwrap();
    assert!(property_fail_closed(allows_unmatched, &world).is_err());
    let empty = World::from_text(
        "version: 1\ncapabilities: []\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n".to_owned(),
        None,
        team("a"),
    );
    for (principal, capability, usage) in empty.questions() {
        let decision = evaluate(empty.ruleset(), principal, capability, AT, usage);
        assert_eq!(
            show(&decision),
            format!("deny capability_not_declared /capabilities {capability}")
        );
    }
    property_explainable(evaluate, &empty).unwrap();
}

#[test]
fn listing_catches_a_listing_that_consults_ceilings_or_shows_unmapped_tools() {
    let world = World::new(
        &known(vec![grant(
            "corp",
            &[],
            &["crm.read", "crm.write"],
            "ro",
            Some((0, "1d")),
        )]),
        team("a"),
    );
    property_listing_is_the_decision(listing, &world).unwrap();
    let consults_ceilings = |policy: &CompiledPolicy, principal: &Principal| -> Vec<Listed> {
        policy
            .tools
            .all()
            .iter()
            .filter(|tool| {
                evaluate(
                    &policy.ruleset,
                    principal,
                    &tool.capability,
                    AT,
                    Usage::Counted {
                        calls: 0,
                        window_start: AT,
                    },
                )
                .is_allow()
            })
            .map(|tool| (tool.upstream.clone(), tool.name.clone(), tool.capability.clone()))
            .collect()
    };
    assert!(property_listing_is_the_decision(consults_ceilings, &world).is_err());
    let shows_unmapped = |policy: &CompiledPolicy, principal: &Principal| -> Vec<Listed> {
        let mut listed = listing(policy, principal);
        if let Some((upstream, _, capability)) = listed.first().cloned() {
            listed.insert(1, (upstream, "hidden".to_owned(), capability));
        }
        listed
    };
    assert!(property_listing_is_the_decision(shows_unmapped, &world).is_err());
}

#[test]
fn explainability_catches_an_allow_that_points_at_the_capability() {
    let world = World::new(
        &known(vec![grant("corp", &[], &["crm.read"], "ro", None)]),
        team("a"),
    );
    property_explainable(evaluate, &world).unwrap();
    assert!(property_explainable(allow_points_at_capability, &world).is_err());
    assert!(property_explainable(allows_unmatched, &world).is_err());
}

#[test]
fn determinism_catches_an_evaluator_with_memory() {
    let world = World::new(
        &known(vec![grant("corp", &[], &["crm.read"], "ro", None)]),
        team("a"),
    );
    property_deterministic(evaluate, &world).unwrap();
    assert!(property_deterministic(forgetful, &world).is_err());
}

#[test]
fn order_independence_catches_a_tie_break_on_rate_alone() {
    // 100/1h and 2400/1d have one rate; the shorter window must win either way round.
    let model = known(vec![
        grant("corp", &[], &["crm.read"], "ro", Some((100, "1h"))),
        grant("corp", &[("team", "a")], &["crm.read"], "ro", Some((2400, "1d"))),
    ]);
    let (world, reversed) = (
        World::new(&model, team("a")),
        World::new(&model.reversed(), team("a")),
    );
    property_order_independent(evaluate, &world, &reversed).unwrap();
    property_order_independent(last_on_ties, &world, &reversed).unwrap();
    assert!(property_order_independent(rate_only_ties, &world, &reversed).is_err());
}

#[test]
fn verdict_order_independence_catches_a_one_sided_ambiguity_check() {
    // `{}` vs `{team: a}` with different accounts is ambiguous in either order.
    let model = known(vec![
        grant("corp", &[], &["crm.read"], "ro", None),
        grant("corp", &[("team", "a")], &["crm.read"], "off", None),
    ]);
    property_verdict_order_independent(compiles, &model).unwrap();
    assert!(!compiles(&model));
    // Broken: only flags the later grant when the earlier selector is a subset of it.
    let one_sided = |model: &Model| {
        let result = compile(model.render().as_bytes(), model.catalog().as_ref());
        let others = result
            .diagnostics
            .iter()
            .any(|d| d.is_error() && d.code.as_str() != "ambiguous_grant");
        let subset = |a: &GrantM, b: &GrantM| a.selector.iter().all(|pair| b.selector.contains(pair));
        let ambiguous = model.grants.iter().enumerate().any(|(i, a)| {
            model.grants[i + 1..].iter().any(|b| {
                a.issuer == b.issuer
                    && a.using != b.using
                    && subset(a, b)
                    && a.capabilities.iter().any(|c| b.capabilities.contains(c))
            })
        });
        !others && !ambiguous
    };
    assert!(property_verdict_order_independent(one_sided, &model).is_err());
}

#[test]
fn diagnostics_resolve_catches_lost_and_shifted_positions() {
    let model = known(vec![grant("ghost", &[], &["crm.read"], "nobody", None)]);
    let text = model.render();
    property_diagnostics_resolve(compile, &text, model.catalog().as_ref()).unwrap();
    let loses_positions = |bytes: &[u8], catalog: Option<&Catalog>| {
        let mut result = compile(bytes, catalog);
        result
            .diagnostics
            .iter_mut()
            .for_each(|d: &mut Diagnostic| d.position = None);
        result
    };
    assert!(property_diagnostics_resolve(loses_positions, &text, model.catalog().as_ref()).is_err());
    let shifts_lines = |bytes: &[u8], catalog: Option<&Catalog>| {
        let mut result = compile(bytes, catalog);
        for d in &mut result.diagnostics {
            if let Some(p) = &mut d.position {
                p.line += 40;
            }
        }
        result
    };
    assert!(property_diagnostics_resolve(shifts_lines, &text, model.catalog().as_ref()).is_err());
    // A YAML error at the very end of the text still lies on a line.
    property_diagnostics_resolve(compile, "version: 1\ncapabilities: [\n", None).unwrap();
}

#[test]
fn the_index_catches_the_latest_grant_winning_a_complete_tie() {
    let model = known(vec![
        grant("corp", &[], &["crm.read"], "ro", Some((10, "60m"))),
        grant("corp", &[("team", "a")], &["crm.read"], "ro", Some((10, "1h"))),
    ]);
    let world = World::new(&model, team("a"));
    property_index_is_the_scan(evaluate, world.ruleset(), &world.principals).unwrap();
    assert!(property_index_is_the_scan(last_on_ties, world.ruleset(), &world.principals).is_err());
    // The tie is real: the pointer and the `per` spelling follow file order.
    let decision = evaluate(
        world.ruleset(),
        &world.principals[0],
        "crm.read",
        AT,
        Usage::NotConsulted,
    );
    assert_eq!(
        show(&decision),
        "allow granted /grants/0 crm.read ro Some((10, \"60m\", 3600000))"
    );
}

#[test]
fn the_reference_catches_each_bug() {
    let model = known(vec![
        grant("corp", &[], &["crm.read", "crm.write"], "ro", Some((1, "1m"))),
        grant("corp", &[("team", "a")], &["crm.read"], "ro", Some((60, "1h"))),
        grant("corp", &[("team", "b")], &["crm.write"], "ro", Some((60, "60m"))),
    ]);
    let mut principals = team("a");
    principals.push(Principal::new("mesh", "svc", BTreeMap::new()));
    let world = World::new(&model, principals);
    property_matches_reference(evaluate, &world).unwrap();
    property_matches_reference(evaluate_linear, &world).unwrap();
    for broken in [
        ignores_usage,
        allows_unmatched,
        rate_only_ties,
        allow_points_at_capability,
    ] {
        assert!(property_matches_reference(broken, &world).is_err());
    }
}

// ── The generators are not vacuous ──────────────────────────────────────────

#[test]
fn most_generated_artifacts_compile_and_raw_ones_often_do_not() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (repaired, raw) = (model(), raw_model());
    let (mut compiled, mut raw_compiled, mut with_grants) = (0, 0, 0);
    for _ in 0..200 {
        let model = repaired.new_tree(&mut runner).unwrap().current();
        compiled += usize::from(compiles(&model));
        with_grants += usize::from(!model.grants.is_empty());
        raw_compiled += usize::from(compiles(&raw.new_tree(&mut runner).unwrap().current()));
    }
    assert_eq!(compiled, 200, "a repaired model always compiles");
    assert!(with_grants >= 150, "{with_grants} of 200 have grants");
    assert!(
        (20..180).contains(&raw_compiled),
        "{raw_compiled} of 200 raw models compile"
    );
}

#[test]
fn generated_questions_reach_every_reason_code() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let cases = (model(), raw_model(), principals());
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..100 {
        let (repaired, raw, principals) = cases.new_tree(&mut runner).unwrap().current();
        let world = World::new(&repaired, principals.clone());
        for (principal, capability, usage) in world.questions() {
            *seen
                .entry(
                    evaluate(world.ruleset(), principal, capability, AT, usage)
                        .reason()
                        .code
                        .as_str(),
                )
                .or_default() += 1;
        }
        let ruleset = raw.raw_ruleset();
        for principal in &principals {
            for capability in ruleset.capabilities() {
                for usage in USAGES {
                    *seen
                        .entry(
                            evaluate(&ruleset, principal, &capability.id, AT, usage)
                                .reason()
                                .code
                                .as_str(),
                        )
                        .or_default() += 1;
                }
            }
        }
    }
    for code in CODES {
        assert!(
            seen.get(code).is_some_and(|&n| n >= 10),
            "{code} is rarely reached: {seen:?}"
        );
    }
}

#[test]
fn broken_artifacts_reach_every_stage_of_the_compiler() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let cases = (raw_model(), prop::collection::vec(breakage(), 0..4));
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..300 {
        let (model, breakages) = cases.new_tree(&mut runner).unwrap().current();
        let text = break_text(&model.render(), &breakages);
        for d in compile(text.as_bytes(), model.catalog().as_ref()).diagnostics {
            *seen.entry(d.code.as_str()).or_default() += 1;
        }
    }
    for code in [
        "yaml_syntax",
        "schema_violation",
        "ambiguous_grant",
        "unknown_account_in_grant",
        "catalog_tool_unmapped",
        "capability_not_realized",
    ] {
        assert!(
            seen.get(code).is_some_and(|&n| n >= 5),
            "{code} is rarely reached: {seen:?}"
        );
    }
}
