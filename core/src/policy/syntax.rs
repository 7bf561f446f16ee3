//! The artifact's lexical rules (docs/reference.md#identifiers-and-other-grammars): identifiers,
//! capability ids, secret references, durations and URIs. Written as small
//! matchers rather than regexes so that each ECMAScript subtlety is visible;
//! `tests/syntax_oracle.rs` checks them against the spec's regexes.

/// `^[a-z0-9][a-z0-9-]*$` — upstream, account and issuer ids.
pub const IDENTIFIER_PATTERN: &str = "^[a-z0-9][a-z0-9-]*$";
/// `^[a-z0-9]+([.-][a-z0-9]+)*$`.
pub const CAPABILITY_ID_PATTERN: &str = "^[a-z0-9]+([.-][a-z0-9]+)*$";
/// `^[a-z][a-z0-9+.-]*://.+` (not anchored at the end).
pub const SECRET_REF_PATTERN: &str = "^[a-z][a-z0-9+.-]*://.+";
/// `^[1-9][0-9]*[smhd]$`.
pub const DURATION_PATTERN: &str = "^[1-9][0-9]*[smhd]$";

fn is_lower_alnum(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit()
}

pub fn is_identifier(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && is_lower_alnum(bytes[0])
        && bytes[1..].iter().all(|&b| is_lower_alnum(b) || b == b'-')
}

pub fn is_capability_id(text: &str) -> bool {
    // Runs of [a-z0-9]+ separated by exactly one `.` or `-`.
    !text.is_empty()
        && text
            .split(['.', '-'])
            .all(|run| !run.is_empty() && run.bytes().all(is_lower_alnum))
}

/// ECMAScript's `.` matches anything but a line terminator.
fn is_line_terminator(ch: char) -> bool {
    matches!(ch, '\n' | '\r' | '\u{2028}' | '\u{2029}')
}

pub fn is_secret_ref(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes[0].is_ascii_lowercase() {
        return false;
    }
    let scheme_end = 1 + bytes[1..]
        .iter()
        .take_while(|&&b| is_lower_alnum(b) || matches!(b, b'+' | b'.' | b'-'))
        .count();
    text[scheme_end..]
        .strip_prefix("://")
        .and_then(|rest| rest.chars().next())
        .is_some_and(|first| !is_line_terminator(first))
}

/// The window a `per` denotes in milliseconds, or `None` when it does not
/// match the duration pattern. Saturates rather than overflowing.
pub fn window_ms(per: &str) -> Option<u128> {
    // The unit is the last *byte*: splitting before the last byte of a
    // non-ASCII character would not be a char boundary (and must not panic).
    let unit_ms: u128 = match per.as_bytes().last()? {
        b's' => 1_000,
        b'm' => 60_000,
        b'h' => 3_600_000,
        b'd' => 86_400_000,
        _ => return None,
    };
    // INVARIANT: the last byte is ASCII, so this is a char boundary.
    let digits = &per[..per.len() - 1];
    let bytes = digits.as_bytes();
    if bytes.is_empty() || bytes[0] == b'0' || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let count = bytes.iter().fold(0u128, |acc, &b| {
        acc.saturating_mul(10).saturating_add(u128::from(b - b'0'))
    });
    Some(count.saturating_mul(unit_ms))
}

/// JSON Schema's `format: uri`: an absolute RFC 3986 URI (scheme required,
/// ASCII only; relative references and IRIs fail).
pub fn is_uri(text: &str) -> bool {
    fluent_uri::Uri::parse(text).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["crm", "9a", "a--b-"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["Crm", "-a", "a_b", "a.b", ""] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn capability_ids() {
        for ok in ["crm.contact.read", "metrics.dashboard-view", "a"] {
            assert!(is_capability_id(ok), "{ok}");
        }
        for bad in ["crm..read", ".x", "x.", "a_b", "A.b", "", "a.-b"] {
            assert!(!is_capability_id(bad), "{bad}");
        }
    }

    #[test]
    fn secret_refs() {
        for ok in ["env://X", "oauth+https://h/t?x", "a://b\nc"] {
            assert!(is_secret_ref(ok), "{ok:?}");
        }
        for bad in ["ENV://X", "env:X", "env://", "env://\nx", "1a://x", "e_v://x"] {
            assert!(!is_secret_ref(bad), "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(window_ms("1s"), Some(1_000));
        assert_eq!(window_ms("24h"), Some(86_400_000));
        assert_eq!(window_ms("7d"), Some(604_800_000));
        for bad in [
            "0s", "01m", "1h30m", "10ms", "1w", "h", "", " 1h", "1h ", "é", "1é",
        ] {
            assert_eq!(window_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn uris() {
        assert!(is_uri(
            "https://login.example.net/.well-known/openid-configuration"
        ));
        assert!(is_uri("urn:isbn:0451450523"));
        assert!(!is_uri("/relative/path"));
        assert!(!is_uri("https://exämple.net/"));
        assert!(!is_uri("not a uri"));
    }
}
