//! Loading a declared catalog file (docs/reference.md#the-declared-catalog). A bad catalog is an
//! error, never "no tools": a catalog that silently degraded to empty would
//! make every mapping look unmapped, or every tool invisible.

use super::document::{Document, NodeRef, Number, Position, Value};
use crate::capabilities::{Catalog, CatalogTool, PlainValue};

/// Why a catalog could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogError {
    /// Not YAML, several documents, over the size limit, …
    Syntax { message: String, position: Position },
    /// The document has no `tools` sequence.
    ToolsNotAList,
    /// An entry lacks a string `upstream` or `name`.
    BadEntry {
        index: usize,
        position: Option<Position>,
    },
}

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogError::Syntax { message, position } => {
                write!(
                    f,
                    "invalid YAML at {}:{}: {message}",
                    position.line, position.column
                )
            }
            CatalogError::ToolsNotAList => write!(f, "the catalog has no `tools` list"),
            CatalogError::BadEntry { index, position } => {
                write!(f, "catalog entry {index} needs string `upstream` and `name`")?;
                if let Some(position) = position {
                    write!(f, " (line {}, column {})", position.line, position.column)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CatalogError {}

/// Reads a catalog. `version` is written by generators and not checked;
/// repeated `(upstream, name)` entries are ignored after the first.
pub fn load_catalog(bytes: &[u8]) -> Result<Catalog, CatalogError> {
    let document = Document::parse_bytes(bytes).map_err(|mut errors| {
        let first = errors.remove(0);
        CatalogError::Syntax {
            message: first.message,
            position: first.position,
        }
    })?;
    let tools = document
        .root()
        .and_then(|root| root.get("tools"))
        .filter(|tools| tools.is_sequence())
        .ok_or(CatalogError::ToolsNotAList)?;
    let mut entries = Vec::new();
    for (index, entry) in tools.items().enumerate() {
        let field = |key: &str| entry.get(key).and_then(NodeRef::as_str).map(str::to_owned);
        let (Some(upstream), Some(name)) = (field("upstream"), field("name")) else {
            return Err(CatalogError::BadEntry {
                index,
                position: entry.position(),
            });
        };
        entries.push(CatalogTool {
            upstream,
            name,
            description: field("description"),
            input_schema: entry.get("inputSchema").map(plain),
        });
    }
    Ok(Catalog::new(entries))
}

/// A node as a JSON-shaped value, aliases expanded (their number is bounded
/// by the parser, and so is the depth).
fn plain(node: NodeRef<'_>) -> PlainValue {
    match node.value() {
        Value::Null | Value::Alias(_) => PlainValue::Null,
        Value::Bool(flag) => PlainValue::Bool(*flag),
        Value::Number(Number::Int(value)) => PlainValue::Integer(*value),
        Value::Number(Number::Float(value)) => PlainValue::Float(*value),
        Value::String(text) => PlainValue::String(text.clone()),
        Value::Sequence(_) => PlainValue::Array(node.items().map(plain).collect()),
        Value::Mapping(_) => PlainValue::Object(
            node.entries()
                .map(|(entry, value)| (entry.key.clone(), plain(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_catalog_loads() {
        let catalog = load_catalog(include_bytes!("../../../examples/catalog.yaml")).unwrap();
        assert_eq!(catalog.tools.len(), 11);
        assert!(catalog.tools[0].input_schema.is_some());
    }

    #[test]
    fn bad_catalogs_fail_instead_of_degrading() {
        assert!(matches!(
            load_catalog(b"tools: [\n"),
            Err(CatalogError::Syntax { .. })
        ));
        assert_eq!(load_catalog(b"tools: {}\n"), Err(CatalogError::ToolsNotAList));
        assert_eq!(load_catalog(b"version: 1\n"), Err(CatalogError::ToolsNotAList));
        assert!(matches!(
            load_catalog(b"tools:\n  - { upstream: a }\n"),
            Err(CatalogError::BadEntry { index: 0, .. })
        ));
        assert!(matches!(
            load_catalog(b"tools:\n  - { upstream: a, name: 3 }\n"),
            Err(CatalogError::BadEntry { .. })
        ));
    }

    #[test]
    fn repeated_entries_count_once() {
        let catalog = load_catalog(
            b"tools:\n  - { upstream: a, name: x }\n  - { upstream: a, name: x, description: d }\n",
        )
        .unwrap();
        assert_eq!(catalog.tools.len(), 1);
        assert_eq!(catalog.tools[0].description, None);
    }
}
