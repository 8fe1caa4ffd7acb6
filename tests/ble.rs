//! End-to-end: the real binary scans a BlueZ stand-in (python-dbusmock's `bluez5`
//! template on a private D-Bus bus, driven by `tests/bluez/driver.py`, see
//! `tests/bluez/stand_in.rs`) with `source = "ble"`, and its captures are read back from
//! the real SQLite outbox. No kernel here has Bluetooth, so these run the D-Bus path
//! (`scanner.adverts = "auto"` finds no management socket); the side channel's reader is
//! tested in `tests/mgmt.rs`, and the daemon on it in `side_channel_*` below.
//!
//! Needs `dbus-daemon` and `/usr/bin/python3` with the `dbusmock` module (Debian:
//! `apt-get install dbus python3-dbusmock`). Where build.rs found them missing, these
//! tests are ignored with that reason (`cargo test` lists them); under CI (`CI` set)
//! they are never ignored, and fail without them.

mod common;
#[path = "bluez/kernel.rs"]
mod kernel;
#[path = "bluez/stand_in.rs"]
mod stand_in;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use kernel::{Answers, FakeKernel};
use stand_in::*;
use tapegate::outbox::{PendingCapture, StateReader};
use tapegate::record::{hex_lower, hex_upper, Advertisement, Mac};
use tapegate::source::ble::mgmt::wire::{self, build};

/// The packets captured per MAC, in capture order.
fn captured(g: &Gateway) -> Vec<(Mac, String)> {
    packets(g.store().pending_captures().unwrap())
}

/// The packets captured so far, read while the daemon runs (none while it has not yet
/// created the outbox or the read fails).
fn captured_so_far(g: &Gateway) -> Vec<(Mac, String)> {
    match StateReader::open(&g.state_dir()) {
        Ok(Some(store)) => store.pending_captures().map(packets).unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn packets(pending: Vec<PendingCapture>) -> Vec<(Mac, String)> {
    pending
        .into_iter()
        .map(|p| (p.capture.mac, p.capture.packet))
        .collect()
}

fn of(caps: &[(Mac, String)], mac: Mac) -> Vec<String> {
    caps.iter()
        .filter(|(m, _)| *m == mac)
        .map(|(_, p)| p.clone())
        .collect()
}

const APPLE: Mac = Mac::new([0x11, 0x22, 0x33, 0x44, 0x55, 0x01]);
const BEACON: Mac = Mac::new([0x11, 0x22, 0x33, 0x44, 0x55, 0x02]);

/// A tape heard after the adverts a test is about, as a barrier: the stand-in's signals
/// reach the daemon in the order it sent them (one stream for new devices, one for
/// changed properties) and every stage keeps that order, so once the sentinel's advert
/// is captured, every advert of the same kind sent before it has been handled, and
/// nothing more comes of them. The sentinel is left out of what the tests count.
const SENTINEL: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x99]);

/// Waits until `heard()` holds the sentinel's packet of `counter` (panics with the log
/// after 30 s, an upper bound for a loaded machine).
fn wait_sentinel(counter: u16, d: &Tapegate, heard: impl Fn() -> Vec<(Mac, String)>) {
    let packet = tape_packet(counter);
    let seen = eventually(Duration::from_secs(30), || {
        of(&heard(), SENTINEL).contains(&packet).then_some(())
    });
    if seen.is_none() {
        panic!(
            "the sentinel's packet {counter} was not heard within 30 s:\n{}",
            d.stderr()
        );
    }
}

/// The adverts recorded in `path` so far, as (MAC, packet as the tape product sends it).
fn recorded(path: &Path) -> Vec<(Mac, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| Advertisement::from_record(l).ok())
        .map(|a| {
            let packet = a
                .manufacturer_data
                .first()
                .map_or_else(String::new, |(id, d)| {
                    let mut bytes = id.to_le_bytes().to_vec();
                    bytes.extend_from_slice(d);
                    hex_upper(&bytes)
                });
            (a.mac, packet)
        })
        .collect()
}

fn without_sentinel(caps: Vec<(Mac, String)>) -> Vec<(Mac, String)> {
    caps.into_iter().filter(|(m, _)| *m != SENTINEL).collect()
}

// ---------------------------------------------------------------------------------------

#[cfg(debug_assertions)]
#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn tape_adverts_heard_over_bluez_become_exactly_the_expected_captures() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let g = Gateway::new(&ble_config(""));
    // Captures are stamped by the daemon's clock.
    let day = common::day::Day::one();
    day.set_on(&g);
    let d = s.tapegate(&g, &["run"]);
    s.wait_scanning();

    let tapes: Vec<Mac> = (1..=3).map(tape_mac).collect();
    for &t in &tapes {
        s.add_tape(t, 0);
    }
    s.call(&format!("add {HCI} {APPLE} - -70 76 021501"));
    s.call(&format!(
        "add-svc {HCI} {BEACON} -80 0000feaa-0000-1000-8000-00805f9b34fb 10"
    ));
    s.add_tape(SENTINEL, 0);
    // The first advert of each tape is read from its properties when it is discovered.
    wait_sentinel(0, &d, || captured_so_far(&g));
    for counter in 1..=3 {
        for &t in &tapes {
            s.tape_counter(t, counter);
        }
        s.call(&format!("mfg {HCI} {APPLE} 76 0215{counter:02x}"));
        s.call(&format!("rssi {HCI} {APPLE} -6{counter}"));
    }
    s.tape_counter(SENTINEL, 1);
    wait_sentinel(1, &d, || captured_so_far(&g));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{log}");

    let caps = without_sentinel(captured(&g));
    assert_eq!(caps.len(), 12, "{caps:?}");
    for &t in &tapes {
        assert_eq!(of(&caps, t), (0..=3).map(tape_packet).collect::<Vec<_>>());
    }
    let pending = g.store().pending_captures().unwrap();
    assert!(pending
        .iter()
        .all(|p| &*p.capture.product_id == "tape" && p.capture.rssi == Some(-60)));
    let now = day.now_ms();
    assert!(pending
        .iter()
        .all(|p| (now - 60_000..=now).contains(&p.capture.ts_ms)));
    assert!(log.contains("scanning for BLE advertisements"), "{log}");
}

/// Runs `tapegate run` with a BLE config against `s` and expects it to fail at once.
fn fails_at_start(s: &StandIn, config: &str) -> String {
    let g = Gateway::new(config);
    let (status, log) = s.tapegate(&g, &["run"]).wait(Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(69),
        "exit 69 (documented: the source cannot work here; the unit does not restart)\n{log}"
    );
    log
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn without_an_adapter_bluez_access_or_bus_the_daemon_exits_3_saying_what_to_do() {
    need_stand_in();
    let mut s = StandIn::start(false, false);
    let log = fails_at_start(&s, &ble_config(""));
    assert!(log.contains("BlueZ is not running"), "{log}");
    assert!(log.contains("systemctl start bluetooth"), "{log}");

    s.start_bluez(false);
    let log = fails_at_start(&s, &ble_config(""));
    assert!(log.contains("no Bluetooth adapter"), "{log}");
    assert!(log.contains("BlueZ reports none"), "{log}");

    s.call(&format!("adapter {HCI}"));
    let log = fails_at_start(&s, &ble_config("adapter = \"hci7\""));
    assert!(
        log.contains("no Bluetooth adapter named \"hci7\": BlueZ reports hci0"),
        "{log}"
    );

    s.deny_bluez();
    let log = fails_at_start(&s, &ble_config(""));
    assert!(log.contains("D-Bus denied access to BlueZ"), "{log}");
    assert!(log.contains("`bluetooth` group"), "{log}");

    let g = Gateway::new(&ble_config(""));
    let out = g
        .command(&["run"])
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", s.dir.path().join("nothing").display()),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{log}");
    assert!(
        log.contains("cannot connect to the D-Bus system bus"),
        "{log}"
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_scan_recording_replays_to_the_same_captures() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let g = Gateway::new(&ble_config(""));
    let recording = g.path("scan.jsonl");
    let mut scan = s.tapegate(
        &g,
        &[
            "scan",
            "--record",
            recording.to_str().unwrap(),
            "--duration",
            "30",
        ],
    );
    s.wait_scanning();
    let tapes: Vec<Mac> = (1..=2).map(tape_mac).collect();
    for &t in &tapes {
        s.add_tape(t, 0);
    }
    s.call(&format!("add {HCI} {APPLE} - -70 76 021501"));
    s.add_tape(SENTINEL, 0);
    let lines = |p: &PathBuf| without_sentinel(recorded(p)).len();
    wait_sentinel(0, &scan, || recorded(&recording));
    assert_eq!(lines(&recording), 2, "{}", scan.stderr());
    for counter in 1..=2 {
        for &t in &tapes {
            s.tape_counter(t, counter);
        }
    }
    s.call(&format!("mfg {HCI} {APPLE} 76 021502"));
    s.tape_counter(SENTINEL, 1);
    wait_sentinel(1, &scan, || recorded(&recording));
    let out = scan.stdout.take();
    unsafe { libc::kill(scan.child.id() as i32, libc::SIGTERM) };
    let mut shown = String::new();
    if let Some(mut o) = out {
        std::io::Read::read_to_string(&mut o, &mut shown).unwrap();
    }
    let (status, log) = scan.wait(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{log}");
    // The live view shows the tapes (MAC, RSSI, product, packet), not the others.
    assert!(shown.contains(&tapes[0].to_string()), "{shown}");
    assert!(shown.contains(&tape_packet(2)), "{shown}");
    assert!(shown.contains("tape"), "{shown}");
    assert!(!shown.contains(&APPLE.to_string()), "{shown}");
    assert_eq!(lines(&recording), 6, "only the tape adverts are recorded");

    // Replayed, the recording gives exactly the captures of each tape.
    let replay = Gateway::new(&format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n",
        recording.display()
    ));
    let out = replay.run(&["run", "--until-drained"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let caps = without_sentinel(captured(&replay));
    assert_eq!(caps.len(), 6);
    for &t in &tapes {
        assert_eq!(of(&caps, t), (0..=2).map(tape_packet).collect::<Vec<_>>());
    }
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn scan_all_shows_every_device() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let g = Gateway::new(&ble_config(""));
    // The scan ends by itself after --duration (under test here): the stand-in answers
    // in milliseconds, well within it.
    let mut scan = s.tapegate(&g, &["scan", "--all", "--duration", "3"]);
    s.wait_scanning();
    s.add_tape(tape_mac(1), 0);
    s.call(&format!("add {HCI} {APPLE} - -70 76 021501"));
    let shown = scan.stdout();
    let (status, log) = scan.wait(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{log}");
    assert!(shown.contains(&tape_mac(1).to_string()), "{shown}");
    assert!(shown.contains(&APPLE.to_string()), "{shown}");
    assert!(
        shown.contains("4C00021501"),
        "on-air bytes of the other device: {shown}"
    );
}

// ---------------------------------------------------------------------------------------
// The liveness ladder.

/// A daemon with a short silence and give-up, a tape heard, and its captures counted.
fn ladder_daemon(s: &mut StandIn, scanner: &str) -> (Gateway, Tapegate) {
    let g = Gateway::new(&ble_config(scanner));
    let d = s.tapegate(&g, &["run"]);
    s.wait_scanning();
    s.add_tape(tape_mac(1), 0);
    wait_admitted(&g, 1, &d);
    (g, d)
}

/// Makes trouble with the stand-in's `command` and expects the daemon to log `seen`, to
/// mend it with one restart of the scan, and to capture again.
fn one_restart_mends(command: &str, seen: &str) {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    // No silence deadline: only what BlueZ signals can tell the daemon.
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0\ngive_up_secs = 30");
    s.call(command);
    d.wait_log(seen, Duration::from_secs(5));
    d.wait_log("scanning again", Duration::from_secs(10));
    s.wait_scanning();
    s.tape_counter(tape_mac(1), 1);
    wait_admitted(&g, 2, &d);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert_eq!(log.matches("restarting the scan").count(), 1, "{log}");
    assert_eq!(
        of(&captured(&g), tape_mac(1)),
        vec![tape_packet(0), tape_packet(1)]
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn an_adapter_powered_off_is_powered_on_by_the_restarted_scan_and_capture_resumes() {
    // Starting the scan powers the adapter on.
    one_restart_mends(&format!("power {HCI} 0"), "was powered off");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn discovery_stopped_by_bluez_is_noticed_from_its_signal_alone_and_restarted() {
    // The source ignores bluez-async's Discovering event: this is the watcher's signal.
    one_restart_mends(
        &format!("stop-discovery {HCI}"),
        "discovery stopped on adapter hci0",
    );
}

/// Takes the adapter away with `away` and expects the daemon to log `seen`, then to climb
/// to re-acquiring it (once); after `back`, to scan again and, once `again` has made the
/// tape advert anew, to capture it.
fn one_reacquisition_mends(
    away: fn(&mut StandIn),
    seen: &str,
    back: fn(&mut StandIn),
    again: fn(&mut StandIn),
) {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0\ngive_up_secs = 30");
    away(&mut s);
    d.wait_log(seen, Duration::from_secs(5));
    // While it is gone, restarting the scan cannot help: the next step is taken.
    d.wait_log("re-acquiring the adapter", Duration::from_secs(10));
    back(&mut s);
    d.wait_log("scanning again", Duration::from_secs(10));
    s.wait_scanning();
    again(&mut s);
    let next = tape_packet(1);
    if eventually(Duration::from_secs(30), || {
        of(&captured_so_far(&g), tape_mac(1))
            .contains(&next)
            .then_some(())
    })
    .is_none()
    {
        panic!("the tape's next advert was not captured:\n{}", d.stderr());
    }
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert_eq!(
        log.matches("restarting the scan did not help").count(),
        1,
        "{log}"
    );
    // A BlueZ that kept the device gives its last advert again when the adapter is
    // re-acquired (dedup, off here, drops it in service).
    let mut caps = of(&captured(&g), tape_mac(1));
    caps.dedup();
    assert_eq!(caps, vec![tape_packet(0), tape_packet(1)]);
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_bluetoothd_restart_re_acquires_the_adapter_and_capture_resumes() {
    one_reacquisition_mends(
        |s| s.kill_bluez(),
        "BlueZ (org.bluez) left the system bus",
        |s| s.start_bluez(true),
        // A new bluetoothd knows no device yet.
        |s| s.add_tape(tape_mac(1), 1),
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn an_adapter_unplugged_and_plugged_back_is_re_acquired_and_capture_resumes() {
    // Told by BlueZ's InterfacesRemoved and InterfacesAdded: nothing polls.
    one_reacquisition_mends(
        |s| {
            s.call(&format!("remove-adapter {HCI}"));
        },
        "adapter hci0 disappeared",
        |s| {
            s.call(&format!("adapter {HCI}"));
        },
        |s| s.tape_counter(tape_mac(1), 1),
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_new_bluetoothd_owner_is_noticed_even_without_a_gap() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0\ngive_up_secs = 30");
    s.kill_bluez();
    s.start_bluez(true);
    d.wait_log("scanning again", Duration::from_secs(10));
    s.wait_scanning();
    s.add_tape(tape_mac(1), 1);
    wait_admitted(&g, 2, &d);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(log.contains("bluetoothd restarted"), "{log}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn silence_restarts_the_scan_and_an_advert_ends_the_trouble() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 1\ngive_up_secs = 30");
    d.wait_log("no advert for 1 s", Duration::from_secs(5));
    s.tape_counter(tape_mac(1), 1);
    d.wait_log("scanning again", Duration::from_secs(5));
    // Stopped at once: one more second without an advert would be silence again. What
    // was heard is committed on the way out.
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert_eq!(admitted(&g), 2, "{log}");
    // The ladder's step is counted where operators look.
    let st = g.status_json();
    assert_eq!(st["scanner"]["restarts"], 1, "{st}");
    assert_eq!(st["scanner"]["reacquires"], 0, "{st}");
    let trouble = st["scanner_last_trouble"].as_str().unwrap_or_default();
    assert!(trouble.contains("no advert for 1 s"), "{st}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_scanner_that_does_not_come_back_ends_the_daemon_with_exit_1() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0\ngive_up_secs = 3");
    let started = Instant::now();
    s.kill_bluez();
    let (status, log) = d.wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(1), "{log}");
    // Both steps were taken, and counted in the state database before the exit.
    let st = g.status_json();
    assert!(st["scanner"]["restarts"].as_u64() >= Some(1), "{st}");
    assert_eq!(st["scanner"]["reacquires"], 1, "{st}");
    assert!(started.elapsed() >= Duration::from_secs(3), "{log}");
    assert!(log.contains("could not be brought back for 3 s"), "{log}");
    assert_eq!(
        log.matches("restarting the scan did not help").count(),
        1,
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------
// Bounded memory.

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn five_thousand_rotating_macs_keep_devices_and_memory_bounded() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let g = Gateway::new(&ble_config("max_devices = 500\nsilence_secs = 0"));
    let d = s.tapegate(&g, &["run"]);
    s.wait_scanning();
    // Tapes that rotate their MAC: each a new device, each one capture.
    let payload = hex_lower(&tape_advert(tape_mac(0), 0, 1).manufacturer_data[0].1);
    s.call(&format!("rotate {HCI} 1000 0 {TAPE_CID} {payload}"));
    wait_admitted(&g, 1000, &d);
    let rss_after_first = rss_kib(d.child.id());
    for round in 1..5 {
        s.call(&format!(
            "rotate {HCI} 1000 {} {TAPE_CID} {payload}",
            round * 1000
        ));
    }
    wait_admitted(&g, 5000, &d);
    // Removal requests are processed by the watcher thread as they come.
    let devices = eventually(Duration::from_secs(10), || {
        let n: u64 = s.call(&format!("devices {HCI}")).parse().unwrap();
        (n <= 500).then_some(n)
    });
    let rss_end = rss_kib(d.child.id());
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(
        devices.is_some(),
        "BlueZ keeps at most max_devices devices\n{log}"
    );
    assert!(log.contains("forgotten=4500"), "{log}");
    // 4,000 more devices than at the first measure: at most 8 MiB more.
    assert!(
        rss_end < rss_after_first + 8 * 1024,
        "RSS {rss_after_first} KiB -> {rss_end} KiB"
    );
}

// ---------------------------------------------------------------------------------------
// Discovery, BlueZ's device objects, one advert per signal.

/// The advert of tape `mac` with `counter`, as the stand-in's `advert` command sends it.
fn tape_payload(counter: u16) -> String {
    hex_lower(&tape_advert(tape_mac(0), 0, counter).manufacturer_data[0].1)
}

/// The captures of `mac` as (packet, RSSI), read back after the daemon stopped.
fn captured_with_rssi(g: &Gateway, mac: Mac) -> Vec<(String, Option<i16>)> {
    g.store()
        .pending_captures()
        .unwrap()
        .into_iter()
        .filter(|p| p.capture.mac == mac)
        .map(|p| (p.capture.packet, p.capture.rssi))
        .collect()
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn discovery_is_le_only_and_without_a_management_socket_adverts_come_over_dbus() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    // `auto`, and no management socket to be had (the fake kernel's path is empty):
    // the daemon says so once at INFO and reads adverts over D-Bus.
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::new(&ble_config(
        "adverts = \"auto\"\nsilence_secs = 0\ngive_up_secs = 30",
    ));
    let d = s.tapegate_mgmt(&g, &["run"], &dir.path().join("nobody-listens.sock"));
    s.wait_scanning();
    s.add_tape(tape_mac(1), 0);
    wait_admitted(&g, 1, &d);
    // BlueZ scans LE only: classic inquiry would take half the time of a dual-mode
    // controller without simultaneous discovery.
    assert_eq!(
        s.call(&format!("filter {HCI}")),
        "DuplicateData=true Transport=le"
    );
    // And after the ladder restarted the scan.
    s.call(&format!("power {HCI} 0"));
    d.wait_log("scanning again", Duration::from_secs(10));
    s.wait_scanning();
    assert_eq!(
        s.call(&format!("filter {HCI}")),
        "DuplicateData=true Transport=le"
    );
    s.tape_counter(tape_mac(1), 1);
    wait_admitted(&g, 2, &d);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the kernel's management socket cannot be used here"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains(" INFO "), "{log}");
    assert!(log.contains("adverts=dbus"), "{log}");
    assert_eq!(g.status_json()["scanner_adverts"], "dbus");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn one_signal_with_rssi_and_data_together_is_one_advert() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0");
    // BlueZ sends a device's changes of one main-loop turn in one PropertiesChanged:
    // each advert here changes RSSI and data at once.
    for c in 1..=5u16 {
        s.call(&format!(
            "advert {HCI} {} -{} {TAPE_CID} {}",
            tape_mac(1),
            60 + c,
            tape_payload(c)
        ));
    }
    s.add_tape(SENTINEL, 0);
    wait_sentinel(0, &d, || captured_so_far(&g));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    let expected: Vec<(String, Option<i16>)> = (0..=5u16)
        .map(|c| {
            (
                tape_packet(c),
                Some(if c == 0 { -60 } else { -60 - c as i16 }),
            )
        })
        .collect();
    assert_eq!(captured_with_rssi(&g, tape_mac(1)), expected, "{log}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_device_bluez_forgot_comes_back_as_a_new_object_whose_data_is_captured() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let (g, d) = ladder_daemon(&mut s, "silence_secs = 0");
    // 30 s unseen, BlueZ removes the device object; its next advert makes a new one,
    // with the new data in InterfacesAdded.
    s.call(&format!("forget {HCI} {}", tape_mac(1)));
    s.add_tape(tape_mac(1), 1);
    s.tape_counter(tape_mac(1), 2);
    // Forgotten again and back with the data it had: a new object is an advert.
    s.call(&format!("forget {HCI} {}", tape_mac(1)));
    s.add_tape(tape_mac(1), 2);
    s.add_tape(SENTINEL, 0);
    wait_sentinel(0, &d, || captured_so_far(&g));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert_eq!(
        of(&captured(&g), tape_mac(1)),
        vec![
            tape_packet(0),
            tape_packet(1),
            tape_packet(2),
            tape_packet(2)
        ],
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------
// The side channel: the daemon reads a fake kernel's management frames
// (`TAPEGATE_MGMT_SOCKET`, tests/bluez/kernel.rs) while BlueZ (the stand-in) scans.

/// The tape's advertising data with `counter`, as the kernel reports it: flags, then
/// the manufacturer data.
fn tape_ad(counter: u16) -> Vec<u8> {
    let mut d = build::ad(0x01, &[0x06]);
    let mut m = TAPE_CID.to_le_bytes().to_vec();
    m.extend(&tape_advert(tape_mac(0), 0, counter).manufacturer_data[0].1);
    d.extend(build::ad(0xFF, &m));
    d
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn side_channel_reports_become_the_captures_while_bluez_keeps_scanning() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(dir.path(), Answers::default());
    let g = Gateway::new(&ble_config("adverts = \"mgmt\"\nsilence_secs = 0"));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    // bluetoothd keeps the adapter: discovery runs over D-Bus, LE only.
    s.wait_scanning();
    assert_eq!(
        s.call(&format!("filter {HCI}")),
        "DuplicateData=true Transport=le"
    );
    k.wait_connected(Duration::from_secs(10));
    d.wait_log("adverts=mgmt", Duration::from_secs(10));
    // The trust probe was the first command, on hci0's index.
    assert_eq!(
        k.commands()[0],
        wire::command(wire::OP_GET_CONNECTIONS, 0, &[])
    );
    let tapes: Vec<Mac> = (1..=3).map(tape_mac).collect();
    for c in 0..3u16 {
        for &t in &tapes {
            k.send(&build::device_found(
                0,
                t.octets(),
                -60 - c as i8,
                &tape_ad(c),
            ));
        }
        // Another device, another adapter's report of a tape, a malformed frame.
        k.send(&build::device_found(
            0,
            APPLE.octets(),
            -70,
            &build::ad(0xFF, &[0x4C, 0, 2]),
        ));
        k.send(&build::device_found(
            1,
            tape_mac(9).octets(),
            -60,
            &tape_ad(c),
        ));
        k.send(&build::frame(wire::EV_DEVICE_FOUND, 0, &[1, 2, 3]));
    }
    // A tape BlueZ reports over D-Bus is not read there: no advert twice.
    s.add_tape(tape_mac(7), 0);
    k.send(&build::device_found(0, SENTINEL.octets(), -60, &tape_ad(0)));
    wait_sentinel(0, &d, || captured_so_far(&g));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    for &t in &tapes {
        let expected: Vec<(String, Option<i16>)> = (0..3u16)
            .map(|c| (tape_packet(c), Some(-60 - c as i16)))
            .collect();
        assert_eq!(captured_with_rssi(&g, t), expected, "{t}");
    }
    let caps = captured(&g);
    assert!(
        of(&caps, tape_mac(9)).is_empty(),
        "another adapter's report"
    );
    assert!(
        of(&caps, tape_mac(7)).is_empty(),
        "a D-Bus advert on the mgmt path"
    );
    assert!(log.contains("malformed_frames=3"), "{log}");
    assert!(
        log.contains("a malformed frame from the kernel's management socket was skipped"),
        "{log}"
    );
    assert_eq!(g.status_json()["scanner_adverts"], "mgmt");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn adverts_mgmt_where_the_channel_cannot_be_had_exits_3_naming_the_setting() {
    need_stand_in();
    let s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let config = ble_config("adverts = \"mgmt\"");
    // Nothing there (as a kernel without Bluetooth).
    let g = Gateway::new(&config);
    let (status, log) = s
        .tapegate_mgmt(&g, &["run"], &dir.path().join("nobody-listens.sock"))
        .wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(69), "{log}");
    assert!(
        log.contains(
            "scanner.adverts = \"mgmt\", but the kernel has no Bluetooth management socket here"
        ),
        "{log}"
    );
    // A process without CAP_NET_ADMIN: the kernel binds its socket, refuses it reports.
    let k = FakeKernel::start(
        dir.path(),
        Answers {
            probe: wire::STATUS_PERMISSION_DENIED,
            ..Answers::default()
        },
    );
    let g = Gateway::new(&config);
    let (status, log) = s
        .tapegate_mgmt(&g, &["run"], &k.path)
        .wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(69), "{log}");
    assert!(
        log.contains("only to a process with CAP_NET_ADMIN"),
        "{log}"
    );
    assert!(log.contains("set scanner.adverts = \"auto\""), "{log}");
    // `auto` takes D-Bus instead, saying why once.
    let g = Gateway::new(&ble_config("adverts = \"auto\""));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scanning for BLE advertisements", Duration::from_secs(15));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(log.contains("adverts=dbus"), "{log}");
    assert_eq!(
        log.matches("only to a process with CAP_NET_ADMIN").count(),
        1,
        "{log}"
    );
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn passive_scanning_is_the_kernels_monitor_for_the_products_and_no_discovery() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::start(dir.path(), Answers::default());
    let g = Gateway::new(&ble_config(
        "adverts = \"mgmt\"\nscan = \"passive\"\nsilence_secs = 0\ngive_up_secs = 30",
    ));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    d.wait_log("scan=passive", Duration::from_secs(15));
    let added = |k: &FakeKernel| {
        k.commands()
            .into_iter()
            .filter(|c| c[..2] == wire::OP_ADD_ADV_PATTERNS_MONITOR.to_le_bytes())
            .collect::<Vec<_>>()
    };
    if eventually(Duration::from_secs(10), || {
        (!added(&k).is_empty()).then_some(())
    })
    .is_none()
    {
        panic!("no monitor added: {:?}\n{}", k.opcodes(), d.stderr());
    }
    // One pattern: manufacturer data (0xFF) starting with the tape's company, as on air.
    let mut pattern = vec![1, 0xFF, 0, 2, 0xF7, 0x0E];
    pattern.resize(1 + 34, 0);
    assert_eq!(
        added(&k)[0],
        wire::command(wire::OP_ADD_ADV_PATTERNS_MONITOR, 0, &pattern)
    );
    // The adapter is on, and nobody started a discovery (which would scan actively).
    assert_eq!(s.call(&format!("filter {HCI}")), "");
    s.call(&format!("wait-discovering {HCI} 0 1"));
    // The kernel reports through the monitor (handle 0: no offload), each with its RSSI.
    for c in 0..3u16 {
        k.send(&build::monitor_found(
            0,
            0,
            tape_mac(1).octets(),
            -50 - c as i8,
            &tape_ad(c),
        ));
    }
    k.send(&build::monitor_found(
        0,
        0,
        SENTINEL.octets(),
        -60,
        &tape_ad(0),
    ));
    wait_sentinel(0, &d, || captured_so_far(&g));
    // Another process removes the monitor: the ladder restarts the scan, which adds it
    // again.
    k.send(&build::frame(
        wire::EV_ADV_MONITOR_REMOVED,
        0,
        &1u16.to_le_bytes(),
    ));
    d.wait_log(
        "advertisement monitor (passive scan) is gone",
        Duration::from_secs(10),
    );
    d.wait_log("scanning again", Duration::from_secs(10));
    assert_eq!(added(&k).len(), 2, "{}", d.stderr());
    k.send(&build::monitor_found(
        0,
        0,
        tape_mac(1).octets(),
        -53,
        &tape_ad(3),
    ));
    k.send(&build::monitor_found(
        0,
        0,
        SENTINEL.octets(),
        -60,
        &tape_ad(1),
    ));
    wait_sentinel(1, &d, || captured_so_far(&g));
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    // Stopping removes the monitor: the kernel would scan on for nobody.
    let removed = wire::command(wire::OP_REMOVE_ADV_MONITOR, 0, &1u16.to_le_bytes());
    assert!(k.commands().contains(&removed), "{:?}", k.opcodes());
    let expected: Vec<(String, Option<i16>)> = (0..4u16)
        .map(|c| (tape_packet(c), Some(-50 - c as i16)))
        .collect();
    assert_eq!(captured_with_rssi(&g, tape_mac(1)), expected, "{log}");
}

#[test]
#[cfg_attr(no_bluez_stand_in, ignore = common::needs_bluez_stand_in!())]
fn a_kernel_that_refuses_the_monitor_gets_a_discovery_instead() {
    need_stand_in();
    let mut s = StandIn::start(true, true);
    let dir = tempfile::tempdir().unwrap();
    // A kernel before advertisement monitors (5.10) answers them as an unknown command.
    let k = FakeKernel::start(
        dir.path(),
        Answers {
            monitor: None,
            ..Answers::default()
        },
    );
    let g = Gateway::new(&ble_config(
        "adverts = \"mgmt\"\nscan = \"passive\"\nsilence_secs = 0",
    ));
    let d = s.tapegate_mgmt(&g, &["run"], &k.path);
    s.wait_scanning();
    assert_eq!(
        s.call(&format!("filter {HCI}")),
        "DuplicateData=true Transport=le"
    );
    d.wait_log("scanning for BLE advertisements", Duration::from_secs(10));
    k.send(&build::device_found(
        0,
        tape_mac(1).octets(),
        -60,
        &tape_ad(0),
    ));
    wait_admitted(&g, 1, &d);
    let (status, log) = d.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log}");
    assert!(
        log.contains("scanning actively (discovery) instead of passively"),
        "{log}"
    );
    assert!(
        log.contains("the kernel refused the advertisement monitor"),
        "{log}"
    );
}
