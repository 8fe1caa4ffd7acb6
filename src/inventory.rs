/*!
The inventory: what a gateway is and runs, for a fleet that wants to see drift in one
query. Version and git commit, the hash of the effective configuration
([`crate::config::effective::hash`]), when the daemon started and on which boot, the
kernel, the OS, BlueZ's version and the adapter.
It touches the config (its hash), the clock and the machine's facts.

The daemon gathers it at start (and again after a reload that changed the config),
records it in the state database (`meta` key `inventory`) and shows it three ways:
`tapegate status --json` (`inventory`, with `uptime_secs` while that daemon runs),
`/metrics` as `tapegate_inventory_info{...} 1` plus `tapegate_start_time_seconds`, and
so in the pushed telemetry. One PromQL query then shows a fleet's versions and configs:
`count by (version, config_hash) (tapegate_inventory_info)`.
*/

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::rfc3339;
use crate::config::{Config, SourceKind};
use crate::record::EpochMillis;

/// The git commit this binary was built from (`build.rs`), or "unknown".
pub const COMMIT: &str = match option_env!("TAPEGATE_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// What a gateway is and runs (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub version: String,
    pub commit: String,
    /// [`crate::config::effective::hash`] of the config the daemon runs with.
    pub config_hash: String,
    pub gateway_id: String,
    /// When the daemon started (RFC 3339) and its epoch milliseconds.
    pub started_at: String,
    pub started_at_ms: EpochMillis,
    /// The daemon's process id (to tell whether it still runs).
    pub pid: u32,
    /// `/proc/sys/kernel/random/boot_id` at start.
    pub boot_id: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os: String,
    pub arch: String,
    /// `bluetoothd --version`, or "unknown" (not installed, not found).
    pub bluez: String,
    /// The adapter the `ble` source uses (configured, or the first the kernel has), or
    /// "none".
    pub adapter: String,
    /// `scanner.source`.
    pub source: String,
}

/// Where BlueZ's daemon is on Debian and its relatives, newest layout first.
const BLUETOOTHD: &[&str] = &[
    "/usr/libexec/bluetooth/bluetoothd",
    "/usr/lib/bluetooth/bluetoothd",
    "/usr/sbin/bluetoothd",
];

impl Inventory {
    /// This machine and `config`, for a daemon started at `started_at`. Blocking: it
    /// runs `bluetoothd --version` (bounded to 2 s).
    pub fn gather(config: &Config, started_at: EpochMillis) -> Inventory {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".into())
        };
        Inventory {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: COMMIT.into(),
            config_hash: crate::config::effective::hash(config),
            gateway_id: config.gateway.id.clone(),
            started_at: rfc3339(started_at),
            started_at_ms: started_at,
            pid: std::process::id(),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            kernel: read("/proc/sys/kernel/osrelease"),
            os: os_name(&read("/etc/os-release")),
            arch: std::env::consts::ARCH.into(),
            bluez: bluez_version(),
            adapter: adapter(config, Path::new("/sys/class/bluetooth")),
            source: config.scanner.source.name().into(),
        }
    }

    /// The labels of `tapegate_inventory_info`.
    pub fn labels(&self) -> Vec<(String, String)> {
        [
            ("version", &self.version),
            ("commit", &self.commit),
            ("config_hash", &self.config_hash),
            ("gateway_id", &self.gateway_id),
            ("boot_id", &self.boot_id),
            ("kernel", &self.kernel),
            ("os", &self.os),
            ("arch", &self.arch),
            ("bluez", &self.bluez),
            ("adapter", &self.adapter),
            ("source", &self.source),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
    }

    /// Whether the daemon that recorded this inventory still runs: same boot, and its
    /// process is alive.
    pub fn daemon_running(&self) -> bool {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        if boot != self.boot_id || self.pid == 0 {
            return false;
        }
        // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
        let r = unsafe { libc::kill(self.pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

/// `PRETTY_NAME` of an os-release text.
fn os_name(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The adapter of the `ble` source: as configured, else the first the kernel lists in
/// `sysfs` (`hci0`), else "none"; "none" for the other sources.
fn adapter(config: &Config, sysfs: &Path) -> String {
    if config.scanner.source != SourceKind::Ble {
        return "none".into();
    }
    if let Some(a) = &config.scanner.adapter {
        return a.clone();
    }
    let mut names: Vec<String> = std::fs::read_dir(sysfs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hci") && !n.contains(':'))
        .collect();
    names.sort();
    names.into_iter().next().unwrap_or_else(|| "none".into())
}

/// `bluetoothd --version` ("5.66"), or "unknown".
pub fn bluez_version() -> String {
    BLUETOOTHD
        .iter()
        .filter(|p| Path::new(p).exists())
        .find_map(|p| run_bounded(p, &["--version"], Duration::from_secs(2)))
        .and_then(|out| out.lines().next().map(|l| l.trim().to_string()))
        .filter(|v| !v.is_empty() && v.len() <= 32)
        .unwrap_or_else(|| "unknown".into())
}

/// The stdout of `program args`, if it exits 0 within `limit`.
fn run_bounded(program: &str, args: &[&str], limit: Duration) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if tokio::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::parse;

    #[test]
    fn the_inventory_of_this_machine_names_every_part() {
        let c = parse("[scanner]\nsource = \"sim\"\n", &[]).unwrap();
        let inv = Inventory::gather(&c, 1_763_719_200_000);
        assert_eq!(inv.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(inv.config_hash, crate::config::effective::hash(&c));
        assert_eq!(inv.started_at, "2025-11-21T10:00:00Z");
        assert_eq!(inv.adapter, "none");
        assert_eq!(inv.source, "sim");
        assert_ne!(inv.kernel, "unknown");
        assert_eq!(inv.boot_id.len(), 36, "{}", inv.boot_id);
        assert!(inv.daemon_running(), "this process runs");
        let gone = Inventory {
            pid: u32::MAX / 2,
            ..inv.clone()
        };
        assert!(!gone.daemon_running());
        let labels = inv.labels();
        assert!(labels
            .iter()
            .any(|(k, v)| k == "config_hash" && v == &inv.config_hash));
    }

    #[test]
    fn the_adapter_is_the_configured_one_or_the_first_the_kernel_lists() {
        let dir = tempfile::tempdir().unwrap();
        let ble = parse("", &[]).unwrap();
        assert_eq!(adapter(&ble, dir.path()), "none");
        for name in ["hci1", "hci0", "hci0:64"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(adapter(&ble, dir.path()), "hci0");
        let named = parse("[scanner]\nadapter = \"hci7\"\n", &[]).unwrap();
        assert_eq!(adapter(&named, dir.path()), "hci7");
        assert_eq!(
            os_name("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
    }
}
