//! Every command and SQL snippet in README.md and docs/ runs as written.
//!
//! The test reads every fenced block tagged `sh`, `bash`, `shell` or `console` (commands; of a
//! `console` block, the `$ ` lines) and `sql` from README.md and docs/**/*.md, and runs it. Not
//! docs/decisions/: a decision record keeps the commands of its day as evidence of what was
//! decided, and is not a manual anyone follows. A block is named `file:line`, the line of its
//! opening fence. A block tagged otherwise (`text`, `yaml`, `json`, none) is output or
//! configuration, not something to run.
//!
//! * **Commands** run in `bash -euo pipefail`, each block in a shell of its own, in one scratch
//!   folder that holds what the docs assume of the repository root: a copy of `examples/`, and
//!   `policy.yaml` and `catalog.yaml` (the example's, standing for "your policy"). `capgate` is on
//!   `PATH`. One `capgate serve` on the example policy answers every block, on a loopback port,
//!   with the folder's `capgate.db` as its SQLite store, so that `capgate audit` finds it as the
//!   docs say. The docs name the address `127.0.0.1:50051` (the default) and, for a deployed
//!   service, `capgate.internal:50051`; both are replaced by the server's. `postgres://…/capgate`
//!   is replaced by a fresh PostgreSQL database served by a second `capgate serve`.
//!   The environment the docs tell a user to set is set: `CAPGATE_SERVER`; `CAPGATE_TOKEN` and
//!   `ADMIN_TOKEN`, the server's admin token (also in `./admin.token` and `./admin-ci.token`);
//!   `GATEWAY_TOKEN`; `BATCH_KEY`, the example's `nightly` static key, which the server is given;
//!   `USER_JWT`, a token the example's made-up identity provider cannot verify (the answer is a
//!   refusal, and the command runs).
//! * The blocks run in order, README.md first and then docs/ by path, as a reader goes through
//!   them, and what they change on the server stays: the docs' rollbacks name revisions 4 and 5,
//!   so before the first block the harness publishes three variants of the example and then the
//!   example again (revision 5, active).
//! * **SQL** runs after a few decisions were recorded, on both stores: docs/audit.md promises its
//!   statements run unchanged on PostgreSQL and SQLite. `<!-- snippet: postgres -->` or
//!   `<!-- snippet: sqlite -->` right before a block names the one store it is written for.
//! * `<!-- snippet: skip: REASON -->` right before a block skips it (docker, a cluster, minutes of
//!   `cargo bench`, …); every skip is printed with its reason. A marker without a reason, an
//!   unknown marker, or one that precedes no block fails the test.
//!
//! A block fails the test when it exits non-zero or runs longer than [`BLOCK_TIMEOUT`] seconds;
//! the failure shows `file:line`, the block, its stdout and its stderr. Every failure is listed,
//! not only the first. Without `DATABASE_URL` the PostgreSQL side is skipped (and said to be),
//! unless `CAPGATE_REQUIRE_POSTGRES=1`.

mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sqlx::{AssertSqlSafe, Connection};

use support::postgres::TestDatabase;
use support::process::Serve;

/// How long one command block may run, in seconds (`timeout` kills it after).
const BLOCK_TIMEOUT: &str = "60";

/// The fence tags of command blocks.
const COMMAND_TAGS: [&str; 4] = ["sh", "bash", "shell", "console"];

const ADMIN_TOKEN: &str = "snippets-admin-token";
const GATEWAY_TOKEN: &str = "snippets-gateway-token";
const BATCH_KEY: &str = "snippets-nightly-key";

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Shell commands.
    Command,
    /// Statements for a capgate store.
    Sql,
}

/// The stores an SQL block is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stores {
    Both,
    Postgres,
    Sqlite,
}

/// What the marker right before a block says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    None,
    Skip(String),
    Only(Stores),
}

/// A fenced block to run.
#[derive(Debug, Clone)]
struct Block {
    /// `file:line` of its opening fence.
    site: String,
    kind: Kind,
    /// What runs: for `console`, the commands without their `$ `.
    text: String,
    marker: Marker,
}

/// Every command and SQL block of `markdown`, or every problem with its markers.
fn extract(file: &str, markdown: &str) -> Result<Vec<Block>, Vec<String>> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    // The lines (0-based) of the markers a block took, to find the stray ones.
    let mut used_markers = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            at += 1;
            continue;
        };
        let indent = line.len() - trimmed.len();
        let tag = info.split_whitespace().next().unwrap_or("");
        let fence_line = at + 1;
        let mut body = Vec::new();
        at += 1;
        while at < lines.len() && !lines[at].trim_start().starts_with("```") {
            // A fence inside a list item is indented, and so is its body.
            let content = lines[at];
            let cut = content.len() - content.trim_start().len();
            body.push(&content[cut.min(indent)..]);
            at += 1;
        }
        at += 1;
        let kind = if COMMAND_TAGS.contains(&tag) {
            Kind::Command
        } else if tag == "sql" {
            Kind::Sql
        } else {
            continue;
        };
        let site = format!("{file}:{fence_line}");
        let before = (0..fence_line - 1).rev().find(|&i| !lines[i].trim().is_empty());
        let marker = match before.map(|i| (i, lines[i].trim())) {
            Some((i, text)) if text.starts_with("<!-- snippet:") => {
                used_markers.push(i);
                match parse_marker(text) {
                    Ok(marker) => marker,
                    Err(problem) => {
                        problems.push(format!("{file}:{}: {problem}", i + 1));
                        Marker::None
                    }
                }
            }
            _ => Marker::None,
        };
        if kind == Kind::Command && matches!(marker, Marker::Only(_)) {
            problems.push(format!("{site}: a store marker is for `sql` blocks"));
        }
        let text = if tag == "console" {
            console_commands(&body)
        } else {
            body.join("\n")
        };
        blocks.push(Block {
            site,
            kind,
            text,
            marker,
        });
    }
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("<!-- snippet:") && !used_markers.contains(&i) {
            problems.push(format!(
                "{file}:{}: the marker is not right before a command or SQL block",
                i + 1
            ));
        }
    }
    if problems.is_empty() {
        Ok(blocks)
    } else {
        Err(problems)
    }
}

/// `<!-- snippet: skip: REASON -->`, `<!-- snippet: postgres -->` or `<!-- snippet: sqlite -->`.
fn parse_marker(text: &str) -> Result<Marker, String> {
    let inner = text
        .strip_prefix("<!-- snippet:")
        .and_then(|rest| rest.strip_suffix("-->"))
        .ok_or_else(|| format!("`{text}` is not `<!-- snippet: … -->` on one line"))?
        .trim();
    if let Some(reason) = inner.strip_prefix("skip") {
        let reason = reason.trim_start().strip_prefix(':').unwrap_or("").trim();
        if reason.is_empty() {
            return Err(format!(
                "`{text}` gives no reason: `<!-- snippet: skip: REASON -->`"
            ));
        }
        return Ok(Marker::Skip(reason.to_owned()));
    }
    match inner {
        "postgres" => Ok(Marker::Only(Stores::Postgres)),
        "sqlite" => Ok(Marker::Only(Stores::Sqlite)),
        _ => Err(format!(
            "`{text}` is not a marker: `skip: REASON`, `postgres` or `sqlite`"
        )),
    }
}

/// The commands of a `console` block: its `$ ` lines and their `\` continuations.
fn console_commands(body: &[&str]) -> String {
    let mut commands = Vec::new();
    let mut continued = false;
    for line in body {
        if let Some(command) = line.strip_prefix("$ ") {
            commands.push(command.to_owned());
            continued = command.ends_with('\\');
        } else if continued {
            commands.push((*line).to_owned());
            continued = line.ends_with('\\');
        }
    }
    commands.join("\n")
}

/// Where and how command blocks run.
struct Shell {
    /// The working directory.
    dir: PathBuf,
    /// Environment variables set for every block.
    env: Vec<(String, String)>,
    /// Texts replaced in a block before it runs (the docs' addresses by the test's).
    substitutions: Vec<(String, String)>,
}

impl Shell {
    /// Runs one command block; the error says which, and what it printed.
    fn run(&self, block: &Block) -> Result<(), String> {
        let mut script = block.text.clone();
        for (from, to) in &self.substitutions {
            script = script.replace(from.as_str(), to);
        }
        let output = Command::new("timeout")
            .args([BLOCK_TIMEOUT, "bash", "-euo", "pipefail", "-c", &script])
            .current_dir(&self.dir)
            .env_remove("CAPGATE_DATABASE_URL")
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .output()
            .expect("run bash");
        if output.status.success() {
            return Ok(());
        }
        let status = match output.status.code() {
            Some(124) => format!("ran longer than {BLOCK_TIMEOUT} s"),
            Some(code) => format!("exited {code}"),
            None => "was killed by a signal".to_owned(),
        };
        Err(format!(
            "{} {status}\n── block ──\n{script}\n── stdout ──\n{}── stderr ──\n{}",
            block.site,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        ))
    }
}

/// The stores SQL blocks run on.
struct Databases {
    sqlite: String,
    /// `None` when the PostgreSQL side is skipped.
    postgres: Option<sqlx::postgres::PgConnectOptions>,
}

impl Databases {
    /// Runs one SQL block on the stores it is written for and says which; the error names the
    /// block and the store.
    async fn run(&self, block: &Block) -> Result<Vec<&'static str>, String> {
        let stores = match block.marker {
            Marker::Only(stores) => stores,
            _ => Stores::Both,
        };
        let mut ran = Vec::new();
        if stores != Stores::Postgres {
            let mut connection = sqlx::SqliteConnection::connect(&self.sqlite)
                .await
                .map_err(|error| format!("{}: cannot open {}: {error}", block.site, self.sqlite))?;
            sqlx::raw_sql(AssertSqlSafe(block.text.clone()))
                .execute(&mut connection)
                .await
                .map_err(|error| sql_failure(block, "SQLite", &error))?;
            ran.push("sqlite");
        }
        if stores != Stores::Sqlite {
            if let Some(options) = &self.postgres {
                let mut connection = sqlx::PgConnection::connect_with(options)
                    .await
                    .map_err(|error| format!("{}: cannot connect to PostgreSQL: {error}", block.site))?;
                sqlx::raw_sql(AssertSqlSafe(block.text.clone()))
                    .execute(&mut connection)
                    .await
                    .map_err(|error| sql_failure(block, "PostgreSQL", &error))?;
                ran.push("postgres");
            }
        }
        Ok(ran)
    }
}

fn sql_failure(block: &Block, store: &str, error: &sqlx::Error) -> String {
    format!(
        "{} fails on {store}: {error}\n── block ──\n{}\n",
        block.site, block.text
    )
}

/// What running a list of blocks found.
#[derive(Default)]
struct Report {
    ran: Vec<String>,
    skipped: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn print(&self) {
        println!("── ran {} blocks ──", self.ran.len());
        for line in &self.ran {
            println!("  ran      {line}");
        }
        println!("── skipped {} blocks ──", self.skipped.len());
        for line in &self.skipped {
            println!("  skipped  {line}");
        }
    }

    /// Every failure in one message, if there is one.
    fn failed(&self) -> Option<String> {
        if self.failures.is_empty() {
            return None;
        }
        let mut message = format!("{} snippet(s) failed:\n", self.failures.len());
        for failure in &self.failures {
            let _ = writeln!(message, "\n{failure}");
        }
        Some(message)
    }
}

/// Runs `blocks` in order: commands in `shell`, SQL on `databases` (without, an SQL block fails).
async fn run_blocks(blocks: &[Block], shell: &Shell, databases: Option<&Databases>) -> Report {
    let mut report = Report::default();
    for block in blocks {
        if let Marker::Skip(reason) = &block.marker {
            report.skipped.push(format!("{}: {reason}", block.site));
            continue;
        }
        let started = Instant::now();
        let result = match (block.kind, databases) {
            (Kind::Command, _) => shell.run(block).map(|()| "sh".to_owned()),
            (Kind::Sql, Some(databases)) => databases
                .run(block)
                .await
                .map(|stores| format!("sql on {}", stores.join(" and "))),
            (Kind::Sql, None) => Err(format!("{}: no store to run SQL on", block.site)),
        };
        match result {
            Ok(how) => report.ran.push(format!(
                "{} ({how}, {:.2} s)",
                block.site,
                started.elapsed().as_secs_f64()
            )),
            Err(failure) => report.failures.push(failure),
        }
    }
    report
}

/// README.md and docs/**/*.md but docs/decisions/, by path.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read docs/")
            .map(|entry| entry.expect("a docs/ entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                if path != Path::new("docs/decisions") {
                    walk(&path, found);
                }
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    let mut found = vec![PathBuf::from("README.md")];
    walk(Path::new("docs"), &mut found);
    found
}

/// Copies the folder `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a scratch folder");
    for entry in std::fs::read_dir(from).expect("read a folder to copy") {
        let entry = entry.expect("a folder entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// Runs `capgate ARGS` with `env`; panics with its output when it fails.
fn capgate(args: &[&str], env: &[(String, String)]) {
    let output = Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(args)
        .env_remove("CAPGATE_DATABASE_URL")
        .envs(env.iter().map(|(name, value)| (name, value)))
        .output()
        .expect("run capgate");
    assert!(
        output.status.success(),
        "capgate {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The decisions a store holds before SQL runs on it: an allow, denials, an unknown tool and a
/// static-key caller.
fn record_some_decisions(server: &str) {
    let env = [
        ("CAPGATE_TOKEN".to_owned(), ADMIN_TOKEN.to_owned()),
        ("CAPGATE_SERVER".to_owned(), server.to_owned()),
    ];
    let staff = ["--issuer", "staff", "--subject", "ana", "--attr", "dept=support"];
    for asked in [
        &["--tool", "helpdesk__get_ticket"][..],
        &["--tool", "payments__issue_refund"],
        &["--tool", "no_such_tool"],
        &["--capability", "billing.refund.create"],
    ] {
        capgate(&[&["decide"][..], &staff, asked].concat(), &env);
    }
    capgate(
        &[
            "decide",
            "--api-key",
            BATCH_KEY,
            "--capability",
            "docs.page.search",
        ],
        &env,
    );
}

/// A `capgate serve` on the example policy with the harness's tokens and static key.
async fn serve(database_url: &str) -> Serve {
    Serve::start_with_env(
        &[
            "--database-url",
            database_url,
            "--policy",
            "examples/policy.yaml",
            "--catalog",
            "examples/catalog.yaml",
            "--admin-token",
            "admin=env://SNIPPETS_ADMIN_TOKEN",
            "--gateway-token",
            "edge=env://SNIPPETS_GATEWAY_TOKEN",
        ],
        &[
            ("SNIPPETS_ADMIN_TOKEN", ADMIN_TOKEN),
            ("SNIPPETS_GATEWAY_TOKEN", GATEWAY_TOKEN),
            ("NIGHTLY_RUNNER_KEY", BATCH_KEY),
        ],
    )
    .await
}

/// Publishes three variants of the example and then the example again, so that revisions 1 to 5
/// exist and 5, the example, is active.
fn publish_a_history(dir: &Path, server: &str) {
    let admin = [("CAPGATE_TOKEN".to_owned(), ADMIN_TOKEN.to_owned())];
    let versions = [
        support::client::example_with_ceiling(601),
        support::client::example_with_ceiling(602),
        support::client::example_with_ceiling(603),
        support::client::POLICY.to_owned(),
    ];
    for (expected, text) in (1..).zip(versions) {
        let file = dir.join(format!("revision-{}.yaml", expected + 1));
        std::fs::write(&file, text).expect("write a policy version");
        let path = file.display().to_string();
        let expected = format!("{expected}");
        capgate(
            &[
                "publish",
                &path,
                "--catalog",
                "examples/catalog.yaml",
                "--server",
                server,
                "--expected-revision",
                &expected,
            ],
            &admin,
        );
        std::fs::remove_file(&file).expect("remove a policy version");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snippet_in_the_readme_and_docs_runs_as_written() {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    for path in documents() {
        let markdown = std::fs::read_to_string(&path).expect("read a Markdown file");
        match extract(&path.display().to_string(), &markdown) {
            Ok(found) => blocks.extend(found),
            Err(found) => problems.extend(found),
        }
    }
    assert!(problems.is_empty(), "snippet markers:\n{}", problems.join("\n"));
    assert!(blocks.len() > 40, "only {} blocks found", blocks.len());

    let scratch = tempfile::tempdir().expect("a scratch folder");
    let dir = scratch.path();
    copy_dir(Path::new("examples"), &dir.join("examples"));
    std::fs::copy("examples/policy.yaml", dir.join("policy.yaml")).expect("copy the policy");
    std::fs::copy("examples/catalog.yaml", dir.join("catalog.yaml")).expect("copy the catalog");
    for file in ["admin.token", "admin-ci.token"] {
        std::fs::write(dir.join(file), format!("{ADMIN_TOKEN}\n")).expect("write a token file");
    }

    let sqlite = format!("sqlite://{}", dir.join("capgate.db").display());
    let server = serve(&sqlite).await;
    let url = format!("http://{}", server.addr);
    publish_a_history(dir, &url);
    record_some_decisions(&url);

    let postgres = TestDatabase::create().await;
    let postgres_server = match &postgres {
        Some(database) => {
            let served = serve(&database.url()).await;
            record_some_decisions(&format!("http://{}", served.addr));
            Some(served)
        }
        None => None,
    };

    let bin = Path::new(env!("CARGO_BIN_EXE_capgate"))
        .parent()
        .expect("the binary's folder");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut substitutions = vec![
        ("127.0.0.1:50051".to_owned(), server.addr.to_string()),
        ("capgate.internal:50051".to_owned(), server.addr.to_string()),
    ];
    if let Some(database) = &postgres {
        substitutions.push(("postgres://…/capgate".to_owned(), database.url()));
    }
    let shell = Shell {
        dir: dir.to_owned(),
        env: [
            ("PATH", path.as_str()),
            ("CAPGATE_SERVER", url.as_str()),
            ("CAPGATE_TOKEN", ADMIN_TOKEN),
            ("ADMIN_TOKEN", ADMIN_TOKEN),
            ("GATEWAY_TOKEN", GATEWAY_TOKEN),
            ("BATCH_KEY", BATCH_KEY),
            // Three base64url parts, as a JWT has; the example's provider does not exist, so no
            // key verifies it.
            ("USER_JWT", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbmEifQ.c2lnbmF0dXJl"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect(),
        substitutions,
    };
    let databases = Databases {
        sqlite,
        postgres: postgres.as_ref().map(|database| database.options.clone()),
    };
    // Without PostgreSQL, what needs it is said to be skipped rather than failed.
    if postgres.is_none() {
        for block in &mut blocks {
            let needs_postgres = match block.kind {
                Kind::Sql => block.marker == Marker::Only(Stores::Postgres),
                Kind::Command => block.marker == Marker::None && block.text.contains("postgres://…/capgate"),
            };
            if needs_postgres {
                block.marker = Marker::Skip("needs PostgreSQL (DATABASE_URL is not set)".to_owned());
            }
        }
    }

    let started = Instant::now();
    let report = run_blocks(&blocks, &shell, Some(&databases)).await;
    report.print();
    println!("── the blocks took {:.1} s ──", started.elapsed().as_secs_f64());
    drop(postgres_server);
    drop(server);
    if let Some(message) = report.failed() {
        panic!("{message}");
    }
}

mod guards {
    //! The harness on small in-memory Markdown: each guard fails where it should.

    use super::*;

    const FIXTURE: &str = "# Fixture\n\
        \n\
        ```sh\n\
        true\n\
        ```\n\
        \n\
        Some output, not a command:\n\
        \n\
        ```text\n\
        exit 1\n\
        ```\n\
        \n\
        <!-- snippet: skip: needs a cluster -->\n\
        ```bash\n\
        exit 1\n\
        ```\n\
        \n\
        1. In a list:\n\
        \n\
        \x20  ```sh\n\
        \x20  echo indented\n\
        \x20  ```\n\
        \n\
        ```sh\n\
        echo about to fail\n\
        false\n\
        echo never\n\
        ```\n";

    fn shell(dir: &Path) -> Shell {
        Shell {
            dir: dir.to_owned(),
            env: Vec::new(),
            substitutions: Vec::new(),
        }
    }

    #[test]
    fn blocks_are_found_with_their_lines_and_markers() {
        let blocks = extract("fixture.md", FIXTURE).expect("valid markers");
        let found: Vec<(&str, Kind, &str, &Marker)> = blocks
            .iter()
            .map(|block| {
                (
                    block.site.as_str(),
                    block.kind,
                    block.text.as_str(),
                    &block.marker,
                )
            })
            .collect();
        let skip = Marker::Skip("needs a cluster".to_owned());
        assert_eq!(
            found,
            [
                ("fixture.md:3", Kind::Command, "true", &Marker::None),
                ("fixture.md:14", Kind::Command, "exit 1", &skip),
                ("fixture.md:20", Kind::Command, "echo indented", &Marker::None),
                (
                    "fixture.md:24",
                    Kind::Command,
                    "echo about to fail\nfalse\necho never",
                    &Marker::None
                ),
            ]
        );
    }

    #[tokio::test]
    async fn a_failing_block_fails_the_run_naming_its_line_and_output() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let blocks = extract("fixture.md", FIXTURE).expect("valid markers");
        let report = run_blocks(&blocks, &shell(dir.path()), None).await;
        assert_eq!(report.ran.len(), 2, "{:?}", report.ran);
        assert_eq!(report.skipped, ["fixture.md:14: needs a cluster"]);
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        let failure = &report.failures[0];
        assert!(failure.starts_with("fixture.md:24 exited 1"), "{failure}");
        assert!(
            failure.contains("── stdout ──\nabout to fail\n── stderr"),
            "{failure}"
        );
        let message = report.failed().expect("a failing block fails the test");
        assert!(
            message.starts_with("1 snippet(s) failed:\n\nfixture.md:24 exited 1"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_pipeline_that_fails_inside_fails_the_block() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let blocks = extract("pipe.md", "```sh\nfalse | cat\n```\n").expect("valid markers");
        let report = run_blocks(&blocks, &shell(dir.path()), None).await;
        assert_eq!(report.failures.len(), 1, "pipefail: {:?}", report.ran);
    }

    #[tokio::test]
    async fn a_failing_sql_block_fails_naming_its_line_and_store() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("fixture.db").display());
        let databases = Databases {
            sqlite,
            postgres: None,
        };
        let markdown = "<!-- snippet: sqlite -->\n```sql\nSELECT 1;\n```\n\n\
                        <!-- snippet: sqlite -->\n```sql\nSELECT nothing FROM nowhere;\n```\n";
        let blocks = extract("fixture.md", markdown).expect("valid markers");
        let report = run_blocks(&blocks, &shell(dir.path()), Some(&databases)).await;
        assert_eq!(report.ran.len(), 1, "{:?}", report.ran);
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(
            report.failures[0].starts_with("fixture.md:7 fails on SQLite"),
            "{}",
            report.failures[0]
        );
    }

    #[test]
    fn a_skip_without_a_reason_is_an_error() {
        for marker in [
            "<!-- snippet: skip -->",
            "<!-- snippet: skip: -->",
            "<!-- snippet: skip:   -->",
        ] {
            let markdown = format!("text\n\n{marker}\n```sh\nexit 1\n```\n");
            let problems = extract("fixture.md", &markdown).expect_err("no reason");
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].starts_with("fixture.md:3: "), "{problems:?}");
            assert!(problems[0].contains("gives no reason"), "{problems:?}");
        }
    }

    #[test]
    fn a_marker_before_no_block_or_unknown_is_an_error() {
        let stray = "<!-- snippet: skip: a reason -->\nA paragraph.\n\n```sh\ntrue\n```\n";
        let problems = extract("fixture.md", stray).expect_err("a stray marker");
        assert_eq!(
            problems,
            ["fixture.md:1: the marker is not right before a command or SQL block"]
        );

        let before_output = "<!-- snippet: skip: a reason -->\n```text\noutput\n```\n";
        assert!(
            extract("fixture.md", before_output).is_err(),
            "a marker before output is stray"
        );

        let unknown = "<!-- snippet: maybe -->\n```sh\ntrue\n```\n";
        let problems = extract("fixture.md", unknown).expect_err("an unknown marker");
        assert!(problems[0].contains("is not a marker"), "{problems:?}");
    }

    #[test]
    fn a_console_block_runs_its_prompts_only() {
        let markdown =
            "```console\n$ capgate validate p.yaml \\\n  --json\n{\"ok\": true}\n$ echo hi\nhi\n```\n";
        let blocks = extract("fixture.md", markdown).expect("valid markers");
        assert_eq!(blocks[0].text, "capgate validate p.yaml \\\n  --json\necho hi");
    }
}
