//! Spec section 8: the rate window the operator calls share, and the token calls.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

use tapegate_mock::{seed, DeviceStatus, Endpoint};

use super::support::*;

/// The eleventh request in a window, across the five calls, is 429 with only a message.
#[tokio::test]
async fn the_eleventh_request_in_a_window_is_429_with_only_a_message() {
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

/// The token calls take `customer_id` and the singular `authorized_group`, both or
/// neither.
#[tokio::test]
async fn token_calls_take_customer_id_and_authorized_group_both_or_neither() {
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
