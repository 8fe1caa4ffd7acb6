//! The run's two ends: an outbox of the older schema made by the earlier commit's own
//! binary (the migration phase restores it before each of its cuts), and the last boot,
//! where everything drains to the service and what it received is held against every
//! pending capture a snapshot showed.

use std::collections::BTreeSet;
use std::time::Duration;

use super::cycle::{user_version, Run, FULL};
use super::gateway::{self, Settings};
use super::witness::Key;
use crate::vm::Vm;

/// Makes `/var/lib/tapegate-v3/outbox.db` with the earlier commit's binary (schema 3):
/// 20 s of the simulated fleet delivered (its readings kept, as that schema did), then
/// 20 s more held while the service is down, the daemon stopped cleanly.
pub fn older_schema(vm: &Vm) {
    let old = |seed: u32| {
        let text = gateway::config(Settings {
            sim_duration_secs: Some(20),
            ..FULL
        })
        .replace("/var/lib/tapegate\"", "/var/lib/tapegate-v3\"")
        .replace(
            "password_file = \"password\"",
            "password_file = \"/etc/tapegate/password\"",
        )
        .replace(
            "sim_change_every = 1\n",
            &format!("sim_change_every = 1\nsim_realtime = false\nsim_seed = {seed}\n"),
        );
        std::fs::write(vm.share().join("old.toml"), text).unwrap();
    };
    gateway::start_mock(vm, 0);
    old(1);
    let out = vm.run(
        "/share/old/usr/bin/tapegate run --until-drained --config /share/old.toml",
        Duration::from_secs(600),
    );
    assert!(out.success(), "the earlier binary's run: {}", out.stderr);
    gateway::stop_mock(vm);
    old(2);
    vm.ok("systemd-run --unit=old /share/old/usr/bin/tapegate run --config /share/old.toml");
    gateway::wait(
        "the old daemon's fleet to end",
        Duration::from_secs(120),
        || {
            vm.ok("journalctl --no-pager -o cat -u old")
                .contains("simulated fleet ended")
                .then_some(())
        },
    );
    vm.ok("systemctl stop old; chown -R tapegate: /var/lib/tapegate-v3; sync");
    let v = vm.ok("runuser -u tapegate -- sqlite3 /var/lib/tapegate-v3/outbox.db \
                   'PRAGMA user_version; SELECT COUNT(*) FROM readings; SELECT COUNT(*) FROM pending;'");
    eprintln!("vm_power: the older outbox (user_version, readings, pending): {v:?}");
    assert!(
        v.starts_with("3\n"),
        "the earlier commit's schema is 3: {v}"
    );
}

/// The last boot: the service up, the fleet ending, everything delivered, a clean stop,
/// and every capture a snapshot showed pending received by the service (or a dead
/// letter, or within what the outbox counts as evicted or delivered without the
/// service's record of it: the mock's record is written every 200 ms and a cut took
/// its last lines).
pub fn finish(run: &mut Run, cuts: usize) {
    let vm = run.boot();
    run.after_boot(&vm);
    gateway::configure(
        &vm,
        Settings {
            sim_duration_secs: Some(5),
            ..FULL
        },
    );
    gateway::start_mock(&vm, run.boots);
    gateway::start(&vm);
    gateway::wait("everything delivered", Duration::from_secs(1200), || {
        let s = gateway::status(&vm);
        (s["pending"] == 0
            && vm
                .sh("journalctl -o cat -u tapegate -b 0 | grep -q 'simulated fleet ended'")
                .success())
        .then_some(s)
    });
    vm.ok("systemctl stop tapegate");
    let code = vm.ok("systemctl show -p ExecMainStatus --value tapegate");
    assert_eq!(code.trim(), "0", "the daemon's clean stop");
    let s = gateway::status(&vm);
    assert_eq!(user_version(&vm), 6, "the outbox migrated");
    let dead: BTreeSet<Key> = keys(&vm.ok(&format!(
        "runuser -u tapegate -- sqlite3 {} \"SELECT printf('P %012X %d %s', mac, captured_at / 1000, CASE typeof(packet) WHEN 'blob' THEN hex(packet) ELSE packet END) FROM dead_letters;\"",
        gateway::DB
    )));
    let received = received(run);
    let missing: Vec<&Key> = run
        .witnessed
        .iter()
        .filter(|k| !received.contains(*k) && !dead.contains(*k))
        .collect();
    let n = |k: &str| s[k].as_u64().unwrap_or(0) as usize;
    let unrecorded = n("delivered").saturating_sub(received.len());
    eprintln!(
        "vm_power: {cuts} cuts; in the end {s}; the service received {} distinct captures; \
         of {} witnessed pending, {} not received (evicted {}, delivered unrecorded {unrecorded}); \
         lost per cut under durability = \"normal\": {:?}",
        received.len(),
        run.witnessed.len(),
        missing.len(),
        n("evicted"),
        run.normal_losses
    );
    assert!(
        missing.len() <= n("evicted") + unrecorded,
        "witnessed captures that never reached the service: {:?}",
        &missing[..missing.len().min(10)]
    );
    vm.power_off(Duration::from_secs(60));
}

fn keys(text: &str) -> BTreeSet<Key> {
    super::witness::Snapshot::parse(text).pending
}

/// Every capture the mock services answered with 200, over all boots.
fn received(run: &Run) -> BTreeSet<Key> {
    let mut got = BTreeSet::new();
    for entry in std::fs::read_dir(run.share.join("out")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("mock-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["status"] != 200 {
                continue;
            }
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            got.insert((
                s("mac_id"),
                s("scan_time").parse().unwrap_or(0),
                s("ble_packet"),
            ));
        }
    }
    got
}
