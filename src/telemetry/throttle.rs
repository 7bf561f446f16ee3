//! Log lines that an outage would repeat, written at most once per interval.
//!
//! During a store outage every batch, every poll and every request meets the same failure; one
//! line per occurrence buries the log (hundreds of identical lines a second per replica). Each
//! such line goes through a [`Throttle`]: the first is written at once, the next ones at most
//! once per interval, each carrying how many were held back since the last one written, so that
//! nothing is hidden, only counted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The interval for a line that may repeat per request or per batch.
pub const EVERY: Duration = Duration::from_secs(10);
/// The interval for a line that says an outage goes on (a failing poll, a failing replay).
pub const OUTAGE_EVERY: Duration = Duration::from_secs(60);

/// Lets a log line through at most once per interval, counting the ones held back.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    /// When a line was last let through, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::every(EVERY)
    }
}

impl Throttle {
    /// A throttle that lets a line through at most once per `every` (a `static` can hold one).
    pub const fn every(every: Duration) -> Self {
        Throttle {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last one)` when a line may be written now; `None` when it is
    /// held back (and counted).
    pub fn check(&self) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (last, held_back) = &mut *state;
        let now = Instant::now();
        if last.is_some_and(|last| now.duration_since(last) < self.every) {
            *held_back += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(held_back))
    }

    /// Forgets the last line, so that the next occurrence is written at once: for a failure
    /// that has ended (the store answers again), whose next start is news.
    pub fn reset(&self) {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_passes_and_the_repeats_are_counted_until_the_interval_ends() {
        let throttle = Throttle::every(Duration::from_millis(200));
        assert_eq!(throttle.check(), Some(0));
        assert_eq!(throttle.check(), None);
        assert_eq!(throttle.check(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(throttle.check(), Some(2));
        assert_eq!(throttle.check(), None);
    }

    #[test]
    fn after_a_reset_the_next_line_passes_at_once() {
        let throttle = Throttle::every(Duration::from_secs(3600));
        assert_eq!(throttle.check(), Some(0));
        assert_eq!(throttle.check(), None);
        throttle.reset();
        assert_eq!(throttle.check(), Some(1));
    }
}
