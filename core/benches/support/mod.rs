//! A deterministic generator of realistic policy artifacts for the
//! benchmarks: the YAML text a person would write, at a chosen size.
//!
//! The shape: 20 domains of 10 capabilities each (200), one upstream per
//! domain realising its capabilities (a few twice), 10 issuers of the three
//! kinds with three declared attributes each, 50 accounts (two disabled), and
//! `grants` grants. A grant names one issuer, selects on 0–2 of its
//! attributes, lists 1–3 capabilities of one domain and sometimes carries a
//! ceiling.
//!
//! INVARIANT: the artifact compiles. Every grant of a given (issuer, domain)
//! runs as the same account, so no two grants that share an issuer and a
//! capability disagree on the account and `ambiguous_grant` cannot fire
//! however the selectors overlap (docs/reference.md#ambiguity, rule 1).

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub mod stream;

/// Seed of every generated artifact: same size, same text, every run.
pub const SEED: u64 = 0x5eed_cab6_a7e0_2024;

const DOMAINS: [&str; 20] = [
    "crm",
    "tickets",
    "billing",
    "docs",
    "metrics",
    "deploy",
    "hr",
    "finance",
    "inventory",
    "search",
    "mail",
    "calendar",
    "storage",
    "analytics",
    "security",
    "network",
    "payroll",
    "legal",
    "sales",
    "support",
];
const RESOURCES: [&str; 5] = ["record", "report", "comment", "attachment", "export"];
const ACTIONS: [&str; 2] = ["read", "write"];
const ACCOUNTS: usize = 50;
/// Accounts declared `disabled: true`.
const DISABLED: [usize; 2] = [13, 37];

/// Attribute names and the values selectors and principals draw them from.
const ATTRIBUTES: [(&str, &[&str]); 6] = [
    (
        "team",
        &[
            "ventas",
            "soporte",
            "finanzas",
            "plataforma",
            "datos",
            "legal",
            "rrhh",
            "seguridad",
        ],
    ),
    ("level", &["intern", "junior", "senior", "staff"]),
    (
        "region",
        &["eu-west", "eu-central", "us-east", "us-west", "ap-south"],
    ),
    ("env", &["dev", "staging", "prod"]),
    ("unit", &["payments", "sre", "core", "edge", "mobile", "web"]),
    ("org", &["Acme Corp", "Globex", "Initech"]),
];

/// A small xorshift64*: deterministic, dependency-free, good enough to
/// spread grants over issuers, domains and values.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-enough in `0..n` (n small).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// How an issuer recognises callers, and so how its attributes are written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Oidc,
    Mtls,
    StaticKey,
}

/// A generated issuer: its id and its declared attributes with the values a
/// principal of it may carry (a static key carries exactly one).
pub struct IssuerSpec {
    pub id: String,
    pub kind: Kind,
    pub attributes: Vec<(&'static str, Vec<&'static str>)>,
}

/// A generated grant, as written.
pub struct GrantSpec {
    pub issuer: usize,
    pub selector: Vec<(&'static str, &'static str)>,
    pub capabilities: Vec<String>,
    pub account: usize,
    pub limits: Option<(u64, &'static str)>,
}

/// The artifact's text and what it was generated from.
pub struct Generated {
    pub text: String,
    pub issuers: Vec<IssuerSpec>,
    pub grants: Vec<GrantSpec>,
}

pub fn capability_id(domain: usize, index: usize) -> String {
    format!(
        "{}.{}.{}",
        DOMAINS[domain],
        RESOURCES[index / ACTIONS.len()],
        ACTIONS[index % ACTIONS.len()]
    )
}

fn account_id(index: usize) -> String {
    format!("svc-{index:02}")
}

fn issuers() -> Vec<IssuerSpec> {
    let kinds = [
        Kind::Oidc,
        Kind::Oidc,
        Kind::Mtls,
        Kind::Oidc,
        Kind::StaticKey,
        Kind::Oidc,
        Kind::Mtls,
        Kind::Oidc,
        Kind::StaticKey,
        Kind::Oidc,
    ];
    let names = [
        "corp-sso",
        "partner-sso",
        "mesh",
        "contractors",
        "ci-bot",
        "support-sso",
        "edge-mesh",
        "research",
        "nightly",
        "field-sso",
    ];
    kinds
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (&kind, name))| {
            // Three of the six attribute names, rotating per issuer.
            let attributes = (0..3)
                .map(|k| {
                    let (attribute, values) = ATTRIBUTES[(i + 2 * k) % ATTRIBUTES.len()];
                    let values = match kind {
                        Kind::StaticKey => vec![values[i % values.len()]],
                        _ => values.to_vec(),
                    };
                    (attribute, values)
                })
                .collect();
            IssuerSpec {
                id: name.to_owned(),
                kind,
                attributes,
            }
        })
        .collect()
}

/// The account every grant of (issuer, domain) runs as. 200 pairs onto 50
/// accounts: each account serves four pairs.
fn account_for(issuer: usize, domain: usize) -> usize {
    (issuer * DOMAINS.len() + domain) % ACCOUNTS
}

fn grants(rng: &mut Rng, issuers: &[IssuerSpec], count: usize) -> Vec<GrantSpec> {
    const PERIODS: [(u64, &str); 6] = [
        (10, "1m"),
        (60, "1h"),
        (100, "1h"),
        (600, "1h"),
        (2400, "1d"),
        (30, "30s"),
    ];
    (0..count)
        .map(|_| {
            let issuer = rng.below(issuers.len());
            let domain = rng.below(DOMAINS.len());
            let mut capabilities: Vec<String> = Vec::new();
            let listed = 1 + rng.below(3);
            while capabilities.len() < listed {
                let id = capability_id(domain, rng.below(RESOURCES.len() * ACTIONS.len()));
                if !capabilities.contains(&id) {
                    capabilities.push(id);
                }
            }
            // 0, 1 or 2 attributes: 25 % / 45 % / 30 %.
            let roll = rng.below(100);
            let keys = if roll < 25 {
                0
            } else if roll < 70 {
                1
            } else {
                2
            };
            let declared = &issuers[issuer].attributes;
            let first = rng.below(declared.len());
            let selector = (0..keys)
                .map(|k| {
                    let (name, values) = &declared[(first + k) % declared.len()];
                    (*name, values[rng.below(values.len())])
                })
                .collect();
            // Four grants in ten carry a ceiling; one in a hundred suspends.
            let limits = match rng.below(100) {
                0 => Some((0, "1d")),
                1..40 => Some(PERIODS[rng.below(PERIODS.len())]),
                _ => None,
            };
            GrantSpec {
                issuer,
                selector,
                capabilities,
                account: account_for(issuer, domain),
                limits,
            }
        })
        .collect()
}

/// Generates the artifact with `count` grants. Same `count`, same text.
pub fn generate(count: usize) -> Generated {
    let mut rng = Rng::new(SEED ^ count as u64);
    let issuers = issuers();
    let grants = grants(&mut rng, &issuers, count);
    let mut out = String::with_capacity(200 * count + 64 * 1024);
    out.push_str(
        "# Generated by benches/support: a synthetic but realistic policy.\nversion: 1\n\ncapabilities:\n",
    );
    for (domain, name) in DOMAINS.iter().enumerate() {
        for index in 0..RESOURCES.len() * ACTIONS.len() {
            let id = capability_id(domain, index);
            if index % 3 == 0 {
                let _ = writeln!(
                    out,
                    "  - id: {id}\n    description: {} of the {name} domain",
                    ACTIONS[index % 2]
                );
            } else {
                let _ = writeln!(out, "  - id: {id}");
            }
        }
    }
    out.push_str("\nupstreams:\n");
    for (domain, name) in DOMAINS.iter().enumerate() {
        let _ = writeln!(out, "  - id: {name}");
        if domain % 2 == 0 {
            let _ = writeln!(out, "    transport:\n      kind: mcp-stdio\n      command: {name}-mcp\n      args: [\"--region\", \"eu-west-1\"]");
        } else {
            let _ = writeln!(
                out,
                "    transport:\n      kind: mcp-http\n      url: https://{name}.example.net/mcp"
            );
        }
        out.push_str("    tools:\n");
        for index in 0..RESOURCES.len() * ACTIONS.len() {
            let capability = capability_id(domain, index);
            let tool = format!("{}_{}", ACTIONS[index % 2], RESOURCES[index / 2]);
            let _ = writeln!(out, "      - name: {tool}\n        capability: {capability}");
            // Some capabilities have a second tool (a bulk variant).
            if index % 4 == 1 {
                let _ = writeln!(out, "      - name: {tool}_bulk\n        capability: {capability}");
            }
        }
    }
    out.push_str("\naccounts:\n");
    for index in 0..ACCOUNTS {
        let id = account_id(index);
        let _ = writeln!(out, "  - id: {id}");
        if DISABLED.contains(&index) {
            out.push_str("    disabled: true\n");
        }
        let _ = writeln!(out, "    secret: {{ ref: \"vault://secret/mcp/{id}#token\" }}");
    }
    out.push_str("\nprincipals:\n  issuers:\n");
    for issuer in &issuers {
        let _ = writeln!(out, "    - id: {}", issuer.id);
        match issuer.kind {
            Kind::Oidc => {
                let _ = writeln!(
                    out,
                    "      kind: oidc\n      discovery: https://{}.example.com/.well-known/openid-configuration\n      audience: capgate",
                    issuer.id
                );
            }
            Kind::Mtls => out.push_str("      kind: mtls\n"),
            Kind::StaticKey => {
                let _ = writeln!(
                    out,
                    "      kind: static-key\n      subject: {0}\n      secret: {{ ref: \"env://{0}_KEY\" }}",
                    issuer.id
                );
            }
        }
        out.push_str("      attributes:\n");
        for (name, values) in &issuer.attributes {
            match issuer.kind {
                Kind::Oidc => {
                    let _ = writeln!(out, "        {name}: \"claim:{name}\"");
                }
                Kind::Mtls => {
                    let _ = writeln!(out, "        {name}: \"dn:{name}\"");
                }
                Kind::StaticKey => {
                    let _ = writeln!(out, "        {name}: \"{}\"", values[0]);
                }
            }
        }
    }
    out.push_str("\ngrants:\n");
    for grant in &grants {
        let _ = writeln!(out, "  - to:\n      issuer: {}", issuers[grant.issuer].id);
        if !grant.selector.is_empty() {
            out.push_str("      attributes:\n");
            for (name, value) in &grant.selector {
                let _ = writeln!(out, "        {name}: \"{value}\"");
            }
        }
        let _ = writeln!(out, "    capabilities: [{}]", grant.capabilities.join(", "));
        let _ = writeln!(out, "    using: {}", account_id(grant.account));
        if let Some((calls, per)) = grant.limits {
            let _ = writeln!(out, "    limits: {{ calls: {calls}, per: {per} }}");
        }
    }
    Generated {
        text: out,
        issuers,
        grants,
    }
}

/// The attributes of a principal that satisfies `grant`'s selector and
/// carries every other attribute its issuer declares, as a real token would.
pub fn principal_attributes(
    issuers: &[IssuerSpec],
    grant: &GrantSpec,
    filler: usize,
) -> BTreeMap<String, String> {
    issuers[grant.issuer]
        .attributes
        .iter()
        .map(|(name, values)| {
            let value = grant
                .selector
                .iter()
                .find(|(selected, _)| selected == name)
                .map_or(values[filler % values.len()], |(_, value)| value);
            ((*name).to_owned(), value.to_owned())
        })
        .collect()
}
