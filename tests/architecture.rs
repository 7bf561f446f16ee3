//! The architecture checks Cargo cannot make. The core's own crate already keeps tokio, the store and
//! the rest of the product out of `capgate-core`; what is left is checked here, over source text:
//!
//! 1. the two identities never meet: `core/src/principals` (who calls) and `core/src/accounts` (as
//!    which account a call runs) never name each other;
//! 2. no context of the core reaches into another's internals: across contexts a path names only what
//!    the other context's root declares public (a `pub use`, a `pub` item or a `pub mod`);
//! 3. the core depends only on allow-listed pure crates (docs/decisions/0012);
//! 4. the product's rooms import each other only down the declared layering, which has no cycle;
//! 5. clippy reports every path `core/clippy.toml` bans.
//!
//! Each check is a function over a repository root, run on the real tree and on a fixture under
//! tests/fixtures/architecture/ that breaks it, so a check that stops seeing anything fails too. The
//! scanner is deliberately small: comments, strings and char literals are blanked out, and the paths
//! that start with `crate`, `capgate`, `self` or `super` are read from the tokens that remain.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

/// The crates the core may depend on: none of them reads a clock, a file, the environment or the
/// network. Adding one is a design decision (docs/decisions/0012), taken there before it is made here.
const PURE_DEPENDENCIES: &[&str] = &[
    "saphyr-parser",
    "ryu-js",
    "fluent-uri",
    "sha2",
    "rustc-hash",
    "strsim",
    // Conditions' arguments (docs/decisions/0034).
    "serde_json",
    // Time windows: pure only without its default features, which read the host's zone files
    // (`tz-system`, `tzdb-zoneinfo`); the test below checks that they are off.
    "jiff",
];

/// Every room may import the rooms listed with it and no other; lower rooms never import higher ones.
/// `main.rs` is the process edge and may import anything; `lib.rs` only declares the rooms.
const ROOMS: &[(&str, &str)] = &[
    ("clock", ""),
    ("changes", ""),
    ("wire", "clock"),
    ("store", "clock"),
    ("identity", "clock"),
    ("telemetry", "wire store changes clock"),
    ("service", "wire store identity telemetry changes clock"),
    ("cli", "service wire store identity telemetry changes clock"),
    ("lib", ""),
    ("main", "cli service wire store identity telemetry changes clock"),
];

// ---------------------------------------------------------------------------------------------------
// The scanner
// ---------------------------------------------------------------------------------------------------

/// `source` with comments, string literals and char literals turned into spaces. Newlines are kept,
/// so a line counted in the result is a line of the source.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let find = |from: usize, wanted: &dyn Fn(usize) -> bool| (from..chars.len()).find(|&j| wanted(j));
    let ident_at = |k: usize| chars.get(k).is_some_and(|c| c.is_alphanumeric() || *c == '_');
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        // `r"…"` and `br"…"` open raw strings; `r#ident` does not.
        let word_starts = i == 0 || !ident_at(i - 1) || (chars[i - 1] == 'b' && (i == 1 || !ident_at(i - 2)));
        let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
        let end = if c == '/' && next == Some('/') {
            find(i, &|j| chars[j] == '\n').unwrap_or(chars.len())
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let (mut depth, mut j) = (0, i);
            loop {
                match (chars.get(j), chars.get(j + 1)) {
                    (Some('/'), Some('*')) => (depth, j) = (depth + 1, j + 2),
                    (Some('*'), Some('/')) if depth == 1 => break j + 2,
                    (Some('*'), Some('/')) => (depth, j) = (depth - 1, j + 2),
                    (None, _) => break j,
                    _ => j += 1,
                }
            }
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            (j + 1).min(chars.len())
        } else if c == 'r' && word_starts && chars.get(i + 1 + hashes) == Some(&'"') {
            // A raw string ends at a quote followed by as many `#` as it opened with.
            let closes = |j: usize| chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#'));
            find(i + 2 + hashes, &closes).map_or(chars.len(), |j| j + 1 + hashes)
        } else if c == '\'' && next == Some('\\') {
            find(i + 3, &|j| chars[j] == '\'').map_or(chars.len(), |j| j + 1)
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i + 3
        } else {
            // Anything else, lifetimes included, is code.
            out.push(c);
            i += 1;
            continue;
        };
        out.extend(chars[i..end].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
        i = end;
    }
    out
}

/// The tokens paths are made of, each with its line; other punctuation is dropped.
fn tokens(code: &str) -> Vec<(&str, usize)> {
    let token = Regex::new(r"[A-Za-z_][A-Za-z0-9_]*|::|[{},;*]").expect("a valid pattern");
    let (mut line, mut counted) = (1, 0);
    let with_line = |found: regex::Match<'_>| {
        line += code[counted..found.start()].matches('\n').count();
        counted = found.start();
        (&code[found.range()], line)
    };
    token.find_iter(code).map(with_line).collect()
}

fn is_ident(token: &str) -> bool {
    token.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// A path as written, with the line of its last segment: `(7, ["super", "super", "cli", "now_ms"])`.
type Written = (usize, Vec<String>);

/// Expands the use tree at `tokens[i]` under `path` into its leaves and returns the index after it. An
/// alias (`as`) does not change what a leaf names; `{self}` names the prefix.
fn use_tree(tokens: &[(&str, usize)], mut i: usize, mut path: Vec<String>, out: &mut Vec<Written>) -> usize {
    let mut line = tokens.get(i).map_or(0, |t| t.1);
    loop {
        match tokens.get(i).map(|t| t.0) {
            Some("{") => {
                i += 1;
                while tokens.get(i).is_some_and(|t| t.0 != "}") {
                    let before = i;
                    i = use_tree(tokens, i, path.clone(), out);
                    i += usize::from(i == before || tokens.get(i).is_some_and(|t| t.0 == ","));
                }
                return i + 1;
            }
            Some("::") => i += 1,
            Some("self") if !path.is_empty() => i += 1,
            Some("as") => i += 2,
            Some(segment) if is_ident(segment) || segment == "*" => {
                (line, i) = (tokens[i].1, i + 1);
                path.push(segment.to_owned());
            }
            _ => {
                out.extend((!path.is_empty()).then_some((line, path)));
                return i;
            }
        }
    }
}

/// The paths `source` writes that resolve into its own crate, read as the module `module`: every
/// leaf of a `use` and every path rooted at `crate`, `capgate` (from the binary), `self` or `super`,
/// each as written and resolved from the crate root. Inline modules (`mod tests {`) are followed, so
/// that their `super` resolves where the compiler resolves it.
fn crate_paths(source: &str, mut module: Vec<String>) -> Vec<(Written, Vec<String>)> {
    let code = code_only(source);
    let tokens = tokens(&code);
    let (mut depth, mut inline, mut found, mut i) = (0usize, Vec::new(), Vec::new(), 0);
    while i < tokens.len() {
        let mut written = Vec::new();
        match tokens[i].0 {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                    module.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.0 == "{") => {
                module.push(tokens[i + 1].0.to_owned());
                inline.push(depth);
            }
            "use" => i = use_tree(&tokens, i + 1, Vec::new(), &mut written) - 1,
            "crate" | "capgate" | "self" | "super" => {
                let mut path = vec![tokens[i].0.to_owned()];
                while tokens.get(i + 1).is_some_and(|t| t.0 == "::")
                    && tokens.get(i + 2).is_some_and(|t| is_ident(t.0))
                {
                    path.push(tokens[i + 2].0.to_owned());
                    i += 2;
                }
                written.push((tokens[i].1, path));
            }
            _ => {}
        }
        found.extend(
            written
                .into_iter()
                .filter_map(|w| resolve(&module, &w.1).map(|to| (w, to))),
        );
        i += 1;
    }
    found
}

/// `path` from the crate root, if it starts there or at the module; other paths name other crates.
fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let supers = path.iter().take_while(|segment| *segment == "super").count();
    let absolute: Vec<String> = match path[0].as_str() {
        "crate" | "capgate" => path[1..].to_vec(),
        "self" | "super" if supers <= module.len() => {
            let (base, rest) = (&module[..module.len() - supers], &path[supers.max(1)..]);
            base.iter().chain(rest).cloned().collect()
        }
        _ => return None,
    };
    (!absolute.is_empty()).then_some(absolute)
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let (mut found, mut pending) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The top module a file of `src` belongs to (its context, or its room; `lib.rs` is `lib`, `main.rs`
/// is `main`) and the file's own module path.
fn place(relative: &Path) -> (String, Vec<String>) {
    let mut module: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|s| s.to_string_lossy().into())
        .collect();
    let top = module[0].clone();
    if (module.len() == 1 && (top == "lib" || top == "main")) || module.last().is_some_and(|l| l == "mod") {
        module.pop();
    }
    (top, module)
}

/// A crate path written in a file of `dir`: where, from which top module, as written, and resolved.
struct Reference {
    at: String,
    from: String,
    written: String,
    path: Vec<String>,
}

fn references(root: &Path, dir: &str) -> Vec<Reference> {
    let mut found = Vec::new();
    for file in rust_files(&root.join(dir)) {
        let relative = file.strip_prefix(root.join(dir)).expect("under the directory");
        let (from, module) = place(relative);
        let source = fs::read_to_string(&file).expect("a readable source file");
        found.extend(
            crate_paths(&source, module)
                .into_iter()
                .map(|((line, written), path)| Reference {
                    at: format!("{dir}/{}:{line}", relative.display()),
                    from: from.clone(),
                    written: written.join("::"),
                    path,
                }),
        );
    }
    found
}

// ---------------------------------------------------------------------------------------------------
// The checks, each over a repository root
// ---------------------------------------------------------------------------------------------------

/// Check 1: principals and accounts are two identities that only `access` and `policy` bring together.
fn identities_meeting(root: &Path) -> Vec<String> {
    let meet = |r: &Reference| {
        matches!(
            (&*r.from, &*r.path[0]),
            ("principals", "accounts") | ("accounts", "principals")
        )
    };
    let references = references(root, "core/src").into_iter().filter(meet);
    references
        .map(|r| format!("{}: {} names {}: {}", r.at, r.from, r.path[0], r.written))
        .collect()
}

/// The names a context's root (`mod.rs`, or the context's single file) makes public: its `pub use`
/// re-exports (aliases included), the items it defines `pub` or `pub(…)`, and the modules it declares
/// plainly `pub` — the crate's public API, such as `policy::syntax`. A `pub(crate) mod` is internal.
fn public_surface(root_file: &Path) -> BTreeSet<String> {
    let code = code_only(&fs::read_to_string(root_file).expect("a readable context root"));
    let kinds = r"(?:(?:const|async|unsafe|extern)\s+)*(?:struct|enum|fn|const|static|type|trait|union)";
    let item = Regex::new(&format!(
        r"\bpub(?:\s*\([^)]*\))?\s+{kinds}\s+(\w+)|\bpub\s+mod\s+(\w+)"
    ))
    .unwrap();
    let reexport = Regex::new(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]*);").unwrap();
    let mut names: BTreeSet<String> = item
        .captures_iter(&code)
        .filter_map(|c| Some(c.get(1).or(c.get(2))?.as_str().to_owned()))
        .collect();
    for body in reexport.captures_iter(&code) {
        // In `a::{B, C as D}` the names are those not followed by `::`: B, C and D.
        let tokens = tokens(&body[1]);
        for (k, (token, _)) in tokens.iter().enumerate() {
            let last = tokens.get(k + 1).is_none_or(|next| next.0 != "::");
            if last && is_ident(token) && !["as", "self", "crate", "super"].contains(token) {
                names.insert((*token).to_owned());
            }
        }
    }
    names
}

/// Check 2: across contexts, the segment after `crate::<context>` must be public at the context's root.
/// A context imported whole (`use crate::policy;`) and then walked (`policy::x::Y`) is not followed;
/// the compiler's privacy already stops that for every module but the `pub` and `pub(…)` ones.
fn reaches_inside(root: &Path) -> Vec<String> {
    let mut surfaces = BTreeMap::new();
    for entry in fs::read_dir(root.join("core/src")).expect("core/src") {
        let path = entry.expect("a directory entry").path();
        match path.file_stem().map(|s| s.to_string_lossy().into_owned()) {
            Some(name) if path.is_dir() => surfaces.insert(name, public_surface(&path.join("mod.rs"))),
            Some(name) if name != "lib" && path.extension().is_some_and(|e| e == "rs") => {
                surfaces.insert(name, public_surface(&path))
            }
            _ => None,
        };
    }
    let reaches = |r: &Reference| {
        let surface = surfaces.get(&r.path[0]).filter(|_| r.path[0] != r.from)?;
        let item = r
            .path
            .get(1)
            .filter(|item| *item != "*" && !surface.contains(*item))?;
        Some(format!(
            "{}: {} reaches inside {}: {} (`{item}` is not public at its root)",
            r.at, r.from, r.path[0], r.written
        ))
    };
    references(root, "core/src").iter().filter_map(reaches).collect()
}

/// Check 3: the packages `core/Cargo.toml` builds the core with that are not on the allow-list. They
/// are read from `[dependencies]`, its target-specific forms and `[dependencies.<name>]` tables, through
/// `package` renames; dev- and build-dependencies never become part of the core.
fn impure_core_dependencies(root: &Path) -> Vec<String> {
    let manifest = fs::read_to_string(root.join("core/Cargo.toml")).expect("core/Cargo.toml");
    let header = Regex::new(r"^\[\s*(?:target\..+\.)?dependencies(?:\.([\w-]+))?\s*\]$").unwrap();
    let package = Regex::new(r#"\bpackage\s*=\s*"([^"]+)""#).unwrap();
    let (mut found, mut in_list, mut table) = (Vec::<(usize, String)>::new(), false, None);
    for (n, line) in manifest.lines().enumerate() {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if line.starts_with('[') {
            let captured = header.captures(line);
            in_list = captured.as_ref().is_some_and(|c| c.get(1).is_none());
            table = captured.and_then(|c| c.get(1)).map(|name| {
                found.push((n + 1, name.as_str().to_owned()));
                found.len() - 1
            });
        } else if let (Some(t), Some(renamed)) = (table, package.captures(line)) {
            found[t].1 = renamed[1].to_owned();
        } else if let Some((key, _)) = line.split_once('=').filter(|_| in_list && !line.starts_with('#')) {
            let key = key.trim().trim_matches('"').split('.').next().unwrap_or_default();
            found.push((
                n + 1,
                package.captures(line).map_or(key.to_owned(), |c| c[1].to_owned()),
            ));
        }
    }
    let impure = found
        .into_iter()
        .filter(|(_, name)| !PURE_DEPENDENCIES.contains(&name.as_str()));
    impure
        .map(|(line, name)| format!("core/Cargo.toml:{line}: `{name}` {NOT_PURE}"))
        .collect()
}

const NOT_PURE: &str = "is not on the pure core's allow-list; adding a dependency to the core is a \
                        design decision (docs/decisions/0012)";

/// Check 4: every file of `src` is in a room of `rooms`, and every path into another room is allowed.
fn room_violations(root: &Path, rooms: &[(&str, &str)]) -> Vec<String> {
    let allowed = |from: &str| {
        rooms
            .iter()
            .find(|(room, _)| *room == from)
            .map(|(_, to)| to.split_whitespace())
    };
    let (mut on_disk, mut violations) = (BTreeSet::new(), Vec::new());
    for file in rust_files(&root.join("src")) {
        let (room, _) = place(file.strip_prefix(root.join("src")).expect("under src"));
        if allowed(&room).is_none() && !on_disk.contains(&room) {
            let at = file.strip_prefix(root).expect("under the root").display();
            violations.push(format!("{at}: the room `{room}` has no place in ROOMS"));
        }
        on_disk.insert(room);
    }
    for r in references(root, "src") {
        let to = &r.path[0];
        let known = on_disk.contains(to) || allowed(to).is_some();
        if known && *to != r.from && allowed(&r.from).is_some_and(|mut may| !may.any(|m| m == to)) {
            violations.push(format!("{}: {} -> {to}: {}", r.at, r.from, r.written));
        }
    }
    violations
}

/// The rooms of `rooms` that cannot be layered — those on a cycle, above one, or allowed a room the
/// table does not list. Layers are peeled from the bottom: a room is placed once all it imports is.
fn not_layered<'a>(rooms: &[(&'a str, &str)]) -> Vec<&'a str> {
    let mut placed = BTreeSet::new();
    while let Some((room, _)) = rooms
        .iter()
        .find(|(room, below)| !placed.contains(room) && below.split_whitespace().all(|b| placed.contains(&b)))
    {
        placed.insert(*room);
    }
    rooms
        .iter()
        .map(|(room, _)| *room)
        .filter(|room| !placed.contains(room))
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// The real tree and the fixtures
// ---------------------------------------------------------------------------------------------------

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    repository().join("tests/fixtures/architecture").join(name)
}

#[test]
fn the_identities_never_meet() {
    assert_eq!(identities_meeting(repository()), Vec::<String>::new());
    // Not vacuously: the scanner sees `access` and `policy` name both.
    let named: BTreeSet<String> = references(repository(), "core/src")
        .into_iter()
        .filter(|r| r.from == "access" || r.from == "policy")
        .map(|r| r.path[0].clone())
        .collect();
    assert!(
        named.contains("principals") && named.contains("accounts"),
        "{named:?}"
    );
}

#[test]
fn identities_meeting_are_reported() {
    assert_eq!(
        identities_meeting(&fixture("identities_meet")),
        [
            "core/src/accounts/mod.rs:3: accounts names principals: crate::principals::Principal",
            "core/src/accounts/mod.rs:13: accounts names principals: super::super::principals::Issuer",
            "core/src/principals/issuer.rs:3: principals names accounts: crate::accounts::AccountRef",
            "core/src/principals/issuer.rs:6: principals names accounts: \
             super::super::accounts::AccountRef::default",
        ]
    );
}

#[test]
fn no_context_reaches_into_another() {
    assert_eq!(reaches_inside(repository()), Vec::<String>::new());
    let across = references(repository(), "core/src")
        .iter()
        .filter(|r| r.path[0] != r.from)
        .count();
    assert!(
        across > 20,
        "the scanner sees only {across} paths across contexts"
    );
}

#[test]
fn reaches_inside_are_reported() {
    assert_eq!(
        reaches_inside(&fixture("reaches_inside")),
        [
            "core/src/access/evaluate.rs:3: access reaches inside capabilities: \
             super::super::capabilities::exposed::name (`exposed` is not public at its root)",
            "core/src/access/evaluate.rs:6: access reaches inside policy: \
             super::super::policy::model::RawGrant (`model` is not public at its root)",
            "core/src/access/mod.rs:11: access reaches inside policy: \
             crate::policy::model::RawGrant (`model` is not public at its root)",
            "core/src/access/mod.rs:14: access reaches inside policy: \
             crate::policy::checks::run (`checks` is not public at its root)",
        ]
    );
}

#[test]
fn the_core_depends_only_on_pure_crates() {
    assert_eq!(impure_core_dependencies(repository()), Vec::<String>::new());
    let manifest = fs::read_to_string(repository().join("core/Cargo.toml")).expect("core/Cargo.toml");
    let jiff = manifest
        .lines()
        .find(|line| line.starts_with("jiff"))
        .expect("jiff");
    assert!(
        jiff.contains("default-features = false") && jiff.contains("tzdb-bundle-always"),
        "jiff must read only its bundled zone database, never the host's: {jiff}"
    );
}

#[test]
fn impure_core_dependencies_are_reported() {
    let expected = [(11, "tokio"), (14, "chrono"), (17, "rand"), (21, "libc")];
    let expected = expected.map(|(line, name)| format!("core/Cargo.toml:{line}: `{name}` {NOT_PURE}"));
    assert_eq!(impure_core_dependencies(&fixture("impure_core_dep")), expected);
}

#[test]
fn the_room_table_is_a_layering() {
    assert_eq!(not_layered(ROOMS), Vec::<&str>::new());
    let cyclic = [
        ("clock", ""),
        ("cli", "server"),
        ("server", "telemetry clock"),
        ("telemetry", "server"),
    ];
    assert_eq!(not_layered(&cyclic), ["cli", "server", "telemetry"]);
    assert_eq!(not_layered(&[("wire", "clock")]), ["wire"]);
}

#[test]
fn the_rooms_import_only_down_the_layering() {
    let violations = room_violations(repository(), ROOMS);
    let listed = violations.join("\n");
    assert!(
        violations.is_empty(),
        "imports against the layering (ROOMS in tests/architecture.rs):\n{listed}"
    );
}

#[test]
fn rooms_importing_up_the_layering_are_reported() {
    assert_eq!(
        room_violations(&fixture("room_cycle"), ROOMS),
        [
            "src/cache.rs: the room `cache` has no place in ROOMS",
            "src/service/mod.rs:5: service -> cli: crate::cli",
            "src/service/mod.rs:10: service -> cli: crate::cli::now_ms",
            "src/store/mod.rs:7: store -> cli: super::super::cli::now_ms",
            "src/telemetry/rpc.rs:3: telemetry -> service: crate::service::proto::Message",
        ]
    );
}

// ---------------------------------------------------------------------------------------------------
// core/clippy.toml
// ---------------------------------------------------------------------------------------------------

/// The `path`s under `key` in a clippy.toml that keeps one entry per line, except those marked
/// `allow-invalid` (crates the core does not depend on, which the probe cannot call).
fn listed_paths(config: &str, key: &str) -> BTreeSet<String> {
    let path = Regex::new(r#"\bpath\s*=\s*"([^"]+)""#).expect("a valid pattern");
    let mut lines = config
        .lines()
        .skip_while(|line| !(line.starts_with(key) && line.trim_end().ends_with('[')));
    assert!(lines.next().is_some(), "clippy.toml has no `{key} = [`");
    let entries = lines
        .take_while(|line| line.trim() != "]")
        .filter(|line| !line.contains("allow-invalid = true"));
    entries
        .filter_map(|line| Some(path.captures(line)?[1].to_owned()))
        .collect()
}

/// Check 5: clippy, run with core/clippy.toml over a crate that uses every banned path once
/// (clippy_probe/pure.rs), reports each path listed there and calls none of them unknown. The probe
/// builds in a target directory of its own, so it never waits on the lock of the outer build.
#[test]
fn clippy_reports_every_path_core_clippy_toml_bans() {
    let config = fs::read_to_string(repository().join("core/clippy.toml")).expect("core/clippy.toml");
    let probe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("core_clippy_probe");
    fs::create_dir_all(probe.join("src")).expect("the probe directory");
    let manifest =
        "[package]\nname = \"core_clippy_probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n[workspace]\n";
    let pure = fs::read_to_string(fixture("clippy_probe/pure.rs")).expect("the probe's pure.rs");
    for (name, content) in [
        ("Cargo.toml", manifest),
        ("clippy.toml", &config),
        ("src/lib.rs", &pure),
    ] {
        fs::write(probe.join(name), content).expect("the probe can be written");
    }
    let output = Command::new(env!("CARGO"))
        .args(["clippy", "--quiet", "--offline", "--message-format=short"])
        .current_dir(&probe)
        .env("CARGO_TARGET_DIR", probe.join("target"))
        .env_remove("CLIPPY_CONF_DIR")
        .output()
        .expect("cargo runs");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`cargo clippy` failed on the probe:\n{report}"
    );

    let reported = |kind: &str| -> BTreeSet<String> {
        let marker = format!("use of a disallowed {kind} `");
        let after = report
            .lines()
            .filter_map(|line| Some(line.split_once(marker.as_str())?.1));
        after
            .filter_map(|rest| Some(rest.split_once('`')?.0.to_owned()))
            .collect()
    };
    let methods = listed_paths(&config, "disallowed-methods");
    assert!(
        methods.len() > 40,
        "core/clippy.toml lost its list of methods:\n{config}"
    );
    assert_eq!(reported("method"), methods, "methods:\n{report}");
    assert_eq!(
        reported("type"),
        listed_paths(&config, "disallowed-types"),
        "types:\n{report}"
    );
    assert!(
        !report.contains("does not refer to"),
        "clippy.toml lists a path clippy cannot find:\n{report}"
    );
}
