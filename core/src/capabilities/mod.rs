//! Capabilities: *what can be done, and with which tools?* Policy speaks in
//! capabilities; upstream tools realise them. Renaming a tool never breaks a
//! policy (invariant 7).
//!
//! Architecture invariant: a tool with no declared capability is neither
//! visible nor callable — the catalog fails closed.

mod catalog;
mod exposed;

pub use catalog::{Catalog, CatalogTool, PlainValue, ToolDescriptor, ToolIndex};
pub use exposed::{exposed_name, split_exposed_name};

/// A declared capability, as compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub id: String,
    pub description: Option<String>,
    /// Some tool mapping points to it.
    pub realized: bool,
    /// `/capabilities/i`.
    pub path: String,
}

/// How to reach an upstream MCP server. Plays no role in decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio { command: String, args: Vec<String> },
    Http { url: String },
}

impl Transport {
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "mcp-stdio",
            Transport::Http { .. } => "mcp-http",
        }
    }
}

/// One tool of an upstream and the capability it realises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolMapping {
    pub upstream: String,
    pub name: String,
    pub capability: String,
    /// `/upstreams/u/tools/t`.
    pub path: String,
}

/// A declared upstream, as compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub id: String,
    pub transport: Transport,
    pub tools: Vec<ToolMapping>,
    /// `/upstreams/u`.
    pub path: String,
}
