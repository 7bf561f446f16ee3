//! Input bounds (docs/service.md): every string and list a caller sends has a
//! documented limit, checked before any work; a request over one gets
//! `INVALID_ARGUMENT` with a `google.rpc.BadRequest` naming each offending
//! field (and the message names the first). The transport caps the encoded
//! message at [`MAX_MESSAGE_BYTES`], so nothing unbounded is ever decoded.
//!
//! No string of `Decide` or `ListVisible`, nor a publish's `comment`, may hold
//! U+0000: PostgreSQL cannot store it in text, and these strings reach audit
//! records and remembered-response keys, which are committed in batches with
//! other callers' records (docs/decisions/0014). An artifact or catalog with a
//! NUL is refused by the compiler instead (`yaml_syntax`, or an unusable
//! catalog), with its position, as `capgate validate` refuses it.
//!
//! | field | limit |
//! |---|---|
//! | `principal.issuer` | 512 bytes |
//! | `principal.subject` | 1024 bytes |
//! | `principal.attributes` | 64 entries |
//! | `principal.attributes[i].name`, each value | 1024 bytes |
//! | `principal.attributes[i].values` | 64 values |
//! | `credential.bearer_token`, `.api_key`, `.client_certificate` | 16 KiB |
//! | `credential.issuer` | 512 bytes |
//! | `tool`, `capability` | 512 bytes |
//! | `request_id` | 128 bytes |
//! | `arguments_json` | 64 KiB, and a JSON object |
//! | `artifact`, `catalog` | 8 MiB each |
//! | `comment` | 4096 bytes |
//! | `ResetUsage`: `principal_id` | 1537 bytes (an issuer, `:`, a subject), required |
//! | `ResetUsage`: `capability` | 512 bytes (as `capability`), required |
//! | ext_authz: `mcp-method`, `mcp-name`, `x-mcp-*`, `context_extensions.mcp_server` | 512 bytes (as `tool`) |
//! | ext_authz: `authorization`, the API-key header, `x-forwarded-client-cert`, `source.principal` | 16 KiB (as a credential) |
//! | ext_authz: `x-request-id` | 128 bytes (as `request_id`) |
//! | ext_authz: the forwarded JSON-RPC body | 1 MiB |
//! | ext_authz: `request.http.headers` (or `header_map`) | 1024 headers |

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::service::pipeline::CallArguments;
use crate::wire::proto::{
    credential, decide_request, list_visible_request, AssertedPrincipal, Credential, DecideRequest,
    ListVisibleRequest, NoteDecisionRequest, NoteKind, PublishPolicyRequest, ResetUsageRequest,
};

pub const MAX_ISSUER: usize = 512;
pub const MAX_SUBJECT: usize = 1024;
pub const MAX_ATTRIBUTES: usize = 64;
pub const MAX_ATTRIBUTE_NAME: usize = 1024;
pub const MAX_ATTRIBUTE_VALUES: usize = 64;
pub const MAX_ATTRIBUTE_VALUE: usize = 1024;
pub const MAX_CREDENTIAL: usize = crate::identity::MAX_CREDENTIAL_BYTES;
pub const MAX_TARGET: usize = 512;
pub const MAX_REQUEST_ID: usize = 128;
/// A `Decide`'s `arguments_json`: a tool call's arguments, as JSON text.
pub const MAX_ARGUMENTS_JSON: usize = 64 * 1024;
pub const MAX_ARTIFACT: usize = capgate_core::policy::document::MAX_ARTIFACT_BYTES;
pub const MAX_CATALOG: usize = capgate_core::policy::document::MAX_ARTIFACT_BYTES;
pub const MAX_COMMENT: usize = 4096;
/// A principal id as the store keys counters: `issuer:subject`.
pub const MAX_PRINCIPAL_ID: usize = MAX_ISSUER + 1 + MAX_SUBJECT;
/// The largest JSON-RPC body the ext_authz door parses (Envoy's `max_request_bytes` should not
/// exceed it): a `tools/call` with its arguments.
pub const MAX_EXT_AUTHZ_BODY: usize = 1024 * 1024;
/// The most headers the ext_authz door takes in one forwarded request. Envoy forwards at most
/// `max_headers_count` of them, 100 unless configured otherwise, so this leaves ten times that;
/// a request with more is refused before any of them is read.
pub const MAX_EXT_AUTHZ_HEADERS: usize = 1024;
/// The largest encoded request: an artifact and a catalog at their limits,
/// plus room for the rest.
pub const MAX_MESSAGE_BYTES: usize = MAX_ARTIFACT + MAX_CATALOG + 64 * 1024;

/// The violations found so far.
#[derive(Debug, Default)]
struct Check {
    violations: Vec<FieldViolation>,
}

impl Check {
    /// A string within `limit` bytes and without U+0000. The value itself is
    /// never quoted: it may be a credential.
    fn text(&mut self, field: impl FnOnce() -> String, value: &str, limit: usize) {
        if let Some(problem) = violation(value, limit) {
            self.violations.push(FieldViolation::new(field(), problem));
        }
    }

    /// A string within `limit` bytes that the compiler checks itself (an
    /// artifact, a catalog).
    fn length(&mut self, field: &str, value: &str, limit: usize) {
        if value.len() > limit {
            self.violations.push(FieldViolation::new(
                field,
                format!("{} bytes, more than the limit of {limit}", value.len()),
            ));
        }
    }

    /// A value that is not what the field holds; `problem` never quotes it.
    fn invalid(&mut self, field: &str, problem: String) {
        self.violations.push(FieldViolation::new(field, problem));
    }

    fn count(&mut self, field: &str, count: usize, limit: usize, noun: &str) {
        if count > limit {
            self.violations.push(FieldViolation::new(
                field,
                format!("{count} {noun}, more than the limit of {limit}"),
            ));
        }
    }

    fn required(&mut self, field: &str, present: bool, what: &str) {
        if !present {
            self.violations
                .push(FieldViolation::new(field, format!("required: {what}")));
        }
    }

    fn principal(&mut self, principal: &AssertedPrincipal) {
        let AssertedPrincipal {
            issuer,
            subject,
            attributes,
        } = principal;
        self.text(|| "principal.issuer".into(), issuer, MAX_ISSUER);
        self.text(|| "principal.subject".into(), subject, MAX_SUBJECT);
        self.count(
            "principal.attributes",
            attributes.len(),
            MAX_ATTRIBUTES,
            "attributes",
        );
        for (index, attribute) in attributes.iter().take(MAX_ATTRIBUTES).enumerate() {
            self.text(
                || format!("principal.attributes[{index}].name"),
                &attribute.name,
                MAX_ATTRIBUTE_NAME,
            );
            self.count(
                &format!("principal.attributes[{index}].values"),
                attribute.values.len(),
                MAX_ATTRIBUTE_VALUES,
                "values",
            );
            for (at, value) in attribute.values.iter().take(MAX_ATTRIBUTE_VALUES).enumerate() {
                self.text(
                    || format!("principal.attributes[{index}].values[{at}]"),
                    value,
                    MAX_ATTRIBUTE_VALUE,
                );
            }
        }
    }

    /// The credential's size; an empty or absent value is not a malformed
    /// request but `credential_missing`, answered and audited.
    fn credential(&mut self, presented: &Credential) {
        let Credential { kind, issuer } = presented;
        self.text(|| "credential.issuer".into(), issuer, MAX_ISSUER);
        let (field, value) = match kind {
            Some(credential::Kind::BearerToken(value)) => ("credential.bearer_token", value),
            Some(credential::Kind::ApiKey(value)) => ("credential.api_key", value),
            Some(credential::Kind::ClientCertificate(value)) => ("credential.client_certificate", value),
            None => return,
        };
        self.text(|| field.into(), value, MAX_CREDENTIAL);
    }

    fn finish(self) -> Result<(), Status> {
        let Some(first) = self.violations.first() else {
            return Ok(());
        };
        let message = format!("`{}`: {}", first.field, first.description);
        Err(Status::with_error_details(
            Code::InvalidArgument,
            message,
            ErrorDetails::with_bad_request(self.violations),
        ))
    }
}

/// The strings a door takes from its own protocol, checked as capgate's own door checks its
/// fields: each `(field, value, limit)` within its limit and free of U+0000. The message names
/// the first field over; the details name every one.
pub fn texts(fields: &[(&str, &str, usize)]) -> Result<(), Status> {
    let mut check = Check::default();
    for (field, value, limit) in fields {
        check.text(|| (*field).to_owned(), value, *limit);
    }
    check.finish()
}

/// What is wrong with a string a caller sent, if anything: longer than `limit` bytes, or holding
/// U+0000. The value itself is never quoted: it may be a credential. Doors that answer in their
/// own protocol (ext_authz) name the field themselves.
pub fn violation(value: &str, limit: usize) -> Option<String> {
    if value.len() > limit {
        Some(format!("{} bytes, more than the limit of {limit}", value.len()))
    } else {
        value
            .find('\0')
            .map(|at| format!("a NUL character (U+0000) at byte {at}, which the store cannot hold"))
    }
}

pub fn decide(request: &DecideRequest) -> Result<(), Status> {
    let DecideRequest {
        caller,
        target,
        request_id,
        arguments_json,
    } = request;
    let mut check = Check::default();
    match caller {
        Some(decide_request::Caller::Principal(principal)) => check.principal(principal),
        Some(decide_request::Caller::Credential(credential)) => check.credential(credential),
        None => check.required("caller", false, "a `credential` or a `principal`"),
    }
    match target {
        Some(decide_request::Target::Tool(tool)) => check.text(|| "tool".into(), tool, MAX_TARGET),
        Some(decide_request::Target::Capability(capability)) => {
            check.text(|| "capability".into(), capability, MAX_TARGET);
        }
        None => check.required("target", false, "a `tool` or a `capability`"),
    }
    check.text(|| "request_id".into(), request_id, MAX_REQUEST_ID);
    if let Some(arguments) = arguments_json {
        // Its content is read by [`arguments`], once every bound holds.
        check.length("arguments_json", arguments, MAX_ARGUMENTS_JSON);
    }
    check.finish()
}

/// A `Decide`'s `arguments_json` (within its bound: [`decide`] checked it), read: a JSON object,
/// or `INVALID_ARGUMENT` naming the field. The message says what is wrong and where, never what
/// the text holds (serde_json's messages name a line and a column, not the input).
pub fn arguments(text: &str) -> Result<CallArguments, Status> {
    let mut check = Check::default();
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(arguments)) => return Ok(arguments),
        Ok(other) => {
            let kind = match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::Object(_) => "an object",
            };
            check.invalid(
                "arguments_json",
                format!("{kind}, not a JSON object: a tool call's arguments are an object"),
            );
        }
        Err(error) => check.invalid("arguments_json", format!("not JSON: {error}")),
    }
    Err(check
        .finish()
        .err()
        .unwrap_or_else(|| Status::invalid_argument("`arguments_json`: not a JSON object")))
}

pub fn list_visible(request: &ListVisibleRequest) -> Result<(), Status> {
    let ListVisibleRequest { caller, request_id } = request;
    let mut check = Check::default();
    match caller {
        Some(list_visible_request::Caller::Principal(principal)) => check.principal(principal),
        Some(list_visible_request::Caller::Credential(credential)) => check.credential(credential),
        None => check.required("caller", false, "a `credential` or a `principal`"),
    }
    check.text(|| "request_id".into(), request_id, MAX_REQUEST_ID);
    check.finish()
}

/// A decision id (a UUIDv7 in its 36-character form).
pub const MAX_DECISION_ID: usize = 64;
/// A note's detail: one line on what happened.
pub const MAX_NOTE_DETAIL: usize = 1024;

pub fn note_decision(request: &NoteDecisionRequest) -> Result<(), Status> {
    let NoteDecisionRequest {
        decision_id,
        kind,
        detail,
    } = request;
    let mut check = Check::default();
    check.required(
        "decision_id",
        !decision_id.is_empty(),
        "the allow's `decision_id`",
    );
    let known = NoteKind::try_from(*kind).is_ok_and(|kind| kind != NoteKind::Unspecified);
    check.required(
        "kind",
        known,
        "NOTE_KIND_CREDENTIAL_FAILED or NOTE_KIND_UPSTREAM_FAILED",
    );
    check.text(|| "decision_id".into(), decision_id, MAX_DECISION_ID);
    check.text(|| "detail".into(), detail, MAX_NOTE_DETAIL);
    check.finish()
}

pub fn publish(request: &PublishPolicyRequest) -> Result<(), Status> {
    let PublishPolicyRequest {
        artifact,
        catalog,
        expected_active_revision: _,
        dry_run: _,
        comment,
        shadow: _,
    } = request;
    let mut check = Check::default();
    check.length("artifact", artifact, MAX_ARTIFACT);
    if let Some(catalog) = catalog {
        check.length("catalog", catalog, MAX_CATALOG);
    }
    check.text(|| "comment".into(), comment, MAX_COMMENT);
    check.finish()
}

pub fn reset_usage(request: &ResetUsageRequest) -> Result<(), Status> {
    let ResetUsageRequest {
        principal_id,
        capability,
    } = request;
    let mut check = Check::default();
    check.required(
        "principal_id",
        !principal_id.is_empty(),
        "the principal id, `issuer:subject`",
    );
    check.text(|| "principal_id".into(), principal_id, MAX_PRINCIPAL_ID);
    check.required("capability", !capability.is_empty(), "the capability id");
    check.text(|| "capability".into(), capability, MAX_TARGET);
    check.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::Attribute;

    fn principal(subject: &str, attributes: Vec<Attribute>) -> Option<decide_request::Caller> {
        Some(decide_request::Caller::Principal(AssertedPrincipal {
            issuer: "staff".into(),
            subject: subject.into(),
            attributes,
        }))
    }

    fn fields(status: &Status) -> Vec<String> {
        status
            .get_details_bad_request()
            .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_violation_is_named() {
        let request = DecideRequest {
            caller: principal(
                &"s".repeat(MAX_SUBJECT + 1),
                vec![Attribute {
                    name: "dept".into(),
                    values: vec!["x".repeat(MAX_ATTRIBUTE_VALUE + 1)],
                }],
            ),
            target: None,
            request_id: "r".repeat(MAX_REQUEST_ID + 1),
            arguments_json: None,
        };
        let status = decide(&request).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("`principal.subject`"));
        assert_eq!(
            fields(&status),
            [
                "principal.subject",
                "principal.attributes[0].values[0]",
                "target",
                "request_id"
            ]
        );
    }

    #[test]
    fn a_nul_character_is_named_without_quoting_the_value() {
        let request = DecideRequest {
            caller: Some(decide_request::Caller::Credential(Credential {
                kind: Some(credential::Kind::ApiKey("sec\0ret".into())),
                issuer: String::new(),
            })),
            target: Some(decide_request::Target::Tool("t".into())),
            request_id: String::new(),
            arguments_json: None,
        };
        let status = decide(&request).unwrap_err();
        assert_eq!(fields(&status), ["credential.api_key"]);
        assert!(status.message().contains("U+0000"), "{status:?}");
        assert!(!format!("{status:?}").contains("sec"), "{status:?}");
    }

    #[test]
    fn arguments_must_be_a_json_object_within_the_bound() {
        let request = |arguments: String| DecideRequest {
            caller: principal("ana", Vec::new()),
            target: Some(decide_request::Target::Tool("t".into())),
            request_id: String::new(),
            arguments_json: Some(arguments),
        };
        // At the bound: a string member padded to exactly 64 KiB.
        let at = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_ARGUMENTS_JSON - 8));
        assert_eq!(at.len(), MAX_ARGUMENTS_JSON);
        assert!(decide(&request(at.clone())).is_ok());
        assert_eq!(arguments(&at).expect("an object").len(), 1);
        let over = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_ARGUMENTS_JSON - 7));
        let status = decide(&request(over)).unwrap_err();
        assert_eq!(fields(&status), ["arguments_json"]);
        assert!(
            status.message().starts_with("`arguments_json`: 65537 bytes"),
            "{status:?}"
        );

        for (text, says) in [
            ("{\"amount\": 5", "not JSON: EOF while parsing an object"),
            ("[1, 2]", "an array, not a JSON object"),
            ("\"secret-ish\"", "a string, not a JSON object"),
            ("null", "null, not a JSON object"),
            ("{} {}", "not JSON: trailing characters"),
        ] {
            let status = arguments(text).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument);
            assert_eq!(fields(&status), ["arguments_json"], "{text}");
            assert!(
                status.message().starts_with(&format!("`arguments_json`: {says}")),
                "{text}: {status:?}"
            );
            assert!(!status.message().contains("secret-ish"), "{status:?}");
        }
        // Nested past serde_json's recursion limit: refused, not a stack overflow.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(arguments(&deep)
            .unwrap_err()
            .message()
            .contains("recursion limit"));
    }

    #[test]
    fn at_the_limit_is_fine() {
        let request = DecideRequest {
            caller: principal(&"s".repeat(MAX_SUBJECT), Vec::new()),
            target: Some(decide_request::Target::Tool("t".repeat(MAX_TARGET))),
            request_id: "r".repeat(MAX_REQUEST_ID),
            arguments_json: None,
        };
        assert!(decide(&request).is_ok());
    }
}
