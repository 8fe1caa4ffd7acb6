//! The device commands (label, relabel, deactivate, configure, add, show, `add
//! --nearest`): chunking, per-device results, and a change never repeated blindly
//! after a lost answer.

use std::time::Duration;

use serde_json::Value;

#[cfg(debug_assertions)]
use crate::common::day::Day;
use crate::common::text;
use tapegate_mock::{seed, Device, DeviceStatus, Endpoint, Fault, QrEcho, Readings};

use super::support::*;

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

/// A label timed out after the mock applied it is confirmed by the lookup, in either
/// shape.
///
/// Seen: 20 labels applied, their answer lost, the lookup answering the label's fields
/// flat on each entry: read as "not labelled", sent again, 20 `ALREADY_LABELLED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_timed_out_after_it_was_applied_is_confirmed_by_the_lookup() {
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

#[test]
fn the_demo_activates_the_unknown_tapes_and_delivers_their_dead_letters() {
    // The demo runs on its own clock: outage at 1/3 of the run (8 s long), activation
    // 2 s after it, the rest of the run to deliver what was re-queued.
    let out = std::process::Command::new(crate::common::BIN)
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
