//! Hostile input never crashes the compiler or the catalog loader
//! (docs/reference.md#parsing: "Never a crash, never unbounded memory or recursion").
//!
//! Generated: arbitrary bytes, YAML-ish text from a grammar of YAML's
//! punctuation (indentation, `-`, `:`, flow brackets, quotes, anchors,
//! aliases, tags, document markers, merge keys), and the example artifact
//! with such tokens spliced in. Explicit: the classic attacks, each with the
//! diagnostic and position the spec asks for.

use capgate_core::policy::document::Document;
use capgate_core::policy::{compile, has_errors, load_catalog, CatalogError, Code, Compilation, Diagnostic};
use proptest::prelude::*;

const EXAMPLE: &str = include_str!("../../examples/policy.yaml");

/// What every compilation must satisfy, whatever its input.
fn well_formed(result: &Compilation) -> Result<(), String> {
    if result.policy.is_some() == has_errors(&result.diagnostics) {
        return Err("a policy exists exactly when no diagnostic is an error".into());
    }
    let syntax = result
        .diagnostics
        .iter()
        .filter(|d| d.code == Code::YamlSyntax)
        .count();
    if syntax > 0 {
        if syntax != result.diagnostics.len() || result.document.is_some() {
            return Err("a YAML error stops everything else".into());
        }
        for d in &result.diagnostics {
            let at = d.position.ok_or("a YAML error has a position")?;
            if !d.path.is_empty() || at.line == 0 || at.column == 0 {
                return Err(format!("bad yaml_syntax diagnostic {d:?}"));
            }
        }
    }
    for d in &result.diagnostics {
        if let Some(at) = d.position {
            if at.line == 0 || at.column == 0 {
                return Err(format!("positions are 1-based: {d:?}"));
            }
        }
    }
    Ok(())
}

fn survive(bytes: &[u8]) -> Result<(), TestCaseError> {
    let result = compile(bytes, None);
    well_formed(&result).map_err(TestCaseError::fail)?;
    if let Err(CatalogError::Syntax { position, .. }) = load_catalog(bytes) {
        prop_assert!(position.line > 0 && position.column > 0);
    }
    Ok(())
}

/// YAML's structural vocabulary, and a few ordinary words.
const TOKENS: &[&str] = &[
    "\n",
    "\n",
    "  ",
    "    ",
    "- ",
    "-",
    ":",
    ": ",
    "? ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    "\"",
    "'",
    "&a ",
    "&b ",
    "*a",
    "*b",
    "!x ",
    "!!str ",
    "!!int ",
    "!!map ",
    "! ",
    "!<tag:x> ",
    "---\n",
    "...\n",
    "<<: ",
    "#c",
    "|\n",
    ">-\n",
    "\t",
    "%YAML 1.2\n",
    "%TAG ! tag:x,2000:\n",
    "~",
    "version",
    "1",
    "2.0",
    "-1",
    "yes",
    "grants",
    "capabilities",
    "id",
    "x",
    "\\",
    "\r\n",
    "\u{feff}",
    "\u{2028}",
    "é",
    "@",
    "`",
    "%",
];

fn yamlish() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..80).prop_map(|tokens| tokens.concat())
}

/// The example with up to four token runs spliced in at random places (a
/// valid artifact broken in small, YAML-shaped ways).
fn mutated_example() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            0usize..40,
            prop::collection::vec(prop::sample::select(TOKENS), 0..4),
        ),
        1..4,
    )
    .prop_map(|edits| {
        let mut text: Vec<char> = EXAMPLE.chars().collect();
        for (at, delete, tokens) in edits {
            let start = at.index(text.len() + 1);
            let end = (start + delete).min(text.len());
            text.splice(start..end, tokens.concat().chars());
        }
        text.into_iter().collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        survive(&bytes)?;
    }

    #[test]
    fn yaml_shaped_text(text in yamlish()) {
        survive(text.as_bytes())?;
    }

    #[test]
    fn a_broken_example(text in mutated_example()) {
        survive(text.as_bytes())?;
    }
}

// ── Explicit attacks ────────────────────────────────────────────────────────

/// The single diagnostic of a compilation, as (code, path, line, column).
fn only(bytes: &[u8]) -> (&'static str, String, usize, usize) {
    let result = compile(bytes, None);
    well_formed(&result).unwrap();
    let [d]: [Diagnostic; 1] = result
        .diagnostics
        .try_into()
        .unwrap_or_else(|all: Vec<Diagnostic>| panic!("expected one diagnostic, got {all:#?}"));
    let at = d.position.expect("a position");
    (d.code.as_str(), d.path, at.line, at.column)
}

fn syntax_at(line: usize, column: usize) -> (&'static str, String, usize, usize) {
    ("yaml_syntax", String::new(), line, column)
}

#[test]
fn billion_laughs_stops_at_the_alias_that_crosses_the_limit() {
    // b holds 9 expansions, c 9 × (1 + 9) = 90: 99 so far. The first `*c`
    // costs 1 + 90 and contains the 101st expansion.
    let bomb = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n\
                b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
                d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
    assert_eq!(only(bomb.as_bytes()), syntax_at(4, 8));
    assert!(
        matches!(load_catalog(bomb.as_bytes()), Err(CatalogError::Syntax { position, .. }) if position.line == 4)
    );
}

#[test]
fn exactly_one_hundred_expansions_are_fine() {
    let mut text = String::from("a: &a x\nl:\n");
    text.push_str(&"  - *a\n".repeat(100));
    assert!(compile(text.as_bytes(), None).document.is_some());
    text.push_str("  - *a\n");
    assert_eq!(only(text.as_bytes()), syntax_at(103, 5));
}

#[test]
fn ten_thousand_nested_flow_collections() {
    let sequences = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    // Refused at the 256th bracket (docs/decisions/0002: the parser's own
    // flow limit is one level below ours).
    assert_eq!(only(sequences.as_bytes()), syntax_at(1, 256));
    let mappings = format!("a: {}x{}", "{a: ".repeat(10_000), "}".repeat(10_000));
    let (code, _, line, column) = only(mappings.as_bytes());
    assert_eq!((code, line), ("yaml_syntax", 1));
    assert!(
        column <= 4 + 4 * 256,
        "refused near the limit, not at the end: column {column}"
    );
    assert!(matches!(
        load_catalog(sequences.as_bytes()),
        Err(CatalogError::Syntax { .. })
    ));
}

#[test]
fn deep_block_nesting_is_bounded_at_256() {
    let ok = format!("{}x\n", "- ".repeat(256));
    assert!(compile(ok.as_bytes(), None).document.is_some());
    let deep = format!("{}x\n", "- ".repeat(10_000));
    assert_eq!(only(deep.as_bytes()), syntax_at(1, 2 * 256 + 1));
}

#[test]
fn nine_mebibytes_are_refused_at_line_one_column_one() {
    let big = format!("version: 1\n{}", "#".repeat(9 * 1024 * 1024));
    assert_eq!(only(big.as_bytes()), syntax_at(1, 1));
    assert!(
        matches!(load_catalog(big.as_bytes()), Err(CatalogError::Syntax { position, .. }) if position.line == 1 && position.column == 1)
    );
    // 8 MiB exactly is not over the limit: this one parses (and fails the schema).
    let mut limit = String::from("version: 1\n#");
    limit.push_str(&"x".repeat(8 * 1024 * 1024 - limit.len()));
    let result = compile(limit.as_bytes(), None);
    assert!(result.document.is_some());
    assert!(
        result.diagnostics.iter().all(|d| d.code == Code::SchemaViolation),
        "{:?}",
        result.diagnostics
    );
}

#[test]
fn invalid_utf8_is_reported_at_the_first_bad_byte() {
    assert_eq!(only(b"version: 1\ncapabilities: [\xc3\x28]\n"), syntax_at(2, 16));
    assert_eq!(only(b"\xff"), syntax_at(1, 1));
    // Columns count characters: `é` before the bad byte is one column.
    assert_eq!(
        only(
            "a: é"
                .as_bytes()
                .iter()
                .chain(b"\x80")
                .copied()
                .collect::<Vec<u8>>()
                .as_slice()
        ),
        syntax_at(1, 5)
    );
    assert!(matches!(
        load_catalog(b"tools: \xfe"),
        Err(CatalogError::Syntax { .. })
    ));
}

#[test]
fn duplicate_keys_are_reported_at_the_second_key() {
    assert_eq!(
        only(b"version: 1\ncapabilities: []\nversion: 1\n"),
        syntax_at(3, 1)
    );
    // Keys are compared as JSON strings: `1` and `1.0` collide.
    assert_eq!(only(b"a: { 1: x, 1.0: y }\n"), syntax_at(1, 12));
    assert!(matches!(
        load_catalog(b"tools: []\ntools: []\n"),
        Err(CatalogError::Syntax { .. })
    ));
}

#[test]
fn a_second_document_is_reported_at_its_marker() {
    assert_eq!(only(b"version: 1\n---\nversion: 1\n"), syntax_at(2, 1));
    assert!(matches!(
        load_catalog(b"tools: []\n---\ntools: []\n"),
        Err(CatalogError::Syntax { .. })
    ));
}

#[test]
fn an_unknown_tag_is_reported_at_its_node() {
    assert_eq!(only(b"version: !foo 1\n"), syntax_at(1, 15));
    assert_eq!(only(b"version: 1\ncapabilities: !foo [a]\n"), syntax_at(2, 20));
    // YAML 1.1 tags are not the core schema's either.
    assert_eq!(only(b"a: !!binary aGVsbG8=\n").0, "yaml_syntax");
}

#[test]
fn a_merge_key_is_an_ordinary_key_the_schema_rejects() {
    let text = "version: 1\ncapabilities:\n  - &base { id: a }\n  - <<: *base\n    id: b\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n";
    let result = compile(text.as_bytes(), None);
    let found: Vec<_> = result
        .diagnostics
        .iter()
        .map(|d| (d.code.as_str(), d.path.as_str()))
        .collect();
    assert_eq!(found, [("schema_violation", "/capabilities/1")]);
    let d = &result.diagnostics[0];
    assert!(
        d.message.contains("<<"),
        "the message names the key: {}",
        d.message
    );
    assert_eq!(d.position.map(|p| (p.line, p.column)), Some((4, 5)));
}

#[test]
fn a_recursive_alias_is_reported_at_the_alias() {
    assert_eq!(only(b"a: &a [*a]\n"), syntax_at(1, 8));
    assert_eq!(only(b"a: &a\n  b: *a\n"), syntax_at(2, 6));
    let catalog = load_catalog(b"tools: [{upstream: a, name: b, inputSchema: &x {a: *x}}]\n");
    assert!(matches!(catalog, Err(CatalogError::Syntax { .. })), "{catalog:?}");
}

#[test]
fn an_alias_to_nothing_is_a_syntax_error() {
    assert_eq!(only(b"a: *nowhere\n").0, "yaml_syntax");
}

#[test]
fn a_non_ascii_duration_is_a_schema_violation_not_a_panic() {
    // Regression: splitting `é` before its last byte used to panic.
    let text = "version: 1\ncapabilities: []\naccounts: []\nprincipals: { issuers: [] }\ngrants:\n  - to: { issuer: a }\n    capabilities: [x]\n    using: a\n    limits: { calls: 1, per: \"é\" }\n";
    assert_eq!(
        only(text.as_bytes()),
        ("schema_violation", "/grants/0/limits/per".to_owned(), 9, 30)
    );
}

#[test]
fn empty_and_comment_only_documents_fail_the_schema_without_a_position() {
    for text in ["", "# nothing\n", "---\n", "...\n"] {
        let result = compile(text.as_bytes(), None);
        let found: Vec<_> = result
            .diagnostics
            .iter()
            .map(|d| (d.code.as_str(), d.path.as_str(), d.position))
            .collect();
        assert_eq!(found, [("schema_violation", "", None)], "{text:?}");
    }
}

/// YAML 1.2 §5.1: a stream holds only printable characters. The C0 controls
/// (tab and line breaks aside) are never printable, not even in a comment; a
/// byte order mark may open the stream but never appear inside the document.
/// Each row is (text, where the error is).
#[test]
fn characters_yaml_1_2_does_not_allow() {
    let rows: &[(&str, (usize, usize))] = &[
        // C0 controls in comments: a whole-line one, an end-of-line one, after the document.
        ("# a\u{1}b\nversion: 1\n", (1, 4)),
        ("version: 1 # bell\u{7}\n", (1, 18)),
        ("version: 1\n# \u{1b}[31m\n", (2, 3)),
        // C0 controls in scalars, plain and quoted (quoting allows tab, not the others).
        ("a: x\u{0}y\n", (1, 5)),
        ("a: \"x\u{8}y\"\n", (1, 6)),
        // A byte order mark anywhere but at the very start of the stream.
        ("version: 1\n\u{feff}capabilities: []\n", (2, 1)),
        ("\u{feff}version: 1\n\u{feff}# again\n", (2, 1)),
        ("a: x\u{feff}y\n", (1, 5)),
        ("a:\n  - \u{feff}x\n", (2, 5)),
        // DEL and the C1 controls (NEL aside) are allowed inside quotes only.
        ("version: 1 # \u{7f}\n", (1, 14)),
        ("a: x\u{9b}y\n", (1, 5)),
    ];
    for (text, (line, column)) in rows {
        assert_eq!(only(text.as_bytes()), syntax_at(*line, *column), "{text:?}");
    }
}

#[test]
fn printable_characters_yaml_1_2_allows() {
    // Tabs in comments and quoted scalars, a leading byte order mark, and the
    // characters JSON allows inside quotes (a BOM, DEL and C1 among them).
    for text in [
        "# a\tcomment\nversion: 1\n",
        "\u{feff}version: 1\n",
        "\u{feff}# a comment\nversion: 1\n",
        "a: \"x\ty\"\n",
        "a: \"x\u{feff}y\"\n",
        "a: 'x\u{feff}y'\n",
        "a: \"x\u{7f}\u{85}\u{9f}y\"\n",
    ] {
        assert!(
            Document::parse(text).is_ok(),
            "{text:?}: {:?}",
            Document::parse(text)
        );
    }
}
