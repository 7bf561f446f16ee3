//! Human text for the dry-run commands: the pieces every report shares — a
//! site as `file:line:column  pointer` (what an editor can open), a ceiling in
//! words, an attribute list — and the diagnostic renderer, ruff/rustc style:
//! the header line, the message, the pointer, the related locations and the
//! source line with the offending span underlined. Plain text, no colours.

use std::fmt::Write as _;

use capgate_core::access::Limits;
use capgate_core::policy::{Code, Diagnostic, Document, Position, Severity};
use capgate_core::principals::{AuthProblem, Principal};

use super::input::Source;

/// `origin:line:column`, or just `origin` when there is no position.
pub fn location(origin: &str, position: Option<Position>) -> String {
    match position {
        Some(position) => format!("{origin}:{}:{}", position.line, position.column),
        None => origin.to_owned(),
    }
}

/// `origin:line:column  pointer`.
pub fn site(origin: &str, position: Option<Position>, path: &str) -> String {
    format!("{}  {}", location(origin, position), pointer(path))
}

/// A pointer for people: the empty pointer designates the whole document.
pub fn pointer(path: &str) -> String {
    if path.is_empty() {
        "\"\" (the whole document)".to_owned()
    } else {
        path.to_owned()
    }
}

/// "N calls per 1h", or "no ceiling declared".
pub fn ceiling(limits: Option<&Limits>) -> String {
    match limits {
        Some(Limits { calls: 0, per, .. }) => format!("0 calls per {per} (suspended)"),
        Some(Limits { calls: 1, per, .. }) => format!("1 call per {per}"),
        Some(Limits { calls, per, .. }) => format!("{calls} calls per {per}"),
        None => "no ceiling declared".to_owned(),
    }
}

/// `[k=v k=v]`, or nothing for no attributes.
pub fn attribute_list<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let shown: Vec<String> = pairs
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    if shown.is_empty() {
        String::new()
    } else {
        format!("[{}]", shown.join(" "))
    }
}

/// The principal block of `explain` and `visible`: who it resolved to and
/// which attributes the issuer does not declare.
pub fn principal(out: &mut String, resolution: Result<(&Principal, &[String]), AuthProblem>) {
    match resolution {
        Ok((principal, discarded)) => {
            let attributes = attribute_list(&principal.attributes);
            if attributes.is_empty() {
                let _ = writeln!(out, "principal  {}  (no attributes)", principal.id);
            } else {
                let _ = writeln!(out, "principal  {}  {attributes}", principal.id);
            }
            if !discarded.is_empty() {
                let _ = writeln!(
                    out,
                    "discarded  {}  (not declared by issuer `{}`)",
                    discarded.join(", "),
                    principal.issuer
                );
            }
        }
        Err(problem) => {
            let _ = writeln!(out, "NO PRINCIPAL");
            let _ = writeln!(out, "  problem   {} — {}", problem.as_str(), problem.describe());
        }
    }
}

/// What `validate` prints in human form.
pub fn diagnostics(source: &Source, document: Option<&Document>, diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    if diagnostics.is_empty() {
        let _ = writeln!(out, "{}: no diagnostics, the policy is valid", source.origin);
        return out;
    }
    let text = source.text();
    let lines = split_lines(&text);
    for diagnostic in diagnostics {
        block(&mut out, &source.origin, &lines, document, diagnostic);
        out.push('\n');
    }
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = diagnostics.len() - errors;
    let _ = writeln!(
        out,
        "{}: {}, {}",
        source.origin,
        count(errors, "error"),
        count(warnings, "warning")
    );
    out
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn block(
    out: &mut String,
    origin: &str,
    lines: &[&str],
    document: Option<&Document>,
    diagnostic: &Diagnostic,
) {
    let Diagnostic {
        severity,
        code,
        message,
        path,
        position,
        related,
    } = diagnostic;
    let severity = match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let _ = writeln!(
        out,
        "{}  {severity}  {}",
        location(origin, *position),
        code.as_str()
    );
    for line in message.lines() {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "  at {}", pointer(path));
    for related in related {
        let _ = writeln!(
            out,
            "  {}: {}",
            related.note,
            site(origin, related.position, &related.path)
        );
    }
    if let Some(position) = position {
        // A YAML error is a point in the text, not a node: underline the
        // token there. Anything else underlines the node the pointer designates.
        let span = if *code == Code::YamlSyntax {
            Span::Token
        } else {
            Span::Node { document, path }
        };
        snippet(out, lines, span, *position);
    }
}

/// What to underline from a diagnostic's position.
enum Span<'d> {
    /// The token at the position (a YAML error).
    Token,
    /// The node a pointer designates.
    Node {
        document: Option<&'d Document>,
        path: &'d str,
    },
}

/// The source line of `position` with the span underlined: a scalar's token,
/// or the rest of the line for a collection.
fn snippet(out: &mut String, lines: &[&str], span: Span<'_>, position: Position) {
    let line = lines.get(position.line.wrapping_sub(1)).copied().unwrap_or("");
    // Tabs would shift the carets; shown as single spaces they keep columns.
    let shown: Vec<char> = line.chars().map(|c| if c == '\t' { ' ' } else { c }).collect();
    let start = position.column.saturating_sub(1).min(shown.len());
    let rest = &shown[start..];
    let width = match span {
        Span::Token => token_width(rest),
        Span::Node { document, path } => {
            let scalar = document.and_then(|document| scalar_text(document, path));
            span_width(rest, scalar.as_deref())
        }
    }
    .max(1);
    let number = position.line.to_string();
    let gutter = " ".repeat(number.len());
    let shown: String = shown.into_iter().collect();
    let _ = writeln!(out, "{gutter} |");
    let _ = writeln!(out, "{number} | {}", shown.trim_end());
    let _ = writeln!(out, "{gutter} | {}{}", " ".repeat(start), "^".repeat(width));
}

/// The value of the scalar a pointer designates (a string's text, a
/// number's or boolean's spelling), or `None` for a collection or nothing.
fn scalar_text(document: &Document, path: &str) -> Option<String> {
    use capgate_core::policy::document::Value;
    let node = document.lookup(path)?;
    match node.value() {
        Value::String(text) => Some(text.clone()),
        Value::Number(_) | Value::Bool(_) => Some(String::new()),
        _ => None,
    }
}

/// How many characters to underline from the start of the node. A quoted
/// scalar runs to its closing quote; a plain scalar is its text when the line
/// spells it out; anything else runs to the end of the line, comment excluded.
fn span_width(rest: &[char], scalar: Option<&str>) -> usize {
    let to_line_end = || content_width(rest);
    let Some(scalar) = scalar else {
        return to_line_end();
    };
    match rest.first() {
        Some('"') => closing_quote(rest, '"').unwrap_or_else(to_line_end),
        Some('\'') => closing_quote(rest, '\'').unwrap_or_else(to_line_end),
        _ if !scalar.is_empty()
            && rest
                .iter()
                .take(scalar.chars().count())
                .copied()
                .eq(scalar.chars()) =>
        {
            scalar.chars().count()
        }
        _ => rest
            .iter()
            .position(|&c| c.is_whitespace() || matches!(c, ',' | ']' | '}' | '#'))
            .unwrap_or_else(to_line_end),
    }
}

/// Width of the token at the start of `rest`: up to whitespace, a flow
/// indicator, or a `:` that ends a key.
fn token_width(rest: &[char]) -> usize {
    rest.iter()
        .enumerate()
        .position(|(index, &c)| {
            c.is_whitespace()
                || matches!(c, ',' | '[' | ']' | '{' | '}' | '#')
                || (c == ':' && rest.get(index + 1).is_none_or(|next| next.is_whitespace()))
        })
        .unwrap_or(rest.len())
}

/// Width of a quoted scalar including both quotes, if it closes on this line.
fn closing_quote(rest: &[char], quote: char) -> Option<usize> {
    let mut index = 1;
    while index < rest.len() {
        let c = rest[index];
        if quote == '"' && c == '\\' {
            index += 2;
            continue;
        }
        if c == quote {
            if quote == '\'' && rest.get(index + 1) == Some(&'\'') {
                index += 2;
                continue;
            }
            return Some(index + 1);
        }
        index += 1;
    }
    None
}

/// Width of the line's content: up to a ` #` comment outside quotes, trailing
/// whitespace excluded.
fn content_width(rest: &[char]) -> usize {
    let mut quote: Option<char> = None;
    let mut end = rest.len();
    for (index, &c) in rest.iter().enumerate() {
        match quote {
            Some(open) if c == open => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && (index == 0 || rest[index - 1].is_whitespace()) => {
                end = index;
                break;
            }
            None => {}
        }
    }
    let content = &rest[..end];
    content.len() - content.iter().rev().take_while(|c| c.is_whitespace()).count()
}

/// Lines as the compiler counts them: `\n`, `\r\n` and a lone `\r` all end one.
fn split_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\n' => {
                lines.push(&text[start..index]);
                start = index + 1;
            }
            b'\r' => {
                lines.push(&text[start..index]);
                if bytes.get(index + 1) == Some(&b'\n') {
                    index += 1;
                }
                start = index + 1;
            }
            _ => {}
        }
        index += 1;
    }
    lines.push(&text[start..]);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(text: &str) -> Vec<char> {
        text.chars().collect()
    }

    #[test]
    fn spans_cover_the_token() {
        assert_eq!(
            span_width(&chars("docs-writer   # comment"), Some("docs-writer")),
            11
        );
        assert_eq!(span_width(&chars("\"a \\\" b\", x"), Some("a \" b")), 8);
        assert_eq!(span_width(&chars("'it''s' # c"), Some("it's")), 7);
        assert_eq!(span_width(&chars("3, per: 1h }"), Some("")), 1);
        assert_eq!(span_width(&chars("id: x   # note"), None), 5);
        assert_eq!(span_width(&chars("url: \"a#b\"  "), None), 10);
        assert_eq!(span_width(&chars(""), None), 0);
    }

    #[test]
    fn tokens_stop_at_structure() {
        assert_eq!(token_width(&chars("capabilities: []")), 12);
        assert_eq!(token_width(&chars("a:b c")), 3);
        assert_eq!(token_width(&chars("[x]")), 0);
        assert_eq!(token_width(&chars("key:")), 3);
    }

    #[test]
    fn lines_end_as_the_compiler_counts_them() {
        assert_eq!(split_lines("a\nb\r\nc\rd"), ["a", "b", "c", "d"]);
        assert_eq!(split_lines("a\n"), ["a", ""]);
    }

    #[test]
    fn ceilings_in_words() {
        let limits = |calls| Limits {
            calls,
            per: "1h".into(),
            window_ms: 3_600_000,
        };
        assert_eq!(ceiling(Some(&limits(600))), "600 calls per 1h");
        assert_eq!(ceiling(Some(&limits(1))), "1 call per 1h");
        assert_eq!(ceiling(Some(&limits(0))), "0 calls per 1h (suspended)");
        assert_eq!(ceiling(None), "no ceiling declared");
    }
}
