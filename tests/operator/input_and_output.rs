//! What goes in and what comes out: CSV files and manifests checked before anything
//! is sent, refusals reported without secrets, JSON output, estimates, progress and an
//! interrupted run's results.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

#[cfg(debug_assertions)]
use crate::common::day::Day;
use crate::common::{collect_stderr, eventually, text, Gateway};
use tapegate::record::Advertisement;
use tapegate_mock::{seed, Endpoint, Readings};

use super::support::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_is_reported_without_the_password() {
    let (mock, g) = setup().await;
    let config = std::fs::read_to_string(g.config_path()).unwrap();
    let password = crate::common::environment_settings(&mock, "ppe")
        .unwrap()
        .password;
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
        crate::common::BIN.to_string(),
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
