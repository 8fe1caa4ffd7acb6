//! Spec sections 4.7, 7 and 8: the multi-device calls (label, deactivate, configure,
//! relabel, show), their limits, validation and partial failures.

use serde_json::{json, Value};

use tapegate_mock::{seed, Device, DeviceStatus};

use super::support::*;

#[tokio::test]
async fn a_multi_device_call_with_some_failures_is_207_with_one_error_per_failed_device() {
    let op = op().await;
    let fresh = seeded(DeviceStatus::NotActivated);
    let labelled = seeded(DeviceStatus::Activated);
    let got = op
        .label(
            json!([
                label_item(fresh, "A"),
                label_item(UNKNOWN, "B"),
                label_item(labelled, "C")
            ]),
            false,
        )
        .await;
    assert_eq!(got.status, 207);
    assert_eq!(
        errors(&got.body),
        [
            (UNKNOWN.into(), "QRMAC_NOT_FOUND".into()),
            (labelled.into(), "ALREADY_LABELLED".into())
        ]
    );
    assert_eq!(counts(&got.body), (1, 2));
}

#[tokio::test]
async fn a_label_call_where_every_device_is_unknown_is_400_carrying_the_207_body() {
    let op = op().await;
    let got = op
        .label(
            json!([label_item(UNKNOWN, "A"), label_item("NOT-A-TAPE", "B")]),
            false,
        )
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(
        got.body,
        json!({"errors": [
            {"qrcode": UNKNOWN, "error_code": "QRMAC_NOT_FOUND"},
            {"qrcode": "NOT-A-TAPE", "error_code": "QRMAC_NOT_FOUND"}],
            "successful": 0, "failed": 2})
    );
}

#[tokio::test]
async fn every_device_failing_for_another_reason_is_still_207() {
    let op = op().await;
    let got = op
        .label(
            json!([
                label_item(seeded(DeviceStatus::Activated), "A"),
                label_item(UNKNOWN, "B")
            ]),
            false,
        )
        .await;
    assert_eq!(got.status, 207);
    let got = op.deactivate(&[UNKNOWN]).await;
    assert_eq!(got.status, 207, "only label has the 400 rule");
    assert_eq!(
        errors(&got.body),
        [(UNKNOWN.into(), "DEVICE_NOT_FOUND".into())]
    );
}

#[tokio::test]
async fn label_relabel_and_show_take_1_to_20_devices_and_refuse_more_changing_nothing() {
    let op = op().await;
    let fresh = seeded(DeviceStatus::NotActivated);
    let mut items = vec![label_item(fresh, "A")];
    items.extend((1..21).map(|i| label_item(&format!("TTC0FFEE{i:06X}"), "B")));
    assert_eq!(items.len(), 21);
    let got = op.label(Value::Array(items.clone()), false).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["message"], "Validation failed");
    assert_eq!(got.body["code"], 400);
    assert!(!got.body["errors"].as_array().unwrap().is_empty());
    assert_eq!(
        op.status_of(fresh),
        DeviceStatus::NotActivated,
        "nothing applied"
    );
    items.pop();
    assert_eq!(op.label(Value::Array(items), false).await.status, 200);

    assert_eq!(op.label(json!([]), false).await.status, 400);
    assert_eq!(op.relabel(json!([])).await.status, 400);
    let qrs: Vec<String> = (0..21).map(|i| format!("TTC0FFEE{i:06X}")).collect();
    let refs: Vec<&str> = qrs.iter().map(String::as_str).collect();
    assert_eq!(op.show(&refs).await.status, 400);
    assert_eq!(op.show(&refs[..20]).await.status, 200);
    assert_eq!(op.show(&[]).await.status, 400);
}

#[tokio::test]
async fn deactivate_and_configure_take_1_to_100_devices() {
    let op = op().await;
    let qrs: Vec<String> = (0..101).map(|i| format!("TTC0FFEE{i:06X}")).collect();
    for q in &qrs {
        op.mock.put_device(
            Device::new(q, &q[2..], DeviceStatus::Activated).labelled("AWB-FLEET", "demo-app"),
        );
    }
    let refs: Vec<&str> = qrs.iter().map(String::as_str).collect();
    let got = op.deactivate(&refs).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["message"], "Validation failed");
    assert_eq!(
        op.status_of(refs[0]),
        DeviceStatus::Activated,
        "nothing applied"
    );
    let got = op.deactivate(&refs[..100]).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(counts(&got.body), (100, 0));

    let devices = |n: usize| -> Value { qrs[..n].iter().map(|q| json!({"qrcode": q})).collect() };
    let got = op
        .post(CONFIG, json!({"firmware": "2.0", "devices": devices(101)}))
        .await;
    assert_eq!(got.status, 400);
    let got = op
        .post(CONFIG, json!({"firmware": "2.0", "devices": devices(100)}))
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        op.post(STATUS, json!({"action": "DEACTIVATE", "devices": []}))
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn a_qr_code_twice_in_one_request_is_a_validation_failure_and_nothing_changes() {
    let op = op().await;
    let fresh = seeded(DeviceStatus::NotActivated);
    let active = seeded(DeviceStatus::Activated);
    let twice = [
        op.label(json!([label_item(fresh, "A"), label_item(fresh, "B")]), false).await,
        op.relabel(json!([{"qrcode": active, "asset_barcode": "A"}, {"qrcode": active, "asset_barcode": "B"}])).await,
        op.deactivate(&[active, active]).await,
        op.post(CONFIG, json!({"firmware": "2.0", "devices": [{"qrcode": active}, {"qrcode": active}]})).await,
    ];
    for got in twice {
        assert_eq!(got.status, 400, "{:?}", got.body);
        assert_eq!(got.body["message"], "Validation failed");
        let text = got.body["errors"].to_string();
        assert!(text.contains("duplicate qrcode"), "{text}");
    }
    assert_eq!(op.status_of(fresh), DeviceStatus::NotActivated);
    assert_eq!(op.status_of(active), DeviceStatus::Activated);
    assert_eq!(op.asset_of(active).as_deref(), Some("ASSET-1002"));
}

#[tokio::test]
async fn a_missing_or_mistyped_field_is_a_validation_failure_naming_it() {
    let op = op().await;
    let cases = [
        (
            LABEL,
            json!({"devices": [{"qrcode": "TTC0FFEE000001", "asset_barcode": "A"}]}),
            "devices[0].application_id",
        ),
        (
            LABEL,
            json!({"devices": [{"qr_code": "TTC0FFEE000001"}]}),
            "devices[0].qr_code",
        ),
        (
            LABEL,
            json!({"override": "yes", "devices": [label_item("TTC0FFEE000001", "A")]}),
            "override",
        ),
        (
            LABEL,
            json!({"devices": [{"qrcode": "TTC0FFEE000001", "asset_barcode": "A", "application_id": "nope"}]}),
            "devices[0].application_id",
        ),
        (
            STATUS,
            json!({"devices": [{"qrcode": "TTC0FFEE000001"}]}),
            "action",
        ),
        (
            STATUS,
            json!({"action": "REACTIVATE", "devices": [{"qrcode": "TTC0FFEE000001"}]}),
            "action",
        ),
        (
            CONFIG,
            json!({"devices": [{"qrcode": "TTC0FFEE000001"}]}),
            "devices[0]",
        ),
        (
            CONFIG,
            json!({"metadata": "x", "devices": [{"qrcode": "TTC0FFEE000001"}]}),
            "metadata",
        ),
        (LABEL, json!([label_item("TTC0FFEE000001", "A")]), ""),
    ];
    for (path, body, field) in cases {
        let got = op.post(path, body.clone()).await;
        assert_eq!(got.status, 400, "{body}");
        assert_eq!(got.body["message"], "Validation failed", "{body}");
        let fields: Vec<&str> = got.body["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert!(fields.contains(&field), "{body}: {fields:?}");
    }
    assert_eq!(op.status_of("TTC0FFEE000001"), DeviceStatus::NotActivated);
}

#[tokio::test]
async fn relabel_of_a_qr_code_without_a_label_is_device_not_found_and_never_creates_one() {
    let op = op().await;
    let fleet_tape = "TTC0FFEE000001"; // known, ACTIVATED, no label
    let got = op
        .relabel(json!([
            {"qrcode": UNKNOWN, "asset_barcode": "A"},
            {"qrcode": fleet_tape, "asset_barcode": "A"},
        ]))
        .await;
    assert_eq!(got.status, 207);
    assert_eq!(
        errors(&got.body),
        [
            (UNKNOWN.into(), "DEVICE_NOT_FOUND".into()),
            (fleet_tape.into(), "DEVICE_NOT_FOUND".into())
        ]
    );
    assert!(op.mock.device(UNKNOWN).is_none());
    assert_eq!(op.asset_of(fleet_tape), None);
}

#[tokio::test]
async fn relabel_edits_the_asset_barcode_and_shipment_and_keeps_the_status() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Rejected);
    let shipment = json!({"awb": "020-12345675", "origin": "DXB"});
    let got = op
        .relabel(json!([{"qrcode": qr, "asset_barcode": "EDITED", "shipment": shipment}]))
        .await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    let d = op.mock.device(qr).unwrap();
    assert_eq!(d.status, DeviceStatus::Rejected);
    let label = d.label.unwrap();
    assert_eq!(label.asset_barcode, "EDITED");
    assert_eq!(label.shipment, Some(shipment));
}

#[tokio::test]
async fn show_answers_one_entry_per_requested_qr_code_in_request_order_with_its_status() {
    let op = op().await;
    let mut qrs: Vec<&str> = seed::STATUS_DEVICES.iter().map(|(q, _)| *q).collect();
    qrs.insert(2, UNKNOWN);
    qrs.push(seed::STATUS_DEVICES[1].0); // the lookup allows a QR code twice
    let got = op.show(&qrs).await;
    assert_eq!(got.status, 207);
    let entries = got.body["devices"].as_array().unwrap();
    let order: Vec<&str> = entries
        .iter()
        .map(|e| e["qrcode"].as_str().unwrap())
        .collect();
    assert_eq!(order, qrs);
    assert_eq!(entries[2]["error_code"], "DEVICE_NOT_FOUND");
    let statuses: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["status"].as_str())
        .collect();
    for s in DeviceStatus::ALL {
        assert!(statuses.contains(&s.as_str()), "{s:?} in {statuses:?}");
    }
    assert_eq!(
        entries[0]["label"],
        Value::Null,
        "NOT_ACTIVATED has no label"
    );
    assert_eq!(entries[1]["label"]["asset_barcode"], "ASSET-1002");
    assert_eq!(
        errors(&got.body),
        [(UNKNOWN.into(), "DEVICE_NOT_FOUND".into())]
    );
    assert_eq!(counts(&got.body), (8, 1));
}

#[tokio::test]
async fn configure_applies_one_shared_change_and_each_devices_own_fields() {
    let op = op().await;
    let a = seeded(DeviceStatus::Activated);
    let b = seeded(DeviceStatus::ForceActivated);
    let got = op
        .post(
            CONFIG,
            json!({"firmware": "1.5.0", "metadata": {"zone": "cold"}, "devices": [
                {"qrcode": a, "tape_displayname": "Pallet A"},
                {"qrcode": b, "asset_barcode": "B-2"},
                {"qrcode": seeded(DeviceStatus::NotActivated)},
            ]}),
        )
        .await;
    assert_eq!(got.status, 207, "{:?}", got.body);
    assert_eq!(
        errors(&got.body),
        [(
            seeded(DeviceStatus::NotActivated).into(),
            "DEVICE_NOT_FOUND".into()
        )]
    );
    let (da, db) = (op.mock.device(a).unwrap(), op.mock.device(b).unwrap());
    assert_eq!(
        (da.firmware.as_str(), db.firmware.as_str()),
        ("1.5.0", "1.5.0")
    );
    assert_eq!(da.metadata, json!({"zone": "cold"}));
    assert_eq!(da.tape_displayname.as_deref(), Some("Pallet A"));
    assert_eq!(db.label.unwrap().asset_barcode, "B-2");
}
