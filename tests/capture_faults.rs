//! End-to-end, through the real binary and a real SQLite file: what the daemon and the
//! operator commands do when things go wrong (a full disk, a bad config, refused
//! captures) and what `status` reports.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use tapegate::outbox::{OutboxError, Outcome, Reading, Seeder, StateReader, StoreOptions};
use tapegate::record::{Advertisement, Capture, Mac};

// ---------------------------------------------------------------------------------
// A full disk
// ---------------------------------------------------------------------------------

/// A tmpfs mounted on a directory, unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `"8m"`) on `dir`. `None` when this process may
    /// not mount, after [`skip`] said so (under CI that is a failure instead).
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size}")).unwrap();
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if rc == 0 {
            return Some(Tmpfs {
                dir: dir.to_path_buf(),
            });
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                skip(&format!("mounting a tmpfs needs root ({err})"));
                None
            }
            _ => panic!("cannot mount a tmpfs on {}: {err}", dir.display()),
        }
    }

    /// Bytes an unprivileged writer can still allocate.
    fn free_bytes(&self) -> u64 {
        let path = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut s) }, 0);
        s.f_bavail * s.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        // Detach, so it goes even if a daemon that outlived a failed test holds files.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A test that cannot run here says so where `cargo test` shows it (stderr, past the
/// output capture), and passes; under CI (`CI` set, where `.ci/run` runs as root) it
/// fails instead, so that a CI that cannot run it is noticed rather than green.
fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("the full-disk test cannot run under CI: {why}");
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED the full-disk test: {why} ***\n*** (under CI, `CI` set, this is a failure) ***\n"
    );
}

const FULL_DISK_T0: i64 = common::T0_MS + 9_000_000;

/// Capture `i` of the disk-full test: its capture time says where it was sent.
fn nth_advert(i: u32) -> Advertisement {
    tape_advert(tape_mac(i % 64), FULL_DISK_T0 + i64::from(i), i as u16)
}

/// Asserts the pending rows are captures `0..n` in order, with nothing missing.
fn assert_gap_free_prefix(g: &Gateway) -> usize {
    let rows = g.store().pending_captures().unwrap();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(
            r.capture.ts_ms,
            FULL_DISK_T0 + i as i64,
            "row {i} of {}",
            rows.len()
        );
    }
    rows.len()
}

/// A full disk holds the group, loses nothing committed, and recovers when space
/// returns.
#[test]
fn a_full_disk_holds_the_group_and_loses_nothing_committed() {
    if unsafe { libc::geteuid() } != 0 {
        skip("mounting a tmpfs needs root");
        return;
    }
    let g = Gateway::new(&stdin_replay_config(20));
    // The filler decides when the disk is full; 8 MiB leaves room, once it is gone, for
    // everything sent and for the WAL (SQLite checkpoints it at about 4 MiB).
    let Some(tmpfs) = Tmpfs::mount(&g.state_dir(), "8m") else {
        return;
    };
    // Every further failed commit is logged at debug: the test counts them.
    let mut daemon = Daemon::start_with(&g, |c| {
        c.env("RUST_LOG", "info,tapegate::ingest=debug");
    });

    // Some captures commit while there is room.
    let mut sent = 0u32;
    let first: Vec<_> = (0..200).map(nth_advert).collect();
    daemon.send(&first);
    sent += 200;
    let committed = eventually(Duration::from_secs(30), || {
        let s = g.try_stats()?;
        (s.pending == 200).then_some(s)
    });
    assert!(committed.is_some(), "{}", daemon.stderr());

    // Fill the disk but for a few pages, then keep capturing until a commit fails.
    let filler = g.state_dir().join("filler");
    let room = 32 * 1024;
    let fill = tmpfs.free_bytes().saturating_sub(room) as usize;
    std::fs::write(&filler, vec![0x5Au8; fill]).unwrap();
    assert!(tmpfs.free_bytes() <= room + 8 * 1024);
    const WARNING: &str = "outbox write failed; holding the group and retrying";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.stderr().contains(WARNING) {
        assert!(
            Instant::now() < deadline && sent < 3000,
            "no failed write after {sent} captures:\n{}",
            daemon.stderr()
        );
        let chunk: Vec<_> = (sent..sent + 25).map(nth_advert).collect();
        daemon.send(&chunk);
        sent += 25;
        std::thread::sleep(Duration::from_millis(30));
    }
    // More arrive while the disk is full; they wait behind the held group.
    let more: Vec<_> = (sent..sent + 100).map(nth_advert).collect();
    daemon.send(&more);
    sent += 100;

    let log = daemon.stderr();
    let warning = log.lines().find(|l| l.contains(WARNING)).unwrap();
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("disk is full"),
        "the cause is a full disk: {warning}"
    );
    assert!(daemon.is_running(), "the daemon stays up:\n{log}");
    // Nothing committed is lost, and what is not committed is held, not dropped.
    let kept = assert_gap_free_prefix(&g);
    assert!(kept >= 200, "{kept} rows");
    assert!(
        kept < sent as usize,
        "the disk was not full: all {sent} committed"
    );
    let s = g.stats();
    assert_eq!((s.admitted, s.pending), (kept as u64, kept as u64));
    // The disk stays full while several retries fail (100, 200, 400 ms apart): the
    // daemon stays up and the held group is neither committed nor dropped.
    const AGAIN: &str = "outbox write failed again";
    let retried = eventually(Duration::from_secs(30), || {
        (daemon.stderr().matches(AGAIN).count() >= 3).then_some(())
    });
    assert!(retried.is_some(), "no retries:\n{}", daemon.stderr());
    assert!(
        daemon.is_running(),
        "the daemon stays up:\n{}",
        daemon.stderr()
    );
    assert_eq!(assert_gap_free_prefix(&g), kept);
    assert_eq!(g.stats().admitted, kept as u64);

    // Space returns: every capture sent ends up pending, in order.
    std::fs::remove_file(&filler).unwrap();
    let recovered = eventually(Duration::from_secs(30), || {
        let s = g.try_stats()?;
        (s.pending == u64::from(sent)).then_some(s)
    });
    let s = recovered.unwrap_or_else(|| {
        panic!(
            "not all {sent} pending: {:?}\n{}",
            g.stats(),
            daemon.stderr()
        )
    });
    assert_eq!(assert_gap_free_prefix(&g), sent as usize);
    assert_eq!(s.admitted, s.pending);
    assert_eq!(s.evicted, 0);
    assert_eq!(integrity_check(&StateReader::path_in(&g.state_dir())), "ok");
    assert!(
        daemon.stderr().contains("outbox write recovered"),
        "{}",
        daemon.stderr()
    );

    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{log}");
    assert_eq!(g.stats().pending, u64::from(sent));
}

fn capture(i: u32) -> Capture {
    fixture::capture(
        tape_mac(i % 64),
        FULL_DISK_T0 + i64::from(i),
        tape_packet(i as u16),
    )
}

/// A group that does not fit fails retryably, changes nothing, and commits once there
/// is room.
#[test]
fn a_group_that_does_not_fit_fails_retryably_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let capped = |pages| StoreOptions {
        max_page_count: Some(pages),
        ..StoreOptions::default()
    };
    let group = |n: u32| -> Vec<Capture> { (n * 50..n * 50 + 50).map(capture).collect() };
    let (mut store, _) = Seeder::open(dir.path(), capped(16)).unwrap();

    let mut n = 0;
    let (err, stats_before, rows_before) = loop {
        assert!(n < 1000, "16 pages never filled up");
        let stats = store.stats().unwrap();
        let rows = store.pending_captures().unwrap();
        match store.enqueue(&group(n)) {
            Ok(evicted) => assert_eq!(evicted, 0),
            Err(e) => break (e, stats, rows),
        }
        n += 1;
    };
    assert!(n > 0, "the first group fits");
    assert!(err.is_retryable(), "{err}");
    match &err {
        OutboxError::WriteFailed(e) => {
            assert_eq!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull))
        }
        other => panic!("not WriteFailed: {other:?}"),
    }
    assert_eq!(store.stats().unwrap(), stats_before);
    assert_eq!(store.pending_captures().unwrap(), rows_before);
    assert_eq!(stats_before.admitted, u64::from(n) * 50);
    // Trying again while still full fails the same way and still changes nothing.
    assert!(store.enqueue(&group(n)).unwrap_err().is_retryable());
    assert_eq!(store.stats().unwrap(), stats_before);
    drop(store);

    let (mut store, report) = Seeder::open(dir.path(), capped(1000)).unwrap();
    assert_eq!(report.pending, u64::from(n) * 50);
    assert_eq!(store.enqueue(&group(n)).unwrap(), 0);
    let s = store.stats().unwrap();
    assert_eq!(
        (s.admitted, s.pending),
        ((u64::from(n) + 1) * 50, (u64::from(n) + 1) * 50)
    );
    let rows = store.pending_captures().unwrap();
    let sent: Vec<Capture> = (0..(n + 1) * 50).map(capture).collect();
    let got: Vec<Capture> = rows.into_iter().map(|p| p.capture).collect();
    assert_eq!(got, sent);
    assert_eq!(integrity_check(store.path()), "ok");
}

// ---------------------------------------------------------------------------------
// A bad config
// ---------------------------------------------------------------------------------

const PASSWORD: &str = "s3cr3t-hunter2";

fn bad_config() -> String {
    format!(
        r#"
[service]
environment = "ppe"
[service.environments.ppe]
base_url = "not a url"
auth_url = "https://auth.example.com/oauth/token"
client_id = "cid"
audience = "aud"
username = "gw"
password = "{PASSWORD}"
customer_id = "cust"
authorized_groups = "grp"

[scanner]
source = "radio"

[dedup]
window_secs = 60
windw = 5

[flush]
max_batch = 300
"#
    )
}

fn assert_exit_2(out: &std::process::Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {err}", out.status);
    err
}

#[test]
fn a_bad_config_exits_2_naming_every_bad_key_its_value_and_what_was_expected() {
    let g = Gateway::new(&bad_config());
    for command in [&["status"][..], &["run"], &["dead-letters", "list"]] {
        let out = g.run(command);
        let err = assert_exit_2(&out);
        assert!(out.stdout.is_empty(), "{command:?}: {}", text(&out.stdout));
        for needle in [
            g.config_path().display().to_string().as_str(),
            "4 problem(s)",
            "flush.max_batch = 300: expected a whole number from 1 to 250",
            "scanner.source = \"radio\": expected one of ble | replay | sim",
            "dedup.windw: unknown field `windw`, expected one of `window_secs`",
            "service.environments.ppe.base_url = \"not a url\": expected an http(s) URL",
        ] {
            assert!(err.contains(needle), "{command:?} lacks {needle:?}:\n{err}");
        }
        assert!(
            !err.contains(PASSWORD),
            "{command:?} shows the password:\n{err}"
        );
    }
    // Loading a config has no side effects: `run` did not create the state database.
    assert!(!g.state_dir().exists());
}

#[test]
fn a_missing_config_file_exits_2_naming_its_path() {
    let g = Gateway::new("");
    std::fs::remove_file(g.config_path()).unwrap();
    for command in [&["status"][..], &["run"]] {
        let err = assert_exit_2(&g.run(command));
        assert!(
            err.contains(&g.config_path().display().to_string()),
            "{command:?}: {err}"
        );
    }
}

#[test]
fn a_bad_environment_override_exits_2_naming_the_key_it_overrides() {
    let g = Gateway::new("");
    assert!(
        g.run(&["status"]).status.success(),
        "the file itself is fine"
    );
    let out = g
        .command(&["status"])
        .env("TAPEGATE_FLUSH__MAX_BATCH", "0")
        .output()
        .unwrap();
    let err = assert_exit_2(&out);
    assert!(
        err.contains("flush.max_batch = 0: expected a whole number from 1 to 250"),
        "{err}"
    );
}

#[test]
fn a_usage_error_exits_2() {
    let g = Gateway::new("");
    let err = assert_exit_2(&g.run(&["frobnicate"]));
    assert!(err.contains("frobnicate"), "{err}");
    let err = assert_exit_2(&g.run(&["dead-letters", "retry", "--mac", "not-a-mac"]));
    assert!(err.contains("--mac"), "{err}");
}

// ---------------------------------------------------------------------------------
// dead-letters
// ---------------------------------------------------------------------------------

const MAC_A: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x0A]);
const MAC_B: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x0B]);
const MAC_C: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x0C]);
const MAC_D: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x0D]);
const NOT_FOUND: &str = "device not found";
const BAD_PACKET: &str = "invalid ble_packet";

fn capture_of(mac: Mac, ts_ms: i64) -> Capture {
    Capture {
        rssi: Some(-61),
        ..fixture::capture(mac, ts_ms, tape_packet(ts_ms as u16))
    }
}

/// Through the real store: A is refused twice, B once, C is delivered and D stays
/// pending. Admitted 5 = delivered 1 + dead letters 3 + pending 1.
fn gateway_with_dead_letters() -> Gateway {
    let g = Gateway::new("");
    let (mut store, _) = Seeder::open(&g.state_dir(), StoreOptions::default()).unwrap();
    store
        .enqueue(&[
            capture_of(MAC_A, 1_000),
            capture_of(MAC_A, 2_000),
            capture_of(MAC_B, 1_100),
            capture_of(MAC_C, 1_200),
            capture_of(MAC_D, 1_300),
        ])
        .unwrap();
    let refuse = |p, error: &str| (p, Outcome::DeadLetter(error.to_string()));
    let batch = store.next_batch(250, 10_000).unwrap();
    assert_eq!(batch.len(), 4, "one capture of each MAC");
    let [a1, b1, c1, _d1] = <[_; 4]>::try_from(batch).unwrap();
    let decoded = Outcome::Delivered(Reading {
        qr_code: Some(format!("TT{}", MAC_C.plain())),
        temp: Some(21.5),
        bat: Some(87.0),
    });
    store
        .settle(
            &[refuse(a1, NOT_FOUND), refuse(b1, BAD_PACKET), (c1, decoded)],
            5_000,
        )
        .unwrap();
    let batch = store.next_batch(250, 10_000).unwrap();
    let a2 = batch.into_iter().find(|p| p.capture.mac == MAC_A).unwrap();
    assert_eq!(a2.capture.ts_ms, 2_000);
    store.settle(&[refuse(a2, NOT_FOUND)], 6_000).unwrap();
    g
}

fn assert_invariant(s: &serde_json::Value) {
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert_eq!(
        n("admitted"),
        n("delivered") + n("dead_letters") + n("evicted") + n("pending"),
        "{s}"
    );
}

fn counts(s: &serde_json::Value) -> [u64; 4] {
    [
        "pending",
        "delivered",
        "dead_letters",
        "dead_letters_stored",
    ]
    .map(|k| s[k].as_u64().unwrap())
}

#[test]
fn dead_letters_are_listed_with_their_error_for_people_and_as_json() {
    let g = gateway_with_dead_letters();

    let out = g.run(&["dead-letters", "list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    let lines: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "a header and three dead letters:\n{listed}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(&MAC_A.to_string()) && l.contains(NOT_FOUND))
            .count(),
        2,
        "{listed}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&MAC_B.to_string()) && l.contains(BAD_PACKET)),
        "{listed}"
    );

    let out = g.run(&["dead-letters", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut got: Vec<(String, String, i64, String)> = rows
        .iter()
        .map(|r| {
            (
                r["mac"].as_str().unwrap().to_string(),
                r["error"].as_str().unwrap().to_string(),
                r["captured_at"].as_i64().unwrap(),
                r["packet"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let row = |mac: Mac, error: &str, ts: i64| {
        (
            mac.to_string(),
            error.to_string(),
            ts,
            tape_packet(ts as u16),
        )
    };
    assert_eq!(
        got,
        vec![
            row(MAC_A, NOT_FOUND, 1_000),
            row(MAC_A, NOT_FOUND, 2_000),
            row(MAC_B, BAD_PACKET, 1_100),
        ]
    );
}

#[test]
fn retry_re_queues_only_that_macs_dead_letters_and_purge_deletes_the_rest() {
    let g = gateway_with_dead_letters();
    let s = g.status_json();
    assert_eq!(counts(&s), [1, 1, 3, 3]);
    assert_invariant(&s);

    // Any spelling of the MAC names it.
    let out = g.run(&["dead-letters", "retry", "--mac", "c0ffee00000a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("re-queued 2"),
        "{}",
        text(&out.stdout)
    );
    let s = g.status_json();
    assert_eq!(counts(&s), [3, 1, 1, 1], "{s}");
    assert_invariant(&s);
    let pending: Vec<(Mac, i64)> = g
        .store()
        .pending_captures()
        .unwrap()
        .into_iter()
        .map(|p| (p.capture.mac, p.capture.ts_ms))
        .collect();
    assert_eq!(
        pending,
        vec![(MAC_D, 1_300), (MAC_A, 1_000), (MAC_A, 2_000)],
        "A's captures are back, in capture order"
    );
    let left = g.store().dead_letters(10).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!((left[0].mac, left[0].error.as_str()), (MAC_B, BAD_PACKET));

    let out = g.run(&["dead-letters", "purge"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("purged 1"),
        "{}",
        text(&out.stdout)
    );
    let s = g.status_json();
    // B still counts as refused; only the stored copy is gone.
    assert_eq!(counts(&s), [3, 1, 1, 0], "{s}");
    assert_invariant(&s);
    let out = g.run(&["dead-letters", "list", "--json"]);
    assert_eq!(text(&out.stdout).trim(), "[]");
}

// ---------------------------------------------------------------------------------
// status
// ---------------------------------------------------------------------------------

/// The number `status` prints on the line of `label`.
fn human_number(status: &str, label: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line:\n{status}"));
    let digits: String = line
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {label:?}:\n{status}"))
}

#[test]
fn status_of_a_gateway_that_never_ran_is_all_zeros_and_creates_nothing() {
    let g = Gateway::new("");
    let s = g.status_json();
    assert_eq!(s["database_exists"], false);
    for k in [
        "pending",
        "delivered",
        "dead_letters",
        "evicted",
        "admitted",
    ] {
        assert_eq!(s[k], 0, "{k} in {s}");
    }
    for k in ["oldest_pending_age_secs", "last_flush_ok_at", "last_error"] {
        assert!(s[k].is_null(), "{k} in {s}");
    }
    let out = g.run(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout);
    assert!(human.contains("not created yet"), "{human}");
    assert_eq!(human_number(&human, "pending"), 0);
    assert!(!StateReader::path_in(&g.state_dir()).exists());
}

/// Status after a run reports the counts, the oldest pending age, the last flush and
/// the last error.
#[cfg(debug_assertions)]
#[test]
fn status_after_a_run_reports_counts_ages_and_the_last_error() {
    // `status` tells ages by its clock.
    let day = common::day::Day::one();
    let started = day.now_ms();
    let hour_ago = started - 3_600_000;
    // Six captures, the first two evicted by max_pending = 4; the oldest kept one was
    // captured an hour ago.
    let times = [
        hour_ago - 7_200_000,
        hour_ago - 3_600_000,
        hour_ago,
        hour_ago + 60_000,
        hour_ago + 120_000,
        hour_ago + 180_000,
    ];
    let g = Gateway::new("");
    day.set_on(&g);
    let trace = g.path("trace.jsonl");
    let adverts: Vec<_> = times
        .iter()
        .enumerate()
        .map(|(i, t)| tape_advert(tape_mac(i as u32), *t, i as u16))
        .collect();
    write_records(&trace, &adverts);
    g.write_config(&format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n[outbox]\nmax_pending = 4\n",
        trace.display()
    ));
    let out = g.run(&["run", "--until-drained"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // One capture delivered, one refused; a flush went well, then one failed.
    let flush_ok_at = 1_763_719_200_000;
    let error = "the service refused the credentials (401): credentials or permission";
    {
        let (mut store, _) = Seeder::open(&g.state_dir(), StoreOptions::default()).unwrap();
        let batch = store.next_batch(250, 10_000).unwrap();
        let of = |i: usize| {
            batch
                .iter()
                .find(|p| p.capture.mac == tape_mac(i as u32))
                .unwrap()
                .clone()
        };
        let decoded = Outcome::Delivered(Reading {
            qr_code: None,
            temp: None,
            bat: None,
        });
        store
            .settle(
                &[
                    (of(3), decoded),
                    (of(4), Outcome::DeadLetter(NOT_FOUND.into())),
                ],
                flush_ok_at,
            )
            .unwrap();
        store.note_flush_ok(flush_ok_at).unwrap();
        store.note_error(error, flush_ok_at + 60_000).unwrap();
    }

    let s = g.status_json();
    let checked = day.now_ms();
    assert_eq!(s["database_exists"], true);
    assert_eq!(s["admitted"], 6);
    assert_eq!(s["evicted"], 2);
    assert_eq!(s["delivered"], 1);
    assert_eq!(s["dead_letters"], 1);
    assert_eq!(s["pending"], 2);
    assert_invariant(&s);
    let age = s["oldest_pending_age_secs"].as_i64().unwrap();
    let (least, most) = ((started - hour_ago) / 1000, (checked - hour_ago) / 1000);
    assert!(
        (least..=most).contains(&age),
        "{age} not in {least}..={most}"
    );
    assert_eq!(s["last_flush_ok_at"], "2025-11-21T10:00:00Z");
    assert_eq!(s["last_error"], error);

    // The replay record keeps capture times to the millisecond, give or take one.
    let oldest = g.stats().oldest_pending_at.unwrap();
    assert!((oldest - hour_ago).abs() <= 1, "{oldest} vs {hour_ago}");
    let out = g.run(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout);
    assert_eq!(human_number(&human, "pending"), 2);
    assert_eq!(human_number(&human, "delivered"), 1);
    assert_eq!(human_number(&human, "dead letters"), 1);
    assert_eq!(human_number(&human, "evicted"), 2);
    assert!(
        human.contains(&tapegate::clock::rfc3339(oldest)),
        "the oldest pending capture time:\n{human}"
    );
    assert!(human.contains("2025-11-21T10:00:00Z"), "{human}");
    assert!(human.contains(error), "{human}");
}

// ---------------------------------------------------------------------------------
// Health and ownership of the state (issue 20)
// ---------------------------------------------------------------------------------

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `(status, body)` of `GET path` at `port`, or `None` while nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// `/healthz` is 503 naming the outbox from the first failed commit until one succeeds.
#[test]
fn healthz_is_503_naming_the_outbox_while_commits_fail() {
    if !is_root() {
        println!("skipped: needs root to mount tmpfs");
        return;
    }
    let port = free_port();
    let g = Gateway::new(&format!(
        "{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        stdin_replay_config(20)
    ));
    let Some(tmpfs) = Tmpfs::mount(&g.state_dir(), "8m") else {
        return;
    };
    let mut daemon = Daemon::start(&g);
    let healthz = || http_get(port, "/healthz");
    eventually(Duration::from_secs(30), || {
        healthz().filter(|(s, _)| *s == 200)
    })
    .unwrap_or_else(|| panic!("not serving:\n{}", daemon.stderr()));

    let filler = g.state_dir().join("filler");
    let fill = tmpfs.free_bytes().saturating_sub(32 * 1024) as usize;
    std::fs::write(&filler, vec![0x5Au8; fill]).unwrap();
    // Captures until a commit fails (a bounded number: a stage holding a group reads no
    // more, and a full pipe would block this test).
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.stderr().contains("outbox write failed") {
        assert!(
            Instant::now() < deadline && sent < 3000,
            "no failed write after {sent} captures:\n{}",
            daemon.stderr()
        );
        daemon.send(&(sent..sent + 25).map(nth_advert).collect::<Vec<_>>());
        sent += 25;
        std::thread::sleep(Duration::from_millis(30));
    }
    let unhealthy = eventually(Duration::from_secs(30), || {
        healthz().filter(|(s, _)| *s == 503)
    })
    .unwrap_or_else(|| {
        panic!(
            "/healthz stayed 200 with the disk full:\n{}",
            daemon.stderr()
        )
    });
    assert!(
        unhealthy
            .1
            .starts_with("outbox: captures cannot be committed")
            && unhealthy.1.contains("full"),
        "{}",
        unhealthy.1
    );
    let (_, page) = http_get(port, "/").unwrap();
    assert!(page.contains("Not healthy: outbox: "), "{page}");

    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(30), || {
        healthz().filter(|(s, _)| *s == 200)
    })
    .unwrap_or_else(|| panic!("not healthy again:\n{}", daemon.stderr()));
    let s = eventually(Duration::from_secs(30), || {
        g.try_stats().filter(|s| s.pending == u64::from(sent))
    });
    assert!(s.is_some(), "nothing lost: {:?}", g.try_stats());
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log}");
}

/// The user the daemon runs as in these tests, as the unit's `User=` would be.
const NOBODY: u32 = 65534;

/// A gateway whose files `nobody` can reach, with its state directory made as the
/// unit's `StateDirectory=` makes it: owned by the daemon's user (`nobody`), 0700.
fn gateway_of_nobody(extra: &str) -> Gateway {
    use std::os::unix::fs::PermissionsExt;
    let g = Gateway::new(extra);
    std::fs::set_permissions(g.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(g.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(g.state_dir()).unwrap();
    std::os::unix::fs::chown(g.state_dir(), Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(g.state_dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    g
}

#[test]
fn an_operator_command_run_as_root_creates_the_database_for_the_daemons_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if !is_root() {
        println!("skipped: needs root to act as two users");
        return;
    }
    let (_rt, mock) = mock_with(tapegate_mock::MockConfig::demo());
    let g = gateway_of_nobody(&format!(
        "{}{}",
        mock_service_section(&mock),
        stdin_replay_config(20)
    ));
    // `sudo tapegate device show --qr ...` before the daemon ever ran: the rate window
    // is kept in the state database, which this creates.
    let out = g.run(&["device", "show", "--qr", "TTC0FFEE000001"]);
    assert!(
        !text(&out.stderr).contains("cannot"),
        "{}",
        text(&out.stderr)
    );
    let db = StateReader::path_in(&g.state_dir());
    for file in std::fs::read_dir(g.state_dir()).unwrap() {
        let file = file.unwrap();
        let m = file.metadata().unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (NOBODY, NOBODY),
            "{} is not the daemon user's",
            file.path().display()
        );
    }
    assert_eq!(
        std::fs::metadata(&db).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The daemon, as its user, admits into it.
    let mut daemon = Daemon::start_with(&g, |c| {
        c.uid(NOBODY).gid(NOBODY);
    });
    daemon.send(&(0..5).map(nth_advert).collect::<Vec<_>>());
    let admitted = eventually(Duration::from_secs(30), || {
        g.try_stats().filter(|s| s.admitted == 5)
    });
    assert!(
        admitted.is_some(),
        "the daemon admitted nothing:\n{}",
        daemon.stderr()
    );
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log}");
}

#[test]
fn a_daemon_that_cannot_write_its_database_exits_5_naming_the_path_and_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !is_root() {
        println!("skipped: needs root to act as two users");
        return;
    }
    let empty = tempfile::NamedTempFile::new().unwrap();
    std::fs::set_permissions(empty.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let g = gateway_of_nobody(&format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n",
        empty.path().display()
    ));
    // As an older tapegate's root-run command left it: root's, readable by all.
    let db = StateReader::path_in(&g.state_dir());
    drop(Seeder::open(&g.state_dir(), StoreOptions::default()).unwrap());
    std::os::unix::fs::chown(&db, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = g
        .command(&["run", "--until-drained"])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "not restarted:\n{err}");
    let said = err
        .lines()
        .find(|l| l.contains("cannot be written"))
        .unwrap_or_else(|| panic!("no reason:\n{err}"));
    assert!(
        said.contains(&db.display().to_string())
            && said.contains("owned by root (uid 0)")
            && said.contains("Fix: sudo chown nobody:"),
        "{said}"
    );
}

/// `status`, `tapes` and `dead-letters` work for a user who may read the state but not
/// write it.
#[test]
fn read_commands_work_for_a_user_who_may_read_but_not_write_the_state() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !is_root() {
        println!("skipped: needs root to act as two users");
        return;
    }
    let g = Gateway::new(&stdin_replay_config(20));
    std::fs::set_permissions(g.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(g.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    // The daemon's state, opened to a group the reader is in (the reader: nobody).
    let db = StateReader::path_in(&g.state_dir());
    drop(Seeder::open(&g.state_dir(), StoreOptions::default()).unwrap());
    for (path, mode) in [(g.state_dir(), 0o750), (db.clone(), 0o640)] {
        std::os::unix::fs::chown(&path, Some(0), Some(NOBODY)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let read_as_reader = |args: &[&str]| {
        let out = g
            .command(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?} as a reader: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let pending = |json: &str| -> u64 {
        serde_json::from_str::<serde_json::Value>(json).unwrap()["pending"]
            .as_u64()
            .unwrap()
    };
    let listing = || std::fs::read_dir(g.state_dir()).unwrap().count();

    // The daemon running (as the owner).
    let mut daemon = Daemon::start(&g);
    daemon.send(&(0..3).map(nth_advert).collect::<Vec<_>>());
    eventually(Duration::from_secs(30), || {
        g.try_stats().filter(|s| s.pending == 3)
    })
    .unwrap_or_else(|| panic!("not committed:\n{}", daemon.stderr()));
    assert_eq!(pending(&read_as_reader(&["status", "--json"])), 3);
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log}");

    // The daemon stopped: nothing to read through but the file.
    let files = listing();
    assert_eq!(pending(&read_as_reader(&["status", "--json"])), 3);
    assert!(read_as_reader(&["status"]).contains("pending        3"));
    assert!(read_as_reader(&["tapes"]).contains("no decoded tapes yet"));
    assert!(read_as_reader(&["dead-letters", "list"]).contains("no dead letters"));
    assert_eq!(listing(), files, "a reader created nothing");
}
