//! Spec section 3: one test per row of the transition table.

use serde_json::{json, Value};

use tapegate_mock::DeviceStatus;

use super::support::*;

#[tokio::test]
async fn label_moves_a_not_activated_device_to_activated_and_links_it_to_the_account() {
    let op = op().await;
    let qr = seeded(DeviceStatus::NotActivated);
    // Not linked yet: the account's edit calls do not find it.
    let before = op
        .relabel(json!([{"qrcode": qr, "asset_barcode": "X"}]))
        .await;
    assert_eq!(
        errors(&before.body),
        [(qr.into(), "DEVICE_NOT_FOUND".into())]
    );
    let got = op.label(json!([label_item(qr, "PALLET-1")]), false).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(
        got.body,
        json!({"errors": [], "successful": 1, "failed": 0})
    );
    assert_eq!(op.status_of(qr), DeviceStatus::Activated);
    assert_eq!(op.asset_of(qr).as_deref(), Some("PALLET-1"));
    let after = op
        .relabel(json!([{"qrcode": qr, "asset_barcode": "PALLET-2"}]))
        .await;
    assert_eq!(after.status, 200, "linked now: {:?}", after.body);
}

/// Deactivate moves activated, force-activated and active-with-no-alerts to
/// deactivated, keeping the label.
#[tokio::test]
async fn deactivate_moves_the_active_statuses_to_deactivated_keeping_the_label() {
    let op = op().await;
    let qrs = [
        seeded(DeviceStatus::Activated),
        seeded(DeviceStatus::ForceActivated),
        seeded(DeviceStatus::ActiveWithNoAlerts),
    ];
    let labels: Vec<_> = qrs.iter().map(|q| op.asset_of(q)).collect();
    let got = op.deactivate(&qrs).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(counts(&got.body), (3, 0));
    for (qr, label) in qrs.iter().zip(labels) {
        assert_eq!(op.status_of(qr), DeviceStatus::Deactivated, "{qr}");
        assert!(label.is_some());
        assert_eq!(op.asset_of(qr), label, "{qr} keeps its label");
    }
}

/// Deactivating a deactivated device is "already in target state" and changes nothing.
#[tokio::test]
async fn deactivating_a_deactivated_device_is_already_in_target_state() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Deactivated);
    let before = op.mock.device(qr);
    let got = op.deactivate(&[qr]).await;
    assert_eq!(got.status, 207);
    assert_eq!(
        errors(&got.body),
        [(qr.into(), "ALREADY_IN_TARGET_STATE".into())]
    );
    assert_eq!(counts(&got.body), (0, 1));
    assert_eq!(op.mock.device(qr), before);
}

#[tokio::test]
async fn deactivating_any_other_status_is_an_invalid_transition_and_leaves_it_unchanged() {
    let op = op().await;
    let others = [
        DeviceStatus::NotActivated,
        DeviceStatus::Rejected,
        DeviceStatus::ReuseOrExpired,
    ];
    let qrs: Vec<&str> = others.iter().map(|s| seeded(*s)).collect();
    let got = op.deactivate(&qrs).await;
    assert_eq!(got.status, 207);
    let expected: Vec<(String, String)> = qrs
        .iter()
        .map(|q| (q.to_string(), "INVALID_TRANSITION".to_string()))
        .collect();
    assert_eq!(errors(&got.body), expected);
    for (qr, status) in qrs.iter().zip(others) {
        assert_eq!(op.status_of(qr), status);
    }
}

#[tokio::test]
async fn labelling_a_device_in_any_labelled_status_without_override_is_already_labelled() {
    let op = op().await;
    let devices: Vec<(&str, DeviceStatus)> = labelled_statuses();
    let items: Vec<Value> = devices.iter().map(|(q, _)| label_item(q, "NEW")).collect();
    // `override` absent and `override: false` are the same.
    for body in [
        json!({"devices": items}),
        json!({"override": false, "devices": items}),
    ] {
        let got = op.post(LABEL, body).await;
        assert_eq!(got.status, 207, "{:?}", got.body);
        assert_eq!(counts(&got.body), (0, devices.len() as u64));
        assert!(errors(&got.body)
            .iter()
            .all(|(_, code)| code == "ALREADY_LABELLED"));
    }
    for (qr, status) in devices {
        assert_eq!(op.status_of(qr), status);
        assert_ne!(op.asset_of(qr).as_deref(), Some("NEW"));
    }
}

#[tokio::test]
async fn labelling_with_override_updates_the_label_and_keeps_every_labelled_status() {
    let op = op().await;
    let devices: Vec<(&str, DeviceStatus)> = labelled_statuses()
        .into_iter()
        .filter(|(_, s)| *s != DeviceStatus::Deactivated)
        .collect();
    let items: Vec<Value> = devices.iter().map(|(q, _)| label_item(q, "NEW")).collect();
    let got = op.label(Value::Array(items), true).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    for (qr, status) in devices {
        assert_eq!(op.status_of(qr), status, "{qr}");
        assert_eq!(op.asset_of(qr).as_deref(), Some("NEW"), "{qr}");
    }
}

/// A deactivated device labelled with override gets the label and stays deactivated.
#[tokio::test]
async fn a_deactivated_device_labelled_with_override_stays_deactivated() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Activated);
    assert_eq!(op.deactivate(&[qr]).await.status, 200);
    let got = op.label(json!([label_item(qr, "RELABELLED")]), true).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(op.status_of(qr), DeviceStatus::Deactivated);
    assert_eq!(op.asset_of(qr).as_deref(), Some("RELABELLED"));
}
