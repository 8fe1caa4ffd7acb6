//! The mock service's operator endpoints over raw HTTP (reqwest on loopback): one test
//! per rule of spec sections 3, 4, 7 and 8, and one per row of the transition table of
//! section 3. The mock is a second implementation of the spec; these tests hold it to it,
//! so that it refuses what the real service would.

#[cfg(debug_assertions)]
mod common;

use std::time::Duration;

use tokio::time::Instant;

#[cfg(debug_assertions)]
use common::day::Day;
use reqwest::Method;
use serde_json::{json, Value};
use tapegate::record::hex_upper;
use tapegate::source::sim::tape::TapeReading;
use tapegate_mock::{
    self as mock, seed, Device, DeviceStatus, Endpoint, Fault, HistoryKeeps, HistoryOrder,
    LookupShape, MockConfig, MockHandle, QrEcho, Readings, HISTORY_OPERATION_ID, LOCATION_UUID,
    VENDOR_ID,
};

const LABEL: &str = "external/v1/devices/label";
const STATUS: &str = "external/v1/devices/status";
const CONFIG: &str = "external/v1/devices/config";
const PARCEL: &str = "devices/v1/parcel";
const MESSAGES: &str = "external/messages";
const ACCOUNT: [(&str, &str); 2] = [
    ("customer_id", "demo-customer"),
    ("authorized_groups", "demo-group"),
];

/// A QR code the service does not know.
const UNKNOWN: &str = "TTC0DEAD000001";

/// The mock, a token of its environment "ppe", and a client.
struct Op {
    mock: MockHandle,
    http: reqwest::Client,
    token: String,
}

/// An answer: status and JSON body (`Null` when not JSON).
#[derive(Debug)]
struct Got {
    status: u16,
    body: Value,
    headers: reqwest::header::HeaderMap,
}

async fn op() -> Op {
    let mock = mock::start(MockConfig::demo()).await.expect("mock starts");
    with_token_of(mock, "ppe").await
}

/// An `Op` on a mock whose clock reads `day`, playing `readings`.
#[cfg(debug_assertions)]
async fn op_on(day: &Day, readings: Readings) -> Op {
    let mock = mock::start(MockConfig {
        readings,
        clock: day.mock_clock(),
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts");
    with_token_of(mock, "ppe").await
}

/// An `Op` on `mock` holding a token granted by environment `env`.
async fn with_token_of(mock: MockHandle, env: &str) -> Op {
    let http = reqwest::Client::new();
    let form = [
        ("grant_type", "password"),
        ("username", "demo"),
        ("password", "demo-password"),
        ("client_id", "tapegate-demo"),
        ("audience", "https://api.example/decode"),
    ];
    let v: Value = http
        .post(mock.auth_url(env))
        .form(&form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = v["access_token"].as_str().unwrap().to_string();
    Op { mock, http, token }
}

impl Op {
    async fn send(
        &self,
        method: Method,
        url: reqwest::Url,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Got {
        let mut req = self.http.request(method, url).bearer_auth(&self.token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.json().await.unwrap_or(Value::Null);
        Got {
            status,
            body,
            headers,
        }
    }

    fn url(&self, path: &str) -> reqwest::Url {
        self.mock.base_url("ppe").join(path).unwrap()
    }

    fn history_url(&self) -> reqwest::Url {
        self.mock
            .historical_base_url("ppe")
            .join(&format!(
                "agent-service/v1/agent/exec/{HISTORY_OPERATION_ID}"
            ))
            .unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> Got {
        self.send(Method::POST, self.url(path), &[], Some(&body))
            .await
    }

    async fn label(&self, devices: Value, override_: bool) -> Got {
        self.post(LABEL, json!({"override": override_, "devices": devices}))
            .await
    }

    async fn relabel(&self, devices: Value) -> Got {
        self.send(
            Method::PUT,
            self.url(LABEL),
            &[],
            Some(&json!({"devices": devices})),
        )
        .await
    }

    async fn show(&self, qrs: &[&str]) -> Got {
        let mut url = self.url(LABEL);
        for qr in qrs {
            url.query_pairs_mut().append_pair("qrcode", qr);
        }
        self.send(Method::GET, url, &[], None).await
    }

    async fn deactivate(&self, qrs: &[&str]) -> Got {
        let devices: Vec<Value> = qrs.iter().map(|q| json!({"qrcode": q})).collect();
        self.post(STATUS, json!({"action": "DEACTIVATE", "devices": devices}))
            .await
    }

    async fn add(&self, params: &[(&str, &str)], headers: &[(&str, &str)]) -> Got {
        let mut url = self.url(PARCEL);
        url.query_pairs_mut().extend_pairs(params);
        self.send(Method::POST, url, headers, None).await
    }

    async fn locate(&self, asset: &str, sensor: bool, headers: &[(&str, &str)]) -> Got {
        let mut url = self.url("external/locations/");
        url.path_segments_mut().unwrap().pop().push(asset);
        if sensor {
            url.query_pairs_mut().append_pair("event", "sensor");
        }
        self.send(Method::GET, url, headers, None).await
    }

    async fn history(&self, filters: Value) -> Got {
        let body = json!({"context": {
            "customer_id": "demo-customer",
            "authorized_groups": "demo-group",
            "filters": filters,
        }});
        self.send(Method::POST, self.history_url(), &ACCOUNT, Some(&body))
            .await
    }

    async fn message(&self, header_type: &str, body: Value) -> Got {
        let headers = [ACCOUNT[0], ACCOUNT[1], ("message_type", header_type)];
        self.send(Method::POST, self.url(MESSAGES), &headers, Some(&body))
            .await
    }

    fn status_of(&self, qr: &str) -> DeviceStatus {
        self.mock.device(qr).expect("device exists").status
    }

    fn asset_of(&self, qr: &str) -> Option<String> {
        self.mock
            .device(qr)
            .and_then(|d| d.label)
            .map(|l| l.asset_barcode)
    }
}

fn label_item(qr: &str, asset: &str) -> Value {
    json!({"qrcode": qr, "asset_barcode": asset, "application_id": "demo-app"})
}

/// The per-device error codes of a 2.5 body, as (qrcode, error_code).
fn errors(body: &Value) -> Vec<(String, String)> {
    body["errors"]
        .as_array()
        .expect("errors is an array")
        .iter()
        .map(|e| {
            (
                e["qrcode"].as_str().unwrap().to_string(),
                e["error_code"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn counts(body: &Value) -> (u64, u64) {
    (
        body["successful"].as_u64().unwrap(),
        body["failed"].as_u64().unwrap(),
    )
}

/// Seeded QR of a status.
fn seeded(status: DeviceStatus) -> &'static str {
    seed::STATUS_DEVICES
        .iter()
        .find(|(_, s)| *s == status)
        .map(|(q, _)| *q)
        .unwrap()
}

/// Seeded labelled statuses (all but NOT_ACTIVATED).
fn labelled_statuses() -> Vec<(&'static str, DeviceStatus)> {
    seed::STATUS_DEVICES
        .iter()
        .copied()
        .filter(|(_, s)| *s != DeviceStatus::NotActivated)
        .collect()
}

// ---- Section 3: one test per row of the transition table ----

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

#[tokio::test]
async fn deactivate_moves_activated_force_activated_and_active_with_no_alerts_to_deactivated_keeping_the_label(
) {
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

#[tokio::test]
async fn deactivating_a_deactivated_device_is_already_in_target_state_and_changes_nothing() {
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

#[tokio::test]
async fn a_deactivated_device_labelled_with_override_gets_the_label_and_stays_deactivated() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Activated);
    assert_eq!(op.deactivate(&[qr]).await.status, 200);
    let got = op.label(json!([label_item(qr, "RELABELLED")]), true).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(op.status_of(qr), DeviceStatus::Deactivated);
    assert_eq!(op.asset_of(qr).as_deref(), Some("RELABELLED"));
}

// ---- Sections 4.7, 7, 8: the multi-device calls ----

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

// ---- Section 8: the shared rate window ----

#[tokio::test]
async fn the_eleventh_request_in_a_window_across_the_five_calls_is_429_with_only_a_message() {
    let op = op().await;
    let active = seeded(DeviceStatus::Activated);
    for i in 0..2 {
        assert_ne!(
            op.label(json!([label_item(UNKNOWN, "A")]), false)
                .await
                .status,
            429,
            "{i}"
        );
        assert_ne!(
            op.relabel(json!([{"qrcode": active, "asset_barcode": "A"}]))
                .await
                .status,
            429
        );
        assert_ne!(op.show(&[active]).await.status, 429);
        assert_ne!(op.deactivate(&[UNKNOWN]).await.status, 429);
        assert_ne!(
            op.post(
                CONFIG,
                json!({"firmware": "2", "devices": [{"qrcode": active}]})
            )
            .await
            .status,
            429
        );
    }
    let got = op.show(&[active]).await;
    assert_eq!(got.status, 429);
    assert_eq!(got.body, json!({"message": "Too many requests"}));
    assert!(got.headers.get("retry-after").is_none());
    assert_eq!(op.mock.operator_requests(Endpoint::ShowLabels), 3);
}

#[tokio::test]
async fn requests_refused_with_400_count_in_the_window() {
    let op = op().await;
    for _ in 0..10 {
        assert_eq!(op.label(json!([]), false).await.status, 400);
    }
    assert_eq!(op.show(&[UNKNOWN]).await.status, 429);
}

#[tokio::test]
async fn a_new_window_admits_again_once_the_fixed_window_has_passed() {
    let op = op().await;
    let window = Duration::from_millis(600);
    op.mock.set_rate_window(2, window);
    let first = Instant::now();
    assert_eq!(op.show(&[UNKNOWN]).await.status, 207);
    assert_eq!(op.show(&[UNKNOWN]).await.status, 207);
    assert_eq!(op.show(&[UNKNOWN]).await.status, 429);
    // Wait on the condition: the first request the service admits again.
    let admitted = loop {
        let got = op.show(&[UNKNOWN]).await;
        if got.status != 429 {
            break Instant::now();
        }
        assert!(
            first.elapsed() < Duration::from_secs(10),
            "never admitted again"
        );
        // The poll interval, not a wait for the result.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        admitted - first >= window,
        "admitted after {:?}",
        admitted - first
    );
}

#[tokio::test]
async fn locations_messages_history_and_add_device_are_outside_the_window() {
    let op = op().await;
    op.mock.set_rate_window(1, Duration::from_secs(600));
    assert_eq!(op.show(&[UNKNOWN]).await.status, 207);
    assert_eq!(op.show(&[UNKNOWN]).await.status, 429);
    for i in 0..3 {
        assert_eq!(op.locate(seed::AWB, false, &ACCOUNT).await.status, 200);
        assert_eq!(
            op.history(json!({"trk_asset_id": seed::SENSOR_TAPE}))
                .await
                .status,
            200
        );
        let msg = json!({"message_type": "MANIFEST_DATA", "data": manifest()});
        assert_eq!(op.message("MANIFEST_DATA", msg).await.status, 201);
        let qr = format!("TTC0DEAD00000{i}");
        let mac = &qr[2..];
        assert_eq!(op.add(&parcel(&qr, mac), &ACCOUNT).await.status, 201);
    }
}

#[tokio::test]
async fn a_bad_token_is_401_unauthorized_access_and_does_not_count_in_the_window() {
    let op = op().await;
    op.mock.set_rate_window(1, Duration::from_secs(600));
    for _ in 0..3 {
        let resp = op
            .http
            .get(op.url(LABEL))
            .query(&[("qrcode", UNKNOWN)])
            .bearer_auth("not-a-token")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body, json!({"message": "Unauthorized access", "code": 401}));
    }
    assert_eq!(op.show(&[UNKNOWN]).await.status, 207);
}

#[tokio::test]
async fn the_token_calls_take_customer_id_and_the_singular_authorized_group_both_or_neither() {
    let op = op().await;
    let url = || {
        let mut u = op.url(LABEL);
        u.query_pairs_mut().append_pair("qrcode", UNKNOWN);
        u
    };
    let both = [
        ("customer_id", "demo-customer"),
        ("authorized_group", "demo-group"),
    ];
    assert_eq!(op.send(Method::GET, url(), &both, None).await.status, 207);
    let other = [
        ("customer_id", "someone-else"),
        ("authorized_group", "demo-group"),
    ];
    assert_eq!(op.send(Method::GET, url(), &other, None).await.status, 401);
    let one = [("customer_id", "demo-customer")];
    assert_eq!(op.send(Method::GET, url(), &one, None).await.status, 400);
    // The plural header is not the one these calls read: customer_id alone is refused.
    let plural = [
        ("customer_id", "demo-customer"),
        ("authorized_groups", "demo-group"),
    ];
    assert_eq!(op.send(Method::GET, url(), &plural, None).await.status, 400);
}

// ---- Section 4.6: add device ----

fn parcel<'a>(qr: &'a str, mac: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("qrcode", qr),
        ("tape_id", mac),
        ("appId", "demo-app"),
        ("dstatus", "1"),
        ("tt", "Green"),
        ("tp", "Parcel"),
    ]
}

fn packet() -> String {
    let p = TapeReading {
        counter: 7,
        temp_centi: 2150,
        battery: 87,
        shock_count: 2,
        serial: 0x00AB_CDEF,
    };
    hex_upper(&p.manufacturer_data())
}

#[tokio::test]
async fn add_device_creates_an_activated_tape_whose_packets_the_service_then_decodes() {
    let op = op().await;
    let decode = || async {
        let body = json!([{"mac_id": "C0DEAD000001", "ble_packet": packet(),
                           "product_id": "tape", "scan_time": "1763719200"}]);
        let got = op
            .send(
                Method::POST,
                op.url("external/v1/devices/decode"),
                &ACCOUNT,
                Some(&body),
            )
            .await;
        got.body[0].clone()
    };
    assert!(decode().await.get("error").is_some(), "unknown before");
    let mut params = parcel(UNKNOWN, "C0:DE:AD:00:00:01");
    params.push(("abc", "020-55555555"));
    let got = op
        .add(
            &params,
            &[ACCOUNT[0], ACCOUNT[1], ("facility_id", "DOCK-7")],
        )
        .await;
    assert_eq!(got.status, 201, "{:?}", got.body);
    assert_eq!(got.body, json!({"code": 201, "message": "Device created"}));
    let d = op.mock.device(UNKNOWN).unwrap();
    assert_eq!(
        (d.status, d.label.is_none()),
        (DeviceStatus::Activated, true)
    );
    assert_eq!(d.customer_asset_id.as_deref(), Some("020-55555555"));
    let item = decode().await;
    assert!(item.get("error").is_none(), "{item}");
    assert_eq!(item["qr_code"], UNKNOWN);
}

#[tokio::test]
async fn adding_an_existing_device_is_409_unless_override_is_1_which_recreates_it() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Activated);
    let got = op.add(&parcel(qr, &qr[2..]), &ACCOUNT).await;
    assert_eq!(got.status, 409);
    assert_eq!(
        got.body,
        json!({"code": 409, "message": "Device already exists"})
    );
    // A fleet tape the service already decodes exists too, and so does its MAC under
    // another QR code.
    assert_eq!(
        op.add(&parcel("TTC0FFEE000001", "C0FFEE000001"), &ACCOUNT)
            .await
            .status,
        409
    );
    assert_eq!(
        op.add(&parcel("OTHER-QR", "C0FFEE000001"), &ACCOUNT)
            .await
            .status,
        409
    );
    let mut params = parcel(qr, &qr[2..]);
    params.push(("override", "0"));
    assert_eq!(op.add(&params, &ACCOUNT).await.status, 409);
    params.pop();
    params.push(("override", "1"));
    let got = op.add(&params, &ACCOUNT).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(
        got.body,
        json!({"code": 200, "message": "Device recreated"})
    );
    assert_eq!(
        op.asset_of(qr),
        None,
        "the old record and its label are gone"
    );
}

#[tokio::test]
async fn add_device_names_a_missing_or_invalid_parameter() {
    let op = op().await;
    let full = parcel(UNKNOWN, "C0DEAD000001");
    for (i, (name, _)) in full.iter().enumerate() {
        let mut p = full.clone();
        p.remove(i);
        let got = op.add(&p, &ACCOUNT).await;
        assert_eq!(got.status, 400, "without {name}");
        assert_eq!(
            got.body["message"],
            format!("Missing required parameter: {name}")
        );
    }
    for (name, bad) in [
        ("dstatus", "2"),
        ("tp", "Pallet"),
        ("appId", "nope"),
        ("tape_id", "not-a-mac"),
        ("override", "yes"),
    ] {
        let mut p: Vec<(&str, &str)> = full.iter().copied().filter(|(k, _)| *k != name).collect();
        p.push((name, bad));
        let got = op.add(&p, &ACCOUNT).await;
        assert_eq!(got.status, 400, "{name}={bad}");
        assert!(
            got.body["message"].as_str().unwrap().contains(name),
            "{:?}",
            got.body
        );
    }
    let mut p = full.clone();
    p.push(("app_id", "demo-app"));
    assert_eq!(
        op.add(&p, &ACCOUNT).await.body["message"],
        "Unknown parameter: app_id"
    );
    assert!(op.mock.device(UNKNOWN).is_none(), "nothing was created");
}

#[tokio::test]
async fn add_device_takes_no_body() {
    let op = op().await;
    let mut url = op.url(PARCEL);
    url.query_pairs_mut()
        .extend_pairs(parcel(UNKNOWN, "C0DEAD000001"));
    let got = op
        .send(
            Method::POST,
            url,
            &ACCOUNT,
            Some(&json!({"qrcode": UNKNOWN})),
        )
        .await;
    assert_eq!(got.status, 400);
}

#[tokio::test]
async fn add_device_requires_customer_id_and_authorized_groups_and_does_not_read_the_singular() {
    let op = op().await;
    let p = parcel(UNKNOWN, "C0DEAD000001");
    for headers in [
        vec![],
        vec![ACCOUNT[0]],
        vec![ACCOUNT[0], ("authorized_group", "demo-group")],
        vec![ACCOUNT[0], ("authorized_groups", "")],
    ] {
        let got = op.add(&p, &headers).await;
        assert_eq!(got.status, 400, "{headers:?}");
        assert_eq!(
            got.body,
            json!({"message": "Missing required headers: customer_id or authorized_groups", "code": 400})
        );
    }
    assert!(op.mock.device(UNKNOWN).is_none());
    let other = [("customer_id", "someone-else"), ACCOUNT[1]];
    let got = op.add(&p, &other).await;
    assert_eq!(got.status, 404, "another account: {:?}", got.body);
    assert!(op.mock.device(UNKNOWN).is_none());
}

#[tokio::test]
async fn add_device_with_dstatus_0_registers_a_not_activated_tape_that_label_then_activates() {
    let op = op().await;
    let mut p = parcel(UNKNOWN, "C0DEAD000001");
    p[3] = ("dstatus", "0");
    assert_eq!(op.add(&p, &ACCOUNT).await.status, 201);
    assert_eq!(op.status_of(UNKNOWN), DeviceStatus::NotActivated);
    assert_eq!(
        op.label(json!([label_item(UNKNOWN, "A")]), false)
            .await
            .status,
        200
    );
    assert_eq!(op.status_of(UNKNOWN), DeviceStatus::Activated);
}

#[tokio::test]
async fn add_device_echoes_the_correlation_id_or_generates_one() {
    let op = op().await;
    let p = parcel(UNKNOWN, "C0DEAD000001");
    let got = op
        .add(
            &p,
            &[ACCOUNT[0], ACCOUNT[1], ("X-Correlation-Id", "dock7-42")],
        )
        .await;
    assert_eq!(got.headers["x-correlation-id"], "dock7-42");
    let got = op
        .add(&parcel("TTC0DEAD000002", "C0DEAD000002"), &ACCOUNT)
        .await;
    assert!(!got.headers["x-correlation-id"].is_empty());
    let seen = op.mock.operator_received();
    assert_eq!(seen[0].header("x-correlation-id"), Some("dock7-42"));
}

// ---- Section 4.1: latest location ----

#[tokio::test]
async fn awb_mode_returns_each_active_tag_whose_latest_counting_event_is_placed() {
    let op = op().await;
    let got = op.locate(seed::AWB, false, &ACCOUNT).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["version"], "1.0.0");
    assert_eq!(got.body["uuid"], LOCATION_UUID);
    assert_eq!(got.body["vendor_id"], VENDOR_ID);
    let assets = got.body["assets"].as_array().unwrap();
    let tags: Vec<&str> = assets
        .iter()
        .map(|a| a["vendor_asset_id"].as_str().unwrap())
        .collect();
    // Tag 3's latest event has lat 0 (no position) and tag 4 has only an end of
    // journey: neither falls back to an older event.
    assert_eq!(tags, [seed::AWB_TAGS[0], seed::AWB_TAGS[1]]);
    let (a, b) = (&assets[0], &assets[1]);
    assert_eq!(a["event_type"], "aircargo-RCS");
    assert_eq!(a["trk_asset_id"], "AWB-TAG-1");
    assert_eq!(a["time_zone"], "Asia/Dubai");
    // The activation that is tag 2's latest event does not count: its location before.
    assert_eq!(b["event_type"], "location");
    assert!(
        b.get("trk_asset_id").is_none(),
        "no asset barcode, no field"
    );
    assert_eq!(b["time_zone"], "Etc/UTC");
    for asset in assets {
        assert!(asset.get("sensors").is_none());
        let ts = asset["timestamp"].as_str().unwrap();
        assert_eq!(ts.len(), 19, "{ts}");
        assert!(!ts.ends_with('Z') && !ts.contains('+'), "{ts}");
        assert!(ts.parse::<jiff::civil::DateTime>().is_ok(), "{ts}");
        assert!(asset["lat"].as_f64().unwrap() != 0.0);
    }
}

#[tokio::test]
async fn an_awb_without_a_returnable_tag_is_404_awb_not_found() {
    let op = op().await;
    for awb in [seed::AWB_UNPLACED, "020-00000000"] {
        let got = op.locate(awb, false, &ACCOUNT).await;
        assert_eq!(got.status, 404, "{awb}");
        assert_eq!(got.body, json!({"message": "AWB not found", "code": 404}));
    }
    // Another account holds none of this one's AWBs.
    let other = [("customer_id", "someone-else"), ACCOUNT[1]];
    assert_eq!(op.locate(seed::AWB, false, &other).await.status, 404);
}

#[tokio::test]
async fn an_awb_match_is_exact_and_case_sensitive() {
    let op = op().await;
    let lower = seed::AWB.to_lowercase() + " ";
    assert_eq!(op.locate(&lower, false, &ACCOUNT).await.status, 404);
}

#[tokio::test]
async fn sensor_mode_returns_the_six_readings_of_the_latest_counting_event_in_order() {
    let op = op().await;
    let got = op.locate(seed::SENSOR_ASSET, true, &ACCOUNT).await;
    assert_eq!(got.status, 200);
    let assets = got.body["assets"].as_array().unwrap();
    assert_eq!(assets.len(), 1);
    let a = &assets[0];
    assert_eq!(a["event_type"], "environment");
    assert_eq!(a["trk_asset_id"], seed::SENSOR_ASSET);
    assert_eq!(a["vendor_asset_id"], seed::SENSOR_TAPE);
    // The end of journey after it does not count: the Singapore reading is the latest.
    assert_eq!(a["location"], "SIN Changi Cargo");
    let sensors = a["sensors"].as_array().unwrap();
    let got: Vec<(String, String, f64)> = sensors
        .iter()
        .map(|s| {
            (
                s["type"].as_str().unwrap().to_string(),
                s["units"].as_str().unwrap().to_string(),
                s["data"].as_f64().expect("data is a number, never null"),
            )
        })
        .collect();
    let expected = [
        ("ambient_temp", "°C", 4.2),
        ("probe_temp", "°C", 3.9),
        ("shock", "g", 0.0),
        ("humidity", "%", 61.0),
        ("pressure", "Pa", 101_325.0),
        ("light", "lx", 0.0),
    ];
    let expected: Vec<(String, String, f64)> = expected
        .iter()
        .map(|(t, u, d)| (t.to_string(), u.to_string(), *d))
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn sensor_mode_answers_no_assets_when_the_latest_event_is_unplaced_and_is_never_404() {
    let op = op().await;
    for asset in [seed::UNPLACED_ASSET, "NO-SUCH-ASSET", seed::AWB] {
        let got = op.locate(asset, true, &ACCOUNT).await;
        assert_eq!(got.status, 200, "{asset}");
        assert_eq!(got.body["assets"], json!([]), "{asset}");
        assert_eq!(got.body["version"], "1.0.0");
    }
}

#[tokio::test]
async fn locations_require_customer_id_and_authorized_groups_and_do_not_read_the_singular() {
    let op = op().await;
    for headers in [
        vec![],
        vec![ACCOUNT[0]],
        vec![ACCOUNT[0], ("authorized_group", "demo-group")],
        vec![("customer_id", ""), ACCOUNT[1]],
    ] {
        for sensor in [false, true] {
            let got = op.locate(seed::AWB, sensor, &headers).await;
            assert_eq!(got.status, 400, "{headers:?}");
            assert_eq!(
                got.body["message"],
                "Missing required headers: customer_id or authorized_groups"
            );
        }
    }
}

#[tokio::test]
async fn the_event_parameter_supports_only_sensor() {
    let op = op().await;
    let mut url = op.url("external/locations/ASSET-0001");
    url.query_pairs_mut().append_pair("event", "location");
    let got = op.send(Method::GET, url, &ACCOUNT, None).await;
    assert_eq!(got.status, 400);
}

// ---- Section 4.2: history ----

fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn times(body: &Value) -> Vec<jiff::Timestamp> {
    body["data"]["events"]
        .as_array()
        .expect("data.events")
        .iter()
        .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn history_is_served_only_at_the_historical_base_url() {
    let op = op().await;
    let body = json!({"context": {"customer_id": "demo-customer", "authorized_groups": "demo-group",
        "filters": {"trk_asset_id": seed::SENSOR_TAPE}}});
    let wrong = op.url(&format!(
        "agent-service/v1/agent/exec/{HISTORY_OPERATION_ID}"
    ));
    assert_eq!(
        op.send(Method::POST, wrong, &ACCOUNT, Some(&body))
            .await
            .status,
        404
    );
    let other_uuid = op
        .mock
        .historical_base_url("ppe")
        .join("agent-service/v1/agent/exec/00000000-0000-0000-0000-000000000000")
        .unwrap();
    assert_eq!(
        op.send(Method::POST, other_uuid, &ACCOUNT, Some(&body))
            .await
            .status,
        404
    );
    let not_here = op.mock.historical_base_url("ppe").join(MESSAGES).unwrap();
    assert_eq!(
        op.send(Method::POST, not_here, &ACCOUNT, Some(&body))
            .await
            .status,
        404
    );
    assert_eq!(
        op.send(Method::POST, op.history_url(), &ACCOUNT, Some(&body))
            .await
            .status,
        200
    );
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn history_answers_data_events_in_time_order_within_the_range() {
    let day = Day::one();
    let op = op_on(&day, Readings::default()).await;
    let (from, to) = (day.days_ago(3), day.days_ago(1));
    let got = op
        .history(
            json!({"trk_asset_id": seed::SENSOR_TAPE, "from": rfc3339(from), "to": rfc3339(to)}),
        )
        .await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["data"]["version"], "1.2.0");
    let t = times(&got.body);
    // Every 30 minutes for two days.
    assert!((95..=97).contains(&t.len()), "{}", t.len());
    assert!(t.windows(2).all(|w| w[0] < w[1]), "ascending");
    assert!(t.iter().all(|x| (from..=to).contains(x)));
    let e = &got.body["data"]["events"][0];
    for field in [
        "battery",
        "customer_asset_id",
        "event_type",
        "lat",
        "lon",
        "location",
        "location_detailed",
        "sensors",
        "timestamp",
        "trk_asset_id",
    ] {
        assert!(e.get(field).is_some(), "{field} in {e}");
    }
    assert_eq!(e["trk_asset_id"], seed::SENSOR_TAPE);
    assert_eq!(e["customer_asset_id"], seed::SENSOR_ASSET);
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn the_event_type_filter_gives_location_events_without_readings_or_environment_events_with_the_active_sensors(
) {
    let day = Day::one();
    let op = op_on(&day, Readings::default()).await;
    let range = |t: &str| {
        json!({"trk_asset_id": seed::SENSOR_TAPE, "event_type": t,
        "from": rfc3339(day.days_ago(2)), "to": rfc3339(day.days_ago(1))})
    };
    let loc = op.history(range("location")).await;
    let env = op.history(range("environment")).await;
    for (got, kind) in [(&loc, "location"), (&env, "environment")] {
        let events = got.body["data"]["events"].as_array().unwrap();
        assert!(!events.is_empty());
        for e in events {
            assert_eq!(e["event_type"], kind);
            let types: Vec<&str> = e["sensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["type"].as_str().unwrap())
                .collect();
            let expected: &[&str] = if kind == "location" {
                &[]
            } else {
                &["ambient_temp", "humidity"]
            };
            assert_eq!(types, expected, "only the tape's active sensors");
        }
    }
    assert_eq!(op.history(range("sensor")).await.status, 400);
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn a_time_frame_over_one_month_is_refused_in_the_history_400_shape() {
    for day in Day::each() {
        let op = op_on(&day, Readings::default()).await;
        let got = op
            .history(json!({"trk_asset_id": seed::SENSOR_TAPE,
                "from": rfc3339(day.days_ago(40)), "to": rfc3339(day.days_ago(8))}))
            .await;
        assert_eq!(got.status, 400);
        assert!(
            got.body["data"]["message"]
                .as_str()
                .unwrap()
                .contains("month"),
            "{:?}",
            got.body
        );
        assert!(got.body["data"]["status"].is_string());
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn history_reaches_back_one_year_and_no_further() {
    for day in Day::each() {
        let op = op_on(&day, Readings::default()).await;
        let old = |days: i64| {
            json!({"trk_asset_id": seed::UNPLACED_TAPE,
            "from": rfc3339(day.days_ago(days)), "to": rfc3339(day.days_ago(days - 20))})
        };
        let year = op.history(old(364)).await;
        assert_eq!(year.status, 200);
        assert!(!times(&year.body).is_empty(), "a year of history is seeded");
        let got = op.history(old(420)).await;
        assert_eq!(got.status, 400);
        assert!(got.body["data"]["message"]
            .as_str()
            .unwrap()
            .contains("one year"));
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn a_range_holding_more_than_1000_events_answers_its_oldest_1000() {
    for day in Day::each() {
        let op = op_on(&day, Readings::default()).await;
        let (from, to) = (day.days_ago(31), day.days_ago(1));
        let got = op
            .history(
                json!({"trk_asset_id": seed::SENSOR_TAPE, "from": rfc3339(from), "to": rfc3339(to)}),
            )
            .await;
        let t = times(&got.body);
        assert_eq!(t.len(), 1000);
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        // The oldest: the first event is within 30 minutes of `from`, the last well before `to`.
        assert!(
            t[0].duration_since(from) <= jiff::SignedDuration::from_mins(30),
            "{}",
            t[0]
        );
        assert!(t[999] < to - jiff::SignedDuration::from_hours(24 * 5));
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn no_time_frame_returns_the_latest_event_and_a_fresh_event_is_not_yet_visible() {
    let day = Day::one();
    let op = op_on(&day, Readings::default()).await;
    let got = op
        .history(json!({"customer_asset_id": seed::SENSOR_ASSET}))
        .await;
    let t = times(&got.body);
    assert_eq!(t.len(), 1);
    let age = day.now().duration_since(t[0]);
    assert!(
        age >= jiff::SignedDuration::from_mins(15),
        "data lags: {age:?}"
    );
    assert!(age <= jiff::SignedDuration::from_hours(3), "{age:?}");
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn history_filters_by_exactly_one_of_trk_asset_id_and_customer_asset_id() {
    let day = Day::one();
    let op = op_on(&day, Readings::default()).await;
    let range = json!({"from": rfc3339(day.days_ago(2)), "to": rfc3339(day.days_ago(1))});
    let with = |k: &[(&str, &str)]| {
        let mut f = range.clone();
        for (key, v) in k {
            f[*key] = json!(v);
        }
        f
    };
    let by_qr = op
        .history(with(&[("trk_asset_id", seed::SENSOR_TAPE)]))
        .await;
    let by_asset = op
        .history(with(&[("customer_asset_id", seed::SENSOR_ASSET)]))
        .await;
    assert_eq!(by_qr.body, by_asset.body);
    let both = op
        .history(with(&[
            ("trk_asset_id", seed::SENSOR_TAPE),
            ("customer_asset_id", seed::SENSOR_ASSET),
        ]))
        .await;
    assert_eq!(both.status, 400);
    assert_eq!(op.history(range.clone()).await.status, 400);
    let unknown = op.history(with(&[("trk_asset_id", UNKNOWN)])).await;
    assert_eq!(
        (unknown.status, unknown.body["data"]["events"].clone()),
        (200, json!([]))
    );
}

#[tokio::test]
async fn history_requires_its_headers_and_a_context_matching_them() {
    let op = op().await;
    let body = json!({"context": {"customer_id": "demo-customer", "authorized_groups": "demo-group",
        "filters": {"trk_asset_id": seed::SENSOR_TAPE}}});
    let got = op
        .send(Method::POST, op.history_url(), &[ACCOUNT[0]], Some(&body))
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(
        got.body["data"]["message"],
        "Missing required headers: customer_id or authorized_groups"
    );
    let mut mismatch = body.clone();
    mismatch["context"]["customer_id"] = json!("someone-else");
    assert_eq!(
        op.send(Method::POST, op.history_url(), &ACCOUNT, Some(&mismatch))
            .await
            .status,
        400
    );
    let no_filters =
        json!({"context": {"customer_id": "demo-customer", "authorized_groups": "demo-group"}});
    assert_eq!(
        op.send(Method::POST, op.history_url(), &ACCOUNT, Some(&no_filters))
            .await
            .status,
        400
    );
}

// ---- Section 4.5: messages ----

fn manifest() -> Value {
    json!({"asset_barcode": "ASSET-0001", "shipped_date": 1763719200,
           "shipment_id": "SHP-1", "container_id": "ULD-1"})
}

fn device_data() -> Value {
    json!({"device_id": seed::SENSOR_TAPE, "sensor_data": {"temperature": 4.5, "humidity": 60},
           "timestamp": 1763719200})
}

fn aircargo() -> Value {
    json!({"bookingPublishEvent": {"bookingDetails": {"awb": seed::AWB, "origin": "DXB"},
           "eventMetadata": {"id": "evt-1", "timestamp": "2026-11-20T10:00:00Z", "type": "BOOKING"}}})
}

#[tokio::test]
async fn each_message_type_with_its_shape_is_accepted_with_201() {
    let op = op().await;
    for (t, data) in [
        ("MANIFEST_DATA", manifest()),
        ("DEVICE_DATA", device_data()),
        ("AIRCARGO", aircargo()),
    ] {
        let got = op
            .message(t, json!({"message_type": t, "data": data}))
            .await;
        assert_eq!(got.status, 201, "{t}: {:?}", got.body);
        assert!(got.body["message"].is_string() && got.body["code"].is_number());
    }
}

#[tokio::test]
async fn the_message_type_header_and_body_must_agree() {
    let op = op().await;
    let got = op
        .message(
            "DEVICE_DATA",
            json!({"message_type": "MANIFEST_DATA", "data": manifest()}),
        )
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["message"], "message_type header and body disagree");
    let got = op
        .send(
            Method::POST,
            op.url(MESSAGES),
            &ACCOUNT,
            Some(&json!({"message_type": "MANIFEST_DATA", "data": manifest()})),
        )
        .await;
    assert_eq!(got.status, 400, "no message_type header");
    let got = op
        .message("WEATHER", json!({"message_type": "WEATHER", "data": {}}))
        .await;
    assert_eq!(
        (got.status, got.body["message"].as_str()),
        (400, Some("Invalid message type"))
    );
}

#[tokio::test]
async fn a_payload_that_does_not_match_its_type_is_refused_naming_the_field() {
    let op = op().await;
    let mut bad_date = manifest();
    bad_date["shipped_date"] = json!("2026-11-20");
    let mut no_humidity = device_data();
    no_humidity["sensor_data"]
        .as_object_mut()
        .unwrap()
        .remove("humidity");
    let mut no_meta = aircargo();
    no_meta["bookingPublishEvent"]
        .as_object_mut()
        .unwrap()
        .remove("eventMetadata");
    for (t, data, field) in [
        ("MANIFEST_DATA", bad_date, "shipped_date"),
        ("DEVICE_DATA", no_humidity, "sensor_data.humidity"),
        ("AIRCARGO", no_meta, "eventMetadata"),
    ] {
        let got = op
            .message(t, json!({"message_type": t, "data": data}))
            .await;
        assert_eq!(got.status, 400, "{t}");
        assert!(
            got.body["message"].as_str().unwrap().contains(field),
            "{:?}",
            got.body
        );
    }
}

#[tokio::test]
async fn messages_require_customer_id_and_authorized_groups() {
    let op = op().await;
    let body = json!({"message_type": "MANIFEST_DATA", "data": manifest()});
    let got = op
        .send(
            Method::POST,
            op.url(MESSAGES),
            &[("message_type", "MANIFEST_DATA")],
            Some(&body),
        )
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(
        got.body["message"],
        "Missing required headers: customer_id or authorized_groups"
    );
}

// ---- Section 7 and the test aids ----

#[tokio::test]
async fn a_body_that_is_not_json_is_401_unauthorized_access() {
    let op = op().await;
    let resp = op
        .http
        .post(op.url(LABEL))
        .bearer_auth(&op.token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"message": "Unauthorized access", "code": 401}));
}

#[tokio::test]
async fn a_delayed_label_is_applied_before_its_answer_is_lost_and_counted_once() {
    let op = op().await;
    let qr = seeded(DeviceStatus::NotActivated);
    op.mock
        .push_operator_fault(Endpoint::Label, Fault::Delay(Duration::from_secs(5)));
    let err = op
        .http
        .post(op.url(LABEL))
        .bearer_auth(&op.token)
        .json(&json!({"devices": [label_item(qr, "LOST-ANSWER")]}))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(op.status_of(qr), DeviceStatus::Activated, "applied");
    assert_eq!(op.mock.operator_requests(Endpoint::Label), 1);
    let seen = op.mock.operator_received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status, Some(200));
    assert_eq!(seen[0].fault, Some(Fault::Delay(Duration::from_secs(5))));
}

#[tokio::test]
async fn an_injected_status_answers_at_once_without_applying_anything() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Activated);
    op.mock.push_operator_fault(
        Endpoint::Deactivate,
        Fault::Status {
            status: 503,
            retry_after: None,
        },
    );
    assert_eq!(op.deactivate(&[qr]).await.status, 503);
    assert_eq!(op.status_of(qr), DeviceStatus::Activated);
    assert_eq!(op.deactivate(&[qr]).await.status, 200, "one-shot");
    assert_eq!(op.mock.operator_requests(Endpoint::Deactivate), 2);
}

#[tokio::test]
async fn the_record_keeps_each_operator_request_without_its_token() {
    let op = op().await;
    op.show(&[UNKNOWN]).await;
    let seen = op.mock.operator_received();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(
        (r.endpoint, r.method.as_str()),
        (Endpoint::ShowLabels, "GET")
    );
    assert_eq!(
        r.query.as_deref(),
        Some(format!("qrcode={UNKNOWN}").as_str())
    );
    assert!(r.header("authorization").is_none());
    assert!(r.headers.iter().all(|(_, v)| !v.contains(&op.token)));
}

#[tokio::test]
async fn a_temporary_fault_of_a_location_read_is_reported_as_awb_not_found_or_no_assets() {
    let op = op().await;
    let fault = || Fault::Status {
        status: 500,
        retry_after: None,
    };
    op.mock.push_operator_fault(Endpoint::Locate, fault());
    let got = op.locate(seed::AWB, false, &ACCOUNT).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.body, json!({"message": "AWB not found", "code": 404}));
    assert_eq!(
        op.locate(seed::AWB, false, &ACCOUNT).await.status,
        200,
        "a retry finds it"
    );
    op.mock.push_operator_fault(Endpoint::Locate, fault());
    let got = op.locate(seed::SENSOR_ASSET, true, &ACCOUNT).await;
    assert_eq!((got.status, got.body["assets"].clone()), (200, json!([])));
    assert_eq!(op.mock.operator_requests(Endpoint::Locate), 3);
}

#[tokio::test]
async fn a_request_refused_with_401_for_a_missing_permission_counts_in_the_window() {
    let op = op().await;
    op.mock.set_permission(Endpoint::Label, false);
    for _ in 0..10 {
        let got = op
            .label(
                json!([label_item(seeded(DeviceStatus::NotActivated), "A")]),
                false,
            )
            .await;
        assert_eq!(got.status, 401);
        assert_eq!(
            got.body,
            json!({"message": "Unauthorized access", "code": 401})
        );
    }
    assert_eq!(
        op.status_of(seeded(DeviceStatus::NotActivated)),
        DeviceStatus::NotActivated
    );
    assert_eq!(op.show(&[UNKNOWN]).await.status, 429);
}

#[tokio::test]
async fn a_token_of_another_environment_is_refused_by_every_operator_endpoint() {
    let mock = mock::start(MockConfig {
        environments: vec![
            mock::MockEnvironment::named("ppe"),
            mock::MockEnvironment::named("prod"),
        ],
        ..MockConfig::demo()
    })
    .await
    .unwrap();
    // "ppe" is where every request goes; the token comes from "prod".
    let op = with_token_of(mock, "prod").await;
    assert_eq!(op.show(&[UNKNOWN]).await.status, 401);
    assert_eq!(op.locate(seed::AWB, false, &ACCOUNT).await.status, 401);
    assert_eq!(
        op.history(json!({"trk_asset_id": seed::SENSOR_TAPE}))
            .await
            .status,
        401
    );
    assert_eq!(
        op.add(&parcel(UNKNOWN, "C0DEAD000001"), &ACCOUNT)
            .await
            .status,
        401
    );
}

#[tokio::test]
async fn a_connection_closed_by_fault_applies_nothing() {
    let op = op().await;
    let qr = seeded(DeviceStatus::NotActivated);
    op.mock.push_operator_fault(Endpoint::Label, Fault::Close);
    let sent = op
        .http
        .post(op.url(LABEL))
        .bearer_auth(&op.token)
        .json(&json!({"devices": [label_item(qr, "A")]}))
        .send()
        .await;
    assert!(sent.is_err(), "no answer");
    assert_eq!(op.status_of(qr), DeviceStatus::NotActivated);
    assert_eq!(op.mock.operator_received()[0].status, None);
}

#[tokio::test]
async fn a_message_for_another_account_is_404() {
    let op = op().await;
    let headers = [
        ("customer_id", "someone-else"),
        ACCOUNT[1],
        ("message_type", "MANIFEST_DATA"),
    ];
    let body = json!({"message_type": "MANIFEST_DATA", "data": manifest()});
    let got = op
        .send(Method::POST, op.url(MESSAGES), &headers, Some(&body))
        .await;
    assert_eq!(got.status, 404);
    assert!(got.body["message"].is_string() && got.body["code"] == 404);
}

#[tokio::test]
async fn relabel_with_nothing_to_change_is_a_validation_failure() {
    let op = op().await;
    let qr = seeded(DeviceStatus::Activated);
    let got = op.relabel(json!([{"qrcode": qr}])).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["errors"][0]["field"], "devices[0]");
    let got = op
        .relabel(json!([{"qrcode": qr, "override": true, "asset_barcode": "A"}]))
        .await;
    assert_eq!(got.status, 400, "relabel has no override");
    assert_eq!(op.asset_of(qr).as_deref(), Some("ASSET-1002"));
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn history_from_alone_runs_to_now_and_to_alone_starts_a_month_before() {
    for day in Day::each() {
        let op = op_on(&day, Readings::default()).await;
        let from = day.days_ago(2);
        let got = op
            .history(json!({"trk_asset_id": seed::SENSOR_TAPE, "from": rfc3339(from)}))
            .await;
        let t = times(&got.body);
        assert!(t[0] >= from && t[0].duration_since(from) <= jiff::SignedDuration::from_mins(30));
        let newest = day.now().duration_since(*t.last().unwrap());
        assert!(
            newest <= jiff::SignedDuration::from_hours(3),
            "runs to now: {newest:?}"
        );

        let to = day.days_ago(300);
        let got = op
            .history(json!({"trk_asset_id": seed::UNPLACED_TAPE, "to": rfc3339(to)}))
            .await;
        let t = times(&got.body);
        // Every 6 hours for 31 days.
        assert!((123..=125).contains(&t.len()), "{}", t.len());
        assert!(*t.last().unwrap() <= to);
        assert!(to.duration_since(t[0]) <= jiff::SignedDuration::from_hours(24 * 31));
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn history_refuses_a_reversed_range_a_bad_date_time_and_an_unknown_filter() {
    let day = Day::one();
    let op = op_on(&day, Readings::default()).await;
    for filters in [
        json!({"trk_asset_id": seed::SENSOR_TAPE, "from": rfc3339(day.days_ago(1)), "to": rfc3339(day.days_ago(2))}),
        json!({"trk_asset_id": seed::SENSOR_TAPE, "from": "yesterday"}),
        json!({"trk_asset_id": seed::SENSOR_TAPE, "from": 1763719200}),
        json!({"trk_asset_id": seed::SENSOR_TAPE, "asset": "x"}),
    ] {
        let got = op.history(filters.clone()).await;
        assert_eq!(got.status, 400, "{filters}");
        assert!(got.body["data"]["message"].is_string(), "{filters}");
    }
}

// ---- Where the spec is silent: each reading the mock plays (mock/readings.rs) ----

/// An `Op` on a mock playing `readings`.
async fn op_with(readings: Readings) -> Op {
    let op = op().await;
    op.mock.set_readings(readings);
    op
}

#[tokio::test]
async fn a_fleet_tape_without_a_label_is_not_activated_until_labelled() {
    let op = op().await;
    let qr = "TTC0FFEE000001";
    let got = op.show(&[qr]).await;
    assert_eq!(got.body["devices"][0]["status"], "NOT_ACTIVATED");
    assert_eq!(got.body["devices"][0]["label"], Value::Null);
    assert_eq!(
        op.label(json!([label_item(qr, "A")]), false).await.status,
        200
    );
    assert_eq!(op.status_of(qr), DeviceStatus::Activated);
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn a_full_history_range_answers_the_oldest_or_the_newest_1000_in_either_order() {
    for day in Day::each() {
        let (from, to) = (day.days_ago(30), day.days_ago(1));
        for keeps in [HistoryKeeps::Oldest, HistoryKeeps::Newest] {
            for order in [HistoryOrder::Ascending, HistoryOrder::Descending] {
                let op = op_on(
                    &day,
                    Readings {
                        history_keeps: keeps,
                        history_order: order,
                        ..Readings::default()
                    },
                )
                .await;
                let got = op
                    .history(json!({"trk_asset_id": seed::SENSOR_TAPE,
                        "from": rfc3339(from), "to": rfc3339(to)}))
                    .await;
                let mut t = times(&got.body);
                assert_eq!(t.len(), 1000, "{keeps:?} {order:?}");
                let ascending = t.windows(2).all(|w| w[0] < w[1]);
                let descending = t.windows(2).all(|w| w[0] > w[1]);
                assert!(
                    (order == HistoryOrder::Ascending && ascending)
                        || (order == HistoryOrder::Descending && descending),
                    "{keeps:?} {order:?}"
                );
                t.sort();
                let half_hour = jiff::SignedDuration::from_mins(30);
                match keeps {
                    HistoryKeeps::Oldest => {
                        assert!(
                            t[0].duration_since(from) <= half_hour,
                            "{keeps:?} {order:?}"
                        )
                    }
                    HistoryKeeps::Newest => {
                        assert!(
                            to.duration_since(t[999]) <= half_hour,
                            "{keeps:?} {order:?}"
                        )
                    }
                }
            }
        }
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn one_month_of_history_is_31_or_30_days_as_the_reading_says() {
    for day in Day::each() {
        for days in [31, 30] {
            let op = op_on(
                &day,
                Readings {
                    month_days: days,
                    ..Readings::default()
                },
            )
            .await;
            let span = |d: i64| {
                json!({"trk_asset_id": seed::UNPLACED_TAPE,
                    "from": rfc3339(day.days_ago(d + 2)), "to": rfc3339(day.days_ago(2))})
            };
            assert_eq!(op.history(span(30)).await.status, 200, "{days}");
            let got = op.history(span(31)).await;
            assert_eq!(got.status, if days == 31 { 200 } else { 400 }, "{days}");
        }
    }
}

#[tokio::test]
async fn the_label_lookup_nests_the_label_or_puts_its_fields_on_the_entry() {
    let labelled = seeded(DeviceStatus::Activated);
    let unlabelled = seeded(DeviceStatus::NotActivated);
    for shape in [LookupShape::Nested, LookupShape::Flat] {
        let op = op_with(Readings {
            lookup: shape,
            ..Readings::default()
        })
        .await;
        let got = op.show(&[labelled, unlabelled]).await;
        let (a, b) = (&got.body["devices"][0], &got.body["devices"][1]);
        match shape {
            LookupShape::Nested => {
                assert!(a["label"]["asset_barcode"].is_string(), "{a}");
                assert_eq!(b["label"], Value::Null);
                assert!(a.get("asset_barcode").is_none(), "{a}");
            }
            LookupShape::Flat => {
                assert!(a["asset_barcode"].is_string(), "{a}");
                assert!(a["application_id"].is_string(), "{a}");
                assert!(a.get("label").is_none(), "{a}");
                assert_eq!(b["asset_barcode"], Value::Null);
            }
        }
    }
}

#[tokio::test]
async fn results_name_the_qr_code_as_sent_or_in_the_services_normalised_form() {
    let labelled = seeded(DeviceStatus::Activated);
    let lower = labelled.to_lowercase();
    for echo in [QrEcho::AsSent, QrEcho::Normalised] {
        let op = op_with(Readings {
            qr_echo: echo,
            ..Readings::default()
        })
        .await;
        let got = op.label(json!([label_item(&lower, "A")]), false).await;
        match echo {
            // Matched exactly: no such device.
            QrEcho::AsSent => assert_eq!(
                errors(&got.body),
                [(lower.clone(), "QRMAC_NOT_FOUND".into())]
            ),
            // Matched without regard to case, and named the service's way.
            QrEcho::Normalised => assert_eq!(
                errors(&got.body),
                [(labelled.to_string(), "ALREADY_LABELLED".into())]
            ),
        }
    }
}

#[tokio::test]
async fn a_request_answered_with_an_injected_401_counts_in_the_window() {
    let op = op().await;
    op.mock.set_rate_window(2, Duration::from_secs(600));
    op.mock.push_operator_fault(
        Endpoint::ShowLabels,
        Fault::Status {
            status: 401,
            retry_after: None,
        },
    );
    assert_eq!(op.show(&[UNKNOWN]).await.status, 401);
    assert_eq!(op.show(&[UNKNOWN]).await.status, 207);
    assert_eq!(op.show(&[UNKNOWN]).await.status, 429);
}

#[tokio::test]
async fn a_fault_for_the_nth_request_applies_to_that_request_alone() {
    let op = op().await;
    op.mock.push_operator_fault_at(
        Endpoint::ShowLabels,
        2,
        Fault::Status {
            status: 503,
            retry_after: None,
        },
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(op.show(&[UNKNOWN]).await.status);
    }
    assert_eq!(got, [207, 503, 207]);
}

#[tokio::test]
async fn a_token_fault_answers_the_next_grant_request() {
    let op = op().await;
    op.mock.push_token_fault(Fault::Status {
        status: 503,
        retry_after: None,
    });
    let form = [
        ("grant_type", "password"),
        ("username", "demo"),
        ("password", "demo-password"),
        ("client_id", "tapegate-demo"),
        ("audience", "https://api.example/decode"),
    ];
    let grant = || op.http.post(op.mock.auth_url("ppe")).form(&form).send();
    assert_eq!(grant().await.unwrap().status(), 503);
    assert_eq!(grant().await.unwrap().status(), 200);
}

#[tokio::test]
async fn retry_1_changes_nothing_a_device_that_exists_is_409_whoever_created_it() {
    let op = op().await;
    let mut params = parcel("TTC0DEAD000001", "C0DEAD000001");
    assert_eq!(op.add(&params, &ACCOUNT).await.status, 201);
    params.push(("retry", "1"));
    let got = op.add(&params, &ACCOUNT).await;
    assert_eq!(got.status, 409);
    params.push(("override", "1"));
    assert_eq!(op.add(&params, &ACCOUNT).await.status, 200);
}
