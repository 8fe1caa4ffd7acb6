//! Where the clock's state comes from: the [`Clock`] trait and the machine's clock
//! ([`SystemClock`]).
//!
//! A clock is a value ([`SharedClock`]) made once where the process starts (the binary's
//! entry point, a test) and handed to every stage, store and command that reads the
//! time: the capture times, the hold decisions, the pages and the commands' ages all
//! read the one they were given, so a test that hands in a stand-in (in debug builds,
//! `fake.rs`) moves the whole daemon's idea of the time, as a real clock step would.

use std::path::Path;
use std::sync::Arc;

use crate::record::EpochMillis;

/// One look at the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The wall clock (epoch milliseconds), right or not.
    pub wall_ms: EpochMillis,
    /// `CLOCK_BOOTTIME` in milliseconds: counts from boot, through suspend, never steps.
    pub boot_ms: i64,
    /// Whether the kernel says the clock is synchronised (`adjtimex`: neither
    /// `TIME_ERROR` nor `STA_UNSYNC`).
    pub kernel_synced: bool,
}

impl Reading {
    /// The reading's wall time minus its boot time: add it to a boot time of this boot
    /// to get that moment's wall time by this reading's clock.
    pub fn offset_ms(&self) -> i64 {
        self.wall_ms.saturating_sub(self.boot_ms)
    }
}

/// The clock's state, behind one trait so that tests can drive it.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The wall clock (epoch milliseconds), right or not.
    fn wall_ms(&self) -> EpochMillis;
    /// `CLOCK_BOOTTIME` in milliseconds.
    fn boot_ms(&self) -> i64;
    /// Whether the kernel says the clock is synchronised.
    fn kernel_synced(&self) -> bool;
    /// Wall time, boot time and the kernel's sync state, read together.
    fn read(&self) -> Reading {
        Reading {
            wall_ms: self.wall_ms(),
            boot_ms: self.boot_ms(),
            kernel_synced: self.kernel_synced(),
        }
    }
    /// This boot's id (`/proc/sys/kernel/random/boot_id`); `None` when unreadable.
    fn boot_id(&self) -> Option<String>;
    /// The name of a running time service that can sync the clock, if there is one.
    fn time_service(&self) -> Option<String>;
}

/// The clock a process hands to what reads the time.
pub type SharedClock = Arc<dyn Clock>;

/// The machine's clock, as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// The machine's clock.
///
/// The time service is found by the names of running processes (`/proc/*/comm`), or,
/// where other users' processes are hidden (the unit's `ProtectProc=invisible`), by the
/// run-time files the services leave in `/run`:
/// `systemd-timesyncd`, `chronyd`, `ntpd` (classic, OpenNTPD, busybox), `ntpd-rs`'s
/// `ntp-daemon`, `htpdate`. What the hold waits for is something *running* that will
/// set the clock; `timedatectl`'s NTP property says only that a unit is enabled (and
/// needs D-Bus and timedated), and the services' run-time files differ by distribution
/// and some appear only after the first sync. Reading `/proc` needs no privilege and
/// costs a few hundred small reads, done only while the kernel says unsynchronised.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// Process names (as `/proc/PID/comm` shows them, cut at 15 bytes) of time services.
const TIME_SERVICES: &[&str] = &[
    "systemd-timesyn",
    "chronyd",
    "ntpd",
    "openntpd",
    "ntp-daemon",
    "htpdate",
];

// The kernel's ABI values (include/uapi/linux/timex.h), the same on every Linux
// target; libc does not export them for every C library.
const STA_UNSYNC: i32 = 0x0040;
const TIME_ERROR: i32 = 5;

impl Clock for SystemClock {
    fn wall_ms(&self) -> EpochMillis {
        system_wall_ms()
    }

    fn boot_ms(&self) -> i64 {
        boot_ms()
    }

    fn kernel_synced(&self) -> bool {
        kernel_synced()
    }

    fn boot_id(&self) -> Option<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    fn time_service(&self) -> Option<String> {
        running_time_service(Path::new("/proc"))
            .or_else(|| time_service_run_files(Path::new("/run")))
    }
}

pub(super) fn system_wall_ms() -> EpochMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as EpochMillis)
        .unwrap_or(0)
}

/// `CLOCK_BOOTTIME` in milliseconds.
pub(super) fn boot_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    // `time_t` and `c_long` are 32 bits on some 32-bit ARM targets.
    #[allow(clippy::unnecessary_cast)]
    let (sec, nsec) = (ts.tv_sec as i64, ts.tv_nsec as i64);
    sec * 1000 + nsec / 1_000_000
}

/// Whether the kernel reports the clock synchronised. `adjtimex` with no mode bits set
/// only reads, and needs no privilege.
fn kernel_synced() -> bool {
    // Under a seccomp filter (the packaged unit's SystemCallFilter=, which leaves @clock
    // out) adjtimex would kill the process: systemd-timesyncd's word is all there is.
    if under_seccomp_filter() {
        return Path::new(TIMESYNCD_SYNCHRONIZED).exists();
    }
    // SAFETY: an all-zero timex is valid (modes = 0: read only).
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `tx` is a valid timex for the call to fill.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        // Refused (a seccomp filter answering EPERM): systemd-timesyncd's own word,
        // the file it touches at each sync, is the next best.
        return Path::new(TIMESYNCD_SYNCHRONIZED).exists();
    }
    state != TIME_ERROR && (tx.status & STA_UNSYNC) == 0
}

/// Whether a seccomp filter confines this process (`Seccomp: 2` in /proc/self/status).
fn under_seccomp_filter() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status.lines().any(|l| {
            l.split_once(':')
                .is_some_and(|(k, v)| k == "Seccomp" && v.trim() == "2")
        })
    })
}

/// Touched by systemd-timesyncd (239 and later) whenever it has synchronised the clock.
const TIMESYNCD_SYNCHRONIZED: &str = "/run/systemd/timesync/synchronized";

/// The first known time service found running under `proc`.
fn running_time_service(proc: &Path) -> Option<String> {
    let entries = std::fs::read_dir(proc).ok()?;
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|comm| comm.trim().to_string())
        .find(|comm| TIME_SERVICES.contains(&comm.as_str()))
}

/// Run-time files a running time service leaves in `/run` (`run` here), for where
/// other users' processes are invisible: the packaged unit has `ProtectProc=invisible`,
/// and the time services run as their own users. systemd-timesyncd's unit has
/// `RuntimeDirectory=systemd/timesync` (there while it runs); chronyd and ntpd write
/// their PID files.
const TIME_SERVICE_RUN_FILES: &[(&str, &str)] = &[
    ("systemd/timesync", "systemd-timesyncd"),
    ("chrony/chronyd.pid", "chronyd"),
    ("chronyd.pid", "chronyd"),
    ("ntpd.pid", "ntpd"),
    ("openntpd.pid", "openntpd"),
];

fn time_service_run_files(run: &Path) -> Option<String> {
    TIME_SERVICE_RUN_FILES
        .iter()
        .find(|(file, _)| run.join(file).exists())
        .map(|(_, name)| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_service_whose_process_is_invisible_is_found_by_its_run_time_files() {
        let run = tempfile::tempdir().unwrap();
        assert_eq!(time_service_run_files(run.path()), None);
        std::fs::create_dir_all(run.path().join("systemd/timesync")).unwrap();
        assert_eq!(
            time_service_run_files(run.path()).as_deref(),
            Some("systemd-timesyncd")
        );
    }

    #[test]
    fn boot_time_moves_forward_and_the_boot_id_is_read() {
        let a = SystemClock.read();
        let b = SystemClock.read();
        assert!(a.boot_ms > 0 && b.boot_ms >= a.boot_ms);
        let id = SystemClock.boot_id().expect("a boot id on Linux");
        assert_eq!(id.len(), 36, "{id}");
    }

    #[test]
    fn a_time_service_is_found_by_its_process_name() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm) in [("1", "systemd\n"), ("42", "chronyd\n"), ("self", "x\n")] {
            std::fs::create_dir(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("comm"), comm).unwrap();
        }
        assert_eq!(running_time_service(dir.path()).as_deref(), Some("chronyd"));
        std::fs::write(dir.path().join("42").join("comm"), "bash\n").unwrap();
        assert_eq!(running_time_service(dir.path()), None);
    }
}
