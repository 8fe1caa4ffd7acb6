//! The gateway in the power-cut VM: the package installed by apt with its unit left
//! disabled (the test starts it, after looking at the database a boot found), the sim
//! source's config delivering to the mock service on the host (reached through the VM's
//! one forward when a phase has the service, unreachable otherwise), the witness, and
//! what a boot finds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tapegate_mock::MockHandle;

use super::witness::Snapshot;
use crate::vm::{self, Vm};

pub const DB: &str = "/var/lib/tapegate/outbox.db";
/// The outbox schema this tree's daemon writes.
pub const SCHEMA: i64 = 6;

/// How a cycle runs the daemon.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub durability: &'static str,
    pub max_pending: u64,
    /// The simulated fleet ends after this long (the last boot, to drain).
    pub sim_duration_secs: Option<u32>,
}

/// The unit's config: the simulated fleet in real time (200 tapes, an advert every
/// 2.5 s each, every packet new: 80 captures a second, and batches that can be full,
/// since a batch holds a MAC once), no dedup, fast retries, to the mock on the host.
pub fn config(s: Settings, mock: &MockHandle) -> String {
    format!(
        "[gateway]\nid = \"vm-power\"\nstate_dir = \"/var/lib/tapegate\"\nclock = \"trust\"\n{}\
         [flush]\nmax_delay_secs = 1\nbackoff_initial_ms = 200\nbackoff_max_secs = 1\n\
         [dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\
         [scanner]\nsource = \"sim\"\nsim_tapes = 200\nsim_interval_ms = 2500\n\
         sim_change_every = 1\nsim_others_ratio = 0.0\n{}\
         [outbox]\ndurability = \"{}\"\nmax_pending = {}\n",
        vm::service_toml(mock, 5),
        s.sim_duration_secs
            .map(|d| format!("sim_duration_secs = {d}\n"))
            .unwrap_or_default(),
        s.durability,
        s.max_pending
    )
}

/// Installs the package from the share by apt, the root-only password, and leaves the
/// unit disabled: after each boot the test reads the database before the daemon does.
pub fn install(vm: &Vm, mock: &MockHandle) {
    vm.apt_install("/share/tapegate.deb", false);
    let ppe = mock.environment("ppe").expect("the mock serves ppe");
    std::fs::write(vm.share().join("password"), format!("{}\n", ppe.password)).unwrap();
    vm.ok("install -m 600 /share/password /etc/tapegate/password && rm /share/password");
    // e2scrub's reaper (for LVM snapshots there are none of) took minutes of a boot.
    vm.ok("systemctl disable tapegate; systemctl mask e2scrub_reap.service; sync");
}

/// The shell lines that put `s` in place as the unit's config.
pub fn configure(vm: &Vm, s: Settings, mock: &MockHandle) -> &'static str {
    std::fs::write(vm.share().join("config.toml"), config(s, mock)).unwrap();
    "install -m 640 -g tapegate /share/config.toml /etc/tapegate/config.toml && sync"
}

/// The shell line that starts the witness for this boot (`/share/out/witness-<boot>.txt`).
pub fn witness(boot: usize) -> String {
    format!(
        "systemd-run --unit=witness --collect -p User=tapegate \
         /bin/bash /share/witness.sh /share/out/witness-{boot:03}.txt"
    )
}

/// What a boot found before the daemon started (`tests/vm/guest/boot-check.sh`).
pub struct Found {
    pub version: i64,
    pub snapshot: Snapshot,
}

/// The database a boot found, checked: no database moved aside (the file list; the
/// journal of every boot is read at the end), `PRAGMA quick_check` ok, and `tapegate
/// status` adding up once the schema is this version's. `None`: no outbox yet.
pub fn boot_check(vm: &Vm) -> Option<Found> {
    found(&vm.ok(&format!("/bin/bash /share/boot-check.sh {SCHEMA}")))
}

/// [`boot_check`]'s reading of what `boot-check.sh` printed in `out`.
pub fn found(out: &str) -> Option<Found> {
    let mut parts: BTreeMap<&str, String> = BTreeMap::new();
    let mut part = "";
    for line in out.lines() {
        if let Some(name) = line.strip_prefix("== ") {
            part = name;
            parts.entry(part).or_default();
        } else {
            let text = parts.entry(part).or_default();
            text.push_str(line);
            text.push('\n');
        }
    }
    if parts.contains_key("none") {
        return None;
    }
    let part = |name: &str| {
        parts
            .get(name)
            .unwrap_or_else(|| panic!("boot-check.sh printed no {name}:\n{out}"))
            .as_str()
    };
    assert!(
        !part("files").contains("corrupt"),
        "a database was moved aside:\n{}",
        part("files")
    );
    assert_eq!(part("quick_check").trim(), "ok", "quick_check");
    let version = part("user_version")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("user_version: {}", part("user_version")));
    if version == SCHEMA {
        status(part("status"));
    }
    Some(Found {
        version,
        snapshot: Snapshot::parse(part("snapshot")),
    })
}

/// `tapegate status --json` as printed, and that its counts add up.
pub fn status(json: &str) -> Value {
    let s: Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("status JSON ({e}): {json}"));
    let n = |k: &str| {
        s[k].as_u64()
            .unwrap_or_else(|| panic!("status has no {k}: {s}"))
    };
    assert_eq!(
        n("admitted"),
        n("delivered") + n("dead_letters") + n("evicted") + n("pending"),
        "admitted = delivered + dead_letters + evicted + pending: {s}"
    );
    s
}

/// Waits until `f` gives a value, asked every 250 ms (each ask is a trip into a VM
/// under TCG); panics with `what` after `limit`.
pub fn wait<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    crate::common::wait_for(what, limit, Duration::from_millis(250), f)
}
