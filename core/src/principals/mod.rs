//! Principals: *who calls?* An authenticated identity turned into the form
//! the policy discriminates on — an issuer, a subject and single-valued
//! attributes (docs/reference.md#issuers-and-attribute-mappings).
//!
//! Architecture invariant: a `Principal` never carries credential material,
//! not even a hash; authentication happened at the edge.

pub mod credential;
mod issuer;
mod normalize;

pub use issuer::{Issuer, IssuerKind};
pub use normalize::{normalize, reduce_multi_valued, resolve_asserted, AuthProblem, Resolution};

use std::collections::BTreeMap;

/// Who invokes. `id` is `<issuer>:<subject>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub id: String,
    pub issuer: String,
    pub subject: String,
    pub attributes: BTreeMap<String, String>,
}

impl Principal {
    /// A principal exactly as given, without normalisation (the effective
    /// diff's representatives are built this way).
    pub fn new(issuer: &str, subject: &str, attributes: BTreeMap<String, String>) -> Self {
        Principal {
            id: format!("{issuer}:{subject}"),
            issuer: issuer.to_owned(),
            subject: subject.to_owned(),
            attributes,
        }
    }
}
