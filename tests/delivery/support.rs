//! What the delivery tests share: generated traces, gateways configured for the mock,
//! the mock's record of what it received, and the real binary as a child process.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{mock_with as mock_on_own_runtime, text, write_records, Gateway};
use tapegate::config::{self, Config};
use tapegate::outbox::{Seeder, StateReader, Stats, StoreOptions};
use tapegate::pipeline::{self, RunOptions, RunReport};
use tapegate::record::{hex_upper, Advertisement, Capture, Mac};
use tapegate::source::sim::tape::UNREGISTERED_PREFIX;
use tapegate_mock::{
    self as mock, DecodeKind, Fault, MockConfig, MockHandle, Received, ReceivedItem, Storm,
};

/// Capture time of the first advert of every trace (2025-11-21 10:00 UTC).
pub(crate) const T0_MS: i64 = 1_763_719_200_000;
/// The mock's item error for a MAC it does not know (spec 4.4, item `error`).
pub(crate) const NOT_FOUND: &str = "device not found or not associated with the customer";
/// Longest a drained run may take before the test calls it stuck.
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(40);

/// One capture as the service sees it: `(mac_id, ble_packet)`.
pub(crate) type Key = (String, String);

// ---------------------------------------------------------------------------------------
// Traces

/// One capture of a generated trace.
#[derive(Debug, Clone)]
pub(crate) struct Shot {
    pub(crate) mac: Mac,
    pub(crate) ts_ms: i64,
    pub(crate) counter: u16,
    pub(crate) temp_centi: i16,
    pub(crate) battery: u8,
}

impl Shot {
    /// The 11-byte payload of a simulated tape (the table in the mock's module doc):
    /// marker `49 56`, counter, temperature in 0.01 °C, battery, shocks, serial.
    pub(crate) fn payload(&self) -> Vec<u8> {
        let mut p = vec![0x49, 0x56];
        p.extend_from_slice(&self.counter.to_le_bytes());
        p.extend_from_slice(&self.temp_centi.to_le_bytes());
        p.extend_from_slice(&[self.battery, 0, 0x01, 0x02, 0x03]);
        p
    }

    pub(crate) fn advert(&self) -> Advertisement {
        Advertisement {
            ts_ms: self.ts_ms,
            mac: self.mac,
            rssi: Some(-60),
            name: Some("TT".into()),
            manufacturer_data: vec![(0x0EF7, self.payload())],
            service_data: vec![],
        }
    }

    /// `ble_packet` as the default product sends it: the company identifier
    /// little-endian, then the payload, in upper-case hex.
    pub(crate) fn packet(&self) -> String {
        let mut bytes = vec![0xF7, 0x0E];
        bytes.extend(self.payload());
        hex_upper(&bytes)
    }

    pub(crate) fn key(&self) -> Key {
        (self.mac.plain(), self.packet())
    }

    pub(crate) fn registered(&self) -> bool {
        !self.mac.octets().starts_with(&UNREGISTERED_PREFIX)
    }

    pub(crate) fn temp(&self) -> f64 {
        f64::from(self.temp_centi) / 100.0
    }
}

/// A tape the mock knows.
pub(crate) fn registered_mac(i: u32) -> Mac {
    let b = i.to_be_bytes();
    Mac::new([0xC0, 0xFF, 0xEE, b[1], b[2], b[3]])
}

/// A tape the mock does not know (`UNREGISTERED_PREFIX`).
pub(crate) fn unregistered_mac(i: u32) -> Mac {
    let b = i.to_be_bytes();
    Mac::new([0xC0, 0xDE, 0xAD, b[1], b[2], b[3]])
}

/// `rounds` captures of each of `registered` known and `unregistered` unknown tapes: a
/// round every minute, the tapes of a round 10 ms apart; each capture has its own packet
/// (counter, temperature and battery change), so trace order is capture order.
pub(crate) fn trace(registered: u32, unregistered: u32, rounds: u32) -> Vec<Shot> {
    let mut shots = Vec::new();
    for r in 0..rounds {
        for i in 0..registered + unregistered {
            let mac = if i < registered {
                registered_mac(i)
            } else {
                unregistered_mac(i - registered)
            };
            shots.push(Shot {
                mac,
                ts_ms: T0_MS + i64::from(r) * 60_000 + i64::from(i) * 10,
                counter: (r * 1000 + i) as u16,
                temp_centi: ((i * 37 + r * 101) % 4000) as i16 - 1000,
                battery: 100 - (r % 100) as u8,
            });
        }
    }
    shots
}

pub(crate) fn write_trace(path: &Path, shots: &[Shot]) {
    let adverts: Vec<Advertisement> = shots.iter().map(Shot::advert).collect();
    write_records(path, &adverts);
}

// ---------------------------------------------------------------------------------------
// Gateways

/// What a test tunes about delivery.
#[derive(Debug, Clone)]
pub(crate) struct Knobs {
    pub(crate) max_batch: usize,
    pub(crate) request_timeout_secs: u64,
    pub(crate) backoff_max_secs: u64,
    /// `flush.max_in_flight`.
    pub(crate) max_in_flight: usize,
    /// `flush.max_delay_secs`.
    pub(crate) max_delay_secs: f64,
    /// `flush.max_attempts`.
    pub(crate) max_attempts: u32,
    /// The environment whose token endpoint is used; the service's own unless a test
    /// wants tokens the decode endpoint refuses.
    pub(crate) token_env: &'static str,
    /// `outbox.max_pending`.
    pub(crate) max_pending: u64,
    /// `[http] listen`, if the test reads `/healthz` or `/metrics`.
    pub(crate) http: Option<std::net::SocketAddr>,
    /// The daemon's clock, if not the machine's.
    pub(crate) clock: Option<tapegate::clock::SharedClock>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            max_batch: 250,
            request_timeout_secs: 10,
            backoff_max_secs: 1,
            max_in_flight: 8,
            max_delay_secs: 0.05,
            max_attempts: 5,
            token_env: "ppe",
            max_pending: 1_000_000,
            http: None,
            clock: None,
        }
    }
}

/// A gateway replaying `trace` into the mock's "ppe" environment with its demo
/// credentials: dedup off (every advert is a capture), quick commits, short waits.
pub(crate) fn delivery_config(mock: &MockHandle, trace: &Path, k: &Knobs) -> String {
    let e = crate::common::environment_settings(mock, "ppe").expect("the mock serves ppe");
    format!(
        r#"
[service]
environment = "ppe"
request_timeout_secs = {timeout}

[service.environments.ppe]
base_url = "{base}"
auth_url = "{auth}"
client_id = "{client_id}"
audience = "{audience}"
username = "{username}"
password = "{password}"
customer_id = "{customer_id}"
authorized_groups = "{groups}"

[scanner]
source = "replay"
replay_path = "{trace}"

[dedup]
window_secs = 0
min_interval_secs = 0

[outbox]
commit_interval_ms = 20
max_pending = {max_pending}

[flush]
max_batch = {max_batch}
max_delay_secs = {max_delay}
backoff_initial_ms = 50
backoff_max_secs = {backoff_max}
max_in_flight = {max_in_flight}
max_attempts = {max_attempts}
{http}"#,
        timeout = k.request_timeout_secs,
        base = e.base_url,
        auth = mock.auth_url(k.token_env),
        client_id = e.client_id,
        audience = e.audience,
        username = e.username,
        password = e.password.expose(),
        customer_id = e.customer_id,
        groups = e.authorized_groups,
        trace = trace.display(),
        max_batch = k.max_batch,
        backoff_max = k.backoff_max_secs,
        max_in_flight = k.max_in_flight,
        max_delay = k.max_delay_secs,
        max_attempts = k.max_attempts,
        max_pending = k.max_pending,
        http = k
            .http
            .map_or_else(String::new, |a| format!("\n[http]\nlisten = \"{a}\"\n")),
    )
}

/// A gateway in a temp dir whose replay trace holds `shots`.
pub(crate) fn gateway(mock: &MockHandle, shots: &[Shot], k: &Knobs) -> Gateway {
    let g = Gateway::new("");
    let trace = g.path("trace.jsonl");
    write_trace(&trace, shots);
    g.write_config(&delivery_config(mock, &trace, k));
    g
}

pub(crate) fn load(g: &Gateway) -> Config {
    config::load(&g.config_path(), std::iter::empty::<(String, String)>()).expect("valid config")
}

/// Runs the daemon in-process until the trace has ended and nothing is pending.
pub(crate) async fn run_until_drained(g: &Gateway) -> RunReport {
    run_until_drained_within(g, RUN_LIMIT).await
}

/// [`run_until_drained`], for a run that takes longer.
pub(crate) async fn run_until_drained_within(g: &Gateway, limit: Duration) -> RunReport {
    let options = RunOptions {
        until_drained: true,
        ..RunOptions::default()
    };
    let run = pipeline::run(load(g), std::future::pending::<()>(), options);
    tokio::time::timeout(limit, run)
        .await
        .expect("the daemon drains in time")
        .expect("the daemon runs")
}

/// A daemon running in-process on a FIFO as its replay trace, so the test decides when
/// captures arrive; closing the feed ends the source, and the daemon drains and returns.
pub(crate) struct Live {
    pub(crate) feed: std::fs::File,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    pub(crate) run: tokio::task::JoinHandle<Result<RunReport, pipeline::RunError>>,
}

impl Live {
    pub(crate) async fn start(mock: &MockHandle, g: &Gateway, k: &Knobs) -> Live {
        let fifo = g.path("trace.fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
        g.write_config(&delivery_config(mock, &fifo, k));
        let mut options = RunOptions {
            until_drained: true,
            ..RunOptions::default()
        };
        if let Some(clock) = &k.clock {
            options.clock = clock.clone();
        }
        let stop = tokio_util::sync::CancellationToken::new();
        let run = tokio::spawn(pipeline::run(
            load(g),
            stop.clone().cancelled_owned(),
            options,
        ));
        // Opening blocks until the daemon opens the other end.
        let feed =
            tokio::task::spawn_blocking(move || std::fs::OpenOptions::new().write(true).open(fifo))
                .await
                .unwrap()
                .expect("the trace FIFO opens");
        Live { feed, stop, run }
    }

    pub(crate) fn send(&mut self, shots: &[Shot]) {
        let mut lines = String::new();
        for s in shots {
            lines.push_str(&s.advert().to_record());
            lines.push('\n');
        }
        self.feed
            .write_all(lines.as_bytes())
            .expect("feed the trace");
    }

    /// Stops the daemon as SIGTERM would (within `limit`), whatever is pending.
    pub(crate) async fn stop(self, limit: Duration) -> RunReport {
        self.stop.cancel();
        drop(self.feed);
        tokio::time::timeout(limit, self.run)
            .await
            .expect("the daemon stops in time")
            .unwrap()
            .expect("the daemon runs")
    }

    /// Ends the trace and waits for the daemon to drain.
    pub(crate) async fn finish(self) -> RunReport {
        drop(self.feed);
        tokio::time::timeout(RUN_LIMIT, self.run)
            .await
            .expect("the daemon drains once the trace ends")
            .unwrap()
            .expect("the daemon runs")
    }
}

/// The daemon running in-process on a gateway's config until the test stops it.
pub(crate) struct Running {
    pub(crate) config: Config,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    pub(crate) run: tokio::task::JoinHandle<Result<RunReport, pipeline::RunError>>,
}

impl Running {
    pub(crate) fn start(g: &Gateway) -> Running {
        let config = load(g);
        let stop = tokio_util::sync::CancellationToken::new();
        let run = tokio::spawn(pipeline::run(
            config.clone(),
            stop.clone().cancelled_owned(),
            RunOptions::default(),
        ));
        Running { config, stop, run }
    }

    /// `tapegate status` (text or JSON) as it reads now.
    pub(crate) fn status(&self, json: bool) -> String {
        let mut out = Vec::new();
        tapegate::cmd::status::status(&self.config, &tapegate::clock::SystemClock, json, &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Stops the daemon (within `limit`) and returns its report.
    pub(crate) async fn stop(self, limit: Duration) -> RunReport {
        self.stop.cancel();
        tokio::time::timeout(limit, self.run)
            .await
            .expect("the daemon stops in time")
            .expect("joins")
            .expect("the daemon runs")
    }
}

/// Every decode request gets `fault`, until the storm is lifted.
pub(crate) fn fail_every_request(mock: &MockHandle, fault: Fault) {
    mock.set_storm(Some(Storm {
        probability: 1.0,
        seed: 1,
        mix: vec![fault],
    }));
}

/// Whether the state database's last error (what `status` shows) says `text`.
pub(crate) fn reports(g: &Gateway, text: &str) -> bool {
    stats_now(g)
        .and_then(|s| s.last_error)
        .is_some_and(|e| e.contains(text))
}

/// The state database's counters, or `None` while it does not exist yet.
pub(crate) fn stats_now(g: &Gateway) -> Option<Stats> {
    StateReader::open(&g.state_dir())
        .ok()
        .flatten()
        .and_then(|s| s.stats().ok())
}

/// DESIGN.md: what was admitted is delivered or dead-lettered, nothing is pending.
pub(crate) fn assert_drained(s: &Stats, admitted: usize, delivered: usize, dead_letters: usize) {
    let got = (
        s.admitted,
        s.delivered,
        s.dead_letters,
        s.evicted,
        s.pending,
    );
    let want = (admitted as u64, delivered as u64, dead_letters as u64, 0, 0);
    assert_eq!(
        got, want,
        "(admitted, delivered, dead_letters, evicted, pending)"
    );
    assert_eq!(s.delivered + s.dead_letters, s.admitted);
}

pub(crate) async fn start_mock() -> MockHandle {
    mock::start(MockConfig::demo()).await.expect("mock starts")
}

// ---------------------------------------------------------------------------------------
// What the service received

/// The bulk requests the mock received, in order of arrival. (A request whose client
/// gave up while the mock held it, by timeout or by dying, is not in the record.)
pub(crate) fn bulk_requests(mock: &MockHandle) -> Vec<Received> {
    let mut requests: Vec<Received> = mock
        .received()
        .into_iter()
        .filter(|r| r.kind == DecodeKind::Bulk)
        .collect();
    requests.sort_by_key(|r| r.at);
    requests
}

pub(crate) fn key_of(item: &ReceivedItem) -> Key {
    (item.mac_id.clone(), item.ble_packet.clone())
}

pub(crate) fn keys(r: &Received) -> HashSet<Key> {
    r.items.iter().map(key_of).collect()
}

/// How often each capture appears in `requests`.
pub(crate) fn tally<'a>(requests: impl IntoIterator<Item = &'a Received>) -> HashMap<Key, usize> {
    let mut n = HashMap::new();
    for r in requests {
        for item in &r.items {
            *n.entry(key_of(item)).or_insert(0) += 1;
        }
    }
    n
}

/// The service decoded this request and its answer reached the gateway.
pub(crate) fn answered(r: &Received) -> bool {
    r.status == Some(200) && !timed_out(r)
}

/// The mock held this request a second or more: in these tests its client has given up
/// by then (timed out, or shut down or killed while waiting).
pub(crate) fn timed_out(r: &Received) -> bool {
    matches!(r.fault, Some(Fault::Delay(d)) if d >= Duration::from_secs(1))
}

/// DESIGN.md: a batch holds at most `max_batch` captures, each MAC at most once, and
/// only captures that were made (with their capture time as `scan_time`).
pub(crate) fn assert_batches_well_formed(requests: &[Received], max_batch: usize, shots: &[Shot]) {
    let made: HashMap<Key, &Shot> = shots.iter().map(|s| (s.key(), s)).collect();
    for (n, r) in requests.iter().enumerate() {
        assert!(
            !r.items.is_empty() && r.items.len() <= max_batch,
            "request {n} holds {} items (max_batch {max_batch})",
            r.items.len()
        );
        let macs: HashSet<&str> = r.items.iter().map(|i| i.mac_id.as_str()).collect();
        assert_eq!(macs.len(), r.items.len(), "request {n} holds a MAC twice");
        for item in &r.items {
            let shot = made
                .get(&key_of(item))
                .unwrap_or_else(|| panic!("request {n} sent a capture never made: {item:?}"));
            assert_eq!(item.scan_time, (shot.ts_ms / 1000).to_string(), "{item:?}");
            assert_eq!(item.product_id, "tape", "{item:?}");
        }
    }
}

/// DESIGN.md: captures of one MAC are delivered in capture order. Across `requests`
/// (in order of arrival) a MAC's captures never go back; with `strict` (requests that
/// were answered) they never repeat either.
pub(crate) fn assert_capture_order<'a>(
    requests: impl IntoIterator<Item = &'a Received>,
    shots: &[Shot],
    strict: bool,
) {
    let captured_at: HashMap<Key, i64> = shots.iter().map(|s| (s.key(), s.ts_ms)).collect();
    let mut last: HashMap<String, i64> = HashMap::new();
    for (n, r) in requests.into_iter().enumerate() {
        for item in &r.items {
            let ts = captured_at[&key_of(item)];
            if let Some(prev) = last.insert(item.mac_id.clone(), ts) {
                assert!(
                    ts > prev || (!strict && ts == prev),
                    "request {n}: {} captured at {ts} sent after its capture at {prev}",
                    item.mac_id
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The real binary

/// A gateway whose outbox already holds `shots` (the tests are about delivery) and
/// whose daemon replays nothing.
pub(crate) fn backlog_gateway(mock: &MockHandle, shots: &[Shot], k: &Knobs) -> Gateway {
    let g = gateway(mock, &[], k);
    let (mut store, _) = Seeder::open(&g.state_dir(), StoreOptions::default()).unwrap();
    let captures: Vec<Capture> = shots
        .iter()
        .map(|s| crate::common::fixture::capture(s.mac, s.ts_ms, s.packet()))
        .collect();
    for group in captures.chunks(1000) {
        store.enqueue(group).unwrap();
    }
    g
}

/// A mock on its own runtime answering every request 0.3 s late, and a gateway whose
/// outbox holds 10,000 captures of 1,000 tapes: 200 batches of 50, seconds of work at
/// 8 in flight, so a signal finds them flying. (Batches of 50: a debug build records a
/// batch of 250 slower than 8 answers of 0.3 s come back; the benchmark runs the full
/// size.)
pub(crate) fn slow_backlog() -> (
    tokio::runtime::Runtime,
    MockHandle,
    Vec<Shot>,
    Knobs,
    Gateway,
) {
    let (rt, mock) = mock_on_own_runtime(MockConfig::demo());
    mock.set_answer_delay(Some(Duration::from_millis(300)));
    let shots = trace(1000, 0, 10);
    let k = Knobs {
        max_batch: 50,
        request_timeout_secs: 30,
        max_in_flight: 8,
        ..Knobs::default()
    };
    let g = backlog_gateway(&mock, &shots, &k);
    (rt, mock, shots, k, g)
}

/// `tapegate <args>` with its log in `<log>` inside the gateway dir.
pub(crate) fn spawn_daemon(g: &Gateway, args: &[&str], log: &str, env: &[(&str, &str)]) -> Child {
    let log = std::fs::File::create(g.path(log)).expect("log file");
    let mut cmd = g.command(args);
    cmd.envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("tapegate starts")
}

pub(crate) fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({sig})");
}

/// Waits at most `limit` for `child` to exit; past it kills it and fails with its log.
pub(crate) fn wait_exit(child: &mut Child, limit: Duration, g: &Gateway, log: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read(g.path(log)).unwrap_or_default();
            panic!(
                "tapegate did not exit within {limit:?}; its log:\n{}",
                text(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn log_of(g: &Gateway, log: &str) -> String {
    text(&std::fs::read(g.path(log)).unwrap_or_default())
}

/// A loopback address nothing listens on now, for `[http] listen`.
pub(crate) fn free_http_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// `GET http://{addr}{path}`: the status and body, or `None` while nothing answers.
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let resp = reqwest::get(format!("http://{addr}{path}")).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// One event of the client's decode gate, as the daemon logs it at TRACE
/// (`tapegate::api::pause`): a request put on the wire, or an answer read that asked
/// for a pause until `until_us`. `seq` orders all events as they took the gate's lock.
#[derive(Debug, Clone)]
pub(crate) struct GateEvent {
    pub(crate) seq: u64,
    pub(crate) at_us: u64,
    pub(crate) until_us: Option<u64>,
    pub(crate) correlation_id: String,
}

/// The value of `key=` in a log line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    Some(rest.split_whitespace().next()?.trim_matches('"'))
}

/// The gate's events in a daemon's log: (requests put on the wire, pauses read).
pub(crate) fn gate_events(log: &str) -> (Vec<GateEvent>, Vec<GateEvent>) {
    let (mut wires, mut pauses) = (Vec::new(), Vec::new());
    for line in log.lines() {
        let wire = line.contains("decode request on the wire");
        if !wire && !line.contains("decode answer read: pause") {
            continue;
        }
        let num = |k| field(line, k).and_then(|v| v.parse::<u64>().ok());
        let e = GateEvent {
            seq: num("gate_seq").expect("gate_seq"),
            at_us: num("at_us").expect("at_us"),
            until_us: num("until_us"),
            correlation_id: field(line, "correlation_id").unwrap_or("").to_string(),
        };
        if wire {
            wires.push(e);
        } else {
            pauses.push(e);
        }
    }
    (wires, pauses)
}

/// Requests put on the wire after a pause was read (a later gate event) and before the
/// pause ended: what "nothing is sent inside a Retry-After once it is read" forbids.
pub(crate) fn sent_inside_a_pause<'a>(
    wires: &'a [GateEvent],
    pauses: &'a [GateEvent],
) -> Vec<(&'a GateEvent, &'a GateEvent)> {
    let mut inside = Vec::new();
    for p in pauses {
        let until = p.until_us.expect("a pause has an end");
        for w in wires {
            if w.seq > p.seq && w.at_us < until {
                inside.push((p, w));
            }
        }
    }
    inside
}
