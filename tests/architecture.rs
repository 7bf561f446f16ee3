//! The boundaries of `src/`, as tests (STYLE.md, "Shape"; rust-analyzer's `xtask/src/tidy.rs`).
//!
//! * [`check_tree`] reads every `.rs` file under a `src/` tree and reports forbidden edges between
//!   contexts, periphery names in the core, core files that switch clippy's `disallowed_*` lints off,
//!   and top-level modules nobody has classified. It runs against the real `src/` (expecting nothing)
//!   and against each small tree under `tests/fixtures/architecture/` (expecting that tree's
//!   violation), so every check is seen to fail.
//! * `cargo tree` shows the library without default features pulls in no periphery crate.
//! * clippy itself is run over a probe crate carrying this crate's `clippy.toml`, to show that every
//!   path listed there is real and reported, and that the periphery's opt-out line silences them.
//!
//! What is proven, and what is not. The scanner works on tokens, not on resolved names: it sees
//! `use`/`crate::`/`super::` paths as written (comments and literals stripped, `{…}` groups expanded,
//! inline `mod` blocks followed), but not what a macro expands to, what a `#[path]` attribute or an
//! `include!` points at, or a root-level re-export (`crate::alias::…` where `alias` re-exports a
//! context is not seen as an edge). The compiler closes most of that gap for the periphery: its
//! crates are optional, and CI builds the library without them. For clocks, environment, filesystem
//! and randomness the gate is clippy: that holds only because CI runs clippy with `-D warnings`
//! (scripts/test.sh) and because no core file, nor `Cargo.toml`, switches those lints off, which is
//! checked here.

// This test reads source trees and runs cargo: the opt-out the periphery uses (see clippy.toml).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// ---------------------------------------------------------------------------------------------------
// The rules
// ---------------------------------------------------------------------------------------------------

/// Each core context with the contexts it may use.
type Rules = &'static [(&'static str, &'static [&'static str])];

/// The core contexts and, for each, the contexts it may use. The edges form a DAG; a context may
/// always use itself.
const CORE: Rules = &[
    ("principals", &[]),
    ("capabilities", &[]),
    ("accounts", &[]),
    ("access", &["principals", "accounts", "capabilities"]),
    ("policy", &["principals", "capabilities", "accounts", "access"]),
];

/// The one module that may use everything, and that nothing in the core may use.
const PERIPHERY: &str = "periphery";

/// Crates that belong to the periphery. A core path starting with one of these (or with one of their
/// `_`-suffixed siblings, such as `tower_http`) is a violation. `serde`, `clap` and `anyhow` are here
/// because they are this crate's optional, CLI-only dependencies; `time` is one too but is left out,
/// as `time::…` is also what a core module of that name would be called.
const PERIPHERY_CRATES: &[&str] = &[
    "tokio",
    "tonic",
    "prost",
    "sqlx",
    "opentelemetry",
    "tower",
    "serde",
    "clap",
    "anyhow",
];

/// Modules of `std` that do I/O or read the process's surroundings.
const PERIPHERY_STD_MODULES: &[&str] = &["fs", "net", "env", "process"];

/// Lints whose `allow`/`expect` in the core would switch clippy.toml's lists off: the two lints
/// themselves, the groups they belong to, and rustc's catch-all.
const GUARDED_LINTS: &[&str] = &[
    "clippy::disallowed_methods",
    "clippy::disallowed_types",
    "clippy::style",
    "clippy::all",
    "warnings",
];

/// Crates whose presence in the core's dependency tree means the core is no longer pure.
const PERIPHERY_PACKAGES: &[&str] = &["tokio", "tonic", "prost", "sqlx", "opentelemetry", "tower"];

fn core_dependencies(rules: Rules, context: &str) -> Option<&'static [&'static str]> {
    rules
        .iter()
        .find(|(name, _)| *name == context)
        .map(|(_, uses)| *uses)
}

// ---------------------------------------------------------------------------------------------------
// Violations
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Violation {
    /// A core context uses a module the table above does not allow it to.
    ForbiddenEdge {
        file: String,
        line: usize,
        from: String,
        to: String,
    },
    /// A core file names a periphery crate or one of `std`'s I/O modules.
    PeripheryName { file: String, line: usize, path: String },
    /// A core file allows (or expects) a lint that guards the core's purity.
    LintOptOut { file: String, line: usize, lint: String },
    /// A top-level module that is neither a core context nor the periphery.
    UnknownModule { file: String, module: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ForbiddenEdge { file, line, from, to } => {
                write!(f, "{file}:{line}: `{from}` may not use `{to}`")
            }
            Violation::PeripheryName { file, line, path } => {
                write!(
                    f,
                    "{file}:{line}: the core names `{path}`, which belongs to the periphery"
                )
            }
            Violation::LintOptOut { file, line, lint } => {
                write!(f, "{file}:{line}: the core switches `{lint}` off")
            }
            Violation::UnknownModule { file, module } => write!(
                f,
                "{file}: `{module}` is neither a core context nor `{PERIPHERY}`; add it to `CORE` in \
                 tests/architecture.rs"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Walking a tree
// ---------------------------------------------------------------------------------------------------

/// Where a file sits in the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// `lib.rs`: the crate root. It is compiled into the core build, so names and lints are checked;
    /// it declares every context, so it has no edges to check.
    Root,
    /// `main.rs` or `bin/…`: a binary, which is periphery.
    Binary,
    /// A module file, with its module path (`access/evaluate.rs` is `["access", "evaluate"]`).
    Module(Vec<String>),
}

fn place_of(relative: &Path) -> Place {
    let mut parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [only] if only == "lib.rs" => return Place::Root,
        [only] if only == "main.rs" => return Place::Binary,
        [first, ..] if first == "bin" => return Place::Binary,
        _ => {}
    }
    let file = parts.pop().unwrap_or_default();
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_owned());
    }
    if parts.is_empty() {
        return Place::Root;
    }
    Place::Module(parts)
}

/// Every `.rs` file under `dir`, relative to `root`, in a stable order.
fn rust_files(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("cannot read `{}`: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(root, &path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(
                path.strip_prefix(root)
                    .expect("found under the root")
                    .to_path_buf(),
            );
        }
    }
}

/// Checks the `src/` tree at `root` and returns every violation, in file and line order.
fn check_tree(root: &Path) -> Vec<Violation> {
    check_tree_against(root, CORE)
}

fn check_tree_against(root: &Path, rules: Rules) -> Vec<Violation> {
    let mut files = Vec::new();
    rust_files(root, root, &mut files);
    let placed: Vec<(String, Place)> = files
        .iter()
        .map(|relative| (relative.to_string_lossy().replace('\\', "/"), place_of(relative)))
        .collect();
    let modules: BTreeSet<&str> = placed
        .iter()
        .filter_map(|(_, place)| match place {
            Place::Module(path) => path.first().map(String::as_str),
            _ => None,
        })
        .collect();

    // An unclassified module is reported once, at the file that declares its contents (`mod.rs` or
    // `name.rs`), or at its first file when it has neither.
    let mut unknown: BTreeMap<&str, &str> = BTreeMap::new();
    for (file, place) in &placed {
        let Place::Module(path) = place else { continue };
        let top = path[0].as_str();
        if top == PERIPHERY || core_dependencies(rules, top).is_some() {
            continue;
        }
        let declares = path.len() == 1;
        if declares || !unknown.contains_key(top) {
            unknown.insert(top, file);
        }
    }

    let mut violations = Vec::new();
    for (file, place) in &placed {
        let context = match place {
            Place::Binary => continue,
            Place::Root => None,
            Place::Module(path) => {
                let top = path[0].as_str();
                if top == PERIPHERY {
                    continue;
                }
                if let Some(&declaring) = unknown.get(top) {
                    if declaring == file {
                        violations.push(Violation::UnknownModule {
                            file: file.clone(),
                            module: top.to_owned(),
                        });
                    }
                    continue;
                }
                Some(top)
            }
        };
        let source = fs::read_to_string(root.join(file))
            .unwrap_or_else(|error| panic!("cannot read `{file}`: {error}"));
        let module = match place {
            Place::Module(path) => path.clone(),
            _ => Vec::new(),
        };
        check_core_file(rules, file, &source, &module, context, &modules, &mut violations);
    }
    violations
}

/// Checks one file of the core (or the crate root, when `context` is `None`).
fn check_core_file(
    rules: Rules,
    file: &str,
    source: &str,
    module: &[String],
    context: Option<&str>,
    modules: &BTreeSet<&str>,
    violations: &mut Vec<Violation>,
) {
    let tokens = lex(source);
    let mut found = Vec::new();
    for path in written_paths(&tokens, module) {
        match resolve(&path.module, &path.segments) {
            Target::Internal(target) => {
                let (Some(from), Some(to)) = (context, target.first()) else {
                    continue;
                };
                // A name at the crate root that is not a module (a re-export, a macro) is not an edge
                // the scanner can follow; see the module documentation.
                let is_module = modules.contains(to.as_str()) || to == PERIPHERY;
                let allowed = to == from
                    || core_dependencies(rules, from).is_some_and(|uses| uses.contains(&to.as_str()));
                if is_module && !allowed {
                    found.push(Violation::ForbiddenEdge {
                        file: file.to_owned(),
                        line: path.line,
                        from: from.to_owned(),
                        to: to.clone(),
                    });
                }
            }
            Target::External(segments) => {
                if names_periphery(&segments, path.imported) {
                    found.push(Violation::PeripheryName {
                        file: file.to_owned(),
                        line: path.line,
                        path: segments.join("::"),
                    });
                }
            }
        }
    }
    for (line, lint) in switched_off_lints(&tokens) {
        if GUARDED_LINTS.contains(&lint.as_str()) {
            found.push(Violation::LintOptOut {
                file: file.to_owned(),
                line,
                lint,
            });
        }
    }
    // By line; a use group naming one context twice on a line is one violation.
    found.sort_by_key(|violation| {
        let line = match violation {
            Violation::ForbiddenEdge { line, .. }
            | Violation::PeripheryName { line, .. }
            | Violation::LintOptOut { line, .. } => *line,
            Violation::UnknownModule { .. } => 0,
        };
        (line, violation.to_string())
    });
    found.dedup();
    violations.extend(found);
}

fn names_periphery(segments: &[String], imported: bool) -> bool {
    let Some(first) = segments.first() else {
        return false;
    };
    // A lone identifier is only a crate name where crates are named: in `use` and `extern crate`.
    let names_a_crate = segments.len() > 1 || imported;
    let periphery_crate = PERIPHERY_CRATES
        .iter()
        .any(|name| first == name || first.strip_prefix(name).is_some_and(|rest| rest.starts_with('_')));
    let periphery_std = first == "std"
        && segments
            .get(1)
            .is_some_and(|module| PERIPHERY_STD_MODULES.contains(&module.as_str()));
    (names_a_crate && periphery_crate) || periphery_std
}

// ---------------------------------------------------------------------------------------------------
// Tokens: Rust source with comments and literals dropped
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Open(char),
    Close(char),
    Punct(char),
    /// A string, character or number literal: its content is never code.
    Literal,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Splits `source` into tokens. Comments (nested block comments included), strings (raw, byte and C
/// strings included), characters and lifetimes are consumed so that nothing inside them looks like
/// code.
fn lex(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let at = |index: usize| chars.get(index).copied();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while let Some(c) = at(i) {
        let start_line = line;
        let tok = match c {
            '\n' => {
                line += 1;
                i += 1;
                continue;
            }
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '/' if at(i + 1) == Some('/') => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
                continue;
            }
            '/' if at(i + 1) == Some('*') => {
                i = skip_block_comment(&chars, i, &mut line);
                continue;
            }
            '"' => {
                i = skip_string(&chars, i + 1, &mut line);
                Tok::Literal
            }
            '\'' => {
                if at(i + 1) == Some('\\') {
                    // An escaped character: skip the backslash and the escaped character, then up to
                    // the closing quote (`'\u{1F600}'`).
                    i += 3;
                    while at(i).is_some_and(|c| c != '\'') {
                        i += 1;
                    }
                    i += 1;
                    Tok::Literal
                } else if at(i + 2) == Some('\'') {
                    i += 3;
                    Tok::Literal
                } else {
                    // A lifetime or a label.
                    i += 1;
                    while at(i).is_some_and(is_ident_continue) {
                        i += 1;
                    }
                    continue;
                }
            }
            c if c.is_ascii_digit() => {
                while at(i).is_some_and(is_ident_continue) {
                    i += 1;
                }
                Tok::Literal
            }
            c if is_ident_start(c) => {
                let start = i;
                while at(i).is_some_and(is_ident_continue) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                if matches!(word.as_str(), "r" | "br" | "cr") {
                    let mut quote = i;
                    while at(quote) == Some('#') {
                        quote += 1;
                    }
                    if at(quote) == Some('"') {
                        i = skip_raw_string(&chars, quote + 1, quote - i, &mut line);
                        tokens.push(Token {
                            tok: Tok::Literal,
                            line: start_line,
                        });
                        continue;
                    }
                }
                if word == "r" && at(i) == Some('#') && at(i + 1).is_some_and(is_ident_start) {
                    // A raw identifier, `r#type`.
                    let start = i + 1;
                    i = start;
                    while at(i).is_some_and(is_ident_continue) {
                        i += 1;
                    }
                    Tok::Ident(chars[start..i].iter().collect())
                } else if matches!(word.as_str(), "b" | "c") && at(i) == Some('"') {
                    i = skip_string(&chars, i + 1, &mut line);
                    Tok::Literal
                } else if word == "b" && at(i) == Some('\'') {
                    i += if at(i + 1) == Some('\\') { 3 } else { 2 };
                    while at(i).is_some_and(|c| c != '\'') {
                        i += 1;
                    }
                    i += 1;
                    Tok::Literal
                } else {
                    Tok::Ident(word)
                }
            }
            ':' if at(i + 1) == Some(':') => {
                i += 2;
                Tok::PathSep
            }
            '(' | '[' | '{' => {
                i += 1;
                Tok::Open(c)
            }
            ')' | ']' | '}' => {
                i += 1;
                Tok::Close(c)
            }
            c => {
                i += 1;
                Tok::Punct(c)
            }
        };
        tokens.push(Token {
            tok,
            line: start_line,
        });
    }
    tokens
}

/// Skips a block comment starting at `i` (on its `/*`); returns the index after it.
fn skip_block_comment(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            (c, _) => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// Skips an escaped string from `i` (just after its opening quote); returns the index after it.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' => {
                if chars.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            '"' => return i + 1,
            c => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// Skips a raw string from `i` (just after its opening quote) closed by `"` and `hashes` `#`s.
fn skip_raw_string(chars: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while let Some(&c) = chars.get(i) {
        if c == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        if c == '\n' {
            *line += 1;
        }
        i += 1;
    }
    i
}

// ---------------------------------------------------------------------------------------------------
// Paths as written
// ---------------------------------------------------------------------------------------------------

/// A path as written, expanded out of any `{…}` group, with the module it was written in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrittenPath {
    /// The file's module plus any inline `mod name { … }` the path sits in.
    module: Vec<String>,
    segments: Vec<String>,
    line: usize,
    /// Written in a `use` or `extern crate` item, where a single identifier names a crate.
    imported: bool,
}

/// Every path in `tokens`, in order.
fn written_paths(tokens: &[Token], file_module: &[String]) -> Vec<WrittenPath> {
    let tok = |index: usize| tokens.get(index).map(|token| &token.tok);
    let ident = |index: usize, word: &str| matches!(tok(index), Some(Tok::Ident(w)) if w == word);
    let mut paths = Vec::new();
    let mut depth = 0;
    // Inline modules we are inside, with the brace depth of their body.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while let Some(current) = tok(i) {
        let previous = i.checked_sub(1).and_then(tok);
        match current {
            Tok::Open('{') if !ident(i.wrapping_sub(1), "use") => {
                depth += 1;
                i += 1;
            }
            Tok::Close('}') => {
                if inline.last().is_some_and(|(_, body)| *body == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(word) if word == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open('{'))) = (tok(i + 1), tok(i + 2)) {
                    inline.push((name.clone(), depth + 1));
                    depth += 1;
                    i += 3;
                } else {
                    i += 2;
                }
            }
            _ if starts_path(current, previous) => {
                let imported = ident(i.wrapping_sub(1), "use")
                    || (ident(i.wrapping_sub(1), "crate") && ident(i.wrapping_sub(2), "extern"));
                // A leading `::` names an external crate, exactly as the same path without it.
                let start = if matches!(current, Tok::PathSep) { i + 1 } else { i };
                let (leaves, next) = parse_tree(tokens, start, Vec::new());
                let mut module = file_module.to_vec();
                module.extend(inline.iter().map(|(name, _)| name.clone()));
                for (segments, line) in leaves {
                    if !segments.is_empty() {
                        paths.push(WrittenPath {
                            module: module.clone(),
                            segments,
                            line,
                            imported,
                        });
                    }
                }
                i = next.max(i + 1);
            }
            _ => i += 1,
        }
    }
    paths
}

/// Whether a path begins at `current`: not in the middle of one, and, for a leading `::`, not right
/// after a name or a type, where `::` continues it (`Vec::<u8>::new`). A `{` only gets here after
/// `use`, where it opens a group.
fn starts_path(current: &Tok, previous: Option<&Tok>) -> bool {
    match (current, previous) {
        (_, Some(Tok::PathSep)) => false,
        (Tok::PathSep, Some(Tok::Ident(_) | Tok::Close(_) | Tok::Punct('>'))) => false,
        (Tok::Ident(_) | Tok::Open('{') | Tok::PathSep, _) => true,
        _ => false,
    }
}

/// Reads a path or a use tree from `i`, below `prefix`; returns its leaves (segments and the line of
/// the last segment) and the index after it.
fn parse_tree(tokens: &[Token], mut i: usize, prefix: Vec<String>) -> (Vec<(Vec<String>, usize)>, usize) {
    let tok = |index: usize| tokens.get(index).map(|token| &token.tok);
    let mut segments = prefix;
    let mut line = tokens.get(i).map_or(0, |token| token.line);
    loop {
        match tok(i) {
            Some(Tok::Ident(word)) => {
                segments.push(word.clone());
                line = tokens[i].line;
                i += 1;
                if tok(i) == Some(&Tok::PathSep) {
                    i += 1;
                } else {
                    return (vec![(segments, line)], i);
                }
            }
            Some(Tok::Open('{')) => {
                i += 1;
                let mut leaves = Vec::new();
                loop {
                    match tok(i) {
                        None => return (leaves, i),
                        Some(Tok::Close('}')) => return (leaves, i + 1),
                        Some(Tok::Ident(_) | Tok::Open('{') | Tok::Punct('*')) => {
                            let (subtree, next) = parse_tree(tokens, i, segments.clone());
                            leaves.extend(subtree);
                            i = skip_to_separator(tokens, next);
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            Some(Tok::Punct('*')) => return (vec![(segments, line)], i + 1),
            // A turbofish (`::<`) or anything else ends the path.
            _ => return (vec![(segments, line)], i),
        }
    }
}

/// Skips what follows a use-tree item (`as name`) up to the `,` or `}` that ends it.
fn skip_to_separator(tokens: &[Token], mut i: usize) -> usize {
    let mut nesting = 0usize;
    while let Some(token) = tokens.get(i) {
        match token.tok {
            Tok::Open(_) => nesting += 1,
            Tok::Close(_) if nesting == 0 => return i,
            Tok::Close(_) => nesting -= 1,
            Tok::Punct(',') if nesting == 0 => return i,
            _ => {}
        }
        i += 1;
    }
    i
}

/// What a path refers to.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A module path from the crate root.
    Internal(Vec<String>),
    /// An external crate, or a name relative to the current module.
    External(Vec<String>),
}

fn resolve(module: &[String], segments: &[String]) -> Target {
    let keep = |segment: &&String| *segment != "self";
    match segments.first().map(String::as_str) {
        Some("crate") => Target::Internal(segments[1..].iter().filter(keep).cloned().collect()),
        Some("self" | "super") => {
            let mut base = module.to_vec();
            let relative = segments
                .iter()
                .take_while(|segment| *segment == "self" || *segment == "super");
            let steps = relative.clone().count();
            for segment in relative {
                if segment == "super" {
                    // INVARIANT: more `super`s than module depth do not compile; stay at the root.
                    base.pop();
                }
            }
            base.extend(segments[steps..].iter().filter(keep).cloned());
            Target::Internal(base)
        }
        _ => Target::External(
            segments
                .iter()
                .enumerate()
                .filter(|(k, s)| *k == 0 || keep(s))
                .map(|(_, s)| s.clone())
                .collect(),
        ),
    }
}

/// The lints named in every `allow(…)` and `expect(…)`, with their line (`cfg_attr` included).
fn switched_off_lints(tokens: &[Token]) -> Vec<(usize, String)> {
    let mut lints = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let Tok::Ident(word) = &token.tok else { continue };
        let is_attribute_call = (word == "allow" || word == "expect")
            && tokens.get(i + 1).map(|t| &t.tok) == Some(&Tok::Open('('))
            // `.expect(…)` is a method call, not a lint level.
            && !(i > 0 && tokens[i - 1].tok == Tok::Punct('.'));
        if !is_attribute_call {
            continue;
        }
        let mut current = String::new();
        let mut line = token.line;
        for inner in &tokens[i + 2..] {
            match &inner.tok {
                Tok::Ident(name) => {
                    if current.is_empty() {
                        line = inner.line;
                    }
                    current.push_str(name);
                }
                Tok::PathSep => current.push_str("::"),
                Tok::Punct(',') | Tok::Close(')') => {
                    if !current.is_empty() {
                        lints.push((line, std::mem::take(&mut current)));
                    }
                    if inner.tok == Tok::Close(')') {
                        break;
                    }
                }
                _ => break,
            }
        }
    }
    lints
}

// ---------------------------------------------------------------------------------------------------
// The real tree
// ---------------------------------------------------------------------------------------------------

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rendered(violations: &[Violation]) -> Vec<String> {
    violations.iter().map(ToString::to_string).collect()
}

#[test]
fn src_keeps_its_boundaries() {
    let violations = rendered(&check_tree(&manifest_dir().join("src")));
    assert!(
        violations.is_empty(),
        "architecture violations in src/:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_scanner_sees_the_edges_src_really_has() {
    // With every context made a leaf, the allowed edges of the real tree show up as violations: the
    // scanner is reading src/, not passing it for want of understanding it.
    const LEAVES: Rules = &[
        ("principals", &[]),
        ("capabilities", &[]),
        ("accounts", &[]),
        ("access", &[]),
        ("policy", &[]),
    ];
    let edges: BTreeSet<(String, String)> = check_tree_against(&manifest_dir().join("src"), LEAVES)
        .into_iter()
        .filter_map(|violation| match violation {
            Violation::ForbiddenEdge { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .collect();
    for (from, to) in [
        ("access", "principals"),
        ("access", "accounts"),
        ("policy", "access"),
        ("policy", "capabilities"),
    ] {
        assert!(
            edges.contains(&(from.to_owned(), to.to_owned())),
            "`{from}` → `{to}` not seen; saw {edges:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// Fixtures: each check, seen failing
// ---------------------------------------------------------------------------------------------------

/// Runs [`check_tree`] on `tests/fixtures/architecture/<name>` and compares what it reports.
fn check(name: &str, expected: &[&str]) {
    let root = manifest_dir().join("tests/fixtures/architecture").join(name);
    assert!(root.is_dir(), "no fixture tree at `{}`", root.display());
    assert_eq!(rendered(&check_tree(&root)), expected, "fixture `{name}`");
}

#[test]
fn a_tree_that_keeps_every_rule_passes() {
    // Allowed edges, `super` inside inline modules, a periphery that uses everything, and periphery
    // names inside comments, strings and raw strings.
    check("clean", &[]);
}

#[test]
fn a_leaf_context_using_another_context_fails() {
    check(
        "edge_use_crate",
        &["principals/mod.rs:3: `principals` may not use `access`"],
    );
}

#[test]
fn an_edge_in_an_expression_path_fails() {
    check(
        "edge_expression_path",
        &["capabilities/exposed.rs:5: `capabilities` may not use `accounts`"],
    );
}

#[test]
fn an_edge_inside_a_use_group_fails() {
    check(
        "edge_use_group",
        &["access/mod.rs:6: `access` may not use `policy`"],
    );
}

#[test]
fn an_edge_through_super_fails() {
    check(
        "edge_super_escape",
        &[
            "accounts/store.rs:3: `accounts` may not use `policy`",
            "accounts/store.rs:11: `accounts` may not use `access`",
        ],
    );
}

#[test]
fn the_core_using_the_periphery_fails() {
    check(
        "core_uses_periphery",
        &[
            "policy/mod.rs:3: `policy` may not use `periphery`",
            "policy/mod.rs:6: `policy` may not use `periphery`",
        ],
    );
}

#[test]
fn a_periphery_name_in_the_core_fails() {
    check(
        "periphery_names",
        &[
            "access/mod.rs:3: the core names `tokio::sync::Mutex`, which belongs to the periphery",
            "access/mod.rs:4: the core names `tonic::Status`, which belongs to the periphery",
            "access/mod.rs:5: the core names `prost`, which belongs to the periphery",
            "access/mod.rs:6: the core names `sqlx::PgPool`, which belongs to the periphery",
            "access/mod.rs:7: the core names `opentelemetry_sdk::trace`, which belongs to the periphery",
            "access/mod.rs:8: the core names `tower::Service`, which belongs to the periphery",
            "access/mod.rs:9: the core names `std::fs`, which belongs to the periphery",
            "access/mod.rs:9: the core names `std::net::TcpStream`, which belongs to the periphery",
            "access/mod.rs:12: the core names `std::env::var`, which belongs to the periphery",
            "access/mod.rs:13: the core names `std::process::Command`, which belongs to the periphery",
            "lib.rs:3: the core names `serde`, which belongs to the periphery",
        ],
    );
}

#[test]
fn a_core_file_switching_the_disallowed_lints_off_fails() {
    check(
        "lint_opt_out",
        &[
            "access/mod.rs:3: the core switches `clippy::disallowed_methods` off",
            "access/mod.rs:6: the core switches `clippy::disallowed_types` off",
            "lib.rs:3: the core switches `warnings` off",
            "policy/mod.rs:3: the core switches `clippy::all` off",
        ],
    );
}

#[test]
fn an_unclassified_top_level_module_fails() {
    check(
        "unknown_module",
        &["cache/mod.rs: `cache` is neither a core context nor `periphery`; add it to `CORE` in tests/architecture.rs"],
    );
}

// ---------------------------------------------------------------------------------------------------
// The core's dependency tree
// ---------------------------------------------------------------------------------------------------

/// The periphery packages in the output of `cargo tree --prefix none` (`name vX.Y.Z …` per line).
fn periphery_packages(tree: &str) -> Vec<String> {
    let found: BTreeSet<String> = tree
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (name, version) = (words.next()?, words.next().unwrap_or(""));
            let periphery = PERIPHERY_PACKAGES.iter().any(|package| {
                name == *package
                    || name
                        .strip_prefix(package)
                        .is_some_and(|rest| rest.starts_with(['-', '_']))
            });
            periphery.then(|| format!("{name} {version}"))
        })
        .collect();
    found.into_iter().collect()
}

#[test]
fn the_core_builds_without_periphery_crates() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--no-default-features",
            "--edges",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(manifest_dir())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8(output.stdout).expect("cargo tree prints UTF-8");
    assert!(
        tree.starts_with("capgate v"),
        "unexpected `cargo tree` output:\n{tree}"
    );
    assert_eq!(
        periphery_packages(&tree),
        Vec::<String>::new(),
        "the core's dependency tree:\n{tree}"
    );
}

#[test]
fn the_dependency_check_flags_a_periphery_crate() {
    let tree = "capgate v0.1.0 (/work/main)\nsha2 v0.10.9\ntokio v1.0.0\nserde v1.0.0\n\
                opentelemetry-otlp v0.1.0\ntokio v1.0.0 (*)\ntokio-util v0.7.0\n";
    assert_eq!(
        periphery_packages(tree),
        ["opentelemetry-otlp v0.1.0", "tokio v1.0.0", "tokio-util v0.7.0"]
    );
}

// ---------------------------------------------------------------------------------------------------
// clippy.toml
// ---------------------------------------------------------------------------------------------------

/// The `path`s listed under `key` in clippy.toml, each with whether it is marked `allow-invalid`.
/// clippy.toml keeps one entry per line, which is all this reader understands.
fn listed_paths(config: &str, key: &str) -> Vec<(String, bool)> {
    let path = regex::Regex::new(r#"\bpath\s*=\s*"([^"]+)""#).expect("a valid pattern");
    let start = config
        .lines()
        .position(|line| line.trim_start().starts_with(key) && line.trim_end().ends_with('['))
        .unwrap_or_else(|| panic!("clippy.toml has no `{key} = [`"));
    config
        .lines()
        .skip(start + 1)
        .take_while(|line| line.trim() != "]")
        .filter_map(|line| {
            let found = path.captures(line)?;
            Some((found[1].to_owned(), line.contains("allow-invalid = true")))
        })
        .collect()
}

fn clippy_config() -> String {
    fs::read_to_string(manifest_dir().join("clippy.toml")).expect("clippy.toml exists")
}

#[test]
fn clippy_toml_forbids_clocks_environment_filesystem_and_randomness() {
    let config = clippy_config();
    let methods: Vec<String> = listed_paths(&config, "disallowed-methods")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let types: Vec<String> = listed_paths(&config, "disallowed-types")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let required_methods = [
        "std::time::SystemTime::now",
        "std::time::Instant::now",
        "std::env::var",
        "std::env::var_os",
        "std::env::vars",
        "std::env::args",
        "std::fs::read",
        "std::fs::read_to_string",
        "std::fs::write",
        "std::fs::File::open",
        "std::fs::File::create",
        "std::collections::hash_map::RandomState::new",
        "rand::random",
        "rand::thread_rng",
    ];
    let required_types = [
        "std::time::SystemTime",
        "std::time::Instant",
        "std::fs::File",
        "std::process::Command",
    ];
    let missing: Vec<&str> = required_methods
        .iter()
        .filter(|path| !methods.iter().any(|listed| listed == *path))
        .chain(
            required_types
                .iter()
                .filter(|path| !types.iter().any(|listed| listed == *path)),
        )
        .copied()
        .collect();
    assert!(missing.is_empty(), "clippy.toml no longer forbids: {missing:?}");
}

#[test]
fn cargo_toml_does_not_switch_the_disallowed_lints_off() {
    let manifest = fs::read_to_string(manifest_dir().join("Cargo.toml")).expect("Cargo.toml exists");
    let offending: Vec<&str> = manifest
        .lines()
        .filter(|line| {
            let line = line.trim();
            let guarded = [
                "disallowed_methods",
                "disallowed_types",
                "disallowed-methods",
                "disallowed-types",
            ]
            .iter()
            .any(|lint| line.starts_with(lint))
                || ["all", "style", "warnings"].iter().any(|group| {
                    line.strip_prefix(group)
                        .is_some_and(|rest| rest.trim_start().starts_with('='))
                });
            guarded && (line.contains("allow") || line.contains("expect"))
        })
        .collect();
    assert!(
        offending.is_empty(),
        "Cargo.toml switches guarded lints off: {offending:?}"
    );
}

/// Runs clippy over a crate made of `clippy_probe/pure.rs` (one use of every forbidden path) and
/// `clippy_probe/periphery.rs` (the same kind of calls under the periphery's opt-out line), with this
/// crate's clippy.toml. Every path listed there (except `allow-invalid` ones, from crates capgate does
/// not depend on, which cannot be called at all) must be reported in `pure.rs`, nothing may be reported
/// in `periphery.rs`, and clippy must not call any listed path unknown.
#[test]
fn clippy_reports_every_listed_path_and_the_periphery_opt_out_silences_it() {
    let fixture = manifest_dir().join("tests/fixtures/architecture/clippy_probe");
    let probe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clippy_probe");
    fs::create_dir_all(probe.join("src")).expect("the probe directory can be created");
    let files = [
        (
            "Cargo.toml",
            "[package]\nname = \"clippy_probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n"
                .to_owned(),
        ),
        ("clippy.toml", clippy_config()),
        ("src/lib.rs", "pub mod periphery;\npub mod pure;\n".to_owned()),
        (
            "src/pure.rs",
            fs::read_to_string(fixture.join("pure.rs")).expect("the probe's pure.rs"),
        ),
        (
            "src/periphery.rs",
            fs::read_to_string(fixture.join("periphery.rs")).expect("the probe's periphery.rs"),
        ),
    ];
    for (name, content) in files {
        fs::write(probe.join(name), content).expect("the probe can be written");
    }

    let output = Command::new(env!("CARGO"))
        .args(["clippy", "--quiet", "--message-format=short"])
        .current_dir(&probe)
        .env("CARGO_TARGET_DIR", probe.join("target"))
        .env_remove("CLIPPY_CONF_DIR")
        .output()
        .expect("cargo runs");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`cargo clippy` failed on the probe (is clippy installed? `rustup component add clippy`):\n{report}"
    );

    let reported = |file: &str, kind: &str| -> BTreeSet<String> {
        let marker = format!("warning: use of a disallowed {kind} `");
        report
            .lines()
            .filter(|line| line.starts_with(file))
            .filter_map(|line| line.split_once(marker.as_str()))
            .filter_map(|(_, rest)| rest.split_once('`').map(|(path, _)| path.to_owned()))
            .collect()
    };
    let config = clippy_config();
    let callable = |key: &str| -> BTreeSet<String> {
        listed_paths(&config, key)
            .into_iter()
            .filter(|(_, invalid)| !invalid)
            .map(|(path, _)| path)
            .collect()
    };

    assert_eq!(
        reported("src/pure.rs", "method"),
        callable("disallowed-methods"),
        "methods:\n{report}"
    );
    assert_eq!(
        reported("src/pure.rs", "type"),
        callable("disallowed-types"),
        "types:\n{report}"
    );
    let in_periphery: Vec<&str> = report
        .lines()
        .filter(|line| line.starts_with("src/periphery.rs") && line.contains("disallowed"))
        .collect();
    assert!(
        in_periphery.is_empty(),
        "the opt-out did not silence clippy:\n{}",
        in_periphery.join("\n")
    );
    assert!(
        !report.contains("does not refer to"),
        "clippy.toml lists a path clippy cannot find:\n{report}"
    );
}
