//! Spec section 4.5: messages.

use reqwest::Method;
use serde_json::{json, Value};

use tapegate_mock::seed;

use super::support::*;

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
