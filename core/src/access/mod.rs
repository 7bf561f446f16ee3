//! Access: *is it allowed, and why?* The pure evaluation (docs/reference.md#decisions):
//! a function of (ruleset, principal, capability, at, usage) to a `Decision`
//! that always carries a reason — a closed code, a pointer into the artifact
//! and a subject.
//!
//! Architecture invariant: no clock, no I/O, no randomness. `at` and `usage`
//! are data. Same inputs, same decision.
//! Architecture invariant: a denial has no account and no limits to read.

mod conditions;
mod decision;
mod dictionary;
mod diff;
mod evaluate;
mod index;
mod limits;
mod listing;
mod ruleset;
mod who_can;

pub use conditions::{
    clock, day_number, first_failing, parse_clock, set_argument, witness, ArgumentPath, Arguments, Condition,
    Kind, Literal, Op, Outcome, Test, Window, DAY_NAMES, EVERY_DAY,
};
pub use decision::{Allow, Decision, Reason, ReasonCode};
pub use diff::{effective_diff, representatives, Change, ChangeKind, Side, Summary};
pub use evaluate::{
    evaluate, evaluate_call, evaluate_linear, evaluate_linear_call, evaluate_prepared,
    evaluate_prepared_call, Prepared,
};
pub use limits::{is_looser, more_restrictive, Limits, Standing};
pub use listing::{visible, VisibleCapability};
pub use ruleset::{CapabilityRule, Grant, Ruleset, CAPABILITIES_ANCHOR, GRANTS_ANCHOR};
pub use who_can::{who_can, Reach};

/// Milliseconds since the Unix epoch, captured by the caller.
pub type Instant = i64;

/// The counter state for the ceiling check (docs/reference.md#inputs-and-usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Usage {
    /// Ceilings are not evaluated (listings, the effective diff, `--usage none`).
    NotConsulted,
    /// The counter store failed or timed out: a ceiling denies.
    Unknown,
    /// A successful read: `calls` counted in the window opened at `window_start`.
    Counted { calls: u64, window_start: Instant },
}
