//! AuthZEN's JSON ↔ the pipeline's terms (docs/decisions/0018-authzen.md).
//!
//! | AuthZEN | pipeline |
//! |---|---|
//! | `subject {type: "identity", id, properties.token \| api_key \| client_certificate}` | `Asked::CredentialOf` (`id` must be the verified subject) |
//! | `subject {type: "identity", id, properties: {issuer, attributes}}` | `Asked::Principal` (gateways trusted to assert) |
//! | `properties.issuer` with a credential | the issuer hint |
//! | `action.name = "tools/call"` | a decision (any other action: 400) |
//! | `resource {type: "tool", id}` / `{type: "capability", id}` | `Target::Tool` / `Target::Capability` |
//! | `resource.properties.arguments`, else `context.arguments` (an object) | the call's arguments, which a grant's conditions read (absent: not forwarded) |
//! | `X-Request-ID` | `request_id` (`<id>/<index>` for a batch's items) |
//!
//! Requests are read as a JSON tree first and then field by field, so that every error names the
//! field (`evaluations[2].resource.id: …`) and never quotes a value (it may be a credential).
//! Unknown members are ignored, as the spec requires; of `context`, only `arguments` is read.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::identity::Presented;
use crate::service::bounds::{
    MAX_ATTRIBUTES, MAX_ATTRIBUTE_NAME, MAX_ATTRIBUTE_VALUE, MAX_ATTRIBUTE_VALUES, MAX_CREDENTIAL,
    MAX_ISSUER, MAX_SUBJECT, MAX_TARGET,
};
use crate::service::identify::{Asked, AssertedCaller};
use crate::service::pipeline::{CallArguments, Target};

/// The one action capgate decides: calling an MCP tool (the COAZ-MCP binding's name).
pub const TOOLS_CALL: &str = "tools/call";

/// The largest request body: a 16 KiB credential and a batch of small items fit.
pub const MAX_BODY: usize = 64 * 1024;
/// The deepest nesting of arrays and objects a request may have; the deepest the API reads is 5.
pub const MAX_DEPTH: usize = 32;
/// The most items an `evaluations` batch may hold.
pub const MAX_EVALUATIONS: usize = 64;

/// A request the door cannot take, as the HTTP status and the message the spec's error body
/// carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: u16,
    pub message: String,
}

impl Problem {
    pub fn bad_request(field: &str, problem: impl std::fmt::Display) -> Problem {
        Problem {
            status: 400,
            message: format!("`{field}`: {problem}"),
        }
    }
}

/// Parses a body as one JSON object, within [`MAX_DEPTH`].
pub fn parse_body(body: &[u8]) -> Result<Map<String, Value>, Problem> {
    if let Some(depth) = too_deep(body) {
        return Err(Problem {
            status: 400,
            message: format!("the request nests more than {MAX_DEPTH} arrays or objects (at byte {depth})"),
        });
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(Problem {
            status: 400,
            message: "the request body must be a JSON object".to_owned(),
        }),
        // serde_json's message names the line and column, never the text around it.
        Err(error) => Err(Problem {
            status: 400,
            message: format!("the request body is not JSON: {error}"),
        }),
    }
}

/// The offset where nesting first passes [`MAX_DEPTH`], found before anything is built, so that
/// a deep document costs a scan and not a tree.
fn too_deep(body: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, byte) in body.iter().enumerate() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(at);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// One evaluation, read and within bounds, borrowing from the request's JSON.
#[derive(Debug)]
pub struct Evaluation<'a> {
    pub caller: Asked<'a>,
    pub target: Target<'a>,
    /// The tool call's arguments; `None` when the request carries none.
    pub arguments: Option<Arc<CallArguments>>,
}

/// The parts of an evaluation: each from the item itself, else from the batch's defaults.
#[derive(Clone)]
pub struct Parts<'a> {
    pub subject: Option<(&'a Value, String)>,
    pub action: Option<(&'a Value, String)>,
    pub resource: Option<(&'a Value, String)>,
    pub context: Option<(&'a Value, String)>,
}

impl<'a> Parts<'a> {
    /// The top level of a request: `subject`, `action`, `resource`, `context`.
    pub fn of(object: &'a Map<String, Value>, prefix: &str) -> Parts<'a> {
        let part = |name: &str| object.get(name).map(|value| (value, format!("{prefix}{name}")));
        Parts {
            subject: part("subject"),
            action: part("action"),
            resource: part("resource"),
            context: part("context"),
        }
    }

    /// `self` where present, `defaults` elsewhere.
    pub fn or(self, defaults: Parts<'a>) -> Parts<'a> {
        Parts {
            subject: self.subject.or(defaults.subject),
            action: self.action.or(defaults.action),
            resource: self.resource.or(defaults.resource),
            context: self.context.or(defaults.context),
        }
    }

    /// Reads the evaluation; `at` names it in errors (`` or `evaluations[2].`).
    pub fn evaluation(self, at: &str) -> Result<Evaluation<'a>, Problem> {
        let (subject, subject_field) = required(self.subject, &format!("{at}subject"))?;
        let (action, action_field) = required(self.action, &format!("{at}action"))?;
        let (resource, resource_field) = required(self.resource, &format!("{at}resource"))?;
        action_is_tools_call(action, &action_field)?;
        let target = target(resource, &resource_field)?;
        let caller = caller(subject, &subject_field)?;
        let arguments = arguments(resource, &resource_field, self.context)?;
        Ok(Evaluation {
            caller,
            target,
            arguments,
        })
    }
}

fn required<'a>(part: Option<(&'a Value, String)>, field: &str) -> Result<(&'a Value, String), Problem> {
    part.ok_or_else(|| Problem::bad_request(field, "required"))
}

/// `value` as an object.
pub fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, Problem> {
    value
        .as_object()
        .ok_or_else(|| Problem::bad_request(field, "must be an object"))
}

/// `object[name]` as a string within `limit` bytes, without U+0000; `None` when absent.
pub fn text<'a>(
    object: &'a Map<String, Value>,
    name: &str,
    field: &str,
    limit: usize,
) -> Result<Option<&'a str>, Problem> {
    let Some(value) = object.get(name) else {
        return Ok(None);
    };
    let field = format!("{field}.{name}");
    let text = value
        .as_str()
        .ok_or_else(|| Problem::bad_request(&field, "must be a string"))?;
    bounded(text, &field, limit)?;
    Ok(Some(text))
}

/// A string within `limit` bytes and without U+0000 (the audit trail cannot hold it). The value
/// is never quoted.
fn bounded(text: &str, field: &str, limit: usize) -> Result<(), Problem> {
    if text.len() > limit {
        return Err(Problem::bad_request(
            field,
            format!("{} bytes, more than the limit of {limit}", text.len()),
        ));
    }
    if let Some(at) = text.find('\0') {
        return Err(Problem::bad_request(
            field,
            format!("a NUL character (U+0000) at byte {at}, which the store cannot hold"),
        ));
    }
    Ok(())
}

fn required_text<'a>(
    object: &'a Map<String, Value>,
    name: &str,
    field: &str,
    limit: usize,
) -> Result<&'a str, Problem> {
    text(object, name, field, limit)?
        .ok_or_else(|| Problem::bad_request(&format!("{field}.{name}"), "required"))
}

/// `action.name` must be `tools/call`: it is the only question capgate answers.
pub fn action_is_tools_call(action: &Value, field: &str) -> Result<(), Problem> {
    let name = required_text(object(action, field)?, "name", field, MAX_TARGET)?;
    if name == TOOLS_CALL {
        Ok(())
    } else {
        Err(Problem::bad_request(
            &format!("{field}.name"),
            format!("capgate decides `{TOOLS_CALL}` only"),
        ))
    }
}

/// What a resource's `type` says it is: `tool` (an exposed tool name) or `capability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Capability,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Capability => "capability",
        }
    }
}

/// A resource's `type` (a resource search reads only this; its `id` is ignored).
pub fn resource_kind(resource: &Value, field: &str) -> Result<Kind, Problem> {
    match required_text(object(resource, field)?, "type", field, MAX_TARGET)? {
        "tool" => Ok(Kind::Tool),
        "capability" => Ok(Kind::Capability),
        _ => Err(Problem::bad_request(
            &format!("{field}.type"),
            "must be `tool` or `capability`",
        )),
    }
}

/// What an evaluation's resource names: its `type` and its required `id`.
pub fn target<'a>(resource: &'a Value, field: &str) -> Result<Target<'a>, Problem> {
    let kind = resource_kind(resource, field)?;
    let id = required_text(object(resource, field)?, "id", field, MAX_TARGET)?;
    Ok(match kind {
        Kind::Tool => Target::Tool(id),
        Kind::Capability => Target::Capability(id),
    })
}

/// The call's arguments: `resource.properties.arguments`, else `context.arguments`; each must be
/// an object where it is given. `None` when neither is: the arguments were not forwarded.
fn arguments(
    resource: &Value,
    resource_field: &str,
    context: Option<(&Value, String)>,
) -> Result<Option<Arc<CallArguments>>, Problem> {
    let properties_field = format!("{resource_field}.properties");
    let of_resource = match object(resource, resource_field)?.get("properties") {
        None => None,
        Some(properties) => arguments_in(properties, &properties_field)?,
    };
    let of_context = match &context {
        None => None,
        Some((context, field)) => arguments_in(context, field)?,
    };
    // Copied once, out of the request's tree, for the pipeline to hold.
    Ok(of_resource
        .or(of_context)
        .map(|arguments| Arc::new(arguments.clone())))
}

/// `holder.arguments` (`holder` an object named `field`), which must be an object when present.
fn arguments_in<'a>(holder: &'a Value, field: &str) -> Result<Option<&'a CallArguments>, Problem> {
    match object(holder, field)?.get("arguments") {
        None => Ok(None),
        Some(Value::Object(arguments)) => Ok(Some(arguments)),
        Some(_) => Err(Problem::bad_request(
            &format!("{field}.arguments"),
            "must be an object (the tool call's arguments)",
        )),
    }
}

/// The caller a subject names: the credential in its properties, checked to be `id`'s, or else
/// an asserted principal (`properties.issuer` and `properties.attributes`).
pub fn caller<'a>(subject: &'a Value, field: &str) -> Result<Asked<'a>, Problem> {
    let subject_object = object(subject, field)?;
    let kind = required_text(subject_object, "type", field, MAX_TARGET)?;
    if kind != "identity" {
        return Err(Problem::bad_request(
            &format!("{field}.type"),
            "must be `identity`",
        ));
    }
    let id = required_text(subject_object, "id", field, MAX_SUBJECT)?;
    let properties_field = format!("{field}.properties");
    let Some(properties) = subject_object.get("properties") else {
        return Err(Problem::bad_request(
            &format!("{properties_field}.issuer"),
            "required: an asserted subject names its issuer (or carry the caller's `token`)",
        ));
    };
    let properties = object(properties, &properties_field)?;
    let issuer = text(properties, "issuer", &properties_field, MAX_ISSUER)?;
    let credentials = [
        ("token", Presented::BearerToken as fn(&'a str) -> Presented<'a>),
        ("api_key", Presented::ApiKey),
        ("client_certificate", Presented::ClientCertificate),
    ];
    let mut presented = None;
    for (name, kind) in credentials {
        if let Some(value) = text(properties, name, &properties_field, MAX_CREDENTIAL)? {
            if presented.is_some() {
                return Err(Problem::bad_request(
                    &format!("{properties_field}.{name}"),
                    "give one of `token`, `api_key` and `client_certificate`",
                ));
            }
            presented = Some(kind(value));
        }
    }
    if let Some(presented) = presented {
        return Ok(Asked::CredentialOf {
            // An empty credential is no credential: `credential_missing`, answered and audited.
            presented: Some(presented).filter(|presented| !credential_text(presented).is_empty()),
            hint: issuer.filter(|issuer| !issuer.is_empty()),
            subject: id,
        });
    }
    let issuer = issuer.ok_or_else(|| {
        Problem::bad_request(
            &format!("{properties_field}.issuer"),
            "required: an asserted subject names its issuer (or carry the caller's `token`)",
        )
    })?;
    let attributes = match properties.get("attributes") {
        None => Vec::new(),
        Some(attributes) => asserted_attributes(attributes, &format!("{properties_field}.attributes"))?,
    };
    Ok(Asked::Principal(AssertedCaller {
        issuer,
        subject: id,
        attributes,
    }))
}

fn credential_text<'a>(presented: &Presented<'a>) -> &'a str {
    match *presented {
        Presented::BearerToken(text) | Presented::ApiKey(text) | Presented::ClientCertificate(text) => text,
    }
}

/// `{name: "value" | ["value", …]}` as `(name, value)` pairs; a name with several values gives
/// no attribute (the policy's multi-valued rule, applied by the pipeline).
fn asserted_attributes<'a>(attributes: &'a Value, field: &str) -> Result<Vec<(&'a str, &'a str)>, Problem> {
    let attributes = object(attributes, field)?;
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(Problem::bad_request(
            field,
            format!(
                "{} attributes, more than the limit of {MAX_ATTRIBUTES}",
                attributes.len()
            ),
        ));
    }
    let mut pairs = Vec::with_capacity(attributes.len());
    for (name, value) in attributes {
        let named = format!("{field}.{name}");
        if name.len() > MAX_ATTRIBUTE_NAME {
            // The name is not repeated when it is the thing too long.
            return Err(Problem::bad_request(
                field,
                format!(
                    "an attribute name of {} bytes, more than the limit of {MAX_ATTRIBUTE_NAME}",
                    name.len()
                ),
            ));
        }
        bounded(name, field, MAX_ATTRIBUTE_NAME)?;
        match value {
            Value::String(text) => {
                bounded(text, &named, MAX_ATTRIBUTE_VALUE)?;
                pairs.push((name.as_str(), text.as_str()));
            }
            Value::Array(values) => {
                if values.len() > MAX_ATTRIBUTE_VALUES {
                    return Err(Problem::bad_request(
                        &named,
                        format!(
                            "{} values, more than the limit of {MAX_ATTRIBUTE_VALUES}",
                            values.len()
                        ),
                    ));
                }
                for (at, value) in values.iter().enumerate() {
                    let field = format!("{named}[{at}]");
                    let text = value
                        .as_str()
                        .ok_or_else(|| Problem::bad_request(&field, "must be a string"))?;
                    bounded(text, &field, MAX_ATTRIBUTE_VALUE)?;
                    pairs.push((name.as_str(), text));
                }
            }
            _ => {
                return Err(Problem::bad_request(
                    &named,
                    "must be a string or an array of strings",
                ))
            }
        }
    }
    Ok(pairs)
}

/// `options.evaluations_semantic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantic {
    /// Every item, in order (the default).
    ExecuteAll,
    /// Stop after the first item that is not permitted (`&&`).
    DenyOnFirstDeny,
    /// Stop after the first item that is permitted (`||`).
    PermitOnFirstPermit,
}

impl Semantic {
    pub fn of(request: &Map<String, Value>) -> Result<Semantic, Problem> {
        let Some(options) = request.get("options") else {
            return Ok(Semantic::ExecuteAll);
        };
        let options = object(options, "options")?;
        match text(options, "evaluations_semantic", "options", MAX_TARGET)? {
            None | Some("execute_all") => Ok(Semantic::ExecuteAll),
            Some("deny_on_first_deny") => Ok(Semantic::DenyOnFirstDeny),
            Some("permit_on_first_permit") => Ok(Semantic::PermitOnFirstPermit),
            Some(_) => Err(Problem::bad_request(
                "options.evaluations_semantic",
                "must be `execute_all`, `deny_on_first_deny` or `permit_on_first_permit`",
            )),
        }
    }

    /// Whether the batch ends after an item decided `permitted`.
    pub fn stops_after(self, permitted: bool) -> bool {
        match self {
            Semantic::ExecuteAll => false,
            Semantic::DenyOnFirstDeny => !permitted,
            Semantic::PermitOnFirstPermit => permitted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_counted_outside_strings() {
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(too_deep(deep.as_bytes()), Some(MAX_DEPTH));
        let quoted = format!("{{\"a\": \"{}\"}}", "[".repeat(100));
        assert_eq!(too_deep(quoted.as_bytes()), None);
        assert_eq!(too_deep(br#"{"a": "\"[[[[", "b": [1]}"#), None);
    }

    #[test]
    fn errors_name_the_field_and_not_the_value() {
        let body = br#"{"subject": {"type": "identity", "id": "ana", "properties": {"token": 7}},
                        "action": {"name": "tools/call"}, "resource": {"type": "tool", "id": "x"}}"#;
        let request = parse_body(body).unwrap();
        let error = Parts::of(&request, "").evaluation("").unwrap_err();
        assert_eq!(error.message, "`subject.properties.token`: must be a string");
        let secret = "s3cret-token\u{0}";
        let body = serde_json::json!({"subject": {"type": "identity", "id": "ana", "properties": {"token": secret}},
            "action": {"name": "tools/call"}, "resource": {"type": "tool", "id": "x"}});
        let request = parse_body(body.to_string().as_bytes()).unwrap();
        let error = Parts::of(&request, "").evaluation("").unwrap_err();
        assert!(error.message.starts_with("`subject.properties.token`: a NUL"));
        assert!(!error.message.contains("s3cret"));
    }

    #[test]
    fn items_take_the_defaults_they_lack() {
        let body = br#"{"subject": {"type": "identity", "id": "ana", "properties": {"issuer": "staff"}},
                        "action": {"name": "tools/call"},
                        "evaluations": [{"resource": {"type": "capability", "id": "c"}}, {"action": {"name": "read"}, "resource": {"type": "tool", "id": "t"}}]}"#;
        let request = parse_body(body).unwrap();
        let defaults = Parts::of(&request, "");
        let items = request["evaluations"].as_array().unwrap();
        let first = object(&items[0], "evaluations[0]").unwrap();
        let first = Parts::of(first, "evaluations[0].")
            .or(defaults.clone())
            .evaluation("evaluations[0].");
        assert!(matches!(first.unwrap().target, Target::Capability("c")));
        let second = object(&items[1], "evaluations[1]").unwrap();
        let second = Parts::of(second, "evaluations[1].").or(defaults.clone());
        assert_eq!(
            second.evaluation("evaluations[1].").unwrap_err().message,
            "`evaluations[1].action.name`: capgate decides `tools/call` only"
        );
    }
}
