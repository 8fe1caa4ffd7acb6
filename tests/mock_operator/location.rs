//! Spec section 4.1: the latest location (AWB and sensor modes).

use reqwest::Method;
use serde_json::json;

use tapegate_mock::{seed, LOCATION_UUID, VENDOR_ID};

use super::support::*;

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

/// Sensor mode answers "no assets" when the latest event is unplaced, and is never 404.
#[tokio::test]
async fn sensor_mode_answers_no_assets_when_the_latest_event_is_unplaced() {
    let op = op().await;
    for asset in [seed::UNPLACED_ASSET, "NO-SUCH-ASSET", seed::AWB] {
        let got = op.locate(asset, true, &ACCOUNT).await;
        assert_eq!(got.status, 200, "{asset}");
        assert_eq!(got.body["assets"], json!([]), "{asset}");
        assert_eq!(got.body["version"], "1.0.0");
    }
}

/// Locations require `customer_id` and `authorized_groups` and do not read the
/// singular.
#[tokio::test]
async fn locations_require_customer_id_and_authorized_groups() {
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
