//! Data-driven compiler tests: every `tests/fixtures/compile/<name>.yaml` is
//! a broken (or warning-worthy) artifact, compiled — against
//! `<name>.catalog.yaml` when that sibling exists — and its diagnostics are
//! snapshotted as plain text in `tests/snapshots/compile/<name>.snap`:
//! severity, code, pointer, line:column, message, and each related pointer
//! with its position and note.
//!
//! Every diagnostic code of `policy::Code::ALL` the compiler reports must appear in some snapshot.
//!
//! To add a fixture: drop the YAML in the folder, run
//! `INSTA_UPDATE=always cargo test --test compile_fixtures`, then read the new
//! snapshot against docs/reference.md#compilation before committing it.

// The fixtures and snapshots are files: this test reads the filesystem on purpose.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::{Path, PathBuf};

use capgate_core::policy::{compile, load_catalog, Code, Diagnostic, Position};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/compile");
const SNAPSHOTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/compile");

/// The fixtures (catalog siblings excluded), sorted by name.
fn fixtures() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .expect("the fixture folder exists")
        .map(|entry| entry.expect("readable").path())
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".yaml") && !name.ends_with(".catalog.yaml")
        })
        .collect();
    found.sort();
    found
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .expect("a UTF-8 name")
        .to_owned()
}

fn at(position: Option<Position>) -> String {
    position.map_or_else(|| "-:-".to_owned(), |p| format!("{}:{}", p.line, p.column))
}

fn render(diagnostic: &Diagnostic) -> String {
    let mut out = format!(
        "{} {} at `{}` {}\n  {}\n",
        diagnostic.severity.as_str(),
        diagnostic.code.as_str(),
        diagnostic.path,
        at(diagnostic.position),
        diagnostic.message
    );
    for related in &diagnostic.related {
        out.push_str(&format!(
            "  related `{}` {} ({})\n",
            related.path,
            at(related.position),
            related.note
        ));
    }
    out
}

/// The compiled fixture as snapshot text.
fn compiled(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("readable fixture");
    let catalog_path = path.with_file_name(format!("{}.catalog.yaml", stem(path)));
    let catalog = catalog_path.exists().then(|| {
        let bytes = std::fs::read(&catalog_path).expect("readable catalog");
        load_catalog(&bytes).unwrap_or_else(|error| panic!("{}: {error}", catalog_path.display()))
    });
    let result = compile(&bytes, catalog.as_ref());
    let mut out = format!(
        "catalog: {}\npolicy: {}\n\n",
        if catalog.is_some() { "yes" } else { "no" },
        if result.policy.is_some() {
            "compiles"
        } else {
            "none"
        }
    );
    for diagnostic in &result.diagnostics {
        out.push_str(&render(diagnostic));
    }
    out
}

#[test]
fn every_fixture_matches_its_snapshot() {
    let fixtures = fixtures();
    assert!(!fixtures.is_empty());
    for path in fixtures {
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(SNAPSHOTS);
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.set_input_file(&path);
        settings.bind(|| insta::assert_snapshot!(stem(&path), compiled(&path)));
    }
}

#[test]
fn every_code_is_covered_by_a_fixture_snapshot() {
    let snapshots: Vec<String> = fixtures()
        .iter()
        .map(|path| {
            let snapshot = Path::new(SNAPSHOTS).join(format!("{}.snap", stem(path)));
            std::fs::read_to_string(&snapshot)
                .unwrap_or_else(|_| panic!("no snapshot {}", snapshot.display()))
        })
        .collect();
    let missing: Vec<&str> = Code::ALL
        .iter()
        .filter(|code| code.from_the_compiler())
        .map(|code| code.as_str())
        .filter(|code| {
            !snapshots
                .iter()
                .any(|text| text.contains(&format!(" {code} at `")))
        })
        .collect();
    assert!(missing.is_empty(), "no fixture snapshot shows {missing:?}");
}

#[test]
fn every_fixture_fails_or_warns() {
    // A fixture that compiles without a word tests nothing.
    for path in fixtures() {
        let text = compiled(&path);
        assert!(
            text.lines().count() > 3,
            "{} produces no diagnostic",
            path.display()
        );
    }
}
