//! `POST /access/v1/search/subject`: who may call this tool (or use this capability) — the
//! service's `who-can` (docs/decisions/0018 §8).
//!
//! capgate grants to *conditions* (an issuer and attribute equalities), not to a list of
//! subjects, so most of the answer cannot be a list of identities: nobody knows every subject an
//! identity provider will ever sign a token for. The response says both things it does know:
//!
//! * `results`: the identities capgate can name — each `static-key` issuer's declared subject,
//!   when its key authenticates and a decision for it would allow now (ceilings aside);
//! * `context.conditions`: every grant that lets a principal through, in file order — its
//!   pointer, issuer, attribute selector, account and ceiling — which is the whole answer for
//!   `oidc` and `mtls` issuers and for asserted principals.
//!
//! It reads the policy's map, not a caller's standing, so it takes the admin token (as the
//! policy service does) and writes no audit record: no caller was decided for.

use serde_json::{json, Map, Value};

use capgate_core::access::{evaluate, who_can, Decision, Grant, ReasonCode, Usage};
use capgate_core::principals::{credential, IssuerKind, Principal};

use super::mapping::{self, Problem};
use crate::service::active::Active;
use crate::service::bounds::MAX_TARGET;
use crate::service::pipeline::Target;

/// What a subject search asks: the target, and the issuer it is narrowed to, if any.
pub struct Asked<'a> {
    pub target: Target<'a>,
    pub issuer: Option<&'a str>,
}

/// Reads `{subject: {type: "identity", properties?: {issuer?}}, action: {name: "tools/call"},
/// resource: {type, id}}`.
pub fn read(request: &Map<String, Value>) -> Result<Asked<'_>, Problem> {
    let part = |name: &str| {
        request
            .get(name)
            .ok_or_else(|| Problem::bad_request(name, "required"))
    };
    let subject = mapping::object(part("subject")?, "subject")?;
    let kind = mapping::text(subject, "type", "subject", MAX_TARGET)?
        .ok_or_else(|| Problem::bad_request("subject.type", "required"))?;
    if kind != "identity" {
        return Err(Problem::bad_request("subject.type", "must be `identity`"));
    }
    let issuer = match subject.get("properties") {
        None => None,
        Some(properties) => {
            let properties = mapping::object(properties, "subject.properties")?;
            mapping::text(properties, "issuer", "subject.properties", MAX_TARGET)?
        }
    };
    mapping::action_is_tools_call(part("action")?, "action")?;
    let target = mapping::target(part("resource")?, "resource")?;
    Ok(Asked { target, issuer })
}

/// The search's answer over the active version.
pub fn answer(active: &Active, asked: &Asked<'_>, at_ms: i64) -> Value {
    let mut context = Map::new();
    context.insert("policy_version".into(), json!(active.version));
    context.insert("policy_revision".into(), json!(active.revision));
    context.insert("at".into(), json!(crate::clock::format(at_ms)));
    let capability = match asked.target {
        Target::Capability(id) => id,
        Target::Tool(name) => match active.policy.tools.resolve(name) {
            Some(tool) => tool.capability.as_str(),
            None => {
                context.insert("reason".into(), json!({"code": "unknown_tool"}));
                return page(Vec::new(), context);
            }
        },
    };
    context.insert("capability".into(), json!(capability));
    let ruleset = &active.policy.ruleset;
    let reach = who_can(ruleset, capability);
    if !reach.declared || !reach.realized {
        // The decision every principal would get says why nobody may.
        if let Decision::Deny(reason) = evaluate(ruleset, &nobody(), capability, at_ms, Usage::NotConsulted) {
            context.insert(
                "reason".into(),
                json!({"code": reason.code.as_str(), "pointer": reason.path}),
            );
        }
        return page(Vec::new(), context);
    }
    let wanted = |issuer: &str| asked.issuer.is_none_or(|wanted| wanted == issuer);
    let conditions: Vec<Value> = reach
        .grants
        .iter()
        .filter(|(_, grant)| !grant.account.disabled && wanted(&grant.issuer))
        .map(|(_, grant)| condition(grant))
        .collect();
    context.insert("conditions".into(), Value::Array(conditions));

    let results = active
        .policy
        .issuers
        .iter()
        .filter(|issuer| issuer.kind == IssuerKind::StaticKey && wanted(&issuer.id))
        .filter(|issuer| active.static_keys.can_authenticate(&issuer.id))
        .filter_map(|issuer| {
            let principal = credential::from_static_key(issuer).ok()?.principal;
            match evaluate(ruleset, &principal, capability, at_ms, Usage::NotConsulted) {
                Decision::Allow(allow) if allow.reason.code == ReasonCode::Granted => Some(json!({
                    "type": "identity",
                    "id": principal.subject,
                    "properties": {
                        "issuer": issuer.id,
                        "pointer": allow.reason.path,
                        "account": {"id": allow.account.id},
                    },
                })),
                _ => None,
            }
        })
        .collect();
    page(results, context)
}

/// A grant as a condition a principal meets to be let through by it.
fn condition(grant: &Grant) -> Value {
    let attributes: Map<String, Value> = grant
        .selector
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    let ceiling = grant.limits.as_ref().map_or(
        Value::Null,
        |limits| json!({"calls": limits.calls, "per": limits.per, "window_ms": limits.window_ms}),
    );
    json!({
        "pointer": grant.path,
        "issuer": grant.issuer,
        "attributes": attributes,
        "account": {"id": grant.account.id},
        "ceiling": ceiling,
    })
}

fn page(results: Vec<Value>, context: Map<String, Value>) -> Value {
    json!({
        "page": {"next_token": "", "count": results.len(), "total": results.len()},
        "context": context,
        "results": results,
    })
}

/// A principal no grant selects: asking for it gives the capability's own denial.
fn nobody() -> Principal {
    Principal::new("", "", Default::default())
}
