//! The gateway in the power-cut VM: the package installed by apt with its unit left
//! disabled (the test starts it, after looking at the database a boot found), the sim
//! source's config, the mock service on the VM's loopback recording into the share, the
//! witness, and the checks of a boot.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::witness::Snapshot;
use crate::vm::Vm;

pub const DB: &str = "/var/lib/tapegate/outbox.db";
const PORT: u16 = 8080;

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
/// since a batch holds a MAC once), no dedup, fast retries, to the mock on loopback.
pub fn config(s: Settings) -> String {
    let env = tapegate_mock::MockEnvironment::demo();
    format!(
        "[gateway]\nid = \"vm-power\"\nstate_dir = \"/var/lib/tapegate\"\nclock = \"trust\"\n\
         [service]\nenvironment = \"ppe\"\nrequest_timeout_secs = 5\n\
         [service.environments.ppe]\nbase_url = \"http://127.0.0.1:{PORT}/ppe/\"\n\
         auth_url = \"http://127.0.0.1:{PORT}/ppe/oauth/token\"\nclient_id = \"{}\"\n\
         audience = \"{}\"\nusername = \"{}\"\npassword_file = \"password\"\n\
         customer_id = \"{}\"\nauthorized_groups = \"{}\"\n\
         [flush]\nmax_delay_secs = 1\nbackoff_initial_ms = 200\nbackoff_max_secs = 1\n\
         [dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\
         [scanner]\nsource = \"sim\"\nsim_tapes = 200\nsim_interval_ms = 2500\n\
         sim_change_every = 1\nsim_others_ratio = 0.0\n{}\
         [outbox]\ndurability = \"{}\"\nmax_pending = {}\n",
        env.client_id,
        env.audience,
        env.username,
        env.customer_id,
        env.authorized_groups,
        s.sim_duration_secs
            .map(|d| format!("sim_duration_secs = {d}\n"))
            .unwrap_or_default(),
        s.durability,
        s.max_pending
    )
}

/// Installs the package from the share by apt, the root-only password, and leaves the
/// unit disabled: after each boot the test reads the database before the daemon does.
pub fn install(vm: &Vm) {
    let out = vm.run(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q /share/tapegate.deb",
        Duration::from_secs(900),
    );
    assert!(
        out.success(),
        "apt-get install: {}\n{}",
        out.stdout,
        out.stderr
    );
    vm.ok("umask 077; printf '%s\\n' demo-password > /etc/tapegate/password");
    // e2scrub's reaper (for LVM snapshots there are none of) took minutes of a boot.
    vm.ok("systemctl disable tapegate; systemctl mask e2scrub_reap.service; sync");
}

/// Writes the unit's config.
pub fn configure(vm: &Vm, s: Settings) {
    std::fs::write(vm.share().join("config.toml"), config(s)).unwrap();
    vm.ok("install -m 640 -g tapegate /share/config.toml /etc/tapegate/config.toml && sync");
}

/// Starts the mock service (recording into `/share/out/mock-<boot>.jsonl`) and waits
/// for its port.
pub fn start_mock(vm: &Vm, boot: usize) {
    vm.ok(&format!(
        "systemd-run --unit=mock --collect /share/bin/tapegate mock --listen 127.0.0.1:{PORT} \
         --record /share/out/mock-{boot:03}.jsonl"
    ));
    wait("the mock service", Duration::from_secs(120), || {
        vm.sh(&format!("exec 3<>/dev/tcp/127.0.0.1/{PORT}"))
            .success()
            .then_some(())
    });
}

pub fn stop_mock(vm: &Vm) {
    vm.ok("systemctl stop mock 2>/dev/null; true");
}

/// Starts the witness for this boot (`/share/out/witness-<boot>.txt`).
pub fn start_witness(vm: &Vm, boot: usize) {
    vm.ok(&format!(
        "systemd-run --unit=witness --collect -p User=tapegate \
         /bin/bash /share/witness.sh /share/out/witness-{boot:03}.txt"
    ));
}

/// The database as the witness reads it, now (the daemon not running).
pub fn read_db(vm: &Vm) -> Snapshot {
    vm.ok("rm -f /tmp/snap; cd /tmp && runuser -u tapegate -- /bin/bash /share/witness.sh /tmp/snap once");
    Snapshot::parse(&vm.ok("cat /tmp/snap 2>/dev/null; true"))
}

/// What a boot finds: no database moved aside (the file list and the journal of the
/// boot before), and `PRAGMA quick_check`'s answer.
pub fn integrity(vm: &Vm) -> String {
    let files = vm.ok("ls -a /var/lib/tapegate");
    assert!(
        !files.contains("corrupt"),
        "a database was moved aside:\n{files}"
    );
    let moved = vm
        .sh("journalctl --no-pager -o cat -u tapegate | grep -i 'moved aside\\|corrupt'")
        .stdout;
    assert!(moved.trim().is_empty(), "the daemon said:\n{moved}");
    let check = vm.ok(&format!(
        "runuser -u tapegate -- sqlite3 -bail {DB} 'PRAGMA quick_check;'"
    ));
    assert_eq!(check.trim(), "ok", "quick_check: {check}");
    check.trim().to_string()
}

/// `tapegate status --json`, and that its counts add up.
pub fn status(vm: &Vm) -> Value {
    let s: Value = serde_json::from_str(&vm.ok("tapegate status --json")).expect("status JSON");
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

/// Starts the daemon and waits for READY (the unit is `Type=notify`).
pub fn start(vm: &Vm) {
    vm.ok("systemctl start tapegate");
}

pub fn wait<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
