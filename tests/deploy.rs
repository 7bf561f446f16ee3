//! The deployment files under `deploy/`, checked as far as a machine without a container engine or
//! a cluster can check them (issue #5):
//!
//! * every YAML file parses (YAML 1.2, every document of a multi-document file);
//! * the Kubernetes objects are the ones docs/operations.md describes — a Deployment of three
//!   replicas with gRPC probes on the container port, its Service, a PodDisruptionBudget, a
//!   migration Job — and every Secret they name, with the key they read, is in the example;
//! * every flag the Deployment, the Job, the compose file, the systemd unit, the Containerfile and
//!   the shell examples of docs/operations.md pass to `capgate` is one that the binary's own
//!   `--help` lists for that subcommand. The checker is also run on snippets with a bogus flag, so
//!   it is seen to fail;
//! * with `kubectl` on the PATH, `kubectl kustomize` builds the Kubernetes directory; with
//!   `systemd-analyze`, `systemd-analyze verify` accepts the unit (and rejects a broken copy);
//! * the image's build stage can build (issue 29): the build context as
//!   `deploy/Containerfile.dockerignore` selects it (Docker's rules, reimplemented here), laid out
//!   as the Containerfile's COPY lines say, resolves with `cargo metadata --locked --offline`, and
//!   holds every repository file the compiler read for `capgate` (cargo's dep-info next to the
//!   binary) and every input build.rs declares. Broken copies (`core/` left out, a COPY line
//!   dropped) are seen to fail;
//! * the header of deploy/compose.yaml works as written: its exports set every variable the file
//!   requires, and the capgate service, run with the file's command line and environment (SQLite
//!   for its PostgreSQL), answers the header's `capgate decide` with an allow — and refuses the
//!   header's former question (issue 29), so the check is seen to fail.
//!
//! Not checked here: running the image build itself (no engine, no base images, and a 40-minute
//! compile), and applying the manifests to a real API server (no cluster). docs/operations.md says
//! so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use saphyr::{LoadableYamlNode, Yaml};

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// How long `capgate serve` waits for the audit writer after the last call (the timeout around
/// `audit_task` in src/periphery/server/mod.rs). Every stop timeout must leave it that long.
const AUDIT_FLUSH_SECONDS: i64 = 30;

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = repository().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

// ---------------------------------------------------------------------------------------------------
// YAML
// ---------------------------------------------------------------------------------------------------

/// Every document of a YAML text.
fn parse_yaml(origin: &str, text: &str) -> Vec<Yaml<'static>> {
    let documents: Vec<Yaml<'static>> =
        Yaml::load_from_str(text).unwrap_or_else(|error| panic!("{origin} is not valid YAML: {error}"));
    assert!(!documents.is_empty(), "{origin} holds no YAML document");
    documents
}

/// The node at a dotted path of mapping keys (`spec.template.spec`).
fn at<'a, 'y>(node: &'a Yaml<'y>, path: &str) -> Option<&'a Yaml<'y>> {
    path.split('.')
        .try_fold(node, |node, key| node.as_mapping_get(key))
}

fn str_at<'a>(node: &'a Yaml<'_>, path: &str) -> Option<&'a str> {
    at(node, path)?.as_str()
}

fn int_at(node: &Yaml<'_>, path: &str) -> Option<i64> {
    at(node, path)?.as_integer()
}

fn seq_at<'a, 'y>(node: &'a Yaml<'y>, path: &str) -> &'a [Yaml<'y>] {
    at(node, path)
        .and_then(Yaml::as_sequence)
        .map_or(&[], Vec::as_slice)
}

/// A sequence of strings (a command line). Kubernetes and Compose refuse numbers there, so a
/// scalar that is not a string is a finding too.
fn strings(origin: &str, node: Option<&Yaml<'_>>) -> Vec<String> {
    let Some(node) = node else {
        return Vec::new();
    };
    if let Some(text) = node.as_str() {
        // Compose also takes a command as one string.
        return text.split_whitespace().map(str::to_owned).collect();
    }
    let items = node
        .as_sequence()
        .unwrap_or_else(|| panic!("{origin}: expected a list of strings, found {node:?}"));
    items
        .iter()
        .map(|item| {
            item.as_str()
                .unwrap_or_else(|| panic!("{origin}: `{item:?}` in a command line is not a string"))
                .to_owned()
        })
        .collect()
}

/// Every `.yaml`/`.yml` file under `deploy/`, relative to the repository, sorted.
fn yaml_files() -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path
                .extension()
                .is_some_and(|extension| extension == "yaml" || extension == "yml")
            {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&repository().join("deploy"), &mut found);
    let mut relative: Vec<String> = found
        .iter()
        .map(|path| {
            path.strip_prefix(repository())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    relative.sort();
    relative
}

/// A Kubernetes object with the file it came from.
struct Object {
    origin: String,
    kind: String,
    name: String,
    yaml: Yaml<'static>,
}

/// Every object in deploy/kubernetes/ except the kustomization.
fn kubernetes_objects() -> Vec<Object> {
    let mut objects = Vec::new();
    for file in yaml_files() {
        if !file.starts_with("deploy/kubernetes/") || file.ends_with("/kustomization.yaml") {
            continue;
        }
        for (index, yaml) in parse_yaml(&file, &read(&file)).into_iter().enumerate() {
            let origin = format!("{file} (document {})", index + 1);
            let kind = str_at(&yaml, "kind")
                .unwrap_or_else(|| panic!("{origin} has no kind"))
                .to_owned();
            let name = str_at(&yaml, "metadata.name")
                .unwrap_or_else(|| panic!("{origin} has no metadata.name"))
                .to_owned();
            assert!(
                at(&yaml, "metadata.namespace").is_none(),
                "{origin}: the manifests are namespace-agnostic; set the namespace when applying"
            );
            objects.push(Object {
                origin,
                kind,
                name,
                yaml,
            });
        }
    }
    objects
}

fn the<'a>(objects: &'a [Object], kind: &str) -> &'a Object {
    let found: Vec<&Object> = objects.iter().filter(|object| object.kind == kind).collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind}, found {}",
        found.len()
    );
    found[0]
}

// ---------------------------------------------------------------------------------------------------
// What `--help` says
// ---------------------------------------------------------------------------------------------------

/// One (sub)command's help: the flags it lists (long and short) and its subcommands.
#[derive(Debug, Default)]
struct Help {
    flags: BTreeSet<String>,
    subcommands: BTreeSet<String>,
}

/// Parses clap's help text: option lines start with `-`, the `Commands:` section lists
/// subcommands one per line.
fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        if in_commands {
            if let Some(name) = trimmed.split_whitespace().next() {
                if name != "help" {
                    help.subcommands.insert(name.to_owned());
                }
            }
        } else if trimmed.starts_with('-') {
            for word in trimmed.split_whitespace() {
                let word = word.trim_end_matches(',');
                if !word.starts_with('-') {
                    break;
                }
                let name: String = word
                    .chars()
                    .take_while(|c| *c == '-' || c.is_ascii_alphanumeric())
                    .collect();
                // Long help lists an enum's values as `- any: …` lines: a lone `-` is no flag.
                if name.len() >= 2 {
                    help.flags.insert(name);
                }
            }
        }
    }
    help
}

/// `capgate <path> --help`, run once per path.
fn help(path: &[String]) -> &'static Help {
    static CACHE: OnceLock<Mutex<BTreeMap<Vec<String>, &'static Help>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(help) = cache.lock().unwrap().get(path).copied() {
        return help;
    }
    let output = Command::new(BIN).args(path).arg("--help").output().unwrap();
    assert!(
        output.status.success(),
        "`capgate {} --help` failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: &'static Help = Box::leak(Box::new(parse_help(&String::from_utf8(output.stdout).unwrap())));
    cache.lock().unwrap().insert(path.to_vec(), parsed);
    parsed
}

// ---------------------------------------------------------------------------------------------------
// Command lines that run capgate, wherever they are written
// ---------------------------------------------------------------------------------------------------

/// A command line that runs capgate.
#[derive(Debug, Clone)]
struct Invocation {
    /// Where it is written, for messages.
    origin: String,
    /// Everything after the program: the subcommand, then its arguments.
    args: Vec<String>,
}

/// Whether a program word is the capgate binary (`capgate`, `/usr/local/bin/capgate`,
/// `target/release/capgate`) — not merely a word ending in it, such as `deploy/capgate`.
fn runs_capgate(program: &str) -> bool {
    program == "capgate"
        || program.ends_with("/bin/capgate")
        || program.ends_with("target/release/capgate")
        || program.ends_with("target/debug/capgate")
}

/// Whether an image reference names the capgate image, whose ENTRYPOINT is the binary.
fn capgate_image(image: &str) -> bool {
    let name = image.rsplit('/').next().unwrap_or(image);
    name == "capgate" || name.starts_with("capgate:") || name.starts_with("capgate@")
}

/// The pod template of a workload (Deployment, Job, …) or the spec of a Pod.
fn pod_spec<'a, 'y>(object: &'a Yaml<'y>) -> Option<&'a Yaml<'y>> {
    at(object, "spec.template.spec")
        .or_else(|| at(object, "spec.jobTemplate.spec.template.spec"))
        .or_else(|| {
            (str_at(object, "kind") == Some("Pod"))
                .then(|| at(object, "spec"))
                .flatten()
        })
}

/// The capgate command lines of a Kubernetes object's containers: `command` + `args`, or the
/// image's ENTRYPOINT + `args` when `command` is not set.
fn kubernetes_invocations(origin: &str, object: &Yaml<'_>) -> Vec<Invocation> {
    let Some(spec) = pod_spec(object) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for list in ["initContainers", "containers"] {
        for container in seq_at(spec, list) {
            let name = str_at(container, "name").unwrap_or("?");
            let here = format!("{origin}, container `{name}`");
            let command = strings(&here, at(container, "command"));
            let mut args = strings(&here, at(container, "args"));
            let runs = match command.split_first() {
                Some((program, rest)) => {
                    let mut all = rest.to_vec();
                    all.append(&mut args);
                    args = all;
                    runs_capgate(program)
                }
                None => str_at(container, "image").is_some_and(capgate_image),
            };
            if runs {
                found.push(Invocation { origin: here, args });
            }
        }
    }
    found
}

/// The capgate command lines of a compose file's services: `entrypoint` + `command`, or the
/// image's ENTRYPOINT + `command` for a service built from deploy/Containerfile or using the
/// capgate image.
fn compose_invocations(origin: &str, compose: &Yaml<'_>) -> Vec<Invocation> {
    let mut found = Vec::new();
    let Some(services) = at(compose, "services").and_then(Yaml::as_mapping) else {
        return found;
    };
    for (name, service) in services {
        let here = format!("{origin}, service `{}`", name.as_str().unwrap_or("?"));
        let entrypoint = strings(&here, at(service, "entrypoint"));
        let command = strings(&here, at(service, "command"));
        let (runs, args) = match entrypoint.split_first() {
            Some((program, rest)) => (runs_capgate(program), [rest, command.as_slice()].concat()),
            None => {
                let built =
                    str_at(service, "build.dockerfile").is_some_and(|file| file.ends_with("Containerfile"));
                (
                    built || str_at(service, "image").is_some_and(capgate_image),
                    command,
                )
            }
        };
        if runs {
            found.push(Invocation { origin: here, args });
        }
    }
    found
}

/// Lines with their `\` continuations joined, comments dropped (systemd and Containerfile syntax).
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (current.is_empty() && trimmed.starts_with(';')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                if !current.is_empty() {
                    lines.push(std::mem::take(&mut current));
                }
            }
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// A systemd unit as `key → values`, section names dropped (capgate's unit has one of each key
/// that matters).
fn unit_settings(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut settings: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in logical_lines(text) {
        if let Some((key, value)) = line.split_once('=') {
            settings
                .entry(key.trim().to_owned())
                .or_default()
                .push(value.trim().to_owned());
        }
    }
    settings
}

/// The capgate command lines of a systemd unit's `Exec…=` settings.
fn systemd_invocations(origin: &str, text: &str) -> Vec<Invocation> {
    let mut found = Vec::new();
    for (key, values) in unit_settings(text) {
        if !key.starts_with("Exec") {
            continue;
        }
        for value in values {
            // Prefixes: `-` ignore failure, `@` argv[0], `+`/`!`/`!!` privileges, `:` no expansion.
            let value = value.trim_start_matches(['-', '@', '+', '!', ':']);
            let mut words = value.split_whitespace();
            if words.next().is_some_and(runs_capgate) {
                found.push(Invocation {
                    origin: format!("{origin}, {key}="),
                    args: words.map(str::to_owned).collect(),
                });
            }
        }
    }
    found
}

/// A Containerfile's last stage, as instructions (upper-cased) with their arguments.
fn final_stage(text: &str) -> Vec<(String, String)> {
    let mut stage = Vec::new();
    for line in logical_lines(text) {
        let (instruction, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = instruction.to_ascii_uppercase();
        if instruction == "FROM" {
            stage.clear();
        }
        stage.push((instruction, rest.trim().to_owned()));
    }
    stage
}

/// The exec form of ENTRYPOINT/CMD, a JSON array of strings.
fn exec_form(origin: &str, instruction: &str, value: &str) -> Vec<String> {
    serde_json::from_str(value)
        .unwrap_or_else(|error| panic!("{origin}: {instruction} is not in exec form ({error}): {value}"))
}

/// The command line the image runs by default: ENTRYPOINT + CMD of the last stage.
fn containerfile_invocations(origin: &str, text: &str) -> Vec<Invocation> {
    let mut entrypoint = Vec::new();
    let mut command = Vec::new();
    for (instruction, value) in final_stage(text) {
        match instruction.as_str() {
            "ENTRYPOINT" => entrypoint = exec_form(origin, "ENTRYPOINT", &value),
            "CMD" => command = exec_form(origin, "CMD", &value),
            _ => {}
        }
    }
    match entrypoint.split_first() {
        Some((program, rest)) if runs_capgate(program) => vec![Invocation {
            origin: format!("{origin}, ENTRYPOINT + CMD"),
            args: [rest, command.as_slice()].concat(),
        }],
        _ => Vec::new(),
    }
}

/// The capgate command lines of the shell blocks of a Markdown file (continuations joined, one
/// command per `&&`, `;` or `|` segment, comments dropped).
fn markdown_invocations(origin: &str, text: &str) -> Vec<Invocation> {
    let mut found = Vec::new();
    // Inside a fenced block: whether it is shell, and its lines so far.
    let mut block: Option<(bool, String)> = None;
    for line in text.lines() {
        let Some(fence) = line.trim_start().strip_prefix("```") else {
            if let Some((true, lines)) = &mut block {
                lines.push_str(line);
                lines.push('\n');
            }
            continue;
        };
        match block.take() {
            Some((shell, lines)) => {
                if shell {
                    for command in logical_lines(&lines) {
                        found.extend(shell_invocations(origin, &command));
                    }
                }
            }
            None => {
                let shell = matches!(fence.trim(), "sh" | "bash" | "shell" | "console");
                block = Some((shell, String::new()));
            }
        }
    }
    assert!(block.is_none(), "{origin}: a fenced block is not closed");
    found
}

/// The capgate commands of one shell command line. `capgate` counts as the program when it starts
/// a command, possibly after variable assignments or a wrapper (`sudo`, `exec`, `kubectl exec … --`);
/// `systemctl restart capgate` runs no capgate.
fn shell_invocations(origin: &str, command: &str) -> Vec<Invocation> {
    // A `#` that starts a word starts a comment.
    let uncommented = match command.find(" #") {
        Some(index) => &command[..index],
        None => command,
    };
    let starts_command = |previous: Option<&&str>| match previous {
        None => true,
        Some(word) => {
            matches!(*word, "sudo" | "exec" | "env" | "time" | "nohup" | "--")
                || (word.contains('=') && !word.starts_with('-'))
        }
    };
    let mut found = Vec::new();
    for segment in uncommented.split(['|', ';', '&']) {
        let words: Vec<&str> = segment.split_whitespace().collect();
        let program = (0..words.len()).find(|&index| {
            runs_capgate(words[index]) && starts_command(index.checked_sub(1).map(|i| &words[i]))
        });
        if let Some(index) = program {
            found.push(Invocation {
                origin: format!("{origin}: `{}`", segment.trim()),
                args: words[index + 1..].iter().map(|word| (*word).to_owned()).collect(),
            });
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------------------------------

/// Every problem with the flags of `invocations`: a subcommand outside `allowed` (an empty list
/// allows all), or a flag that `capgate <subcommand> --help` does not list. Flags are recognised by
/// their leading `-`; `--flag=value` is checked by its name.
fn unknown_flags(invocations: &[Invocation], allowed: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for invocation in invocations {
        let mut path: Vec<String> = Vec::new();
        let mut rest = invocation.args.as_slice();
        while let Some((word, tail)) = rest.split_first() {
            if !help(&path).subcommands.contains(word) {
                break;
            }
            path.push(word.clone());
            rest = tail;
        }
        let Some(subcommand) = path.first() else {
            problems.push(format!(
                "{}: `{}` does not start with a capgate subcommand",
                invocation.origin,
                invocation.args.join(" ")
            ));
            continue;
        };
        if !allowed.is_empty() && !allowed.contains(&subcommand.as_str()) {
            problems.push(format!(
                "{}: `capgate {subcommand}` is not one of {allowed:?}",
                invocation.origin
            ));
        }
        let known = &help(&path).flags;
        for word in rest {
            if !word.starts_with('-') || word == "-" || word == "--" {
                continue;
            }
            let flag = word.split_once('=').map_or(word.as_str(), |(flag, _)| flag);
            if !known.contains(flag) {
                problems.push(format!(
                    "{}: `{flag}` is not a flag of `capgate {}` (its --help lists {known:?})",
                    invocation.origin,
                    path.join(" ")
                ));
            }
        }
    }
    problems
}

/// The value following `flag` in a command line (`--flag value` or `--flag=value`), every time.
fn values_of(args: &[String], flag: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == flag {
            values.extend(words.next().cloned());
        } else if let Some(value) = word.strip_prefix(&format!("{flag}=")) {
            values.push(value.to_owned());
        }
    }
    values
}

/// Every capgate command line the deployment files write, with the subcommands each may run.
fn deployment_invocations() -> Vec<Invocation> {
    let mut invocations = Vec::new();
    for object in kubernetes_objects() {
        invocations.extend(kubernetes_invocations(&object.origin, &object.yaml));
    }
    let compose = "deploy/compose.yaml";
    for document in parse_yaml(compose, &read(compose)) {
        invocations.extend(compose_invocations(compose, &document));
    }
    let unit = "deploy/systemd/capgate.service";
    invocations.extend(systemd_invocations(unit, &read(unit)));
    let containerfile = "deploy/Containerfile";
    invocations.extend(containerfile_invocations(containerfile, &read(containerfile)));
    invocations
}

// ---------------------------------------------------------------------------------------------------
// The image's build context and build stage
// ---------------------------------------------------------------------------------------------------

/// One rule of a `.dockerignore` file: a pattern (by path segment) and whether it lets paths back
/// in (`!`).
#[derive(Debug)]
struct IgnoreRule {
    segments: Vec<String>,
    include: bool,
}

/// The rules of a `.dockerignore` text, in order. A leading `/` and a trailing `/` mean nothing to
/// Docker; character classes and escapes are refused, so that they are never half-understood here.
fn ignore_rules(text: &str) -> Vec<IgnoreRule> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (include, pattern) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            assert!(
                !pattern.contains(['[', '\\']),
                "`{line}`: this checker knows `*`, `?` and `**`, not classes or escapes"
            );
            let segments = pattern
                .trim_matches('/')
                .split('/')
                .filter(|segment| !segment.is_empty() && *segment != ".")
                .map(str::to_owned)
                .collect();
            IgnoreRule { segments, include }
        })
        .collect()
}

/// Whether a glob segment matches one path segment: `*` any run of characters, `?` one.
fn segment_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => {
            segment_matches(rest, name) || (!name.is_empty() && segment_matches(pattern, &name[1..]))
        }
        (Some((b'?', rest)), Some((_, name_rest))) => segment_matches(rest, name_rest),
        (Some((expected, rest)), Some((found, name_rest))) => {
            expected == found && segment_matches(rest, name_rest)
        }
        _ => false,
    }
}

/// Whether pattern segments match path segments, `**` standing for any number of segments.
fn glob_matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skipped| glob_matches(rest, &path[skipped..]))
        }
        Some((first, rest)) => path.split_first().is_some_and(|(name, path_rest)| {
            segment_matches(first.as_bytes(), name.as_bytes()) && glob_matches(rest, path_rest)
        }),
    }
}

/// Whether the context holds `path`: Docker's rule, where the last rule that matches the path or a
/// folder above it decides, and a path no rule matches is in.
fn in_context(rules: &[IgnoreRule], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let mut included = true;
    for rule in rules {
        if (1..=segments.len()).any(|end| glob_matches(&rule.segments, &segments[..end])) {
            included = rule.include;
        }
    }
    included
}

/// The files of the build context `root` as `rules` select them, relative to `root`. A folder that
/// is left out, and under which no `!` rule could let anything back in, is not entered (so target/
/// costs nothing).
fn build_context(root: &Path, rules: &[IgnoreRule]) -> BTreeSet<String> {
    fn walk(root: &Path, relative: &str, rules: &[IgnoreRule], found: &mut BTreeSet<String>) {
        let dir = root.join(relative);
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
        {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if relative.is_empty() {
                name
            } else {
                format!("{relative}/{name}")
            };
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                let reopened = rules.iter().any(|rule| {
                    rule.include
                        && (rule
                            .segments
                            .first()
                            .is_some_and(|first| first.contains(['*', '?']))
                            || rule.segments.join("/").starts_with(&format!("{path}/")))
                });
                if in_context(rules, &path) || reopened {
                    walk(root, &path, rules, found);
                }
            } else if in_context(rules, &path) {
                found.insert(path);
            }
        }
    }
    let mut found = BTreeSet::new();
    walk(root, "", rules, &mut found);
    found
}

/// The build stage's tree as the Containerfile's COPY lines lay it out from `context`: each file
/// under the stage's WORKDIR, with the context file it comes from. Every COPY source of every
/// stage (but `--from`) must be in the context; each one that is not is a problem.
fn build_stage(
    containerfile: &str,
    context: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, Vec<String>> {
    let mut stage = BTreeMap::new();
    let mut problems = Vec::new();
    let mut stage_index = 0;
    for line in logical_lines(containerfile) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|word| word.to_ascii_uppercase()).as_deref() {
            Some("FROM") => stage_index += 1,
            Some("COPY") => {
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|word| !word.starts_with("--"))
                    .collect();
                if words[1..].iter().any(|word| word.starts_with("--from")) || args.len() < 2 {
                    continue;
                }
                let (destination, sources) = args.split_last().unwrap();
                for source in sources {
                    assert!(
                        !source.contains(['*', '?']),
                        "`{line}`: wildcards are not modelled here"
                    );
                    let source = source.trim_end_matches('/');
                    let under = format!("{source}/");
                    let files: Vec<&String> = context
                        .iter()
                        .filter(|file| *file == source || file.starts_with(&under))
                        .collect();
                    if files.is_empty() {
                        problems.push(format!(
                            "`{line}`: `{source}` is not in the build context (deploy/Containerfile.dockerignore leaves it out, or it does not exist)"
                        ));
                        continue;
                    }
                    // Only the first stage, the build, is laid out: its WORKDIR is where cargo runs.
                    if stage_index != 1 || destination.starts_with('/') {
                        continue;
                    }
                    // A folder's content goes into the destination; a file goes into it when it is a
                    // folder (`./`, `dir/`, several sources), else becomes it.
                    let into_folder = destination.ends_with('/') || sources.len() > 1;
                    let destination = destination.trim_start_matches("./").trim_end_matches('/');
                    let join = |inside: &str| match (destination, inside) {
                        ("", inside) => inside.to_owned(),
                        (destination, "") => destination.to_owned(),
                        (destination, inside) => format!("{destination}/{inside}"),
                    };
                    for file in files {
                        let target = if file != source {
                            join(&file[under.len()..])
                        } else if into_folder || destination.is_empty() {
                            join(&Path::new(file).file_name().unwrap().to_string_lossy())
                        } else {
                            destination.to_owned()
                        };
                        stage.insert(target, file.clone());
                    }
                }
            }
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(stage)
    } else {
        Err(problems)
    }
}

/// The repository files the compiler read to build `capgate`: its binary's root, `src/main.rs`
/// (which declares no module of its own), and what the dep-info files rustc writes into
/// target/debug/deps list for the libraries that go into it (`capgate`, `capgate-core`), less what
/// is outside the repository (the registry) or generated into target/. Only a library build names
/// an `.rlib`: a unit-test build of the same crate also reads its `#[cfg(test)]` fixtures, which the
/// release binary never does. Cargo's own summary next to the binary (`capgate.d`) is written only
/// when the binary is built for itself, never when it is built for the tests, so a fresh checkout
/// running only the suite has none.
fn files_the_binary_was_built_from() -> Vec<String> {
    let deps = Path::new(BIN).with_file_name("deps");
    let target_dir = Path::new(BIN).parent().and_then(Path::parent).unwrap();
    let entries =
        std::fs::read_dir(&deps).unwrap_or_else(|error| panic!("cannot list {}: {error}", deps.display()));
    let mut paths = Vec::new();
    let mut read_any = false;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".d") else {
            continue;
        };
        let crate_name = stem
            .rsplit_once('-')
            .map_or(stem, |(crate_name, _hash)| crate_name);
        if crate_name != "capgate" && crate_name != "capgate_core" {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())
            .unwrap_or_else(|error| panic!("cannot read dep-info {}: {error}", entry.path().display()));
        if !text.lines().any(|line| line.contains(".rlib:")) {
            continue;
        }
        read_any = true;
        paths.extend(dep_info_inputs(&text));
    }
    assert!(
        read_any,
        "no library dep-info of capgate or capgate-core in {}",
        deps.display()
    );
    paths.push(repository().join("src/main.rs").to_string_lossy().into_owned());
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        // rustc lists a workspace member's own files relative to the workspace root.
        .map(|path| repository().join(path))
        .filter(|path| !path.starts_with(target_dir))
        .filter_map(|path| {
            path.strip_prefix(repository())
                .ok()
                .map(|relative| relative.to_string_lossy().into_owned())
        })
        .collect()
}

/// The inputs a dep-info file lists for its first target (`target: input input …`); a space inside
/// a path is escaped with a backslash.
fn dep_info_inputs(text: &str) -> Vec<String> {
    let first = text.lines().next().unwrap_or_default();
    let Some((_, dependencies)) = first.split_once(": ") else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut characters = dependencies.chars();
    while let Some(character) = characters.next() {
        match character {
            '\\' => current.extend(characters.next()),
            ' ' => paths.push(std::mem::take(&mut current)),
            _ => current.push(character),
        }
    }
    paths.push(current);
    paths.retain(|path| !path.is_empty());
    paths
}

/// What build.rs says it reads (`cargo:rerun-if-changed=PATH`).
fn build_script_inputs(build_rs: &str) -> Vec<String> {
    build_rs
        .split("rerun-if-changed=")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// Everything that stops the image's build stage from building `capgate`, found without a container
/// engine: the context as `ignore` selects it, the stage as `containerfile` lays it out (in a
/// scratch folder), `cargo metadata --locked --offline` in it (the workspace's members and the lock
/// file), and every repository file the compiler or build.rs read for the binary, present in it.
fn image_build_problems(containerfile: &str, ignore: &str) -> Vec<String> {
    let context = build_context(repository(), &ignore_rules(ignore));
    let stage = match build_stage(containerfile, &context) {
        Ok(stage) => stage,
        Err(problems) => return problems,
    };
    let mut problems = Vec::new();
    let mut needed = files_the_binary_was_built_from();
    needed.extend(build_script_inputs(&read("build.rs")));
    for path in needed {
        let full = repository().join(&path);
        // A folder (build.rs's inputs are folders) counts with every file under it; a file that a
        // former build read and that is gone since counts for nothing.
        let wanted = if full.is_dir() {
            build_context(&full, &[])
                .into_iter()
                .map(|file| format!("{path}/{file}"))
                .collect()
        } else if full.exists() {
            vec![path]
        } else {
            Vec::new()
        };
        for file in wanted {
            if !stage.contains_key(&file) {
                problems.push(format!(
                    "`{file}` is read to build capgate, and the image's build stage does not hold it"
                ));
            }
        }
    }

    let scratch = tempfile::tempdir().unwrap();
    for (target, source) in &stage {
        let path = scratch.path().join(target);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(repository().join(source), &path).unwrap();
    }
    let host = Command::new("rustc").arg("-vV").output().expect("run rustc -vV");
    let host = String::from_utf8(host.stdout)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    // Only the host's dependencies: the others (Windows' crates) were never downloaded.
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args(["--filter-platform", &host])
        .current_dir(scratch.path())
        .output()
        .expect("run cargo metadata");
    if !output.status.success() {
        problems.push(format!(
            "`cargo metadata --locked --offline` fails in the build stage: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    problems
}

// ---------------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------------

#[test]
fn every_yaml_file_under_deploy_parses() {
    let files = yaml_files();
    for expected in [
        "deploy/compose.yaml",
        "deploy/kubernetes/deployment.yaml",
        "deploy/kubernetes/kustomization.yaml",
        "deploy/kubernetes/migrate-job.yaml",
        "deploy/kubernetes/pdb.yaml",
        "deploy/kubernetes/secret.example.yaml",
        "deploy/kubernetes/service.yaml",
    ] {
        assert!(files.iter().any(|file| file == expected), "{expected} is missing");
    }
    for file in &files {
        for (index, document) in parse_yaml(file, &read(file)).iter().enumerate() {
            assert!(
                document.as_mapping().is_some(),
                "{file}, document {}: expected a mapping at the top, found {document:?}",
                index + 1
            );
        }
    }

    // The checks above can fail: a broken file and a parse error in a later document are found.
    for broken in ["a: [1, 2\n", "kind: Service\n---\nkind: [\n", "a: 1\na: 2\n"] {
        assert!(Yaml::load_from_str(broken).is_err(), "saphyr accepted {broken:?}");
    }
}

#[test]
fn every_flag_passed_to_capgate_is_one_its_help_lists() {
    let invocations = deployment_invocations();
    // Each file contributes what it should, so the check below is not vacuous.
    for (origin, subcommand) in [
        ("deploy/kubernetes/deployment.yaml", "serve"),
        ("deploy/kubernetes/migrate-job.yaml", "migrate"),
        ("deploy/compose.yaml, service `migrate`", "migrate"),
        ("deploy/compose.yaml, service `capgate`", "serve"),
        ("deploy/systemd/capgate.service", "serve"),
        ("deploy/Containerfile", "serve"),
    ] {
        assert!(
            invocations
                .iter()
                .any(|invocation| invocation.origin.starts_with(origin)
                    && invocation.args.first().map(String::as_str) == Some(subcommand)),
            "no `capgate {subcommand}` found in {origin}: {invocations:#?}"
        );
    }
    let flags: usize = invocations
        .iter()
        .map(|invocation| invocation.args.iter().filter(|arg| arg.starts_with("--")).count())
        .sum();
    assert!(flags >= 20, "only {flags} flags found: {invocations:#?}");

    let problems = unknown_flags(&invocations, &["serve", "migrate"]);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_flag_checker_reports_a_bogus_flag_wherever_it_is_written() {
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: capgate}
spec:
  template:
    spec:
      containers:
        - name: capgate
          image: registry.example.com/capgate:1.0
          args: [serve, --listen, "0.0.0.0:50051", --listen-address, "0.0.0.0:50051"]
"#;
    let compose = r#"
services:
  capgate:
    image: capgate:local
    command: ["serve", "--audit-spool=/spool", "--audit-spool-dir=/spool"]
"#;
    let unit = "[Service]\nExecStart=/usr/local/bin/capgate serve \\\n    --listen 127.0.0.1:50051 \\\n    --gateway-tokens a=env://A\n";
    let containerfile = "FROM debian:bookworm-slim\nENTRYPOINT [\"capgate\"]\nCMD [\"serve\", \\\n  \"--tls-certificate\", \"/tls.crt\"]\n";
    let markdown = "```sh\ncapgate policies activate 3 --server http://127.0.0.1:50051 --revision 3\n```\n";
    let job = "kind: Job\nmetadata: {name: m}\nspec: {template: {spec: {containers: [{name: m, image: capgate, args: [migrate, --listen, x]}]}}}\n";
    let wrong_subcommand = "kind: Job\nmetadata: {name: m}\nspec: {template: {spec: {containers: [{name: m, image: capgate, args: [validate, p.yaml]}]}}}\n";
    // The deploy files may run `serve` and `migrate` only; documentation may run any subcommand.
    let deploy: &[&str] = &["serve", "migrate"];
    let cases: Vec<(Vec<Invocation>, &[&str], &str)> = vec![
        (
            kubernetes_invocations("deployment snippet", &parse_yaml("snippet", deployment)[0]),
            deploy,
            "`--listen-address` is not a flag of `capgate serve`",
        ),
        (
            compose_invocations("compose snippet", &parse_yaml("snippet", compose)[0]),
            deploy,
            "`--audit-spool-dir` is not a flag of `capgate serve`",
        ),
        (
            systemd_invocations("unit snippet", unit),
            deploy,
            "`--gateway-tokens` is not a flag of `capgate serve`",
        ),
        (
            containerfile_invocations("containerfile snippet", containerfile),
            deploy,
            "`--tls-certificate` is not a flag of `capgate serve`",
        ),
        (
            markdown_invocations("markdown snippet", markdown),
            &[],
            "`--revision` is not a flag of `capgate policies activate`",
        ),
        (
            kubernetes_invocations("job snippet", &parse_yaml("snippet", job)[0]),
            deploy,
            "`--listen` is not a flag of `capgate migrate`",
        ),
        (
            kubernetes_invocations("job snippet", &parse_yaml("snippet", wrong_subcommand)[0]),
            deploy,
            "`capgate validate` is not one of [\"serve\", \"migrate\"]",
        ),
    ];
    for (invocations, allowed, expected) in cases {
        assert_eq!(
            invocations.len(),
            1,
            "the snippet for {expected:?} yields {invocations:#?}"
        );
        let problems = unknown_flags(&invocations, allowed);
        assert_eq!(problems.len(), 1, "expected only {expected:?}, got {problems:#?}");
        assert!(
            problems[0].contains(expected),
            "expected {expected:?}, got {problems:#?}"
        );
    }
    // The correct flags of the same snippets pass: `--listen` and `--audit-spool=` were not reported.

    // In documentation, `capgate` is the program only where a command starts.
    let commands = "```sh\nsystemctl restart capgate\njournalctl -u capgate -o cat | tail\n\
                    kubectl -n capgate logs deployment/capgate\nsudo capgate audit --limit 5\n```\n";
    let found = markdown_invocations("markdown snippet", commands);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].args, ["audit", "--limit", "5"]);
}

#[test]
fn the_shell_examples_of_the_operations_guide_use_real_flags() {
    let guide = "docs/operations.md";
    let invocations = markdown_invocations(guide, &read(guide));
    for subcommand in [
        "serve", "migrate", "publish", "policies", "audit", "validate", "diff",
    ] {
        assert!(
            invocations
                .iter()
                .any(|invocation| invocation.args.first().map(String::as_str) == Some(subcommand)),
            "{guide} shows no `capgate {subcommand}`"
        );
    }
    let problems = unknown_flags(&invocations, &[]);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_deployment_runs_three_replicas_with_grpc_probes_tokens_from_secrets_and_a_spool() {
    let objects = kubernetes_objects();
    let deployment = &the(&objects, "Deployment").yaml;
    assert_eq!(int_at(deployment, "spec.replicas"), Some(3));

    let pod = pod_spec(deployment).unwrap();
    let containers = seq_at(pod, "containers");
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let invocation = &kubernetes_invocations("deployment", deployment)[0];
    let args = &invocation.args;
    assert_eq!(args[0], "serve");

    // The gRPC port, and every probe on it through the native gRPC probe; then the metrics port,
    // the one `--metrics-listen` binds.
    let ports = seq_at(container, "ports");
    assert_eq!(ports.len(), 2);
    let port = int_at(&ports[0], "containerPort").unwrap();
    assert_eq!(port, 50051);
    assert_eq!(str_at(&ports[0], "name"), Some("grpc"));
    assert_eq!(values_of(args, "--listen"), [format!("0.0.0.0:{port}")]);
    assert_eq!(str_at(&ports[1], "name"), Some("metrics"));
    let metrics = int_at(&ports[1], "containerPort").unwrap();
    assert_eq!(
        values_of(args, "--metrics-listen"),
        [format!("0.0.0.0:{metrics}")]
    );
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert_eq!(
            int_at(container, &format!("{probe}.grpc.port")),
            Some(port),
            "{probe} must be a grpc probe on the container port"
        );
    }

    // The database URL comes from a Secret, through the flag's environment variable, and is not
    // on the command line.
    assert!(values_of(args, "--database-url").is_empty());
    let env = seq_at(container, "env");
    let database = env
        .iter()
        .find(|variable| str_at(variable, "name") == Some("CAPGATE_DATABASE_URL"))
        .expect("CAPGATE_DATABASE_URL is set");
    assert!(at(database, "valueFrom.secretKeyRef").is_some());

    // Tokens are files of a read-only Secret volume, named by `file://` references.
    let mounts = seq_at(container, "volumeMounts");
    let volumes = seq_at(pod, "volumes");
    let volume_of = |path: &str| {
        let mount = mounts
            .iter()
            .filter(|mount| {
                str_at(mount, "mountPath").is_some_and(|dir| path.starts_with(&format!("{dir}/")))
            })
            .max_by_key(|mount| str_at(mount, "mountPath").map_or(0, str::len))
            .unwrap_or_else(|| panic!("`{path}` is on no mounted volume"));
        let name = str_at(mount, "name").unwrap();
        let volume = volumes
            .iter()
            .find(|volume| str_at(volume, "name") == Some(name))
            .unwrap_or_else(|| panic!("the mount of `{path}` names no volume"));
        (mount, volume)
    };
    let tokens: Vec<String> = ["--gateway-token", "--admin-token"]
        .iter()
        .flat_map(|flag| values_of(args, flag))
        .collect();
    assert!(tokens.len() >= 2, "a gateway and an admin token: {tokens:?}");
    for token in tokens {
        let (_name, reference) = token.split_once('=').unwrap();
        let path = reference
            .strip_prefix("file://")
            .unwrap_or_else(|| panic!("`{token}`: tokens come from Secret files"));
        let (mount, volume) = volume_of(path);
        assert!(
            at(volume, "secret.secretName").is_some(),
            "`{path}` is not on a Secret volume"
        );
        assert_eq!(at(mount, "readOnly").and_then(Yaml::as_bool), Some(true));
        let file = &path[str_at(mount, "mountPath").unwrap().len() + 1..];
        assert!(
            seq_at(volume, "secret.items")
                .iter()
                .any(|item| str_at(item, "path") == Some(file)),
            "`{file}` is not an item of the Secret volume"
        );
    }

    // The spool: a writable emptyDir on a read-only root filesystem.
    let spool = values_of(args, "--audit-spool");
    assert_eq!(spool.len(), 1);
    let (mount, volume) = volume_of(&format!("{}/audit-1.jsonl", spool[0]));
    assert!(at(volume, "emptyDir").is_some());
    assert_ne!(at(mount, "readOnly").and_then(Yaml::as_bool), Some(true));
    assert_eq!(
        at(container, "securityContext.readOnlyRootFilesystem").and_then(Yaml::as_bool),
        Some(true)
    );
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot").and_then(Yaml::as_bool),
        Some(true)
    );
    assert!(!seq_at(pod, "topologySpreadConstraints").is_empty());

    // Stopping leaves time for the preStop pause and the audit flush.
    let pause: i64 = strings("preStop", at(container, "lifecycle.preStop.exec.command"))
        .last()
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or(0);
    let grace = int_at(pod, "terminationGracePeriodSeconds").unwrap();
    assert!(
        grace > pause + AUDIT_FLUSH_SECONDS,
        "terminationGracePeriodSeconds {grace} ≤ preStop {pause} + audit flush {AUDIT_FLUSH_SECONDS}"
    );
}

#[test]
fn the_service_budget_and_job_match_the_deployment_and_the_secrets_exist() {
    let objects = kubernetes_objects();
    let deployment = &the(&objects, "Deployment").yaml;
    let labels = at(deployment, "spec.template.metadata.labels").unwrap();
    assert_eq!(at(deployment, "spec.selector.matchLabels"), Some(labels));

    let service = &the(&objects, "Service").yaml;
    assert_eq!(str_at(service, "spec.type"), Some("ClusterIP"));
    assert_eq!(at(service, "spec.selector"), Some(labels));
    let ports = seq_at(service, "spec.ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(int_at(&ports[0], "port"), Some(50051));
    assert_eq!(str_at(&ports[0], "appProtocol"), Some("grpc"));
    assert_eq!(str_at(&ports[0], "targetPort"), Some("grpc"));

    let budget = &the(&objects, "PodDisruptionBudget").yaml;
    assert_eq!(int_at(budget, "spec.minAvailable"), Some(2));
    assert_eq!(at(budget, "spec.selector.matchLabels"), Some(labels));

    let job = &the(&objects, "Job").yaml;
    let migrate = kubernetes_invocations("job", job);
    assert_eq!(migrate.len(), 1);
    assert_eq!(migrate[0].args, ["migrate"]);

    // Every Secret key the workloads read is in the example, under the Secret they name.
    let secrets: BTreeMap<&str, BTreeSet<&str>> = objects
        .iter()
        .filter(|object| object.kind == "Secret")
        .map(|object| {
            assert!(
                object.origin.contains("secret.example.yaml"),
                "{}: real Secrets do not belong in the repository",
                object.origin
            );
            let keys = at(&object.yaml, "stringData")
                .and_then(Yaml::as_mapping)
                .unwrap_or_else(|| panic!("{}: no stringData", object.origin))
                .iter()
                .map(|(key, value)| {
                    assert!(
                        value.as_str().is_some_and(|value| value.contains("REPLACE-ME")),
                        "{}: `{key:?}` must hold a placeholder marked REPLACE-ME",
                        object.origin
                    );
                    key.as_str().unwrap()
                })
                .collect();
            (object.name.as_str(), keys)
        })
        .collect();
    let mut database_refs = Vec::new();
    for workload in [deployment, job] {
        let pod = pod_spec(workload).unwrap();
        for container in seq_at(pod, "containers") {
            for variable in seq_at(container, "env") {
                if let Some(reference) = at(variable, "valueFrom.secretKeyRef") {
                    let (name, key) = (
                        str_at(reference, "name").unwrap(),
                        str_at(reference, "key").unwrap(),
                    );
                    assert!(
                        secrets.get(name).is_some_and(|keys| keys.contains(key)),
                        "Secret `{name}` key `{key}` is not in secret.example.yaml"
                    );
                    if str_at(variable, "name") == Some("CAPGATE_DATABASE_URL") {
                        database_refs.push((name, key));
                    }
                }
            }
        }
        for volume in seq_at(pod, "volumes") {
            if let Some(name) = str_at(volume, "secret.secretName") {
                for item in seq_at(volume, "secret.items") {
                    let key = str_at(item, "key").unwrap();
                    assert!(
                        secrets.get(name).is_some_and(|keys| keys.contains(key)),
                        "Secret `{name}` key `{key}` is not in secret.example.yaml"
                    );
                }
            }
        }
    }
    assert_eq!(
        database_refs.len(),
        2,
        "the Deployment and the Job read the database URL"
    );
    assert_eq!(database_refs[0], database_refs[1], "from the same Secret");
}

#[test]
fn the_kustomization_lists_every_manifest_but_the_secret_example() {
    let kustomization = &parse_yaml(
        "kustomization.yaml",
        &read("deploy/kubernetes/kustomization.yaml"),
    )[0];
    let listed: BTreeSet<String> = strings("resources", at(kustomization, "resources"))
        .into_iter()
        .collect();
    let present: BTreeSet<String> = yaml_files()
        .iter()
        .filter_map(|file| file.strip_prefix("deploy/kubernetes/"))
        .filter(|file| *file != "kustomization.yaml" && *file != "secret.example.yaml")
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, present);

    // kustomize itself, when it is here: the directory builds, and the objects come out whole.
    let Ok(output) = Command::new("kubectl")
        .args(["kustomize"])
        .arg(repository().join("deploy/kubernetes"))
        .output()
    else {
        eprintln!("note: kubectl is not installed; `kubectl kustomize deploy/kubernetes` not run");
        return;
    };
    assert!(
        output.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let built = parse_yaml("kubectl kustomize", &String::from_utf8(output.stdout).unwrap());
    let kinds: BTreeSet<&str> = built.iter().filter_map(|object| str_at(object, "kind")).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["Deployment", "Job", "PodDisruptionBudget", "Service"])
    );
}

#[test]
fn the_compose_file_waits_for_postgres_and_the_migration() {
    let origin = "deploy/compose.yaml";
    let compose = &parse_yaml(origin, &read(origin))[0];
    let postgres = at(compose, "services.postgres").unwrap();
    assert!(str_at(postgres, "image").unwrap().starts_with("postgres:16"));
    assert!(strings("healthcheck", at(postgres, "healthcheck.test")).contains(&"pg_isready".to_owned()));

    let migrate = at(compose, "services.migrate").unwrap();
    assert_eq!(strings("migrate", at(migrate, "command")), ["migrate"]);
    assert_eq!(
        str_at(migrate, "depends_on.postgres.condition"),
        Some("service_healthy")
    );

    let capgate = at(compose, "services.capgate").unwrap();
    assert_eq!(
        str_at(capgate, "depends_on.postgres.condition"),
        Some("service_healthy")
    );
    assert_eq!(
        str_at(capgate, "depends_on.migrate.condition"),
        Some("service_completed_successfully")
    );
    let invocation = compose_invocations(origin, compose)
        .into_iter()
        .find(|invocation| invocation.origin.ends_with("`capgate`"))
        .unwrap();
    // Every `env://` token names a variable the service is given.
    let environment = at(capgate, "environment").and_then(Yaml::as_mapping).unwrap();
    let tokens: Vec<String> = ["--gateway-token", "--admin-token"]
        .iter()
        .flat_map(|flag| values_of(&invocation.args, flag))
        .collect();
    assert_eq!(tokens.len(), 2);
    for token in tokens {
        let variable = token
            .split_once("=env://")
            .unwrap_or_else(|| panic!("`{token}`: compose passes tokens through the environment"))
            .1;
        assert!(
            environment.iter().any(|(key, _)| key.as_str() == Some(variable)),
            "`{variable}` is not in the capgate service's environment"
        );
    }
    // The policy it publishes is mounted.
    let volumes = strings("volumes", at(capgate, "volumes"));
    for file in values_of(&invocation.args, "--policy")
        .into_iter()
        .chain(values_of(&invocation.args, "--catalog"))
    {
        assert!(
            volumes.iter().any(|volume| volume
                .split(':')
                .nth(1)
                .is_some_and(|target| file.starts_with(&format!("{target}/")))),
            "`{file}` is on no volume of {volumes:?}"
        );
    }
    let grace = str_at(capgate, "stop_grace_period").unwrap();
    let grace: i64 = grace.strip_suffix('s').unwrap().parse().unwrap();
    assert!(grace > AUDIT_FLUSH_SECONDS);
}

#[test]
fn the_systemd_unit_is_hardened_and_verifies() {
    let origin = "deploy/systemd/capgate.service";
    let text = read(origin);
    let settings = unit_settings(&text);
    let one = |key: &str| -> String {
        match settings.get(key).map(Vec::as_slice) {
            Some([value]) => value.clone(),
            other => panic!("{origin}: expected one {key}=, found {other:?}"),
        }
    };
    assert_eq!(one("KillSignal"), "SIGTERM");
    let stop: i64 = one("TimeoutStopSec").trim_end_matches('s').parse().unwrap();
    assert!(stop > AUDIT_FLUSH_SECONDS);
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert!(one("DynamicUser") == "yes" || settings.contains_key("User"));

    // The state directory holds everything the service writes, since the rest is read-only.
    let state = format!("/var/lib/{}/", one("StateDirectory"));
    let invocation = &systemd_invocations(origin, &text)[0];
    assert!(one("ExecStart").starts_with("/usr/local/bin/capgate serve"));
    for path in values_of(&invocation.args, "--audit-spool") {
        assert!(path.starts_with(&state), "the spool `{path}` is outside {state}");
    }
    for url in values_of(&invocation.args, "--database-url") {
        assert!(
            url.strip_prefix("sqlite://")
                .is_some_and(|path| path.starts_with(&state)),
            "the database `{url}` is outside {state}"
        );
    }
    // Tokens come from the environment file; the example defines each variable they name.
    let environment = read("deploy/systemd/capgate.env.example");
    assert!(one("EnvironmentFile").ends_with("/capgate.env"));
    for token in ["--gateway-token", "--admin-token"]
        .iter()
        .flat_map(|flag| values_of(&invocation.args, flag))
    {
        let variable = token.split_once("=env://").unwrap().1;
        assert!(
            environment
                .lines()
                .any(|line| line.starts_with(&format!("{variable}="))),
            "`{variable}` is not in capgate.env.example"
        );
    }

    // systemd's own verdict, when systemd-analyze is here. It needs the program to exist, so it
    // verifies a copy that runs the binary under test. A broken copy shows the check can fail.
    let verify = |unit: &str| -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capgate.service");
        std::fs::write(&path, unit.replace("/usr/local/bin/capgate", BIN)).unwrap();
        let output = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .ok()?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // Only what concerns this unit: other units of the machine may have their own complaints.
        let about_us: Vec<&str> = said.lines().filter(|line| line.contains("capgate")).collect();
        Some(format!(
            "exit {:?}\n{}",
            output.status.code(),
            about_us.join("\n")
        ))
    };
    let Some(verdict) = verify(&text) else {
        eprintln!("note: systemd-analyze is not installed; `systemd-analyze verify` not run");
        return;
    };
    assert_eq!(verdict, "exit Some(0)\n", "systemd-analyze verify {origin}");
    let broken = text.replace("KillMode=mixed", "KillMode=mixed\nFrobnicate=yes");
    let verdict = verify(&broken).unwrap();
    assert!(verdict.contains("Frobnicate"), "a broken unit passed: {verdict}");
}

#[test]
fn the_containerfile_builds_locked_and_runs_unprivileged() {
    let origin = "deploy/Containerfile";
    let text = read(origin);
    let lines = logical_lines(&text);
    let froms: Vec<&String> = lines.iter().filter(|line| line.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage: {froms:?}");
    assert!(froms[0].starts_with("FROM rust:${RUST_VERSION}-bookworm AS build"));
    assert!(lines.contains(&"ARG RUST_VERSION=1.95".to_owned()));
    assert!(froms[1].starts_with("FROM debian:bookworm-slim"));
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("RUN ") && line.contains("cargo build --release --locked")),
        "the build uses the lock file"
    );

    let stage = final_stage(&text);
    let value = |instruction: &str| -> Vec<String> {
        stage
            .iter()
            .filter(|(name, _)| name == instruction)
            .map(|(_, value)| value.clone())
            .collect()
    };
    let user = value("USER");
    assert_eq!(user.len(), 1);
    let uid = user[0].split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "the image runs as `{uid}`");
    assert_eq!(value("EXPOSE"), ["50051"]);
    assert_eq!(
        exec_form(origin, "ENTRYPOINT", &value("ENTRYPOINT")[0]),
        ["capgate"]
    );
    let invocation = &containerfile_invocations(origin, &text)[0];
    assert_eq!(values_of(&invocation.args, "--listen"), ["0.0.0.0:50051"]);
}

#[test]
fn the_ignore_rules_are_read_as_docker_reads_them() {
    let rules = ignore_rules("*\n!core/\n!/tests/fixtures/\n**/*.tmp\n!docs/*.md\n");
    for (path, expected) in [
        ("Cargo.toml", false),
        ("target/debug/capgate", false),
        ("core", true),
        ("core/src/lib.rs", true),
        ("tests/deploy.rs", false),
        ("tests/fixtures/cli/a.yaml", true),
        ("tests/fixtures/cli/a.tmp", false),
        ("core/src/x.tmp", false),
        ("docs/release.md", true),
        ("docs/decisions/0001.md", false),
    ] {
        assert_eq!(in_context(&rules, path), expected, "{path}");
    }
}

#[test]
fn the_image_builds_from_the_context_its_ignore_file_selects() {
    let containerfile = read("deploy/Containerfile");
    let ignore = read("deploy/Containerfile.dockerignore");
    let problems = image_build_problems(&containerfile, &ignore);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The check can fail, each way the image broke or could break: a workspace member left out of
    // the context (issue 29), left out of the stage, and a file the compiler embeds left behind.
    let problems = image_build_problems(&containerfile, &ignore.replace("\n!core/\n", "\n"));
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("`core` is not in the build context")),
        "{problems:#?}"
    );
    let problems = image_build_problems(&containerfile.replace("\nCOPY core core\n", "\n"), &ignore);
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("`core/src/lib.rs` is read to build capgate"))
            && problems.iter().any(|problem| problem.contains("cargo metadata")),
        "{problems:#?}"
    );
    let problems = image_build_problems(
        &containerfile.replace("\nCOPY migrations migrations\n", "\n"),
        &ignore,
    );
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("`migrations/sqlite/0001_init.sql` is read to build capgate")),
        "{problems:#?}"
    );
}

/// The commands of the header comment of deploy/compose.yaml: its indented lines, continuations
/// joined, comment lines dropped.
fn compose_header_commands(text: &str) -> Vec<String> {
    let header: String = text
        .lines()
        .take_while(|line| line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("#   "))
        .map(|line| format!("{line}\n"))
        .collect();
    logical_lines(&header)
}

/// Runs `script` in bash from the repository root with `capgate` on the PATH.
fn bash(script: &str, env: &[(String, String)]) -> std::process::Output {
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(repository())
        .env("PATH", path)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .output()
        .expect("run bash")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_headers_commands_work_against_the_binary() {
    let origin = "deploy/compose.yaml";
    let text = read(origin);
    let compose = &parse_yaml(origin, &text)[0];
    let commands = compose_header_commands(&text);
    let up = commands
        .iter()
        .position(|command| command.starts_with("docker compose"))
        .unwrap_or_else(|| panic!("{origin}: the header starts no `docker compose`: {commands:#?}"));
    let (before, after) = (&commands[..up], &commands[up + 1..]);
    assert!(!after.is_empty(), "{origin}: the header asks the service nothing");

    // What the header exports before `docker compose up`: every variable the file requires.
    let required: BTreeSet<&str> = text
        .split("${")
        .skip(1)
        .filter_map(|rest| rest.split_once(":?").map(|(name, _)| name))
        .collect();
    let printed = bash(
        &format!(
            "{}\n{}",
            before.join("\n"),
            required
                .iter()
                .map(|name| format!("printf '%s\\n' \"${{{name}:-}}\""))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        &[],
    );
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let values: BTreeMap<&str, String> = required
        .iter()
        .copied()
        .zip(
            String::from_utf8(printed.stdout)
                .unwrap()
                .lines()
                .map(str::to_owned),
        )
        .collect();
    for (name, value) in &values {
        assert!(
            !value.is_empty(),
            "{origin}: the header does not set `{name}`, which Compose requires"
        );
    }
    let interpolate = |value: &str| -> String {
        let mut value = value.to_owned();
        for (name, set) in &values {
            while let Some(start) = value.find(&format!("${{{name}:?")) {
                let end = start + value[start..].find('}').unwrap();
                value.replace_range(start..=end, set);
            }
        }
        value
    };

    // The capgate service as Compose would run it: its command line and environment, its volumes
    // on folders of the host, its ports on loopback, its store on SQLite (after the migrate
    // service's command), and the variables from the header.
    let scratch = tempfile::tempdir().unwrap();
    let database = format!(
        "sqlite://{}?mode=rwc",
        scratch.path().join("capgate.db").display()
    );
    let service = at(compose, "services.capgate").unwrap();
    let mut mounts = Vec::new();
    for volume in strings(origin, at(service, "volumes")) {
        let mut parts = volume.split(':');
        let (source, target) = (parts.next().unwrap(), parts.next().unwrap());
        let host = if source.starts_with('.') || source.starts_with('/') {
            repository().join("deploy").join(source)
        } else {
            scratch.path().join(source)
        };
        std::fs::create_dir_all(&host).unwrap();
        mounts.push((target.to_owned(), host.display().to_string()));
    }
    let mut environment: Vec<(String, String)> = at(service, "environment")
        .and_then(Yaml::as_mapping)
        .unwrap()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().unwrap().to_owned(),
                interpolate(value.as_str().unwrap()),
            )
        })
        .filter(|(name, _)| name != "CAPGATE_DATABASE_URL")
        .collect();
    environment.push(("CAPGATE_DATABASE_URL".to_owned(), database.clone()));
    let migrate = strings(origin, at(compose, "services.migrate.command"));
    let migrated = Command::new(BIN)
        .args(&migrate)
        .envs(environment.clone())
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "capgate {migrate:?}: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let mut args = Vec::new();
    let mut words = compose_invocations(origin, compose)
        .into_iter()
        .find(|invocation| invocation.origin.ends_with("`capgate`"))
        .unwrap()
        .args
        .into_iter()
        .skip(1); // `serve`: Serve adds it
    while let Some(word) = words.next() {
        match word.as_str() {
            // Serve listens on a loopback port of its choosing; metrics likewise.
            "--listen" => {
                words.next();
            }
            "--metrics-listen" => {
                words.next();
                args.extend(["--metrics-listen".to_owned(), "127.0.0.1:0".to_owned()]);
            }
            _ => args.push(
                mounts
                    .iter()
                    .find_map(|(target, host)| {
                        word.strip_prefix(target.as_str())
                            .map(|rest| format!("{host}{rest}"))
                    })
                    .unwrap_or(word),
            ),
        }
    }
    args.extend(["--database-url".to_owned(), database]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = environment
        .iter()
        .filter(|(name, _)| name != "CAPGATE_DATABASE_URL")
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let serve = support::process::Serve::start_with_env(&args, &env).await;

    // The header's questions, as written, to that service.
    let exported: Vec<(String, String)> = values
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.clone()))
        .collect();
    let asked = after
        .join("\n")
        .replace("127.0.0.1:50051", &serve.addr.to_string());
    let answered = bash(&asked, &exported);
    let stdout = String::from_utf8_lossy(&answered.stdout);
    assert!(
        answered.status.success() && stdout.contains("ALLOWED"),
        "{origin}'s header:\n{asked}\nexit {:?}\n{stdout}{}",
        answered.status.code(),
        String::from_utf8_lossy(&answered.stderr)
    );

    // The check can fail: the header's former question, a client certificate forwarded by a gateway
    // that may not assert, is refused by the same service.
    let former = format!(
        "CAPGATE_TOKEN=\"$CAPGATE_GATEWAY_TOKEN\" capgate decide --server http://{} \
         --client-dn \"CN=refunder,OU=payments,O=Acme Corp\" --capability billing.refund.create",
        serve.addr
    );
    let refused = bash(&former, &exported);
    assert!(
        !refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("may not forward"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// Where a `capgate serve` of the README listens and keeps its store.
#[derive(Debug, PartialEq)]
struct Service {
    listen: String,
    store: String,
}

/// The service a README block starts: `serve`'s flags, else the environment the block sourced,
/// else `capgate serve --help`'s defaults. `None` when the block starts none.
fn service_of(block: &str, env: &BTreeMap<String, String>) -> Option<Service> {
    let line = logical_lines(block).into_iter().find(|line| {
        line.split_whitespace().any(|word| word == "serve") && line.contains("capgate")
            || line.contains("-- serve")
    })?;
    let args: Vec<String> = line
        .split_whitespace()
        .skip_while(|word| *word != "serve")
        .map(str::to_owned)
        .collect();
    let help = Command::new(BIN).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let setting = |flag: &str, variable: &str| -> String {
        if let Some(value) = values_of(&args, flag).pop() {
            return value;
        }
        if let Some(value) = env.get(variable) {
            return value.clone();
        }
        help.split(&format!("[env: {variable}] [default: "))
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .unwrap_or_else(|| panic!("`capgate serve --help` gives no default for {variable}"))
            .to_owned()
    };
    Some(Service {
        listen: setting("--listen", "CAPGATE_LISTEN"),
        store: setting("--database-url", "CAPGATE_DATABASE_URL"),
    })
}

/// The fenced shell blocks of a Markdown text.
fn shell_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (line.trim_start().strip_prefix("```"), &mut current) {
            (Some(_), Some(_)) => blocks.extend(current.take()),
            (Some(tag), None) => current = matches!(tag.trim(), "sh" | "bash").then(String::new),
            (None, Some(block)) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// Every way the README's tour would collide with its main command: the same address, the same
/// store, or a gateway that asks another service than the tour's. `tour_env` is what sourcing
/// examples/tour/tour.env sets.
fn tour_collisions(readme: &str, tour_env: &BTreeMap<String, String>) -> Vec<String> {
    let blocks = shell_blocks(readme);
    let main = blocks
        .iter()
        .find(|block| block.contains("cargo run --release -- serve"))
        .and_then(|block| service_of(block, &BTreeMap::new()))
        .expect("README.md's main command starts `capgate serve`");
    let tour = blocks
        .iter()
        .find(|block| block.contains(". examples/tour/tour.env") && block.contains("capgate serve"))
        .and_then(|block| service_of(block, tour_env))
        .expect("README.md's tour starts `capgate serve` after sourcing examples/tour/tour.env");
    let mut problems = Vec::new();
    if main.listen == tour.listen {
        problems.push(format!(
            "the main command and the tour both listen on {}",
            tour.listen
        ));
    }
    if main.store == tour.store {
        problems.push(format!(
            "the main command and the tour share the store {}",
            tour.store
        ));
    }
    let asked = tour_env
        .get("CAPGATE_URL")
        .map(String::as_str)
        .unwrap_or("http://127.0.0.1:50051");
    if asked != format!("http://{}", tour.listen) {
        problems.push(format!(
            "the tour's gateway asks {asked}, and the tour's service listens on {}",
            tour.listen
        ));
    }
    problems
}

/// What sourcing examples/tour/tour.env sets, of the variables that place the tour's service.
fn tour_env() -> BTreeMap<String, String> {
    let names = ["CAPGATE_LISTEN", "CAPGATE_DATABASE_URL", "CAPGATE_URL"];
    let script = format!(
        ". examples/tour/tour.env\n{}",
        names
            .map(|name| format!("printf '%s\\n' \"${{{name}-<unset>}}\""))
            .join("\n")
    );
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(repository());
    for name in names {
        command.env_remove(name);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    names
        .into_iter()
        .zip(String::from_utf8(output.stdout).unwrap().lines())
        .filter(|(_, value)| *value != "<unset>")
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

#[test]
fn the_readme_tour_runs_beside_the_main_command() {
    let readme = read("README.md");
    let env = tour_env();
    let problems = tour_collisions(&readme, &env);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The check can fail: tour.env as it was (issue 29) collides on the address, and a tour without
    // a store of its own would share the main command's.
    let mut former = env.clone();
    former.remove("CAPGATE_LISTEN");
    former.remove("CAPGATE_URL");
    assert_eq!(
        tour_collisions(&readme, &former),
        ["the main command and the tour both listen on 127.0.0.1:50051"]
    );
    let mut shared = env.clone();
    shared.remove("CAPGATE_DATABASE_URL");
    assert_eq!(
        tour_collisions(&readme, &shared),
        ["the main command and the tour share the store sqlite://capgate.db"]
    );
}
