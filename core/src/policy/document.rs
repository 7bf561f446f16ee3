//! The parsed artifact: one YAML 1.2 document (core schema) as a tree of nodes
//! that remember where their content starts, and RFC 6901 pointer resolution
//! back to those positions (docs/reference.md#parsing).
//!
//! The tree is built from `saphyr-parser` events so that every limit is ours
//! and exact: duplicate keys, several documents, unknown tags, alias
//! expansions, nesting depth and size are all `yaml_syntax` errors, never a
//! crash and never unbounded memory. Aliases are not copied: an alias node
//! points at its anchored node, so a document costs memory in proportion to
//! its text whatever its aliases say.

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use super::pointer;

/// An artifact larger than this is refused before it is parsed.
pub const MAX_ARTIFACT_BYTES: usize = 8 * 1024 * 1024;
/// Resolving an alias counts one expansion plus the expansions inside the
/// aliased content; the 101st in a document is an error.
pub const MAX_ALIAS_EXPANSIONS: u64 = 100;
/// Collections nested deeper than this (aliases included) are an error.
pub const MAX_DEPTH: usize = 256;

/// Where a node's content starts: 1-based line and column (in characters),
/// 0-based character offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: usize,
    pub column: usize,
    pub offset: usize,
}

/// A YAML error: the parser's, or one of our limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub message: String,
    pub position: Position,
}

/// Index of a node in the document's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(u32);

/// A number as YAML's core schema reads it. Integers that fit stay exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i128),
    Float(f64),
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            // Precision loss is the JSON data model's, and intended.
            #[allow(clippy::cast_precision_loss)]
            Number::Int(value) => value as f64,
            Number::Float(value) => value,
        }
    }

    /// The value as an integer when it is one in JSON Schema's sense: a float
    /// with a zero fractional part counts (`2.0` is 2).
    pub fn as_integer(self) -> Option<i128> {
        match self {
            Number::Int(value) => Some(value),
            Number::Float(value) if value.is_finite() && value.fract() == 0.0 => {
                // Saturating conversion: beyond i128 the exact value no longer matters.
                #[allow(clippy::cast_possible_truncation)]
                Some(value as i128)
            }
            Number::Float(_) => None,
        }
    }

    /// The ECMAScript `Number::toString` form, which is how a number becomes a
    /// mapping key or a string attribute (`1.0` → `"1"`, `1e21` → `"1e+21"`).
    pub fn to_js_string(self) -> String {
        let value = match self {
            Number::Int(value) if value.unsigned_abs() <= 1 << 53 => return value.to_string(),
            other => other.as_f64(),
        };
        if value.is_nan() {
            "NaN".to_owned()
        } else if value.is_infinite() {
            if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
        } else {
            ryu_js::Buffer::new().format_finite(value).to_owned()
        }
    }
}

/// A node's value. Scalars are already resolved by the core schema.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Sequence(Vec<NodeId>),
    Mapping(Vec<Entry>),
    /// An alias: the anchored node it refers to (the latest definition before it).
    Alias(NodeId),
}

/// One key of a mapping. Keys are strings, as in JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_position: Option<Position>,
    pub value: NodeId,
}

#[derive(Debug, Clone)]
struct Node {
    value: Value,
    /// Start of the node's content; `None` for an empty (null) value.
    position: Option<Position>,
    /// Alias expansions inside this node, nested ones included.
    expansions: u64,
    /// Collection nesting below and including this node, through aliases.
    height: usize,
}

/// A parsed document. `root` is `None` for a stream with no document.
#[derive(Debug, Clone)]
pub struct Document {
    nodes: Vec<Node>,
    root: Option<NodeId>,
}

/// A node seen through its document; aliases are followed by `value()`.
#[derive(Debug, Clone, Copy)]
pub struct NodeRef<'d> {
    document: &'d Document,
    id: NodeId,
}

impl<'d> NodeRef<'d> {
    pub fn id(self) -> NodeId {
        self.id
    }

    /// The node's own position (an alias's is the alias's).
    pub fn position(self) -> Option<Position> {
        self.document.node(self.id).position
    }

    /// The value, with aliases followed.
    pub fn value(self) -> &'d Value {
        self.document.value_of(self.id)
    }

    pub fn as_str(self) -> Option<&'d str> {
        match self.value() {
            Value::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self.value() {
            Value::Bool(flag) => Some(*flag),
            _ => None,
        }
    }

    pub fn as_number(self) -> Option<Number> {
        match self.value() {
            Value::Number(number) => Some(*number),
            _ => None,
        }
    }

    /// The items of a sequence; empty for anything else.
    pub fn items(self) -> impl Iterator<Item = NodeRef<'d>> + 'd {
        let items: &'d [NodeId] = match self.value() {
            Value::Sequence(items) => items,
            _ => &[],
        };
        let document = self.document;
        items.iter().map(move |&id| NodeRef { document, id })
    }

    /// The entries of a mapping, in document order; empty for anything else.
    pub fn entries(self) -> impl Iterator<Item = (&'d Entry, NodeRef<'d>)> + 'd {
        let entries: &'d [Entry] = match self.value() {
            Value::Mapping(entries) => entries,
            _ => &[],
        };
        let document = self.document;
        entries.iter().map(move |entry| {
            (
                entry,
                NodeRef {
                    document,
                    id: entry.value,
                },
            )
        })
    }

    /// The value under `key` of a mapping.
    pub fn get(self, key: &str) -> Option<NodeRef<'d>> {
        self.entries()
            .find(|(entry, _)| entry.key == key)
            .map(|(_, node)| node)
    }

    pub fn is_mapping(self) -> bool {
        matches!(self.value(), Value::Mapping(_))
    }

    pub fn is_sequence(self) -> bool {
        matches!(self.value(), Value::Sequence(_))
    }
}

impl Document {
    /// Parses UTF-8 text (or refuses it) as exactly one YAML 1.2 document.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Document, Vec<SyntaxError>> {
        if bytes.len() > MAX_ARTIFACT_BYTES {
            return Err(vec![SyntaxError {
                message: format!(
                    "the document is {} bytes, more than the limit of {MAX_ARTIFACT_BYTES}",
                    bytes.len()
                ),
                position: Position {
                    line: 1,
                    column: 1,
                    offset: 0,
                },
            }]);
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => Document::parse(text),
            Err(error) => {
                let valid = &bytes[..error.valid_up_to()];
                // INVARIANT: the prefix before `valid_up_to` is valid UTF-8.
                let prefix = std::str::from_utf8(valid).unwrap_or_default();
                Err(vec![SyntaxError {
                    message: format!(
                        "the document is not valid UTF-8 (bad byte at offset {})",
                        error.valid_up_to()
                    ),
                    position: position_after(prefix),
                }])
            }
        }
    }

    /// Parses text as exactly one YAML 1.2 document, core schema.
    pub fn parse(text: &str) -> Result<Document, Vec<SyntaxError>> {
        if text.len() > MAX_ARTIFACT_BYTES {
            return Document::parse_bytes(text.as_bytes());
        }
        Builder::new(text).run()
    }

    pub fn root(&self) -> Option<NodeRef<'_>> {
        self.root.map(|id| NodeRef { document: self, id })
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    fn value_of(&self, id: NodeId) -> &Value {
        match &self.node(id).value {
            Value::Alias(target) => &self.node(*target).value,
            value => value,
        }
    }

    /// The node a pointer designates, if any. A leading `#` is tolerated, and
    /// `""` and `"/"` designate the root.
    pub fn lookup(&self, target: &str) -> Option<NodeRef<'_>> {
        let mut node = self.root()?;
        for segment in pointer::segments(target) {
            node = match node.value() {
                Value::Mapping(_) => node.get(&segment)?,
                Value::Sequence(items) => {
                    if segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
                        return None;
                    }
                    let index: usize = segment.parse().ok()?;
                    NodeRef {
                        document: self,
                        id: *items.get(index)?,
                    }
                }
                _ => return None,
            };
        }
        Some(node)
    }

    /// The position a pointer resolves to: the start of the designated node's
    /// content; `None` when it designates nothing or an empty value.
    pub fn resolve(&self, target: &str) -> Option<Position> {
        self.lookup(target)?.position()
    }
}

/// For a parser error about a tab, the byte offset of the tab it is about: the first tab in the
/// whitespace before the `at`-th character on its line (the parser reports the token after it).
fn tab_before(text: &str, at: usize, message: &str) -> Option<usize> {
    if !message.contains("tab") {
        return None;
    }
    let at = text.char_indices().nth(at).map_or(text.len(), |(byte, _)| byte);
    let line_start = text[..at].rfind('\n').map_or(0, |newline| newline + 1);
    let before = &text[line_start..at];
    let blank = before.len() - before.trim_start_matches([' ', '\t']).len();
    before[..blank].find('\t').map(|tab| line_start + tab)
}

/// Position just after `prefix` (used for errors found outside the parser).
fn position_after(prefix: &str) -> Position {
    let mut line = 1;
    let mut column = 1;
    let mut offset = 0;
    let mut previous_cr = false;
    for ch in prefix.chars() {
        offset += 1;
        match ch {
            '\n' if previous_cr => {}
            '\n' | '\r' => {
                line += 1;
                column = 1;
            }
            _ => column += 1,
        }
        previous_cr = ch == '\r';
    }
    Position { line, column, offset }
}

/// Characters YAML 1.2 does not allow where they stand (§5.1, §5.2), which
/// the parser lets through: a stream holds only printable characters, and
/// the C0 controls other than tab and the line breaks are never printable,
/// not even in a comment or inside quotes. DEL, the C1 controls other than
/// NEL, U+FFFE and U+FFFF are not printable either, but JSON allows them in
/// strings, so YAML does inside quoted scalars (`nb-json`); so it does a byte
/// order mark, which is otherwise allowed only at the very start of the
/// stream: our stream holds one document, and a BOM anywhere else is inside it.
struct Unprintable {
    /// (character index, byte index, character, allowed inside quotes), in text order.
    found: Vec<(usize, usize, char, bool)>,
    /// Parallel to `found`: seen inside a quoted scalar, where it is allowed.
    quoted: Vec<bool>,
}

impl Unprintable {
    fn scan(text: &str) -> Self {
        let found: Vec<(usize, usize, char, bool)> = text
            .char_indices()
            .enumerate()
            .filter_map(|(index, (byte, ch))| {
                let quotable = match ch {
                    '\t' | '\n' | '\r' => return None,
                    '\u{0}'..='\u{1f}' => false,
                    '\u{feff}' if index == 0 => return None,
                    '\u{7f}'
                    | '\u{80}'..='\u{84}'
                    | '\u{86}'..='\u{9f}'
                    | '\u{feff}'
                    | '\u{fffe}'
                    | '\u{ffff}' => true,
                    _ => return None,
                };
                Some((index, byte, ch, quotable))
            })
            .collect();
        let quoted = vec![false; found.len()];
        Unprintable { found, quoted }
    }

    /// Marks what lies inside a quoted scalar's span (character indices).
    fn allow_quoted(&mut self, span: std::ops::Range<usize>) {
        let from = self.found.partition_point(|&(index, ..)| index < span.start);
        let to = self.found.partition_point(|&(index, ..)| index < span.end);
        for at in from..to {
            self.quoted[at] = self.found[at].3;
        }
    }

    /// The first character not allowed where it stands, before `stop` (the
    /// character index where parsing stopped, if it did): its byte index and
    /// the message.
    fn first_before(&self, stop: Option<usize>) -> Option<(usize, String)> {
        let at = (0..self.found.len()).find(|&at| !self.quoted[at])?;
        let (index, byte, ch, _) = self.found[at];
        if stop.is_some_and(|stop| index >= stop) {
            return None;
        }
        let message = match ch {
            '\u{feff}' => "a byte order mark must not appear inside a document (only at the very start \
                            of the stream)"
                .to_owned(),
            '\u{0}'..='\u{1f}' => format!(
                "the control character U+{:04X} is not allowed anywhere in YAML, comments and \
                 quoted strings included (only tab and line breaks are)",
                u32::from(ch)
            ),
            _ => format!(
                "the character U+{:04X} is not printable: YAML allows it only inside a quoted string",
                u32::from(ch)
            ),
        };
        Some((byte, message))
    }
}

/// Random access to the text by character index (the parser's unit).
struct Chars {
    chars: Vec<char>,
}

impl Chars {
    fn get(&self, index: usize) -> Option<char> {
        self.chars.get(index).copied()
    }
}

enum Frame {
    Sequence {
        id: NodeId,
        items: Vec<NodeId>,
    },
    Mapping {
        id: NodeId,
        entries: Vec<Entry>,
        /// Keys seen so far, built only for large mappings (small ones are
        /// scanned: most mappings in a policy have a handful of keys).
        seen: Option<HashSet<String>>,
        pending_key: Option<(String, Option<Position>)>,
    },
}

struct Builder<'t> {
    text: &'t str,
    chars: Option<Chars>,
    nodes: Vec<Node>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, NodeId>,
    /// Anchored collections still open: an alias to one would be recursive.
    open_anchors: HashSet<usize>,
    /// Anchored collections being built, innermost last.
    closing_anchors: Vec<(NodeId, usize)>,
    expansions: u64,
    root: Option<NodeId>,
    documents: usize,
    errors: Vec<SyntaxError>,
}

const CORE_TAG: &str = "tag:yaml.org,2002:";

impl<'t> Builder<'t> {
    fn new(text: &'t str) -> Self {
        Builder {
            text,
            chars: None,
            nodes: Vec::new(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            open_anchors: HashSet::new(),
            closing_anchors: Vec::new(),
            expansions: 0,
            root: None,
            documents: 0,
            errors: Vec::new(),
        }
    }

    fn run(mut self) -> Result<Document, Vec<SyntaxError>> {
        let mut unprintable = Unprintable::scan(self.text);
        // Where parsing stopped on an error, if it did: characters past it
        // were never read as YAML, so nothing is said about them.
        let mut stopped_at = None;
        let mut parser = Parser::new_from_str(self.text);
        loop {
            let (event, span) = match parser.next_event() {
                None => break,
                Some(Ok(next)) => next,
                Some(Err(error)) => {
                    let marker = error.marker();
                    stopped_at = Some(marker.index());
                    let position = match tab_before(self.text, marker.index(), error.info()) {
                        // The parser stops at the token after a tab it refuses; the tab is what
                        // to change.
                        Some(tab) => position_after(&self.text[..tab]),
                        None => Position {
                            line: marker.line(),
                            column: marker.col() + 1,
                            offset: marker.index(),
                        },
                    };
                    self.errors.push(SyntaxError {
                        message: error.info().to_owned(),
                        position,
                    });
                    break;
                }
            };
            if let Event::Scalar(_, ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted, ..) = event {
                unprintable.allow_quoted(span.start.index()..span.end.index());
            }
            let fatal = match event {
                Event::StreamEnd => break,
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => false,
                Event::DocumentStart(_) => {
                    self.documents += 1;
                    if self.documents > 1 {
                        self.error(
                            "a policy file holds exactly one YAML document; found a second",
                            marker_position(&span),
                        );
                        true
                    } else {
                        false
                    }
                }
                Event::Scalar(text, style, anchor, tag) => {
                    self.scalar(&text, style, anchor, tag.as_deref(), &span)
                }
                Event::Alias(anchor) => self.alias(anchor, &span),
                Event::SequenceStart(anchor, tag) => self.open(false, anchor, tag.as_deref(), &span),
                Event::MappingStart(anchor, tag) => self.open(true, anchor, tag.as_deref(), &span),
                Event::SequenceEnd | Event::MappingEnd => {
                    self.close();
                    false
                }
            };
            if fatal {
                stopped_at = self.errors.last().map(|error| error.position.offset);
                break;
            }
        }
        if let Some((at, message)) = unprintable.first_before(stopped_at) {
            let position = position_after(&self.text[..at]);
            self.error(message, position);
        }
        if self.errors.is_empty() {
            Ok(Document {
                nodes: self.nodes,
                root: self.root,
            })
        } else {
            self.errors.sort_by_key(|error| error.position.offset);
            Err(self.errors)
        }
    }

    fn error(&mut self, message: impl Into<String>, position: Position) {
        self.errors.push(SyntaxError {
            message: message.into(),
            position,
        });
    }

    fn depth(&self) -> usize {
        self.stack.len()
    }

    /// The start of the node's content, skipping an anchor and a tag.
    fn content_start(&mut self, span: &Span, has_properties: bool) -> Position {
        let start = marker_position(span);
        if !has_properties {
            return start;
        }
        let chars = self.chars.get_or_insert_with(|| Chars {
            chars: self.text.chars().collect(),
        });
        let mut index = start.offset;
        let mut line = start.line;
        let mut column = start.column;
        let advance = |index: &mut usize, line: &mut usize, column: &mut usize| {
            let ch = chars.get(*index);
            *index += 1;
            match ch {
                Some('\n') => {
                    *line += 1;
                    *column = 1;
                }
                Some('\r') if chars.get(*index) != Some('\n') => {
                    *line += 1;
                    *column = 1;
                }
                Some('\r') => {}
                _ => *column += 1,
            }
        };
        while let Some('&' | '!') = chars.get(index) {
            let verbatim = chars.get(index) == Some('!') && chars.get(index + 1) == Some('<');
            while let Some(ch) = chars.get(index) {
                if verbatim {
                    advance(&mut index, &mut line, &mut column);
                    if ch == '>' {
                        break;
                    }
                } else if ch.is_whitespace() || matches!(ch, ',' | '[' | ']' | '{' | '}') {
                    break;
                } else {
                    advance(&mut index, &mut line, &mut column);
                }
            }
            // Whitespace and comments between the properties and the content.
            loop {
                match chars.get(index) {
                    Some(' ' | '\t' | '\n' | '\r') => advance(&mut index, &mut line, &mut column),
                    Some('#') => {
                        while !matches!(chars.get(index), None | Some('\n' | '\r')) {
                            advance(&mut index, &mut line, &mut column);
                        }
                    }
                    _ => break,
                }
            }
        }
        Position {
            line,
            column,
            offset: index,
        }
    }

    /// A block scalar starts at its `|` or `>` indicator, as upstream's
    /// parser has it; the event's span starts at the first content line. The
    /// header is the nearest non-blank line above the content: the indicator
    /// is its first `|`/`>` followed only by chomping/indentation indicators
    /// and an optional comment.
    fn block_indicator(&mut self, content: Position) -> Position {
        let chars = self.chars.get_or_insert_with(|| Chars {
            chars: self.text.chars().collect(),
        });
        if matches!(chars.get(content.offset), Some('|' | '>')) {
            return content;
        }
        let is_break = |ch: Option<char>| matches!(ch, Some('\n' | '\r'));
        let mut line_start = content.offset;
        while line_start > 0 && !is_break(chars.get(line_start - 1)) {
            line_start -= 1;
        }
        let mut line = content.line;
        while line_start > 0 && line > 1 {
            // Step over the break that ends the line above (`\n`, `\r\n` or `\r`).
            let mut end = line_start - 1;
            if chars.get(end) == Some('\n') && end > 0 && chars.get(end - 1) == Some('\r') {
                end -= 1;
            }
            let mut begin = end;
            while begin > 0 && !is_break(chars.get(begin - 1)) {
                begin -= 1;
            }
            line -= 1;
            let above = &chars.chars[begin..end];
            if above.iter().all(|ch| matches!(ch, ' ' | '\t')) {
                line_start = begin;
                continue;
            }
            let header_tail = |rest: &[char]| {
                let rest: String = rest.iter().collect();
                let after = rest.trim_start_matches(|ch: char| ch == '+' || ch == '-' || ch.is_ascii_digit());
                after.is_empty()
                    || (after.starts_with([' ', '\t'])
                        && matches!(
                            after.trim_start_matches([' ', '\t']).chars().next(),
                            None | Some('#')
                        ))
            };
            return above
                .iter()
                .enumerate()
                .find(|&(at, ch)| matches!(ch, '|' | '>') && header_tail(&above[at + 1..]))
                .map_or(content, |(at, _)| Position {
                    line,
                    column: at + 1,
                    offset: begin + at,
                });
        }
        content
    }

    /// A block sequence written at its key's indentation (`grants:` then
    /// `- to: …`) starts at its first `-`, like any block sequence. The
    /// parser starts such an "indentless" sequence where its first item does,
    /// after the `-` and the blanks that follow it (or at the line's end, for
    /// an empty first item), so the `-` is the first non-blank character of
    /// that line. An indented sequence already starts at its `-`, which is
    /// the first non-blank of its line too; a flow sequence starts at `[`.
    /// Only mapping values can be indentless, and a block sequence that is a
    /// mapping value always starts a line of its own (`a: - x` is not YAML),
    /// unless it follows an explicit `:` indicator, which is not a `-`.
    fn indentless_dash(&mut self, content: Position) -> Position {
        let chars = self.chars.get_or_insert_with(|| Chars {
            chars: self.text.chars().collect(),
        });
        if chars.get(content.offset) == Some('[') {
            return content;
        }
        let mut line_start = content.offset;
        while line_start > 0 && !matches!(chars.get(line_start - 1), Some('\n' | '\r')) {
            line_start -= 1;
        }
        let mut first = line_start;
        while first < content.offset && matches!(chars.get(first), Some(' ' | '\t')) {
            first += 1;
        }
        let dash = chars.get(first) == Some('-')
            && matches!(chars.get(first + 1), None | Some(' ' | '\t' | '\n' | '\r'));
        if dash && first < content.offset && content.column > content.offset - first {
            Position {
                line: content.line,
                column: content.column - (content.offset - first),
                offset: first,
            }
        } else {
            content
        }
    }

    fn push_node(&mut self, node: Node) -> NodeId {
        let id = NodeId(u32::try_from(self.nodes.len()).unwrap_or(u32::MAX));
        self.nodes.push(node);
        id
    }

    fn scalar(
        &mut self,
        text: &str,
        style: ScalarStyle,
        anchor: usize,
        tag: Option<&Tag>,
        span: &Span,
    ) -> bool {
        let has_properties = anchor != 0 || tag.is_some();
        // An empty scalar has no content to skip to: a tagged empty string
        // (`a: !!str`) starts at its tag, not at whatever follows on the next
        // line. An empty null has no position, tagged (`a: !!null`) or not.
        let empty_text = text.is_empty() && style == ScalarStyle::Plain;
        let mut position = self.content_start(span, has_properties && !empty_text);
        if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
            position = self.block_indicator(position);
        }
        let value = match resolve_scalar(text, style, tag) {
            Ok(value) => value,
            Err(message) => {
                self.error(message, position);
                Value::Null
            }
        };
        let empty = matches!(value, Value::Null) && text.is_empty() && style == ScalarStyle::Plain;
        let id = self.push_node(Node {
            value,
            position: if empty { None } else { Some(position) },
            expansions: 0,
            height: 0,
        });
        if anchor != 0 {
            self.anchors.insert(anchor, id);
        }
        self.attach(id, position)
    }

    fn alias(&mut self, anchor: usize, span: &Span) -> bool {
        let position = marker_position(span);
        if self.open_anchors.contains(&anchor) {
            self.error("an alias may not refer to a node that contains it", position);
            return true;
        }
        let Some(&target) = self.anchors.get(&anchor) else {
            self.error("alias to an unknown anchor", position);
            return true;
        };
        let (inner, height) = {
            let node = &self.nodes[target.0 as usize];
            (node.expansions, node.height)
        };
        let cost = 1 + inner;
        self.expansions = self.expansions.saturating_add(cost);
        if self.expansions > MAX_ALIAS_EXPANSIONS {
            self.error(
                format!("too many alias expansions: the limit is {MAX_ALIAS_EXPANSIONS} per document"),
                position,
            );
            return true;
        }
        if self.depth() + height > MAX_DEPTH {
            self.error(
                format!("collections are nested deeper than {MAX_DEPTH} levels"),
                position,
            );
            return true;
        }
        let id = self.push_node(Node {
            value: Value::Alias(target),
            position: Some(position),
            expansions: cost,
            height,
        });
        self.attach(id, position)
    }

    fn open(&mut self, mapping: bool, anchor: usize, tag: Option<&Tag>, span: &Span) -> bool {
        let has_properties = anchor != 0 || tag.is_some();
        let mut position = self.content_start(span, has_properties);
        let is_value = matches!(
            self.stack.last(),
            Some(Frame::Mapping {
                pending_key: Some(_),
                ..
            })
        );
        if !mapping && !has_properties && is_value {
            position = self.indentless_dash(position);
        }
        if self.depth() >= MAX_DEPTH {
            self.error(
                format!("collections are nested deeper than {MAX_DEPTH} levels"),
                position,
            );
            return true;
        }
        if let Some(tag) = tag {
            let expected = if mapping { "map" } else { "seq" };
            let non_specific = tag.handle.is_empty() && tag.suffix == "!";
            if !(non_specific || (tag.handle == CORE_TAG && tag.suffix == expected)) {
                self.error(
                    format!(
                        "unknown tag `{}` (only the core schema's tags are accepted)",
                        tag_text(tag)
                    ),
                    position,
                );
            }
        }
        let id = self.push_node(Node {
            value: Value::Null,
            position: Some(position),
            expansions: 0,
            height: 1,
        });
        if anchor != 0 {
            self.anchors.insert(anchor, id);
            self.open_anchors.insert(anchor);
            self.closing_anchors.push((id, anchor));
        }
        self.stack.push(if mapping {
            Frame::Mapping {
                id,
                entries: Vec::new(),
                seen: None,
                pending_key: None,
            }
        } else {
            Frame::Sequence {
                id,
                items: Vec::new(),
            }
        });
        false
    }

    fn close(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        let (id, value, children): (NodeId, Value, Vec<NodeId>) = match frame {
            Frame::Sequence { id, items } => {
                let children = items.clone();
                (id, Value::Sequence(items), children)
            }
            Frame::Mapping { id, entries, .. } => {
                let children = entries.iter().map(|entry| entry.value).collect();
                (id, Value::Mapping(entries), children)
            }
        };
        let mut expansions = 0u64;
        let mut height = 0usize;
        for child in children {
            let node = &self.nodes[child.0 as usize];
            expansions = expansions.saturating_add(node.expansions);
            height = height.max(node.height);
        }
        let node = &mut self.nodes[id.0 as usize];
        node.value = value;
        node.expansions = expansions;
        node.height = height + 1;
        let position = node.position.unwrap_or(Position {
            line: 1,
            column: 1,
            offset: 0,
        });
        if let Some(&(last, anchor)) = self.closing_anchors.last() {
            if last == id {
                self.closing_anchors.pop();
                self.open_anchors.remove(&anchor);
            }
        }
        self.attach(id, position);
    }

    /// Puts a finished node into its parent (or makes it the root).
    fn attach(&mut self, id: NodeId, position: Position) -> bool {
        let key_text = match self.stack.last() {
            Some(Frame::Mapping {
                pending_key: None, ..
            }) => Some(self.key_string(id, position)),
            _ => None,
        };
        match self.stack.last_mut() {
            None => {
                self.root = Some(id);
                false
            }
            Some(Frame::Sequence { items, .. }) => {
                items.push(id);
                false
            }
            Some(Frame::Mapping {
                entries, pending_key, ..
            }) if pending_key.is_some() => {
                let (key, key_position) = pending_key.take().unwrap_or_default();
                entries.push(Entry {
                    key,
                    key_position,
                    value: id,
                });
                false
            }
            Some(Frame::Mapping {
                entries,
                seen,
                pending_key,
                ..
            }) => {
                let key = match key_text {
                    Some(Ok(key)) => key,
                    Some(Err(message)) => {
                        self.error(message, position);
                        return true;
                    }
                    None => return false,
                };
                let duplicate = match seen {
                    Some(keys) => !keys.insert(key.clone()),
                    None => {
                        let duplicate = entries.iter().any(|entry| entry.key == key);
                        if !duplicate && entries.len() >= 16 {
                            let mut keys: HashSet<String> =
                                entries.iter().map(|entry| entry.key.clone()).collect();
                            keys.insert(key.clone());
                            *seen = Some(keys);
                        }
                        duplicate
                    }
                };
                if duplicate {
                    let message = format!("duplicate mapping key `{key}`");
                    *pending_key = Some((key, Some(position)));
                    self.error(message, position);
                    return false;
                }
                *pending_key = Some((key, Some(position)));
                false
            }
        }
    }

    /// A mapping key as a string, as JSON would have it.
    fn key_string(&self, id: NodeId, _position: Position) -> Result<String, String> {
        let node = &self.nodes[id.0 as usize];
        let value = match &node.value {
            Value::Alias(target) => &self.nodes[target.0 as usize].value,
            value => value,
        };
        match value {
            Value::Null => Ok(String::new()),
            Value::Bool(flag) => Ok(flag.to_string()),
            Value::Number(number) => Ok(number.to_js_string()),
            Value::String(text) => Ok(text.clone()),
            Value::Sequence(_) | Value::Mapping(_) | Value::Alias(_) => {
                Err("a mapping key must be a scalar, not a collection".to_owned())
            }
        }
    }
}

fn marker_position(span: &Span) -> Position {
    Position {
        line: span.start.line(),
        column: span.start.col() + 1,
        offset: span.start.index(),
    }
}

fn tag_text(tag: &Tag) -> String {
    if tag.handle == CORE_TAG {
        format!("!!{}", tag.suffix)
    } else if tag.handle.is_empty() {
        format!("!<{}>", tag.suffix)
    } else {
        format!("{}{}", tag.handle, tag.suffix)
    }
}

/// Resolves a scalar by YAML 1.2's core schema. Only plain scalars are
/// resolved; quoted and block scalars are strings.
fn resolve_scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    let Some(tag) = tag else {
        return Ok(if style == ScalarStyle::Plain {
            resolve_plain(text)
        } else {
            Value::String(text.to_owned())
        });
    };
    if tag.handle.is_empty() && tag.suffix == "!" {
        return Ok(Value::String(text.to_owned()));
    }
    let core = if tag.handle == CORE_TAG {
        Some(tag.suffix.as_str())
    } else if tag.handle.is_empty() {
        tag.suffix.strip_prefix(CORE_TAG)
    } else {
        None
    };
    let wrong = |kind: &str| format!("`{text}` is not a valid {kind}");
    match core {
        Some("str") => Ok(Value::String(text.to_owned())),
        Some("null") => match resolve_plain(text) {
            Value::Null => Ok(Value::Null),
            _ => Err(wrong("!!null")),
        },
        Some("bool") => match resolve_plain(text) {
            value @ Value::Bool(_) => Ok(value),
            _ => Err(wrong("!!bool")),
        },
        Some("int") => match resolve_plain(text) {
            value @ Value::Number(Number::Int(_)) => Ok(value),
            Value::Number(Number::Float(f)) if is_int_literal(text) => Ok(Value::Number(Number::Float(f))),
            _ => Err(wrong("!!int")),
        },
        Some("float") => match resolve_plain(text) {
            Value::Number(number) => Ok(Value::Number(Number::Float(number.as_f64()))),
            _ => Err(wrong("!!float")),
        },
        _ => Err(format!(
            "unknown tag `{}` (only the core schema's tags are accepted)",
            tag_text(tag)
        )),
    }
}

fn is_int_literal(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        || text
            .strip_prefix("0o")
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        || text
            .strip_prefix("0x")
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The core schema's resolution of a plain scalar.
fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".nan" | ".NaN" | ".NAN" => return Value::Number(Number::Float(f64::NAN)),
        _ => {}
    }
    if is_int_literal(text) {
        let parsed = if let Some(octal) = text.strip_prefix("0o") {
            i128::from_str_radix(octal, 8).ok()
        } else if let Some(hex) = text.strip_prefix("0x") {
            i128::from_str_radix(hex, 16).ok()
        } else {
            text.parse::<i128>().ok()
        };
        return Value::Number(match parsed {
            Some(value) => Number::Int(value),
            None => Number::Float(big_integer_as_f64(text)),
        });
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        let negative = text.starts_with('-');
        return Value::Number(Number::Float(if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }));
    }
    if is_float_literal(unsigned) {
        if let Ok(value) = text.parse::<f64>() {
            return Value::Number(Number::Float(value));
        }
    }
    Value::String(text.to_owned())
}

/// An integer literal too large for i128, read as the double JSON would hold.
fn big_integer_as_f64(text: &str) -> f64 {
    let radix_digits = |digits: &str, radix: u32| {
        digits.chars().fold(0.0f64, |acc, ch| {
            acc * f64::from(radix) + f64::from(ch.to_digit(radix).unwrap_or(0))
        })
    };
    if let Some(octal) = text.strip_prefix("0o") {
        radix_digits(octal, 8)
    } else if let Some(hex) = text.strip_prefix("0x") {
        radix_digits(hex, 16)
    } else {
        text.parse::<f64>().unwrap_or(f64::INFINITY)
    }
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` without the sign.
fn is_float_literal(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            whole.bytes().all(|b| b.is_ascii_digit())
                && fraction.bytes().all(|b| b.is_ascii_digit())
                && (!whole.is_empty() || !fraction.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|exp| {
        let digits = exp.strip_prefix(['-', '+']).unwrap_or(exp);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Document {
        Document::parse(text).expect("parses")
    }

    fn first_error(text: &str) -> SyntaxError {
        Document::parse(text).expect_err("must fail").remove(0)
    }

    #[test]
    fn core_schema_scalars() {
        let doc = parse("a: yes\nb: true\nc: ~\nd: 0x10\ne: 2.0\nf: '3'\ng: 1e3\nh: .5\ni: 1.\n");
        let root = doc.root().unwrap();
        assert_eq!(root.get("a").unwrap().as_str(), Some("yes"));
        assert_eq!(root.get("b").unwrap().as_bool(), Some(true));
        assert_eq!(root.get("c").unwrap().value(), &Value::Null);
        assert_eq!(root.get("d").unwrap().as_number(), Some(Number::Int(16)));
        assert_eq!(root.get("e").unwrap().as_number().unwrap().as_integer(), Some(2));
        assert_eq!(root.get("f").unwrap().as_str(), Some("3"));
        assert_eq!(
            root.get("g").unwrap().as_number().unwrap().as_integer(),
            Some(1000)
        );
        assert_eq!(root.get("h").unwrap().as_number(), Some(Number::Float(0.5)));
        assert_eq!(root.get("i").unwrap().as_number(), Some(Number::Float(1.0)));
    }

    #[test]
    fn keys_are_stringified_like_json_and_duplicates_are_errors() {
        let doc = parse("1: a\ntrue: b\n~: c\n1.5: d\n");
        let keys: Vec<_> = doc
            .root()
            .unwrap()
            .entries()
            .map(|(e, _)| e.key.clone())
            .collect();
        assert_eq!(keys, ["1", "true", "", "1.5"]);
        let error = first_error("a: 1\nb: 2\na: 3\n");
        assert!(error.message.contains("duplicate"), "{error:?}");
        assert_eq!((error.position.line, error.position.column), (3, 1));
        // Large mappings switch to a set; duplicates are still found.
        let mut large: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        large.push_str("k3: again\n");
        assert_eq!(first_error(&large).position.line, 41);
        // `1` and `1.0` become the same JSON key.
        assert!(Document::parse("1: a\n1.0: b\n").is_err());
    }

    #[test]
    fn a_tab_in_indentation_is_pointed_at_where_it_stands() {
        // The parser stops at the token after the tab; the error points at the tab itself.
        let text = "a:\n  b:\n  \t c: 2\n";
        let error = first_error(text);
        assert!(error.message.contains("tab"), "{error:?}");
        assert_eq!(
            (error.position.line, error.position.column, error.position.offset),
            (3, 3, 10),
            "{error:?}"
        );
        // Characters before it are counted as characters, not bytes.
        let error = first_error("é: 1\nf:\n\tg: 2\n");
        assert_eq!((error.position.line, error.position.column), (3, 1), "{error:?}");
        assert_eq!(error.position.offset, 8, "{error:?}");
    }

    #[test]
    fn several_documents_are_an_error() {
        let error = first_error("a: 1\n---\nb: 2\n");
        assert_eq!(error.position.line, 2);
        assert!(Document::parse("---\na: 1\n...\n").is_ok());
    }

    #[test]
    fn unknown_tags_are_errors_core_tags_are_not() {
        assert!(Document::parse("a: !foo x\n").is_err());
        let doc = parse("a: !!str 3\nb: ! 4\nc: !!int 5\n");
        let root = doc.root().unwrap();
        assert_eq!(root.get("a").unwrap().as_str(), Some("3"));
        assert_eq!(root.get("b").unwrap().as_str(), Some("4"));
        assert_eq!(root.get("c").unwrap().as_number(), Some(Number::Int(5)));
    }

    #[test]
    fn tagged_empty_scalars_start_at_their_tag() {
        let doc = parse("a: !!str\nb: 1\n");
        assert_eq!(doc.root().unwrap().get("a").unwrap().as_str(), Some(""));
        assert_eq!(doc.resolve("/a").map(|p| (p.line, p.column)), Some((1, 4)));
    }

    #[test]
    fn positions_skip_anchor_and_tag_and_empty_values_have_none() {
        let text = "a: &x 1\nb: !!str 2\nc:\nd: *x\ne:\n  - k: v\n";
        let doc = parse(text);
        assert_eq!(doc.resolve("/a").map(|p| (p.line, p.column)), Some((1, 7)));
        assert_eq!(doc.resolve("/b").map(|p| (p.line, p.column)), Some((2, 10)));
        assert_eq!(doc.resolve("/c"), None);
        assert_eq!(doc.resolve("/d").map(|p| (p.line, p.column)), Some((4, 4)));
        assert_eq!(doc.resolve("/e").map(|p| (p.line, p.column)), Some((6, 3)));
        assert_eq!(doc.resolve("/e/0").map(|p| (p.line, p.column)), Some((6, 5)));
        assert_eq!(doc.resolve("#/e/0/k").map(|p| (p.line, p.column)), Some((6, 8)));
        assert_eq!(doc.resolve("/e/1"), None);
        assert_eq!(doc.resolve("/nothing"), None);
        assert_eq!(doc.resolve("").map(|p| p.line), Some(1));
    }

    #[test]
    fn block_scalars_start_at_their_indicator() {
        let text = "a: |\n  text\nb: >-\n\n  folded\nc: &x |2 # a | comment\n   kept\n\"k|\": |+\n  x\nd:\n  - |\n    item\ne: |\nf: 1\n";
        let doc = parse(text);
        let at = |pointer: &str| doc.resolve(pointer).map(|p| (p.line, p.column));
        assert_eq!(at("/a"), Some((1, 4)));
        assert_eq!(at("/b"), Some((3, 4)));
        assert_eq!(at("/c"), Some((6, 7)));
        assert_eq!(at("/k|"), Some((8, 7)));
        assert_eq!(at("/d/0"), Some((11, 5)));
        assert_eq!(at("/e"), Some((13, 4)));
        assert_eq!(doc.root().unwrap().get("c").unwrap().as_str(), Some(" kept\n"));
        let crlf = parse("a: |\r\n  text\r\n");
        assert_eq!(
            crlf.resolve("/a").map(|p| (p.line, p.column, p.offset)),
            Some((1, 4, 3))
        );
    }

    #[test]
    fn aliases_follow_the_latest_anchor_and_are_bounded() {
        let doc = parse("a: &x 1\nb: &x 2\nc: *x\n");
        assert_eq!(
            doc.root().unwrap().get("c").unwrap().as_number(),
            Some(Number::Int(2))
        );
        // 100 expansions are fine, the 101st is not.
        let mut ok = String::from("a: &a x\nl:\n");
        for _ in 0..100 {
            ok.push_str("  - *a\n");
        }
        assert!(Document::parse(&ok).is_ok());
        let bad = format!("{ok}  - *a\n");
        let error = first_error(&bad);
        assert_eq!(error.position.line, 103);
        // A billion laughs stops at the first alias over the limit.
        let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n";
        let error = first_error(bomb);
        assert_eq!(error.position.line, 3);
    }

    #[test]
    fn nesting_is_bounded() {
        // Block sequences: `- - - x` nests one level per dash.
        let deep_ok = format!("{}x\n", "- ".repeat(MAX_DEPTH));
        assert!(Document::parse(&deep_ok).is_ok());
        let too_deep = format!("{}x\n", "- ".repeat(MAX_DEPTH + 1));
        let error = first_error(&too_deep);
        assert_eq!(error.position.column, 2 * MAX_DEPTH + 1);
        // Flow collections hit the parser's own limit (255 levels) first:
        // still a syntax error, never a crash (docs/decisions/0002).
        let flow = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(Document::parse(&flow).is_err());
        // Aliases count towards depth: a deep anchor placed deep is too deep.
        let aliased = |levels: usize| {
            format!(
                "a: &a\n  {}x\nb:\n  {}*a\n",
                "- ".repeat(200),
                "- ".repeat(levels)
            )
        };
        assert!(Document::parse(&aliased(50)).is_ok());
        assert!(Document::parse(&aliased(60)).is_err());
    }

    #[test]
    fn size_and_encoding_are_checked() {
        let big = vec![b' '; MAX_ARTIFACT_BYTES + 1];
        let error = Document::parse_bytes(&big).unwrap_err().remove(0);
        assert_eq!((error.position.line, error.position.column), (1, 1));
        let error = Document::parse_bytes(b"a: 1\nb: \xff\n").unwrap_err().remove(0);
        assert_eq!((error.position.line, error.position.column), (2, 4));
    }

    #[test]
    fn js_number_strings() {
        assert_eq!(Number::Float(1.0).to_js_string(), "1");
        assert_eq!(Number::Float(1e21).to_js_string(), "1e+21");
        assert_eq!(Number::Float(0.1).to_js_string(), "0.1");
        assert_eq!(Number::Int(-3).to_js_string(), "-3");
    }
}
