//! The VM test's faults, under the unit in a passive scan (where the kernel's
//! advertisement monitor must survive them): bluetoothd restarted, the adapter powered
//! off and on, the controller removed and plugged back, the daemon killed -9, every
//! monitor removed by another socket (handle 0), a controller that stops reporting.
//! Each ends with the tapes heard again within the ladder's bound, at most one monitor
//! in the kernel, and the journal saying what happened.

use std::time::Duration;

use tokio::time::Instant;

use super::cases::{counters, wait_delivered, MGMT_ACTIVE, MGMT_PASSIVE, T1};
use super::radio::Radio;
use super::stack::Gateway;

/// The ladder's bound in these configs (`give_up_secs`).
const BACK_WITHIN: Duration = Duration::from_secs(60);

/// Applies `fault`, moves T1 to a new counter, and waits until it is delivered; how
/// long that took.
fn heard_again_after(g: &Gateway, radio: &Radio, counter: u16, fault: &dyn Fn()) -> Duration {
    let t = Instant::now();
    fault();
    radio.cmd(&format!("tape {T1} counter={counter}"));
    wait_delivered(g, "mock", T1, counter, BACK_WITHIN);
    t.elapsed()
}

/// At most one monitor in the kernel (the daemon's).
fn one_monitor(g: &Gateway, after: &str) {
    let m = g.monitors();
    assert!(
        m.len() <= 1,
        "after {after}: the kernel holds monitors {m:?}"
    );
}

pub fn passive_faults(g: &Gateway, radio: &Radio) {
    let id = g.start_unit(MGMT_PASSIVE);
    radio.cmd(&format!("tape {T1} counter=30"));
    wait_delivered(g, "mock", T1, 30, Duration::from_secs(30));

    let took = heard_again_after(g, radio, 31, &|| {
        g.vm.ok("systemctl restart bluetooth");
    });
    one_monitor(g, "bluetoothd restarted");
    eprintln!(
        "vm_ble: passive, bluetoothd restarted: heard again after {:.1} s",
        took.as_secs_f64()
    );

    let took = heard_again_after(g, radio, 32, &|| {
        g.vm.ok("script -qc 'btmgmt power off' /dev/null; script -qc 'btmgmt power on' /dev/null");
    });
    one_monitor(g, "btmgmt power off, on");
    eprintln!(
        "vm_ble: passive, adapter powered off and on: heard again after {:.1} s",
        took.as_secs_f64()
    );

    let took = heard_again_after(g, radio, 33, &|| {
        radio.cmd("unplug");
        g.wait("hci0 gone", Duration::from_secs(10), || {
            (!g.vm.sh("test -e /sys/class/bluetooth/hci0").success()).then_some(())
        });
        radio.cmd("plug extended");
    });
    one_monitor(g, "the controller removed and plugged back");
    eprintln!(
        "vm_ble: passive, controller re-plugged: heard again after {:.1} s",
        took.as_secs_f64()
    );

    let took = heard_again_after(g, radio, 34, &|| {
        g.vm.ok("python3 /share/mgmt.py remove 0");
    });
    one_monitor(g, "every monitor removed (handle 0)");
    eprintln!(
        "vm_ble: passive, every monitor removed by another socket: heard again after {:.1} s",
        took.as_secs_f64()
    );

    let journal = g.journal(&id);
    for said in [
        "bluetoothd restarted",
        "was powered off",
        "advertisement monitor (passive scan) is gone",
        "scanning again",
    ] {
        assert!(
            journal.contains(said),
            "the journal says {said:?}:\n{}",
            g.unit_log()
        );
    }

    // Killed: systemd restarts it (Restart=on-failure, 5 s later); the monitor the
    // killed daemon left is removed by the next.
    let pid = g.main_pid();
    let took = heard_again_after(g, radio, 35, &|| {
        g.vm.ok(&format!("kill -9 {pid}"));
        g.wait("the unit restarted", Duration::from_secs(60), || {
            let now = g.main_pid();
            (now != pid && now != "0").then_some(())
        });
    });
    let m = g.monitors();
    assert_eq!(m.len(), 1, "after kill -9 and the restart: monitors {m:?}");
    let id =
        g.vm.ok("systemctl show -p InvocationID --value tapegate")
            .trim()
            .to_string();
    assert!(
        g.journal(&id).contains("an earlier run left"),
        "{}",
        g.unit_log()
    );
    eprintln!(
        "vm_ble: passive, killed -9: heard again after {:.1} s (restart included)",
        took.as_secs_f64()
    );

    g.vm.ok("systemctl stop tapegate");
    assert!(
        g.monitors().is_empty(),
        "a stopped daemon leaves no monitor"
    );
}

/// A controller that stops reporting while it answers every command (the radio's
/// `wedge`): the silence (`silence_secs = 10`) starts the ladder, whose restart of the
/// scan does not help; the power cycle before re-acquiring resets the controller.
pub fn wedged_controller(g: &Gateway, radio: &Radio) {
    for (mode, scanner, counter) in [("active", MGMT_ACTIVE, 40), ("passive", MGMT_PASSIVE, 42)] {
        let id = g.start_unit(scanner);
        radio.cmd(&format!("tape {T1} counter={counter}"));
        wait_delivered(g, "mock", T1, counter, Duration::from_secs(30));
        let took = heard_again_after(g, radio, counter + 1, &|| {
            radio.cmd("wedge");
        });
        let journal = g.journal(&id);
        assert!(journal.contains("no advert for"), "{}", g.unit_log());
        assert!(
            journal.contains("power-cycling the adapter"),
            "{}",
            g.unit_log()
        );
        let t1 = counters(&g.delivered("mock"), T1);
        eprintln!(
            "vm_ble: {mode}, a wedged controller: heard again after {:.1} s ({} captures of T1 so far)",
            took.as_secs_f64(),
            t1.len()
        );
    }
    g.vm.ok("systemctl stop tapegate");
}
