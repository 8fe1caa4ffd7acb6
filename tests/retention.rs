//! Retention by age and size through the real binary and a real SQLite file: captures
//! past `outbox.max_age_secs` or beyond `outbox.max_bytes` are evicted oldest first,
//! counted by the bound that evicted them in `status --json` and `/metrics`, the newest
//! kept, the database file never past its bound, and every accepted capture still
//! accounted for (`admitted = pending + delivered + dead letters + evicted`).

mod common;

use std::time::Duration;

#[cfg(debug_assertions)]
use common::day::Day;
use common::{eventually, stdin_replay_config, tape_advert, tape_mac, Daemon, Gateway};

const LIMIT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[cfg(debug_assertions)]
#[test]
fn captures_past_max_age_are_evicted_at_commit_and_while_idle_and_counted_so() {
    // Ages are counted by the daemon's clock.
    for day in Day::each() {
        let port = free_port();
        let g = Gateway::new(&format!(
            "{}max_age_secs = 2\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            stdin_replay_config(20)
        ));
        day.set_on(&g);
        let mut daemon = Daemon::start(&g);
        let now = day.now_ms();
        let day = 86_400_000;
        // Five a day old (already past the bound when they arrive), then ten of now.
        let old: Vec<_> = (0..5)
            .map(|i| tape_advert(tape_mac(i), now - day, 1))
            .collect();
        let fresh: Vec<_> = (5..15)
            .map(|i| tape_advert(tape_mac(i), now + i64::from(i), 1))
            .collect();
        daemon.send(&old);
        daemon.send(&fresh);
        let s = eventually(LIMIT, || {
            let s = g.status_json();
            (s["admitted"] == 15).then_some(s)
        })
        .unwrap_or_else(|| panic!("not admitted:\n{}", daemon.stderr()));
        // The old ones went at once; the fresh ones are kept until they are 2 s old, and
        // then go although nothing more is committed.
        assert!(s["evicted_by"]["max_age"].as_u64().unwrap() >= 5, "{s}");
        let s = eventually(LIMIT, || {
            let s = g.status_json();
            (s["evicted_by"]["max_age"] == 15).then_some(s)
        })
        .unwrap_or_else(|| panic!("not aged out:\n{}\n{}", g.status_json(), daemon.stderr()));
        assert_eq!(
            (s["pending"].as_u64(), s["evicted"].as_u64()),
            (Some(0), Some(15)),
            "{s}"
        );
        assert_eq!(s["evicted_by"]["max_pending"], 0);
        assert_eq!(s["evicted_by"]["max_bytes"], 0);
        let m = metrics(port);
        assert!(
            m.lines()
                .any(|l| l == "tapegate_evictions_total{bound=\"max_age\"} 15"),
            "{m}"
        );
        assert!(m.lines().any(|l| l == "tapegate_evicted_total 15"), "{m}");
        let (status, log) = daemon.terminate(Duration::from_secs(20));
        assert!(status.success());
        assert!(
            log.contains(
                "outbox bounds: evicted the oldest pending captures (max_pending 0, max_age"
            ),
            "{log}"
        );
    }
}

#[cfg(debug_assertions)]
#[test]
fn a_database_at_max_bytes_evicts_the_oldest_and_never_grows_past_it() {
    let day = Day::one();
    let max_bytes: u64 = 1024 * 1024;
    let g = Gateway::new(&format!(
        "{}max_bytes = {max_bytes}\n",
        stdin_replay_config(20)
    ));
    day.set_on(&g);
    let mut daemon = Daemon::start(&g);
    let now = day.now_ms();
    // 30,000 captures of 200 tapes: about 3 MB of outbox, three times the bound.
    let n = 30_000u32;
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let adverts: Vec<_> = chunk
            .iter()
            .map(|i| {
                tape_advert(
                    tape_mac(i % 200),
                    now - 60_000 + i64::from(*i),
                    (*i % 1000) as u16,
                )
            })
            .collect();
        daemon.send(&adverts);
    }
    let s = eventually(LIMIT, || {
        let s = g.status_json();
        (s["admitted"] == u64::from(n)).then_some(s)
    })
    .unwrap_or_else(|| panic!("not admitted:\n{}", daemon.stderr()));
    let num = |k: &str| s[k].as_u64().unwrap();
    assert!(s["evicted_by"]["max_bytes"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(
        num("evicted"),
        s["evicted_by"]["max_bytes"].as_u64().unwrap(),
        "{s}"
    );
    assert_eq!(num("admitted"), num("pending") + num("evicted"), "{s}");
    assert!(num("database_bytes") <= max_bytes, "{s}");
    assert!(num("pending") > 5_000, "too much evicted: {s}");
    // The newest are kept: the last capture sent is pending, the first is gone.
    let rows = g.store().pending_captures().unwrap();
    let last = rows.last().unwrap();
    assert_eq!(last.capture.ts_ms, now - 60_000 + i64::from(n - 1));
    assert!(rows[0].capture.ts_ms > now - 60_000, "the oldest was kept");
    let (status, _) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success());
    // The file on the card: its bound, and a commit group's slack at most.
    let file = std::fs::metadata(g.state_dir().join("outbox.db"))
        .unwrap()
        .len();
    assert!(file <= max_bytes + 256 * 1024, "outbox.db is {file} bytes");
}
