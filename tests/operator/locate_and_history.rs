//! Locating (AWB and sensor modes) and history: the one AWB retry, readings with
//! units, and a range split into months and merged complete and in order.

#[cfg(debug_assertions)]
use crate::common::day::Day;
use crate::common::text;
use tapegate_mock::{seed, Endpoint, Fault, Readings};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awb_404_is_retried_once_then_reported_not_found() {
    let (mock, g) = setup().await;
    let out = g.run(&["locate", seed::AWB_UNPLACED]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stderr).contains("AWB not found"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(404), Some(404)]);
    let found = g.run(&["locate", seed::AWB, "--json"]);
    assert_eq!(code(&found), 0, "{}", text(&found.stderr));
    assert_eq!(json(&found)["assets"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awb_404_from_a_temporary_fault_is_found_on_the_one_retry() {
    let (mock, g) = setup().await;
    // The service reports a temporary fault of an AWB read as 404 AWB not found.
    mock.push_operator_fault(
        Endpoint::Locate,
        Fault::Status {
            status: 500,
            retry_after: None,
        },
    );
    let out = g.run(&["locate", seed::AWB]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(404), Some(200)]);
    assert!(text(&out.stderr).contains("asking once more"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensor_mode_prints_six_readings_with_units_and_no_reading_exits_1() {
    let (mock, g) = setup().await;
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for (kind, units) in tapegate::operator::SENSORS {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(kind) && l.contains(&format!(" {units}"))),
            "{kind} {units}: {stdout}"
        );
    }
    let none = g.run(&["locate", seed::UNPLACED_ASSET, "--sensor"]);
    assert_eq!(code(&none), 1);
    assert!(text(&none.stderr).contains("no current reading"));
    assert_eq!(
        mock.operator_requests(Endpoint::Locate),
        3,
        "no reading is asked once more (spec 4.1 sensor rule 4)"
    );
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_14_months_is_refused_before_anything_is_sent() {
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let out = g.run(&[
            "history",
            "--qr",
            seed::SENSOR_TAPE,
            "--from",
            &day.days_ago(426).to_string(),
        ]);
        assert_eq!(code(&out), 2, "{day}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("one year"),
            "{day}: {}",
            text(&out.stderr)
        );
        assert_eq!(mock.operator_requests(Endpoint::History), 0, "{day}");
    }
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_over_3_months_is_3_or_more_requests_merged_in_order() {
    // `--to` left out: the range ends now, by the command's clock.
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let from = day.days_ago(100);
        let out = g.run(&[
            "history",
            "--qr",
            seed::SENSOR_TAPE,
            "--from",
            &from.to_string(),
            "--json",
        ]);
        assert_eq!(code(&out), 0, "{day}: {}", text(&out.stderr));
        let requests = mock.operator_requests(Endpoint::History);
        assert!(requests >= 4, "{day}: {requests} requests");
        assert!(
            statuses(&mock, Endpoint::History)
                .iter()
                .all(|s| *s == Some(200)),
            "{day}"
        );
        let events = json(&out);
        let times: Vec<jiff::Timestamp> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
            .collect();
        // The tape has an event every 30 min: no gap wider means no window's 1,000 cap
        // cut any, and none narrower or equal to zero means no duplicate and time order.
        assert!(times.len() >= 100 * 48 - 5, "{day}: {} events", times.len());
        for w in times.windows(2) {
            let gap = w[1].as_second() - w[0].as_second();
            assert!(gap > 0 && gap <= 1800, "{day}: {} then {}", w[0], w[1]);
        }
        assert!(times[0] >= from, "{day}");
    }
}

/// A service may read the range to the whole second and answer an event just before a
/// `--from` that has a fraction: it is outside the range asked, and not printed.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_prints_no_event_from_before_the_range_asked() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    // The tape reports on every half hour; the fixed day is on one.
    let on_the_half_hour = day.days_ago(2);
    assert_eq!(on_the_half_hour.as_second() % 1800, 0, "{day}");
    let from = on_the_half_hour + jiff::SignedDuration::from_millis(500);
    let out = g.run(&[
        "history",
        "--qr",
        seed::SENSOR_TAPE,
        "--from",
        &from.to_string(),
        "--to",
        &day.days_ago(1).to_string(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    let first: jiff::Timestamp = json(&out)[0]["timestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        first,
        on_the_half_hour + jiff::SignedDuration::from_mins(30),
        "asked from {from}"
    );
    assert!(statuses(&mock, Endpoint::History) == [Some(200)]);
}

#[cfg(debug_assertions)]
/// Whether `from..=to` holds a whole calendar month (UTC) of 31 days: the client asks
/// history a calendar month at a time, so only then does it ask a 31-day window.
fn holds_a_whole_31_day_month(from: jiff::Timestamp, to: jiff::Timestamp) -> bool {
    use jiff::ToSpan;
    let utc = jiff::tz::TimeZone::UTC;
    let mut month = from.to_zoned(utc.clone()).date().first_of_month();
    loop {
        let start = month.to_zoned(utc.clone()).unwrap().timestamp();
        let next = month.checked_add(1.month()).unwrap();
        let end = next.to_zoned(utc.clone()).unwrap().timestamp();
        if end > to {
            return false;
        }
        if start >= from && month.days_in_month() == 31 {
            return true;
        }
        month = next;
    }
}

/// History is complete whichever end of a full answer the service keeps, and whatever
/// its month.
///
/// Seen: 2,740 events in range, 1,396 printed, when the service keeps the newest 1,000
/// of a full answer; and a 400 for a 31-day window when its month is 30 days.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_complete_whichever_end_of_a_full_answer_is_kept() {
    let mut whole_31_day_months = 0;
    for day in Day::each() {
        for readings in Readings::variants() {
            let (mock, g) = setup_on(readings, &day).await;
            let (from, to) = (day.days_ago(58), day.days_ago(1));
            let out = g.run(&[
                "history",
                "--qr",
                seed::SENSOR_TAPE,
                "--from",
                &from.to_string(),
                "--to",
                &to.to_string(),
                "--json",
            ]);
            assert_eq!(code(&out), 0, "{day}, {readings:?}: {}", both(&out));
            let times: Vec<jiff::Timestamp> = json(&out)
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
                .collect();
            // An event every 30 min: the first and last within 30 min of the ends, no gap
            // wider, no duplicate, in time order.
            let half_hour = jiff::SignedDuration::from_mins(30);
            assert!(
                times.len() >= 57 * 48,
                "{day}, {readings:?}: {} events",
                times.len()
            );
            assert!(
                times[0].duration_since(from) <= half_hour,
                "{day}, {readings:?}"
            );
            assert!(
                to.duration_since(*times.last().unwrap()) <= half_hour,
                "{day}, {readings:?}"
            );
            for w in times.windows(2) {
                let gap = w[1].as_second() - w[0].as_second();
                assert!(
                    gap > 0 && gap <= 1800,
                    "{day}, {readings:?}: {} then {}",
                    w[0],
                    w[1]
                );
            }
            let refused = statuses(&mock, Endpoint::History)
                .iter()
                .filter(|s| **s == Some(400))
                .count();
            // A service whose month is 30 days refuses the client's window of a whole
            // 31-day month, and nothing else.
            if readings.month_days == 30 && holds_a_whole_31_day_month(from, to) {
                whole_31_day_months += 1;
                assert!(
                    refused >= 1,
                    "{day}, {readings:?}: a 31-day month was never asked"
                );
            } else {
                assert_eq!(refused, 0, "{day}, {readings:?}");
            }
        }
    }
    // The fixed days are chosen so that one does (the refusal is exercised).
    assert!(
        whole_31_day_months > 0 || std::env::var_os(crate::common::day::TEST_DAYS_ENV).is_some(),
        "no fixed day's range holds a whole 31-day month"
    );
}

/// Item 8: a reading of 0 is marked (the service sends 0 for a value not reported);
/// `assets: []` is asked once more like an AWB 404; error codes come with a hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_of_0_are_marked_an_empty_sensor_answer_is_asked_again_and_errors_hint() {
    let (mock, g) = setup().await;
    mock.push_operator_fault(
        Endpoint::Locate,
        Fault::Status {
            status: 500,
            retry_after: None,
        },
    );
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor"]);
    assert_eq!(code(&out), 0, "{}", both(&out));
    assert_eq!(statuses(&mock, Endpoint::Locate), [Some(200), Some(200)]);
    let stdout = text(&out.stdout);
    let shock = stdout.lines().find(|l| l.contains("shock")).unwrap();
    assert!(shock.contains("not reported"), "{stdout}");
    let temp = stdout.lines().find(|l| l.contains("ambient_temp")).unwrap();
    assert!(!temp.contains("not reported"), "{stdout}");
    let out = g.run(&["locate", seed::SENSOR_ASSET, "--sensor", "--json"]);
    let sensors = json(&out)["assets"][0]["sensors"].clone();
    assert_eq!(sensors[2]["mark"], "zero_or_unreported", "{sensors}");
    assert_eq!(sensors[0].get("mark"), None, "{sensors}");

    let labelled = seed::STATUS_DEVICES[1].0;
    let out = g.run(&["device", "label", "--qr", labelled, "--asset", "AWB-X"]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stdout).contains("ALREADY_LABELLED") && text(&out.stdout).contains("--override"),
        "{}",
        both(&out)
    );
    let not_activated = seed::STATUS_DEVICES[0].0;
    let out = g.run(&["device", "deactivate", "--qr", not_activated]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stdout).contains("INVALID_TRANSITION")
            && text(&out.stdout).contains("`device show`"),
        "{}",
        both(&out)
    );
}

/// Item 9: an asset id is percent-encoded byte for byte, or refused (exit 2, nothing
/// sent) when it cannot be meant; never changed by the URL library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locate_id_is_sent_byte_for_byte_or_refused() {
    let (mock, g) = setup().await;
    for id in ["..", ".", "a\nb", "a\tb", ""] {
        let out = g.run(&["locate", id]);
        assert_eq!(code(&out), 2, "{id:?}: {}", both(&out));
    }
    assert!(mock.operator_received().is_empty(), "something was sent");
    let out = g.run(&["locate", "a b/c?d%2E"]);
    assert_eq!(code(&out), 1, "{}", both(&out));
    let got = mock.operator_received();
    assert_eq!(got.len(), 2, "AWB not found, asked twice");
    assert!(
        got[0]
            .path
            .ends_with("/external/locations/a%20b%2Fc%3Fd%252E"),
        "{}",
        got[0].path
    );
}
