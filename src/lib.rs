//! capgate decides, for AI agents and the MCP tools they call, who is calling,
//! which tools they may see, which execution account a call runs as, under
//! which rate ceiling — and why.
//!
//! The crate is a pure core of five contexts and one periphery:
//!
//! * [`principals`] — who calls? Normalising an authenticated identity.
//! * [`capabilities`] — what can be done, with which tools? Exposed names, the catalog.
//! * [`accounts`] — as which account? Opaque references, never secrets.
//! * [`access`] — is it allowed, and why? The pure evaluation.
//! * [`policy`] — what was declared? The artifact, its compiler and diagnostics.
//! * `periphery` (feature `cli`) — everything that touches the world: the command line.
//!
//! The core does no I/O, reads no clock and no environment; time and usage
//! come in as data. `tests/architecture.rs` and clippy's `disallowed-methods`
//! keep it that way.

pub mod access;
pub mod accounts;
pub mod capabilities;
pub mod policy;
pub mod principals;

#[cfg(feature = "cli")]
pub mod periphery;
