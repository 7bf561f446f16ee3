//! capgate's pure core: it compiles a declarative policy and decides, for AI agents and the MCP
//! tools they call, who is calling, which tools they may see, which execution account a call runs
//! as, under which rate ceiling — and why.
//!
//! Five contexts, each answering one question:
//!
//! * [`principals`] — who calls? Normalising an authenticated identity.
//! * [`capabilities`] — what can be done, with which tools? Exposed names, the catalog.
//! * [`accounts`] — as which account? Opaque references, never secrets.
//! * [`access`] — is it allowed, and why? The pure evaluation.
//! * [`policy`] — what was declared? The artifact, its compiler and diagnostics.
//!
//! The crate does no I/O, reads no clock, no environment and no randomness: time and usage come in
//! as data. Its `Cargo.toml` names no crate that does I/O, and its own `clippy.toml` bans the
//! standard library's clocks, files, environment, network, processes and entropy for this crate
//! alone (docs/decisions/0012).

pub mod access;
pub mod accounts;
pub mod capabilities;
pub mod policy;
pub mod principals;
