//! The VM test's cases on a healthy stack: both paths delivering exactly the tapes'
//! adverts, `tapegate scan` in a passive scan, the start step's socket under
//! `adverts = "dbus"`, a hundred tapes (the scan modes traced: `modes.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::radio::Radio;
use super::stack::{plain, Gateway, Item};

pub const T1: &str = "C0:FF:EE:00:00:01";
pub const T2: &str = "C0:FF:EE:00:00:02";
pub const FOREIGN: &str = "D0:00:00:00:00:02";

pub const MGMT_ACTIVE: &str =
    "adverts = \"mgmt\"\nscan = \"active\"\nsilence_secs = 10\ngive_up_secs = 120";
pub const MGMT_PASSIVE: &str =
    "adverts = \"mgmt\"\nscan = \"passive\"\nsilence_secs = 10\ngive_up_secs = 120";
pub const DBUS_ACTIVE: &str =
    "adverts = \"dbus\"\nscan = \"active\"\nsilence_secs = 10\ngive_up_secs = 120";

/// Wall-clock seconds now (the guest's clock is the host's: QEMU's RTC).
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The counters delivered of `mac`, in order.
pub fn counters(items: &[Item], mac: &str) -> Vec<u16> {
    let mac = plain(mac);
    items
        .iter()
        .filter(|i| i.mac_id == mac)
        .filter_map(Item::counter)
        .collect()
}

/// Waits until the mock `unit` has received counter `counter` of `mac`.
pub fn wait_delivered(g: &Gateway, unit: &str, mac: &str, counter: u16, limit: Duration) {
    g.wait(
        &format!("{mac} counter {counter} delivered to {unit}"),
        limit,
        || {
            counters(&g.delivered(unit), mac)
                .contains(&counter)
                .then_some(())
        },
    );
}

/// The RSSI of each tape `tapegate tapes --json` shows (`config`: another daemon's).
pub fn rssi_of_tapes(g: &Gateway, config: &str) -> BTreeMap<String, i64> {
    let text = g.vm.ok(&format!("tapegate tapes --json {config}"));
    let rows: serde_json::Value = serde_json::from_str(&text).expect("tapes JSON");
    rows.as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["mac"].as_str()?.to_string(), r["rssi"].as_i64()?)))
        .collect()
}

/// The air of the main case: two tapes (fixed payloads, their counters set by the
/// test) with their names in the scan response, and a foreign advertiser.
pub fn main_air(radio: &Radio) {
    radio.cmd(&format!(
        "tape {T1} rssi=-61 step=0 counter=1 name=TT-0001 interval=200"
    ));
    radio.cmd(&format!(
        "tape {T2} rssi=-67 step=0 counter=1 name=TT-0002 interval=200"
    ));
    radio.cmd(&format!(
        "tape {FOREIGN} rssi=-70 company=004C step=0 interval=300"
    ));
}

/// Both paths at once in active scans: the unit on the side channel (its start step's
/// socket, from systemd's store) and a second daemon by hand on D-Bus, each delivering
/// to a mock of its own: the tapes' adverts with their RSSI, a payload change, a tape
/// gone past BlueZ's 30 s and back; the foreign advertiser filtered.
pub fn both_paths_active(g: &Gateway, radio: &Radio) {
    main_air(radio);
    let id = g.start_unit(MGMT_ACTIVE);
    let hand = g.start_hand(DBUS_ACTIVE);
    let limit = Duration::from_secs(30);
    for unit in ["mock", "mock-hand"] {
        wait_delivered(g, unit, T1, 1, limit);
        wait_delivered(g, unit, T2, 1, limit);
    }
    radio.cmd(&format!("tape {T1} counter=2"));
    for unit in ["mock", "mock-hand"] {
        wait_delivered(g, unit, T1, 2, limit);
    }
    // T2 silent for longer than BlueZ's TemporaryTimeout (30 s), then back with new
    // data. (Under a discovery that never stops, bluetoothd 5.66 kept its device object
    // for minutes: whether it was still there is said, not assumed.)
    let off_at = now_secs();
    radio.cmd(&format!("off {T2}"));
    g.wait("35 s of silence of T2", Duration::from_secs(60), || {
        (now_secs() - off_at >= 35).then_some(())
    });
    for unit in ["mock", "mock-hand"] {
        assert!(
            !g.delivered(unit)
                .iter()
                .any(|i| i.mac_id == plain(T2) && i.scan_secs() > off_at + 1),
            "{unit}: nothing of a silent tape is captured"
        );
    }
    let object = format!("/org/bluez/hci0/dev_{}", T2.replace(':', "_"));
    let kept =
        g.vm.sh(&format!(
            "busctl introspect org.bluez {object} >/dev/null 2>&1"
        ))
        .success();
    let gone = now_secs() - off_at;
    radio.cmd(&format!("tape {T2} counter=3"));
    radio.cmd(&format!("on {T2}"));
    for unit in ["mock", "mock-hand"] {
        wait_delivered(g, unit, T2, 3, limit);
    }
    let air = radio.air();
    g.stop_hand(&hand);
    for unit in ["mock", "mock-hand"] {
        let items = g.delivered(unit);
        assert!(
            !items.iter().any(|i| i.mac_id == plain(FOREIGN)),
            "{unit}: the foreign advertiser was delivered"
        );
        let t1 = counters(&items, T1);
        let first_2 = t1.iter().position(|c| *c == 2).unwrap();
        assert!(
            t1[..first_2].iter().all(|c| *c == 1) && t1[first_2..].iter().all(|c| *c == 2),
            "{unit}: T1 {t1:?}"
        );
        let t2 = counters(&items, T2);
        assert_eq!(t2.last(), Some(&3), "{unit}: T2 {t2:?}");
        assert!(
            items.iter().all(|i| i.status == Some(200)),
            "{unit}: every item decoded"
        );
        eprintln!(
            "vm_ble: {unit}: T1 {t1:?}, T2 {t2:?} (silent {gone} s; BlueZ kept its object: {kept})"
        );
    }
    assert!(
        air[FOREIGN].reported > 0,
        "the foreign advertiser was heard on air"
    );
    for config in ["", "--config /share/hand.toml"] {
        let rssi = rssi_of_tapes(g, config);
        assert_eq!(rssi.get(T1), Some(&-61), "{config}: {rssi:?}");
        assert_eq!(rssi.get(T2), Some(&-67), "{config}: {rssi:?}");
    }
    assert_eq!(g.status()["scanner_adverts"], "mgmt");
    let journal = g.journal(&id);
    assert!(
        journal.contains("the kernel's Bluetooth management socket is open for tapegate"),
        "the start step stored the socket"
    );
    assert_eq!(
        g.fd_store(),
        "0",
        "the daemon took the socket from the store"
    );
}

/// `tapegate scan` with `scanner.scan = "passive"`: the products' monitor, a passive
/// scan, the tapes shown and recorded with their RSSI and data.
pub fn scan_passive(g: &Gateway, radio: &Radio) {
    g.vm.ok("systemctl stop tapegate");
    let before = radio.air();
    let out = g.vm.run(
        "RUST_LOG=info TAPEGATE_SCANNER__SCAN=passive TAPEGATE_SCANNER__ADVERTS=mgmt \
         tapegate scan --duration 8 --record /share/out/scan.jsonl",
        Duration::from_secs(60),
    );
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("scan=passive"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("passive scanning needs"),
        "{}",
        out.stderr
    );
    let after = radio.air();
    assert_eq!(
        after[T1].scan_requests, before[T1].scan_requests,
        "no scan request"
    );
    let recorded = std::fs::read_to_string(g.vm.share().join("out/scan.jsonl")).unwrap();
    let adverts: Vec<tapegate::record::Advertisement> = recorded
        .lines()
        .map(|l| tapegate::record::Advertisement::from_record(l).unwrap())
        .collect();
    let t1: Vec<_> = adverts.iter().filter(|a| a.mac.to_string() == T1).collect();
    assert!(!t1.is_empty(), "{}", out.stdout);
    assert!(t1
        .iter()
        .all(|a| a.rssi == Some(-61) && a.manufacturer_data[0].0 == 0x0EF7));
    assert!(
        !adverts.iter().any(|a| a.mac.to_string() == FOREIGN),
        "only tapes without --all"
    );
    eprintln!("vm_ble: scan passive: {} adverts of T1 in 8 s", t1.len());
}

/// `adverts = "dbus"` under the unit: the start step still stores a socket; the daemon
/// takes it out of the store (and closes it), so the next start step's fits; the tapes
/// are delivered from BlueZ's signals, read as the service user under the unit's
/// hardening.
pub fn dbus_takes_the_stored_socket(g: &Gateway, radio: &Radio) {
    for counter in [10, 11] {
        let id = g.start_unit(DBUS_ACTIVE);
        assert!(g
            .journal(&id)
            .contains("the kernel's Bluetooth management socket is open for tapegate"));
        assert_eq!(g.fd_store(), "0", "the store is empty once the daemon runs");
        assert_eq!(g.status()["scanner_adverts"], "dbus");
        radio.cmd(&format!("tape {T1} counter={counter}"));
        wait_delivered(g, "mock", T1, counter, Duration::from_secs(30));
    }
}

/// A hundred tapes advertising once a second, their data changing with every advert,
/// for a minute, with the shipped dedup (60 s window, 5 s interval): every tape
/// delivered, its captures at most the interval apart, the newest state of each
/// delivered after it stopped; the reports per second in `status`.
/// What the mock received after `mark`.
fn items_of(g: &Gateway, mark: usize) -> Vec<Item> {
    g.delivered("mock").split_off(mark)
}

/// For a failure: per tape, the last counters the mock received (with its answer's
/// status), the daemon's status and what its outbox still holds.
fn behind_why(g: &Gateway, items: &[Item], fleet: &[String]) -> String {
    let mut out = String::new();
    for mac in fleet {
        let plain = plain(mac);
        let tail: Vec<String> = items
            .iter()
            .filter(|i| i.mac_id == plain)
            .map(|i| format!("{:?}@{}/{:?}", i.counter(), i.scan_secs(), i.status))
            .collect();
        let from = tail.len().saturating_sub(4);
        out += &format!("{mac}: {}\n", tail[from..].join(" "));
    }
    out += &g.vm.sh("tapegate status --json").stdout;
    out += &g
        .vm
        .sh("python3 -c \"import sqlite3; c = sqlite3.connect('file:/var/lib/tapegate/outbox.db?mode=ro', uri=True); \
             print('pending', c.execute('select count(*), min(captured_at), max(captured_at) from pending').fetchall()); \
             print('dead', c.execute('select count(*), group_concat(distinct error) from dead_letters').fetchall())\"")
        .stdout;
    out
}

pub fn a_hundred_tapes(g: &Gateway, radio: &Radio) {
    radio.cmd("clear");
    g.start_unit_with(MGMT_ACTIVE, "window_secs = 60\nmin_interval_secs = 5");
    let mark = g.delivered("mock").len();
    let fleet: Vec<String> = (1..=100)
        .map(|i| format!("C0:FF:EE:10:00:{i:02X}"))
        .collect();
    radio.cmd("fleet 100 interval=1000 step=1");
    // Sixty adverts of every tape, about a minute: counted, not timed (a loaded machine
    // slows the radio, not what is asserted).
    let started = tokio::time::Instant::now();
    let minute = g.wait(
        "sixty adverts of every tape",
        Duration::from_secs(240),
        || {
            let air = radio.air();
            fleet.iter().all(|m| air[m].sent >= 60).then_some(air)
        },
    );
    let took = started.elapsed().as_secs_f64();
    // Every tape then holds its newest state on air until the controller has reported
    // it three times. The kernel ends an LE discovery after 10.24 s and bluetoothd starts
    // the next; while the scan is off, and for reports in flight as it stops, nothing
    // reaches the host: a tape's single last advert may be lost so, as on any dock; its
    // state, repeated, is not.
    radio.cmd("fleet 100 step=0");
    let air = g.wait(
        "each tape's newest state reported three times",
        Duration::from_secs(60),
        || {
            let air = radio.air();
            fleet
                .iter()
                .all(|m| {
                    let a = &air[m];
                    a.last_reported_counter == a.last_counter && a.reported_repeats >= 3
                })
                .then_some(air)
        },
    );
    radio.cmd("quiet");
    // Dedup holds the newest state of each tape and admits it when the interval ends.
    let behind = || {
        let items = g.delivered("mock");
        fleet
            .iter()
            .filter_map(|m| {
                let last = air[m].last_counter.map(|c| c as u16);
                let got = counters(&items[mark..], m).last().copied();
                (got != last).then(|| format!("{m}: on air {last:?}, delivered {got:?}"))
            })
            .collect::<Vec<_>>()
    };
    if g.try_wait(Duration::from_secs(60), || {
        behind().is_empty().then_some(())
    })
    .is_none()
    {
        panic!(
            "the newest state of these tapes was not delivered: {:?}\n{}\n{}",
            behind(),
            behind_why(g, &items_of(g, mark), &fleet),
            g.unit_log()
        );
    }
    let items = g.delivered("mock")[mark..].to_vec();
    let (mut worst_gap, mut sent, mut reported) = (0, 0, 0);
    for mac in &fleet {
        let c = counters(&items, mac);
        assert_eq!(c.first(), Some(&0), "{mac}: its first advert is delivered");
        for w in c.windows(2) {
            worst_gap = worst_gap.max(w[1].wrapping_sub(w[0]));
        }
        sent += minute[mac].sent;
        reported += minute[mac].reported;
    }
    let reports = g.wait(
        "the reports per second in status",
        Duration::from_secs(90),
        || g.status()["scanner_reports_per_sec"].as_f64(),
    );
    eprintln!(
        "vm_ble: a hundred tapes: {sent} adverts on air in {took:.0} s ({reported} HCI reports), \
         {} captures delivered, at most {worst_gap} adverts between two captures of a tape, \
         {reports:.1} reports/s in status",
        items.len()
    );
    // One advert a second and a 5 s interval: a capture at least every 5 adverts, give
    // or take the advertising delay and the interval's alignment.
    assert!(
        worst_gap <= 7,
        "a tape's captures at most the dedup interval apart"
    );
    radio.cmd("clear");
}
