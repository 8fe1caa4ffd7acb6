//! The run's two ends: an outbox of the older schema made by the earlier commit's own
//! binary (the migration phase restores it before each of its cuts), and the last boot,
//! where everything drains to the service and what it received is held against every
//! pending capture a snapshot showed.

use std::collections::BTreeSet;
use std::time::Duration;

use tapegate_mock::MockHandle;

use super::cycle::{user_version, Run, FULL};
use super::gateway::{self, Settings};
use super::witness::Key;
use crate::vm::{self, Vm};

/// Makes `/var/lib/tapegate-v3/outbox.db` with the earlier commit's binary (schema 3):
/// 20 s of the simulated fleet delivered (its readings kept, as that schema did), then
/// 20 s more held while the service is unreachable (the guest's link down), the daemon
/// stopped cleanly, and its readings multiplied. The guest's link is up when this starts.
pub fn older_schema(vm: &Vm, mock: &MockHandle) {
    let old = |seed: u32| {
        let text = gateway::config(
            Settings {
                sim_duration_secs: Some(20),
                ..FULL
            },
            mock,
        )
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
    old(1);
    let out = vm.run(
        "/share/old/usr/bin/tapegate run --until-drained --config /share/old.toml",
        Duration::from_secs(600),
    );
    assert!(out.success(), "the earlier binary's run: {}", out.stderr);
    vm.link_down();
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
    // 64 times the readings (102,400), as a dock's older outbox holds after weeks: the
    // migration's last step drops them, which widens the moment a cut can fall inside.
    let columns = "mac, qr_code, captured_at, decoded_at, rssi, temp, bat, raw";
    let double = format!("INSERT INTO readings({columns}) SELECT {columns} FROM readings;");
    vm.ok(&format!(
        "systemctl stop old && sqlite3 -bail /var/lib/tapegate-v3/outbox.db '{}' && \
         chown -R tapegate: /var/lib/tapegate-v3 && sync",
        double.repeat(6)
    ));
    let v = vm.ok("runuser -u tapegate -- sqlite3 /var/lib/tapegate-v3/outbox.db \
                   'PRAGMA user_version; SELECT COUNT(*) FROM readings; SELECT COUNT(*) FROM pending;'");
    vm::say(&format!(
        "vm_power: the older outbox (user_version, readings, pending): {v:?}"
    ));
    assert!(
        v.starts_with("3\n"),
        "the earlier commit's schema is 3: {v}"
    );
}

/// The last boot: the service up, the fleet ending, everything delivered, a clean stop,
/// no database moved aside in any boot's journal, and every capture a snapshot showed
/// pending received by the service or a dead letter (or evicted: the outbox counts
/// each capture it evicted). The service is on the host: its record of what it
/// answered outlives every cut.
pub fn finish(run: &mut Run, cuts: usize) {
    let vm = run.boot(true);
    run.after_boot(&vm);
    let configure = gateway::configure(
        &vm,
        Settings {
            sim_duration_secs: Some(5),
            ..FULL
        },
        &run.mock,
    );
    vm.ok(&format!("{configure} && systemctl start tapegate"));
    let drained = tokio::time::Instant::now();
    gateway::wait("everything delivered", Duration::from_secs(1200), || {
        let s = gateway::status(&vm.ok("tapegate status --json"));
        (s["pending"] == 0
            && vm
                .sh("journalctl -o cat -u tapegate -b 0 | grep -q 'simulated fleet ended'")
                .success())
        .then_some(s)
    });
    run.say(&format!(
        "the last boot drained in {:.0} s",
        drained.elapsed().as_secs_f64()
    ));
    vm.ok("systemctl stop tapegate");
    let code = vm.ok("systemctl show -p ExecMainStatus --value tapegate");
    assert_eq!(code.trim(), "0", "the daemon's clean stop");
    // Every boot's daemon, as far as its journal reached the disk before a cut.
    let said = vm
        .sh("journalctl --no-pager -o cat -u tapegate | grep -i 'moved aside\\|corrupt'")
        .stdout;
    assert!(said.trim().is_empty(), "the daemon said:\n{said}");
    let s = gateway::status(&vm.ok("tapegate status --json"));
    assert_eq!(user_version(&vm), gateway::SCHEMA, "the outbox migrated");
    let dead: BTreeSet<Key> = keys(&vm.ok(&format!(
        "runuser -u tapegate -- sqlite3 {} \"SELECT printf('P %012X %d %s', mac, captured_at / 1000, CASE typeof(packet) WHEN 'blob' THEN hex(packet) ELSE packet END) FROM dead_letters;\"",
        gateway::DB
    )));
    let received = received(&run.mock);
    let missing: Vec<&Key> = run
        .witnessed
        .iter()
        .filter(|k| !received.contains(*k) && !dead.contains(*k))
        .collect();
    let n = |k: &str| s[k].as_u64().unwrap_or(0) as usize;
    run.say(&format!(
        "{cuts} cuts; in the end {s}; the service received {} distinct captures; \
         of {} witnessed pending, {} not received (evicted {}); \
         lost per cut under durability = \"normal\": {:?}; schema found after each \
         migration cut: {:?}",
        received.len(),
        run.witnessed.len(),
        missing.len(),
        n("evicted"),
        run.normal_losses,
        run.migration_found
    ));
    assert!(
        missing.len() <= n("evicted"),
        "witnessed captures that never reached the service: {:?}",
        &missing[..missing.len().min(10)]
    );
    vm.power_off(Duration::from_secs(60));
}

fn keys(text: &str) -> BTreeSet<Key> {
    super::witness::Snapshot::parse(text).pending
}

/// Every capture the service answered with 200, over all boots.
fn received(mock: &MockHandle) -> BTreeSet<Key> {
    mock.received()
        .iter()
        .filter(|r| r.status == Some(200))
        .flat_map(|r| &r.items)
        .map(|i| {
            (
                i.mac_id.clone(),
                i.scan_time.parse().unwrap_or(0),
                i.ble_packet.clone(),
            )
        })
        .collect()
}
