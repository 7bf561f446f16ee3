//! Policy: *what was declared?* The v1 artifact (YAML), its compiler and its
//! diagnostics (docs/reference.md#the-artifact). Compiling yields the evaluable policy (if
//! no error) and every diagnostic, with positions, in the spec's order.
//!
//! Architecture invariant: compiling touches nothing outside its input — no
//! network, no credentials, no files. A policy is fully checkable on a laptop.

mod catalog;
mod checks;
mod compile;
mod diagnostic;
pub mod document;
mod model;
pub mod pointer;
pub mod schema;
pub mod suggest;
pub mod syntax;

pub use catalog::{load_catalog, CatalogError};
pub use compile::{compile, Compilation};
pub use diagnostic::{bounded, has_errors, Bounds, Code, Diagnostic, Related, Severity};
pub use document::{Document, Position};
pub use model::CompiledPolicy;

use sha2::{Digest, Sha256};

/// The version label of an artifact: `sha256:` and the hex SHA-256 of its bytes.
pub fn version_label(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut label = String::with_capacity(7 + 64);
    label.push_str("sha256:");
    for byte in digest {
        label.push_str(&format!("{byte:02x}"));
    }
    label
}
