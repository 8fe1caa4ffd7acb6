//! The hold policy and the repair arithmetic, pure: readings and facts are passed in.
//! DESIGN.md, "Time on a gateway without a real-time clock", is the specification.

use std::fmt;

use super::source::Reading;
use crate::record::EpochMillis;

/// `[gateway] clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockPolicy {
    /// Hold while unsynchronised and a time service can sync the clock (at most the
    /// maximum hold), and while the clock reads earlier than the database's newest time.
    Auto,
    /// Hold while the kernel says unsynchronised, however long.
    Wait,
    /// Never hold (a box with a good real-time clock).
    Trust,
}

/// Validated `[gateway] clock` and `clock_max_hold_secs`: config's words for the
/// keeper, defined here, below both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSettings {
    pub policy: ClockPolicy,
    pub max_hold: std::time::Duration,
}

/// What is known beside one reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// A time service runs that can sync the clock.
    pub time_service: bool,
    /// The clock has been seen synchronised earlier in this boot: a kernel that later
    /// reports it unsynchronised (hours without the network) is drifting, not wrong.
    pub synced_this_boot: bool,
    /// The newest wall time the state database has recorded.
    pub high_water_ms: Option<EpochMillis>,
    /// Boot time at which the current hold began.
    pub hold_started_boot_ms: Option<i64>,
}

/// Why captures are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Unsynchronised, and something will sync it.
    AwaitingSync,
    /// The clock reads earlier than a time already recorded: wrong for sure.
    Behind { by_ms: i64 },
}

/// Why an unsynchronised clock is used as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// `gateway.clock = "trust"`.
    Configured,
    /// Nothing will ever sync it (no RTC, no time service: build machines, CI, VMs),
    /// and it is not behind the database.
    NoTimeService,
    /// Held for `clock_max_hold_secs` without a sync: send with the estimate.
    HoldExpired,
}

/// What to do with captures now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Synced,
    Trusted(Trust),
    Hold(Hold),
}

impl Verdict {
    pub fn holds(&self) -> bool {
        matches!(self, Verdict::Hold(_))
    }
}

impl fmt::Display for Verdict {
    /// The clock state as `status` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Synced => f.write_str("synchronised"),
            Verdict::Trusted(Trust::Configured) => {
                f.write_str("trusted (gateway.clock = \"trust\")")
            }
            Verdict::Trusted(Trust::NoTimeService) => {
                f.write_str("unsynchronised, no time service: trusted")
            }
            Verdict::Trusted(Trust::HoldExpired) => f.write_str(
                "unsynchronised past gateway.clock_max_hold_secs: sending with estimated times",
            ),
            Verdict::Hold(Hold::AwaitingSync) => {
                f.write_str("unsynchronised: holding captures until the clock is synchronised")
            }
            Verdict::Hold(Hold::Behind { by_ms }) => write!(
                f,
                "{}s behind the newest time already recorded: holding captures",
                (by_ms + 999) / 1000
            ),
        }
    }
}

/// Decides whether captures are held, per DESIGN.md.
pub fn decide(policy: ClockPolicy, max_hold_ms: i64, now: &Reading, facts: &Facts) -> Verdict {
    match policy {
        ClockPolicy::Trust => Verdict::Trusted(Trust::Configured),
        ClockPolicy::Wait if now.kernel_synced => Verdict::Synced,
        ClockPolicy::Wait => Verdict::Hold(Hold::AwaitingSync),
        ClockPolicy::Auto => {
            if now.kernel_synced || facts.synced_this_boot {
                return Verdict::Synced;
            }
            let hold = match facts.high_water_ms {
                Some(h) if now.wall_ms < h => Hold::Behind {
                    by_ms: h - now.wall_ms,
                },
                _ if facts.time_service => Hold::AwaitingSync,
                _ => return Verdict::Trusted(Trust::NoTimeService),
            };
            match facts.hold_started_boot_ms {
                Some(since) if now.boot_ms.saturating_sub(since) >= max_hold_ms => {
                    Verdict::Trusted(Trust::HoldExpired)
                }
                _ => Verdict::Hold(hold),
            }
        }
    }
}

/// The wall time of a capture taken at `capture_boot_ms` of the same boot, by the
/// clock of `now`: `wall_now - (boot_now - boot_capture)`.
pub fn repaired_wall(now: &Reading, capture_boot_ms: i64) -> EpochMillis {
    capture_boot_ms.saturating_add(now.offset_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::clock::fake::FIXED_DAYS;

    const HOUR: i64 = 3_600_000;
    const WEEK: i64 = 7 * 24 * HOUR;
    /// 2026-11-23T00:00:00Z
    const T: EpochMillis = 1_795_392_000_000;

    fn reading(wall_ms: EpochMillis, boot_ms: i64, kernel_synced: bool) -> Reading {
        Reading {
            wall_ms,
            boot_ms,
            kernel_synced,
        }
    }

    #[test]
    fn a_capture_is_repaired_to_the_synced_clock_minus_the_boot_time_since() {
        for t in std::iter::once(T).chain(FIXED_DAYS.map(|d| d.wall_ms)) {
            // Captured 90 s after boot while the clock read three weeks behind; synced
            // at boot time 600 s to t.
            let synced = reading(t, 600_000, true);
            assert_eq!(repaired_wall(&synced, 90_000), t - 510_000);
            // The same capture, repaired later by the same (now running) clock: same
            // answer.
            let later = reading(t + 1_000_000, 1_600_000, true);
            assert_eq!(repaired_wall(&later, 90_000), t - 510_000);
            // A capture at the very moment of the reading keeps the reading's time.
            assert_eq!(repaired_wall(&synced, 600_000), t);
        }
    }

    #[test]
    fn repair_undoes_a_three_week_jump() {
        for t in std::iter::once(T).chain(FIXED_DAYS.map(|d| d.wall_ms)) {
            let boot_at_capture = 12_345;
            let wrong = reading(t - 3 * WEEK, boot_at_capture, false);
            let synced = reading(t + 5_000, boot_at_capture + 5_000, true);
            assert_eq!(repaired_wall(&synced, boot_at_capture), t);
            assert_eq!(
                wrong.wall_ms + 3 * WEEK,
                repaired_wall(&synced, boot_at_capture)
            );
        }
    }

    #[test]
    fn auto_trusts_an_unsynchronised_clock_when_no_time_service_can_sync_it() {
        let v = decide(
            ClockPolicy::Auto,
            HOUR,
            &reading(T, 1, false),
            &Facts::default(),
        );
        assert_eq!(v, Verdict::Trusted(Trust::NoTimeService));
        assert_eq!(v.to_string(), "unsynchronised, no time service: trusted");
    }

    #[test]
    fn auto_holds_while_unsynchronised_and_a_time_service_is_there() {
        let facts = Facts {
            time_service: true,
            ..Facts::default()
        };
        let v = decide(ClockPolicy::Auto, HOUR, &reading(T, 1, false), &facts);
        assert_eq!(v, Verdict::Hold(Hold::AwaitingSync));
        assert_eq!(
            decide(ClockPolicy::Auto, HOUR, &reading(T, 1, true), &facts),
            Verdict::Synced
        );
    }

    #[test]
    fn auto_holds_at_most_the_maximum_hold() {
        let facts = Facts {
            time_service: true,
            hold_started_boot_ms: Some(1_000),
            ..Facts::default()
        };
        let before = reading(T, 1_000 + HOUR - 1, false);
        let at = reading(T, 1_000 + HOUR, false);
        assert!(decide(ClockPolicy::Auto, HOUR, &before, &facts).holds());
        assert_eq!(
            decide(ClockPolicy::Auto, HOUR, &at, &facts),
            Verdict::Trusted(Trust::HoldExpired)
        );
    }

    /// Auto holds while the clock reads earlier than the database even without a time
    /// service.
    #[test]
    fn auto_holds_while_the_clock_reads_earlier_than_the_database() {
        let facts = Facts {
            high_water_ms: Some(T),
            ..Facts::default()
        };
        let behind = reading(T - 2_500, 1, false);
        let v = decide(ClockPolicy::Auto, HOUR, &behind, &facts);
        assert_eq!(v, Verdict::Hold(Hold::Behind { by_ms: 2_500 }));
        assert!(v.to_string().starts_with("3s behind"), "{v}");
        assert_eq!(
            decide(ClockPolicy::Auto, HOUR, &reading(T, 1, false), &facts),
            Verdict::Trusted(Trust::NoTimeService)
        );
    }

    #[test]
    fn auto_trusts_a_clock_synchronised_earlier_in_this_boot() {
        let facts = Facts {
            time_service: true,
            synced_this_boot: true,
            high_water_ms: Some(T + HOUR),
            ..Facts::default()
        };
        assert_eq!(
            decide(ClockPolicy::Auto, HOUR, &reading(T, 1, false), &facts),
            Verdict::Synced
        );
    }

    #[test]
    fn wait_holds_while_unsynchronised_whatever_else_and_trust_never_holds() {
        let expired = Facts {
            hold_started_boot_ms: Some(0),
            ..Facts::default()
        };
        let unsynced = reading(T, 10 * HOUR, false);
        assert_eq!(
            decide(ClockPolicy::Wait, HOUR, &unsynced, &expired),
            Verdict::Hold(Hold::AwaitingSync)
        );
        assert_eq!(
            decide(ClockPolicy::Wait, HOUR, &reading(T, 1, true), &expired),
            Verdict::Synced
        );
        let behind = Facts {
            time_service: true,
            high_water_ms: Some(T + HOUR),
            ..Facts::default()
        };
        assert_eq!(
            decide(ClockPolicy::Trust, HOUR, &unsynced, &behind),
            Verdict::Trusted(Trust::Configured)
        );
    }
}
