//! Spec section 7 and the mock's test aids (delays, injected answers and faults, the
//! record of requests).

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

#[cfg(debug_assertions)]
use crate::common::day::Day;
use tapegate_mock::{self as mock, seed, DeviceStatus, Endpoint, Fault, MockConfig, Readings};

use super::support::*;

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
