//! The gateway's side of the VM: the package installed by apt, the unit configured and
//! (re)started, the mock services that stand for the tracking service on the VM's own
//! loopback (the `mock` binary of this build, from the share; each records what it
//! received into the share), the journal, `tapegate status`, the HCI trace.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::vm::Vm;

/// The mock service's port for the unit, and for a second daemon run by hand.
pub const UNIT_PORT: u16 = 8080;
pub const HAND_PORT: u16 = 8081;
/// Dedup in most cases: an unchanged packet again after 10 s, no interval.
pub const DEDUP: &str = "window_secs = 10\nmin_interval_secs = 0";

/// What the tracking service received: one decode item.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Item {
    pub mac_id: String,
    pub ble_packet: String,
    /// Capture time, whole epoch seconds.
    pub scan_time: String,
    pub status: Option<u16>,
}

impl Item {
    pub fn scan_secs(&self) -> i64 {
        self.scan_time.parse().unwrap_or(0)
    }

    /// The tape payload's counter (bytes 4 and 5 of the packet, little-endian).
    pub fn counter(&self) -> Option<u16> {
        let b = hex::decode(&self.ble_packet).ok()?;
        (b.len() == 13 && b[..4] == [0xF7, 0x0E, 0x49, 0x56])
            .then(|| u16::from_le_bytes([b[4], b[5]]))
    }
}

/// A MAC as the service gets it (`C0FFEE000001`).
pub fn plain(mac: &str) -> String {
    mac.replace(':', "").to_uppercase()
}

pub struct Gateway<'a> {
    pub vm: &'a Vm,
}

impl<'a> Gateway<'a> {
    /// Installs the package from the share as an installer would (`apt-get install`
    /// of the `.deb`), the root-only password file, and starts the mock services.
    pub fn install(vm: &'a Vm) -> Gateway<'a> {
        vm.ok("DEBIAN_FRONTEND=noninteractive apt-get install -y -q /share/tapegate.deb");
        vm.ok("umask 077; printf '%s\\n' demo-password > /etc/tapegate/password");
        for (unit, port) in [("mock", UNIT_PORT), ("mock-hand", HAND_PORT)] {
            vm.ok(&format!(
                "systemd-run --unit={unit} --collect /share/bin/tapegate mock \
                 --listen 127.0.0.1:{port} --record /share/out/{unit}.jsonl"
            ));
        }
        let g = Gateway { vm };
        g.wait("the mock services", Duration::from_secs(30), || {
            let out = vm.sh("exec 3<>/dev/tcp/127.0.0.1/8080 && exec 4<>/dev/tcp/127.0.0.1/8081");
            out.success().then_some(())
        });
        g
    }

    /// A gateway config delivering to the mock on `port`, with `scanner` (lines of
    /// `[scanner]`) and `dedup` (lines of `[dedup]`); `state_dir` and the password file
    /// as given (`password`: the unit's credential).
    pub fn config(
        port: u16,
        (id, state_dir, password): (&str, &str, &str),
        scanner: &str,
        dedup: &str,
    ) -> String {
        let env = tapegate_mock::MockEnvironment::demo();
        format!(
            "[gateway]\nid = \"{id}\"\nstate_dir = \"{state_dir}\"\nclock = \"trust\"\n\
             [service]\nenvironment = \"ppe\"\nrequest_timeout_secs = 5\n\
             [service.environments.ppe]\nbase_url = \"http://127.0.0.1:{port}/ppe/\"\n\
             auth_url = \"http://127.0.0.1:{port}/ppe/oauth/token\"\nclient_id = \"{}\"\n\
             audience = \"{}\"\nusername = \"{}\"\npassword_file = \"{password}\"\n\
             customer_id = \"{}\"\nauthorized_groups = \"{}\"\n\
             [flush]\nmax_delay_secs = 1\nbackoff_initial_ms = 200\nbackoff_max_secs = 2\n\
             [dedup]\n{dedup}\n[scanner]\nsource = \"ble\"\n{scanner}\n",
            env.client_id, env.audience, env.username, env.customer_id, env.authorized_groups
        )
    }

    /// Configures the unit with `scanner` (and dedup: an unchanged packet again after
    /// 10 s, no interval), (re)starts it, and waits until it scans; the start's
    /// invocation id.
    pub fn start_unit(&self, scanner: &str) -> String {
        self.start_unit_with(scanner, DEDUP)
    }

    /// [`Gateway::start_unit`] with `dedup` (lines of `[dedup]`).
    pub fn start_unit_with(&self, scanner: &str, dedup: &str) -> String {
        let text = Self::config(
            UNIT_PORT,
            ("vm-dock", "/var/lib/tapegate", "password"),
            scanner,
            dedup,
        );
        std::fs::write(self.vm.share().join("config.toml"), text).unwrap();
        self.vm
            .ok("install -m 640 -g tapegate /share/config.toml /etc/tapegate/config.toml");
        self.vm.ok("systemctl restart tapegate");
        let id = self
            .vm
            .ok("systemctl show -p InvocationID --value tapegate")
            .trim()
            .to_string();
        self.wait_logged(
            &id,
            "scanning for BLE advertisements",
            Duration::from_secs(60),
        );
        id
    }

    /// A second daemon, run by hand as root beside the unit (`/share/hand.toml`, its own
    /// state directory, delivering to the mock on [`HAND_PORT`]), started and scanning;
    /// its invocation id.
    pub fn start_hand(&self, scanner: &str) -> String {
        let text = Self::config(
            HAND_PORT,
            (
                "vm-hand",
                "/var/lib/tapegate-hand",
                "/etc/tapegate/password",
            ),
            scanner,
            DEDUP,
        );
        std::fs::write(self.vm.share().join("hand.toml"), text).unwrap();
        self.vm
            .ok("systemd-run --unit=hand tapegate run --config /share/hand.toml");
        let id = self
            .vm
            .ok("systemctl show -p InvocationID --value hand")
            .trim()
            .to_string();
        self.wait_logged(
            &id,
            "scanning for BLE advertisements",
            Duration::from_secs(60),
        );
        id
    }

    /// Stops the daemon run by hand.
    pub fn stop_hand(&self, _id: &str) {
        self.vm
            .ok("systemctl stop hand; systemctl reset-failed hand 2>/dev/null; true");
    }

    /// How many descriptors the unit's file descriptor store holds.
    pub fn fd_store(&self) -> String {
        self.vm
            .ok("systemctl show -p NFileDescriptorStore --value tapegate")
            .trim()
            .to_string()
    }

    /// The unit's journal of invocation `id`, every field of each record (`MESSAGE=`,
    /// then tracing's fields in upper case: `SCAN=passive`).
    pub fn journal(&self, id: &str) -> String {
        self.vm.ok(&format!(
            "journalctl --no-pager -o verbose _SYSTEMD_INVOCATION_ID={id}"
        ))
    }

    /// Waits until the journal of invocation `id` says `what`.
    pub fn wait_logged(&self, id: &str, what: &str, limit: Duration) {
        let found = self.try_wait(limit, || self.journal(id).contains(what).then_some(()));
        if found.is_none() {
            panic!(
                "the unit did not log {what:?} within {limit:?}:\n{}",
                self.unit_log()
            );
        }
    }

    /// The unit's journal since the VM booted (for failures).
    pub fn unit_log(&self) -> String {
        self.vm
            .sh("journalctl --no-pager -o short-monotonic -u tapegate -n 80")
            .stdout
    }

    /// `tapegate status --json`.
    pub fn status(&self) -> Value {
        serde_json::from_str(&self.vm.ok("tapegate status --json")).expect("status JSON")
    }

    /// What the mock `unit` (`mock` or `mock-hand`) received so far.
    pub fn delivered(&self, unit: &str) -> Vec<Item> {
        let path: PathBuf = self.vm.share().join(format!("out/{unit}.jsonl"));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until `f` gives a value (panics with the unit's journal after `limit`).
    pub fn wait<T>(&self, what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
        match self.try_wait(limit, f) {
            Some(v) => v,
            None => panic!(
                "gave up after {limit:?} waiting for {what}:\n{}",
                self.unit_log()
            ),
        }
    }

    pub fn try_wait<T>(&self, limit: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
        crate::common::eventually_every(limit, Duration::from_millis(250), f)
    }

    /// The advertisement monitors the kernel holds on hci0.
    pub fn monitors(&self) -> Vec<u16> {
        let v: Value =
            serde_json::from_str(&self.vm.ok("python3 /share/mgmt.py monitors")).unwrap();
        v["handles"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_u64())
                    .map(|h| h as u16)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The main PID of the unit.
    pub fn main_pid(&self) -> String {
        self.vm
            .ok("systemctl show -p MainPID --value tapegate")
            .trim()
            .to_string()
    }
}

/// An HCI trace (`btmon -w`) taken while `f` runs, decoded by the guest's btmon.
pub fn traced<T>(vm: &Vm, name: &str, f: impl FnOnce() -> T) -> (T, String) {
    let file = format!("/share/out/{name}.btsnoop");
    vm.ok(&format!(
        "systemd-run --unit=btmon-{name} --collect btmon -w {file}; sleep 0.5"
    ));
    let value = f();
    vm.ok(&format!("systemctl stop btmon-{name}"));
    let text = vm.ok(&format!(
        "btmon -r {file} 2>/dev/null | sed 's/\\x1b\\[[0-9;]*m//g'"
    ));
    (value, text)
}
