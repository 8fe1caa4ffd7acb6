//! The shared rate window: a request that would earn a 429 waits instead, across runs
//! and whatever the window's alignment; a 429 anyway waits for its `Retry-After`.

use std::time::{Duration, SystemTime};

#[cfg(debug_assertions)]
use crate::common::day::Day;
use crate::common::text;
use tapegate_mock::{seed, Endpoint, Fault, Readings};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eleventh_label_request_in_a_window_waits_instead_of_earning_a_429() {
    let (mock, g) = setup().await;
    // 220 devices: 11 requests of 20, one more than a window takes.
    let out = run(
        &g,
        &with_qrs(&["device", "label", "--asset", "AWB-1"], &fleet(220)),
    );
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("s for the service's rate window"),
        "{}",
        text(&out.stderr)
    );
    let got = statuses(&mock, Endpoint::Label);
    assert_eq!(got, vec![Some(200); 11]);
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eleventh_label_request_waits_across_two_cli_runs() {
    // The window's stamps are the clock's, kept in the database between runs.
    for day in Day::each() {
        let (mock, g) = setup_on(Readings::default(), &day).await;
        let qrs = fleet(220);
        let first = run(
            &g,
            &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[..200]),
        );
        assert_eq!(code(&first), 0, "{day}: {}", text(&first.stderr));
        assert!(!text(&first.stderr).contains("rate window"), "{day}");
        let second = run(
            &g,
            &with_qrs(&["device", "label", "--asset", "AWB-1"], &qrs[200..]),
        );
        assert_eq!(code(&second), 0, "{day}: {}", text(&second.stderr));
        assert!(
            text(&second.stderr).contains("s for the service's rate window"),
            "{day}: {}",
            text(&second.stderr)
        );
        assert_eq!(
            statuses(&mock, Endpoint::Label),
            vec![Some(200); 11],
            "{day}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_anyway_waits_for_the_next_window_and_sends_again() {
    let (mock, g) = setup().await;
    // Another client of the same identity filled the window: the service says 429.
    mock.push_operator_fault(
        Endpoint::Deactivate,
        Fault::Status {
            status: 429,
            retry_after: None,
        },
    );
    let qrs = labelled_fleet(&mock, 2);
    let out = run(&g, &with_qrs(&["device", "deactivate"], &qrs));
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        statuses(&mock, Endpoint::Deactivate),
        [Some(429), Some(200)]
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("(429)") && stderr.contains("s for the service's rate window"),
        "{stderr}"
    );
}

/// Item 4: a 429 is retried after its `Retry-After` by every call (add, locate,
/// history, message), not reported.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_retries_a_429_after_its_retry_after() {
    let day = Day::one();
    let (mock, g) = setup_on(Readings::default(), &day).await;
    let payload = g.path("manifest.json");
    std::fs::write(
        &payload,
        r#"{"asset_barcode":"A","shipped_date":1763719200,"shipment_id":"S","container_id":"C"}"#,
    )
    .unwrap();
    let from = day.days_ago(2).to_string();
    let cases: [(Endpoint, &str, Vec<&str>); 4] = [
        (
            Endpoint::AddDevice,
            "1",
            vec![
                "device",
                "add",
                "--qr",
                "TTC0DEAD000007",
                "--tape-id",
                "C0DEAD000007",
            ],
        ),
        (Endpoint::Locate, "1", vec!["locate", seed::AWB]),
        (
            Endpoint::History,
            "1",
            vec!["history", "--qr", seed::SENSOR_TAPE, "--from", &from],
        ),
        (
            Endpoint::Message,
            "2",
            vec!["message", "MANIFEST_DATA", payload.to_str().unwrap()],
        ),
    ];
    for (endpoint, after, args) in cases {
        mock.push_operator_fault(
            endpoint,
            Fault::Status {
                status: 429,
                retry_after: Some(after.to_string()),
            },
        );
        let out = g.run(&args);
        assert_eq!(code(&out), 0, "{endpoint:?}: {}", both(&out));
        let at = received_at(&mock, endpoint);
        assert_eq!(statuses(&mock, endpoint)[0], Some(429), "{endpoint:?}");
        let gap = at[1].duration_since(at[0]).unwrap();
        let wanted = Duration::from_secs(after.parse().unwrap());
        assert!(gap >= wanted, "{endpoint:?}: sent again after {gap:?}");
    }
    let adds = mock.operator_received();
    assert!(
        adds.iter()
            .filter(|r| r.endpoint == Endpoint::AddDevice)
            .all(|r| !r.query.as_deref().unwrap_or_default().contains("retry=1")),
        "a 429 applied nothing: no retry=1"
    );
}

/// Times at which no window's length holds more than ten of `at`.
fn max_in_any_span(at: &[SystemTime], span: Duration) -> usize {
    at.iter()
        .map(|t| at.iter().filter(|u| **u >= *t && **u < *t + span).count())
        .max()
        .unwrap_or(0)
}

/// Item 5: ten requests spread over most of a window, then more: a window anchored at
/// the client's first request lets the next ten through at its end, nineteen in one
/// window of a service whose windows sit on a grid. Never more than ten in any span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_span_of_a_window_holds_more_than_ten_requests_whatever_the_alignment() {
    for readings in rate_variants() {
        let (mock, g) = setup_with(readings).await;
        for nth in 1..=10 {
            mock.push_operator_fault_at(
                Endpoint::ShowLabels,
                nth,
                Fault::Delay(Duration::from_millis(300)),
            );
        }
        let csv = format!("qrcode\n{}\n", fleet(400).join("\n"));
        let out = csv_run(&g, "show", &csv);
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let got = statuses(&mock, Endpoint::ShowLabels);
        assert_eq!(got, vec![Some(200); 20], "{readings:?}");
        let at = received_at(&mock, Endpoint::ShowLabels);
        let most = max_in_any_span(&at, Duration::from_secs(WINDOW_SECS));
        assert!(
            most <= 10,
            "{readings:?}: {most} requests in {WINDOW_SECS} s"
        );
    }
}

/// Item 5: the resend after a 401 takes a slot of the window like any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resend_after_a_401_takes_a_slot_of_the_window() {
    for readings in rate_variants() {
        let (mock, g) = setup_with(readings).await;
        mock.push_operator_fault(
            Endpoint::ShowLabels,
            Fault::Status {
                status: 401,
                retry_after: None,
            },
        );
        let out = run(&g, &with_qrs(&["device", "show"], &fleet(220)));
        assert_eq!(code(&out), 0, "{readings:?}: {}", both(&out));
        let got = statuses(&mock, Endpoint::ShowLabels);
        assert!(!got.contains(&Some(429)), "{readings:?}: {got:?}");
        assert_eq!(got.len(), 12, "{readings:?}: {got:?}");
    }
}
