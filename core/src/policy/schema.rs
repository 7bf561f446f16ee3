//! Schema validation (docs/reference.md#top-level-sections): the artifact's JSON Schema,
//! checked directly on the parsed document so that every violation carries
//! the exact granularity, pointer and order the spec fixes — one diagnostic
//! per failing leaf keyword, deeper paths first, equal depth in document
//! order, de-duplicated on (path, keyword, key).
//!
//! The same constraints are published as a JSON Schema document
//! (`capgate schema`, [`SCHEMA_JSON`]); `tests/schema_oracle.rs` checks that
//! this validator and an independent JSON Schema implementation running the
//! published document agree on generated artifacts.

use std::collections::HashSet;

use super::document::{Document, NodeRef, Value};
use super::{pointer, suggest, syntax, Code, Diagnostic, Position, Severity};

/// The artifact's JSON Schema (draft 2020-12), as printed by `capgate schema`.
pub const SCHEMA_JSON: &str = include_str!("schema.json");

/// The largest window a `per` may denote: 2^53 ms (docs/reference.md#limits-and-windows, ours).
pub const MAX_WINDOW_MS: u128 = 1 << 53;

/// The largest `calls` a ceiling may hold: 2^64 − 1, what a counter holds
/// (ours, docs/decisions/0004).
pub const MAX_CALLS: i128 = u64::MAX as i128;

struct Violation {
    path: String,
    keyword: &'static str,
    key: Option<String>,
    message: String,
    /// Where to point instead of where `path` resolves: an unknown key's own position (the
    /// pointer stays the object's, as JSON Schema reports `additionalProperties`).
    at: Option<Position>,
}

#[derive(Default)]
struct Validator {
    found: Vec<Violation>,
}

/// Validates a parsed artifact; empty when it satisfies the schema.
pub fn validate(document: &Document) -> Vec<Diagnostic> {
    let mut validator = Validator::default();
    match document.root() {
        Some(root) => validator.root(root),
        None => validator.report("", "type", None, "the document is empty; expected an object"),
    }
    let mut found = validator.found;
    // Deeper first; the sort is stable, so equal depths keep document order.
    found.sort_by_key(|violation| std::cmp::Reverse(pointer::segments(&violation.path).len()));
    let mut seen = HashSet::new();
    found
        .into_iter()
        .filter(|v| seen.insert((v.path.clone(), v.keyword, v.key.clone())))
        .map(|violation| Diagnostic {
            severity: Severity::Error,
            code: Code::SchemaViolation,
            position: violation.at.or_else(|| document.resolve(&violation.path)),
            message: violation.message,
            path: violation.path,
            related: Vec::new(),
        })
        .collect()
}

/// The pointer of a child of `path`. The validator builds one for every
/// node of the document, so it is built by copying, not `format!`: through the
/// formatting machinery it was nearly half of validating a 10k-grant artifact.
fn child(path: &str, segment: &str) -> String {
    let mut child = String::with_capacity(path.len() + 1 + segment.len());
    child.push_str(path);
    pointer::push(&mut child, segment);
    child
}

fn describe(node: NodeRef<'_>) -> &'static str {
    match node.value() {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "an array",
        Value::Mapping(_) => "an object",
        Value::Alias(_) => "an alias",
    }
}

type Check = fn(&mut Validator, NodeRef<'_>, &str);

/// A closed object's properties: name and how to check its value.
struct Shape {
    required: &'static [&'static str],
    properties: &'static [(&'static str, Check)],
}

impl Validator {
    fn report(&mut self, path: &str, keyword: &'static str, key: Option<&str>, message: impl Into<String>) {
        self.report_at(path, keyword, key, message.into(), None);
    }

    /// As [`Validator::report`], pointing at `at` rather than where `path` resolves.
    fn report_at(
        &mut self,
        path: &str,
        keyword: &'static str,
        key: Option<&str>,
        message: String,
        at: Option<Position>,
    ) {
        self.found.push(Violation {
            path: path.to_owned(),
            keyword,
            key: key.map(str::to_owned),
            message,
            at,
        });
    }

    /// `type: object`, `required`, `properties` and `additionalProperties: false`.
    fn object(&mut self, node: NodeRef<'_>, path: &str, what: &str, shape: &Shape) {
        if !node.is_mapping() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("{what} must be an object, found {found}"),
            );
            return;
        }
        for required in shape.required {
            if node.get(required).is_none() {
                self.report(
                    path,
                    "required",
                    Some(required),
                    format!("{what} is missing the required property `{required}`"),
                );
            }
        }
        for (entry, value) in node.entries() {
            match shape.properties.iter().find(|(name, _)| *name == entry.key) {
                Some((name, check)) => check(self, value, &child(path, name)),
                None => {
                    let known = shape.properties.iter().map(|(name, _)| *name);
                    self.report_at(
                        path,
                        "additionalProperties",
                        Some(&entry.key),
                        format!(
                            "{what} does not allow the property `{}`{}",
                            entry.key,
                            suggest::did_you_mean(&entry.key, known)
                        ),
                        entry.key_position,
                    );
                }
            }
        }
    }

    fn array(&mut self, node: NodeRef<'_>, path: &str, what: &str, item: Check) {
        if !node.is_sequence() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("`{what}` must be an array, found {found}"),
            );
            return;
        }
        for (index, value) in node.items().enumerate() {
            item(self, value, &child(path, &index.to_string()));
        }
    }

    fn string<'d>(&mut self, node: NodeRef<'d>, path: &str) -> Option<&'d str> {
        let text = node.as_str();
        if text.is_none() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("`{}` must be a string, found {found}", last(path)),
            );
        }
        text
    }

    fn non_empty_string(&mut self, node: NodeRef<'_>, path: &str) {
        if self.string(node, path).is_some_and(str::is_empty) {
            self.report(
                path,
                "minLength",
                None,
                format!("`{}` must not be empty", last(path)),
            );
        }
    }

    fn patterned(
        &mut self,
        node: NodeRef<'_>,
        path: &str,
        name: &str,
        pattern: &str,
        check: fn(&str) -> bool,
    ) {
        if let Some(text) = self.string(node, path) {
            if !check(text) {
                self.report(
                    path,
                    "pattern",
                    None,
                    format!("`{text}` is not a valid {name} (pattern `{pattern}`)"),
                );
            }
        }
    }

    fn uri(&mut self, node: NodeRef<'_>, path: &str) {
        if let Some(text) = self.string(node, path) {
            if !syntax::is_uri(text) {
                self.report(
                    path,
                    "format",
                    None,
                    format!("`{text}` is not an absolute URI (RFC 3986)"),
                );
            }
        }
    }

    fn boolean(&mut self, node: NodeRef<'_>, path: &str) {
        if node.as_bool().is_none() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("`{}` must be a boolean, found {found}", last(path)),
            );
        }
    }

    fn string_map(&mut self, node: NodeRef<'_>, path: &str) {
        if !node.is_mapping() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("`attributes` must be an object, found {found}"),
            );
            return;
        }
        for (entry, value) in node.entries() {
            let at = child(path, &entry.key);
            match value.as_str() {
                None => {
                    let found = describe(value);
                    self.report(
                        &at,
                        "type",
                        None,
                        format!(
                            "the value of attribute `{}` must be a string, found {found} (quote it)",
                            entry.key
                        ),
                    );
                }
                Some("") => self.report(
                    &at,
                    "minLength",
                    None,
                    format!("the value of attribute `{}` must not be empty", entry.key),
                ),
                Some(_) => {}
            }
        }
    }

    fn root(&mut self, node: NodeRef<'_>) {
        self.object(
            node,
            "",
            "the policy",
            &Shape {
                required: &["version", "capabilities", "accounts", "principals", "grants"],
                properties: &[
                    ("version", Validator::version),
                    ("capabilities", |v, n, p| {
                        v.array(n, p, "capabilities", Validator::capability)
                    }),
                    ("upstreams", |v, n, p| {
                        v.array(n, p, "upstreams", Validator::upstream)
                    }),
                    ("accounts", |v, n, p| {
                        v.array(n, p, "accounts", Validator::account)
                    }),
                    ("principals", Validator::principals),
                    ("grants", |v, n, p| v.array(n, p, "grants", Validator::grant)),
                ],
            },
        );
    }

    fn version(&mut self, node: NodeRef<'_>, path: &str) {
        let known = node
            .as_number()
            .is_some_and(|n| n.as_f64() == 1.0 || n.as_f64() == 2.0);
        if !known {
            self.report(
                path,
                "enum",
                None,
                "`version` must be the number 1, or 2 for an artifact whose grants carry conditions (`when`)",
            );
        }
    }

    fn identifier(&mut self, node: NodeRef<'_>, path: &str) {
        self.patterned(
            node,
            path,
            "identifier",
            syntax::IDENTIFIER_PATTERN,
            syntax::is_identifier,
        );
    }

    fn capability_id(&mut self, node: NodeRef<'_>, path: &str) {
        self.patterned(
            node,
            path,
            "capability id",
            syntax::CAPABILITY_ID_PATTERN,
            syntax::is_capability_id,
        );
    }

    fn secret(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "`secret`",
            &Shape {
                required: &["ref"],
                properties: &[("ref", |v, n, p| {
                    v.patterned(
                        n,
                        p,
                        "secret reference",
                        syntax::SECRET_REF_PATTERN,
                        syntax::is_secret_ref,
                    );
                })],
            },
        );
    }

    fn capability(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "a capability",
            &Shape {
                required: &["id"],
                properties: &[
                    ("id", Validator::capability_id),
                    ("description", |v, n, p| {
                        v.string(n, p);
                    }),
                ],
            },
        );
    }

    fn upstream(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "an upstream",
            &Shape {
                required: &["id", "transport", "tools"],
                properties: &[
                    ("id", Validator::identifier),
                    ("transport", Validator::transport),
                    ("tools", |v, n, p| v.array(n, p, "tools", Validator::tool)),
                ],
            },
        );
    }

    /// `oneOf` of the two transport shapes: one diagnostic when neither (or,
    /// impossibly, both) match.
    fn transport(&mut self, node: NodeRef<'_>, path: &str) {
        let stdio = {
            let mut probe = Validator::default();
            probe.object(
                node,
                path,
                "",
                &Shape {
                    required: &["kind", "command"],
                    properties: &[
                        ("kind", |v, n, p| {
                            if n.as_str() != Some("mcp-stdio") {
                                v.report(p, "const", None, "");
                            }
                        }),
                        ("command", Validator::non_empty_string),
                        ("args", |v, n, p| {
                            v.array(n, p, "args", |v, n, p| {
                                v.string(n, p);
                            });
                        }),
                    ],
                },
            );
            probe.found.is_empty()
        };
        let http = {
            let mut probe = Validator::default();
            probe.object(
                node,
                path,
                "",
                &Shape {
                    required: &["kind", "url"],
                    properties: &[
                        ("kind", |v, n, p| {
                            if n.as_str() != Some("mcp-http") {
                                v.report(p, "const", None, "");
                            }
                        }),
                        ("url", Validator::uri),
                    ],
                },
            );
            probe.found.is_empty()
        };
        if stdio == http {
            self.report(
                path,
                "oneOf",
                None,
                "`transport` must be either `{kind: mcp-stdio, command, args?}` or `{kind: mcp-http, url}`",
            );
        }
    }

    fn tool(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "a tool mapping",
            &Shape {
                required: &["name", "capability"],
                properties: &[
                    ("name", Validator::non_empty_string),
                    ("capability", Validator::capability_id),
                ],
            },
        );
    }

    fn account(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "an account",
            &Shape {
                required: &["id", "secret"],
                properties: &[
                    ("id", Validator::identifier),
                    ("disabled", Validator::boolean),
                    ("secret", Validator::secret),
                    ("upstreams", Validator::upstream_ids),
                ],
            },
        );
    }

    /// An account's `upstreams`: upstream ids.
    fn upstream_ids(&mut self, node: NodeRef<'_>, path: &str) {
        self.array(node, path, "upstreams", Validator::identifier);
    }

    fn principals(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "`principals`",
            &Shape {
                required: &["issuers"],
                properties: &[("issuers", |v, n, p| v.array(n, p, "issuers", Validator::issuer))],
            },
        );
    }

    fn issuer(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "an issuer",
            &Shape {
                required: &["id", "kind"],
                properties: &[
                    ("id", Validator::identifier),
                    ("kind", |v, n, p| {
                        if let Some(kind) = v.string(n, p) {
                            if !matches!(kind, "oidc" | "static-key" | "mtls") {
                                v.report(
                                    p,
                                    "enum",
                                    None,
                                    format!("`{kind}` is not an issuer kind (oidc, static-key or mtls)"),
                                );
                            }
                        }
                    }),
                    ("discovery", Validator::uri),
                    ("audience", |v, n, p| {
                        v.string(n, p);
                    }),
                    ("subject", Validator::non_empty_string),
                    ("secret", Validator::secret),
                    ("attributes", Validator::string_map),
                ],
            },
        );
    }

    fn grant(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "a grant",
            &Shape {
                required: &["to", "capabilities", "using"],
                properties: &[
                    ("to", |v, n, p| {
                        v.object(
                            n,
                            p,
                            "`to`",
                            &Shape {
                                required: &["issuer"],
                                properties: &[
                                    ("issuer", Validator::identifier),
                                    ("attributes", Validator::string_map),
                                ],
                            },
                        );
                    }),
                    ("capabilities", |v, n, p| {
                        v.array(n, p, "capabilities", Validator::capability_id);
                        if n.is_sequence() && n.items().next().is_none() {
                            v.report(p, "minItems", None, "a grant must name at least one capability");
                        }
                    }),
                    ("using", Validator::identifier),
                    ("limits", Validator::limits),
                    ("when", |v, n, p| {
                        v.array(n, p, "when", Validator::condition);
                        if n.is_sequence() && n.items().next().is_none() {
                            v.report(p, "minItems", None, "`when` must hold at least one condition");
                        }
                    }),
                ],
            },
        );
    }

    /// `oneOf` of the two condition shapes, `{argument, <one operator>}` and `{time}`:
    /// one diagnostic at the condition when it is neither, saying what is wrong with the
    /// shape its keys point to.
    ///
    /// Only the shape the keys point to is probed: the other cannot match, since each shape
    /// requires its own key and refuses the other's (`time` is no property of an argument
    /// condition, `argument` none of a time condition).
    fn condition(&mut self, node: NodeRef<'_>, path: &str) {
        let mut problem = Validator::default();
        if node.get("time").is_some() {
            problem.object(node, path, "a time condition", &TIME_CONDITION);
        } else {
            problem.object(node, path, "an argument condition", &ARGUMENT_CONDITION);
            let operators = node
                .entries()
                .filter(|(entry, _)| OPERATORS.contains(&entry.key.as_str()))
                .count();
            if node.is_mapping() && operators != 1 {
                problem.report(
                    path,
                    "maxProperties",
                    None,
                    format!(
                        "an argument condition must have exactly one operator ({}), found {operators}",
                        OPERATORS.join(", ")
                    ),
                );
            }
        }
        if !problem.found.is_empty() {
            let detail = problem
                .found
                .first()
                .map(|violation| violation.message.clone())
                .unwrap_or_default();
            self.report(
                path,
                "oneOf",
                None,
                format!(
                    "a condition must be `{{argument: <path>, <operator>: <value>}}` or `{{time: {{zone, days?, from?, until?}}}}`: {detail}"
                ),
            );
        }
    }

    fn number(&mut self, node: NodeRef<'_>, path: &str) {
        if node.as_number().is_none() {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("`{}` must be a number, found {found}", last(path)),
            );
        }
    }

    /// A literal an argument is compared with: a string, a number or a boolean.
    fn scalar(&mut self, node: NodeRef<'_>, path: &str) {
        let scalar = node.as_str().is_some() || node.as_number().is_some() || node.as_bool().is_some();
        if !scalar {
            let found = describe(node);
            self.report(
                path,
                "type",
                None,
                format!("a value to compare with must be a string, a number or a boolean, found {found}"),
            );
        }
    }

    fn clock(&mut self, node: NodeRef<'_>, path: &str) {
        self.patterned(node, path, "time of day", CLOCK_PATTERN, |text| {
            crate::access::parse_clock(text).is_some()
        });
    }

    fn limits(&mut self, node: NodeRef<'_>, path: &str) {
        self.object(
            node,
            path,
            "`limits`",
            &Shape {
                required: &["calls", "per"],
                properties: &[
                    ("calls", |v, n, p| {
                        // Two leaf keywords, checked independently: `-1.5`
                        // fails both `type: integer` and `minimum: 0`.
                        let number = n.as_number();
                        if number.and_then(|number| number.as_integer()).is_none() {
                            let found = describe(n);
                            v.report(
                                p,
                                "type",
                                None,
                                format!("`calls` must be an integer, found {found}"),
                            );
                        }
                        if number.is_some_and(|number| number.as_f64() < 0.0) {
                            v.report(p, "minimum", None, "`calls` must be 0 or more");
                        }
                        // Ours: a ceiling no 64-bit counter holds is refused
                        // rather than saturated (docs/decisions/0004).
                        let integer = number.and_then(|number| number.as_integer());
                        if integer.is_some_and(|calls| calls > MAX_CALLS) {
                            v.report(
                                p,
                                "maximum",
                                None,
                                format!(
                                    "`calls` must be at most {MAX_CALLS} (2^64 − 1), the most a counter holds"
                                ),
                            );
                        }
                    }),
                    ("per", |v, n, p| {
                        let Some(text) = v.string(n, p) else { return };
                        match syntax::window_ms(text) {
                            None => v.report(
                                p,
                                "pattern",
                                None,
                                format!(
                                    "`{text}` is not a duration (pattern `{}`: e.g. 30s, 15m, 1h, 7d)",
                                    syntax::DURATION_PATTERN
                                ),
                            ),
                            Some(window) if window > MAX_WINDOW_MS => v.report(
                                p,
                                "maximum",
                                None,
                                format!("the window `{text}` is longer than 2^53 milliseconds"),
                            ),
                            Some(_) => {}
                        }
                    }),
                ],
            },
        );
    }
}

/// The operators of an argument condition (docs/reference.md#conditions).
const OPERATORS: [&str; 7] = [
    "equals",
    "in",
    "at_most",
    "at_least",
    "below",
    "above",
    "starts_with",
];

/// `HH:MM`, 00:00 to 24:00.
pub const CLOCK_PATTERN: &str = "^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$";

/// A path into the arguments: dotted member names, or an RFC 6901 pointer.
pub const ARGUMENT_PATH_PATTERN: &str = "^((/[^/]+)+|[^/.][^.]*([.][^.]+)*)$";

const ARGUMENT_CONDITION: Shape = Shape {
    required: &["argument"],
    properties: &[
        ("argument", |v, n, p| {
            v.patterned(n, p, "argument path", ARGUMENT_PATH_PATTERN, |text| {
                crate::access::ArgumentPath::parse(text).is_some()
            });
        }),
        ("equals", Validator::scalar),
        ("in", |v, n, p| {
            v.array(n, p, "in", Validator::scalar);
            if n.is_sequence() && n.items().next().is_none() {
                v.report(p, "minItems", None, "`in` must list at least one value");
            }
        }),
        ("at_most", Validator::number),
        ("at_least", Validator::number),
        ("below", Validator::number),
        ("above", Validator::number),
        ("starts_with", |v, n, p| {
            v.string(n, p);
        }),
    ],
};

const TIME_CONDITION: Shape = Shape {
    required: &["time"],
    properties: &[("time", |v, n, p| {
        v.object(
            n,
            p,
            "`time`",
            &Shape {
                required: &["zone"],
                properties: &[
                    ("zone", Validator::non_empty_string),
                    ("days", |v, n, p| {
                        v.array(n, p, "days", |v, n, p| {
                            let day = v.string(n, p);
                            if day.is_some_and(|day| crate::access::day_number(day).is_none()) {
                                v.report(
                                    p,
                                    "enum",
                                    None,
                                    "a day is one of mon, tue, wed, thu, fri, sat, sun",
                                );
                            }
                        });
                        if n.is_sequence() && n.items().next().is_none() {
                            v.report(p, "minItems", None, "`days` must name at least one day");
                        }
                    }),
                    ("from", Validator::clock),
                    ("until", Validator::clock),
                ],
            },
        );
    })],
};

fn last(path: &str) -> String {
    pointer::segments(path).pop().unwrap_or_default()
}
