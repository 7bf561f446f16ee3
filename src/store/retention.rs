//! Audit retention: the periods the audit trail is grouped in, the same on
//! both stores (docs/decisions/0009-audit-partitioning.md).
//!
//! PostgreSQL partitions `audit_log` by range of `at`, one partition per
//! period; SQLite has no partitions but groups records in the same periods
//! when it prunes, so that `capgate audit prune` keeps one contract: only
//! whole periods that end at or before the cutoff go, nothing newer.
//!
//! Everything here is arithmetic on milliseconds since the Unix epoch — no
//! clock, no SQL — so both stores and the command line share it, and the
//! unit tests below pin it.

/// How many periods after the current one the server keeps partitions for,
/// so that a new period never starts without one (the store also creates a
/// missing partition on demand; this keeps that off the hot path).
pub const PERIODS_AHEAD: u32 = 2;

/// The first instant of the monthly periods: 0001-01-01T00:00:00Z. Records
/// before it (a broken clock) share the one period [`Period::Before`].
pub const MONTHS_START_MS: i64 = -62_135_596_800_000;

/// The end of the monthly periods: 10000-01-01T00:00:00Z. Records from it on
/// share the one period [`Period::After`].
pub const MONTHS_END_MS: i64 = 253_402_300_800_000;

/// The prefix of every partition (and SQLite bucket) name.
pub const NAME_PREFIX: &str = "audit_log_p";

const DAY_MS: i64 = 86_400_000;

/// One period of the audit trail.
///
/// INVARIANT: a period is one calendar month in UTC, for the years
/// 0001–9999; the periods tile the whole `BIGINT` range without gaps or
/// overlaps, so every record belongs to exactly one. Partitions already in
/// the field have these bounds: a different granularity needs a migration
/// that moves rows, not just a new constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    /// Everything before 0001-01-01T00:00:00Z.
    Before,
    /// One calendar month in UTC; `month` is 1–12, `year` 1–9999.
    Month { year: i32, month: u8 },
    /// Everything from 10000-01-01T00:00:00Z on.
    After,
}

impl Period {
    /// The period holding the instant `at_ms`.
    pub fn containing(at_ms: i64) -> Period {
        if at_ms < MONTHS_START_MS {
            return Period::Before;
        }
        if at_ms >= MONTHS_END_MS {
            return Period::After;
        }
        let (year, month, _day) = civil_from_days(at_ms.div_euclid(DAY_MS));
        // INVARIANT: within the bounds checked above, the year is 1–9999 and
        // the month 1–12, so neither conversion can fail.
        Period::Month {
            year: i32::try_from(year).unwrap_or(i32::MAX),
            month: u8::try_from(month).unwrap_or(12),
        }
    }

    /// The first instant of the period (inclusive); `None` for the period
    /// unbounded below.
    pub fn start_ms(self) -> Option<i64> {
        match self {
            Period::Before => None,
            Period::Month { year, month } => Some(month_start_ms(i64::from(year), i64::from(month))),
            Period::After => Some(MONTHS_END_MS),
        }
    }

    /// The first instant after the period (exclusive); `None` for the period
    /// unbounded above.
    pub fn end_ms(self) -> Option<i64> {
        match self {
            Period::Before => Some(MONTHS_START_MS),
            Period::Month {
                year: 9999,
                month: 12,
            } => Some(MONTHS_END_MS),
            Period::Month { year, month: 12 } => Some(month_start_ms(i64::from(year) + 1, 1)),
            Period::Month { year, month } => Some(month_start_ms(i64::from(year), i64::from(month) + 1)),
            Period::After => None,
        }
    }

    /// The period after this one (`After` stays `After`).
    pub fn next(self) -> Period {
        match self.end_ms() {
            Some(end) => Period::containing(end),
            None => Period::After,
        }
    }

    /// The partition's name on PostgreSQL, the bucket's on SQLite:
    /// `audit_log_p2026_11`, `audit_log_p_before`, `audit_log_p_after`.
    /// Only `[a-z0-9_]`, so it needs no quoting (it is quoted anyway).
    pub fn name(self) -> String {
        match self {
            Period::Before => format!("{NAME_PREFIX}_before"),
            Period::Month { year, month } => format!("{NAME_PREFIX}{year:04}_{month:02}"),
            Period::After => format!("{NAME_PREFIX}_after"),
        }
    }
}

/// The periods from the one holding `at_ms` through [`PERIODS_AHEAD`] later.
pub fn periods_from(at_ms: i64) -> Vec<Period> {
    let mut periods = vec![Period::containing(at_ms)];
    for _ in 0..PERIODS_AHEAD {
        let next = periods[periods.len() - 1].next();
        if periods.contains(&next) {
            break;
        }
        periods.push(next);
    }
    periods
}

/// Where pruning before `before_ms` stops: the start of the period holding
/// `before_ms`. Every record before it is in a period that ends at or before
/// `before_ms`; the period holding `before_ms` itself is kept whole. `None`
/// when nothing can go (`before_ms` is in the period unbounded below).
pub fn prune_cutoff(before_ms: i64) -> Option<i64> {
    Period::containing(before_ms).start_ms()
}

/// A range partition's bounds as PostgreSQL prints them
/// (`pg_get_expr(relpartbound, oid)`); `None` stands for `MINVALUE` and
/// `MAXVALUE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeBounds {
    pub from_ms: Option<i64>,
    pub until_ms: Option<i64>,
}

impl RangeBounds {
    /// Whether every instant the range can hold is before `before_ms`, that
    /// is, whether the partition may be dropped by a prune before it.
    pub fn ends_by(self, before_ms: i64) -> bool {
        self.until_ms.is_some_and(|until| until <= before_ms)
    }
}

/// Parses `FOR VALUES FROM ('1000') TO ('2000')` (either bound may be
/// `MINVALUE`/`MAXVALUE`). Anything else — `DEFAULT`, a list partition, a
/// bound with more than one column — is `None`: a partition whose bounds
/// are not understood is never dropped.
pub fn parse_range_bounds(text: &str) -> Option<RangeBounds> {
    let inner = text.trim().strip_prefix("FOR VALUES FROM (")?.strip_suffix(')')?;
    let (from, until) = inner.split_once(") TO (")?;
    let bound = |text: &str| -> Option<Option<i64>> {
        match text.trim() {
            "MINVALUE" | "MAXVALUE" => Some(None),
            value => {
                let value = value
                    .strip_prefix('\'')
                    .and_then(|quoted| quoted.strip_suffix('\''))
                    .unwrap_or(value);
                value.parse::<i64>().ok().map(Some)
            }
        }
    };
    Some(RangeBounds {
        from_ms: bound(from)?,
        until_ms: bound(until)?,
    })
}

/// The first instant of a month in UTC, in milliseconds, for a month of the
/// years 1–9999 (`month` 1–12).
fn month_start_ms(year: i64, month: i64) -> i64 {
    days_from_civil(year, month, 1) * DAY_MS
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`; exact for any year of interest).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `(year, month, day)` of a day counted from 1970-01-01 (the
/// inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn month(year: i32, month: u8) -> Period {
        Period::Month { year, month }
    }

    /// The instant of a UTC date-time, through the `time` crate: an oracle
    /// independent of the arithmetic above.
    fn utc(year: i32, month: u8, day: u8) -> i64 {
        let date = time::Date::from_calendar_date(year, time::Month::try_from(month).unwrap(), day).unwrap();
        i64::try_from(date.midnight().assume_utc().unix_timestamp_nanos() / 1_000_000).unwrap()
    }

    #[test]
    fn months_agree_with_the_calendar() {
        for year in [
            1, 4, 100, 400, 1582, 1899, 1900, 1969, 1970, 2000, 2024, 2026, 2100, 9999,
        ] {
            for m in 1..=12u8 {
                let period = month(year, m);
                let start = utc(year, m, 1);
                assert_eq!(period.start_ms(), Some(start), "{year}-{m}");
                assert_eq!(Period::containing(start), period);
                assert_eq!(Period::containing(start - 1).end_ms(), Some(start), "{year}-{m}");
                assert_eq!(Period::containing(start - 1).next(), period);
                let end = period.end_ms().unwrap();
                assert_eq!(Period::containing(end - 1), period);
                assert_ne!(Period::containing(end), period);
                // A leap day belongs to February.
                if m == 2 && year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) {
                    assert_eq!(Period::containing(utc(year, 2, 29)), period);
                }
            }
        }
        assert_eq!(MONTHS_START_MS, utc(1, 1, 1));
        assert_eq!(MONTHS_END_MS, utc(9999, 12, 31) + DAY_MS);
    }

    #[test]
    fn every_instant_has_exactly_one_period() {
        assert_eq!(Period::containing(i64::MIN), Period::Before);
        assert_eq!(Period::containing(MONTHS_START_MS - 1), Period::Before);
        assert_eq!(Period::containing(MONTHS_START_MS), month(1, 1));
        assert_eq!(Period::containing(MONTHS_END_MS - 1), month(9999, 12));
        assert_eq!(Period::containing(MONTHS_END_MS), Period::After);
        assert_eq!(Period::containing(i64::MAX), Period::After);
        assert_eq!(Period::containing(-1), month(1969, 12));
        assert_eq!(Period::containing(0), month(1970, 1));
        assert_eq!(Period::Before.start_ms(), None);
        assert_eq!(Period::Before.next(), month(1, 1));
        assert_eq!(month(9999, 12).next(), Period::After);
        assert_eq!(Period::After.end_ms(), None);
        assert_eq!(Period::After.next(), Period::After);
    }

    #[test]
    fn names_sort_like_the_periods_they_name() {
        assert_eq!(month(2026, 11).name(), "audit_log_p2026_11");
        assert_eq!(month(1, 1).name(), "audit_log_p0001_01");
        assert_eq!(Period::Before.name(), "audit_log_p_before");
        assert_eq!(Period::After.name(), "audit_log_p_after");
        assert!(month(2026, 9).name() < month(2026, 10).name());
    }

    #[test]
    fn the_periods_ahead_follow_the_current_one() {
        let now = utc(2026, 11, 30) + 3_600_000;
        assert_eq!(
            periods_from(now),
            [month(2026, 11), month(2026, 12), month(2027, 1)]
        );
        assert_eq!(periods_from(MONTHS_END_MS - 1), [month(9999, 12), Period::After]);
        assert_eq!(periods_from(i64::MAX), [Period::After]);
    }

    #[test]
    fn the_period_holding_the_cutoff_is_kept() {
        let march = utc(2026, 3, 1);
        assert_eq!(prune_cutoff(march), Some(march));
        assert_eq!(prune_cutoff(march + 1), Some(march));
        assert_eq!(prune_cutoff(utc(2026, 4, 1) - 1), Some(march));
        assert_eq!(prune_cutoff(MONTHS_START_MS - 1), None);
        assert_eq!(prune_cutoff(MONTHS_START_MS), Some(MONTHS_START_MS));
    }

    #[test]
    fn partition_bounds_parse_as_postgresql_prints_them() {
        let bounds = |from, until| {
            Some(RangeBounds {
                from_ms: from,
                until_ms: until,
            })
        };
        assert_eq!(
            parse_range_bounds("FOR VALUES FROM ('1000') TO ('2000')"),
            bounds(Some(1000), Some(2000))
        );
        assert_eq!(
            parse_range_bounds("FOR VALUES FROM (MINVALUE) TO ('-62135596800000')"),
            bounds(None, Some(-62_135_596_800_000))
        );
        assert_eq!(
            parse_range_bounds("FOR VALUES FROM ('253402300800000') TO (MAXVALUE)"),
            bounds(Some(253_402_300_800_000), None)
        );
        assert_eq!(
            parse_range_bounds("FOR VALUES FROM (5) TO (6)"),
            bounds(Some(5), Some(6))
        );
        for other in [
            "DEFAULT",
            "FOR VALUES IN ('a')",
            "FOR VALUES FROM ('1', '2') TO ('3', '4')",
            "FOR VALUES FROM ('x') TO ('2')",
            "",
        ] {
            assert_eq!(parse_range_bounds(other), None, "{other}");
        }
        let january = RangeBounds {
            from_ms: Some(10),
            until_ms: Some(20),
        };
        assert!(january.ends_by(20) && january.ends_by(21) && !january.ends_by(19));
        let open = RangeBounds {
            from_ms: Some(10),
            until_ms: None,
        };
        assert!(!open.ends_by(i64::MAX));
    }
}
