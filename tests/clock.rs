//! Time on a gateway without a real-time clock (DESIGN.md), through the real binary: a
//! real-time simulated fleet, the mock service on loopback, a real SQLite file, and
//! the daemon's clock driven by the test clock file (`TAPEGATE_FAKE_CLOCK`, debug
//! builds only), which moves the whole process's wall clock and sync state.
//! One test in process: a stage stamps captures by the clock value it is handed.
// The test clock exists only in debug builds; a release build would ignore it.
#![cfg(debug_assertions)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::day::{write_atomically, Day};
use common::{eventually, mock_with as mock_on_own_runtime, text, Gateway};
use tapegate::outbox::Stats;
use tapegate::source::sim::tape::TapeReading;
use tapegate_mock::{MockConfig, MockHandle, ReceivedItem};

const WEEK_MS: i64 = 7 * 24 * 3_600_000;

/// Three simulated tapes in real time, each advert a new state (its counter goes up by
/// one), dedup off: every advert is a capture, and the counters say what was lost,
/// repeated or reordered. Ten captures a second: a batch carries one capture per tape,
/// so this is a rate the flusher keeps up with on a loaded machine.
fn sim_config(mock: &MockHandle) -> String {
    let service = common::service_toml(mock, "ppe", 5).expect("the mock serves ppe");
    format!(
        r#"{service}

[scanner]
source = "sim"
sim_tapes = 3
sim_interval_ms = 300
sim_change_every = 1
sim_others_ratio = 0

[dedup]
window_secs = 0
min_interval_secs = 0

[outbox]
commit_interval_ms = 20

[flush]
max_delay_secs = 0.05
backoff_initial_ms = 50
backoff_max_secs = 1
"#
    )
}

/// Rewrites the test clock file atomically (the daemon may read it at any moment): the
/// clock reads `day`, moved by `shift_ms`.
fn set_clock(path: &Path, day: &Day, shift_ms: i64, synced: bool, time_service: bool) {
    write_atomically(path, &day.clock_file(shift_ms, synced, time_service));
}

/// Now on `day` (the right time of the test's world), whole seconds.
fn now_secs(day: &Day) -> i64 {
    day.now_ms().div_euclid(1000)
}

/// The mock, its clock on `day`.
fn mock_on(day: &Day) -> (tokio::runtime::Runtime, MockHandle) {
    mock_on_own_runtime(MockConfig {
        clock: day.mock_clock(),
        ..MockConfig::demo()
    })
}

fn spawn_daemon(g: &Gateway, clock_file: &Path) -> Child {
    let log = std::fs::File::create(g.path("daemon.log")).expect("log file");
    g.command(&["run"])
        .env(tapegate::clock::FAKE_CLOCK_ENV, clock_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("tapegate starts")
}

/// Waits (at most 30 s: the machine may be loaded) for the daemon's stats to satisfy
/// `done`; fails with its log.
fn stats_when(g: &Gateway, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    eventually(Duration::from_secs(30), || {
        g.try_stats().filter(|s| done(s))
    })
    .unwrap_or_else(|| panic!("{what}: not within 30 s; log:\n{}", log(g)))
}

fn assert_clock_says(s: &Stats, words: &str) {
    let state = s.clock.state.as_deref().unwrap_or_default();
    assert!(
        state.contains(words),
        "clock state {state:?}, expected {words:?}"
    );
}

/// SIGTERM, and the exit (0) waited for.
fn stop(child: &mut Child, g: &Gateway) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = eventually(Duration::from_secs(20), || child.try_wait().unwrap())
        .unwrap_or_else(|| panic!("no exit after SIGTERM; log:\n{}", log(g)));
    assert!(status.success(), "exit {status}; log:\n{}", log(g));
}

fn log(g: &Gateway) -> String {
    text(&std::fs::read(g.path("daemon.log")).unwrap_or_default())
}

/// Every decoded item the mock answered, in order of arrival.
fn delivered_items(mock: &MockHandle) -> Vec<ReceivedItem> {
    mock.received()
        .into_iter()
        .filter(|r| r.status == Some(200))
        .flat_map(|r| r.items)
        .collect()
}

fn counter(item: &ReceivedItem) -> u16 {
    let bytes = hex::decode(&item.ble_packet).expect("hex ble_packet");
    TapeReading::from_packet(&bytes)
        .expect("a simulated tape's packet")
        .counter
}

fn scan_time(item: &ReceivedItem) -> i64 {
    item.scan_time.parse().expect("scan_time is whole seconds")
}

/// Per tape, in order of arrival at the service, each counter exactly one more than
/// the one before: nothing lost between the first and the last, nothing repeated,
/// nothing reordered.
fn assert_each_tape_arrived_whole_and_in_order(items: &[ReceivedItem]) {
    let mut last: HashMap<&str, u16> = HashMap::new();
    for item in items {
        let c = counter(item);
        if let Some(prev) = last.insert(item.mac_id.as_str(), c) {
            assert_eq!(
                c,
                prev.wrapping_add(1),
                "tape {}: counter {c} arrived after {prev}",
                item.mac_id
            );
        }
    }
    assert_eq!(last.len(), 3, "every tape was delivered");
}

/// An unsynced boot holds captures, a sync repairs them, and a backward step loses or
/// reorders nothing.
#[test]
fn an_unsynced_boot_holds_captures_until_a_sync_repairs_them() {
    for day in Day::each() {
        let (_rt, mock) = mock_on(&day);
        let g = Gateway::new(&sim_config(&mock));
        let clock_file = g.path("clock.toml");

        // A Pi booted three weeks in the past, with systemd-timesyncd not yet synced.
        let started = now_secs(&day);
        set_clock(&clock_file, &day, -3 * WEEK_MS, false, true);
        let mut child = spawn_daemon(&g, &clock_file);

        let held = stats_when(&g, "captures held", |s| s.clock.held >= 30);
        assert_eq!(
            mock.decoded_items(),
            0,
            "a held capture reached the service"
        );
        assert_clock_says(&held, "unsynchronised: holding");
        let status = g.status_json();
        assert!(status["held"].as_u64().unwrap() >= 30, "{status}");

        // The time service syncs: the clock jumps three weeks forward.
        set_clock(&clock_file, &day, 0, true, true);
        let synced_at = now_secs(&day);
        let repaired = stats_when(&g, "held captures repaired and delivered", |s| {
            s.clock.held == 0
                && s.clock.repaired >= held.clock.held
                && s.delivered >= s.clock.repaired
        });
        assert_eq!(repaired.clock.estimated, 0);
        assert_eq!(
            repaired.clock.state.as_deref(),
            Some("synchronised"),
            "{repaired:?}"
        );
        let before_step = delivered_items(&mock);
        assert!(before_step.len() as u64 >= repaired.clock.repaired);
        for item in &before_step {
            let t = scan_time(item);
            assert!(
                (started - 1..=now_secs(&day) + 1).contains(&t),
                "scan_time {t} is not the capture's true time (test started at {started}, synced at {synced_at})"
            );
        }

        // The clock steps ten minutes back while running (synced): captures keep coming in
        // capture order, none lost.
        let delivered_at_step = repaired.delivered;
        let step_at = now_secs(&day);
        set_clock(&clock_file, &day, -600_000, true, true);
        eventually(Duration::from_secs(30), || {
            let items = delivered_items(&mock);
            items
                .iter()
                .filter(|i| scan_time(i) < step_at - 300)
                .nth(30)
                .map(|_| ())
        })
        .unwrap_or_else(|| {
            panic!(
                "captures after the backward step were not delivered; log:\n{}",
                log(&g)
            )
        });
        assert!(g.stats().delivered > delivered_at_step);

        stop(&mut child, &g);

        let items = delivered_items(&mock);
        assert_each_tape_arrived_whole_and_in_order(&items);
        let end = g.stats();
        assert_eq!(end.dead_letters, 0);
        assert_eq!(
            end.delivered,
            items.len() as u64,
            "each capture delivered once"
        );
        assert_eq!(
            end.admitted,
            end.delivered + end.pending,
            "every accepted capture is delivered or still pending"
        );
        assert_eq!(end.clock.held, 0);
    }
}

#[test]
fn with_no_time_service_an_unsynchronised_clock_is_trusted_and_said_so_once() {
    let day = Day::one();
    let (_rt, mock) = mock_on(&day);
    let g = Gateway::new(&sim_config(&mock));
    let clock_file = g.path("clock.toml");
    set_clock(&clock_file, &day, 0, false, false);
    let mut child = spawn_daemon(&g, &clock_file);

    stats_when(&g, "captures delivered", |s| s.delivered >= 30);
    let status = g.status_json();
    assert_eq!(
        status["clock"], "unsynchronised, no time service: trusted",
        "{status}"
    );
    assert_eq!(status["held"], 0, "{status}");
    stop(&mut child, &g);
    let said = log(&g)
        .matches("no time service runs to sync it: trusting it")
        .count();
    assert_eq!(said, 1, "log:\n{}", log(&g));
}

/// A clock restored behind the database holds captures until it is no longer behind.
#[test]
fn a_clock_behind_the_database_holds_captures_until_it_catches_up() {
    let day = Day::one();
    let (_rt, mock) = mock_on(&day);
    let g = Gateway::new(&sim_config(&mock));
    let clock_file = g.path("clock.toml");
    let started = now_secs(&day);

    // A first run with a right clock records times in the database.
    set_clock(&clock_file, &day, 0, false, false);
    let mut first = spawn_daemon(&g, &clock_file);
    stats_when(&g, "the first run delivers", |s| s.delivered >= 10);
    stop(&mut first, &g);
    // What the first run left pending was captured with a right clock: not held.
    let sendable = mock.decoded_items() + g.stats().pending;

    // Restarted with the clock a day behind (a clock restored from an old shutdown),
    // no time service: wrong for sure, so held.
    set_clock(&clock_file, &day, -24 * 3_600_000, false, false);
    let mut second = spawn_daemon(&g, &clock_file);
    let held = stats_when(&g, "captures held", |s| s.clock.held >= 20);
    assert_clock_says(&held, "behind the newest time already recorded");
    assert!(
        mock.decoded_items() <= sendable,
        "a capture taken with the clock behind reached the service"
    );

    // The clock is set right again: the held captures are re-timed by boot time and
    // sent, counted as estimated (no sync vouched for them).
    set_clock(&clock_file, &day, 0, false, false);
    let released = stats_when(&g, "held captures released and delivered", |s| {
        s.clock.held == 0
            && s.clock.estimated >= held.clock.held
            && mock.decoded_items() >= sendable + held.clock.held
    });
    assert_eq!(released.clock.repaired, 0);
    stop(&mut second, &g);

    let items = delivered_items(&mock);
    for item in &items {
        let t = scan_time(item);
        assert!(
            (started - 1..=now_secs(&day) + 1).contains(&t),
            "scan_time {t} is a day behind: not re-timed"
        );
    }
    // (The simulated fleet starts again from the same counters in each run, so order is
    // proven by the test above, within one run.)
    assert_eq!(g.stats().delivered, items.len() as u64);
}

/// A daemon killed if the test fails before it stops it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The value of the sample `key` (`name{labels}`) in a scrape of `/metrics` at `port`.
fn metric(port: u16, key: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    let key = format!("{key} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(str::to_string)
}

/// `tapegate_clock_state{state="..."}` of a scrape of `/metrics` at `port`.
fn clock_state_metric(port: u16, state: &str) -> Option<String> {
    metric(port, &format!("tapegate_clock_state{{state=\"{state}\"}}"))
}

#[test]
fn the_clock_state_metric_follows_the_clock_from_holding_to_synchronised() {
    let day = Day::one();
    let (_rt, mock) = mock_on(&day);
    let port = free_port();
    let g = Gateway::new(&format!(
        "{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        sim_config(&mock)
    ));
    let clock_file = g.path("clock.toml");
    set_clock(&clock_file, &day, -3 * WEEK_MS, false, true);
    let mut child = Running(spawn_daemon(&g, &clock_file));

    stats_when(&g, "captures held", |s| s.clock.held >= 3);
    let holding = eventually(Duration::from_secs(30), || {
        clock_state_metric(port, "holding").filter(|v| v == "1")
    });
    assert!(
        holding.is_some(),
        "status says holding, /metrics does not: trusted = {:?}\n{}",
        clock_state_metric(port, "trusted"),
        log(&g)
    );
    assert_eq!(clock_state_metric(port, "trusted").as_deref(), Some("0"));

    set_clock(&clock_file, &day, 0, true, true);
    stats_when(&g, "held captures released", |s| s.clock.held == 0);
    let synced = eventually(Duration::from_secs(30), || {
        clock_state_metric(port, "synchronised").filter(|v| v == "1")
    });
    assert!(synced.is_some(), "{}", log(&g));
    assert_eq!(clock_state_metric(port, "holding").as_deref(), Some("0"));
    stop(&mut child.0, &g);
}

/// Captures of a group still open when the clock is repaired are never sent with the
/// wrong time.
#[test]
fn a_group_open_when_the_clock_is_repaired_is_never_sent_wrongly_timed() {
    let day = Day::one();
    let (_rt, mock) = mock_on(&day);
    // A group stays open 10 s, and the clock's repair (looked at every second) lands
    // while one is.
    let config = sim_config(&mock).replace("commit_interval_ms = 20", "commit_interval_ms = 10000");
    assert!(config.contains("commit_interval_ms = 10000"));
    let port = free_port();
    let g = Gateway::new(&format!(
        "{config}\n[http]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let clock_file = g.path("clock.toml");
    let started = now_secs(&day);
    set_clock(&clock_file, &day, -3 * WEEK_MS, false, true);
    let mut child = Running(spawn_daemon(&g, &clock_file));

    // The first group commits (held) and the next one opens. Once it holds 20 captures
    // stamped with the wrong clock (heard, not committed), the clock syncs.
    let held = stats_when(&g, "a group committed and held", |s| s.clock.held > 0);
    eventually(Duration::from_secs(30), || {
        let heard: u64 = metric(port, "tapegate_adverts_total")?.parse().ok()?;
        (heard >= held.admitted + 20).then_some(())
    })
    .unwrap_or_else(|| panic!("the open group did not fill; log:\n{}", log(&g)));
    set_clock(&clock_file, &day, 0, true, true);
    let repaired = stats_when(&g, "the open group committed after the repair", |s| {
        s.clock.held == 0 && s.admitted >= held.admitted + 20 && s.pending == 0
    });
    assert_eq!(repaired.clock.estimated, 0);
    stop(&mut child.0, &g);

    let items = delivered_items(&mock);
    assert!(
        items.len() as u64 >= held.admitted + 20,
        "{} delivered",
        items.len()
    );
    let end = now_secs(&day);
    let wrong: Vec<i64> = items
        .iter()
        .map(scan_time)
        .filter(|t| !(started - 1..=end + 1).contains(t))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} captures sent with a wrong scan_time (e.g. {:?}; the test ran {started}..{end})",
        wrong.len(),
        items.len(),
        &wrong[..wrong.len().min(3)]
    );
    assert_each_tape_arrived_whole_and_in_order(&items);
}

/// In process, no binary: the ingest stage stamps what it hears by the clock it is
/// handed (here a hand clock years behind, at boot time 7 s), not the machine's: the
/// tapes heard carry its wall time and the committed capture its boot time.
#[tokio::test(start_paused = true)]
async fn the_ingest_stage_stamps_captures_by_the_clock_it_is_handed() {
    use std::sync::Arc;
    use tapegate::dedup::DedupSettings;
    use tapegate::heard_now::HeardNow;
    use tapegate::ingest::{run, IngestSettings};
    use tapegate::outbox::{Seeder, StoreOptions};
    use tapegate::record::{Advertisement, Mac};
    use tapegate::source::Heard;
    use tokio::sync::{mpsc, watch};

    const WALL: i64 = 1_600_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Seeder::open(dir.path(), StoreOptions::default()).unwrap();
    let (outbox, _owner) = store.start().unwrap();
    let time = Arc::new(tapegate::clock::fake::HandClock::new("boot-a"));
    time.set(WALL, 7_000, true, false);
    let tapes_heard = Arc::new(HeardNow::default());
    let (tx, rx) = mpsc::channel(16);
    let (committed_tx, mut committed) = watch::channel(0);
    let task = tokio::spawn(run(
        IngestSettings {
            products: tapegate::products::Products(Vec::new()),
            dedup: DedupSettings {
                window_ms: 0,
                min_interval_ms: 0,
                max_tracked: 1000,
            },
            commit_interval: Duration::from_millis(200),
            live: true,
            clock: None,
            time: time.clone(),
            beat: tapegate::util::systemd::Liveness::default()
                .stage("ingest", Duration::from_secs(10)),
            reload_products: None,
            reload_dedup: None,
            metrics: Arc::default(),
            tapes_heard: tapes_heard.clone(),
            admission: Arc::default(),
        },
        rx,
        tapegate::outbox::Handles::new(&outbox).ingest(),
        committed_tx,
        tokio_util::sync::CancellationToken::new(),
    ));
    let mac = Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]);
    let capture = common::fixture::capture(mac, WALL, "F70E01");
    let advert = Advertisement {
        ts_ms: WALL,
        mac,
        rssi: Some(-60),
        name: None,
        manufacturer_data: Vec::new(),
        service_data: Vec::new(),
    };
    let heard = Heard {
        advert,
        capture: Some(Box::new(capture)),
    };
    tx.send(heard).await.unwrap();
    committed.changed().await.unwrap();
    let heard_at: Vec<i64> = tapes_heard.since(0, 10).iter().map(|s| s.at).collect();
    assert_eq!(heard_at, vec![WALL]);
    let flusher = tapegate::outbox::Handles::new(&outbox).flusher();
    let fetched = flusher.fetch(10, 100, Default::default(), Vec::new());
    let batch = fetched.await.unwrap().rows;
    assert_eq!(batch[0].capture.boot_ms, Some(7_000));
    drop(tx);
    assert_eq!(task.await.unwrap().accepted, 1);
}
