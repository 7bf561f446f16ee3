//! The compiled model (docs/reference.md#compilation) and how it is read off a document
//! that satisfied the schema.

use std::collections::{HashMap, HashSet};

use crate::access::{ArgumentPath, Condition, Grant, Limits, Literal, Op, Ruleset, Test, Window, EVERY_DAY};
use crate::accounts::{Account, AccountRef, SecretRef};
use crate::capabilities::{Capability, ToolIndex, ToolMapping, Transport, Upstream};
use crate::principals::{Issuer, IssuerKind};

use super::document::{Document, NodeRef};
use super::{pointer, syntax};

/// A policy that compiled: everything evaluation, listing and the service need.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// `sha256:<hex>` of the artifact's bytes.
    pub version: String,
    pub capabilities: Vec<Capability>,
    pub upstreams: Vec<Upstream>,
    pub accounts: Vec<Account>,
    pub issuers: Vec<Issuer>,
    /// The projection evaluation consumes; secret references never enter it.
    pub ruleset: Ruleset,
    /// Exposed name → tool, from the catalog (or the mappings without one).
    pub tools: ToolIndex,
}

impl CompiledPolicy {
    pub fn issuer(&self, id: &str) -> Option<&Issuer> {
        self.issuers.iter().find(|issuer| issuer.id == id)
    }

    pub fn account(&self, id: &str) -> Option<&Account> {
        self.accounts.iter().find(|account| account.id == id)
    }

    pub fn issuer_ids(&self) -> Vec<String> {
        self.issuers.iter().map(|issuer| issuer.id.clone()).collect()
    }
}

/// A grant as written, before accounts are resolved.
#[derive(Debug, Clone)]
pub(crate) struct RawGrant {
    pub issuer: String,
    pub selector: Vec<(String, String)>,
    pub capabilities: Vec<String>,
    pub using: String,
    pub limits: Option<Limits>,
    /// `when`, in order: the conditions as read.
    pub conditions: Vec<Condition>,
    /// The `when` entries that cannot be read (the entry's pointer and the problem), which
    /// a check reports.
    pub unreadable: Vec<Unreadable>,
    pub path: String,
}

/// A condition the schema let through that still cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// `time.zone` names no zone of the IANA database compiled in.
    UnknownZone { path: String, zone: String },
}

/// The declarations of a schema-valid document, in file order.
#[derive(Debug, Clone)]
pub(crate) struct Declared {
    pub capabilities: Vec<Capability>,
    /// Whether the artifact has an `upstreams` key at all.
    pub upstreams: Vec<Upstream>,
    pub accounts: Vec<Account>,
    pub issuers: Vec<Issuer>,
    pub grants: Vec<RawGrant>,
    /// The artifact's `version` (1 or 2).
    pub version: i128,
    /// Look-up sets for the semantic checks, built once so that checking is
    /// linear in the artifact's size.
    names: Names,
}

#[derive(Debug, Clone, Default)]
struct Names {
    capabilities: HashSet<String>,
    accounts: HashSet<String>,
    realized: HashSet<String>,
    used_accounts: HashSet<String>,
}

fn text(node: Option<NodeRef<'_>>) -> String {
    node.and_then(NodeRef::as_str).unwrap_or_default().to_owned()
}

fn string_pairs(node: Option<NodeRef<'_>>) -> Vec<(String, String)> {
    node.map(|node| {
        node.entries()
            .map(|(entry, value)| (entry.key.clone(), text(Some(value))))
            .collect()
    })
    .unwrap_or_default()
}

fn indexed<'d>(node: Option<NodeRef<'d>>) -> impl Iterator<Item = (usize, NodeRef<'d>)> {
    node.into_iter().flat_map(NodeRef::items).enumerate()
}

/// A literal as written: a string, a number or a boolean (the schema refused anything else).
fn literal(node: NodeRef<'_>) -> Literal {
    if let Some(number) = node.as_number() {
        Literal::Number(number.as_f64())
    } else if let Some(flag) = node.as_bool() {
        Literal::Bool(flag)
    } else {
        Literal::String(text(Some(node)))
    }
}

/// One `when` entry of a schema-valid grant.
fn read_condition(node: NodeRef<'_>, path: String) -> Result<Condition, Unreadable> {
    if let Some(time) = node.get("time") {
        let zone_name = text(time.get("zone"));
        let Ok(zone) = jiff::tz::TimeZone::get(&zone_name) else {
            return Err(Unreadable::UnknownZone {
                path: format!("{path}/time/zone"),
                zone: zone_name,
            });
        };
        let days = time.get("days").map_or(EVERY_DAY, |days| {
            days.items()
                .filter_map(|day| day.as_str().and_then(crate::access::day_number))
                .fold(0, |set, day| set | 1 << day)
        });
        let clock = |key: &str, default: u16| {
            time.get(key)
                .and_then(NodeRef::as_str)
                .and_then(crate::access::parse_clock)
                .unwrap_or(default)
        };
        return Ok(Condition {
            path,
            test: Test::Time(Window {
                zone_name,
                zone,
                days,
                from: clock("from", 0),
                until: clock("until", 24 * 60),
            }),
        });
    }
    let number = |key: &str| node.get(key).and_then(NodeRef::as_number).map(|n| n.as_f64());
    let op = if let Some(value) = node.get("equals") {
        Op::Equals(literal(value))
    } else if let Some(values) = node.get("in") {
        Op::In(values.items().map(literal).collect())
    } else if let Some(n) = number("at_most") {
        Op::AtMost(n)
    } else if let Some(n) = number("at_least") {
        Op::AtLeast(n)
    } else if let Some(n) = number("below") {
        Op::Below(n)
    } else if let Some(n) = number("above") {
        Op::Above(n)
    } else {
        Op::StartsWith(text(node.get("starts_with")))
    };
    let written = text(node.get("argument"));
    // INVARIANT: the schema refused a path with an empty segment.
    let path_in_arguments = ArgumentPath::parse(&written).unwrap_or(ArgumentPath {
        written,
        segments: Vec::new(),
    });
    Ok(Condition {
        path,
        test: Test::Argument {
            path: path_in_arguments,
            op,
        },
    })
}

impl Declared {
    /// Reads the declarations. The document must have passed the schema.
    pub fn read(document: &Document) -> Declared {
        let root = document.root();
        let get = |key: &str| root.and_then(|root| root.get(key));

        let capabilities = indexed(get("capabilities"))
            .map(|(i, node)| Capability {
                id: text(node.get("id")),
                description: node
                    .get("description")
                    .and_then(NodeRef::as_str)
                    .map(str::to_owned),
                realized: false,
                path: pointer::join(["capabilities", &i.to_string()]),
            })
            .collect();

        let upstreams = indexed(get("upstreams"))
            .map(|(u, node)| {
                let id = text(node.get("id"));
                let transport = node.get("transport");
                let field = |key: &str| transport.and_then(|t| t.get(key));
                let transport = if field("kind").and_then(NodeRef::as_str) == Some("mcp-http") {
                    Transport::Http {
                        url: text(field("url")),
                    }
                } else {
                    Transport::Stdio {
                        command: text(field("command")),
                        args: field("args")
                            .into_iter()
                            .flat_map(NodeRef::items)
                            .map(|arg| text(Some(arg)))
                            .collect(),
                    }
                };
                let tools = indexed(node.get("tools"))
                    .map(|(t, tool)| ToolMapping {
                        upstream: id.clone(),
                        name: text(tool.get("name")),
                        capability: text(tool.get("capability")),
                        path: pointer::join(["upstreams", &u.to_string(), "tools", &t.to_string()]),
                    })
                    .collect();
                Upstream {
                    id,
                    transport,
                    tools,
                    path: pointer::join(["upstreams", &u.to_string()]),
                }
            })
            .collect();

        let accounts = indexed(get("accounts"))
            .map(|(a, node)| Account {
                id: text(node.get("id")),
                disabled: node.get("disabled").and_then(NodeRef::as_bool).unwrap_or(false),
                secret_ref: SecretRef::new(text(node.get("secret").and_then(|s| s.get("ref")))),
                upstreams: node.get("upstreams").map(|list| {
                    list.items()
                        .filter_map(NodeRef::as_str)
                        .map(str::to_owned)
                        .collect()
                }),
                path: pointer::join(["accounts", &a.to_string()]),
            })
            .collect();

        let issuers = indexed(get("principals").and_then(|p| p.get("issuers")))
            .map(|(i, node)| Issuer {
                id: text(node.get("id")),
                kind: node
                    .get("kind")
                    .and_then(NodeRef::as_str)
                    .and_then(IssuerKind::parse)
                    .unwrap_or(IssuerKind::StaticKey),
                attributes: string_pairs(node.get("attributes")),
                subject: node.get("subject").and_then(NodeRef::as_str).map(str::to_owned),
                discovery: node.get("discovery").and_then(NodeRef::as_str).map(str::to_owned),
                audience: node.get("audience").and_then(NodeRef::as_str).map(str::to_owned),
                secret_ref: node
                    .get("secret")
                    .and_then(|s| s.get("ref"))
                    .and_then(NodeRef::as_str)
                    .map(str::to_owned),
                path: pointer::join(["principals", "issuers", &i.to_string()]),
            })
            .collect();

        let grants = indexed(get("grants"))
            .map(|(g, node)| {
                let to = node.get("to");
                let mut grant = RawGrant {
                    issuer: text(to.and_then(|to| to.get("issuer"))),
                    selector: string_pairs(to.and_then(|to| to.get("attributes"))),
                    capabilities: node
                        .get("capabilities")
                        .into_iter()
                        .flat_map(NodeRef::items)
                        .map(|c| text(Some(c)))
                        .collect(),
                    using: text(node.get("using")),
                    limits: node.get("limits").map(|limits| {
                        let per = text(limits.get("per"));
                        let calls = limits
                            .get("calls")
                            .and_then(NodeRef::as_number)
                            .and_then(|n| n.as_integer())
                            .unwrap_or(0);
                        Limits {
                            // INVARIANT: the schema refused `calls` outside
                            // 0..=u64::MAX (docs/decisions/0004), so this
                            // conversion is exact; nothing is saturated here.
                            calls: u64::try_from(calls).unwrap_or_default(),
                            window_ms: syntax::window_ms(&per)
                                .and_then(|w| u64::try_from(w).ok())
                                .unwrap_or(u64::MAX),
                            per,
                        }
                    }),
                    conditions: Vec::new(),
                    unreadable: Vec::new(),
                    path: pointer::join(["grants", &g.to_string()]),
                };
                for (c, condition) in indexed(node.get("when")) {
                    let path = pointer::join(["grants", &g.to_string(), "when", &c.to_string()]);
                    match read_condition(condition, path) {
                        Ok(condition) => grant.conditions.push(condition),
                        Err(unreadable) => grant.unreadable.push(unreadable),
                    }
                }
                grant
            })
            .collect();

        let mut declared = Declared {
            capabilities,
            upstreams,
            accounts,
            issuers,
            grants,
            version: get("version")
                .and_then(NodeRef::as_number)
                .and_then(|n| n.as_integer())
                .unwrap_or(1),
            names: Names::default(),
        };
        declared.names = Names {
            capabilities: declared.capabilities.iter().map(|c| c.id.clone()).collect(),
            accounts: declared.accounts.iter().map(|a| a.id.clone()).collect(),
            realized: declared.mappings().map(|m| m.capability.clone()).collect(),
            used_accounts: declared.grants.iter().map(|g| g.using.clone()).collect(),
        };
        declared
    }

    pub fn declares_capability(&self, id: &str) -> bool {
        self.names.capabilities.contains(id)
    }

    pub fn declares_account(&self, id: &str) -> bool {
        self.names.accounts.contains(id)
    }

    /// Some tool mapping (of any upstream) points to the capability.
    pub fn realizes(&self, capability: &str) -> bool {
        self.names.realized.contains(capability)
    }

    /// Some grant runs as the account.
    pub fn uses_account(&self, id: &str) -> bool {
        self.names.used_accounts.contains(id)
    }

    pub fn mappings(&self) -> impl Iterator<Item = &ToolMapping> {
        self.upstreams.iter().flat_map(|upstream| upstream.tools.iter())
    }

    /// Builds the evaluable policy; only called when no error was found.
    pub fn into_policy(
        mut self,
        version: String,
        tools: ToolIndex,
        realized_by_catalog: Option<&HashSet<String>>,
    ) -> CompiledPolicy {
        for capability in &mut self.capabilities {
            capability.realized = match realized_by_catalog {
                Some(covered) => covered.contains(&capability.id),
                None => self.names.realized.contains(&capability.id),
            };
        }
        // The last declaration wins, as for every look-up.
        let accounts: HashMap<&str, &Account> = self
            .accounts
            .iter()
            .map(|account| (account.id.as_str(), account))
            .collect();
        let account_ref = |id: &str| {
            // An unresolved id is projected as disabled (unreachable after a
            // clean compile).
            accounts.get(id).map_or(
                AccountRef {
                    id: id.to_owned(),
                    disabled: true,
                },
                |account| AccountRef {
                    id: account.id.clone(),
                    disabled: account.disabled,
                },
            )
        };
        let grants = self
            .grants
            .iter_mut()
            .map(|raw| Grant {
                issuer: raw.issuer.clone(),
                selector: raw.selector.clone(),
                capabilities: raw.capabilities.clone(),
                account: account_ref(&raw.using),
                limits: raw.limits.clone(),
                conditions: std::mem::take(&mut raw.conditions),
                path: raw.path.clone(),
            })
            .collect();
        let rules = self
            .capabilities
            .iter()
            .map(|c| crate::access::CapabilityRule {
                id: c.id.clone(),
                realized: c.realized,
                path: c.path.clone(),
            })
            .collect();
        CompiledPolicy {
            version,
            ruleset: Ruleset::new(rules, grants),
            capabilities: self.capabilities,
            upstreams: self.upstreams,
            accounts: self.accounts,
            issuers: self.issuers,
            tools,
        }
    }
}
