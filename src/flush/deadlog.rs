//! Dead letters in the log: one WARN line per MAC per [`DEAD_LETTER_LOG_EVERY`], whose
//! message names the MAC and the service's reason (what `journalctl` shows), with the
//! fields `mac` (journald shows it as `MAC`), `reason`, and how many were not logged
//! since. Tapes of other customers pass every dock and are refused at every
//! advert; a line each would drown the journal, none would hide a wrong setup.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::record::Mac;

/// A MAC's dead letters are logged at most once per this period.
pub const DEAD_LETTER_LOG_EVERY: Duration = Duration::from_secs(600);

/// MACs remembered at most; past it the ones logged longest ago are forgotten.
const TRACKED_MAX: usize = 10_000;

/// When each MAC's dead letter was last logged, and how many were not logged since.
#[derive(Debug, Default)]
pub struct DeadLetterLog {
    macs: HashMap<Mac, (Instant, u64)>,
}

impl DeadLetterLog {
    /// Whether a dead letter of `mac` is logged now: `Some(suppressed)`, the number not
    /// logged since the last line for it; `None` when it is counted instead.
    pub fn admit(&mut self, mac: Mac, now: Instant) -> Option<u64> {
        if let Some((at, suppressed)) = self.macs.get_mut(&mac) {
            if now.saturating_duration_since(*at) < DEAD_LETTER_LOG_EVERY {
                *suppressed += 1;
                return None;
            }
            let n = std::mem::take(suppressed);
            *at = now;
            return Some(n);
        }
        if self.macs.len() >= TRACKED_MAX {
            self.macs
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < DEAD_LETTER_LOG_EVERY);
            if self.macs.len() >= TRACKED_MAX {
                self.macs.clear();
            }
        }
        self.macs.insert(mac, (now, 0));
        Some(0)
    }

    /// Logs a dead letter of `mac` if its period allows.
    pub fn log(&mut self, mac: Mac, reason: &str, correlation_id: &str, now: Instant) {
        if let Some(suppressed) = self.admit(mac, now) {
            // The message itself names the tape and the reason: `journalctl -u tapegate`
            // shows the message, not the fields. The reason is the service's text, cut
            // and made inert.
            let said = crate::util::text::shown(reason, 200);
            tracing::warn!(
                mac = %mac,
                correlation_id,
                reason,
                suppressed,
                "the service refused a capture of {mac}: {said}; kept as a dead letter"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_macs_dead_letters_are_logged_once_per_period_with_the_count_suppressed() {
        let mut log = DeadLetterLog::default();
        let t0 = Instant::now();
        let a = Mac::new([0xC0, 0xDE, 0xAD, 0, 0, 1]);
        let b = Mac::new([0xC0, 0xDE, 0xAD, 0, 0, 2]);
        assert_eq!(log.admit(a, t0), Some(0));
        assert_eq!(log.admit(b, t0), Some(0), "another MAC has its own period");
        for s in 1..=3 {
            assert_eq!(log.admit(a, t0 + Duration::from_secs(s)), None);
        }
        let later = t0 + DEAD_LETTER_LOG_EVERY;
        assert_eq!(log.admit(a, later), Some(3));
        assert_eq!(log.admit(a, later + Duration::from_secs(1)), None);
    }

    #[test]
    fn the_memory_of_logged_macs_is_bounded() {
        let mut log = DeadLetterLog::default();
        let t0 = Instant::now();
        for i in 0..(TRACKED_MAX as u32 + 10) {
            let b = i.to_be_bytes();
            log.admit(Mac::new([0xC0, 0xDE, b[0], b[1], b[2], b[3]]), t0);
        }
        assert!(log.macs.len() <= TRACKED_MAX);
    }
}
