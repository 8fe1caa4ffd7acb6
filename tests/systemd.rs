//! Living under systemd, checked against the real binary: the sd_notify protocol on a
//! `NOTIFY_SOCKET` datagram socket as systemd provides it, and SIGHUP reload.

mod common;

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use common::*;

const STDIN_REPLAY: &str = "[scanner]\nsource = \"replay\"\nreplay_path = \"-\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n[outbox]\ncommit_interval_ms = 20\n";

/// Whether a message received on the notify socket (earlier, or until the deadline)
/// matches `until`.
fn receive_until(
    sock: &UnixDatagram,
    seen: &mut Vec<String>,
    until: impl Fn(&str) -> bool,
) -> bool {
    // One datagram may carry several states, and they may come in any order.
    if seen.iter().any(|m| m.lines().any(&until)) {
        return true;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let hit = msg.lines().any(&until);
            seen.push(msg);
            if hit {
                return true;
            }
        }
    }
    false
}

#[test]
fn under_systemd_it_notifies_ready_status_watchdog_and_stopping() {
    let g = Gateway::new(STDIN_REPLAY);
    let socket = g.path("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut child = g
        .command(&["run"])
        .env("NOTIFY_SOCKET", &socket)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut seen = Vec::new();
    assert!(
        receive_until(&sock, &mut seen, |m| m == "READY=1"),
        "no READY: {seen:?}"
    );
    writeln!(
        stdin,
        "{}",
        tape_advert(tape_mac(1), T0_MS + 1_000, 1).to_record()
    )
    .unwrap();
    stdin.flush().unwrap();
    // Every stage is alive: pings arrive at half of WatchdogSec.
    assert!(
        receive_until(&sock, &mut seen, |m| m == "WATCHDOG=1"),
        "no WATCHDOG: {seen:?}"
    );
    assert!(
        receive_until(&sock, &mut seen, |m| m.starts_with("STATUS=pending ")),
        "no STATUS: {seen:?}"
    );
    // The capture is committed before the stop, so the count below cannot race it.
    wait_pending(&g, 1);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(
        receive_until(&sock, &mut seen, |m| m == "STOPPING=1"),
        "no STOPPING: {seen:?}"
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(stdin);
    let at = |what: &str| {
        seen.iter()
            .position(|m| m.lines().any(|l| l == what))
            .unwrap()
    };
    let (ready, stopping) = (at("READY=1"), at("STOPPING=1"));
    assert!(ready < stopping);
    assert_eq!(g.stats().pending, 1);
}

#[test]
fn outside_systemd_nothing_is_notified_and_it_runs_the_same() {
    let g = Gateway::new(STDIN_REPLAY);
    let socket = g.path("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // A run with the socket named, to show this test can see a notification at all.
    let mut under_systemd = g
        .command(&["run"])
        .env("NOTIFY_SOCKET", &socket)
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    assert!(
        receive_until(&sock, &mut seen, |m| m == "READY=1"),
        "the socket does not receive: {seen:?}"
    );
    unsafe { libc::kill(under_systemd.id() as i32, libc::SIGTERM) };
    assert!(under_systemd.wait().unwrap().success());
    while sock.recv(&mut [0u8; 4096]).is_ok() {}

    // The same run without NOTIFY_SOCKET: it captures and stops the same, and the
    // socket hears nothing.
    let mut daemon = Daemon::start_with(&g, |c| {
        c.env_remove("NOTIFY_SOCKET");
    });
    daemon.send(&[tape_advert(tape_mac(1), T0_MS + 1_000, 1)]);
    wait_pending(&g, 1);
    let (status, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{log}");
    let mut buf = [0u8; 4096];
    let heard = sock
        .recv(&mut buf)
        .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
    assert!(heard.is_err(), "notified outside systemd: {heard:?}");
}

fn wait_pending(g: &Gateway, n: u64) {
    // The database may exist before its schema does: read it only once it can be.
    let got = eventually(Duration::from_secs(15), || {
        (g.try_stats()?.pending == n).then_some(())
    });
    assert!(got.is_some(), "pending never reached {n}");
}

#[test]
fn sighup_reloads_products_and_refuses_a_bad_config_without_dropping_anything() {
    let product =
        |id: &str| format!("{STDIN_REPLAY}[[products]]\nid = \"{id}\"\nmanufacturer_id = 0x0EF7\n");
    let g = Gateway::new(&product("tape-v1"));
    let mut daemon = Daemon::start(&g);
    let advert = |i: u32| tape_advert(tape_mac(i), T0_MS + 1_000 + i64::from(i), 1);
    daemon.send(&[advert(1)]);
    wait_pending(&g, 1);
    let last_product = |g: &Gateway, mac| {
        let rows = g.store().pending_captures().unwrap();
        rows.last()
            .filter(|r| r.capture.mac == mac)
            .map(|r| r.capture.product_id.clone())
    };

    // A good new config: products change at once, nothing pending is touched.
    g.write_config(&product("tape-v2"));
    daemon.hang_up();
    // Once ingest says so, every advert it reads carries the new products.
    let reloaded = eventually(Duration::from_secs(15), || {
        daemon.stderr().contains("reloaded products").then_some(())
    });
    assert!(reloaded.is_some(), "no reload: {}", daemon.stderr());
    daemon.send(&[advert(2)]);
    let product_2 = eventually(Duration::from_secs(15), || last_product(&g, tape_mac(2)));
    assert_eq!(
        product_2.as_deref(),
        Some("tape-v2"),
        "products were not reloaded"
    );

    // A bad new config is refused; the running one stays in force.
    g.write_config(&format!(
        "{}\n[flush]\nmax_batch = 999\n",
        product("tape-v3")
    ));
    daemon.hang_up();
    let refused = eventually(Duration::from_secs(15), || {
        daemon.stderr().contains("new config refused").then_some(())
    });
    assert!(refused.is_some(), "no refusal: {}", daemon.stderr());
    daemon.send(&[advert(1000)]);
    let product_1000 = eventually(Duration::from_secs(15), || last_product(&g, tape_mac(1000)));
    assert_eq!(
        product_1000.as_deref(),
        Some("tape-v2"),
        "capture after the refused reload"
    );

    let (status, err) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    assert!(err.contains("config reloaded"), "{err}");
    assert!(
        err.contains("new config refused") && err.contains("flush.max_batch = 999"),
        "{err}"
    );
    let rows = g.store().pending_captures().unwrap();
    assert_eq!(
        &*rows[0].capture.product_id, "tape-v1",
        "what was captured before stays as it was"
    );
    assert_eq!(rows.len() as u64, g.stats().admitted, "nothing dropped");
}

/// READY only once the source is up: a BLE source that cannot start (here no D-Bus
/// system bus) fails the start instead of following a READY, says why at ERROR, and ends
/// with exit 69 (EX_UNAVAILABLE), which the unit does not restart (`RestartPreventExitStatus=`).
#[test]
fn a_source_that_cannot_work_here_never_says_ready_and_exits_3() {
    let g = Gateway::new("[scanner]\nsource = \"ble\"\n");
    let socket = g.path("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let out = g
        .command(&["run"])
        .env("NOTIFY_SOCKET", &socket)
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", g.path("no-bus").display()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("ERROR")
            && err.contains("the source failed, stopping: cannot connect to the D-Bus system bus"),
        "the reason is in the ERROR line itself: {err}"
    );
    let mut heard = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(
        heard.iter().any(|m| m.contains("STOPPING=1")),
        "the socket heard the run: {heard:?}"
    );
    assert!(
        !heard.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "READY before the source was up: {heard:?}"
    );
}

/// Under a unit, stderr is the journal stream (`JOURNAL_STREAM` names it): why a command
/// failed is marked priority 3 there, so `journalctl -p warning` shows it; elsewhere
/// (the variable inherited, the stream not) it is printed plain.
#[test]
fn a_failure_told_to_the_journal_stream_is_marked_as_an_error() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;
    let g = Gateway::new("[readings]\nretention_hours = 0\n");
    let (journal, mut reader) = UnixStream::pair().unwrap();
    let meta = std::fs::File::from(std::os::fd::OwnedFd::from(journal.try_clone().unwrap()))
        .metadata()
        .unwrap();
    let status = g
        .command(&["check", "--config-only"])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(Stdio::from(std::os::fd::OwnedFd::from(journal)))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
    let mut told = String::new();
    std::io::Read::read_to_string(&mut reader, &mut told).unwrap();
    assert!(
        told.lines().all(|l| l.starts_with("<3>tapegate: "))
            && told.contains("readings.retention_hours = 0"),
        "{told:?}"
    );

    let out = g
        .command(&["check", "--config-only"])
        .env("JOURNAL_STREAM", "1:2")
        .output()
        .unwrap();
    let plain = text(&out.stderr);
    assert!(
        plain.starts_with("tapegate: config") && !plain.contains("<3>"),
        "{plain}"
    );
}
