//! `argument_not_in_schema` (error, ours: docs/decisions/0034): a condition reads an
//! argument that the `inputSchema` of a tool realising one of the grant's capabilities
//! does not declare, so every call of that tool would be denied `arguments_missing`.
//! Checked only against a declared catalog's schemas, and only where a schema lists
//! `properties` (an object schema without them admits any member).

use super::Findings;
use crate::access::{Kind, Test};
use crate::capabilities::{Catalog, PlainValue};
use crate::policy::model::{Declared, RawGrant};
use crate::policy::Code;

/// What a tool's input schema says of an argument path.
pub(super) enum Declares {
    /// The schema does not constrain it (no `properties` on the way, or no `type`).
    Unknown,
    /// The kinds of value the schema allows there, and whether a number must be whole.
    Kinds { kinds: Vec<Kind>, integer: bool },
    /// The member at this many segments in is not among the declared `properties`.
    Absent { at: usize },
}

fn member<'v>(schema: &'v PlainValue, key: &str) -> Option<&'v PlainValue> {
    match schema {
        PlainValue::Object(members) => members
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value),
        _ => None,
    }
}

/// Walks `segments` through `properties` (and an array's `items`).
pub(super) fn declares(schema: &PlainValue, segments: &[String]) -> Declares {
    let mut at = schema;
    for (depth, segment) in segments.iter().enumerate() {
        if let Some(properties) = member(at, "properties") {
            match member(properties, segment) {
                Some(next) => at = next,
                None => return Declares::Absent { at: depth },
            }
        } else if let (Some(items), true) = (member(at, "items"), segment.parse::<usize>().is_ok()) {
            at = items;
        } else {
            return Declares::Unknown;
        }
    }
    let types: Vec<&str> = match member(at, "type") {
        Some(PlainValue::String(one)) => vec![one.as_str()],
        Some(PlainValue::Array(many)) => many
            .iter()
            .filter_map(|t| match t {
                PlainValue::String(t) => Some(t.as_str()),
                _ => None,
            })
            .collect(),
        _ => return Declares::Unknown,
    };
    let mut kinds = Vec::new();
    for t in &types {
        match *t {
            "string" => kinds.push(Kind::String),
            "number" | "integer" => kinds.push(Kind::Number),
            "boolean" => kinds.push(Kind::Bool),
            _ => {}
        }
    }
    let integer = types.contains(&"integer") && !types.contains(&"number");
    Declares::Kinds { kinds, integer }
}

/// The tools realising any capability the grant names that declare an input schema:
/// `(upstream/name, schema)`, in mapping order.
pub(super) fn schemas<'c>(
    declared: &Declared,
    catalog: Option<&'c Catalog>,
    grant: &RawGrant,
) -> Vec<(String, &'c PlainValue)> {
    let Some(catalog) = catalog else {
        return Vec::new();
    };
    declared
        .mappings()
        .filter(|mapping| grant.capabilities.contains(&mapping.capability))
        .filter_map(|mapping| {
            let tool = catalog
                .tools
                .iter()
                .find(|tool| tool.upstream == mapping.upstream && tool.name == mapping.name)?;
            let schema = tool.input_schema.as_ref()?;
            Some((format!("{}/{}", mapping.upstream, mapping.name), schema))
        })
        .collect()
}

/// Reports each condition whose argument some tool's schema lacks; returns whether any was.
pub(super) fn check(findings: &mut Findings<'_>, tools: &[(String, &PlainValue)], grant: &RawGrant) -> bool {
    let mut found = false;
    for condition in &grant.conditions {
        let Test::Argument { path, .. } = &condition.test else {
            continue;
        };
        let lacking = tools
            .iter()
            .find_map(|(tool, schema)| match declares(schema, &path.segments) {
                Declares::Absent { at } => Some((tool, at)),
                _ => None,
            });
        if let Some((tool, at)) = lacking {
            found = true;
            findings.error(
                Code::ArgumentNotInSchema,
                format!("{}/argument", condition.path),
                format!(
                    "the tool `{tool}` declares no argument `{}` (its inputSchema has no `{}` there), so its calls could never meet this condition",
                    path.written, path.segments[at]
                ),
                &[],
            );
        }
    }
    found
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::capabilities::{Catalog, CatalogTool, PlainValue};
    use crate::policy::checks::testing::artifact;
    use crate::policy::compile;

    /// The crm tool's schema: `id` a string, `limit` an integer, `amount` a number,
    /// `filter.region` a string.
    pub(crate) fn crm_catalog() -> Catalog {
        let object = |members: Vec<(&str, PlainValue)>| {
            PlainValue::Object(members.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        };
        let typed = |t: &str| object(vec![("type", PlainValue::String(t.to_owned()))]);
        let schema = object(vec![
            ("type", PlainValue::String("object".to_owned())),
            (
                "properties",
                object(vec![
                    ("id", typed("string")),
                    ("limit", typed("integer")),
                    ("amount", typed("number")),
                    (
                        "filter",
                        object(vec![("properties", object(vec![("region", typed("string"))]))]),
                    ),
                ]),
            ),
        ]);
        Catalog::new([CatalogTool {
            upstream: "crm".to_owned(),
            name: "get_contact".to_owned(),
            description: None,
            input_schema: Some(schema),
        }])
    }

    pub(crate) fn findings(conditions: &str) -> Vec<(String, String)> {
        let text = artifact(&format!(
            "grants:\n  - to: {{ issuer: ci }}\n    capabilities: [crm.contact.read]\n    using: crm-ro\n    when:\n{conditions}"
        ))
        .replacen("version: 1", "version: 2", 1);
        compile(text.as_bytes(), Some(&crm_catalog()))
            .diagnostics
            .into_iter()
            .map(|d| (d.code.as_str().to_owned(), d.path))
            .collect()
    }

    #[test]
    fn a_path_the_schema_lacks_is_named_at_its_argument() {
        assert_eq!(
            findings("      - { argument: id, starts_with: c- }\n      - { argument: filter.country, equals: ES }\n      - { argument: filter.region, equals: eu }\n"),
            [("argument_not_in_schema".to_owned(), "/grants/0/when/1/argument".to_owned())]
        );
    }

    #[test]
    fn without_a_catalog_nothing_is_checked_against_schemas() {
        let text = artifact("grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n    when:\n      - { argument: nowhere, equals: 1 }\n")
            .replacen("version: 1", "version: 2", 1);
        assert!(compile(text.as_bytes(), None).diagnostics.is_empty());
    }
}
