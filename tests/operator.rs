//! The operator commands through the real binary against the mock service on loopback
//! (issue 11's "How it is checked"): the shared rate window, chunking, per-device
//! results, label never repeated blindly, AWB retry, history splitting, CSV errors and
//! `device add --nearest`. The mock runs in-process; each command is a child process
//! with its own state database in a temp dir.

//! The operator commands through the real binary against the mock service on loopback:
//! the shared rate window, chunking, per-device results, label never repeated blindly,
//! AWB retry, history splitting, CSV manifests and `device add --nearest`; and issue
//! 21, each item against the reading of the spec that shows it.
//!
//! Where the spec is silent the mock plays each reading (`tapegate_mock::Readings`):
//! the tests run under every variant of [`Readings::variants`] (a loop inside the
//! test), except those that wait for the rate window, which run under one variant per
//! rate reading. The mock runs in-process; each command is a child process with its own
//! state database in a temp dir.

mod common;

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tapegate::record::{Advertisement, Mac};
use tapegate_mock::{
    self as mock, seed, Device, DeviceStatus, Endpoint, Fault, MockConfig, MockHandle, QrEcho,
    RateWindows, Readings,
};

#[cfg(debug_assertions)]
use common::day::Day;
use common::{collect_stderr, eventually, tape_advert, text, write_records, Gateway};

/// The rate window the tests give the mock and the client (the real one is 60 s).
const WINDOW_SECS: u64 = 2;

async fn start_mock(readings: Readings) -> MockHandle {
    mock::start(MockConfig {
        readings,
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts")
}

/// The mock (playing `readings`) and a gateway speaking to it, both on `day`.
#[cfg(debug_assertions)]
async fn setup_on(readings: Readings, day: &Day) -> (MockHandle, Gateway) {
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
fn gateway_with(mock: &MockHandle, window_secs: u64) -> Gateway {
    let e = common::environment_settings(mock, "ppe").expect("ppe");
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

fn gateway(mock: &MockHandle) -> Gateway {
    gateway_with(mock, WINDOW_SECS)
}

/// The mock (first choices on every open point) and a gateway speaking to it.
async fn setup() -> (MockHandle, Gateway) {
    setup_with(Readings::default()).await
}

async fn setup_with(readings: Readings) -> (MockHandle, Gateway) {
    let mock = start_mock(readings).await;
    let g = gateway(&mock);
    (mock, g)
}

/// One variant per reading of where the rate window starts.
fn rate_variants() -> Vec<Readings> {
    let v = Readings::variants();
    let first = v.iter().find(|r| r.rate == RateWindows::FromFirstRequest);
    let grid = v.iter().find(|r| r.rate == RateWindows::Grid);
    first.into_iter().chain(grid).copied().collect()
}

/// QR codes of fleet tapes the mock knows (NOT_ACTIVATED, no label).
fn fleet(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("TTC0FFEE{i:06X}")).collect()
}

/// Fleet tapes labelled (ACTIVATED) in the mock, as if done before the test.
fn labelled_fleet(mock: &MockHandle, n: usize) -> Vec<String> {
    let qrs = fleet(n);
    for q in &qrs {
        mock.put_device(
            Device::new(q, &q[2..], DeviceStatus::Activated).labelled("AWB-FLEET", "demo-app"),
        );
    }
    qrs
}

fn with_qrs(args: &[&str], qrs: &[String]) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    for q in qrs {
        v.push("--qr".into());
        v.push(q.clone());
    }
    v
}

fn run(g: &Gateway, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    g.run(&args)
}

/// `tapegate device <op> --csv FILE` with `csv` as the file.
fn csv_run(g: &Gateway, op: &str, csv: &str) -> Output {
    let path = g.path(&format!("{op}.csv"));
    std::fs::write(&path, csv).unwrap();
    g.run(&["device", op, "--csv", path.to_str().unwrap()])
}

/// `tapegate <args>` with `input` on stdin.
fn run_stdin(g: &Gateway, args: &[&str], input: &str) -> Output {
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

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn both(out: &Output) -> String {
    format!("{}\n{}", text(&out.stdout), text(&out.stderr))
}

fn statuses(mock: &MockHandle, endpoint: Endpoint) -> Vec<Option<u16>> {
    mock.operator_received()
        .iter()
        .filter(|r| r.endpoint == endpoint)
        .map(|r| r.status)
        .collect()
}

fn received_at(mock: &MockHandle, endpoint: Endpoint) -> Vec<SystemTime> {
    mock.operator_received()
        .iter()
        .filter(|r| r.endpoint == endpoint)
        .map(|r| r.at)
        .collect()
}

/// The devices of a `--json` report whose `error_code` is `code` (`None`: ok ones).
fn devices_with(report: &Value, code: Option<&str>) -> usize {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eleventh_label_request_in_a_window_waits_instead_of_earning_a_429() {
    let (mock, g) = setup().await;
    // 220 devices: 11 requests of 20, one more than a window takes.
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &fleet(220)),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("s for the service's rate window"),
        "{}",
        text(&out.stderr)
    );
    let got = statuses(&mock, Endpoint::Label);
    assert_eq!(got, vec![Some(200); 11]);
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eleventh_label_request_waits_across_two_cli_runs() {
    // The window's stamps are the clock's, kept in the database between runs.
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let qrs = fleet(220);
        let first = run(
            &g,
            &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[..200]),
        );
        assert_eq!(code(&first), 0, "{day}: {}", text(&first.stderr));
        assert!(!text(&first.stderr).contains("rate window"), "{day}");
        let second = run(
            &g,
            &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[200..]),
        );
        assert_eq!(code(&second), 0, "{day}: {}", text(&second.stderr));
        assert!(
            text(&second.stderr).contains("s for the service's rate window"),
            "{day}: {}",
            text(&second.stderr)
        );
        assert_eq!(
            statuses(&mock, Endpoint::Label),
            vec![Some(200); 11],
            "{day}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_anyway_waits_for_the_next_window_and_sends_again() {
    let (mock, g) = setup().await;
    // Another client of the same identity filled the window: the service says 429.
    mock.push_operator_fault(
        Endpoint::Deactivate,
        Fault::Status {
            status: 429,
            retry_after: None,
        },
    );
    let qrs = labelled_fleet(&mock, 2);
    let out = run(&g, &with_qrs(&["device", "deactivate"], &qrs));
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        statuses(&mock, Endpoint::Deactivate),
        [Some(429), Some(200)]
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("(429)") && stderr.contains("s for the service's rate window"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_45_device_deactivate_is_one_request_and_already_in_target_state_exits_0() {
    let (mock, g) = setup().await;
    let deactivated = seed::STATUS_DEVICES
        .iter()
        .find(|(_, s)| *s == DeviceStatus::Deactivated)
        .map(|(q, _)| q.to_string())
        .unwrap();
    let mut qrs = labelled_fleet(&mock, 44);
    qrs.push(deactivated.clone());
    // A QR code given twice is sent once.
    qrs.push(qrs[0].clone());
    let out = run(&g, &with_qrs(&["device", "deactivate", "--json"], &qrs));
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(mock.operator_requests(Endpoint::Deactivate), 1);
    let report = json(&out);
    let devices = report["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 45);
    let already = devices
        .iter()
        .find(|d| d["qrcode"] == deactivated.as_str())
        .unwrap();
    assert_eq!(already["ok"], true);
    assert_eq!(already["error_code"], "ALREADY_IN_TARGET_STATE");
    assert_eq!(
        mock.device(&qrs[0]).unwrap().status,
        DeviceStatus::Deactivated
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_45_device_label_is_three_requests() {
    let (mock, g) = setup().await;
    let qrs = fleet(45);
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-7"], &qrs),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(mock.operator_requests(Endpoint::Label), 3);
    for q in &qrs {
        let label = mock.device(q).unwrap().label.unwrap();
        assert_eq!(
            (label.asset_barcode.as_str(), label.application_id.as_str()),
            ("AWB-7", "demo-app")
        );
    }
}

/// Seen: 20 labels applied, their answer lost, the lookup answering the label's fields
/// flat on each entry: read as "not labelled", sent again, 20 `ALREADY_LABELLED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_timed_out_after_the_mock_applied_it_is_confirmed_by_the_lookup_in_either_shape() {
    for readings in Readings::variants() {
        let (mock, g) = setup_with(readings).await;
        // The mock applies the label, then holds the answer past the client's 1 s timeout.
        mock.push_operator_fault(Endpoint::Label, Fault::Delay(Duration::from_secs(3)));
        let qrs = fleet(20);
        let out = run(
            &g,
            &with_qrs(&["device", "label", "--asset", "AWB-9", "--json"], &qrs),
        );
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        assert_eq!(
            mock.operator_requests(Endpoint::Label),
            1,
            "{readings:?}: the label was sent again"
        );
        assert!(
            mock.operator_requests(Endpoint::ShowLabels) >= 1,
            "{readings:?}: no lookup"
        );
        let report = json(&out);
        let devices = report["devices"].as_array().unwrap();
        let reported: Vec<&str> = devices
            .iter()
            .map(|d| d["qrcode"].as_str().unwrap())
            .collect();
        assert_eq!(reported, qrs, "{readings:?}: every device, in order");
        for d in devices {
            assert_eq!(d["ok"], true, "{readings:?}: {d}");
            assert!(
                d["note"].as_str().unwrap().contains("lookup confirms"),
                "{readings:?}: {d}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_lost_before_the_mock_applied_it_is_sent_again_for_those_not_labelled() {
    let (mock, g) = setup().await;
    // A 503: nothing applied; the lookup shows no label, so the label goes again.
    mock.push_operator_fault(
        Endpoint::Label,
        Fault::Status {
            status: 503,
            retry_after: None,
        },
    );
    let qrs = fleet(2);
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-3"], &qrs),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(statuses(&mock, Endpoint::Label), [Some(503), Some(200)]);
    assert_eq!(
        mock.device(&qrs[1]).unwrap().label.unwrap().asset_barcode,
        "AWB-3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabel_of_an_unknown_qr_reports_device_not_found() {
    let (_mock, g) = setup().await;
    let out = run(
        &g,
        &[
            "device",
            "relabel",
            "--qr",
            "TTNOSUCHTAPE",
            "--asset",
            "AWB-2",
        ]
        .map(String::from),
    );
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("TTNOSUCHTAPE") && stdout.contains("DEVICE_NOT_FOUND"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivated_then_labelled_with_override_stays_deactivated() {
    let (mock, g) = setup().await;
    let qr = fleet(1).remove(0);
    let label = |extra: &[&str]| {
        let mut a = vec!["device", "label", "--qr", &qr, "--asset", "AWB-NEW"];
        a.extend_from_slice(extra);
        g.run(&a)
    };
    assert_eq!(code(&label(&[])), 0);
    assert_eq!(code(&g.run(&["device", "deactivate", "--qr", &qr])), 0);
    // Without override: ALREADY_LABELLED, exit 1.
    let refused = label(&[]);
    assert_eq!(code(&refused), 1);
    assert!(text(&refused.stdout).contains("ALREADY_LABELLED"));
    let out = g.run(&[
        "device",
        "label",
        "--qr",
        &qr,
        "--asset",
        "AWB-OVER",
        "--override",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out.stdout));
    // Item 8: "ok" alone would read as active again.
    assert!(
        text(&out.stdout).contains("a DEACTIVATED device stays deactivated"),
        "{}",
        text(&out.stdout)
    );
    let d = mock.device(&qr).unwrap();
    assert_eq!(d.status, DeviceStatus::Deactivated);
    assert_eq!(d.label.unwrap().asset_barcode, "AWB-OVER");
    let shown = g.run(&["device", "show", "--qr", &qr, "--json"]);
    assert_eq!(code(&shown), 0);
    assert_eq!(
        json(&shown)["devices"][0]["record"]["status"],
        "DEACTIVATED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awb_404_is_retried_once_then_reported_not_found() {
    let (mock, g) = setup().await;
    let out = g.run(&["locate", seed::AWB_UNPLACED]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stderr).contains("AWB not found"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(404), Some(404)]);
    let found = g.run(&["locate", seed::AWB, "--json"]);
    assert_eq!(code(&found), 0, "{}", text(&found.stderr));
    assert_eq!(json(&found)["assets"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awb_404_from_a_temporary_fault_is_found_on_the_one_retry() {
    let (mock, g) = setup().await;
    // The service reports a temporary fault of an AWB read as 404 AWB not found.
    mock.push_operator_fault(
        Endpoint::Locate,
        Fault::Status {
            status: 500,
            retry_after: None,
        },
    );
    let out = g.run(&["locate", seed::AWB]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(404), Some(200)]);
    assert!(text(&out.stderr).contains("asking once more"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensor_mode_prints_six_readings_with_units_and_no_reading_exits_1() {
    let (mock, g) = setup().await;
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for (kind, units) in tapegate::operator::SENSORS {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(kind) && l.contains(&format!(" {units}"))),
            "{kind} {units}: {stdout}"
        );
    }
    let none = g.run(&["locate", seed::UNPLACED_ASSET, "--sensor"]);
    assert_eq!(code(&none), 1);
    assert!(text(&none.stderr).contains("no current reading"));
    assert_eq!(
        mock.operator_requests(Endpoint::Locate),
        3,
        "no reading is asked once more (spec 4.1 sensor rule 4)"
    );
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_14_months_is_refused_before_anything_is_sent() {
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let out = g.run(&[
            "history",
            "--qr",
            seed::SENSOR_TAPE,
            "--from",
            &day.days_ago(426).to_string(),
        ]);
        assert_eq!(code(&out), 2, "{day}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("one year"),
            "{day}: {}",
            text(&out.stderr)
        );
        assert_eq!(mock.operator_requests(Endpoint::History), 0, "{day}");
    }
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_3_months_is_3_or_more_requests_merged_in_order() {
    // `--to` left out: the range ends now, by the command's clock.
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let from = day.days_ago(100);
        let out = g.run(&[
            "history",
            "--qr",
            seed::SENSOR_TAPE,
            "--from",
            &from.to_string(),
            "--json",
        ]);
        assert_eq!(code(&out), 0, "{day}: {}", text(&out.stderr));
        let requests = mock.operator_requests(Endpoint::History);
        assert!(requests >= 4, "{day}: {requests} requests");
        assert!(
            statuses(&mock, Endpoint::History)
                .iter()
                .all(|s| *s == Some(200)),
            "{day}"
        );
        let events = json(&out);
        let times: Vec<jiff::Timestamp> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
            .collect();
        // The tape has an event every 30 min: no gap wider means no window's 1,000 cap
        // cut any, and none narrower or equal to zero means no duplicate and time order.
        assert!(times.len() >= 100 * 48 - 5, "{day}: {} events", times.len());
        for w in times.windows(2) {
            let gap = w[1].as_second() - w[0].as_second();
            assert!(gap > 0 && gap <= 1800, "{day}: {} then {}", w[0], w[1]);
        }
        assert!(times[0] >= from, "{day}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_csv_row_names_its_line_and_nothing_is_sent_for_it() {
    let (mock, g) = setup().await;
    let qrs = fleet(3);
    let out = csv_run(
        &g,
        "label",
        &format!(
            "qrcode,asset_barcode,shipment\n{},AWB-1,\n{},AWB-2,{{not json\n{},AWB-3,\n",
            qrs[0], qrs[1], qrs[2]
        ),
    );
    assert_eq!(code(&out), 1);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("line 3:"), "{stdout}");
    let sent: Vec<String> = mock
        .operator_received()
        .iter()
        .map(|r| r.body.clone())
        .collect();
    assert!(
        sent.iter().all(|b| !b.contains(&qrs[1])),
        "the bad row was sent"
    );
    assert!(mock.device(&qrs[0]).unwrap().label.is_some());
    assert!(mock.device(&qrs[2]).unwrap().label.is_some());
    // An unknown column: nothing at all is sent, exit 2.
    let before = mock.operator_received().len();
    let out = csv_run(&g, "label", &format!("qrcode,colour\n{},red\n", qrs[0]));
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("\"colour\""),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mock.operator_received().len(), before);
}

/// Runs the daemon over `adverts` (captured now) until the service has answered them.
fn hear(g: &Gateway, adverts: &[Advertisement]) {
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
fn unknown_tape(day: &Day, i: u8, rssi: i16) -> Advertisement {
    let mac = Mac::new([0xC0, 0xDE, 0xAD, 0, 0, i]);
    let mut a = tape_advert(mac, day.now_ms(), 1);
    a.rssi = Some(rssi);
    a
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_with_two_tapes_4_db_apart_refuses_and_lists_both() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    hear(
        &g,
        &[unknown_tape(&day, 1, -60), unknown_tape(&day, 2, -64)],
    );
    let out = g.run(&["device", "add", "--qr", "TTC0DEAD000001", "--nearest"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("C0:DE:AD:00:00:01") && stdout.contains("C0:DE:AD:00:00:02"),
        "{stdout}"
    );
    assert_eq!(mock.operator_requests(Endpoint::AddDevice), 0);
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_activates_the_tape_10_db_louder_and_requeues_its_dead_letters() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    hear(
        &g,
        &[unknown_tape(&day, 1, -50), unknown_tape(&day, 2, -64)],
    );
    assert_eq!(g.stats().dead_letters, 2);
    let out = g.run(&["device", "add", "--qr", "TTC0DEAD000001", "--nearest"]);
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("re-queued 1 dead letter(s) of C0:DE:AD:00:00:01"));
    let add = mock
        .operator_received()
        .into_iter()
        .find(|r| r.endpoint == Endpoint::AddDevice)
        .unwrap();
    let query = add.query.unwrap_or_default();
    assert!(
        query.contains("tape_id=C0DEAD000001")
            && query.contains("dstatus=1")
            && query.contains("tp=Parcel"),
        "{query}"
    );
    assert_eq!(g.stats().pending, 1);
    // A second add of the same tape: 409, and the error says what to do.
    let again = g.run(&[
        "device",
        "add",
        "--qr",
        "TTC0DEAD000001",
        "--tape-id",
        "C0:DE:AD:00:00:01",
    ]);
    assert_eq!(code(&again), 1);
    assert!(
        text(&again.stderr).contains("--override"),
        "{}",
        text(&again.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_payload_is_checked_before_it_is_sent() {
    let (mock, g) = setup().await;
    let file = g.path("payload.json");
    std::fs::write(
        &file,
        r#"{"device_id":"TT1","sensor_data":{"temperature":4.5},"timestamp":1763719200}"#,
    )
    .unwrap();
    let out = g.run(&["message", "DEVICE_DATA", file.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("sensor_data.humidity is missing"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mock.operator_requests(Endpoint::Message), 0);
    std::fs::write(&file, r#"{"device_id":"TT1","sensor_data":{"temperature":4.5,"humidity":60},"timestamp":1763719200}"#).unwrap();
    let out = g.run(&["message", "DEVICE_DATA", file.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let sent = mock.operator_received().pop().unwrap();
    assert_eq!(sent.header("message_type"), Some("DEVICE_DATA"));
}

#[test]
fn the_demo_activates_the_unknown_tapes_and_delivers_their_dead_letters() {
    // The demo runs on its own clock: outage at 1/3 of the run (8 s long), activation
    // 2 s after it, the rest of the run to deliver what was re-queued.
    let out = std::process::Command::new(common::BIN)
        .args(["demo", "--duration", "28", "--tapes", "60"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let added = stdout
        .lines()
        .find(|l| l.contains("tapegate device add --qr TTC0DEAD"))
        .unwrap_or_else(|| panic!("no activation: {stdout}"));
    assert!(
        added.contains("HTTP 201") && added.contains("dead letter(s) re-queued"),
        "{added}"
    );
    let delivered = stdout
        .split("now delivered:")
        .nth(1)
        .unwrap_or_else(|| panic!("no delivered tapes: {stdout}"));
    assert!(
        delivered
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("C0:DE:AD") && l.contains("decoded")),
        "{delivered}"
    );
    assert!(stdout.contains("--- tapegate locate ASSET-0001 --sensor ---"));
    assert!(stdout.contains("humidity 61 %"), "{stdout}");
    assert!(stdout.contains("event(s) in 1 request(s)"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configure_rows_with_different_changes_go_in_separate_requests() {
    let (mock, g) = setup().await;
    let qrs = labelled_fleet(&mock, 3);
    let out = csv_run(
        &g,
        "configure",
        &format!(
            "qrcode,firmware,tape_displayname\n{},1.5.0,Pallet 1\n{},1.6.0,\n{},1.5.0,\n",
            qrs[0], qrs[1], qrs[2]
        ),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // One shared firmware per request (spec 4.7): two changes, two requests.
    assert_eq!(mock.operator_requests(Endpoint::Configure), 2);
    let firmware: Vec<String> = qrs
        .iter()
        .map(|q| mock.device(q).unwrap().firmware)
        .collect();
    assert_eq!(firmware, ["1.5.0", "1.6.0", "1.5.0"]);
    assert_eq!(
        mock.device(&qrs[0]).unwrap().tape_displayname.as_deref(),
        Some("Pallet 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_is_reported_without_the_password() {
    let (mock, g) = setup().await;
    let config = std::fs::read_to_string(g.config_path()).unwrap();
    let password = common::environment_settings(&mock, "ppe").unwrap().password;
    let wrong = "hunter2-not-the-password";
    std::fs::write(g.config_path(), config.replace(password.expose(), wrong)).unwrap();
    for args in [
        &["device", "show", "--qr", "TTC0FFEE000001"][..],
        &["locate", seed::AWB],
    ] {
        let out = g.run(args);
        assert_eq!(code(&out), 1, "{args:?}");
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            all.contains("token refused") || all.contains("credentials"),
            "{all}"
        );
        assert!(!all.contains(wrong), "{all}");
    }
    assert_eq!(mock.operator_received().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_reported_as_credentials_or_permission() {
    let (mock, g) = setup().await;
    mock.set_permission(Endpoint::Label, false);
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &fleet(1)),
    );
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stderr).contains("credentials or permission"),
        "{}",
        text(&out.stderr)
    );
    // One retry with a fresh token (spec 5.5), then no more.
    assert_eq!(statuses(&mock, Endpoint::Label), [Some(401), Some(401)]);
}

// ---- Issue 21: right under every reading, and never a success not confirmed ----

/// A service may read the range to the whole second and answer an event just before a
/// `--from` that has a fraction: it is outside the range asked, and not printed.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_prints_no_event_from_before_the_range_asked() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    // The tape reports on every half hour; the fixed day is on one.
    let on_the_half_hour = day.days_ago(2);
    assert_eq!(on_the_half_hour.as_second() % 1800, 0, "{day}");
    let from = on_the_half_hour + jiff::SignedDuration::from_millis(500);
    let out = g.run(&[
        "history",
        "--qr",
        seed::SENSOR_TAPE,
        "--from",
        &from.to_string(),
        "--to",
        &day.days_ago(1).to_string(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    let first: jiff::Timestamp = json(&out)[0]["timestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        first,
        on_the_half_hour + jiff::SignedDuration::from_mins(30),
        "asked from {from}"
    );
    assert!(statuses(&mock, Endpoint::History) == [Some(200)]);
}

#[cfg(debug_assertions)]
/// Whether `from..=to` holds a whole calendar month (UTC) of 31 days: the client asks
/// history a calendar month at a time, so only then does it ask a 31-day window.
fn holds_a_whole_31_day_month(from: jiff::Timestamp, to: jiff::Timestamp) -> bool {
    use jiff::ToSpan;
    let utc = jiff::tz::TimeZone::UTC;
    let mut month = from.to_zoned(utc.clone()).date().first_of_month();
    loop {
        let start = month.to_zoned(utc.clone()).unwrap().timestamp();
        let next = month.checked_add(1.month()).unwrap();
        let end = next.to_zoned(utc.clone()).unwrap().timestamp();
        if end > to {
            return false;
        }
        if start >= from && month.days_in_month() == 31 {
            return true;
        }
        month = next;
    }
}

/// Seen: 2,740 events in range, 1,396 printed, when the service keeps the newest 1,000
/// of a full answer; and a 400 for a 31-day window when its month is 30 days.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_complete_whichever_end_of_a_full_answer_the_service_keeps_and_whatever_its_month(
) {
    let mut whole_31_day_months = 0;
    for day in Day::each() {
        for readings in Readings::variants() {
            let (mock, g) = setup_on(readings, &day).await;
            let (from, to) = (day.days_ago(58), day.days_ago(1));
            let out = g.run(&[
                "history",
                "--qr",
                seed::SENSOR_TAPE,
                "--from",
                &from.to_string(),
                "--to",
                &to.to_string(),
                "--json",
            ]);
            assert_eq!(code(&out), 0, "{day}, {readings:?}: {}", both(&out));
            let times: Vec<jiff::Timestamp> = json(&out)
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
                .collect();
            // An event every 30 min: the first and last within 30 min of the ends, no gap
            // wider, no duplicate, in time order.
            let half_hour = jiff::SignedDuration::from_mins(30);
            assert!(
                times.len() >= 57 * 48,
                "{day}, {readings:?}: {} events",
                times.len()
            );
            assert!(
                times[0].duration_since(from) <= half_hour,
                "{day}, {readings:?}"
            );
            assert!(
                to.duration_since(*times.last().unwrap()) <= half_hour,
                "{day}, {readings:?}"
            );
            for w in times.windows(2) {
                let gap = w[1].as_second() - w[0].as_second();
                assert!(
                    gap > 0 && gap <= 1800,
                    "{day}, {readings:?}: {} then {}",
                    w[0],
                    w[1]
                );
            }
            let refused = statuses(&mock, Endpoint::History)
                .iter()
                .filter(|s| **s == Some(400))
                .count();
            // A service whose month is 30 days refuses the client's window of a whole
            // 31-day month, and nothing else.
            if readings.month_days == 30 && holds_a_whole_31_day_month(from, to) {
                whole_31_day_months += 1;
                assert!(
                    refused >= 1,
                    "{day}, {readings:?}: a 31-day month was never asked"
                );
            } else {
                assert_eq!(refused, 0, "{day}, {readings:?}");
            }
        }
    }
    // The fixed days are chosen so that one does (the refusal is exercised).
    assert!(
        whole_31_day_months > 0 || std::env::var_os(common::day::TEST_DAYS_ENV).is_some(),
        "no fixed day's range holds a whole 31-day month"
    );
}

/// Seen: `device show --json` printed no asset for labelled tapes when the lookup put
/// the label's fields on the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_show_gives_the_label_whichever_shape_the_lookup_answers_in() {
    for readings in Readings::variants() {
        let (_mock, g) = setup_with(readings).await;
        let labelled = seed::STATUS_DEVICES[1].0;
        let unlabelled = seed::STATUS_DEVICES[0].0;
        let out = g.run(&[
            "device", "show", "--qr", labelled, "--qr", unlabelled, "--json",
        ]);
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let report = json(&out);
        let record = |i: usize| report["devices"][i]["record"].clone();
        assert_eq!(
            record(0)["label"]["asset_barcode"],
            "ASSET-1002",
            "{readings:?}"
        );
        assert_eq!(
            record(0)["label"]["application_id"],
            "demo-app",
            "{readings:?}"
        );
        assert_eq!(record(1)["label"], Value::Null, "{readings:?}");
        assert_eq!(record(1)["status"], "NOT_ACTIVATED", "{readings:?}");
    }
}

/// Item 1: a failure before anything reached the service (here the token endpoint's
/// 503) is not a lost answer: no `retry=1`, and the 409 that follows is "exists".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_that_never_reached_the_service_is_not_taken_for_a_lost_answer() {
    let (mock, g) = setup().await;
    let existing = seed::STATUS_DEVICES[1].0;
    mock.push_token_fault(Fault::Status {
        status: 503,
        retry_after: None,
    });
    let out = g.run(&[
        "device",
        "add",
        "--qr",
        existing,
        "--tape-id",
        &existing[2..],
    ]);
    assert_eq!(code(&out), 1, "{}", both(&out));
    assert!(text(&out.stderr).contains("--override"), "{}", both(&out));
    let adds: Vec<String> = mock
        .operator_received()
        .into_iter()
        .filter(|r| r.endpoint == Endpoint::AddDevice)
        .map(|r| r.query.unwrap_or_default())
        .collect();
    assert_eq!(adds.len(), 1, "{adds:?}");
    assert!(!adds[0].contains("retry=1"), "{adds:?}");
}

/// Item 1: after an answer that may have been lost, a 409 is confirmed by the lookup
/// (the QR code carries the tape id sent) or reported "exists", never a plain success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_after_a_lost_add_is_confirmed_by_the_lookup_or_reported() {
    for readings in Readings::variants() {
        let (mock, g) = setup_with(readings).await;
        // Not ours: a 503 applied nothing; the QR code belongs to another tape.
        let existing = seed::STATUS_DEVICES[1].0;
        mock.push_operator_fault(
            Endpoint::AddDevice,
            Fault::Status {
                status: 503,
                retry_after: None,
            },
        );
        let out = g.run(&[
            "device",
            "add",
            "--qr",
            existing,
            "--tape-id",
            "C0:DE:AD:00:00:09",
        ]);
        assert_eq!(code(&out), 1, "{readings:?}: {}", both(&out));
        assert!(
            text(&out.stderr).contains("another tape id"),
            "{}",
            both(&out)
        );
        let adds: Vec<String> = mock
            .operator_received()
            .into_iter()
            .filter(|r| r.endpoint == Endpoint::AddDevice)
            .map(|r| r.query.unwrap_or_default())
            .collect();
        assert!(adds[1].contains("retry=1"), "{adds:?}");
        // Ours: applied, the answer held past the client's timeout; `--json` says so.
        mock.push_operator_fault(Endpoint::AddDevice, Fault::Delay(Duration::from_secs(3)));
        let out = g.run(&[
            "device",
            "add",
            "--qr",
            "TTC0DEAD000005",
            "--tape-id",
            "C0:DE:AD:00:00:05",
            "--json",
        ]);
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let doc = json(&out);
        assert_eq!(doc["ok"], true, "{doc}");
        assert!(
            doc["note"]
                .as_str()
                .unwrap()
                .contains("created by the earlier attempt"),
            "{doc}"
        );
        assert_eq!(
            statuses(&mock, Endpoint::AddDevice)[2..],
            [Some(201), Some(409)]
        );
    }
}

/// Item 2: per-device errors named by the service's normalised QR code are matched,
/// not read as "absent from errors, so ok".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_naming_the_qr_code_as_sent_or_normalised_are_matched_to_their_device() {
    for readings in Readings::variants() {
        let (_mock, g) = setup_with(readings).await;
        let lower = seed::STATUS_DEVICES[1].0.to_lowercase();
        let out = g.run(&[
            "device", "label", "--qr", &lower, "--asset", "AWB-X", "--json",
        ]);
        assert_eq!(code(&out), 1, "{readings:?}: {}", both(&out));
        let d = &json(&out)["devices"][0];
        assert_eq!(d["ok"], false, "{readings:?}: {d}");
        let want = match readings.qr_echo {
            QrEcho::AsSent => "QRMAC_NOT_FOUND",
            QrEcho::Normalised => "ALREADY_LABELLED",
        };
        assert_eq!(d["error_code"], want, "{readings:?}: {d}");
    }
}

/// Item 3: a 160-device label run refused at its 7th request still reports the 120
/// labelled, the 20 refused and the 20 not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_fails_part_way_reports_every_device() {
    for json_out in [true, false] {
        let (mock, g) = setup().await;
        for nth in [7, 8] {
            // A token refused twice: the permission withdrawn during the run.
            mock.push_operator_fault_at(
                Endpoint::Label,
                nth,
                Fault::Status {
                    status: 401,
                    retry_after: None,
                },
            );
        }
        let qrs = fleet(160);
        let mut args = vec!["device", "label", "--asset", "AWB-7"];
        if json_out {
            args.push("--json");
        }
        let out = run(&g, &with_qrs(&args, &qrs));
        assert_eq!(code(&out), 1, "{}", both(&out));
        assert!(
            text(&out.stderr).contains("credentials or permission"),
            "{}",
            both(&out)
        );
        if json_out {
            let report = json(&out);
            assert_eq!(devices_with(&report, None), 120);
            assert_eq!(devices_with(&report, Some("REFUSED")), 20);
            assert_eq!(devices_with(&report, Some("NOT_SENT")), 20);
            assert!(report["error"].as_str().unwrap().contains("credentials"));
        } else {
            let stdout = text(&out.stdout);
            for q in &qrs {
                assert!(stdout.contains(q.as_str()), "{q} not reported");
            }
            assert!(
                stdout.contains("120 of 160 device(s) succeeded"),
                "{stdout}"
            );
        }
        assert!(qrs[..120]
            .iter()
            .all(|q| mock.device(q).unwrap().label.is_some()));
        assert!(qrs[120..]
            .iter()
            .all(|q| mock.device(q).unwrap().label.is_none()));
    }
}

/// Item 4: a 429 is retried after its `Retry-After` by every call (add, locate,
/// history, message), not reported.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_retries_a_429_after_its_retry_after() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    let payload = g.path("manifest.json");
    std::fs::write(
        &payload,
        r#"{"asset_barcode":"A","shipped_date":1763719200,"shipment_id":"S","container_id":"C"}"#,
    )
    .unwrap();
    let from = day.days_ago(2).to_string();
    let cases: [(Endpoint, &str, Vec<&str>); 4] = [
        (
            Endpoint::AddDevice,
            "1",
            vec![
                "device",
                "add",
                "--qr",
                "TTC0DEAD000007",
                "--tape-id",
                "C0DEAD000007",
            ],
        ),
        (Endpoint::Locate, "1", vec!["locate", seed::AWB]),
        (
            Endpoint::History,
            "1",
            vec!["history", "--qr", seed::SENSOR_TAPE, "--from", &from],
        ),
        (
            Endpoint::Message,
            "2",
            vec!["message", "MANIFEST_DATA", payload.to_str().unwrap()],
        ),
    ];
    for (endpoint, after, args) in cases {
        mock.push_operator_fault(
            endpoint,
            Fault::Status {
                status: 429,
                retry_after: Some(after.to_string()),
            },
        );
        let out = g.run(&args);
        assert_eq!(code(&out), 0, "{endpoint:?}: {}", both(&out));
        let at = received_at(&mock, endpoint);
        assert_eq!(statuses(&mock, endpoint)[0], Some(429), "{endpoint:?}");
        let gap = at[1].duration_since(at[0]).unwrap();
        let wanted = Duration::from_secs(after.parse().unwrap());
        assert!(gap >= wanted, "{endpoint:?}: sent again after {gap:?}");
    }
    let adds = mock.operator_received();
    assert!(
        adds.iter()
            .filter(|r| r.endpoint == Endpoint::AddDevice)
            .all(|r| !r.query.as_deref().unwrap_or_default().contains("retry=1")),
        "a 429 applied nothing: no retry=1"
    );
}

/// Times at which no window's length holds more than ten of `at`.
fn max_in_any_span(at: &[SystemTime], span: Duration) -> usize {
    at.iter()
        .map(|t| at.iter().filter(|u| **u >= *t && **u < *t + span).count())
        .max()
        .unwrap_or(0)
}

/// Item 5: ten requests spread over most of a window, then more: a window anchored at
/// the client's first request lets the next ten through at its end, nineteen in one
/// window of a service whose windows sit on a grid. Never more than ten in any span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_span_of_a_window_holds_more_than_ten_requests_whatever_the_alignment() {
    for readings in rate_variants() {
        let (mock, g) = setup_with(readings).await;
        for nth in 1..=10 {
            mock.push_operator_fault_at(
                Endpoint::ShowLabels,
                nth,
                Fault::Delay(Duration::from_millis(300)),
            );
        }
        let csv = format!("qrcode\n{}\n", fleet(400).join("\n"));
        let out = csv_run(&g, "show", &csv);
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let got = statuses(&mock, Endpoint::ShowLabels);
        assert_eq!(got, vec![Some(200); 20], "{readings:?}");
        let at = received_at(&mock, Endpoint::ShowLabels);
        let most = max_in_any_span(&at, Duration::from_secs(WINDOW_SECS));
        assert!(
            most <= 10,
            "{readings:?}: {most} requests in {WINDOW_SECS} s"
        );
    }
}

/// Item 5: the resend after a 401 takes a slot of the window like any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resend_after_a_401_takes_a_slot_of_the_window() {
    for readings in rate_variants() {
        let (mock, g) = setup_with(readings).await;
        mock.push_operator_fault(
            Endpoint::ShowLabels,
            Fault::Status {
                status: 401,
                retry_after: None,
            },
        );
        let out = run(&g, &with_qrs(&["device", "show"], &fleet(220)));
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let got = statuses(&mock, Endpoint::ShowLabels);
        assert!(!got.contains(&Some(429)), "{readings:?}: {got:?}");
        assert_eq!(got.len(), 12, "{readings:?}: {got:?}");
    }
}

/// Item 6: one manifest drives add, label, show and deactivate (a known column a
/// command does not use is ignored), from a file or stdin, with per-row results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_manifest_drives_add_label_show_and_deactivate() {
    for readings in Readings::variants() {
        let (mock, g) = setup_with(readings).await;
        let existing = seed::STATUS_DEVICES[1].0;
        let csv = format!(
            "qrcode,tape_id,asset_barcode,application_id\n\
             TTC0DEAD000011,C0:DE:AD:00:00:11,AWB-11,demo-app\n\
             TTC0DEAD000012,c0-de-ad-00-00-12,AWB-12,demo-app\n\
             {existing},{},AWB-13,demo-app\n",
            &existing[2..]
        );
        let path = g.path("manifest.csv");
        std::fs::write(&path, &csv).unwrap();
        let path = path.to_str().unwrap();
        let add = g.run(&["device", "add", "--csv", path, "--json"]);
        assert_eq!(code(&add), 1, "{readings:?}: {}", both(&add));
        let report = json(&add);
        let rows: Vec<(u64, bool, Option<&str>)> = report["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["line"].as_u64().unwrap(),
                    d["ok"] == true,
                    d["error_code"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [(2, true, None), (3, true, None), (4, false, Some("EXISTS"))],
            "{readings:?}"
        );
        // The two added; label them from the same file (the third is labelled already).
        let new_rows: String = csv.lines().take(3).map(|l| format!("{l}\n")).collect();
        std::fs::write(g.path("new.csv"), &new_rows).unwrap();
        let new = g.path("new.csv");
        let new = new.to_str().unwrap();
        for op in ["label", "show", "deactivate"] {
            let out = g.run(&["device", op, "--csv", new]);
            assert_eq!(code(&out), 0, "{readings:?} {op}: {}", both(&out));
        }
        let out = run_stdin(&g, &["device", "show", "--csv", "-", "--json"], &new_rows);
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        for d in json(&out)["devices"].as_array().unwrap() {
            assert_eq!(d["record"]["status"], "DEACTIVATED", "{readings:?}: {d}");
        }
        let d = mock.device("TTC0DEAD000012").unwrap();
        assert_eq!(d.label.unwrap().asset_barcode, "AWB-12");
        assert_eq!(d.mac, "C0DEAD000012");
    }
}

/// Runs the daemon over `adverts` (captured now) until the service has answered them.
fn hear_now(g: &Gateway, adverts: &[Advertisement]) {
    hear(g, adverts)
}

/// Item 7: `--json` is one JSON document on stdout for every command; a config
/// without `[service]` is a config error (exit 2).
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_one_document_for_every_command_and_a_missing_service_section_exits_2() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    hear_now(
        &g,
        &[unknown_tape(&day, 1, -50), unknown_tape(&day, 2, -64)],
    );
    let out = g.run(&[
        "device",
        "add",
        "--qr",
        "TTC0DEAD000001",
        "--nearest",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    let doc = json(&out);
    assert_eq!(doc["nearest"]["mac"], "C0:DE:AD:00:00:01", "{doc}");
    assert_eq!(
        (doc["ok"].clone(), doc["requeued_dead_letters"].clone()),
        (Value::Bool(true), 1.into())
    );
    let payload = g.path("device.json");
    std::fs::write(&payload, r#"{"device_id":"TT1","sensor_data":{"temperature":4.5,"humidity":60},"timestamp":1763719200}"#).unwrap();
    let out = g.run(&[
        "message",
        "DEVICE_DATA",
        payload.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    assert_eq!(json(&out)["status"], 201);
    drop(mock);
    let bare = Gateway::new("");
    for args in [
        &["device", "show", "--qr", "TT1"][..],
        &["locate", seed::AWB],
        &["message", "DEVICE_DATA", payload.to_str().unwrap()],
    ] {
        let out = bare.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", both(&out));
        assert!(text(&out.stderr).contains("[service]"), "{}", both(&out));
    }
}

/// Item 8: a reading of 0 is marked (the service sends 0 for a value not reported);
/// `assets: []` is asked once more like an AWB 404; error codes come with a hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_of_0_are_marked_an_empty_sensor_answer_is_asked_again_and_errors_hint() {
    let (mock, g) = setup().await;
    mock.push_operator_fault(
        Endpoint::Locate,
        Fault::Status {
            status: 500,
            retry_after: None,
        },
    );
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor"]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(200), Some(200)]);
    let stdout = text(&out.stdout);
    let shock = stdout.lines().find(|l| l.contains("shock")).unwrap();
    assert!(shock.contains("not reported"), "{stdout}");
    let temp = stdout.lines().find(|l| l.contains("ambient_temp")).unwrap();
    assert!(!temp.contains("not reported"), "{stdout}");
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor", "--json"]);
    let sensors = json(&out)["assets"][0]["sensors"].clone();
    assert_eq!(sensors[2]["mark"], "zero_or_unreported", "{sensors}");
    assert_eq!(sensors[0].get("mark"), None, "{sensors}");

    let labelled = seed::STATUS_DEVICES[1].0;
    let out = g.run(&["device", "label", "--qr", labelled, "--asset", "AWB-X"]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stdout).contains("ALREADY_LABELLED") && text(&out.stdout).contains("--override"),
        "{}",
        both(&out)
    );
    let not_activated = seed::STATUS_DEVICES[0].0;
    let out = g.run(&["device", "deactivate", "--qr", not_activated]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stdout).contains("INVALID_TRANSITION")
            && text(&out.stdout).contains("`device show`"),
        "{}",
        both(&out)
    );
}

/// Item 8: after a lost label answer, a device carrying the asset sent but another
/// shipment carries someone else's label: not "confirmed", not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_after_a_lost_label_answer_compares_the_shipment_too() {
    for readings in Readings::variants() {
        let (mock, g) = setup_with(readings).await;
        let qr = "TTC0FFEE000001";
        let mut d =
            Device::new(qr, &qr[2..], DeviceStatus::Activated).labelled("AWB-S", "demo-app");
        d.label.as_mut().unwrap().shipment = Some(serde_json::json!({"awb": "111"}));
        mock.put_device(d);
        // The connection closes without an answer (nothing applied).
        mock.push_operator_fault(Endpoint::Label, Fault::Close);
        let out = g.run(&[
            "device",
            "label",
            "--qr",
            qr,
            "--asset",
            "AWB-S",
            "--shipment",
            r#"{"awb": "222"}"#,
            "--json",
        ]);
        assert_eq!(code(&out), 1, "{readings:?}: {}", both(&out));
        let d = &json(&out)["devices"][0];
        assert_eq!(d["error_code"], "ALREADY_LABELLED", "{readings:?}: {d}");
        assert_eq!(mock.operator_requests(Endpoint::Label), 1, "{readings:?}");
        let label = mock.device(qr).unwrap().label.unwrap();
        assert_eq!(label.shipment, Some(serde_json::json!({"awb": "111"})));
    }
}

/// Item 9: an asset id is percent-encoded byte for byte, or refused (exit 2, nothing
/// sent) when it cannot be meant; never changed by the URL library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locate_id_is_sent_byte_for_byte_or_refused() {
    let (mock, g) = setup().await;
    for id in ["..", ".", "a\nb", "a\tb", ""] {
        let out = g.run(&["locate", id]);
        assert_eq!(code(&out), 2, "{id:?}: {}", both(&out));
    }
    assert!(mock.operator_received().is_empty(), "something was sent");
    let out = g.run(&["locate", "a b/c?d%2E"]);
    assert_eq!(code(&out), 1, "{}", both(&out));
    let got = mock.operator_received();
    assert_eq!(got.len(), 2, "AWB not found, asked twice");
    assert!(
        got[0]
            .path
            .ends_with("/external/locations/a%20b%2Fc%3Fd%252E"),
        "{}",
        got[0].path
    );
}

/// Item 10: an empty, control-character or 10 KB QR code, asset id or tape id is
/// refused before anything is sent, naming the value; a MAC in any common spelling is
/// taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_cannot_be_meant_are_refused_before_anything_is_sent() {
    let (mock, g) = setup().await;
    let long = "Q".repeat(10_000);
    let cases: Vec<Vec<&str>> = vec![
        vec!["device", "label", "--qr", "", "--asset", "A"],
        vec!["device", "label", "--qr", "TT1\nTT2", "--asset", "A"],
        vec!["device", "label", "--qr", &long, "--asset", "A"],
        vec!["device", "label", "--qr", "TT1", "--asset", "A\u{1b}[2J"],
        vec!["device", "show", "--qr", "TT1 "],
        vec!["device", "add", "--qr", "TT1", "--tape-id", "not-a-mac"],
        vec!["device", "add", "--qr", "", "--tape-id", "C0DEAD000001"],
        vec!["history", "--qr", "TT\u{202e}1"],
    ];
    for args in &cases {
        let out = g.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", both(&out));
        let stderr = text(&out.stderr);
        assert!(
            stderr.len() < 2_000,
            "the value is shown bounded: {} bytes",
            stderr.len()
        );
        assert!(
            !stderr.contains('\u{1b}') && !stderr.contains('\u{202e}'),
            "{stderr:?}"
        );
    }
    let out = g.run(&["device", "add", "--qr", "TT1", "--tape-id", "not-a-mac"]);
    assert!(text(&out.stderr).contains("not-a-mac"), "{}", both(&out));
    assert!(mock.operator_received().is_empty(), "something was sent");
    let out = g.run(&[
        "device",
        "add",
        "--qr",
        "TTC0DEAD000003",
        "--tape-id",
        "c0de.ad00.0003",
    ]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    let add = mock.operator_received().pop().unwrap();
    assert!(add.query.unwrap().contains("tape_id=C0DEAD000003"));
}

/// Item 11: a quote never closed (it would swallow the rows after it) and a column
/// named twice refuse the file, naming the line; nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_quote_never_closed_or_a_column_named_twice_refuses_the_file() {
    let (mock, g) = setup().await;
    let qrs = fleet(4);
    let out = csv_run(
        &g,
        "label",
        &format!(
            "qrcode,asset_barcode\n{},AWB-1\n{},\"AWB-2\n{},AWB-3\n{},AWB-4\n",
            qrs[0], qrs[1], qrs[2], qrs[3]
        ),
    );
    assert_eq!(code(&out), 2, "{}", both(&out));
    assert!(
        text(&out.stderr).contains("line 3: a quoted field opened here is never closed"),
        "{}",
        both(&out)
    );
    let out = csv_run(
        &g,
        "show",
        &format!("qrcode,qrcode\n{},{}\n", qrs[0], qrs[1]),
    );
    assert_eq!(code(&out), 2, "{}", both(&out));
    assert!(
        text(&out.stderr).contains("\"qrcode\" is named twice"),
        "{}",
        both(&out)
    );
    assert!(mock.operator_received().is_empty(), "something was sent");
}

/// Item 12: a run longer than the window says its estimate before it starts, and
/// shows no progress line when stderr is not a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_says_its_estimate_up_front() {
    let (_mock, g) = setup().await;
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &fleet(220)),
    );
    assert_eq!(code(&out), 0, "{}", both(&out));
    let stderr = text(&out.stderr);
    // 11 requests, 10 free: one more span of the window (2 s + 1 s of margin).
    assert!(
        stderr.contains("label: 220 device(s) in 11 request(s), at most 10 per 2 s: about 3 s"),
        "{stderr}"
    );
    assert!(!stderr.contains('\r'), "progress on a pipe: {stderr:?}");
}

/// Item 12: on a terminal, a progress line is kept up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_a_long_run_shows_its_progress() {
    let (_mock, g) = setup().await;
    let mut cmd = vec![
        common::BIN.to_string(),
        "device".into(),
        "label".into(),
        "--asset".into(),
        "AWB-1".into(),
    ];
    cmd.extend(with_qrs(&[], &fleet(45)));
    cmd.extend(["--config".into(), g.config_path().display().to_string()]);
    // `script` runs the command on a pseudo-terminal (util-linux, in every Debian).
    let out = std::process::Command::new("script")
        .args(["-qefc", &cmd.join(" "), "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all = text(&out.stdout);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("\r\x1b[Klabel: 20 of 45 device(s), 20 ok, 1 request(s)"),
        "{all:?}"
    );
    assert!(
        all.contains("\r\x1b[Klabel: 45 of 45 device(s), 45 ok, 3 request(s)"),
        "{all:?}"
    );
}

/// Item 12: Ctrl-C in a long run prints (here as JSON) every result so far: the
/// devices labelled, and those not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_prints_every_result_so_far() {
    let mock = start_mock(Readings::default()).await;
    // A long window: the run is surely waiting when the interrupt comes.
    let g = gateway_with(&mock, 30);
    let qrs = fleet(300);
    let args = with_qrs(&["device", "label", "--asset", "AWB-1", "--json"], &qrs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = g
        .command(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (stderr, reader) = collect_stderr(&mut child);
    let waiting = eventually(Duration::from_secs(20), || {
        (mock.operator_requests(Endpoint::Label) == 10
            && stderr
                .lock()
                .unwrap()
                .contains("for the service's rate window"))
        .then_some(())
    });
    assert!(waiting.is_some(), "{}", stderr.lock().unwrap());
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = eventually(Duration::from_secs(10), || child.try_wait().unwrap());
    let status = status.expect("the run ends soon after Ctrl-C");
    reader.join().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(1), "{}", stderr.lock().unwrap());
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["interrupted"], true);
    assert_eq!(devices_with(&report, None), 200);
    assert_eq!(devices_with(&report, Some("NOT_SENT")), 100);
    assert_eq!(mock.operator_requests(Endpoint::Label), 10);
}
