//! SIGHUP applies what changed (src/pipeline/reload.rs), through the real binary and the mock
//! service: the delivery stage restarted with new flush settings while captures keep
//! coming (none lost, none given two fates), the HTTP server moved to a new port,
//! telemetry switched on, one log line naming what was applied and what needs a
//! restart; and a config that cannot be applied (a port in use) changes nothing.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    eventually, mock_service_section, mock_with, stdin_replay_config, tape_advert, tape_mac,
    Daemon, Gateway, T0_MS,
};
use tapegate_mock::MockConfig;

const LIMIT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` on `port`: its status line's code, or `None` when nothing listens.
fn metrics_status(port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

fn metric(port: u16, line_start: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_reload_restarts_delivery_moves_the_server_and_loses_nothing() {
    let (_rt, mock) = mock_with(MockConfig::demo());
    let (port_a, port_b, no_receiver) = (free_port(), free_port(), free_port());
    let g = Gateway::new("");
    let config = |max_batch: u32, port: u16, extra: &str| {
        format!(
            "{}max_batch = {max_batch}\n{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n{extra}",
            mock_service_section(&mock),
            stdin_replay_config(20)
        )
    };
    g.write_config(&config(5, port_a, ""));
    let mut daemon = Daemon::start(&g);
    let advert = |i: u32| tape_advert(tape_mac(i), T0_MS + i64::from(i), 1);
    let delivered = |n: u64| {
        eventually(LIMIT, || (g.try_stats()?.delivered >= n).then_some(()))
            .unwrap_or_else(|| panic!("not {n} delivered: {:?}", g.try_stats()))
    };
    daemon.send(&(0..40).map(advert).collect::<Vec<_>>());
    delivered(40);
    let sizes = |mock: &tapegate_mock::MockHandle| -> Vec<usize> {
        mock.received()
            .iter()
            .filter(|r| r.status == Some(200))
            .map(|r| r.items.len())
            .collect()
    };
    assert!(sizes(&mock).iter().all(|n| *n <= 5), "{:?}", sizes(&mock));
    assert_eq!(metrics_status(port_a), Some(200));
    let hash_before = g.status_json()["inventory"]["config_hash"].clone();

    // The new config: bigger batches, another port, telemetry on, another gateway id
    // (which needs a restart). Reloaded while captures stream in.
    let telemetry = format!(
        "[telemetry]\nurl = \"http://127.0.0.1:{no_receiver}/api/v1/write\"\ninterval_secs = 1\n"
    );
    g.write_config(&config(50, port_b, &telemetry));
    let renamed = std::fs::read_to_string(g.config_path())
        .unwrap()
        .replace("id = \"test-gw\"", "id = \"renamed\"");
    std::fs::write(g.config_path(), renamed).unwrap();
    daemon.send(&(40..240).map(advert).collect::<Vec<_>>());
    daemon.hang_up();
    daemon.send(&(240..440).map(advert).collect::<Vec<_>>());
    let line = eventually(LIMIT, || {
        daemon
            .stderr()
            .lines()
            .find(|l| l.contains("SIGHUP: config reloaded"))
            .map(String::from)
    })
    .unwrap_or_else(|| panic!("no reload line:\n{}", daemon.stderr()));
    for applied in [
        "flush.max_batch (delivery restarted)",
        "http.listen (server restarted)",
        "telemetry.url (telemetry restarted)",
    ] {
        assert!(line.contains(applied), "{applied} not in {line}");
    }
    assert!(line.contains("needs a restart: gateway.id"), "{line}");
    assert!(line.contains("WARN"), "something needs a restart: {line}");
    delivered(440);

    // Nothing lost, one fate each: every capture reached the service, none pending.
    let s = g.status_json();
    let n = |k: &str| s[k].as_u64().unwrap();
    assert_eq!(
        (n("admitted"), n("pending"), n("evicted")),
        (440, 0, 0),
        "{s}"
    );
    assert_eq!(n("delivered") + n("dead_letters"), 440, "{s}");
    let answered: HashSet<String> = mock
        .received()
        .iter()
        .filter(|r| r.status == Some(200))
        .flat_map(|r| r.items.iter().map(|i| i.mac_id.clone()))
        .collect();
    for i in 0..440 {
        let mac = tape_mac(i).to_string().replace(':', "");
        assert!(
            answered.contains(&mac),
            "capture {i} ({mac}) never delivered"
        );
    }
    // Bigger batches after the reload; the server moved; telemetry runs; the running
    // gateway id is the old one, the config hash the new one's.
    assert!(sizes(&mock).iter().any(|n| *n > 5), "{:?}", sizes(&mock));
    assert!(sizes(&mock).iter().all(|n| *n <= 50), "{:?}", sizes(&mock));
    assert_eq!(metrics_status(port_b), Some(200));
    assert_eq!(metrics_status(port_a), None, "the old port still answers");
    let pushed = eventually(LIMIT, || {
        metric(
            port_b,
            "tapegate_telemetry_pushes_total{outcome=\"failed\"}",
        )
        .filter(|v| *v >= 1.0)
    });
    assert!(
        pushed.is_some(),
        "telemetry not started:\n{}",
        daemon.stderr()
    );
    let inventory = &g.status_json()["inventory"];
    assert_eq!(inventory["gateway_id"], "test-gw", "{inventory}");
    assert_ne!(inventory["config_hash"], hash_before, "{inventory}");

    // A config that cannot be applied (its port is taken) changes nothing at all.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port_c = taken.local_addr().unwrap().port();
    let hash_after = inventory["config_hash"].clone();
    g.write_config(&config(7, port_c, &telemetry));
    daemon.hang_up();
    eventually(LIMIT, || {
        daemon.stderr().contains("new config refused").then_some(())
    })
    .unwrap_or_else(|| panic!("not refused:\n{}", daemon.stderr()));
    assert_eq!(g.status_json()["inventory"]["config_hash"], hash_after);
    assert_eq!(metrics_status(port_b), Some(200), "the server moved anyway");
    assert_eq!(
        daemon.stderr().matches("SIGHUP: config reloaded").count(),
        1,
        "{}",
        daemon.stderr()
    );
    daemon.send(&(440..460).map(advert).collect::<Vec<_>>());
    delivered(460);
    drop(taken);
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log}");
}
