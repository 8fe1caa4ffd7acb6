//! The days a test of what depends on the date runs on ([`FIXED_DAYS`]), never the day
//! it happens to run: a [`Day`] moves the gateway's clock (the test clock file every
//! command and daemon of a [`Gateway`] reads) and the mock's ([`MockClock`]) to read it.
//! The test clock exists in debug builds only, so does this.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use tapegate::clock::fake::{FixedDay, FIXED_DAYS};

use super::Gateway;

/// A fixed day, begun: the offset that moves the machine's clock to read it, taken
/// when the test began on it (the clocks move on from there, as real ones do).
#[derive(Debug, Clone, Copy)]
pub struct Day {
    pub fixed: FixedDay,
    /// What the machine's clock is moved by.
    pub offset_ms: i64,
}

impl Day {
    /// Each fixed day in turn, begun as the test reaches it.
    pub fn each() -> impl Iterator<Item = Day> {
        FIXED_DAYS.into_iter().map(Day::begin)
    }

    /// One fixed day (a day like the one the suite once failed on), for a test that
    /// reads the date but whose outcome does not turn on it.
    pub fn one() -> Day {
        Day::begin(FIXED_DAYS[3])
    }

    /// Begins `fixed`, and says so on stderr: a failing test's output names the day
    /// it failed on.
    pub fn begin(fixed: FixedDay) -> Day {
        let day = Day {
            fixed,
            offset_ms: fixed.offset_ms_now(),
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
        write!(f, "{} ({})", self.fixed.rfc3339, self.fixed.why)
    }
}

/// Writes `text` to `path` by a rename, so that a process reading it at any moment
/// sees the old text or the new, never half.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
