//! End-to-end: the real binary captures replayed advertisements into a real SQLite
//! outbox (no [service] configured, so captures accumulate).

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use tapegate::record::Mac;

fn replay_config(path: &std::path::Path, dedup: (u32, u32), outbox: &str) -> String {
    format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n\n[dedup]\nwindow_secs = {}\nmin_interval_secs = {}\n\n[outbox]\n{outbox}\n",
        path.display(),
        dedup.0,
        dedup.1
    )
}

fn run_until_drained(g: &Gateway) -> std::process::Output {
    let out = g.run(&["run", "--until-drained"]);
    assert!(
        out.status.success(),
        "run failed ({:?}): {}",
        out.status,
        text(&out.stderr)
    );
    out
}

#[test]
fn replay_with_dedup_off_admits_every_tape_advert_and_drops_the_rest() {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    let mut adverts = Vec::new();
    for t in 0..20 {
        for m in 0..50 {
            adverts.push(tape_advert(
                tape_mac(m),
                T0_MS + 1_000_000 + t * 1000 + i64::from(m),
                t as u16,
            ));
            if m % 3 == 0 {
                adverts.push(other_advert(
                    Mac::new([0x11, 0, 0, 0, 0, m as u8]),
                    T0_MS + 1_000_000 + t * 1000,
                ));
            }
        }
    }
    write_records(&trace, &adverts);
    g.write_config(&replay_config(&trace, (0, 0), ""));
    run_until_drained(&g);

    let store = g.store();
    let pending = store.pending_captures().unwrap();
    assert_eq!(pending.len(), 1000);
    assert_eq!(store.count_pending_rows().unwrap(), 1000);
    // Admission order is the replay order; packets are as on air, upper-case hex.
    assert_eq!(pending[0].capture.mac, tape_mac(0));
    assert_eq!(pending[0].capture.packet, tape_packet(0));
    assert_eq!(&*pending[0].capture.product_id, "tape");
    assert_eq!(pending[999].capture.packet, tape_packet(19));
    let s = g.stats();
    assert_eq!((s.admitted, s.pending, s.evicted), (1000, 1000, 0));
}

#[test]
fn an_unchanged_packet_is_admitted_once_per_window() {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    // 10 tapes repeat one packet every second for 100 s; window 60 s, no throttle:
    // admitted at t = 0 and t = 60.
    let mut adverts = Vec::new();
    for t in 0..100 {
        for m in 0..10 {
            adverts.push(tape_advert(tape_mac(m), T0_MS + 2_000_000 + t * 1000, 7));
        }
    }
    write_records(&trace, &adverts);
    g.write_config(&replay_config(&trace, (60, 0), ""));
    run_until_drained(&g);

    let pending = g.store().pending_captures().unwrap();
    assert_eq!(pending.len(), 20);
    for m in 0..10 {
        let times: Vec<i64> = pending
            .iter()
            .filter(|p| p.capture.mac == tape_mac(m))
            .map(|p| p.capture.ts_ms)
            .collect();
        assert_eq!(
            times,
            vec![T0_MS + 2_000_000, T0_MS + 2_060_000],
            "tape {m}"
        );
    }
}

#[test]
fn a_changing_packet_is_throttled_and_its_newest_state_is_kept() {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    // 5 tapes change their packet every second for 20 s; one admission per 5 s. At
    // each interval end the newest held packet is admitted: 0, 4, 9, 14, and 19 (held
    // at the end of the replay, admitted when the source ends).
    let mut adverts = Vec::new();
    for t in 0..20 {
        for m in 0..5 {
            adverts.push(tape_advert(
                tape_mac(m),
                T0_MS + 3_000_000 + t * 1000,
                t as u16,
            ));
        }
    }
    write_records(&trace, &adverts);
    g.write_config(&replay_config(&trace, (60, 5), ""));
    run_until_drained(&g);

    let pending = g.store().pending_captures().unwrap();
    for m in 0..5 {
        let packets: Vec<String> = pending
            .iter()
            .filter(|p| p.capture.mac == tape_mac(m))
            .map(|p| p.capture.packet.clone())
            .collect();
        let want: Vec<String> = [0, 4, 9, 14, 19].iter().map(|c| tape_packet(*c)).collect();
        assert_eq!(packets, want, "tape {m}");
    }
    assert_eq!(pending.len(), 25);
}

#[test]
fn bad_replay_lines_are_reported_by_line_number_and_the_rest_is_ingested() {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    let good = |i: u32| tape_advert(tape_mac(i), T0_MS + 4_000_000 + i64::from(i), 1).to_record();
    let lines = [
        good(1),
        "{\"ts\": 1, \"mac\": \"not-a-mac\", \"manufacturer_data\": {}}".to_string(),
        good(2),
        String::new(),
        "this is not json".to_string(),
        good(3),
    ];
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    g.write_config(&replay_config(&trace, (0, 0), ""));
    let out = run_until_drained(&g);
    let err = text(&out.stderr);
    assert!(err.contains("line 2") || err.contains("line=2"), "{err}");
    assert!(err.contains("line 5") || err.contains("line=5"), "{err}");
    assert!(
        !err.contains("line 4") && !err.contains("line=4"),
        "a blank line is not an error: {err}"
    );
    assert_eq!(g.stats().pending, 3);
}

#[test]
fn past_max_pending_the_oldest_captures_are_evicted_and_counted() {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    let adverts: Vec<_> = (0..250)
        .map(|i| tape_advert(tape_mac(i), T0_MS + 5_000_000 + i64::from(i), i as u16))
        .collect();
    write_records(&trace, &adverts);
    g.write_config(&replay_config(&trace, (0, 0), "max_pending = 100"));
    run_until_drained(&g);

    let s = g.stats();
    assert_eq!((s.admitted, s.pending, s.evicted), (250, 100, 150));
    let pending = g.store().pending_captures().unwrap();
    let macs: Vec<Mac> = pending.iter().map(|p| p.capture.mac).collect();
    let newest: Vec<Mac> = (150..250).map(tape_mac).collect();
    assert_eq!(macs, newest, "the newest captures are kept");
}

#[test]
fn a_corrupt_database_is_moved_aside_and_a_fresh_one_started() {
    let g = Gateway::new("");
    std::fs::create_dir_all(g.state_dir()).unwrap();
    let db = g.state_dir().join("outbox.db");
    std::fs::write(
        &db,
        b"this is not a database, it is a tape measure".repeat(200),
    )
    .unwrap();
    let trace = g.path("trace.jsonl");
    write_records(&trace, &[tape_advert(tape_mac(1), T0_MS + 6_000_000, 1)]);
    g.write_config(&replay_config(&trace, (0, 0), ""));

    let out = run_until_drained(&g);
    let err = text(&out.stderr);
    let aside: Vec<_> = std::fs::read_dir(g.state_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("outbox.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(err.contains("ERROR"), "{err}");
    assert!(
        err.contains(&aside[0]) && err.contains(&db.display().to_string()),
        "{err}"
    );
    assert_eq!(g.stats().pending, 1);
    // The next start finds a healthy database and moves nothing.
    run_until_drained(&g);
    assert_eq!(g.stats().pending, 2);
}

#[test]
fn sigterm_commits_what_is_held_and_exits_0() {
    let g = Gateway::new(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"-\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n[outbox]\ncommit_interval_ms = 10000\n",
    );
    let mut child = g
        .command(&["run"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..300 {
        writeln!(
            stdin,
            "{}",
            tape_advert(tape_mac(i), T0_MS + 7_000_000, 1).to_record()
        )
        .unwrap();
    }
    stdin.flush().unwrap();
    // The commit interval is ten seconds: once the daemon has read every line from the
    // pipe, those after the first commit are held (in the source's buffer or the
    // group), not committed.
    let read_all = eventually(Duration::from_secs(15), || {
        (unread_bytes(&stdin) == 0).then_some(())
    });
    assert!(read_all.is_some(), "the daemon did not read its input");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        text(&out.stderr)
    );
    drop(stdin);
    assert_eq!(g.stats().pending, 300);
}

#[test]
fn kill_9_while_ingesting_keeps_every_capture_committed_before_it() {
    let g = Gateway::new(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"-\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n[outbox]\ncommit_interval_ms = 50\n",
    );
    let mut child = g
        .command(&["run"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut sent = 0u32;
    let mut send = |n: u32, stdin: &mut std::process::ChildStdin| {
        let mut buf = String::new();
        for _ in 0..n {
            buf.push_str(
                &tape_advert(
                    tape_mac(sent % 4096),
                    T0_MS + 8_000_000 + i64::from(sent),
                    sent as u16,
                )
                .to_record(),
            );
            buf.push('\n');
            sent += 1;
        }
        stdin.write_all(buf.as_bytes()).unwrap();
    };
    send(5000, &mut stdin);
    // Read the state database while the daemon runs until all 5000 are committed.
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        let s = g.status_json();
        let pending = s["pending"].as_u64().unwrap();
        if pending == 5000 || Instant::now() > deadline {
            break pending;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(committed, 5000);
    // More, and kill -9 in the middle of ingesting them.
    send(20_000, &mut stdin);
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();

    let store = g.store();
    let rows = store.pending_captures().unwrap();
    assert!(
        rows.len() >= 5000,
        "lost committed captures: {}",
        rows.len()
    );
    // What survived is exactly a prefix of what was sent, in order, with no gaps.
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.capture.ts_ms, T0_MS + 8_000_000 + i as i64, "row {i}");
    }
    // The database is whole: a fresh start opens it without quarantine.
    let check = rusqlite_quick_check(&g.state_dir().join("outbox.db"));
    assert_eq!(check, "ok");
    let s = store.stats().unwrap();
    assert_eq!(s.admitted, rows.len() as u64);
}

fn rusqlite_quick_check(path: &std::path::Path) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}
