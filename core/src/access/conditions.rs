//! Conditions (docs/reference.md#conditions): what a grant may require of the call itself —
//! of the tool's arguments and of the instant — beyond who calls and which capability.
//!
//! A grant's conditions all hold, or the grant does not apply. The language is closed and
//! small on purpose (docs/decisions/0034): a condition is one argument and one operator
//! (`equals`, `in`, `at_most`, `at_least`, `below`, `above`, `starts_with`) or one weekly
//! time window in a named zone. Every test is total and bounded by the size of the
//! condition and of one argument: no loops over the input, no regular expressions, no
//! recursion beyond the path's segments.
//!
//! Architecture invariant: checking a condition reads only the arguments and the instant
//! it is given. The time zones are the IANA database compiled into the binary
//! (`jiff`'s bundled copy), never the host's files, so the same inputs give the same
//! answer on every machine running the same build.

use jiff::civil::Time;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::{Map, Value};

use super::Instant;

/// The arguments of a call, as the door received them: `None` when they were not
/// forwarded at all (every argument a condition needs is then missing).
pub type Arguments<'v> = Option<&'v Map<String, Value>>;

/// One condition of a grant, with the pointer of its entry in the artifact.
#[derive(Debug, Clone)]
pub struct Condition {
    /// `/grants/g/when/i`: what a denial names, the entry a person would change.
    pub path: String,
    pub test: Test,
}

/// Two conditions are the same condition when they are written the same: what `diff`
/// compares, and what a ruleset's equality needs (a zone has no equality of its own).
impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.test.written() == other.test.written()
    }
}

impl Eq for Condition {}

/// What a condition tests.
#[derive(Debug, Clone)]
pub enum Test {
    /// One argument, found by `path`, against one operator.
    Argument { path: ArgumentPath, op: Op },
    /// The instant, read in `zone`, falls on one of `days` between `from` and `until`.
    Time(Window),
}

/// A path into the arguments: `amount`, `order.total`, `items.0.sku`, or an RFC 6901
/// pointer (`/order/total`) for member names that hold a dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentPath {
    /// As written in the artifact: what diagnostics, denials and listings show.
    pub written: String,
    /// The member names (or array positions) it walks, in order.
    pub segments: Vec<String>,
}

impl ArgumentPath {
    /// Reads a path as written; `None` for an empty one or one with an empty segment.
    pub fn parse(written: &str) -> Option<ArgumentPath> {
        let segments: Vec<String> = if written.starts_with('/') {
            crate::policy::pointer::segments(written)
        } else {
            written.split('.').map(str::to_owned).collect()
        };
        if segments.is_empty() || segments.iter().any(String::is_empty) {
            return None;
        }
        Some(ArgumentPath {
            written: written.to_owned(),
            segments,
        })
    }

    /// The argument the path leads to, if the arguments have it. A segment that is a
    /// number indexes an array; on an object it is a member name like any other.
    pub fn find<'v>(&self, arguments: &'v Map<String, Value>) -> Option<&'v Value> {
        let (first, rest) = self.segments.split_first()?;
        let mut at = member(arguments, first)?;
        for segment in rest {
            at = match at {
                Value::Object(members) => member(members, segment)?,
                Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(at)
    }
}

/// The member `name` of an object. A small object (a tool call's arguments mostly are) is
/// scanned rather than hashed: comparing a few short names costs less than hashing one.
fn member<'v>(object: &'v Map<String, Value>, name: &str) -> Option<&'v Value> {
    if object.len() <= 8 {
        object
            .iter()
            .find(|(key, _)| key.as_str() == name)
            .map(|(_, value)| value)
    } else {
        object.get(name)
    }
}

/// A literal a condition compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    String(String),
    /// Numbers compare as IEEE doubles, as JSON's data model has them.
    Number(f64),
    Bool(bool),
}

impl Literal {
    fn is(&self, value: &Value) -> bool {
        match (self, value) {
            (Literal::String(expected), Value::String(found)) => expected == found,
            (Literal::Number(expected), Value::Number(found)) => found.as_f64() == Some(*expected),
            (Literal::Bool(expected), Value::Bool(found)) => expected == found,
            _ => false,
        }
    }

    /// The kind of value it compares with.
    pub fn kind(&self) -> Kind {
        match self {
            Literal::String(_) => Kind::String,
            Literal::Number(_) => Kind::Number,
            Literal::Bool(_) => Kind::Bool,
        }
    }

    /// As JSON: how it is written back in listings, diffs and witnesses.
    pub fn to_json(&self) -> Value {
        match self {
            Literal::String(text) => Value::String(text.clone()),
            Literal::Number(number) => number_value(*number),
            Literal::Bool(flag) => Value::Bool(*flag),
        }
    }
}

/// A JSON number for `number`, written as an integer where it is one.
fn number_value(number: f64) -> Value {
    // Exact: an integral double within ±2^53 converts to i64 without loss.
    #[allow(clippy::cast_possible_truncation)]
    if number.fract() == 0.0 && number.abs() <= 9_007_199_254_740_992.0 {
        return Value::from(number as i64);
    }
    serde_json::Number::from_f64(number).map_or(Value::Null, Value::Number)
}

/// The kinds of value the operators compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    String,
    Number,
    Bool,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
        }
    }
}

/// The closed operator set.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Equals(Literal),
    /// One of the listed values (at least one).
    In(Vec<Literal>),
    AtMost(f64),
    AtLeast(f64),
    Below(f64),
    Above(f64),
    StartsWith(String),
}

impl Op {
    /// The operator's key in the artifact.
    pub fn keyword(&self) -> &'static str {
        match self {
            Op::Equals(_) => "equals",
            Op::In(_) => "in",
            Op::AtMost(_) => "at_most",
            Op::AtLeast(_) => "at_least",
            Op::Below(_) => "below",
            Op::Above(_) => "above",
            Op::StartsWith(_) => "starts_with",
        }
    }

    /// The operator's operand as JSON.
    pub fn operand(&self) -> Value {
        match self {
            Op::Equals(literal) => literal.to_json(),
            Op::In(literals) => Value::Array(literals.iter().map(Literal::to_json).collect()),
            Op::AtMost(n) | Op::AtLeast(n) | Op::Below(n) | Op::Above(n) => number_value(*n),
            Op::StartsWith(prefix) => Value::String(prefix.clone()),
        }
    }

    /// The kinds of value the operator can hold for (`In` may mix kinds).
    pub fn kinds(&self) -> Vec<Kind> {
        match self {
            Op::Equals(literal) => vec![literal.kind()],
            Op::In(literals) => {
                let mut kinds: Vec<Kind> = Vec::new();
                for kind in literals.iter().map(Literal::kind) {
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
                kinds
            }
            Op::AtMost(_) | Op::AtLeast(_) | Op::Below(_) | Op::Above(_) => vec![Kind::Number],
            Op::StartsWith(_) => vec![Kind::String],
        }
    }

    /// Whether `value` passes. A value of another kind than the operator's does not.
    pub fn holds(&self, value: &Value) -> bool {
        let number = || value.as_f64();
        match self {
            Op::Equals(literal) => literal.is(value),
            Op::In(literals) => literals.iter().any(|literal| literal.is(value)),
            Op::AtMost(bound) => number().is_some_and(|n| n <= *bound),
            Op::AtLeast(bound) => number().is_some_and(|n| n >= *bound),
            Op::Below(bound) => number().is_some_and(|n| n < *bound),
            Op::Above(bound) => number().is_some_and(|n| n > *bound),
            Op::StartsWith(prefix) => value
                .as_str()
                .is_some_and(|text| text.starts_with(prefix.as_str())),
        }
    }
}

/// A weekly window: `days` (bit 0 is Monday) between `from` and `until` (minutes after
/// local midnight, `from < until`), read in `zone`.
#[derive(Debug, Clone)]
pub struct Window {
    /// The IANA name as written.
    pub zone_name: String,
    pub zone: TimeZone,
    pub days: u8,
    pub from: u16,
    pub until: u16,
}

/// Every day of the week.
pub const EVERY_DAY: u8 = 0b111_1111;

/// The days' names, Monday first, as the artifact writes them.
pub const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

impl Window {
    /// Whether the instant (ms since the epoch) falls in the window.
    pub fn holds(&self, at: Instant) -> bool {
        let Ok(timestamp) = Timestamp::from_millisecond(at) else {
            // Outside jiff's range (beyond ±9999 years): in no window.
            return false;
        };
        let local = self.zone.to_datetime(timestamp);
        let day = local.weekday().to_monday_zero_offset();
        let minute =
            u16::try_from(i32::from(local.hour()) * 60 + i32::from(local.minute())).unwrap_or(u16::MAX);
        self.days >> day & 1 == 1 && self.from <= minute && minute < self.until
    }

    /// How it is written back: `mon–fri 09:00–18:00 Europe/Madrid`.
    pub fn written(&self) -> String {
        let days = if self.days == EVERY_DAY {
            "every day".to_owned()
        } else {
            DAY_NAMES
                .iter()
                .enumerate()
                .filter(|(day, _)| self.days >> day & 1 == 1)
                .map(|(_, name)| *name)
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "{days} {}–{} {}",
            clock(self.from),
            clock(self.until),
            self.zone_name
        )
    }
}

/// `HH:MM` for minutes after midnight (`24:00` for the end of the day).
pub fn clock(minutes: u16) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

/// Reads `HH:MM` (00:00 to 24:00) as minutes after midnight.
pub fn parse_clock(text: &str) -> Option<u16> {
    let (hours, minutes) = text.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: u16 = hours.parse().ok()?;
    let minutes: u16 = minutes.parse().ok()?;
    let total = hours * 60 + minutes;
    (minutes < 60 && total <= 24 * 60).then_some(total)
}

impl Test {
    /// One line for a person, also the identity `diff` compares:
    /// `amount at_most 100`, `time mon,fri 09:00–18:00 Europe/Madrid`.
    pub fn written(&self) -> String {
        match self {
            Test::Argument { path, op } => format!("{} {} {}", path.written, op.keyword(), op.operand()),
            Test::Time(window) => format!("time {}", window.written()),
        }
    }

    /// What it is about: the argument's path as written, or `time`.
    pub fn subject(&self) -> &str {
        match self {
            Test::Argument { path, .. } => &path.written,
            Test::Time(_) => "time",
        }
    }
}

/// How one condition, or a grant's conditions, came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Holds,
    /// The argument is there, or the instant is known, and the test fails.
    Fails,
    /// The argument the test needs is absent (or no arguments were forwarded).
    Missing,
}

impl Condition {
    pub fn check(&self, arguments: Arguments<'_>, at: Instant) -> Outcome {
        match &self.test {
            Test::Time(window) => {
                if window.holds(at) {
                    Outcome::Holds
                } else {
                    Outcome::Fails
                }
            }
            Test::Argument { path, op } => match arguments.and_then(|arguments| path.find(arguments)) {
                None => Outcome::Missing,
                Some(value) if op.holds(value) => Outcome::Holds,
                Some(_) => Outcome::Fails,
            },
        }
    }
}

/// The first condition, in the order written, that does not hold, and how; `None` when
/// all hold (and for a grant without conditions).
pub fn first_failing<'c>(
    conditions: &'c [Condition],
    arguments: Arguments<'_>,
    at: Instant,
) -> Option<(&'c Condition, Outcome)> {
    conditions
        .iter()
        .find_map(|condition| match condition.check(arguments, at) {
            Outcome::Holds => None,
            outcome => Some((condition, outcome)),
        })
}

/// Arguments and an instant under which every condition holds, if some exist: what the
/// compiler requires of each grant (so that a listed tool is one some call may use:
/// docs/reference.md#listings) and what the property tests call.
///
/// Complete for the closed language: per argument, the literal candidates of `equals`
/// and `in`, else the least value in the numeric bounds (or a middle one between two
/// strict bounds), else the longest prefix; per window set, each window's opening on
/// each day of a reference fortnight. `integers` names the argument paths whose schema
/// says `integer`, where a witness between two bounds must be whole.
pub fn witness(conditions: &[Condition], integers: &[&str]) -> Option<(Map<String, Value>, Instant)> {
    let mut arguments = Map::new();
    let mut paths: Vec<&ArgumentPath> = Vec::new();
    for condition in conditions {
        if let Test::Argument { path, .. } = &condition.test {
            if !paths.iter().any(|seen| seen.segments == path.segments) {
                paths.push(path);
            }
        }
    }
    for (n, path) in paths.iter().enumerate() {
        // A path that is a strict prefix of another would need a scalar with members.
        let nested = paths.iter().enumerate().any(|(m, other)| {
            m != n && other.segments.len() > path.segments.len() && other.segments.starts_with(&path.segments)
        });
        if nested {
            return None;
        }
        let ops: Vec<&Op> = conditions
            .iter()
            .filter_map(|condition| match &condition.test {
                Test::Argument { path: of, op } if of.segments == path.segments => Some(op),
                _ => None,
            })
            .collect();
        let value = witness_value(&ops, integers.contains(&path.written.as_str()))?;
        set_argument(&mut arguments, &path.segments, value);
    }
    let windows: Vec<&Window> = conditions
        .iter()
        .filter_map(|condition| match &condition.test {
            Test::Time(window) => Some(window),
            Test::Argument { .. } => None,
        })
        .collect();
    let at = witness_instant(&windows)?;
    // The witness is checked, not trusted: a value the search got wrong is no witness.
    let all_hold = first_failing(conditions, Some(&arguments), at).is_none();
    all_hold.then_some((arguments, at))
}

/// Sets `value` at the path `segments` of `arguments`, making objects of what lies in the way:
/// how a witness, and the command line's `--arg order.total=10`, build arguments.
pub fn set_argument(arguments: &mut Map<String, Value>, segments: &[String], value: Value) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut at = arguments;
    for segment in parents {
        let entry = at
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(members) = entry else {
            return;
        };
        at = members;
    }
    at.insert(last.clone(), value);
}

/// A value every operator of `ops` accepts.
fn witness_value(ops: &[&Op], integer: bool) -> Option<Value> {
    let holds = |value: &Value| ops.iter().all(|op| op.holds(value));
    // Candidates the literals name, first.
    let mut named = ops.iter().filter_map(|op| match op {
        Op::Equals(literal) => Some(vec![literal.clone()]),
        Op::In(literals) => Some(literals.clone()),
        _ => None,
    });
    if let Some(first) = named.next() {
        return first.iter().map(Literal::to_json).find(|value| holds(value));
    }
    if let Some(prefix) = ops
        .iter()
        .filter_map(|op| match op {
            Op::StartsWith(prefix) => Some(prefix),
            _ => None,
        })
        .max_by_key(|prefix| prefix.len())
    {
        let value = Value::String(prefix.clone());
        return holds(&value).then_some(value);
    }
    // Numeric bounds only: the tightest on each side.
    let (mut low, mut high): (Bound, Bound) = (None, None);
    for op in ops {
        match **op {
            Op::AtLeast(n) => low = tighter(low, (n, true), |a, b| a > b),
            Op::Above(n) => low = tighter(low, (n, false), |a, b| a > b),
            Op::AtMost(n) => high = tighter(high, (n, true), |a, b| a < b),
            Op::Below(n) => high = tighter(high, (n, false), |a, b| a < b),
            _ => {}
        }
    }
    let candidates: Vec<f64> = match (low, high) {
        (None, None) => vec![0.0],
        (Some((n, _)), None) => vec![n, (n + 1.0).floor(), n + 1.0],
        (None, Some((n, _))) => vec![n, (n - 1.0).ceil(), n - 1.0],
        (Some((a, _)), Some((b, _))) => vec![a, b, a.ceil(), b.floor(), (a + b) / 2.0, (a + 1.0).floor()],
    };
    candidates
        .into_iter()
        .filter(|n| !integer || n.fract() == 0.0)
        .map(number_value)
        .find(|value| holds(value))
}

/// A bound on a number: its value and whether it is inclusive.
type Bound = Option<(f64, bool)>;

/// The tighter of a bound and another, where `beats(a, b)` says `a` is tighter; on equal
/// values, the exclusive one.
fn tighter(current: Bound, candidate: (f64, bool), beats: impl Fn(f64, f64) -> bool) -> Bound {
    Some(match current {
        None => candidate,
        Some(current) if beats(candidate.0, current.0) => candidate,
        Some(current) if candidate.0 == current.0 && !candidate.1 => candidate,
        Some(current) => current,
    })
}

/// The first instant of a reference fortnight (from Monday 2026-01-05, local to each
/// window's zone) at which every window is open; the epoch when there are none.
fn witness_instant(windows: &[&Window]) -> Option<Instant> {
    if windows.is_empty() {
        return Some(0);
    }
    let start = jiff::civil::date(2026, 1, 5);
    let mut candidates = Vec::new();
    for window in windows {
        for day in 0..14 {
            let date = start.checked_add(jiff::Span::new().days(day)).ok()?;
            let opening = i64::from(window.from);
            let time = Time::new(
                i8::try_from(opening / 60).ok()?,
                i8::try_from(opening % 60).ok()?,
                0,
                0,
            )
            .ok()?;
            let opening = window.zone.to_timestamp(date.to_datetime(time)).ok()?;
            candidates.push(opening.as_millisecond());
        }
    }
    candidates.sort_unstable();
    candidates
        .into_iter()
        .find(|&at| windows.iter().all(|window| window.holds(at)))
}

/// Monday-first day number of a weekday name, as the artifact writes it.
pub fn day_number(name: &str) -> Option<u8> {
    DAY_NAMES
        .iter()
        .position(|day| *day == name)
        .and_then(|at| u8::try_from(at).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argument(path: &str, op: Op) -> Condition {
        Condition {
            path: "/grants/0/when/0".to_owned(),
            test: Test::Argument {
                path: ArgumentPath::parse(path).unwrap(),
                op,
            },
        }
    }

    fn arguments(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    fn window(zone: &str, days: u8, from: &str, until: &str) -> Condition {
        Condition {
            path: "/grants/0/when/0".to_owned(),
            test: Test::Time(Window {
                zone_name: zone.to_owned(),
                zone: TimeZone::get(zone).unwrap(),
                days,
                from: parse_clock(from).unwrap(),
                until: parse_clock(until).unwrap(),
            }),
        }
    }

    #[test]
    fn each_operator_holds_fails_or_misses() {
        let args = arguments(
            r#"{"amount": 100, "currency": "EUR", "order": {"lines": [{"sku": "x-1"}]}, "flag": true}"#,
        );
        let cases = [
            (argument("amount", Op::AtMost(100.0)), Outcome::Holds),
            (argument("amount", Op::Below(100.0)), Outcome::Fails),
            (argument("amount", Op::AtLeast(100.5)), Outcome::Fails),
            (argument("amount", Op::Above(99.9)), Outcome::Holds),
            (
                argument("amount", Op::Equals(Literal::Number(100.0))),
                Outcome::Holds,
            ),
            (
                argument("amount", Op::Equals(Literal::String("100".into()))),
                Outcome::Fails,
            ),
            (
                argument(
                    "currency",
                    Op::In(vec![Literal::String("USD".into()), Literal::String("EUR".into())]),
                ),
                Outcome::Holds,
            ),
            (argument("currency", Op::AtMost(5.0)), Outcome::Fails),
            (
                argument("order.lines.0.sku", Op::StartsWith("x-".into())),
                Outcome::Holds,
            ),
            (
                argument("/order/lines/0/sku", Op::StartsWith("y-".into())),
                Outcome::Fails,
            ),
            (
                argument("order.lines.1.sku", Op::StartsWith("x-".into())),
                Outcome::Missing,
            ),
            (argument("flag", Op::Equals(Literal::Bool(true))), Outcome::Holds),
            (
                argument("absent", Op::Equals(Literal::Bool(true))),
                Outcome::Missing,
            ),
        ];
        for (condition, expected) in cases {
            assert_eq!(
                condition.check(Some(&args), 0),
                expected,
                "{}",
                condition.test.written()
            );
        }
        // No arguments forwarded: every argument is missing.
        assert_eq!(
            argument("amount", Op::AtMost(1.0)).check(None, 0),
            Outcome::Missing
        );
    }

    #[test]
    fn a_window_is_read_in_its_zone_on_its_days() {
        // 2026-07-06 is a Monday; Madrid is UTC+2 in summer.
        let monday_0830_utc = 1_783_326_600_000; // 2026-07-06T08:30:00Z = 10:30 in Madrid
        let weekdays = window("Europe/Madrid", 0b001_1111, "09:00", "18:00");
        assert_eq!(weekdays.check(None, monday_0830_utc), Outcome::Holds);
        let mornings = window("Europe/Madrid", 0b001_1111, "09:00", "10:30");
        assert_eq!(
            mornings.check(None, monday_0830_utc),
            Outcome::Fails,
            "until is exclusive"
        );
        let weekend = window("Europe/Madrid", 0b110_0000, "00:00", "24:00");
        assert_eq!(weekend.check(None, monday_0830_utc), Outcome::Fails);
        let utc = window("UTC", EVERY_DAY, "08:30", "08:31");
        assert_eq!(utc.check(None, monday_0830_utc), Outcome::Holds);
    }

    #[test]
    fn a_witness_satisfies_and_contradictions_have_none() {
        let satisfiable = [
            argument("amount", Op::AtMost(100.0)),
            argument("amount", Op::Above(10.0)),
            argument("currency", Op::In(vec![Literal::String("EUR".into())])),
            argument("order.id", Op::StartsWith("ord-".into())),
            argument("order.kind", Op::Equals(Literal::String("retail".into()))),
            window("America/New_York", 0b000_0100, "09:00", "09:01"),
        ];
        let (args, at) = witness(&satisfiable, &[]).expect("a witness");
        assert!(first_failing(&satisfiable, Some(&args), at).is_none());

        let contradictions: [&[Condition]; 5] = [
            &[
                argument("amount", Op::Below(5.0)),
                argument("amount", Op::Above(5.0)),
            ],
            &[
                argument("x", Op::Equals(Literal::Number(1.0))),
                argument("x", Op::Equals(Literal::Number(2.0))),
            ],
            &[
                argument("x", Op::StartsWith("a".into())),
                argument("x", Op::StartsWith("b".into())),
            ],
            &[
                argument("x", Op::Equals(Literal::Number(1.0))),
                argument("x.y", Op::Equals(Literal::Number(1.0))),
            ],
            &[
                window("UTC", EVERY_DAY, "09:00", "10:00"),
                window("UTC", EVERY_DAY, "10:00", "11:00"),
            ],
        ];
        for conditions in contradictions {
            assert!(
                witness(conditions, &[]).is_none(),
                "{:?}",
                conditions.iter().map(|c| c.test.written()).collect::<Vec<_>>()
            );
        }
        // Between 5 and 6 exclusive there is a number, but no integer.
        let strict = [argument("n", Op::Above(5.0)), argument("n", Op::Below(6.0))];
        assert!(witness(&strict, &[]).is_some());
        assert!(witness(&strict, &["n"]).is_none());
    }

    #[test]
    fn clocks_read_and_write_back() {
        assert_eq!(parse_clock("09:05"), Some(545));
        assert_eq!(parse_clock("24:00"), Some(1440));
        for bad in ["24:01", "9:00", "09:60", "0900", "aa:bb"] {
            assert_eq!(parse_clock(bad), None, "{bad}");
        }
        assert_eq!(clock(1440), "24:00");
        assert_eq!(day_number("wed"), Some(2));
    }
}
