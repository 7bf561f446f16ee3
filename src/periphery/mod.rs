//! The periphery: everything that touches the world — the command line
//! today. It may read files, standard input, the clock and the environment;
//! the core never does, and receives what it needs from here as data.

// The periphery is where clocks, files, streams and the environment are used.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod cli;
pub mod identity;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod store;
#[cfg(feature = "server")]
pub mod telemetry;
