//! The operator commands through the real binary against the mock service on loopback
//! (issue 11's "How it is checked"): the shared rate window, chunking, per-device
//! results, label never repeated blindly, AWB retry, history splitting, CSV errors and
//! `device add --nearest`. The mock runs in-process; each command is a child process
//! with its own state database in a temp dir.

mod common;

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use tapegate::mock::{self, seed, DeviceStatus, Endpoint, Fault, MockConfig, MockHandle};
use tapegate::record::{Advertisement, Mac};

use common::{tape_advert, text, write_records, Gateway};

/// The rate window the tests give the mock and the client (the real one is 60 s).
const WINDOW_SECS: u64 = 2;

async fn start_mock() -> MockHandle {
    mock::start(MockConfig::demo()).await.expect("mock starts")
}

/// A gateway speaking to the mock's "ppe" environment, every operator key set.
fn gateway(mock: &MockHandle, extra: &str) -> Gateway {
    let e = mock.environment_settings("ppe").expect("ppe");
    let g = Gateway::new("");
    g.write_config(&format!(
        r#"
[service]
environment = "ppe"
request_timeout_secs = 1
rate_window_secs = {WINDOW_SECS}

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

{extra}
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
    mock.set_rate_window(10, Duration::from_secs(WINDOW_SECS));
    g
}

/// The mock and a gateway speaking to it.
async fn setup() -> (MockHandle, Gateway) {
    let mock = start_mock().await;
    let g = gateway(&mock, "");
    (mock, g)
}

/// QR codes of fleet tapes the mock knows (ACTIVATED, no label).
fn fleet(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("TTC0FFEE{i:06X}")).collect()
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

fn statuses(mock: &MockHandle, endpoint: Endpoint) -> Vec<Option<u16>> {
    mock.operator_received()
        .iter()
        .filter(|r| r.endpoint == endpoint)
        .map(|r| r.status)
        .collect()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eleventh_label_request_waits_across_two_cli_runs() {
    let (mock, g) = setup().await;
    let qrs = fleet(220);
    let first = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[..200]),
    );
    assert_eq!(code(&first), 0, "{}", text(&first.stderr));
    assert!(!text(&first.stderr).contains("rate window"));
    let second = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[200..]),
    );
    assert_eq!(code(&second), 0, "{}", text(&second.stderr));
    assert!(
        text(&second.stderr).contains("s for the service's rate window"),
        "{}",
        text(&second.stderr)
    );
    assert_eq!(statuses(&mock, Endpoint::Label), vec![Some(200); 11]);
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
    let out = run(&g, &with_qrs(&["device", "deactivate"], &fleet(2)));
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
    let mut qrs = fleet(44);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_timed_out_after_the_mock_applied_it_is_not_repeated() {
    let (mock, g) = setup().await;
    // The mock applies the label, then holds the answer past the client's 1 s timeout.
    mock.push_operator_fault(Endpoint::Label, Fault::Delay(Duration::from_secs(3)));
    let qrs = fleet(3);
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-9", "--json"], &qrs),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        mock.operator_requests(Endpoint::Label),
        1,
        "the label was sent again"
    );
    assert!(
        mock.operator_requests(Endpoint::ShowLabels) >= 1,
        "no lookup"
    );
    let report = json(&out);
    for d in report["devices"].as_array().unwrap() {
        assert_eq!(d["ok"], true, "{d}");
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
    for (kind, units) in tapegate::api::SENSORS {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(kind) && l.trim_end().ends_with(units)),
            "{kind} {units}: {stdout}"
        );
    }
    let none = g.run(&["locate", seed::UNPLACED_ASSET, "--sensor"]);
    assert_eq!(code(&none), 1);
    assert!(text(&none.stderr).contains("no current reading"));
    assert_eq!(
        mock.operator_requests(Endpoint::Locate),
        2,
        "sensor mode is not retried"
    );
}

fn days_ago(days: i64) -> String {
    let t = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24 * days);
    t.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_14_months_is_refused_before_anything_is_sent() {
    let (mock, g) = setup().await;
    let out = g.run(&[
        "history",
        "--qr",
        seed::SENSOR_TAPE,
        "--from",
        &days_ago(426),
    ]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("one year"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mock.operator_requests(Endpoint::History), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_3_months_is_3_or_more_requests_merged_in_order() {
    let (mock, g) = setup().await;
    let from = days_ago(100);
    let out = g.run(&[
        "history",
        "--qr",
        seed::SENSOR_TAPE,
        "--from",
        &from,
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let requests = mock.operator_requests(Endpoint::History);
    assert!(requests >= 4, "{requests} requests");
    assert!(statuses(&mock, Endpoint::History)
        .iter()
        .all(|s| *s == Some(200)));
    let events = json(&out);
    let times: Vec<jiff::Timestamp> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
        .collect();
    // The tape has an event every 30 min: no gap wider means no window's 1,000 cap
    // cut any, and none narrower or equal to zero means no duplicate and time order.
    assert!(times.len() >= 100 * 48 - 5, "{} events", times.len());
    for w in times.windows(2) {
        let gap = w[1].as_second() - w[0].as_second();
        assert!(gap > 0 && gap <= 1800, "{} then {}", w[0], w[1]);
    }
    assert!(times[0] >= from.parse().unwrap());
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

fn unknown_tape(i: u8, rssi: i16) -> Advertisement {
    let mac = Mac::new([0xC0, 0xDE, 0xAD, 0, 0, i]);
    let mut a = tape_advert(mac, tapegate::clock::now_ms(), 1);
    a.rssi = Some(rssi);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_with_two_tapes_4_db_apart_refuses_and_lists_both() {
    let (mock, g) = setup().await;
    hear(&g, &[unknown_tape(1, -60), unknown_tape(2, -64)]);
    let out = g.run(&["device", "add", "--qr", "TTC0DEAD000001", "--nearest"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("C0:DE:AD:00:00:01") && stdout.contains("C0:DE:AD:00:00:02"),
        "{stdout}"
    );
    assert_eq!(mock.operator_requests(Endpoint::AddDevice), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_activates_the_tape_10_db_louder_and_requeues_its_dead_letters() {
    let (mock, g) = setup().await;
    hear(&g, &[unknown_tape(1, -50), unknown_tape(2, -64)]);
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
    let qrs = fleet(3);
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
    let password = mock.environment_settings("ppe").unwrap().password;
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
