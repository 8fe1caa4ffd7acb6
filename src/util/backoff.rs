//! Exponential backoff with full jitter and a cap: the one retry delay of the daemon,
//! used by the flusher (delivery), the token cache (grants) and ingest (outbox commits).
//! A leaf: it imports nothing of the crate.
//!
//! It is data, not a loop: the caller asks for the next delay after a failure, passing
//! the randomness in (`jitter` in `[0, 1]`; 1.0 turns jitter off), so that tests can
//! hold it to exact numbers.

use std::time::Duration;

/// The longest `Retry-After` honoured. The server's word goes beyond the configured cap
/// (it knows when it will take requests again), but not without bound: a hostile or
/// broken value must not stop delivery for days.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

/// Exponential backoff with full jitter and a cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            failures: 0,
        }
    }

    /// The delay after one more failure: uniformly random in `[0, min(max, initial·2ⁿ)]`
    /// (`jitter` in `[0, 1]`; 1.0 turns jitter off), but never less than the server's
    /// `Retry-After` (which may exceed `max`, up to [`RETRY_AFTER_MAX`]).
    pub fn next_delay(&mut self, jitter: f64, retry_after: Option<Duration>) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << self.failures.min(20));
        self.failures = self.failures.saturating_add(1);
        let ceiling = exp.min(self.max);
        let jittered = ceiling.mul_f64(jitter.clamp(0.0, 1.0));
        let server = retry_after.unwrap_or_default().min(RETRY_AFTER_MAX);
        jittered.min(self.max).max(server)
    }

    /// After a success: the next failure starts from `initial` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_off() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let got: Vec<u128> = (0..6)
            .map(|_| b.next_delay(1.0, None).as_millis())
            .collect();
        assert_eq!(got, vec![500, 1000, 2000, 4000, 4000, 4000]);
        b.reset();
        assert_eq!(b.next_delay(1.0, None), Duration::from_millis(500));
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_ceiling() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(300));
        assert_eq!(b.next_delay(0.0, None), Duration::ZERO);
        assert_eq!(b.next_delay(0.5, None), Duration::from_millis(500));
    }

    #[test]
    fn retry_after_is_honoured_beyond_the_cap_up_to_an_hour() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        assert_eq!(
            b.next_delay(0.1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(
            b.next_delay(0.1, Some(Duration::from_secs(600))),
            Duration::from_secs(600)
        );
        assert_eq!(
            b.next_delay(0.1, Some(Duration::from_secs(10_000_000))),
            RETRY_AFTER_MAX
        );
    }
}
