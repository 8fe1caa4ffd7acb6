//! What the operator-command tests share: the mock and a gateway configured for it,
//! fleets of labelled tapes, the binary run with arguments or stdin, and readers of its
//! output and of the mock's record.

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime};

use serde_json::Value;

#[cfg(debug_assertions)]
use crate::common::day::Day;
use crate::common::{tape_advert, text, write_records, Gateway};
use tapegate::record::{Advertisement, Mac};
use tapegate_mock::{
    self as mock, Device, DeviceStatus, Endpoint, MockConfig, MockHandle, RateWindows, Readings,
};

/// The rate window the tests give the mock and the client (the real one is 60 s).
pub(crate) const WINDOW_SECS: u64 = 2;

pub(crate) async fn start_mock(readings: Readings) -> MockHandle {
    mock::start(MockConfig {
        readings,
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts")
}

/// The mock (playing `readings`) and a gateway speaking to it, both on `day`.
#[cfg(debug_assertions)]
pub(crate) async fn setup_on(readings: Readings, day: &Day) -> (MockHandle, Gateway) {
    let mock = mock::start(MockConfig {
        readings,
        clock: day.mock_clock(),
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts");
    let g = gateway(&mock);
    day.set_on(&g);
    (mock, g)
}

/// A gateway speaking to the mock's "ppe" environment, every operator key set, with a
/// rate window of `window_secs` on both sides.
pub(crate) fn gateway_with(mock: &MockHandle, window_secs: u64) -> Gateway {
    let e = crate::common::environment_settings(mock, "ppe").expect("ppe");
    let g = Gateway::new("");
    g.write_config(&format!(
        r#"
[service]
environment = "ppe"
request_timeout_secs = 1
rate_window_secs = {window_secs}

[service.environments.ppe]
base_url = "{base}"
auth_url = "{auth}"
client_id = "{client_id}"
audience = "{audience}"
username = "{username}"
password = "{password}"
customer_id = "{customer_id}"
authorized_groups = "{groups}"
historical_base_url = "{historical}"
history_operation_id = "{op}"
default_app_id = "demo-app"
"#,
        base = e.base_url,
        auth = e.auth_url,
        client_id = e.client_id,
        audience = e.audience,
        username = e.username,
        password = e.password.expose(),
        customer_id = e.customer_id,
        groups = e.authorized_groups,
        historical = mock.historical_base_url("ppe"),
        op = mock::HISTORY_OPERATION_ID,
    ));
    mock.set_rate_window(10, Duration::from_secs(window_secs));
    g
}

pub(crate) fn gateway(mock: &MockHandle) -> Gateway {
    gateway_with(mock, WINDOW_SECS)
}

/// The mock (first choices on every open point) and a gateway speaking to it.
pub(crate) async fn setup() -> (MockHandle, Gateway) {
    setup_with(Readings::default()).await
}

pub(crate) async fn setup_with(readings: Readings) -> (MockHandle, Gateway) {
    let mock = start_mock(readings).await;
    let g = gateway(&mock);
    (mock, g)
}

/// One variant per reading of where the rate window starts.
pub(crate) fn rate_variants() -> Vec<Readings> {
    let v = Readings::variants();
    let first = v.iter().find(|r| r.rate == RateWindows::FromFirstRequest);
    let grid = v.iter().find(|r| r.rate == RateWindows::Grid);
    first.into_iter().chain(grid).copied().collect()
}

/// QR codes of fleet tapes the mock knows (NOT_ACTIVATED, no label).
pub(crate) fn fleet(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("TTC0FFEE{i:06X}")).collect()
}

/// Fleet tapes labelled (ACTIVATED) in the mock, as if done before the test.
pub(crate) fn labelled_fleet(mock: &MockHandle, n: usize) -> Vec<String> {
    let qrs = fleet(n);
    for q in &qrs {
        mock.put_device(
            Device::new(q, &q[2..], DeviceStatus::Activated).labelled("AWB-FLEET", "demo-app"),
        );
    }
    qrs
}

pub(crate) fn with_qrs(args: &[&str], qrs: &[String]) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    for q in qrs {
        v.push("--qr".into());
        v.push(q.clone());
    }
    v
}

pub(crate) fn run(g: &Gateway, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    g.run(&args)
}

/// `tapegate device <op> --csv FILE` with `csv` as the file.
pub(crate) fn csv_run(g: &Gateway, op: &str, csv: &str) -> Output {
    let path = g.path(&format!("{op}.csv"));
    std::fs::write(&path, csv).unwrap();
    g.run(&["device", op, "--csv", path.to_str().unwrap()])
}

/// `tapegate <args>` with `input` on stdin.
pub(crate) fn run_stdin(g: &Gateway, args: &[&str], input: &str) -> Output {
    let mut child = g
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

pub(crate) fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

pub(crate) fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub(crate) fn both(out: &Output) -> String {
    format!("{}\n{}", text(&out.stdout), text(&out.stderr))
}

pub(crate) fn statuses(mock: &MockHandle, endpoint: Endpoint) -> Vec<Option<u16>> {
    mock.operator_received()
        .iter()
        .filter(|r| r.endpoint == endpoint)
        .map(|r| r.status)
        .collect()
}

pub(crate) fn received_at(mock: &MockHandle, endpoint: Endpoint) -> Vec<SystemTime> {
    mock.operator_received()
        .iter()
        .filter(|r| r.endpoint == endpoint)
        .map(|r| r.at)
        .collect()
}

/// The devices of a `--json` report whose `error_code` is `code` (`None`: ok ones).
pub(crate) fn devices_with(report: &Value, code: Option<&str>) -> usize {
    report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| match code {
            None => d["ok"] == true,
            Some(c) => d["error_code"] == c,
        })
        .count()
}

/// Runs the daemon over `adverts` (captured now) until the service has answered them.
pub(crate) fn hear(g: &Gateway, adverts: &[Advertisement]) {
    let trace = g.path("heard.jsonl");
    write_records(&trace, adverts);
    let out = g
        .command(&["run", "--until-drained"])
        .env("TAPEGATE_SCANNER__SOURCE", "replay")
        .env("TAPEGATE_SCANNER__REPLAY_PATH", &trace)
        .env("TAPEGATE_DEDUP__WINDOW_SECS", "0")
        .env("TAPEGATE_DEDUP__MIN_INTERVAL_SECS", "0")
        .env("TAPEGATE_FLUSH__MAX_DELAY_SECS", "0.05")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

/// An advert of a tape the service does not know, heard now by `day`'s clock.
#[cfg(debug_assertions)]
pub(crate) fn unknown_tape(day: &Day, i: u8, rssi: i16) -> Advertisement {
    let mac = Mac::new([0xC0, 0xDE, 0xAD, 0, 0, i]);
    let mut a = tape_advert(mac, day.now_ms(), 1);
    a.rssi = Some(rssi);
    a
}
