//! The hand-written schema validator (`policy::schema::validate`, reached
//! through `compile`) against an independent JSON Schema implementation — the
//! `jsonschema` crate running the printed schema (`SCHEMA_JSON`), draft
//! 2020-12 with `format: uri` asserted — on generated artifacts near the
//! schema's boundary (docs/reference.md#top-level-sections).
//!
//! Both validators see the same parsed document: ours directly, `jsonschema`
//! converted to `serde_json`. So the comparison is about validation only; the
//! YAML layer has its own tests. One rule is not expressible in JSON Schema
//! (a window longer than 2^53 ms) and is never generated here; it has its own
//! test below.
//!
//! Where the granularity of our diagnostics matters (one per failing leaf,
//! `required`/`additionalProperties` at the object, one per bad transport,
//! deeper first, then document order), hand cases pin the exact paths.

use std::sync::OnceLock;

use capgate_core::policy::document::{Document, NodeRef, Number, Value};
use capgate_core::policy::schema::SCHEMA_JSON;
use capgate_core::policy::syntax::is_uri;
use capgate_core::policy::{compile, Code};
use jsonschema::error::ValidationErrorKind;
use jsonschema::{Draft, Validator};
use proptest::prelude::*;
use serde_json::{json, Value as Json};

// ── The oracle ──────────────────────────────────────────────────────────────

fn schema() -> Json {
    serde_json::from_str(SCHEMA_JSON).expect("the printed schema is JSON")
}

fn oracle() -> &'static Validator {
    static ORACLE: OnceLock<Validator> = OnceLock::new();
    ORACLE.get_or_init(|| {
        jsonschema::options()
            .with_draft(Draft::Draft202012)
            .should_validate_formats(true)
            .build(&schema())
            .expect("the printed schema builds")
    })
}

/// A parsed document as the JSON data model sees it (aliases followed).
fn to_json(node: NodeRef<'_>) -> Json {
    match node.value() {
        Value::Null | Value::Alias(_) => Json::Null,
        Value::Bool(flag) => Json::Bool(*flag),
        Value::Number(Number::Int(value)) => match (i64::try_from(*value), u64::try_from(*value)) {
            (Ok(small), _) => json!(small),
            (_, Ok(unsigned)) => json!(unsigned),
            #[allow(clippy::cast_precision_loss)]
            _ => serde_json::Number::from_f64(*value as f64).map_or(Json::Null, Json::Number),
        },
        Value::Number(Number::Float(value)) => {
            serde_json::Number::from_f64(*value).map_or(Json::Null, Json::Number)
        }
        Value::String(text) => Json::String(text.clone()),
        Value::Sequence(_) => Json::Array(node.items().map(to_json).collect()),
        Value::Mapping(_) => Json::Object(
            node.entries()
                .map(|(entry, value)| (entry.key.clone(), to_json(value)))
                .collect(),
        ),
    }
}

/// Our verdict: does compiling report a schema violation?
fn ours(text: &str) -> bool {
    !our_paths(text).is_empty()
}

/// Where our schema violations are, one entry per diagnostic, sorted.
fn our_paths(text: &str) -> Vec<String> {
    let mut paths: Vec<String> = compile(text.as_bytes(), None)
        .diagnostics
        .into_iter()
        .filter(|d| d.code == Code::SchemaViolation)
        .map(|d| d.path)
        .collect();
    paths.sort();
    paths
}

/// Where the oracle's errors are, sorted: one entry per failing keyword, and
/// for `additionalProperties` one per unexpected key (the oracle groups them
/// in one error; the spec wants one diagnostic per key).
fn their_paths(instance: &Json) -> Vec<String> {
    let mut paths: Vec<String> = oracle()
        .iter_errors(instance)
        .flat_map(|error| {
            let copies = match error.kind() {
                ValidationErrorKind::AdditionalProperties { unexpected } => unexpected.len(),
                _ => 1,
            };
            vec![error.instance_path().to_string(); copies]
        })
        .collect();
    paths.sort();
    paths
}

/// The property: on a document that parses, our validator and the oracle
/// find the same failures at the same instance locations — the same verdict,
/// and the same granularity (§1.4: one diagnostic per failing leaf keyword,
/// per missing or extra key, one per bad transport). `ours` is a parameter so
/// that a deliberately wrong validator can be shown to fail it.
fn property_agrees(text: &str, ours: impl Fn(&str) -> Vec<String>) -> Result<(), String> {
    let document =
        Document::parse(text).map_err(|errors| format!("generator bug, not YAML: {errors:?}\n{text}"))?;
    let instance = document.root().map_or(Json::Null, to_json);
    let (mine, theirs) = (ours(text), their_paths(&instance));
    if mine == theirs {
        return Ok(());
    }
    let reasons: Vec<String> = oracle()
        .iter_errors(&instance)
        .map(|e| format!("{} at `{}`", e, e.instance_path()))
        .collect();
    Err(format!(
        "ours at {mine:?}, jsonschema at {theirs:?} ({reasons:?})\n{text}"
    ))
}

// ── Generated artifacts: a valid tree, then mutations ───────────────────────

/// A YAML tree written in flow style: `Raw` is a plain scalar written as is
/// (so `2.0`, `~`, `yes`, `0x1` reach the core schema), `Str` a quoted string.
#[derive(Debug, Clone)]
enum Y {
    Raw(&'static str),
    Str(String),
    Seq(Vec<Y>),
    Map(Vec<(String, Y)>),
}

fn s(text: &str) -> Y {
    Y::Str(text.to_owned())
}

fn map(entries: Vec<(&str, Y)>) -> Y {
    Y::Map(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn render(tree: &Y, out: &mut String) {
    match tree {
        Y::Raw(text) => out.push_str(text),
        Y::Str(text) => out.push_str(&serde_json::to_string(text).unwrap()),
        Y::Seq(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render(item, out);
            }
            out.push(']');
        }
        Y::Map(entries) => {
            out.push('{');
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(key).unwrap());
                out.push_str(": ");
                render(value, out);
            }
            out.push('}');
        }
    }
}

/// Top level in block style (one key per line), the rest in flow style.
fn text_of(tree: &Y) -> String {
    let mut out = String::new();
    match tree {
        Y::Map(entries) => {
            for (key, value) in entries {
                out.push_str(&serde_json::to_string(key).unwrap());
                out.push_str(": ");
                render(value, &mut out);
                out.push('\n');
            }
        }
        other => {
            render(other, &mut out);
            out.push('\n');
        }
    }
    out
}

fn pick<T: Clone>(choice: &prop::sample::Index, from: &[T]) -> T {
    from[choice.index(from.len())].clone()
}

/// A small valid artifact; every optional key is sometimes present.
fn valid_tree() -> impl Strategy<Value = Y> {
    let capability = (0usize..3, any::<bool>()).prop_map(|(i, described)| {
        let mut entries = vec![("id", s(["crm.contact.read", "a", "metrics.dashboard-view"][i]))];
        if described {
            entries.push(("description", s("free text")));
        }
        map(entries)
    });
    let transport = prop_oneof![
        any::<bool>().prop_map(|with_args| {
            let mut entries = vec![("kind", s("mcp-stdio")), ("command", s("server"))];
            if with_args {
                entries.push(("args", Y::Seq(vec![s("--x"), s("")])));
            }
            map(entries)
        }),
        Just(map(vec![
            ("kind", s("mcp-http")),
            ("url", s("https://h.example/mcp"))
        ])),
    ];
    let tool = (0usize..2).prop_map(|i| map(vec![("name", s(["get", "a__b"][i])), ("capability", s("a"))]));
    let upstream = (transport, prop::collection::vec(tool, 0..3)).prop_map(|(transport, tools)| {
        map(vec![
            ("id", s("crm")),
            ("transport", transport),
            ("tools", Y::Seq(tools)),
        ])
    });
    let account = prop::option::of(any::<bool>()).prop_map(|disabled| {
        let mut entries = vec![("id", s("acct"))];
        if let Some(flag) = disabled {
            entries.push(("disabled", Y::Raw(if flag { "true" } else { "false" })));
        }
        entries.push(("secret", map(vec![("ref", s("vault://secret/x#token"))])));
        map(entries)
    });
    let issuer = (0usize..3, prop::collection::vec(any::<bool>(), 5)).prop_map(|(kind, optional)| {
        let mut entries = vec![
            ("id", s("corp")),
            ("kind", s(["oidc", "static-key", "mtls"][kind])),
        ];
        let extras: [(&str, Y); 5] = [
            (
                "discovery",
                s("https://login.example/.well-known/openid-configuration"),
            ),
            ("audience", s("gw")),
            ("subject", s("runner")),
            ("secret", map(vec![("ref", s("env://KEY"))])),
            (
                "attributes",
                map(vec![("team", s("claim:team")), ("a/b", s("dn:OU"))]),
            ),
        ];
        for (present, extra) in optional.into_iter().zip(extras) {
            if present {
                entries.push(extra);
            }
        }
        map(entries)
    });
    let grant = (any::<bool>(), 1usize..3, prop::option::of((0usize..3, 0usize..3))).prop_map(
        |(selected, n, limits)| {
            let mut to = vec![("issuer", s("corp"))];
            if selected {
                to.push(("attributes", map(vec![("team", s("a"))])));
            }
            let mut entries = vec![
                ("to", map(to)),
                ("capabilities", Y::Seq(vec![s("a"); n])),
                ("using", s("acct")),
            ];
            if let Some((calls, per)) = limits {
                entries.push((
                    "limits",
                    map(vec![
                        ("calls", Y::Raw(["0", "10", "600"][calls])),
                        ("per", s(["1h", "30s", "7d"][per])),
                    ]),
                ));
            }
            map(entries)
        },
    );
    (
        prop::collection::vec(capability, 0..3),
        prop::option::of(prop::collection::vec(upstream, 0..2)),
        prop::collection::vec(account, 0..3),
        prop::collection::vec(issuer, 0..3),
        prop::collection::vec(grant, 0..3),
    )
        .prop_map(|(capabilities, upstreams, accounts, issuers, grants)| {
            let mut entries = vec![("version", Y::Raw("1")), ("capabilities", Y::Seq(capabilities))];
            if let Some(upstreams) = upstreams {
                entries.push(("upstreams", Y::Seq(upstreams)));
            }
            entries.push(("accounts", Y::Seq(accounts)));
            entries.push(("principals", map(vec![("issuers", Y::Seq(issuers))])));
            entries.push(("grants", Y::Seq(grants)));
            map(entries)
        })
}

/// Values on both sides of each field's rule, chosen by the field's name.
fn candidates(field: &str) -> Vec<Y> {
    let strings = |items: &[&str]| items.iter().map(|t| s(t)).collect::<Vec<Y>>();
    match field {
        "id" | "issuer" | "using" => strings(&[
            "crm",
            "9a",
            "a--b-",
            "Crm",
            "-a",
            "a_b",
            "a.b",
            "",
            "a b",
            "é",
            "crm.contact.read",
        ]),
        "capability" | "capabilities" => strings(&[
            "crm.contact.read",
            "metrics.dashboard-view",
            "a",
            "crm..read",
            ".x",
            "x.",
            "a_b",
            "A.b",
            "a.-b",
            "",
        ]),
        "ref" => strings(&[
            "env://X",
            "oauth+https://h/t?x=1",
            "a+b.c-d://x",
            "ENV://X",
            "env:X",
            "env://",
            "env://\nx",
            "env://\u{2028}x",
            "env://x\ny",
            "1a://x",
            "e_v://x",
            "://x",
        ]),
        "url" | "discovery" => strings(&[
            "https://h.example/mcp",
            "urn:isbn:0451450523",
            "a:",
            "HTTP://X",
            "/relative",
            "not a uri",
            "https://exämple.net/",
            "http://[::1",
            "https://h/ p",
            "a:b%zz",
            "",
            "https://h:port/",
        ]),
        "kind" => strings(&[
            "oidc",
            "static-key",
            "mtls",
            "mcp-stdio",
            "mcp-http",
            "OIDC",
            "static_key",
            "",
        ]),
        "calls" => vec![
            Y::Raw("0"),
            Y::Raw("2.0"),
            Y::Raw("-1"),
            Y::Raw("2.5"),
            Y::Raw("1e3"),
            Y::Raw("-0.0"),
            Y::Raw("0x10"),
            Y::Raw("9007199254740993"),
            Y::Raw("99999999999999999999999999999999999999999"),
            s("3"),
            Y::Raw("-1.0"),
            Y::Raw("-1.5"),
        ],
        "per" => vec![
            s("1h"),
            s("30s"),
            s("60m"),
            s("7d"),
            s("0s"),
            s("1h30m"),
            s("10ms"),
            s("1w"),
            s("01m"),
            s("1H"),
            s(" 1h"),
            s("1h "),
            s("h"),
            s(""),
            s("é"),
            s("1é"),
            Y::Raw("5"),
            Y::Raw("1h"),
        ],
        "version" => vec![
            Y::Raw("1"),
            Y::Raw("1.0"),
            Y::Raw("1e0"),
            Y::Raw("0x1"),
            Y::Raw("0o1"),
            Y::Raw("2"),
            Y::Raw("true"),
            s("1"),
            Y::Raw("+1"),
        ],
        "command" | "name" | "subject" => strings(&["", "c", "a__b", " "]),
        "args" => vec![
            Y::Seq(vec![]),
            Y::Seq(vec![s("x")]),
            Y::Seq(vec![Y::Raw("1")]),
            s("--x"),
            Y::Seq(vec![Y::Raw("~")]),
        ],
        "disabled" => vec![
            Y::Raw("true"),
            Y::Raw("false"),
            Y::Raw("yes"),
            Y::Raw("off"),
            s("false"),
            Y::Raw("0"),
            Y::Raw("True"),
        ],
        "description" | "audience" => vec![s("x"), s(""), Y::Raw("3"), Y::Raw("~"), Y::Raw("no")],
        "transport" => vec![
            map(vec![("kind", s("mcp-stdio"))]),
            map(vec![("kind", s("mcp-stdio")), ("command", s(""))]),
            map(vec![
                ("kind", s("mcp-stdio")),
                ("command", s("c")),
                ("args", Y::Seq(vec![Y::Raw("1")])),
            ]),
            map(vec![
                ("kind", s("mcp-stdio")),
                ("command", s("c")),
                ("url", s("https://x")),
            ]),
            map(vec![("kind", s("mcp-http")), ("command", s("c"))]),
            map(vec![("kind", s("mcp-http")), ("url", s("not a uri"))]),
            map(vec![
                ("kind", s("mcp-http")),
                ("url", s("https://x")),
                ("args", Y::Seq(vec![])),
            ]),
            map(vec![("kind", s("other")), ("url", s("https://x"))]),
            map(vec![("command", s("c"))]),
            map(vec![]),
            s("stdio"),
            Y::Raw("~"),
        ],
        "attributes" => vec![
            map(vec![]),
            map(vec![("team", s(""))]),
            map(vec![("team", Y::Raw("3"))]),
            map(vec![("team", Y::Raw("true"))]),
            map(vec![("team", Y::Raw("~"))]),
            map(vec![("", s("x")), ("~/", s("y"))]),
            Y::Seq(vec![]),
        ],
        "limits" => vec![
            map(vec![("calls", Y::Raw("1"))]),
            map(vec![("per", s("1h"))]),
            map(vec![]),
        ],
        "secret" => vec![
            s("env://X"),
            map(vec![]),
            map(vec![("ref", s("env://X")), ("extra", Y::Raw("1"))]),
        ],
        "principals" => vec![map(vec![]), map(vec![("issuers", map(vec![]))])],
        "to" => vec![map(vec![]), map(vec![("attributes", map(vec![]))])],
        _ => Vec::new(),
    }
}

/// Values of the wrong type for almost anything.
fn wrong_types() -> Vec<Y> {
    vec![
        Y::Raw("~"),
        Y::Raw("true"),
        Y::Raw("1"),
        Y::Raw("1.5"),
        s("s"),
        Y::Seq(vec![]),
        Y::Map(vec![]),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every node's path, with the name of the field it sits in.
fn paths(tree: &Y, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(here.clone());
    match tree {
        Y::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                here.push(Step::Index(i));
                paths(item, here, out);
                here.pop();
            }
        }
        Y::Map(entries) => {
            for (key, value) in entries {
                here.push(Step::Key(key.clone()));
                paths(value, here, out);
                here.pop();
            }
        }
        Y::Raw(_) | Y::Str(_) => {}
    }
}

fn node_at<'t>(tree: &'t mut Y, path: &[Step]) -> &'t mut Y {
    path.iter().fold(tree, |node, step| match (node, step) {
        (Y::Seq(items), Step::Index(i)) => &mut items[*i],
        (Y::Map(entries), Step::Key(key)) => {
            &mut entries.iter_mut().find(|(k, _)| k == key).expect("path exists").1
        }
        _ => unreachable!("paths are taken from the tree"),
    })
}

/// The field a node belongs to: its key, or its sequence's key.
fn field_of(path: &[Step]) -> String {
    path.iter()
        .rev()
        .find_map(|step| match step {
            Step::Key(key) => Some(key.clone()),
            Step::Index(_) => None,
        })
        .unwrap_or_default()
}

/// One mutation: replace a node by a field candidate or a wrong type, remove
/// it from its parent, or add an extra key / item to it.
#[derive(Debug, Clone)]
struct Mutation {
    node: prop::sample::Index,
    kind: u8,
    choice: prop::sample::Index,
}

const EXTRA_KEYS: [&str; 8] = ["extra", "<<", "Id", "", "description", "args", "url", "disabled"];

fn apply(tree: &mut Y, mutation: &Mutation) {
    let mut all = Vec::new();
    paths(tree, &mut Vec::new(), &mut all);
    let path = pick(&mutation.node, &all);
    match mutation.kind % 4 {
        0 | 1 => {
            let field = field_of(&path);
            let mut options = if mutation.kind % 4 == 0 {
                candidates(&field)
            } else {
                Vec::new()
            };
            if options.is_empty() {
                options = wrong_types();
            }
            *node_at(tree, &path) = pick(&mutation.choice, &options);
        }
        2 => remove_at(tree, &path),
        _ => extend_at(tree, &path, mutation.choice.index(EXTRA_KEYS.len())),
    }
}

/// Removes a node from its parent (the root stays).
fn remove_at(tree: &mut Y, path: &[Step]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match (node_at(tree, parent), last) {
        (Y::Seq(items), Step::Index(i)) => {
            items.remove(*i);
        }
        (Y::Map(entries), Step::Key(key)) => entries.retain(|(k, _)| k != key),
        _ => {}
    }
}

/// Gives an object one more key (`EXTRA_KEYS[choice]`, unless present), or a
/// sequence one more item (a copy of its first, or a wrong type).
fn extend_at(tree: &mut Y, path: &[Step], choice: usize) {
    match node_at(tree, path) {
        Y::Map(entries) => {
            let key = EXTRA_KEYS[choice % EXTRA_KEYS.len()];
            if !entries.iter().any(|(k, _)| k == key) {
                entries.push((key.to_owned(), s("x")));
            }
        }
        Y::Seq(items) => {
            let wrong = wrong_types();
            let item = items
                .first()
                .cloned()
                .unwrap_or_else(|| wrong[choice % wrong.len()].clone());
            items.push(item);
        }
        _ => {}
    }
}

fn mutated_tree() -> impl Strategy<Value = Y> {
    let mutation = (
        any::<prop::sample::Index>(),
        any::<u8>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(node, kind, choice)| Mutation { node, kind, choice });
    (valid_tree(), prop::collection::vec(mutation, 0..4)).prop_map(|(mut tree, mutations)| {
        for mutation in &mutations {
            apply(&mut tree, mutation);
        }
        tree
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn valid_trees_are_valid_for_both(tree in valid_tree()) {
        let text = text_of(&tree);
        prop_assert!(!ours(&text), "{}", text);
        property_agrees(&text, our_paths).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn ours_agrees_with_jsonschema_near_the_boundary(tree in mutated_tree()) {
        property_agrees(&text_of(&tree), our_paths).map_err(TestCaseError::fail)?;
    }

    /// Our diagnostics never repeat a (path, message) pair, and are sorted
    /// deeper-first.
    #[test]
    fn diagnostics_are_deduplicated_and_deeper_first(tree in mutated_tree()) {
        let text = text_of(&tree);
        let result = compile(text.as_bytes(), None);
        let schema: Vec<_> = result.diagnostics.iter().filter(|d| d.code == Code::SchemaViolation).collect();
        let mut seen = std::collections::HashSet::new();
        for d in &schema {
            prop_assert!(seen.insert((&d.path, &d.message)), "repeated {:?}\n{}", d, text);
        }
        let depths: Vec<usize> = schema.iter().map(|d| depth(&d.path)).collect();
        prop_assert!(depths.windows(2).all(|w| w[0] >= w[1]), "{:?}\n{}", depths, text);
    }

    /// `format: uri` as we check it and as `jsonschema` does.
    #[test]
    fn uri_formats_agree(pieces in prop::collection::vec(prop::sample::select(&[
        "https", "http", "urn", "a", "Z", "+", "-", ".", ":", "//", "/", "?", "#", "@", "[", "]", "::1", "%", "%20", "%zz", " ", "é", "x", "1", "80", "!", "\n",
    ][..]), 0..8)) {
        let text = pieces.concat();
        let format = jsonschema::options()
            .with_draft(Draft::Draft202012)
            .should_validate_formats(true)
            .build(&json!({ "type": "string", "format": "uri" }))
            .unwrap();
        prop_assert_eq!(is_uri(&text), format.is_valid(&json!(text)), "{:?}", text);
    }
}

fn depth(path: &str) -> usize {
    path.matches('/').count()
}

// ── The oracle itself can fail ──────────────────────────────────────────────

#[test]
fn a_validator_that_ignores_patterns_or_merges_keys_disagrees() {
    let ignores_patterns = |text: &str| {
        let mut paths = our_paths(text);
        let result = compile(text.as_bytes(), None);
        paths.retain(|path| {
            !result
                .diagnostics
                .iter()
                .any(|d| d.path == *path && d.message.contains("pattern"))
        });
        paths
    };
    // Control for granularity: one diagnostic per object instead of one per key.
    let one_per_object = |text: &str| {
        let mut paths = our_paths(text);
        paths.dedup();
        paths
    };
    let extra_keys =
        "version: 1\ncapabilities: [{ id: a, x: 1, y: 2 }]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
    assert!(property_agrees(extra_keys, our_paths).is_ok());
    assert!(property_agrees(extra_keys, one_per_object).is_err());
    let text =
        "version: 1\ncapabilities: [{ id: A.b }]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
    assert!(property_agrees(text, our_paths).is_ok());
    assert!(property_agrees(text, ignores_patterns).is_err());
}

#[test]
fn without_format_assertion_a_bad_uri_would_pass() {
    let lenient = jsonschema::options()
        .with_draft(Draft::Draft202012)
        .should_validate_formats(false)
        .build(&schema())
        .unwrap();
    let text = "version: 1\ncapabilities: []\naccounts: []\nprincipals: { issuers: [{ id: corp, kind: oidc, discovery: not a uri }] }\ngrants: []\n";
    let document = Document::parse(text).unwrap();
    let instance = to_json(document.root().unwrap());
    assert!(lenient.is_valid(&instance));
    assert!(!oracle().is_valid(&instance));
    assert!(ours(text));
}

// ── The printed schema ──────────────────────────────────────────────────────

#[test]
fn the_printed_schema_is_valid_draft_2020_12_with_format_assertion() {
    let schema = schema();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(
        schema["$vocabulary"]["https://json-schema.org/draft/2020-12/vocab/format-assertion"],
        true
    );
    if let Err(error) = jsonschema::meta::validate(&schema) {
        panic!("not a valid draft 2020-12 schema: {error}");
    }
    // Control: the meta-schema check does reject a broken schema.
    let mut broken = schema.clone();
    broken["properties"]["grants"]["items"]["properties"]["capabilities"]["minItems"] = json!(-1);
    assert!(jsonschema::meta::validate(&broken).is_err());
}

// ── The rule JSON Schema cannot express: windows above 2^53 ms ──────────────

fn with_per(per: &str) -> String {
    format!("version: 1\ncapabilities: []\naccounts: []\nprincipals: {{ issuers: [] }}\ngrants:\n  - to: {{ issuer: a }}\n    capabilities: [x]\n    using: a\n    limits: {{ calls: 1, per: \"{per}\" }}\n")
}

/// The schema violations of an artifact as (path, line, column).
fn violations(text: &str) -> Vec<(String, usize, usize)> {
    compile(text.as_bytes(), None)
        .diagnostics
        .into_iter()
        .filter(|d| d.code == Code::SchemaViolation)
        .map(|d| {
            let at = d.position.map_or((0, 0), |p| (p.line, p.column));
            (d.path, at.0, at.1)
        })
        .collect()
}

#[test]
fn windows_longer_than_2_pow_53_ms_are_ours_alone() {
    // 2^53 ms = 9 007 199 254 740 992 ms = 104 249 991.37… days.
    for ok in ["104249991d", "9007199254740s", "150119987579m", "2501999792h"] {
        assert!(violations(&with_per(ok)).is_empty(), "{ok}");
        assert!(property_agrees(&with_per(ok), our_paths).is_ok());
    }
    for over in [
        "104249992d",
        "9007199254741s",
        "150119987580m",
        "2501999793h",
        "99999999999999999999999999999999999999999d",
    ] {
        assert_eq!(
            violations(&with_per(over)),
            [("/grants/0/limits/per".to_owned(), 9, 30)],
            "{over}"
        );
        // The published schema cannot say this: jsonschema accepts it.
        assert!(property_agrees(&with_per(over), our_paths).is_err(), "{over}");
    }
}

// ── Granularity, paths and order (ours, exact) ──────────────────────────────

/// An artifact whose sections can be replaced one at a time.
fn artifact(capabilities: &str, upstreams: &str, accounts: &str, grants: &str) -> String {
    format!("version: 1\ncapabilities: {capabilities}\n{upstreams}accounts: {accounts}\nprincipals: {{ issuers: [] }}\ngrants: {grants}\n")
}

/// (path, message) of every schema violation.
fn found(text: &str) -> Vec<(String, String)> {
    let result = compile(text.as_bytes(), None);
    let schema: Vec<_> = result
        .diagnostics
        .into_iter()
        .filter(|d| d.code == Code::SchemaViolation)
        .collect();
    assert!(schema.iter().all(|d| d.position.is_some()), "{schema:#?}");
    schema.into_iter().map(|d| (d.path, d.message)).collect()
}

#[track_caller]
fn check(text: &str, expected: &[(&str, &str)]) {
    let found = found(text);
    let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
    let wanted: Vec<&str> = expected.iter().map(|(p, _)| *p).collect();
    assert_eq!(paths, wanted, "{found:#?}");
    for ((_, message), (_, needle)) in found.iter().zip(expected) {
        assert!(message.contains(needle), "`{message}` should mention `{needle}`");
    }
    assert!(
        property_agrees(text, our_paths).is_ok(),
        "the oracle agrees that it is invalid"
    );
}

#[test]
fn one_diagnostic_per_failing_leaf_keyword() {
    check(
        &artifact("[{ id: 3 }]", "", "[]", "[]"),
        &[("/capabilities/0/id", "string")],
    );
    check(
        &artifact("[{ id: A_b }]", "", "[]", "[]"),
        &[("/capabilities/0/id", "pattern")],
    );
    check(
        &artifact(
            "[]",
            "",
            "[]",
            "[{ to: { issuer: a }, capabilities: [], using: a, limits: { calls: -1, per: 1h30m } }]",
        ),
        &[
            ("/grants/0/limits/calls", "0 or more"),
            ("/grants/0/limits/per", "1h30m"),
            ("/grants/0/capabilities", "at least one"),
        ],
    );
    check(
        &artifact(
            "[]",
            "",
            "[]",
            "[{ to: { issuer: a }, capabilities: [x], using: a, limits: { calls: 2.5, per: 1h } }]",
        ),
        &[("/grants/0/limits/calls", "integer")],
    );
    // Two leaf keywords fail on one value: two diagnostics, not de-duplicated.
    check(
        &artifact(
            "[]",
            "",
            "[]",
            "[{ to: { issuer: a }, capabilities: [x], using: a, limits: { calls: -1.5, per: 1h } }]",
        ),
        &[
            ("/grants/0/limits/calls", "integer"),
            ("/grants/0/limits/calls", "0 or more"),
        ],
    );
    check(
        &artifact("[]", "", "[{ id: a, secret: env://X }]", "[]"),
        &[("/accounts/0/secret", "object")],
    );
}

#[test]
fn integral_floats_are_integers_and_version_is_the_number_one() {
    assert!(found(&artifact(
        "[]",
        "",
        "[]",
        "[{ to: { issuer: a }, capabilities: [x], using: a, limits: { calls: 2.0, per: 1h } }]"
    ))
    .is_empty());
    assert!(found(&artifact("[]", "", "[]", "[]").replace("version: 1", "version: 1.0")).is_empty());
    check(
        &artifact("[]", "", "[]", "[]").replace("version: 1", "version: \"1\""),
        &[("/version", "number 1")],
    );
}

#[test]
fn required_and_additional_properties_are_reported_at_the_object_per_key() {
    check(
        &artifact("[{ description: x, extra: 1, more: 2 }]", "", "[]", "[]"),
        &[
            ("/capabilities/0", "`id`"),
            ("/capabilities/0", "`extra`"),
            ("/capabilities/0", "`more`"),
        ],
    );
    check(
        "version: 1\ncapabilities: []\naccounts: []\ngrants: []\nx: 1\n",
        &[("", "`principals`"), ("", "`x`")],
    );
}

#[test]
fn a_bad_transport_is_one_diagnostic_at_the_transport() {
    for transport in [
        "{ kind: mcp-stdio, command: \"\", args: [1], url: 3 }",
        "{ kind: mcp-http, url: not a uri }",
        "{ kind: mcp-http, command: c }",
        "{}",
        "stdio",
    ] {
        let upstreams = format!("upstreams: [{{ id: u, transport: {transport}, tools: [] }}]\n");
        check(
            &artifact("[]", &upstreams, "[]", "[]"),
            &[("/upstreams/0/transport", "transport")],
        );
    }
}

#[test]
fn deeper_paths_first_then_document_order() {
    // Accounts come before capabilities in this file: document order, not
    // the schema's order, breaks ties between equal depths.
    let text = "version: 1\naccounts: [{ id: B, secret: { ref: \"x\" } }]\ncapabilities: [{ id: C }]\nprincipals: { issuers: [] }\ngrants: [{ to: { issuer: a }, capabilities: [x], using: a, limits: { calls: x, per: 1h } }]\nextra: 1\n";
    check(
        text,
        &[
            ("/accounts/0/secret/ref", "secret reference"),
            ("/grants/0/limits/calls", "integer"),
            ("/accounts/0/id", "identifier"),
            ("/capabilities/0/id", "capability id"),
            ("", "`extra`"),
        ],
    );
}

#[test]
fn an_aliased_invalid_node_is_reported_at_each_place_it_is_used() {
    // One node, two instance locations: two diagnostics, not one de-duplicated away.
    let text = "version: 1\ncapabilities: [&bad { id: A }, *bad]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
    check(
        text,
        &[
            ("/capabilities/0/id", "pattern"),
            ("/capabilities/1/id", "pattern"),
        ],
    );
}

// ── The generator is not vacuous ────────────────────────────────────────────

#[test]
fn mutated_artifacts_land_on_both_sides_of_the_boundary() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = mutated_tree();
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..400 {
        let tree = strategy.new_tree(&mut runner).unwrap().current();
        if ours(&text_of(&tree)) {
            invalid += 1;
        } else {
            valid += 1;
        }
    }
    assert!(valid >= 80 && invalid >= 80, "valid {valid}, invalid {invalid}");
}

// ── Every single mutation of one rich artifact ──────────────────────────────

/// A valid artifact with every optional key present somewhere.
fn rich_tree() -> Y {
    map(vec![
        ("version", Y::Raw("1")),
        (
            "capabilities",
            Y::Seq(vec![map(vec![("id", s("a")), ("description", s("d"))])]),
        ),
        (
            "upstreams",
            Y::Seq(vec![
                map(vec![
                    ("id", s("crm")),
                    (
                        "transport",
                        map(vec![
                            ("kind", s("mcp-stdio")),
                            ("command", s("c")),
                            ("args", Y::Seq(vec![s("x")])),
                        ]),
                    ),
                    (
                        "tools",
                        Y::Seq(vec![map(vec![("name", s("t")), ("capability", s("a"))])]),
                    ),
                ]),
                map(vec![
                    ("id", s("web")),
                    (
                        "transport",
                        map(vec![("kind", s("mcp-http")), ("url", s("https://h/mcp"))]),
                    ),
                    ("tools", Y::Seq(vec![])),
                ]),
            ]),
        ),
        (
            "accounts",
            Y::Seq(vec![map(vec![
                ("id", s("acct")),
                ("disabled", Y::Raw("false")),
                ("secret", map(vec![("ref", s("env://X"))])),
            ])]),
        ),
        (
            "principals",
            map(vec![(
                "issuers",
                Y::Seq(vec![map(vec![
                    ("id", s("corp")),
                    ("kind", s("oidc")),
                    ("discovery", s("https://login/.well-known/openid-configuration")),
                    ("audience", s("gw")),
                    ("subject", s("s")),
                    ("secret", map(vec![("ref", s("env://K"))])),
                    ("attributes", map(vec![("team", s("claim:team"))])),
                ])]),
            )]),
        ),
        (
            "grants",
            Y::Seq(vec![map(vec![
                (
                    "to",
                    map(vec![
                        ("issuer", s("corp")),
                        ("attributes", map(vec![("team", s("a"))])),
                    ]),
                ),
                ("capabilities", Y::Seq(vec![s("a")])),
                ("using", s("acct")),
                ("limits", map(vec![("calls", Y::Raw("1")), ("per", s("1h"))])),
            ])]),
        ),
    ])
}

/// Each node replaced by each candidate of its field and each wrong type,
/// each node removed, each object given each extra key: one at a time.
#[test]
fn every_single_mutation_of_a_rich_artifact_agrees() {
    let base = rich_tree();
    assert!(!ours(&text_of(&base)));
    let mut all = Vec::new();
    paths(&base, &mut Vec::new(), &mut all);
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in &all {
        let mut options = candidates(&field_of(path));
        options.extend(wrong_types());
        let mut variants: Vec<Y> = options
            .into_iter()
            .map(|option| {
                let mut tree = base.clone();
                *node_at(&mut tree, path) = option;
                tree
            })
            .collect();
        let mut removed = base.clone();
        remove_at(&mut removed, path);
        variants.push(removed);
        for choice in 0..EXTRA_KEYS.len() {
            let mut extended = base.clone();
            extend_at(&mut extended, path, choice);
            variants.push(extended);
        }
        for tree in variants {
            checked += 1;
            if let Err(error) = property_agrees(&text_of(&tree), our_paths) {
                failures.push(error);
            }
        }
    }
    assert!(checked > 1000, "{checked} mutations");
    assert!(
        failures.is_empty(),
        "{} disagreements, first: {}",
        failures.len(),
        failures[0]
    );
}
