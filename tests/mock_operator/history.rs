//! Spec section 4.2: history.

use reqwest::Method;
use serde_json::json;

#[cfg(debug_assertions)]
use crate::common::day::Day;
use tapegate_mock::{seed, Readings, HISTORY_OPERATION_ID};

use super::support::*;

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

/// The event type filter gives location events without readings, or environment events
/// with the active sensors.
#[cfg(debug_assertions)]
#[tokio::test]
async fn the_event_type_filter_gives_location_or_environment_events() {
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
