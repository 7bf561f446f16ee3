//! Where a pointer lands (docs/reference.md#pointers-and-positions): the start of the value node it
//! designates, one row per YAML shape. `check(text, pointer, expected)` with
//! `expected` as `line:column`, or `-` for no position (an empty value, or a
//! pointer to nothing).
//!
//! The rows that matter most are the block sequences written at their key's
//! indentation (`grants:` then `- to: …` on the next line, not indented), which
//! YAML allows and many editors produce: their position is their first `-`,
//! exactly as for an indented sequence, never the first key of the first item.

use capgate_core::policy::document::Document;

fn check(text: &str, pointer: &str, expected: &str) {
    let document = Document::parse(text).unwrap_or_else(|errors| panic!("{text:?}: {errors:?}"));
    let found = document
        .resolve(pointer)
        .map_or_else(|| "-".to_owned(), |p| format!("{}:{}", p.line, p.column));
    assert_eq!(found, expected, "`{pointer}` in {text:?}");
}

// ── Block sequences at their key's indentation ──────────────────────────────

#[test]
fn a_sequence_at_its_keys_indentation_starts_at_its_first_dash() {
    check("capabilities:\n- id: a\n- id: b\n", "/capabilities", "2:1");
    check("capabilities:\n- id: a\n- id: b\n", "/capabilities/0", "2:3");
    check("capabilities:\n- id: a\n- id: b\n", "/capabilities/1/id", "3:7");
}

#[test]
fn scalar_and_nested_items_at_the_keys_indentation() {
    check("a:\n- x\n- y\n", "/a", "2:1");
    check("a:\n- - x\n", "/a", "2:1");
    check("a:\n- - x\n", "/a/0", "2:3");
    check("a:\n-\n- y\n", "/a", "2:1");
    check("a:\n-\n- y\n", "/a/0", "-");
}

#[test]
fn an_unindented_sequence_inside_a_mapping() {
    check(
        "principals:\n  issuers:\n  - id: staff\n",
        "/principals/issuers",
        "3:3",
    );
    check(
        "principals:\n  issuers:\n  - id: staff\n",
        "/principals/issuers/0",
        "3:5",
    );
}

#[test]
fn comments_blank_lines_and_properties_before_the_first_dash() {
    check("a:\n# a comment\n\n- x\n", "/a", "4:1");
    check("a: &s\n- x\nb: *s\n", "/a", "2:1");
    check("a: !!seq\n- x\n", "/a", "2:1");
    check("a: &s # why\n- x\n", "/a", "2:1");
    check("a:\n- # the first item is below\n  x\n", "/a", "2:1");
    check("a:\n-   \t x\n", "/a", "2:1");
}

#[test]
fn indented_and_flow_sequences_are_unchanged() {
    check("a:\n  - x\n", "/a", "2:3");
    check("a: [x, y]\n", "/a", "1:4");
    check("- x\n- y\n", "", "1:1");
    check("a:\n- k: v\n  j: w\n", "/a/0/j", "3:6");
}

// ── Empty values ────────────────────────────────────────────────────────────

#[test]
fn an_empty_value_has_no_position_tagged_or_not() {
    check("secret:\nb: 1\n", "/secret", "-");
    check("secret: !!null\nb: 1\n", "/secret", "-");
    check("secret: &n !!null\nb: 1\n", "/secret", "-");
    check("a:\n- !!null\n- x\n", "/a/0", "-");
    // Written content has a position, whatever it resolves to.
    check("secret: !!null ~\n", "/secret", "1:16");
    check("secret: null\n", "/secret", "1:9");
    // An empty string is a value, not an absence: it starts at its tag.
    check("secret: !!str\nb: 1\n", "/secret", "1:9");
}
