//! Spec section 4.6: add device.

use reqwest::Method;
use serde_json::json;

use tapegate::record::hex_upper;
use tapegate::source::sim::tape::TapeReading;
use tapegate_mock::DeviceStatus;

use super::support::*;

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

/// Add device requires `customer_id` and `authorized_groups` and does not read the
/// singular.
#[tokio::test]
async fn add_device_requires_customer_id_and_authorized_groups() {
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

/// Add device with `dstatus` 0 registers a not-activated tape that label then
/// activates.
#[tokio::test]
async fn add_device_with_dstatus_0_registers_a_not_activated_tape() {
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
