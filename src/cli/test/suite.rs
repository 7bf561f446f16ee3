//! The test file format (`*.capgate-test.yaml`): what one suite declares, and
//! loading it. The file is read by the same YAML layer as a policy, so every
//! problem in it has a line and a column; it is checked against the JSON
//! Schema `capgate schema --tests` prints (`schema.json`, the one definition of
//! the format), then read into the types below, then its references (a case
//! naming an undeclared principal) are checked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value as Json;

use capgate_core::access::Instant;
use capgate_core::policy::document::{Document, NodeRef, Number, Position, Value};

use crate::clock;

/// The format's JSON Schema, printed by `capgate schema --tests`.
pub const SCHEMA_JSON: &str = include_str!("schema.json");

/// One test file, loaded. Paths are resolved against the file's folder.
#[derive(Debug)]
pub struct Suite {
    /// The file as named on the command line or found by discovery.
    pub origin: String,
    /// The folder its relative paths start from.
    pub folder: PathBuf,
    /// The file's text, for the source lines of failing cases.
    pub text: String,
    pub policy: PathBuf,
    pub catalog: Option<PathBuf>,
    pub at: Option<Instant>,
    /// Per static-key issuer id, its key for this suite.
    pub keys: BTreeMap<String, String>,
    pub jwks: Option<PathBuf>,
    pub principals: BTreeMap<String, Principal>,
    pub decide: Vec<DecideCase>,
    pub visible: Vec<VisibleCase>,
    pub who_can: Vec<WhoCanCase>,
}

/// A principal by its parts, or a credential to authenticate offline.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Principal {
    Parts(Parts),
    Token(Token),
    ApiKey(ApiKey),
    ClientDn(ClientDn),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parts {
    pub issuer: String,
    pub subject: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, OneOrMany>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn values(&self) -> &[String] {
        match self {
            OneOrMany::One(value) => std::slice::from_ref(value),
            OneOrMany::Many(values) => values,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub token: String,
    pub jwks: Option<String>,
    pub issuer: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub api_key: String,
    pub issuer: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientDn {
    pub client_dn: String,
    pub issuer: Option<String>,
}

/// A case's principal: a name declared under `principals`, or one in place.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PrincipalUse {
    Named(String),
    Inline(Principal),
}

/// `usage`: a call count, `unknown` or `none`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum UsageSpec {
    Counted(u64),
    Word(UsageWord),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageWord {
    Unknown,
    None,
}

/// `ceiling`: `none`, or the exact ceiling.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Ceiling {
    None(NoCeiling),
    Limits { calls: u64, per: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoCeiling {
    None,
}

/// What a case is, and where it is in the test file.
#[derive(Debug, Clone)]
pub struct Located<T> {
    /// `/decide/3`: the case's pointer into the test file.
    pub pointer: String,
    pub position: Option<Position>,
    pub case: T,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideSpec {
    pub name: String,
    pub principal: PrincipalUse,
    pub capability: Option<String>,
    pub tool: Option<String>,
    pub usage: Option<UsageSpec>,
    pub window_start: Option<String>,
    pub at: Option<String>,
    /// The call's arguments; `None`: not given.
    pub arguments: Option<serde_json::Map<String, Json>>,
    pub expect: DecideExpect,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideExpect {
    pub decision: Option<String>,
    pub reason: Option<String>,
    pub pointer: Option<String>,
    pub grant: Option<String>,
    pub account: Option<String>,
    pub ceiling: Option<Ceiling>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisibleSpec {
    pub name: String,
    pub principal: PrincipalUse,
    pub expect: VisibleExpect,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisibleExpect {
    pub tools: Option<Vec<String>>,
    pub capabilities: Option<Vec<String>>,
    #[serde(default)]
    pub includes: Vec<String>,
    #[serde(default)]
    pub excludes: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhoCanSpec {
    pub name: String,
    pub capability: String,
    pub expect: WhoCanExpect,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhoCanExpect {
    pub grants: Option<Vec<String>>,
    pub declared: Option<bool>,
    pub realized: Option<bool>,
}

/// A decide case with its instants parsed.
#[derive(Debug, Clone)]
pub struct DecideCase {
    pub spec: Located<DecideSpec>,
    pub at: Option<Instant>,
    pub window_start: Option<Instant>,
}

pub type VisibleCase = Located<VisibleSpec>;
pub type WhoCanCase = Located<WhoCanSpec>;

/// The file as serde reads it, before positions and references.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    policy: String,
    catalog: Option<String>,
    at: Option<String>,
    #[serde(default)]
    keys: BTreeMap<String, String>,
    jwks: Option<String>,
    #[serde(default)]
    principals: BTreeMap<String, Principal>,
    #[serde(default)]
    decide: Vec<DecideSpec>,
    #[serde(default)]
    visible: Vec<VisibleSpec>,
    #[serde(default)]
    who_can: Vec<WhoCanSpec>,
}

/// One problem in a test file: a message and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub pointer: String,
    pub position: Option<Position>,
    pub message: String,
}

/// Loads a test file from its bytes. `origin` names it in messages; `folder`
/// is what its relative paths are relative to.
pub fn load(origin: &str, folder: &Path, bytes: &[u8]) -> Result<Suite, Vec<Problem>> {
    let document = Document::parse_bytes(bytes).map_err(|errors| {
        errors
            .into_iter()
            .map(|error| Problem {
                pointer: String::new(),
                position: Some(error.position),
                message: error.message,
            })
            .collect::<Vec<_>>()
    })?;
    let Some(root) = document.root() else {
        return Err(vec![Problem {
            pointer: String::new(),
            position: None,
            message: "the file holds no YAML document".to_owned(),
        }]);
    };
    let json = to_json(root);
    let mut problems = schema_problems(&document, &json);
    if !problems.is_empty() {
        return Err(problems);
    }
    let raw: Raw = serde_json::from_value(json).map_err(|error| {
        vec![Problem {
            pointer: String::new(),
            position: None,
            message: format!("the file does not have the test format: {error}"),
        }]
    })?;
    let at_of = |pointer: String, text: &Option<String>, problems: &mut Vec<Problem>| {
        let text = text.as_deref()?;
        match clock::parse(text) {
            Ok(instant) => Some(instant),
            Err(error) => {
                problems.push(problem(
                    &document,
                    pointer,
                    format!("`{text}` is not an instant: {error}"),
                ));
                None
            }
        }
    };
    let at = at_of("/at".to_owned(), &raw.at, &mut problems);
    let mut decide = Vec::new();
    for (index, spec) in raw.decide.into_iter().enumerate() {
        let pointer = format!("/decide/{index}");
        let at = at_of(format!("{pointer}/at"), &spec.at, &mut problems);
        let window_start = at_of(
            format!("{pointer}/window_start"),
            &spec.window_start,
            &mut problems,
        );
        if window_start.is_some() && !matches!(spec.usage, Some(UsageSpec::Counted(_))) {
            problems.push(problem(
                &document,
                format!("{pointer}/window_start"),
                "`window_start` needs a counted `usage`".to_owned(),
            ));
        }
        check_principal_use(
            &document,
            &raw.principals,
            &spec.principal,
            &pointer,
            &mut problems,
        );
        decide.push(DecideCase {
            spec: located(&document, pointer, spec),
            at,
            window_start,
        });
    }
    let visible: Vec<VisibleCase> = raw
        .visible
        .into_iter()
        .enumerate()
        .map(|(index, spec)| {
            let pointer = format!("/visible/{index}");
            check_principal_use(
                &document,
                &raw.principals,
                &spec.principal,
                &pointer,
                &mut problems,
            );
            located(&document, pointer, spec)
        })
        .collect();
    let who_can: Vec<WhoCanCase> = raw
        .who_can
        .into_iter()
        .enumerate()
        .map(|(index, spec)| located(&document, format!("/who_can/{index}"), spec))
        .collect();
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Suite {
        origin: origin.to_owned(),
        folder: folder.to_owned(),
        text: String::from_utf8_lossy(bytes).into_owned(),
        policy: folder.join(raw.policy),
        catalog: raw.catalog.map(|catalog| folder.join(catalog)),
        at,
        keys: raw.keys,
        jwks: raw.jwks.map(|jwks| folder.join(jwks)),
        principals: raw.principals,
        decide,
        visible,
        who_can,
    })
}

fn located<T>(document: &Document, pointer: String, case: T) -> Located<T> {
    Located {
        position: document.resolve(&pointer),
        pointer,
        case,
    }
}

fn problem(document: &Document, pointer: String, message: String) -> Problem {
    Problem {
        position: document.resolve(&pointer),
        pointer,
        message,
    }
}

/// A case naming a principal must name a declared one.
fn check_principal_use(
    document: &Document,
    declared: &BTreeMap<String, Principal>,
    used: &PrincipalUse,
    case: &str,
    problems: &mut Vec<Problem>,
) {
    if let PrincipalUse::Named(name) = used {
        if !declared.contains_key(name) {
            problems.push(problem(
                document,
                format!("{case}/principal"),
                format!("no principal `{name}` is declared under `principals`"),
            ));
        }
    }
}

/// The validator of `schema.json`, built once; `Err` only if the schema itself is broken,
/// which the test `the_schema_builds` rules out.
fn validator() -> Result<&'static jsonschema::Validator, &'static str> {
    static VALIDATOR: OnceLock<Result<jsonschema::Validator, String>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| {
            let schema: Json = serde_json::from_str(SCHEMA_JSON).map_err(|error| error.to_string())?;
            jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(&schema)
                .map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Every place the file breaks the schema, deepest first within a place,
/// in document order.
fn schema_problems(document: &Document, json: &Json) -> Vec<Problem> {
    let validator = match validator() {
        Ok(validator) => validator,
        // Never accept a file unchecked: a broken schema refuses every file, saying why.
        Err(error) => {
            return vec![problem(
                document,
                String::new(),
                format!("the test file schema does not build: {error}"),
            )]
        }
    };
    let mut problems: Vec<Problem> = validator
        .iter_errors(json)
        .map(|error| {
            let pointer = error.instance_path().as_str().to_owned();
            let message = describe(&pointer, &error);
            problem(document, pointer, message)
        })
        .collect();
    problems.sort_by(|a, b| {
        a.position
            .cmp(&b.position)
            .then_with(|| a.pointer.cmp(&b.pointer))
    });
    problems.dedup();
    problems
}

/// The validator's message, rewritten where its own wording would not help:
/// a `oneOf` over principal or usage forms says which forms exist.
fn describe(pointer: &str, error: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind;
    let last = pointer.rsplit('/').next().unwrap_or_default();
    match error.kind() {
        ValidationErrorKind::AnyOf { .. } if pointer.is_empty() => {
            "a test file needs at least one of `decide`, `visible` or `who_can`".to_owned()
        }
        ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::OneOfMultipleValid { .. }
            if last == "principal" || pointer.starts_with("/principals/") =>
        {
            "a principal is a declared name, `issuer` and `subject` (and `attributes`), or exactly one \
             credential: `token` (with `jwks`), `api_key` or `client_dn`, each with an optional `issuer`"
                .to_owned()
        }
        ValidationErrorKind::OneOfMultipleValid { .. } | ValidationErrorKind::OneOfNotValid { .. }
            if pointer.starts_with("/decide/") && pointer.matches('/').count() == 2 =>
        {
            "a decide case names exactly one of `capability` or `tool`".to_owned()
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let names: Vec<String> = unexpected.iter().map(|name| format!("`{name}`")).collect();
            format!("unknown member {} here", names.join(", "))
        }
        ValidationErrorKind::MinProperties { .. } if last == "expect" => {
            "`expect` names nothing to check".to_owned()
        }
        _ => {
            let mut text = error.to_string();
            // The validator's sentences start with a capital; ours do not.
            if let Some(first) = text.chars().next().filter(char::is_ascii_uppercase) {
                text.replace_range(..1, &first.to_ascii_lowercase().to_string());
            }
            // The validator quotes the whole offending value; a case can be long.
            if text.len() > 200 {
                format!("{}…", text.chars().take(200).collect::<String>())
            } else {
                text
            }
        }
    }
}

/// A parsed node as the JSON data model sees it (aliases followed).
fn to_json(node: NodeRef<'_>) -> Json {
    match node.value() {
        Value::Null | Value::Alias(_) => Json::Null,
        Value::Bool(flag) => Json::Bool(*flag),
        Value::Number(Number::Int(value)) => match (i64::try_from(*value), u64::try_from(*value)) {
            (Ok(small), _) => Json::from(small),
            (_, Ok(unsigned)) => Json::from(unsigned),
            #[allow(clippy::cast_precision_loss)]
            _ => serde_json::Number::from_f64(*value as f64).map_or(Json::Null, Json::Number),
        },
        Value::Number(Number::Float(value)) => {
            serde_json::Number::from_f64(*value).map_or(Json::Null, Json::Number)
        }
        Value::String(text) => Json::String(text.clone()),
        Value::Sequence(_) => Json::Array(node.items().map(to_json).collect()),
        Value::Mapping(_) => Json::Object(
            node.entries()
                .map(|(entry, value)| (entry.key.clone(), to_json(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<(String, String)> {
        match load("t.yaml", Path::new("."), text.as_bytes()) {
            Ok(_) => Vec::new(),
            Err(problems) => problems
                .into_iter()
                .map(|problem| {
                    let at = problem
                        .position
                        .map_or("-".to_owned(), |p| format!("{}:{}", p.line, p.column));
                    (at, problem.message)
                })
                .collect(),
        }
    }

    #[test]
    fn the_schema_builds() {
        let schema: Json = serde_json::from_str(SCHEMA_JSON).expect("schema.json is JSON");
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&schema)
            .expect("schema.json is a schema");
    }

    #[test]
    fn a_well_formed_file_loads() {
        let suite = load(
            "t.yaml",
            Path::new("/here"),
            b"policy: p.yaml\nprincipals:\n  a: { issuer: staff, subject: a }\ndecide:\n  - name: one\n    principal: a\n    capability: x\n    expect: { decision: allow }\n",
        )
        .expect("loads");
        assert_eq!(suite.policy, Path::new("/here/p.yaml"));
        assert_eq!(suite.decide.len(), 1);
        assert_eq!(
            suite.decide[0].spec.position.map(|p| (p.line, p.column)),
            Some((5, 5))
        );
    }

    #[test]
    fn problems_have_lines_and_columns() {
        assert_eq!(
            problems("policy: p.yaml\ndecide:\n  - name: one\n    principal: nobody\n    capability: x\n    expect: { decision: allow }\n"),
            vec![("4:16".to_owned(), "no principal `nobody` is declared under `principals`".to_owned())]
        );
        assert_eq!(
            problems("policy: p.yaml\n"),
            vec![(
                "1:1".to_owned(),
                "a test file needs at least one of `decide`, `visible` or `who_can`".to_owned()
            )]
        );
        let both = problems(
            "policy: p.yaml\ndecide:\n  - name: one\n    principal: { issuer: s, subject: a }\n    capability: x\n    tool: y\n    expect: { decision: allow }\n",
        );
        assert_eq!(
            both,
            vec![(
                "3:5".to_owned(),
                "a decide case names exactly one of `capability` or `tool`".to_owned()
            )]
        );
        let typo = problems(
            "policy: p.yaml\nwho_can:\n  - name: one\n    capability: x\n    expect: { grant: [] }\n",
        );
        assert_eq!(typo.len(), 1, "{typo:?}");
        assert_eq!(typo[0].0, "5:13");
        assert!(typo[0].1.contains("grant"), "{typo:?}");
        let when = problems(
            "policy: p.yaml\nat: yesterday\nwho_can:\n  - name: one\n    capability: x\n    expect: { declared: true }\n",
        );
        assert_eq!(when.len(), 1, "{when:?}");
        assert_eq!(when[0].0, "2:5");
        let syntax = problems("policy: [\n");
        assert_eq!(syntax.len(), 1, "{syntax:?}");
        assert_ne!(syntax[0].0, "-");
    }
}
