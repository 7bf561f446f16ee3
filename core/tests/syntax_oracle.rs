//! The hand-written lexical matchers of `policy::syntax` against the spec's
//! regexes (docs/reference.md#identifiers-and-other-grammars), compiled with the `regex` crate, on
//! generated strings.
//!
//! The spec's regexes are ECMAScript. Two translations keep them faithful in
//! Rust: ECMAScript's `.` excludes the four line terminators (`\n`, `\r`,
//! U+2028, U+2029) while Rust's excludes only `\n`, so `.` becomes
//! `[^\n\r\u{2028}\u{2029}]`; and without the `m` flag `^`/`$` anchor at the
//! ends of the input in both engines, so they stay as written.

use capgate_core::policy::syntax::{
    is_capability_id, is_identifier, is_secret_ref, window_ms, CAPABILITY_ID_PATTERN, DURATION_PATTERN,
    IDENTIFIER_PATTERN, SECRET_REF_PATTERN,
};
use proptest::prelude::*;
use regex::Regex;

const ECMA_DOT: &str = r"[^\n\r\u{2028}\u{2029}]";

/// The spec's regex as Rust must read it: every `.` outside a character class
/// becomes ECMAScript's dot. (The spec's patterns have no escapes.)
fn ecma(pattern: &str) -> Regex {
    let mut translated = String::new();
    let mut in_class = false;
    for ch in pattern.chars() {
        match ch {
            '[' => in_class = true,
            ']' => in_class = false,
            _ => {}
        }
        if ch == '.' && !in_class {
            translated.push_str(ECMA_DOT);
        } else {
            translated.push(ch);
        }
    }
    Regex::new(&translated).expect("the spec's regex compiles")
}

/// Pieces that sit on the edges of the four grammars: every class member, its
/// neighbours (`A`, `_`, `/`, `:`), the four line terminators, a tab, a space,
/// non-ASCII letters and digits, and the multi-character tokens `://` and
/// unit suffixes.
const PIECES: &[&str] = &[
    "a", "z", "m", "s", "h", "d", "0", "1", "9", "-", ".", "+", "_", "A", "Z", ":", "/", "://", "\n", "\r",
    "\u{2028}", "\u{2029}", "\t", " ", "é", "ß", "٣", "ms", "w", "~", "#",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..10).prop_map(|pieces| pieces.concat())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn the_translation_of_dot_is_ecmascripts() {
    let secret = ecma(SECRET_REF_PATTERN);
    assert_eq!(secret.as_str(), format!("^[a-z][a-z0-9+.-]*://{ECMA_DOT}+"));
    assert_eq!(
        ecma(CAPABILITY_ID_PATTERN).as_str(),
        "^[a-z0-9]+([.-][a-z0-9]+)*$"
    );
    // Control: a naive translation disagrees with the spec on a line terminator.
    let naive = Regex::new(SECRET_REF_PATTERN).unwrap();
    assert!(naive.is_match("env://\u{2028}x"));
    assert!(!secret.is_match("env://\u{2028}x"));
    assert!(!is_secret_ref("env://\u{2028}x"));
}

#[test]
fn the_spec_table_examples() {
    for (valid, invalid, matcher) in [
        (
            &["crm", "9a", "a--b-"][..],
            &["Crm", "-a", "a_b", "a.b"][..],
            is_identifier as fn(&str) -> bool,
        ),
        (
            &["crm.contact.read", "metrics.dashboard-view"],
            &["crm..read", ".x", "x.", "a_b", "A.b"],
            is_capability_id,
        ),
        (
            &["env://X", "oauth+https://h/t?…"],
            &["ENV://X", "env:X", "env://"],
            is_secret_ref,
        ),
    ] {
        for text in valid {
            assert!(matcher(text), "{text:?} is valid");
        }
        for text in invalid {
            assert!(!matcher(text), "{text:?} is invalid");
        }
    }
    for invalid in ["1h30m", "10ms", "1w", "0s"] {
        assert_eq!(window_ms(invalid), None, "{invalid}");
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn identifiers_agree(text in text()) {
        prop_assert_eq!(is_identifier(&text), ecma(IDENTIFIER_PATTERN).is_match(&text), "{:?}", text);
    }

    #[test]
    fn capability_ids_agree(text in text()) {
        prop_assert_eq!(is_capability_id(&text), ecma(CAPABILITY_ID_PATTERN).is_match(&text), "{:?}", text);
    }

    #[test]
    fn secret_refs_agree(text in text()) {
        prop_assert_eq!(is_secret_ref(&text), ecma(SECRET_REF_PATTERN).is_match(&text), "{:?}", text);
    }

    #[test]
    fn durations_agree_and_denote_their_milliseconds(text in text()) {
        let window = window_ms(&text);
        prop_assert_eq!(window.is_some(), ecma(DURATION_PATTERN).is_match(&text), "{:?}", text);
        if let Some(window) = window {
            let (digits, unit) = text.split_at(text.len() - 1);
            let unit_ms = match unit { "s" => 1_000, "m" => 60_000, "h" => 3_600_000, _ => 86_400_000 };
            let expected = digits.parse::<u128>().unwrap() * unit_ms;
            prop_assert_eq!(window, expected, "{:?}", text);
        }
    }

    /// Durations whose digits go beyond `u128` saturate instead of wrapping.
    #[test]
    fn long_durations_saturate(digits in "[1-9][0-9]{0,60}", unit in "[smhd]") {
        let text = format!("{digits}{unit}");
        let unit_ms: u128 = match unit.as_str() { "s" => 1_000, "m" => 60_000, "h" => 3_600_000, _ => 86_400_000 };
        let expected = digits.parse::<u128>().ok().and_then(|n| n.checked_mul(unit_ms)).unwrap_or(u128::MAX);
        prop_assert_eq!(window_ms(&text), Some(expected));
    }
}
