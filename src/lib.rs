//! capgate, the product: the command line, the decision service, its store, identity and
//! telemetry, around the pure core in [`capgate_core`].
//!
//! The rooms, each named for its job (docs/ARCHITECTURE.md has the map and its invariants):
//!
//! * [`cli`] — the `capgate` command line, one file per subcommand.
//! * [`service`] — the decision service (`capgate serve`): one decision pipeline, its gRPC doors.
//! * [`wire`] — the generated gRPC messages and their conversions to and from the core's types.
//! * [`clock`] — the time, read in one place, and instants as RFC 3339 text.
//! * [`store`] — the store port and its PostgreSQL and SQLite implementations.
//! * [`identity`] — turning a caller's own credential into an issuer, subject and attributes.
//! * [`telemetry`] — logs, traces and metrics.
//! * [`changes`] — how two decisions about one request differ (replay and shadow versions).
//!
//! Everything here may touch the world — files, the clock, the network; the core never does and
//! receives what it needs from here as data.

pub mod changes;
pub mod cli;
pub mod clock;
pub mod identity;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod wire;
