//! The test clock (compiled in debug builds only, so a release binary holds none): a
//! [`Clock`] driven by a small file that a test rewrites, named by `TAPEGATE_FAKE_CLOCK`.
//! The binary's entry point asks [`from_env`] once and hands the clock it gets down as a
//! value; it moves the whole process's wall clock and sync state, as a real clock step
//! would; boot time stays the machine's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::source::{boot_ms, system_wall_ms, Clock, SharedClock, SystemClock};
use super::Reading;
use super::FAKE_CLOCK_ENV;
use crate::record::EpochMillis;

/// The test clock named by [`FAKE_CLOCK_ENV`], if the variable is set.
pub fn from_env() -> Option<SharedClock> {
    let path = std::env::var_os(FAKE_CLOCK_ENV)?;
    Some(Arc::new(FileClock::new(PathBuf::from(path))))
}

/// A clock for tests, driven by a small TOML file that the test rewrites:
///
/// ```toml
/// wall_offset_ms = -1814400000   # added to the machine's wall clock
/// synced = false                 # what adjtimex would say
/// time_service = true            # whether a time service runs
/// boot_id = "..."                # optional; the machine's by default
/// ```
///
/// Boot time is the machine's. The file is re-read at most every
/// [`FileClock::REREAD`]; a missing or unreadable file leaves the last state in force
/// (at first: the machine's clock, synchronised, no time service), with a warning.
#[derive(Debug)]
pub struct FileClock {
    path: PathBuf,
    /// When the file was last read (boot time, ms), and what it said.
    state: Mutex<(Option<i64>, FakeState)>,
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeState {
    #[serde(default)]
    wall_offset_ms: i64,
    #[serde(default = "yes")]
    synced: bool,
    #[serde(default)]
    time_service: bool,
    #[serde(default)]
    boot_id: Option<String>,
}

fn yes() -> bool {
    true
}

impl FileClock {
    /// How stale the file's state may be.
    pub const REREAD: Duration = Duration::from_millis(10);

    pub fn new(path: PathBuf) -> FileClock {
        FileClock {
            path,
            state: Mutex::new((
                None,
                FakeState {
                    synced: true,
                    ..FakeState::default()
                },
            )),
        }
    }

    fn state(&self) -> FakeState {
        let Ok(mut guard) = self.state.lock() else {
            return FakeState::default();
        };
        let (read_at, state) = &mut *guard;
        let now = boot_ms();
        if read_at.is_none() {
            // Said at the first reading, once the process's logging has started.
            tracing::warn!(path = %self.path.display(), "using the test clock from {FAKE_CLOCK_ENV}");
        }
        if read_at.is_none_or(|t| now - t >= Self::REREAD.as_millis() as i64) {
            *read_at = Some(now);
            match std::fs::read_to_string(&self.path)
                .map_err(|e| e.to_string())
                .and_then(|text| toml::from_str::<FakeState>(&text).map_err(|e| e.to_string()))
            {
                Ok(new) => *state = new,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "test clock file unreadable; keeping its last state")
                }
            }
        }
        state.clone()
    }
}

impl Clock for FileClock {
    fn wall_ms(&self) -> EpochMillis {
        system_wall_ms().saturating_add(self.state().wall_offset_ms)
    }

    fn boot_ms(&self) -> i64 {
        boot_ms()
    }

    fn kernel_synced(&self) -> bool {
        self.state().synced
    }

    fn boot_id(&self) -> Option<String> {
        self.state().boot_id.or_else(|| SystemClock.boot_id())
    }

    fn time_service(&self) -> Option<String> {
        self.state()
            .time_service
            .then(|| "test time service".to_string())
    }
}

/// A day a test of what depends on the date runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedDay {
    /// The moment, epoch milliseconds.
    pub wall_ms: EpochMillis,
    /// The same moment, for people (RFC 3339).
    pub rfc3339: &'static str,
    /// What makes the day a hard one.
    pub why: &'static str,
}

/// The days on which every test of what depends on the date runs (history's months
/// and year, the rate window's stamps, the clock's repair, retention by age), each test
/// under every one, so that no day of the year can pass or fail the suite: the
/// gateway's clock (the test clock file) and the mock's (`tapegate_mock::MockClock`
/// in the tests) are moved to read the day. Evening times leave a test an hour and a
/// half before its day ends.
pub const FIXED_DAYS: [FixedDay; 5] = [
    FixedDay {
        wall_ms: 1_769_898_600_000,
        rfc3339: "2026-01-31T22:30:00Z",
        why: "the end of a 31-day month",
    },
    FixedDay {
        wall_ms: 1_835_476_200_000,
        rfc3339: "2028-02-29T22:30:00Z",
        why: "the end of February in a leap year",
    },
    FixedDay {
        wall_ms: 1_798_756_200_000,
        rfc3339: "2026-12-31T22:30:00Z",
        why: "New Year's Eve",
    },
    FixedDay {
        wall_ms: 1_795_953_600_000,
        rfc3339: "2026-11-29T12:00:00Z",
        why: "a day whose last 58 days hold no whole 31-day month (the suite once failed on it)",
    },
    FixedDay {
        wall_ms: 1_788_436_800_000,
        rfc3339: "2026-09-03T12:00:00Z",
        why: "a day whose last 58 days hold a whole 31-day month (August)",
    },
];

/// A clock a test sets by hand: every reading is what the test last set, nothing moves
/// by itself (deterministic, for the keeper's and the stages' own tests).
#[derive(Debug)]
pub struct HandClock {
    boot_id: String,
    /// The reading, and whether a time service runs.
    state: Mutex<(Reading, bool)>,
}

impl HandClock {
    /// At wall and boot time 0, unsynchronised, no time service.
    pub fn new(boot_id: &str) -> HandClock {
        let reading = Reading {
            wall_ms: 0,
            boot_ms: 0,
            kernel_synced: false,
        };
        HandClock {
            boot_id: boot_id.to_string(),
            state: Mutex::new((reading, false)),
        }
    }

    /// Reading `wall_ms` at boot time 0, synchronised, no time service.
    pub fn at(wall_ms: EpochMillis) -> HandClock {
        let clock = HandClock::new("hand");
        clock.set(wall_ms, 0, true, false);
        clock
    }

    /// What every reading says from now on.
    pub fn set(&self, wall_ms: i64, boot_ms: i64, kernel_synced: bool, service: bool) {
        let reading = Reading {
            wall_ms,
            boot_ms,
            kernel_synced,
        };
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = (reading, service);
    }

    fn get(&self) -> (Reading, bool) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for HandClock {
    fn wall_ms(&self) -> EpochMillis {
        self.get().0.wall_ms
    }
    fn boot_ms(&self) -> i64 {
        self.get().0.boot_ms
    }
    fn kernel_synced(&self) -> bool {
        self.get().0.kernel_synced
    }
    fn boot_id(&self) -> Option<String> {
        Some(self.boot_id.clone())
    }
    fn time_service(&self) -> Option<String> {
        self.get().1.then(|| "chronyd".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fixed_day_says_the_moment_it_holds() {
        for day in FIXED_DAYS {
            assert_eq!(crate::clock::rfc3339(day.wall_ms), day.rfc3339);
        }
    }

    #[test]
    fn the_file_clock_follows_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clock.toml");
        std::fs::write(
            &path,
            "wall_offset_ms = -86400000\nsynced = false\ntime_service = true\nboot_id = \"b1\"\n",
        )
        .unwrap();
        let c = FileClock::new(path.clone());
        let r = c.read();
        assert!(!r.kernel_synced);
        assert!((system_wall_ms() - 86_400_000 - r.wall_ms).abs() < 5_000);
        assert_eq!(c.boot_id().as_deref(), Some("b1"));
        assert!(c.time_service().is_some());

        std::fs::write(&path, "synced = true\n").unwrap();
        std::thread::sleep(FileClock::REREAD); // the time under test: the re-read period
        let r = c.read();
        assert!(r.kernel_synced);
        assert!((system_wall_ms() - r.wall_ms).abs() < 5_000);
        assert!(c.time_service().is_none());
    }
}
