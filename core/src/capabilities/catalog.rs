//! The declared catalog (docs/reference.md#the-declared-catalog) and the tool index built from it:
//! exposed name → tool, and which tools a set of capabilities makes visible
//! (§4.10 step 3).

use std::collections::{HashMap, HashSet};

use super::{exposed_name, ToolMapping};

/// A JSON-shaped value passed through untouched (a tool's input schema).
#[derive(Debug, Clone, PartialEq)]
pub enum PlainValue {
    Null,
    Bool(bool),
    Integer(i128),
    Float(f64),
    String(String),
    Array(Vec<PlainValue>),
    Object(Vec<(String, PlainValue)>),
}

/// One entry of a declared catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogTool {
    pub upstream: String,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<PlainValue>,
}

/// The tools upstreams really offer, in file order, first occurrence of each
/// `(upstream, name)` only.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Catalog {
    pub tools: Vec<CatalogTool>,
}

impl Catalog {
    /// Builds a catalog, ignoring repeated `(upstream, name)` entries after the first.
    pub fn new(tools: impl IntoIterator<Item = CatalogTool>) -> Self {
        let mut seen = HashSet::new();
        let tools = tools
            .into_iter()
            .filter(|tool| seen.insert((tool.upstream.clone(), tool.name.clone())))
            .collect();
        Catalog { tools }
    }

    /// Without a declared catalog the artifact's own mappings act as one, in
    /// upstream order then tool order.
    pub fn from_mappings<'m>(mappings: impl IntoIterator<Item = &'m ToolMapping>) -> Self {
        Catalog::new(mappings.into_iter().map(|mapping| CatalogTool {
            upstream: mapping.upstream.clone(),
            name: mapping.name.clone(),
            description: None,
            input_schema: None,
        }))
    }

    pub fn contains(&self, upstream: &str, name: &str) -> bool {
        self.tools
            .iter()
            .any(|tool| tool.upstream == upstream && tool.name == name)
    }
}

/// A tool a client may see: the catalog entry plus its capability.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDescriptor {
    pub exposed_name: String,
    pub upstream: String,
    pub name: String,
    pub capability: String,
    pub description: Option<String>,
    pub input_schema: Option<PlainValue>,
}

/// Every mapped catalog tool, in catalog order, with a reverse index from
/// exposed name. Unmapped catalog tools are not in it: they do not exist for
/// clients.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolIndex {
    tools: Vec<ToolDescriptor>,
    by_exposed_name: HashMap<String, usize>,
}

impl ToolIndex {
    pub fn new<'m>(catalog: &Catalog, mappings: impl IntoIterator<Item = &'m ToolMapping>) -> Self {
        let mut capability_of: HashMap<(&str, &str), &str> = HashMap::new();
        for mapping in mappings {
            capability_of
                .entry((mapping.upstream.as_str(), mapping.name.as_str()))
                .or_insert(mapping.capability.as_str());
        }
        let mut index = ToolIndex::default();
        for tool in &catalog.tools {
            let Some(capability) = capability_of.get(&(tool.upstream.as_str(), tool.name.as_str())) else {
                continue;
            };
            let exposed = exposed_name(&tool.upstream, &tool.name);
            index.by_exposed_name.insert(exposed.clone(), index.tools.len());
            index.tools.push(ToolDescriptor {
                exposed_name: exposed,
                upstream: tool.upstream.clone(),
                name: tool.name.clone(),
                capability: (*capability).to_owned(),
                description: tool.description.clone(),
                input_schema: tool.input_schema.clone(),
            });
        }
        index
    }

    /// The tool behind an exposed name; `None` means `unknown_tool`.
    pub fn resolve(&self, exposed: &str) -> Option<&ToolDescriptor> {
        self.by_exposed_name.get(exposed).map(|&at| &self.tools[at])
    }

    /// The exposed name a caller most likely meant by an unknown one (`crm__refnd` for
    /// `crm__refund`): among the tools of the upstream it names (the part before `__`), else
    /// among all. At most 1,024 names are compared, so an unknown name costs microseconds however
    /// large the catalog.
    pub fn closest(&self, exposed: &str) -> Option<&str> {
        const COMPARED: usize = 1024;
        let upstream = exposed.split_once("__").map(|(upstream, _)| upstream);
        let of_upstream = self
            .tools
            .iter()
            .filter(|tool| upstream.is_some_and(|upstream| tool.upstream == upstream))
            .take(COMPARED)
            .map(|tool| tool.exposed_name.as_str());
        crate::policy::suggest::closest(exposed, of_upstream).or_else(|| {
            let all = self
                .tools
                .iter()
                .take(COMPARED)
                .map(|tool| tool.exposed_name.as_str());
            crate::policy::suggest::closest(exposed, all)
        })
    }

    /// " (did you mean `x`?)" for [`ToolIndex::closest`], or nothing.
    pub fn did_you_mean(&self, exposed: &str) -> String {
        crate::policy::suggest::hint(self.closest(exposed))
    }

    /// The tools realising any of the given capabilities, in catalog order.
    pub fn realizing<'a>(
        &'a self,
        capability: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = &'a ToolDescriptor> + 'a {
        self.tools.iter().filter(move |tool| capability(&tool.capability))
    }

    pub fn all(&self) -> &[ToolDescriptor] {
        &self.tools
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(upstream: &str, name: &str) -> CatalogTool {
        CatalogTool {
            upstream: upstream.into(),
            name: name.into(),
            description: None,
            input_schema: None,
        }
    }

    fn mapping(upstream: &str, name: &str, capability: &str) -> ToolMapping {
        ToolMapping {
            upstream: upstream.into(),
            name: name.into(),
            capability: capability.into(),
            path: String::new(),
        }
    }

    #[test]
    fn repeated_catalog_entries_count_once_and_unmapped_tools_are_absent() {
        let catalog = Catalog::new([tool("a", "x"), tool("a", "y"), tool("a", "x")]);
        assert_eq!(catalog.tools.len(), 2);
        let mappings = [mapping("a", "x", "cap.one")];
        let index = ToolIndex::new(&catalog, &mappings);
        assert_eq!(index.all().len(), 1);
        assert_eq!(
            index.resolve("a__x").map(|t| t.capability.as_str()),
            Some("cap.one")
        );
        assert!(index.resolve("a__y").is_none());
    }
}
