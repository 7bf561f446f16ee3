//! The clock, and instants as text: [`now`] is the one place the product reads the time (the
//! service stamps every decision with it, the command line uses it as the default `--at`); the
//! strict RFC 3339 form `--at` and `--window-start` accept (cli.md, "Common inputs") and the UTC
//! form every output uses.
//!
//! The grammar is lexed by hand so that exactly the spec's shape is accepted
//! (`time`'s own RFC 3339 parser also takes leap seconds, which we refuse);
//! `time` does the calendar arithmetic.

use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

use capgate_core::access::Instant;

/// Milliseconds since the Unix epoch for `YYYY-MM-DD(T|t)HH:MM:SS[.digits](Z|z|±HH:MM)`.
/// Digits beyond milliseconds are truncated; a leap second (`:60`) is refused.
/// The result must fall within the years 0000–9999 in UTC, so that it can be
/// printed back in the same form.
pub fn parse(text: &str) -> Result<Instant, String> {
    let mut lexer = Lexer {
        bytes: text.as_bytes(),
        at: 0,
    };
    let fields = lexer.fields().ok_or_else(|| SHAPE.to_owned())?;
    let Fields {
        year,
        month,
        day,
        hour,
        minute,
        second,
        millisecond,
        offset_minutes,
    } = fields;

    let month = u8::try_from(month)
        .ok()
        .and_then(|month| Month::try_from(month).ok())
        .ok_or_else(|| format!("month `{month:02}` does not exist"))?;
    let date =
        Date::from_calendar_date(i32::from(year), month, u8::try_from(day).unwrap_or(0)).map_err(|_| {
            format!(
                "day `{day:02}` does not exist in {year:04}-{:02}",
                u8::from(month)
            )
        })?;
    if second == 60 {
        return Err("leap seconds (`:60`) are not accepted".to_owned());
    }
    let clock = Time::from_hms_milli(
        u8::try_from(hour).unwrap_or(u8::MAX),
        u8::try_from(minute).unwrap_or(u8::MAX),
        u8::try_from(second).unwrap_or(u8::MAX),
        millisecond,
    )
    .map_err(|_| format!("`{hour:02}:{minute:02}:{second:02}` is not a time of day"))?;

    // The local reading is within 0000–9999, where `time` is exact and total;
    // the offset is applied in milliseconds so that nothing can overflow or
    // panic near the ends of the range (`to_offset` would).
    let local = PrimitiveDateTime::new(date, clock)
        .assume_utc()
        .unix_timestamp_nanos()
        / 1_000_000;
    let utc = local - i128::from(offset_minutes) * 60_000;
    if !(i128::from(FIRST)..=i128::from(LAST)).contains(&utc) {
        return Err("the instant falls outside the years 0000-9999 in UTC".to_owned());
    }
    Instant::try_from(utc).map_err(|_| "the instant is out of range".to_owned())
}

/// What [`parse`] says of text that is not an instant at all.
const SHAPE: &str = "expected an RFC 3339 instant such as `2026-01-02T15:04:05Z`";

/// An instant as [`parse`] takes it, or a date `YYYY-MM-DD` standing for its
/// first instant in UTC (`audit prune --before`, where whole days are the
/// natural unit).
pub fn parse_instant_or_date(text: &str) -> Result<Instant, String> {
    let is_date = text.len() == 10
        && text.bytes().enumerate().all(|(at, byte)| {
            if at == 4 || at == 7 {
                byte == b'-'
            } else {
                byte.is_ascii_digit()
            }
        });
    if is_date {
        return parse(&format!("{text}T00:00:00Z"));
    }
    parse(text).map_err(|problem| {
        if problem == SHAPE {
            format!("{SHAPE} or a date such as `2026-01-02`")
        } else {
            problem
        }
    })
}

/// What the audit commands take for a time (`--since`, `--until`, `--before`), at `now`: an
/// instant as [`parse`] takes it; a date `YYYY-MM-DD` (its midnight UTC); `today` or `yesterday`
/// (their midnight UTC); or a span back from now, `90s`, `15m`, `1h`, `2d`, `1w`. Operators ask
/// "what happened in the last hour" far more often than they type an RFC 3339 instant.
pub fn parse_when_at(text: &str, now: Instant) -> Result<Instant, String> {
    const DAY: Instant = 86_400_000;
    let midnight = now.div_euclid(DAY) * DAY;
    match text {
        "today" => return Ok(midnight),
        "yesterday" => return Ok(midnight - DAY),
        _ => {}
    }
    if let Some(unit_at) = text.find(|c: char| !c.is_ascii_digit()).filter(|&at| at > 0) {
        let unit_ms: Option<Instant> = match &text[unit_at..] {
            "s" => Some(1_000),
            "m" => Some(60_000),
            "h" => Some(3_600_000),
            "d" => Some(DAY),
            "w" => Some(7 * DAY),
            _ => None,
        };
        if let Some(unit_ms) = unit_ms {
            let span = text[..unit_at]
                .parse::<Instant>()
                .ok()
                .and_then(|amount| amount.checked_mul(unit_ms))
                .and_then(|span| now.checked_sub(span))
                .filter(|at| *at >= FIRST);
            return span.ok_or_else(|| format!("`{text}` reaches back before the year 0000"));
        }
    }
    parse_instant_or_date(text).map_err(|problem| {
        format!("{problem}, `today`, `yesterday`, or a span back from now such as `1h` or `7d`")
    })
}

/// [`parse_when_at`] now.
pub fn parse_when(text: &str) -> Result<Instant, String> {
    parse_when_at(text, now())
}

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z.
const FIRST: Instant = -62_167_219_200_000;
const LAST: Instant = 253_402_300_799_999;

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z` in UTC; the milliseconds only when not zero.
pub fn format(instant: Instant) -> String {
    let nanos = i128::from(instant) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(moment) => {
            let mut text = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                moment.year(),
                u8::from(moment.month()),
                moment.day(),
                moment.hour(),
                moment.minute(),
                moment.second()
            );
            if moment.millisecond() != 0 {
                text.push_str(&format!(".{:03}", moment.millisecond()));
            }
            text.push('Z');
            text
        }
        // Unreachable for instants that `parse` or `now` produced; printing the
        // raw number is better than inventing a date.
        Err(_) => format!("{instant}ms"),
    }
}

/// The current instant in milliseconds since the Unix epoch, truncated.
pub fn now() -> Instant {
    use std::time::{SystemTime, UNIX_EPOCH};
    let millis = |ms: u128| Instant::try_from(ms).unwrap_or(Instant::MAX);
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => millis(since.as_millis()),
        Err(before) => -millis(before.duration().as_millis()),
    }
}

struct Fields {
    year: u16,
    month: u16,
    day: u16,
    hour: u16,
    minute: u16,
    second: u16,
    millisecond: u16,
    offset_minutes: i16,
}

struct Lexer<'t> {
    bytes: &'t [u8],
    at: usize,
}

impl Lexer<'_> {
    fn fields(&mut self) -> Option<Fields> {
        let year = self.digits(4)?;
        self.literal(b"-")?;
        let month = self.digits(2)?;
        self.literal(b"-")?;
        let day = self.digits(2)?;
        self.literal(b"Tt")?;
        let hour = self.digits(2)?;
        self.literal(b":")?;
        let minute = self.digits(2)?;
        self.literal(b":")?;
        let second = self.digits(2)?;
        let millisecond = if self.literal(b".").is_some() {
            self.fraction()?
        } else {
            0
        };
        let offset_minutes = match self.next()? {
            b'Z' | b'z' => 0,
            sign @ (b'+' | b'-') => {
                let hours = self.digits(2)?;
                self.literal(b":")?;
                let minutes = self.digits(2)?;
                if hours > 23 || minutes > 59 {
                    return None;
                }
                // INVARIANT: hours ≤ 23 and minutes ≤ 59, so this fits in i16.
                let total = i16::try_from(hours * 60 + minutes).ok()?;
                if sign == b'-' {
                    -total
                } else {
                    total
                }
            }
            _ => return None,
        };
        (self.at == self.bytes.len()).then_some(Fields {
            year,
            month,
            day,
            hour,
            minute,
            second,
            millisecond,
            offset_minutes,
        })
    }

    fn next(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn literal(&mut self, one_of: &[u8]) -> Option<()> {
        let byte = *self.bytes.get(self.at)?;
        one_of.contains(&byte).then(|| self.at += 1)
    }

    fn digit(&mut self) -> Option<u16> {
        let byte = *self.bytes.get(self.at)?;
        byte.is_ascii_digit().then(|| {
            self.at += 1;
            u16::from(byte - b'0')
        })
    }

    fn digits(&mut self, count: usize) -> Option<u16> {
        (0..count).try_fold(0u16, |value, _| Some(value * 10 + self.digit()?))
    }

    /// One or more digits; the first three are milliseconds, the rest truncated.
    fn fraction(&mut self) -> Option<u16> {
        let mut millisecond = 0;
        let mut count = 0;
        while let Some(digit) = self.digit() {
            if count < 3 {
                millisecond = millisecond * 10 + digit;
            }
            count += 1;
        }
        match count {
            0 => None,
            1 => Some(millisecond * 100),
            2 => Some(millisecond * 10),
            _ => Some(millisecond),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Instant = 86_400_000;

    #[test]
    fn audit_times_take_dates_day_names_and_spans_back() {
        let now = parse("2026-12-01T10:30:00Z").unwrap();
        let at = |text: &str| parse_when_at(text, now).map(format);
        assert_eq!(at("2026-12-01").unwrap(), "2026-12-01T00:00:00Z");
        assert_eq!(at("2026-11-30T08:00:00Z").unwrap(), "2026-11-30T08:00:00Z");
        assert_eq!(at("today").unwrap(), "2026-12-01T00:00:00Z");
        assert_eq!(at("yesterday").unwrap(), "2026-11-30T00:00:00Z");
        assert_eq!(at("1h").unwrap(), "2026-12-01T09:30:00Z");
        assert_eq!(at("90s").unwrap(), "2026-12-01T10:28:30Z");
        assert_eq!(at("15m").unwrap(), "2026-12-01T10:15:00Z");
        assert_eq!(at("2d").unwrap(), "2026-11-29T10:30:00Z");
        assert_eq!(at("1w").unwrap(), "2026-11-24T10:30:00Z");
        for wrong in ["1y", "h", "-1h", "soon", "99999999999999999999d"] {
            let problem = at(wrong).unwrap_err();
            assert!(
                problem.contains("`1h`") || problem.contains("before the year"),
                "{wrong}: {problem}"
            );
        }
    }

    #[test]
    fn accepts_the_spec_shape_in_both_cases() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse("1970-01-01t00:00:00z"), Ok(0));
        assert_eq!(parse("1970-01-02T00:00:00.5Z"), Ok(DAY + 500));
        assert_eq!(parse("1970-01-02T00:00:00.05Z"), Ok(DAY + 50));
        assert_eq!(parse("1970-01-02T00:00:00.123999999Z"), Ok(DAY + 123));
        assert_eq!(parse("2026-01-02T00:00:00Z"), Ok(1_767_312_000_000));
    }

    #[test]
    fn offsets_move_the_instant_to_utc() {
        assert_eq!(parse("1970-01-01T01:30:00+01:30"), Ok(0));
        assert_eq!(parse("1969-12-31T23:00:00-01:00"), Ok(0));
        assert_eq!(parse("1970-01-01T00:00:00-00:00"), Ok(0));
        assert_eq!(parse("1970-01-01T00:00:00+23:59"), Ok(-(23 * 60 + 59) * 60_000));
    }

    #[test]
    fn refuses_everything_else() {
        for text in [
            "",
            "2026-01-02",
            "2026-01-02T00:00:00",
            "2026-01-02 00:00:00Z",
            "2026-01-02T00:00Z",
            "2026-1-02T00:00:00Z",
            "+2026-01-02T00:00:00Z",
            "2026-01-02T00:00:00.Z",
            "2026-01-02T00:00:00ZZ",
            "2026-01-02T00:00:00+0100",
            "2026-01-02T00:00:00+24:00",
            "2026-01-02T00:00:00+01:60",
            "2026-01-02T24:00:00Z",
            "2026-01-02T23:60:00Z",
            "2016-12-31T23:59:60Z",
            "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-01-00T00:00:00Z",
            "2026-01-02T00:00:00Z ",
            "２026-01-02T00:00:00Z",
            "0000-01-01T00:00:00+00:01",
        ] {
            assert!(parse(text).is_err(), "{text:?} should be refused");
        }
        assert!(parse("2024-02-29T00:00:00Z").is_ok());
        assert!(parse("0000-01-01T00:00:00Z").is_ok());
        assert!(parse("9999-12-31T23:59:59.999Z").is_ok());
        assert!(parse("9999-12-31T23:59:59-00:01").is_err());
        assert!(parse("9999-12-31T23:59:59.999-23:59").is_err());
        assert_eq!(parse("0000-01-01T00:00:00Z"), Ok(FIRST));
        assert_eq!(parse("9999-12-31T23:59:59.999Z"), Ok(LAST));
        assert_eq!(parse("0000-01-01T23:59:00+23:59"), Ok(FIRST));
    }

    #[test]
    fn a_date_is_its_first_instant_in_utc() {
        assert_eq!(parse_instant_or_date("1970-01-02"), Ok(DAY));
        assert_eq!(parse_instant_or_date("1970-01-02T00:00:00.5Z"), Ok(DAY + 500));
        assert_eq!(
            parse_instant_or_date("2026-02-29").unwrap_err(),
            "day `29` does not exist in 2026-02"
        );
        for text in [
            "",
            "2026-1-02",
            "2026-01-02Z",
            "2026/01/02",
            "20260102",
            "next tuesday",
        ] {
            let problem = parse_instant_or_date(text).unwrap_err();
            assert!(problem.contains("or a date such as"), "{text:?}: {problem}");
        }
    }

    #[test]
    fn formats_in_utc_with_milliseconds_only_when_present() {
        assert_eq!(format(0), "1970-01-01T00:00:00Z");
        assert_eq!(format(DAY + 500), "1970-01-02T00:00:00.500Z");
        assert_eq!(format(-1), "1969-12-31T23:59:59.999Z");
        for text in [
            "2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.006Z",
            "0000-01-01T00:00:00Z",
        ] {
            assert_eq!(parse(text).map(format).as_deref(), Ok(text));
        }
    }
}
