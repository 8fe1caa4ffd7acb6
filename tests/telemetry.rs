//! Pushed telemetry against a real receiver: Debian's `prometheus` with
//! `--web.enable-remote-write-receiver`, started by the test on a loopback port, asked
//! over its HTTP API (PromQL) what it holds. The real binary pushes to it; nothing of
//! the receiver is mocked.
//!
//! It needs `prometheus` (`apt-get install prometheus`). Without it the test says so
//! loudly and passes, except under CI (`CI` set), where it fails: `.ci/run` installs it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{eventually, Daemon, Gateway};
use serde_json::Value;

/// Long enough for a cold Prometheus on a busy 2-core machine.
const LIMIT: Duration = Duration::from_secs(60);

/// The receiver, stopped when dropped.
struct Receiver {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Receiver {
    /// Prometheus with the remote-write receiver on, an empty scrape config and its
    /// own TSDB, on `port`; returns once `/-/ready` answers 200.
    fn start(port: u16) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, "global:\n  scrape_interval: 1m\n").unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg("--web.enable-remote-write-receiver")
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--config.file={}", config.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let r = Receiver {
            child,
            port,
            _dir: dir,
        };
        let ready = eventually(LIMIT, || {
            get(r.port, "/-/ready").filter(|(status, _)| *status == 200)
        });
        assert!(ready.is_some(), "prometheus not ready: {}", r.log());
        r
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The `data.result` of an instant PromQL query.
    fn query(&self, promql: &str) -> Vec<Value> {
        let (status, body) = get(
            self.port,
            &format!("/api/v1/query?query={}", encode(promql)),
        )
        .unwrap_or_else(|| panic!("prometheus does not answer"));
        assert_eq!(status, 200, "{promql}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    fn write_url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/write", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET on loopback: (status, body), or `None` when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn prometheus_present() -> bool {
    Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `false` (after saying so loudly) when the receiver is not installed outside CI.
fn receiver_available(test: &str) -> bool {
    if prometheus_present() {
        return true;
    }
    let why = "`prometheus` is not installed (apt-get install prometheus)";
    if std::env::var_os("CI").is_some() {
        panic!("{test} cannot run here: {why}");
    }
    eprintln!("\n*** SKIPPED {test}: {why} ***\n*** (it runs under CI, `CI` set, where this is a failure) ***\n");
    false
}

/// A gateway `id` that simulates tapes (no `[service]`: captures pile up) and pushes
/// to `url` every second, serving `/metrics` on `http_port`.
fn pushing_gateway(id: &str, url: &str, http_port: u16, extra: &str) -> Gateway {
    let g = Gateway::new("");
    let text = format!(
        "[gateway]\nid = \"{id}\"\nstate_dir = \"{}\"\nshutdown_grace_secs = 5\n\n\
         [scanner]\nsource = \"sim\"\nsim_tapes = 3\nsim_interval_ms = 200\n\n\
         [dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\n\
         [http]\nlisten = \"127.0.0.1:{http_port}\"\n\n\
         [telemetry]\nurl = \"{url}\"\ninterval_secs = 1\ntimeout_secs = 2\n{extra}\n",
        g.state_dir().display()
    );
    std::fs::write(g.config_path(), text).unwrap();
    g
}

/// One value of the daemon's own `/metrics` (the sum over its series).
fn own_metric(http_port: u16, name: &str, labels: &str) -> Option<f64> {
    let (status, body) = get(http_port, "/metrics")?;
    if status != 200 {
        return None;
    }
    let prefix = format!("{name}{labels}");
    body.lines()
        .filter(|l| l.starts_with(&prefix) && l[prefix.len()..].starts_with(' '))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

#[test]
fn pushes_kept_through_a_receiver_outage_arrive_in_order_with_the_gateway_label() {
    if !receiver_available("the telemetry outage test") {
        return;
    }
    let port = free_port();
    let http_port = free_port();
    let url = format!("http://127.0.0.1:{port}/api/v1/write");
    let g = pushing_gateway("dock-out", &url, http_port, "");
    let daemon = Daemon::start(&g);

    // The receiver is down: pushes fail and are kept; capture goes on regardless.
    let kept = eventually(LIMIT, || {
        own_metric(http_port, "tapegate_telemetry_buffered", "").filter(|n| *n >= 3.0)
    })
    .unwrap_or_else(|| {
        panic!(
            "no push kept while the receiver is down:\n{}",
            daemon.stderr()
        )
    });
    let admitted_during_outage = g.stats().admitted;
    assert!(
        admitted_during_outage > 0,
        "capture stopped during the outage"
    );
    let receiver_up_at_ms = tapegate::clock::system().wall_ms();
    let failed = own_metric(
        http_port,
        "tapegate_telemetry_pushes_total",
        "{outcome=\"failed\"}",
    )
    .unwrap();
    assert!(failed >= kept, "failed {failed}, kept {kept}");

    let receiver = Receiver::start(port);
    // Everything kept is sent once the receiver is back...
    eventually(LIMIT, || {
        own_metric(http_port, "tapegate_telemetry_buffered", "").filter(|n| *n == 0.0)
    })
    .unwrap_or_else(|| {
        panic!(
            "kept pushes not sent:\n{}\n{}",
            daemon.stderr(),
            receiver.log()
        )
    });
    // ...and the receiver holds them: samples from before it started, in time order,
    // labelled with the gateway.
    let samples = eventually(LIMIT, || {
        let r = receiver.query(
            "tapegate_pending{job=\"tapegate\",gateway=\"dock-out\",instance=\"dock-out\"}[1h]",
        );
        let values = r.first()?["values"].as_array()?.clone();
        (values.len() as f64 >= kept + 1.0).then_some(values)
    })
    .unwrap_or_else(|| panic!("the receiver lacks the kept pushes:\n{}", daemon.stderr()));
    let times: Vec<f64> = samples.iter().map(|v| v[0].as_f64().unwrap()).collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "samples out of order: {times:?}"
    );
    assert!(
        times[0] * 1000.0 < receiver_up_at_ms as f64,
        "no sample from the outage: first at {}, receiver up at {receiver_up_at_ms}",
        times[0]
    );
    let refused = own_metric(
        http_port,
        "tapegate_telemetry_pushes_total",
        "{outcome=\"refused\"}",
    )
    .unwrap();
    assert_eq!(refused, 0.0, "{}", daemon.stderr());
    let log = daemon.stderr();
    assert_eq!(
        log.matches("telemetry: push failed").count(),
        1,
        "the outage is logged once:\n{log}"
    );
    assert!(log.contains("the receiver answers again"), "{log}");
    assert!(
        g.stats().admitted > admitted_during_outage,
        "capture stopped"
    );
    let (status, _) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success());
}

#[test]
fn a_full_buffer_keeps_the_newest_pushes_and_counts_the_dropped() {
    if !receiver_available("the telemetry buffer test") {
        return;
    }
    let port = free_port();
    let http_port = free_port();
    let url = format!("http://127.0.0.1:{port}/api/v1/write");
    let g = pushing_gateway("dock-full", &url, http_port, "max_buffered = 2\n");
    let started_ms = tapegate::clock::system().wall_ms() as f64;
    let daemon = Daemon::start(&g);
    eventually(LIMIT, || {
        own_metric(
            http_port,
            "tapegate_telemetry_pushes_total",
            "{outcome=\"dropped\"}",
        )
        .filter(|n| *n >= 3.0)
    })
    .unwrap_or_else(|| panic!("nothing dropped:\n{}", daemon.stderr()));
    assert_eq!(
        own_metric(http_port, "tapegate_telemetry_buffered", ""),
        Some(2.0)
    );
    let receiver = Receiver::start(port);
    eventually(LIMIT, || {
        own_metric(http_port, "tapegate_telemetry_buffered", "").filter(|n| *n == 0.0)
    })
    .unwrap_or_else(|| panic!("kept pushes not sent:\n{}", daemon.stderr()));
    let dropped = own_metric(
        http_port,
        "tapegate_telemetry_pushes_total",
        "{outcome=\"dropped\"}",
    )
    .unwrap();
    let samples = eventually(LIMIT, || {
        let r = receiver.query("tapegate_pending{gateway=\"dock-full\"}[1h]");
        let values = r.first()?["values"].as_array()?.clone();
        (!values.is_empty()).then_some(values)
    })
    .unwrap_or_else(|| panic!("nothing arrived:\n{}", daemon.stderr()));
    // A push a second from the start: the first `dropped` pushes were dropped, so the
    // oldest the receiver holds was taken at least that many seconds after the start
    // (keeping the oldest instead would put it at the start).
    let first_ms = samples[0][0].as_f64().unwrap() * 1000.0;
    assert!(
        first_ms >= started_ms + (dropped - 1.0) * 1000.0,
        "the oldest pushes were kept: first sample at {first_ms}, start {started_ms}, {dropped} dropped"
    );
    assert!(dropped >= 3.0, "{dropped}");
}

#[test]
fn two_gateways_push_to_one_receiver_with_their_own_labels_and_no_secret() {
    if !receiver_available("the telemetry fleet test") {
        return;
    }
    let receiver = Receiver::start(free_port());
    let token = "tok-FLEET-8c1d2e";
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let a = pushing_gateway("dock-a", &receiver.write_url(), free_port(), "");
    let b = pushing_gateway(
        "dock-b",
        &receiver.write_url(),
        free_port(),
        &format!("bearer_token_file = \"{}\"\n", token_file.display()),
    );
    let (da, db) = (Daemon::start(&a), Daemon::start(&b));
    // The fleet's versions and configs in one query.
    let query = "group by (gateway, version, commit, config_hash) (tapegate_inventory_info{job=\"tapegate\"})";
    let rows = eventually(LIMIT, || {
        let r = receiver.query(query);
        (r.len() == 2).then_some(r)
    })
    .unwrap_or_else(|| panic!("not both gateways:\n{}\n{}", da.stderr(), db.stderr()));
    eprintln!("{query}:\n{}", serde_json::to_string_pretty(&rows).unwrap());
    let mut by_gateway: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            let m = &r["metric"];
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("gateway"), s("version"), s("config_hash"))
        })
        .collect();
    by_gateway.sort();
    assert_eq!(by_gateway[0].0, "dock-a");
    assert_eq!(by_gateway[1].0, "dock-b");
    assert!(by_gateway.iter().all(|g| g.1 == env!("CARGO_PKG_VERSION")));
    // Different configs, different hashes; each the hash `status --json` shows.
    assert_ne!(by_gateway[0].2, by_gateway[1].2, "{by_gateway:?}");
    for (g, row) in [(&a, &by_gateway[0]), (&b, &by_gateway[1])] {
        let status = g.status_json();
        assert_eq!(
            status["inventory"]["config_hash"],
            row.2.as_str(),
            "{status}"
        );
        assert_eq!(status["inventory"]["running"], true, "{status}");
    }
    // No label of any series holds the credential.
    let (_, series) = get(
        receiver.port,
        &format!("/api/v1/series?match[]={}", encode("{job=\"tapegate\"}")),
    )
    .unwrap();
    assert!(series.contains("dock-b"), "{series}");
    assert!(!series.contains(token), "the token is in a series");
    for log in [da.stderr(), db.stderr()] {
        assert!(!log.contains(token), "the token is in the log:\n{log}");
    }
}
