//! Accounts: *as which account* does a call run? An account is an opaque
//! handle to an execution identity. The core never holds secret material,
//! only a reference (`vault://…`, `env://…`) that a gateway resolves after an
//! allow (docs/reference.md#accounts-and-secret-references).
//!
//! Architecture invariant: nothing here shares a type with `principals`. Who
//! invokes and what account a call runs as can never be confused.

/// Where an account's secret lives, e.g. `vault://secret/mcp/helpdesk-ro#token`.
/// Only the generic shape is checked; the scheme means something only to the
/// gateway that resolves it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef(String);

impl SecretRef {
    pub fn new(reference: impl Into<String>) -> Self {
        SecretRef(reference.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A declared account, as compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: String,
    pub disabled: bool,
    pub secret_ref: SecretRef,
    /// The upstreams the account's secret is for (`upstreams:`, ours, docs/decisions/0030);
    /// `None` when the artifact does not say, as in mcpizer's format.
    pub upstreams: Option<Vec<String>>,
    /// Pointer into the artifact, `/accounts/a`.
    pub path: String,
}

/// What a decision says about an account: its id and whether it is disabled.
/// Deliberately without the secret reference: the decision engine never sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccountRef {
    pub id: String,
    pub disabled: bool,
}
