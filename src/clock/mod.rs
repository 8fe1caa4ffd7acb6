//! Time: the clock as a value handed to what reads it ([`SharedClock`]: the machine's
//! [`SystemClock`], and in debug builds only a test clock, which the binary's entry
//! point may choose); formatting for operators (RFC 3339 UTC and short ages); the pure
//! hold policy and repair arithmetic of a gateway without a real-time clock; and the
//! keeper that applies them to the outbox.

#[cfg(any(test, debug_assertions))]
pub mod fake;
mod keeper;
mod policy;
mod source;

pub use keeper::ClockKeeper;
pub use policy::{decide, repaired_wall, ClockPolicy, ClockSettings, Facts, Hold, Trust, Verdict};
pub use source::{system, Clock, Reading, SharedClock, SystemClock};

use crate::record::EpochMillis;

/// The environment variable that names the test clock's file. Only a debug build's entry
/// point reads it (`fake::from_env`): a release build has no test clock, so no stray
/// variable can move a gateway's clock.
pub const FAKE_CLOCK_ENV: &str = "TAPEGATE_FAKE_CLOCK";

/// `2026-11-21T19:40:00Z` (UTC, whole seconds).
pub fn rfc3339(ms: EpochMillis) -> String {
    match jiff::Timestamp::from_second(ms.div_euclid(1000)) {
        Ok(t) => t.to_string(),
        // Beyond jiff's range (years -9999..=9999): no reading can be that far off.
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// The instant `ms` as a [`jiff::Timestamp`] (clamped to jiff's years -9999..=9999: no
/// reading can be that far off), for what computes with calendar time.
pub fn timestamp(ms: EpochMillis) -> jiff::Timestamp {
    jiff::Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    })
}

/// The instant `ms` as a [`std::time::SystemTime`].
pub fn system_time(ms: EpochMillis) -> std::time::SystemTime {
    let since_epoch = std::time::Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        std::time::SystemTime::UNIX_EPOCH + since_epoch
    } else {
        std::time::SystemTime::UNIX_EPOCH - since_epoch
    }
}

/// `3s`, `4m 12s`, `2h 05m`, `3d 04h`.
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m {:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_763_719_200_125), "2025-11-21T10:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn a_timestamp_is_the_instant_or_the_end_of_the_calendar() {
        assert_eq!(
            timestamp(1_763_719_200_125).as_millisecond(),
            1_763_719_200_125
        );
        assert_eq!(timestamp(i64::MAX), jiff::Timestamp::MAX);
        assert_eq!(timestamp(i64::MIN), jiff::Timestamp::MIN);
    }

    #[test]
    fn ages_read_shortly() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(252), "4m 12s");
        assert_eq!(age(7500), "2h 05m");
        assert_eq!(age(273_600), "3d 04h");
    }
}
