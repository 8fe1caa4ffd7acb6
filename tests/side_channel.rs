//! The side channel's commands against a fake kernel that answers as the kernel does
//! (net/bluetooth/mgmt.c; Debian's 6.1 in the VM tests, `tests/vm_x86_64/ble.rs`) where its
//! behaviour cannot be provoked at will there: a Remove answered late, with Adds
//! answered Busy meanwhile; a kernel answering Busy until the adapter is power-cycled;
//! "Advertisement Monitor Removed" with handle 0; a monitor left by a killed daemon;
//! `tapegate scan` in a passive scan. The real binary scans the BlueZ stand-in, with
//! `TAPEGATE_MGMT_SOCKET` pointing at the fake kernel (`tests/bluez/kernel.rs`). And the
//! socket the unit's start step stores, handed by "systemd" to a daemon that reads
//! D-Bus.
//!
//! Needs the BlueZ stand-in, as `tests/ble.rs`.

mod common;
#[path = "bluez/kernel.rs"]
mod kernel;
#[path = "bluez/stand_in.rs"]
mod stand_in;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::*;
use kernel::{Answers, FakeKernel};
use stand_in::*;
use tapegate::source::ble::mgmt::wire::{self, build};

const PASSIVE: &str = "adverts = \"mgmt\"\nscan = \"passive\"\nsilence_secs = 0\ngive_up_secs = 30";

/// The tape's advert with `counter`, as the kernel reports it.
fn tape_ad(counter: u16) -> Vec<u8> {
    let mut d = build::ad(0x01, &[0x06]);
    let mut m = TAPE_CID.to_le_bytes().to_vec();
    m.extend(&tape_advert(tape_mac(0), 0, counter).manufacturer_data[0].1);
    d.extend(build::ad(0xFF, &m));
    d
}

/// Waits until the fake kernel has received `n` commands `opcode`.
fn wait_commands(k: &FakeKernel, opcode: u16, n: usize, d: &Tapegate) {
    if eventually(Duration::from_secs(20), || {
        (k.commands_of(opcode).len() >= n).then_some(())
    })
    .is_none()
    {
        panic!(
            "{} of {n} commands 0x{opcode:04x} within 20 s: {:?}\n{}",
            k.commands_of(opcode).len(),
            k.opcodes(),
            d.stderr()
        );
    }
}

/// The monitor commands (Add, Remove) the kernel was sent, in order.
fn monitor_commands(k: &FakeKernel) -> Vec<u16> {
    let monitor = [
        wire::OP_ADD_ADV_PATTERNS_MONITOR,
        wire::OP_REMOVE_ADV_MONITOR,
    ];
    k.opcodes()
        .into_iter()
        .filter(|o| monitor.contains(o))
        .collect()
}

/// A tape report through the monitor, then waits until `n` captures are admitted.
fn heard(k: &FakeKernel, g: &Gateway, d: &Tapegate, counter: u16, n: u64) {
    k.send(&build::monitor_found(
        0,
        0,
        tape_mac(1).octets(),
        -55,
        &tape_ad(counter),
    ));
    wait_admitted(g, n, d);
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_monitor_removed_with_handle_0_is_ours_removed_and_is_added_again() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(dir.path(), Answers::default());
    let g = Gateway::new(&ble_config(PASSIVE));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scan=passive", Duration::from_secs(15));
    heard(&k, &g, &d, 0, 1);
    // bluetoothd removes every monitor so (handle 0) when an adapter appears; the
    // kernel tells other sockets with handle 0 too.
    k.send(&build::frame(
        wire::EV_ADV_MONITOR_REMOVED,
        0,
        &0u16.to_le_bytes(),
    ));
    d.wait_log(
        "advertisement monitor (passive scan) is gone",
        Duration::from_secs(10),
    );
    wait_commands(&k, wire::OP_ADD_ADV_PATTERNS_MONITOR, 2, &d);
    d.wait_log("scanning again", Duration::from_secs(10));
    heard(&k, &g, &d, 1, 2);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    // The kernel may send "removed, handle 0" for a removal that came before our Add
    // (bluetoothd's reset racing the registration: a re-plugged controller on a real
    // kernel kept monitors [1, 2]), so ours is removed before the next Add.
    let monitor_commands = monitor_commands(&k);
    assert_eq!(
        &monitor_commands[..3],
        [
            wire::OP_ADD_ADV_PATTERNS_MONITOR,
            wire::OP_REMOVE_ADV_MONITOR,
            wire::OP_ADD_ADV_PATTERNS_MONITOR
        ],
        "{monitor_commands:?}"
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_restart_waits_for_the_remove_and_busy_is_asked_again_not_taken_for_a_refusal() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    // The kernel answers a Remove half a second late, and an Add meanwhile Busy.
    let k = FakeKernel::start(
        dir.path(),
        Answers {
            remove_takes: Duration::from_millis(500),
            ..Answers::default()
        },
    );
    let g = Gateway::new(&ble_config(PASSIVE));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scan=passive", Duration::from_secs(15));
    heard(&k, &g, &d, 0, 1);
    // The adapter powered off: the ladder restarts the scan, which replaces the
    // monitor (Remove, then Add).
    s.call(&format!("power {HCI} 0"));
    d.wait_log("scanning again", Duration::from_secs(15));
    heard(&k, &g, &d, 1, 2);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    let opcodes = monitor_commands(&k);
    assert_eq!(
        opcodes,
        [
            wire::OP_ADD_ADV_PATTERNS_MONITOR,
            wire::OP_REMOVE_ADV_MONITOR,
            wire::OP_ADD_ADV_PATTERNS_MONITOR,
            wire::OP_REMOVE_ADV_MONITOR,
        ],
        "one Add after the Remove's answer, none Busy; one Remove at the stop\n{log}"
    );
    // One step was enough: no re-acquisition, no refusal.
    assert!(!log.contains("did not help"), "{log}");
    assert!(!log.contains("refused"), "{log}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_kernel_answering_busy_for_good_is_power_cycled_and_the_scan_stays_passive() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(
        dir.path(),
        Answers {
            busy_until_power_cycle: true,
            ..Answers::default()
        },
    );
    let g = Gateway::new(&ble_config(PASSIVE));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scanning for BLE advertisements", Duration::from_secs(30));
    heard(&k, &g, &d, 0, 1);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(log.contains("scan=passive"), "{log}");
    assert!(!log.contains("instead of passively"), "{log}");
    let powered: Vec<Vec<u8>> = k
        .commands_of(kernel::OP_SET_POWERED)
        .into_iter()
        .map(|c| c[wire::HEADER_LEN..].to_vec())
        .collect();
    assert_eq!(powered, [vec![0], vec![1]], "off, then on\n{log}");
    assert!(log.contains("power-cycling the adapter"), "{log}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_monitor_left_by_a_killed_daemon_is_removed_at_the_next_start() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(
        dir.path(),
        Answers {
            monitor: Some(7),
            ..Answers::default()
        },
    );
    let g = Gateway::new(&ble_config(PASSIVE));
    let mut d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scan=passive", Duration::from_secs(15));
    heard(&k, &g, &d, 0, 1);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert_eq!(k.state.lock().unwrap().monitors, [7], "the kernel keeps it");
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scan=passive", Duration::from_secs(15));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    let removed = wire::command(wire::OP_REMOVE_ADV_MONITOR, 0, &7u16.to_le_bytes());
    let commands = k.commands();
    let first_remove = commands.iter().position(|c| *c == removed);
    let last_add = commands
        .iter()
        .rposition(|c| c[..2] == wire::OP_ADD_ADV_PATTERNS_MONITOR.to_le_bytes());
    assert!(
        first_remove.is_some() && first_remove < last_add,
        "the leaked monitor is removed before the new one is added: {:?}\n{log}",
        k.opcodes()
    );
    assert!(log.contains("an earlier run left"), "{log}");
    assert!(
        k.state.lock().unwrap().monitors.is_empty(),
        "none left after the stop"
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn tapegate_scan_scans_passively_with_the_products_monitor() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(dir.path(), Answers::default());
    let g = Gateway::new(&ble_config(PASSIVE));
    let mut d = s.tapegate_mgmt(&g, &["scan", "--duration", "4"], &k.path);
    wait_commands(&k, wire::OP_ADD_ADV_PATTERNS_MONITOR, 1, &d);
    k.send(&build::monitor_found(
        0,
        0,
        tape_mac(1).octets(),
        -55,
        &tape_ad(3),
    ));
    let out = d.stdout();
    let (status, log) = d.wait(Duration::from_secs(20));
    assert!(status.success(), "{log}");
    assert!(log.contains("scan=passive"), "{log}");
    assert!(!log.contains("passive scanning needs"), "{log}");
    assert!(out.contains(&tape_packet(3)), "{out}");
    // Stopping removes the monitor.
    assert_eq!(k.commands_of(wire::OP_REMOVE_ADV_MONITOR).len(), 1, "{log}");
}

/// A seqpacket pair: (the kernel's end, the end systemd would pass).
fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two descriptors that are then owned here.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made and are owned from here.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// The start step's socket is taken from systemd's store, and closed when adverts come
/// over D-Bus.
#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn the_start_steps_socket_is_taken_from_systemds_store_and_closed() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    // systemd's ends: the notify socket, and the stored management socket as fd 3.
    let notify_path = dir.path().join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_nonblocking(true).unwrap();
    let (kernel, stored) = seqpacket_pair();
    let g = Gateway::new(&ble_config("adverts = \"dbus\"\nsilence_secs = 0"));
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=tapegate-mgmt exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(["run", "--config"])
        .arg(g.config_path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", &s.address)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info");
    let raw = stored.as_raw_fd();
    // SAFETY: dup2 in the child before exec, onto fd 3 (no CLOEXEC on the copy).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = Tapegate::spawn(&mut cmd);
    drop(stored);
    d.wait_log("scanning for BLE advertisements", Duration::from_secs(20));
    // The daemon told systemd to drop the socket from the store...
    let mut said = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = notify.recv(&mut buf) {
        said.push_str(&String::from_utf8_lossy(&buf[..n]));
        said.push('\n');
    }
    assert!(
        said.contains("FDSTOREREMOVE=1") && said.contains("FDNAME=tapegate-mgmt"),
        "{said}\n{}",
        d.stderr()
    );
    // ...and closed its copy: the kernel's end sees the socket's last holder gone.
    let closed = eventually(Duration::from_secs(10), || {
        let mut byte = [0u8; 1];
        // SAFETY: recv into a one-byte buffer, without waiting.
        let n = unsafe {
            libc::recv(
                kernel.as_raw_fd(),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        };
        (n == 0).then_some(())
    });
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(
        closed.is_some(),
        "the daemon kept the stored socket open:\n{log}"
    );
    assert!(log.contains("adverts=dbus"), "{log}");
}
