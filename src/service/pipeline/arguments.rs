//! A tool call's arguments, as the audit trail and a request's fingerprint see them: their
//! canonical JSON, its digest, and — only when the operator opts in — their values with every
//! sensitive member redacted, within a bound.
//!
//! The canonical form is what makes one object one digest, however a gateway wrote it: object
//! members sorted by name (by code point, recursively), no whitespace, strings and numbers as
//! serde_json writes them. Two gateways that forward the same arguments in another member order,
//! or a retry that re-serialises them, give the same digest.
//!
//! Architecture invariant: nothing here keeps or logs a value unless [`AuditArguments::keep`]
//! says so, and then only after redaction.

use std::io::Write as _;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::service::config::AuditArguments;

use super::CallArguments;

/// The most a record keeps of a call's arguments (their redacted canonical JSON); larger ones
/// are recorded by their digest and their size only.
pub const MAX_KEPT_ARGUMENTS: usize = 16 * 1024;

/// What a redacted member's value becomes.
pub const REDACTED: &str = "[redacted]";

/// A member whose name, lower-cased, holds one of these is redacted, whatever the operator adds.
const SENSITIVE: [&str; 8] = [
    "password",
    "secret",
    "token",
    "key",
    "authorization",
    "credential",
    "cookie",
    "session",
];

/// What a decision's record keeps of the call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `sha256:<hex>` of the arguments' canonical JSON (before redaction).
    pub digest: String,
    pub kept: Kept,
}

/// The values a record keeps besides the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// None: the default.
    Nothing,
    /// The canonical JSON of the arguments, sensitive members redacted.
    Redacted(String),
    /// The redacted arguments were this many bytes, over [`MAX_KEPT_ARGUMENTS`]: not kept.
    Omitted(u64),
}

impl Recorded {
    /// What the record of a call with `arguments` keeps, as `settings` say.
    pub fn of(arguments: &CallArguments, settings: &AuditArguments) -> Recorded {
        let kept = if settings.keep {
            let text = canonical_with(arguments, &|name| redacted(name, &settings.redact));
            if text.len() <= MAX_KEPT_ARGUMENTS {
                Kept::Redacted(text)
            } else {
                Kept::Omitted(text.len() as u64)
            }
        } else {
            Kept::Nothing
        };
        Recorded {
            digest: digest(arguments),
            kept,
        }
    }
}

/// `sha256:<hex>` of the canonical JSON of `arguments`.
pub fn digest(arguments: &CallArguments) -> String {
    let hash = Sha256::digest(canonical(arguments).as_bytes());
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in hash {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// The canonical JSON of an object: members sorted by name, recursively, no whitespace.
pub fn canonical(arguments: &CallArguments) -> String {
    canonical_with(arguments, &|_| false)
}

/// The canonical JSON of `object`, the value of every member `redact` names (at any depth)
/// written as [`REDACTED`].
fn canonical_with(object: &Map<String, Value>, redact: &dyn Fn(&str) -> bool) -> String {
    let mut out = Vec::new();
    write_object(&mut out, object, redact);
    // INVARIANT: only serde_json's own string and number output and ASCII punctuation are
    // written, all UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

fn write_value(out: &mut Vec<u8>, value: &Value, redact: &dyn Fn(&str) -> bool) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_json(out, number),
        Value::String(text) => write_json(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item, redact);
            }
            out.push(b']');
        }
        Value::Object(object) => write_object(out, object, redact),
    }
}

fn write_object(out: &mut Vec<u8>, object: &Map<String, Value>, redact: &dyn Fn(&str) -> bool) {
    // `String`'s order is its UTF-8 bytes', which is code point order.
    let mut members: Vec<(&String, &Value)> = object.iter().collect();
    members.sort_unstable_by(|one, two| one.0.cmp(two.0));
    out.push(b'{');
    for (index, (name, value)) in members.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_json(out, name);
        out.push(b':');
        if redact(name) {
            write_json(out, REDACTED);
        } else {
            write_value(out, value, redact);
        }
    }
    out.push(b'}');
}

/// A string or a number as serde_json writes it.
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // INVARIANT: serialising a string or a number into memory cannot fail; were it to, the
    // output would be visibly not JSON rather than a panic on a caller's input.
    if serde_json::to_writer(&mut *out, value).is_err() {
        let _ = out.write_all(b"?");
    }
}

/// Whether a member named `name` is redacted: its name, lower-cased, holds a [`SENSITIVE`] word
/// or equals one of the operator's `extra` names (lower-case).
fn redacted(name: &str, extra: &[String]) -> bool {
    let lower = name.to_lowercase();
    SENSITIVE.iter().any(|word| lower.contains(word)) || extra.contains(&lower)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> CallArguments {
        match value {
            Value::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }

    fn parsed(text: &str) -> CallArguments {
        serde_json::from_str(text).expect("an object")
    }

    #[test]
    fn members_are_sorted_recursively_without_whitespace() {
        let arguments =
            parsed(r#"{ "b": [ {"z": 1, "a": null} , true ], "a": { "y": "x", "x": 1.5 }, "A": -0 }"#);
        assert_eq!(
            canonical(&arguments),
            // serde_json reads `-0` as a float, and writes it so.
            r#"{"A":-0.0,"a":{"x":1.5,"y":"x"},"b":[{"a":null,"z":1},true]}"#
        );
    }

    #[test]
    fn the_order_of_members_in_the_input_does_not_change_the_digest() {
        let one =
            parsed(r#"{"amount": 50, "currency": "EUR", "meta": {"b": 2, "a": [1, {"d": 4, "c": 3}]}}"#);
        let two =
            parsed(r#"{"meta": {"a": [1, {"c": 3, "d": 4}], "b": 2}, "currency": "EUR", "amount": 50}"#);
        // Read with `preserve_order`, the two maps iterate in different orders.
        assert_ne!(one.keys().collect::<Vec<_>>(), two.keys().collect::<Vec<_>>());
        assert_eq!(digest(&one), digest(&two));
        // Whitespace and member order aside, any other value is another digest.
        let three =
            parsed(r#"{"amount": 51, "currency": "EUR", "meta": {"b": 2, "a": [1, {"d": 4, "c": 3}]}}"#);
        assert_ne!(digest(&one), digest(&three));
        // The order of an array's items is part of the value.
        let four =
            parsed(r#"{"amount": 50, "currency": "EUR", "meta": {"b": 2, "a": [{"d": 4, "c": 3}, 1]}}"#);
        assert_ne!(digest(&one), digest(&four));
    }

    #[test]
    fn the_digest_is_sha256_of_the_canonical_text() {
        // `printf '{"a":1}' | sha256sum`
        assert_eq!(
            digest(&parsed(r#"{ "a" : 1 }"#)),
            "sha256:015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
        assert_eq!(
            digest(&Map::new()),
            // `printf '{}' | sha256sum`
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn strings_and_numbers_are_written_as_serde_json_writes_them() {
        let arguments = object(json!({
            "text": "line\nbreak \"quoted\" \u{0} é 😀",
            "big": u64::MAX,
            "negative": i64::MIN,
            "float": 0.1,
            "exponent": 1e300,
        }));
        assert_eq!(
            canonical(&arguments),
            "{\"big\":18446744073709551615,\"exponent\":1e+300,\"float\":0.1,\
             \"negative\":-9223372036854775808,\"text\":\"line\\nbreak \\\"quoted\\\" \\u0000 é 😀\"}"
        );
        // Sorted by code point: upper case before lower case, `é` after `z`.
        let names = object(json!({"é": 1, "z": 2, "Z": 3}));
        assert_eq!(canonical(&names), r#"{"Z":3,"z":2,"é":1}"#);
    }

    fn settings(keep: bool, redact: &[&str]) -> AuditArguments {
        AuditArguments {
            keep,
            redact: redact.iter().map(|name| (*name).to_owned()).collect(),
        }
    }

    #[test]
    fn values_are_kept_only_when_asked_and_then_redacted() {
        let arguments = parsed(
            r#"{"amount": 50, "Password": "hunter2", "auth": {"apiKey": "k", "list": [{"SESSION_ID": 1, "x": 2}]},
                "X-Authorization": "Bearer t", "cookies": ["a"], "iban": "ES00", "monkey": 1}"#,
        );
        let digest = digest(&arguments);
        let by_default = Recorded::of(&arguments, &settings(false, &[]));
        assert_eq!(by_default.digest, digest);
        assert_eq!(by_default.kept, Kept::Nothing);

        let kept = Recorded::of(&arguments, &settings(true, &["iban"]));
        // The digest is of the arguments as sent, not as kept.
        assert_eq!(kept.digest, digest);
        assert_eq!(
            kept.kept,
            Kept::Redacted(
                r#"{"Password":"[redacted]","X-Authorization":"[redacted]","amount":50,"auth":{"apiKey":"[redacted]","list":[{"SESSION_ID":"[redacted]","x":2}]},"cookies":"[redacted]","iban":"[redacted]","monkey":"[redacted]"}"#
                    .to_owned()
            )
        );
        // An operator's name is a whole name, not a part of one.
        let partial = Recorded::of(&parsed(r#"{"iban_country": "ES"}"#), &settings(true, &["iban"]));
        assert_eq!(
            partial.kept,
            Kept::Redacted(r#"{"iban_country":"ES"}"#.to_owned())
        );
    }

    #[test]
    fn kept_arguments_over_the_bound_are_noted_not_kept() {
        let at_the_bound = |extra: usize| {
            // `{"a":"…"}` is 8 bytes around the text.
            let text = "x".repeat(MAX_KEPT_ARGUMENTS - 8 + extra);
            Recorded::of(&object(json!({ "a": text })), &settings(true, &[]))
        };
        assert!(matches!(at_the_bound(0).kept, Kept::Redacted(text) if text.len() == MAX_KEPT_ARGUMENTS));
        let over = at_the_bound(1);
        assert_eq!(over.kept, Kept::Omitted(MAX_KEPT_ARGUMENTS as u64 + 1));
        assert!(over.digest.starts_with("sha256:"));
    }
}
