//! The daemon's HTTP server (`[http] listen`, DESIGN.md "Health for fleets and
//! installers"): the real binary against the mock service over loopback, its answers
//! read as a scraper, a monitor and a phone's browser (headless Chromium) would.
//! Every wait polls a condition with a deadline.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    eventually_async, other_advert, stdin_replay_config, tape_advert, tape_mac, Daemon, Gateway,
};
use tapegate::record::{Advertisement, Mac};
use tapegate::source::sim::tape::UNREGISTERED_PREFIX;
use tapegate_mock::{self as mock, Fault, MockConfig, MockHandle, Storm};

/// Longest wait for a condition (generous: the machine may be busy; a pass costs no more).
const LIMIT: Duration = Duration::from_secs(60);

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `[service]` pointing at the mock's "ppe" environment, quick retries, and the HTTP
/// server on `port`.
fn service_and_http(mock: &MockHandle, port: u16, request_timeout_secs: u64) -> String {
    let service =
        common::service_toml(mock, "ppe", request_timeout_secs).expect("the mock serves ppe");
    format!(
        "{service}\n[flush]\nmax_delay_secs = 0.05\nbackoff_initial_ms = 50\nbackoff_max_secs = 1\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n"
    )
}

/// A daemon replaying its stdin (dedup off) into the mock, serving HTTP on a free port.
fn replay_gateway(mock: &MockHandle, request_timeout_secs: u64) -> (Gateway, String) {
    let port = free_port();
    let g = Gateway::new(&format!(
        "{}{}",
        stdin_replay_config(20),
        service_and_http(mock, port, request_timeout_secs)
    ));
    (g, format!("http://127.0.0.1:{port}"))
}

async fn start_mock() -> MockHandle {
    mock::start(MockConfig::demo()).await.expect("mock starts")
}

/// `(status, body)` of a GET, or `None` while nothing answers.
async fn get(url: &str) -> Option<(u16, String)> {
    let resp = reqwest::get(url).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// Waits for the daemon's server to answer `/healthz` at all.
async fn until_serving(base: &str) {
    let url = format!("{base}/healthz");
    eventually_async(LIMIT, async || get(&url).await)
        .await
        .expect("timed out waiting for the HTTP server");
}

fn unregistered_mac(i: u8) -> Mac {
    let p = UNREGISTERED_PREFIX;
    Mac::new([p[0], p[1], p[2], 0, 0, i])
}

/// 20 known tapes, 5 the service does not know and 5 adverts that are not tapes.
fn mixed_adverts(ts_ms: i64) -> Vec<Advertisement> {
    let mut adverts: Vec<Advertisement> = (0..20)
        .map(|i| tape_advert(tape_mac(i), ts_ms, i as u16))
        .collect();
    adverts.extend((0..5).map(|i| tape_advert(unregistered_mac(i), ts_ms, 100 + u16::from(i))));
    adverts.extend((0..5).map(|i| other_advert(Mac::new([0x11, 0x22, 0x33, 0, 0, i]), ts_ms)));
    adverts
}

/// Every sample of a scrape by name and labels (`name{k="v",...}`, labels sorted),
/// whatever type the parser gave it.
fn samples(text: &str) -> HashMap<String, f64> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text exposition");
    let mut out = HashMap::new();
    for s in scrape.samples {
        let mut labels: Vec<(String, String)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.sort();
        let key = if labels.is_empty() {
            s.metric.clone()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            format!("{}{{{}}}", s.metric, l.join(","))
        };
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            prometheus_parse::Value::Summary(_) => continue,
        };
        out.insert(key, value);
    }
    out
}

fn metric(samples: &HashMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in /metrics: {:#?}", samples.keys()))
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_status_json_after_a_replay_and_a_drain() {
    let mock = start_mock().await;
    let (g, base) = replay_gateway(&mock, 10);
    let day = common::day::Day::one();
    day.set_on(&g);
    let mut d = Daemon::start(&g);
    until_serving(&base).await;
    let now = day.now_ms();
    d.send(&mixed_adverts(now));
    eventually_async(LIMIT, async || {
        g.try_stats()
            .filter(|s| s.pending == 0 && s.delivered + s.dead_letters == 25)
            .map(|_| ())
    })
    .await
    .expect("timed out waiting for the replay to drain");

    let (status, body) = get(&format!("{base}/metrics"))
        .await
        .expect("/metrics answers");
    assert_eq!(status, 200, "{body}");
    let m = samples(&body);
    let s = g.status_json();
    for (name, field) in [
        ("tapegate_admitted_total", "admitted"),
        ("tapegate_delivered_total", "delivered"),
        ("tapegate_dead_letters_total", "dead_letters"),
        ("tapegate_evicted_total", "evicted"),
        ("tapegate_pending", "pending"),
        ("tapegate_dead_letters_stored", "dead_letters_stored"),
        ("tapegate_tapes", "tapes"),
    ] {
        assert_eq!(
            metric(&m, name),
            s[field].as_u64().unwrap() as f64,
            "{name} vs status.{field}: {s:#}"
        );
    }
    for (name, field) in [
        ("tapegate_scanner_restarts_total", "restarts"),
        ("tapegate_scanner_reacquires_total", "reacquires"),
        ("tapegate_scanner_dropped_total", "dropped"),
        ("tapegate_scanner_adverts_dropped_total", "dropped"),
        ("tapegate_scanner_devices_forgotten_total", "forgotten"),
    ] {
        assert_eq!(
            metric(&m, name),
            s["scanner"][field].as_u64().unwrap() as f64
        );
    }
    assert_eq!(
        (s["delivered"].as_u64(), s["dead_letters"].as_u64()),
        (Some(20), Some(5)),
        "the mock knows the 20 tapes and refuses the 5 others"
    );
    assert_eq!(metric(&m, "tapegate_oldest_pending_age_seconds"), 0.0);
    assert_eq!(metric(&m, "tapegate_adverts_total"), 30.0);
    assert_eq!(metric(&m, "tapegate_adverts_unmatched_total"), 5.0);
    assert_eq!(metric(&m, "tapegate_batches_in_flight"), 0.0);
    assert_eq!(
        metric(&m, "tapegate_token_grants_total"),
        mock.token_grants() as f64
    );
    let requests = mock.decode_requests() as f64;
    assert!(requests >= 1.0);
    assert_eq!(
        metric(&m, "tapegate_request_duration_seconds_count"),
        requests
    );
    assert_eq!(metric(&m, "tapegate_batch_size_count"), requests);
    assert_eq!(
        metric(&m, "tapegate_batch_size_sum"),
        25.0,
        "each capture sent once"
    );
    assert_eq!(metric(&m, "tapegate_delivery_latency_seconds_count"), 25.0);
    assert_eq!(metric(&m, "tapegate_clock_state{state=\"trusted\"}"), 1.0);
    assert!(metric(&m, "tapegate_last_flush_ok_timestamp_seconds") * 1000.0 >= now as f64);

    let (code, _) = d.terminate(LIMIT);
    assert!(code.success());
    mock.shutdown().await;
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_503_naming_the_flusher_while_the_service_hangs_and_200_again_after() {
    let mock = start_mock().await;
    let (g, base) = replay_gateway(&mock, 1);
    let day = common::day::Day::one();
    day.set_on(&g);
    let mut d = Daemon::start(&g);
    until_serving(&base).await;
    let healthz = format!("{base}/healthz");
    assert_eq!(get(&healthz).await, Some((200, "ok\n".to_string())));

    // Every decode answer is held far past the 1 s request timeout.
    mock.set_storm(Some(Storm {
        probability: 1.0,
        seed: 1,
        mix: vec![Fault::Delay(Duration::from_secs(5))],
    }));
    d.send(&mixed_adverts(day.now_ms()));
    let body = eventually_async(LIMIT, async || {
        get(&healthz)
            .await
            .filter(|(s, _)| *s == 503)
            .map(|(_, b)| b)
    })
    .await
    .expect("timed out waiting for /healthz to turn 503");
    assert!(
        body.starts_with("flush: ") && body.contains("failed in a row (last: timeout)"),
        "{body}"
    );
    let (_, page) = get(&format!("{base}/")).await.unwrap();
    assert!(page.contains("Not healthy: flush: "), "{page}");
    let (_, metrics) = get(&format!("{base}/metrics")).await.unwrap();
    assert!(
        metric(
            &samples(&metrics),
            "tapegate_request_failures_total{cause=\"timeout\"}"
        ) >= 3.0
    );
    assert!(g.stats().pending > 0, "nothing was delivered meanwhile");

    mock.set_storm(None);
    eventually_async(LIMIT, async || {
        get(&healthz).await.filter(|(s, _)| *s == 200).map(|_| ())
    })
    .await
    .expect("timed out waiting for /healthz to be 200 again");
    eventually_async(LIMIT, async || {
        g.try_stats().filter(|s| s.pending == 0).map(|_| ())
    })
    .await
    .expect("timed out waiting for the backlog to drain");
    let (code, _) = d.terminate(LIMIT);
    assert!(code.success());
    mock.shutdown().await;
}

/// Chromium from Debian's `chromium` package, or `None` (the caller skips, loudly;
/// under CI it fails).
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"]
        .into_iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is not installed: .ci/run installs Debian's chromium package"
        );
        eprintln!("SKIPPED: the status page test needs chromium (apt-get install chromium)");
    }
    found
}

/// Runs headless Chromium on `url` with a phone-sized window: the screenshot goes to
/// `png`, the DOM after load is returned.
fn browse(chromium: &Path, url: &str, png: &Path) -> String {
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=412,915",
    ];
    let shot = Command::new(chromium)
        .args(common)
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        shot.status.success() && png.is_file(),
        "chromium took no screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let dom = Command::new(chromium)
        .args(common)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    String::from_utf8(dom.stdout).unwrap()
}

/// The card of `mac` in the page's list of tapes.
fn tape_card<'a>(dom: &'a str, mac: &str) -> &'a str {
    let start = dom
        .find(&format!("<li data-mac=\"{mac}\">"))
        .unwrap_or_else(|| panic!("no card for {mac} in {dom}"));
    let end = dom[start..].find("</li>").unwrap() + start;
    &dom[start..end]
}

/// Simulated tapes whose packet never changes, so that each has one reading the page
/// and the state database agree on however long the browser takes.
const STEADY: &str = "sim_change_every = 1000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_tapes_of_a_sim_run_in_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let mock = start_mock().await;
    let port = free_port();
    let g = Gateway::new(&format!(
        "[scanner]\nsource = \"sim\"\nsim_tapes = 6\nsim_unregistered = 2\nsim_interval_ms = 100\n{STEADY}\n{}",
        service_and_http(&mock, port, 10)
    ));
    // The tapes' latest readings written with each answer, so that this test's reads
    // of the table (another process) see what the page shows.
    let d = Daemon::start_with(&g, |c| {
        c.env(tapegate::outbox::LATEST_EVERY_ENV, "0");
    });
    let base = format!("http://127.0.0.1:{port}");
    until_serving(&base).await;
    // Every tape of the fleet answered: four decoded, two refused as unknown.
    let refused = eventually_async(LIMIT, async || {
        let store = tapegate::outbox::StateReader::open(&g.state_dir()).ok()??;
        let mut refused: Vec<Mac> = store
            .dead_letters(1000)
            .ok()?
            .iter()
            .map(|d| d.mac)
            .collect();
        refused.sort();
        refused.dedup();
        (store.stats().ok()?.tapes == 4 && refused.len() == 2).then_some(refused)
    })
    .await
    .expect("timed out waiting for every simulated tape to be answered");
    let before = g.store().tapes(100).unwrap();

    let png = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&png);
    let dom = browse(&chromium, &format!("{base}/"), &png);
    eprintln!("status page screenshot: {}", png.display());

    assert!(dom.contains("<span id=\"gateway\">test-gw</span>"), "{dom}");
    assert!(
        dom.contains("Healthy: every stage is making progress"),
        "{dom}"
    );
    assert_eq!(before.len(), 4);
    for tape in &before {
        let row = tape_card(&dom, &tape.mac.to_string());
        let qr = tape.qr_code.as_deref().expect("the mock gives QR codes");
        assert!(row.contains(&format!(">{qr}<")), "{row}");
        assert!(row.contains(">known<") && row.contains(" dBm<"), "{row}");
        let temp = format!(">{:.1} °C<", tape.temp.unwrap());
        assert!(row.contains(&temp), "no {temp} in {row}");
    }
    for mac in &refused {
        let row = tape_card(&dom, &mac.to_string());
        assert!(row.contains(">unknown<"), "{row}");
    }
    assert_eq!(
        dom.matches("<li data-mac=").count(),
        6,
        "the six tapes, not the other devices"
    );
    assert!(dom.contains("<dl id=\"outbox\">") && dom.contains("<dl id=\"scanner\">"));
    let (code, _) = d.terminate(LIMIT);
    assert!(code.success());
    mock.shutdown().await;
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_token_in_any_answer() {
    let mock = start_mock().await;
    let (g, base) = replay_gateway(&mock, 10);
    let day = common::day::Day::one();
    day.set_on(&g);
    let password = common::environment_settings(&mock, "ppe")
        .unwrap()
        .password
        .expose()
        .to_string();
    assert!(
        password.len() >= 8,
        "a password distinctive enough to grep for"
    );
    let mut d = Daemon::start(&g);
    until_serving(&base).await;
    // A failure first, so that the last error is on the page and in /metrics too.
    mock.push_fault(Fault::Status {
        status: 503,
        retry_after: None,
    });
    d.send(&mixed_adverts(day.now_ms()));
    eventually_async(LIMIT, async || {
        g.try_stats()
            .filter(|s| s.pending == 0 && s.last_error.is_some())
            .map(|_| ())
    })
    .await
    .expect("timed out waiting for the replay to drain");
    assert!(
        mock.token_grants() >= 1,
        "a token was granted, so one could leak"
    );

    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for path in ["/", "/metrics", "/healthz", "/nope"] {
        let resp = client.get(format!("{base}{path}")).send().await.unwrap();
        let headers = format!("{:?}", resp.headers());
        answers.push((path, headers, resp.text().await.unwrap()));
    }
    let post = client
        .post(format!("{base}/"))
        .body(password.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(post.status().as_u16(), 405, "read-only");
    answers.push((
        "POST /",
        format!("{:?}", post.headers()),
        post.text().await.unwrap(),
    ));

    for (path, headers, body) in &answers {
        assert!(!body.is_empty(), "{path} answered nothing");
        for secret in [password.as_str(), "mock-ppe-"] {
            assert!(!body.contains(secret), "{path} shows {secret:?}: {body}");
            assert!(!headers.contains(secret), "{path} headers show {secret:?}");
        }
    }
    let (code, log) = d.terminate(LIMIT);
    assert!(code.success());
    assert!(
        !log.contains(&password) && !log.contains("mock-ppe-"),
        "{log}"
    );
    mock.shutdown().await;
}

/// Every answer forbids scripts, framing and sniffing, and a listen beyond loopback is
/// warned of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_forbids_scripts_framing_and_sniffing() {
    let port = free_port();
    let g = Gateway::new(&format!(
        "{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        stdin_replay_config(20)
    ));
    let d = Daemon::start(&g);
    let base = format!("http://127.0.0.1:{port}");
    until_serving(&base).await;
    for path in ["/", "/metrics", "/healthz", "/nope"] {
        let resp = reqwest::get(format!("{base}{path}")).await.unwrap();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "style-src 'unsafe-inline'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp:?}");
        }
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
    let (code, log) = d.terminate(LIMIT);
    assert!(code.success());
    const WARNING: &str = "answers anyone who can reach it";
    assert!(!log.contains(WARNING), "loopback is not exposed:\n{log}");

    // On every address: said at start and by `check` (both forms).
    let port = free_port();
    g.write_config(&format!(
        "{}\n[http]\nlisten = \"0.0.0.0:{port}\"\n",
        stdin_replay_config(20)
    ));
    let d = Daemon::start(&g);
    until_serving(&format!("http://127.0.0.1:{port}")).await;
    let (code, log) = d.terminate(LIMIT);
    assert!(code.success());
    let line = log
        .lines()
        .find(|l| l.contains(WARNING))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        line.contains("WARN") && line.contains(&format!("0.0.0.0:{port}")),
        "{line}"
    );
    for args in [&["check"][..], &["check", "--config-only"]] {
        let said = common::text(&g.run(args).stdout);
        assert!(
            said.lines()
                .any(|l| l.starts_with("warn http") && l.contains(WARNING)),
            "{args:?}: {said}"
        );
    }
}

/// One slow client, for as long as the task runs: connects, sends a request's header a
/// byte a second without ever finishing it, and connects again the moment the server
/// closes the connection. Counts its connections in `connected`.
async fn trickle(
    addr: std::net::SocketAddr,
    connected: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let header = b"GET /metrics HTTP/1.1\r\nHost: gw\r\nX-Slow: ";
    loop {
        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (mut rx, mut tx) = stream.into_split();
        let mut sent = 0usize;
        let mut buf = [0u8; 1024];
        loop {
            let byte = header.get(sent).copied().unwrap_or(b'a');
            if tx.write_all(&[byte]).await.is_err() {
                break;
            }
            if sent == 0 {
                connected.fetch_add(1, Ordering::SeqCst);
            }
            sent += 1;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                read = rx.read(&mut buf) => if matches!(read, Ok(0) | Err(_)) { break },
            }
        }
    }
}

/// A monitor's probe of `path` on a connection of its own: connects, sends the request
/// 300 ms later, reads the answer to its end. The status and body.
async fn probe(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {head:?}")))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    ))
}

/// The body of a chunked answer.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A hundred clients trickling header bytes do not keep `/healthz` and `/metrics` from
/// answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_clients_trickling_headers_do_not_stop_healthz_and_metrics() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let port = free_port();
    let g = Gateway::new(&format!(
        "{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        stdin_replay_config(20)
    ));
    let d = Daemon::start(&g);
    let base = format!("http://127.0.0.1:{port}");
    until_serving(&base).await;

    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let connected = std::sync::Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..100)
        .map(|_| tokio::spawn(trickle(addr, connected.clone())))
        .collect();
    eventually_async(LIMIT, async || {
        (connected.load(Ordering::SeqCst) >= 100).then_some(())
    })
    .await
    .expect("timed out waiting for all 100 slow clients connected");

    // A monitor's probes, each on a new connection that sends its request 300 ms after
    // connecting (a monitor on a slow link), each allowed 10 s. Slow clients reconnect
    // as fast as they are closed, hundreds a second: without a grace before eviction,
    // the probe's connection is closed before its request arrives.
    let mut answered = Vec::new();
    for i in 0..7 {
        let path = if i % 2 == 0 { "/healthz" } else { "/metrics" };
        let got = tokio::time::timeout(Duration::from_secs(10), probe(addr, path)).await;
        let ok = match &got {
            Ok(Ok((status, body))) => {
                *status == 200 && (body == "ok\n" || body.contains("tapegate_pending "))
            }
            _ => false,
        };
        let said = match got {
            Ok(Ok((status, body))) => format!("{status} {:.60}", body),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer in 10 s".into(),
        };
        answered.push((path, ok, said));
    }
    let slow_connections = connected.load(Ordering::SeqCst);
    for a in &attackers {
        a.abort();
    }
    assert!(
        answered.iter().all(|(_, ok, _)| *ok),
        "probes answered under the attack: {answered:?} ({slow_connections} slow connections made)"
    );
    let (code, log) = d.terminate(LIMIT);
    assert!(code.success(), "{log}");
}

#[test]
fn a_port_in_use_stops_the_daemon_at_start_naming_the_key_and_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let g = Gateway::new(&format!(
        "{}\n[http]\nlisten = \"{addr}\"\n",
        stdin_replay_config(20)
    ));
    let out = g.run(&["run"]);
    let stderr = common::text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on http.listen = {addr}")),
        "{stderr}"
    );
    assert!(
        g.stats().pending == 0 && g.stats().admitted == 0,
        "nothing ran"
    );
}
