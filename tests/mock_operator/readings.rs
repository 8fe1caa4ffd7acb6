//! Where the spec is silent: each reading the mock plays (mock/readings.rs).

use std::time::Duration;

use serde_json::{json, Value};

#[cfg(debug_assertions)]
use crate::common::day::Day;
use tapegate_mock::{
    seed, DeviceStatus, Endpoint, Fault, HistoryKeeps, HistoryOrder, LookupShape, QrEcho, Readings,
};

use super::support::*;

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
