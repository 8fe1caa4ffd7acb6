//! The days a test of what depends on the date runs on ([`FIXED_DAYS`]), never the day
//! it happens to run: a [`Day`] moves the gateway's clock (the test clock file every
//! command and daemon of a [`Gateway`] reads) and the mock's (`MockClock`) to read it.
//! `TAPEGATE_TEST_DAYS` (RFC 3339 instants, comma-separated) runs the same tests on
//! other days instead: `TAPEGATE_TEST_DAYS=2030-03-31T23:00:00Z cargo test`.
//! The test clock exists in debug builds only, so does this.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use tapegate::clock::fake::{FixedDay, FIXED_DAYS};

use super::Gateway;

/// The variable that names other days to run on.
pub const TEST_DAYS_ENV: &str = "TAPEGATE_TEST_DAYS";

/// A day, begun: the offset that moves the machine's clock to read it, taken when the
/// test began on it (the clocks move on from there, as real ones do).
#[derive(Debug, Clone)]
pub struct Day {
    /// The moment the day begins at, epoch milliseconds.
    pub wall_ms: i64,
    /// The day for people, and why it is hard.
    pub label: String,
    /// What the machine's clock is moved by.
    pub offset_ms: i64,
}

impl Day {
    /// Each day in turn ([`FIXED_DAYS`], or those of [`TEST_DAYS_ENV`]), begun as the
    /// test reaches it.
    pub fn each() -> impl Iterator<Item = Day> {
        days()
            .into_iter()
            .map(|(wall_ms, label)| Day::begin(wall_ms, label))
    }

    /// One day (a day like the one the suite once failed on, or the first of
    /// [`TEST_DAYS_ENV`]), for a test that reads the date but whose outcome does not
    /// turn on it.
    pub fn one() -> Day {
        let mut days = days();
        let (wall_ms, label) = if std::env::var_os(TEST_DAYS_ENV).is_some() {
            days.swap_remove(0)
        } else {
            days.swap_remove(3)
        };
        Day::begin(wall_ms, label)
    }

    /// Begins the day of `wall_ms`, and says so on stderr: a failing test's output
    /// names the day it failed on.
    pub fn begin(wall_ms: i64, label: String) -> Day {
        let offset_ms = wall_ms - tapegate::clock::system().wall_ms();
        let day = Day {
            wall_ms,
            label,
            offset_ms,
        };
        eprintln!("-- on {day}");
        day
    }

    /// Now by this day's clock, in milliseconds.
    pub fn now_ms(&self) -> i64 {
        tapegate::clock::system().wall_ms() + self.offset_ms
    }

    /// Now by this day's clock.
    pub fn now(&self) -> Timestamp {
        tapegate::clock::timestamp(self.now_ms())
    }

    /// `days` times 24 hours before now, to the whole second (as the service's times
    /// are written).
    pub fn days_ago(&self, days: i64) -> Timestamp {
        let t = self.now() - SignedDuration::from_hours(24 * days);
        Timestamp::from_second(t.as_second()).unwrap_or(t)
    }

    /// The mock's clock on this day.
    #[cfg(feature = "mock")]
    pub fn mock_clock(&self) -> tapegate_mock::MockClock {
        tapegate_mock::MockClock::offset_ms(self.offset_ms)
    }

    /// The test clock file's text: this day, moved by `shift_ms` more, synchronised
    /// or not, with or without a time service.
    pub fn clock_file(&self, shift_ms: i64, synced: bool, time_service: bool) -> String {
        format!(
            "wall_offset_ms = {}\nsynced = {synced}\ntime_service = {time_service}\n",
            self.offset_ms + shift_ms
        )
    }

    /// Every command and daemon of `g` reads this day from now on, its clock as this
    /// machine's and CI's are: unsynchronised, with no time service, so trusted.
    pub fn set_on(&self, g: &Gateway) {
        write_atomically(&g.clock_path(), &self.clock_file(0, false, false));
    }
}

impl Day {
    /// A clock on this day for a daemon run in process by the test (the file clock of
    /// `g`, as its commands read).
    pub fn shared_clock(&self, g: &Gateway) -> tapegate::clock::SharedClock {
        self.set_on(g);
        std::sync::Arc::new(tapegate::clock::fake::FileClock::new(g.clock_path()))
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// The days to run on: [`TEST_DAYS_ENV`]'s, or else [`FIXED_DAYS`].
fn days() -> Vec<(i64, String)> {
    match std::env::var(TEST_DAYS_ENV) {
        Ok(list) => list
            .split(',')
            .map(|t| {
                let at: Timestamp = t.trim().parse().unwrap_or_else(|e| {
                    panic!("{TEST_DAYS_ENV}: {t:?} is not an RFC 3339 instant: {e}")
                });
                (at.as_millisecond(), format!("{at} (from {TEST_DAYS_ENV})"))
            })
            .collect(),
        Err(_) => FIXED_DAYS
            .iter()
            .map(|d: &FixedDay| (d.wall_ms, format!("{} ({})", d.rfc3339, d.why)))
            .collect(),
    }
}

/// Writes `text` to `path` by a rename, so that a process reading it at any moment
/// sees the old text or the new, never half.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
