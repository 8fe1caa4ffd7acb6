//! Refusals and faults of the service (tokens, 4xx and 5xx, `Retry-After`, a database
//! that fails under delivery): nothing stalls, nothing spins, nothing is dead-lettered
//! that the service did not refuse, and health and logs say what delivery does.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{eventually, eventually_async, mock_with as mock_on_own_runtime, Gateway};
use tapegate::outbox::StateReader;
use tapegate::pipeline::{self, RunOptions};
use tapegate_mock::{
    self as mock, Fault, MockConfig, MockEnvironment, MockHandle, Received, Storm,
};

use super::support::*;

/// A fault storm loses nothing, resends only unanswered batches and honours
/// `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_storm_loses_nothing_and_resends_only_unanswered_batches() {
    let mock = start_mock().await;
    let shots = trace(150, 0, 3);
    // One batch at a time, so that "the request after a Retry-After answer" is the
    // one sent after it (concurrency has tests of its own).
    let k = Knobs {
        max_batch: 25,
        request_timeout_secs: 1,
        backoff_max_secs: 2,
        max_in_flight: 1,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);
    // Each kind of fault once, in front of the seeded storm (same mix, Retry-After 1).
    let status = |status, retry_after: &str| Fault::Status {
        status,
        retry_after: Some(retry_after.to_string()),
    };
    mock.push_fault(status(503, "2"));
    mock.push_fault(Fault::Delay(Duration::from_millis(1500)));
    mock.push_fault(Fault::Close);
    mock.push_fault(status(429, "1"));
    mock.set_storm(Some(Storm::new(0.3, 7)));

    // About 8 s alone; the limit only catches a hang. On 2 cores beside the suite's
    // daemons (kill -9 tests, 8 in flight) it once missed 40 s.
    let report = run_until_drained_within(&g, Duration::from_secs(120)).await;
    mock.set_storm(None);

    // Nothing lost.
    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
    assert_eq!(g.store().count_pending_rows().unwrap(), 0);
    assert_eq!(g.store().tapes(1000).unwrap().len(), 150);

    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    assert_capture_order(&requests, &shots, false);
    assert_capture_order(requests.iter().filter(|r| answered(r)), &shots, true);
    assert!(report.flush.expect("the flusher ran").failures >= 4);
    // A request whose client gave up is recorded as held, or not at all (the mock's
    // handler is dropped with the connection).
    let unrecorded = mock.decode_requests() - mock.received().len() as u64;
    let held = requests.iter().filter(|r| timed_out(r)).count() as u64;
    assert!(unrecorded + held >= 1, "a request timed out");

    // Every capture was answered exactly once, by its last request; before that it was
    // only in requests that failed (an error status, a closed connection, a timeout).
    let mut seen: HashMap<Key, Vec<&Received>> = HashMap::new();
    for r in &requests {
        for item in &r.items {
            seen.entry(key_of(item)).or_default().push(r);
        }
    }
    for s in &shots {
        let got = seen.get(&s.key()).map(Vec::as_slice).unwrap_or_default();
        let (last, earlier) = got
            .split_last()
            .unwrap_or_else(|| panic!("{:?} never answered", s.key()));
        assert!(
            answered(last),
            "{:?}: last request {:?}",
            s.key(),
            last.status
        );
        for r in earlier {
            assert!(
                !answered(r),
                "{:?} sent again after an answered request",
                s.key()
            );
        }
    }
    // The service decoded a capture twice only when the first answer was lost.
    let decoded_unanswered: usize = requests
        .iter()
        .filter(|r| r.status == Some(200) && timed_out(r))
        .map(|r| r.decoded)
        .sum();
    assert_eq!(
        mock.decoded_items(),
        (shots.len() + decoded_unanswered) as u64
    );

    // No request arrives sooner after a 429/503 with Retry-After: N than N seconds.
    let mut honoured = 0;
    for w in requests.windows(2) {
        if let Some(Fault::Status {
            status: 429 | 503,
            retry_after: Some(secs),
        }) = &w[0].fault
        {
            let asked = Duration::from_secs(secs.parse().unwrap());
            let gap = w[1].at.duration_since(w[0].at).unwrap_or_default();
            assert!(
                gap >= asked,
                "request after a Retry-After: {secs} answer came {gap:?} later"
            );
            honoured += 1;
        }
    }
    assert!(honoured >= 2, "{honoured} Retry-After answers checked");
}

/// Expired and revoked tokens are replaced between batches without a storm of grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_revoked_tokens_are_replaced_without_a_storm_of_grants() {
    let mock = start_mock().await;
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &Knobs::default()).await;
    let shots = trace(40, 0, 4);
    let rounds: Vec<&[Shot]> = shots.chunks(40).collect();
    let refused = |mock: &MockHandle| {
        bulk_requests(mock)
            .iter()
            .filter(|r| r.status == Some(401))
            .count()
    };
    let limit = Duration::from_secs(10);

    // 1. The first batch gets a token.
    live.send(rounds[0]);
    eventually_async(limit, async || mock.decoded_items() == 40)
        .await
        .expect("timed out waiting for round 0 delivered");
    assert_eq!((mock.token_grants(), refused(&mock)), (1, 0));

    // 2. The service forgets every token between batches: one 401, one new token, and
    // the same batch goes through.
    mock.revoke_all_tokens();
    live.send(rounds[1]);
    eventually_async(limit, async || mock.decoded_items() == 80)
        .await
        .expect("timed out waiting for round 1 delivered");
    assert_eq!((mock.token_grants(), refused(&mock)), (2, 1));

    // 3. Again, and tokens granted from now on live 2 s.
    assert!(mock.set_expires_in("ppe", 2));
    mock.revoke_all_tokens();
    live.send(rounds[2]);
    eventually_async(limit, async || mock.decoded_items() == 120)
        .await
        .expect("timed out waiting for round 2 delivered");
    assert_eq!((mock.token_grants(), refused(&mock)), (3, 2));

    // 4. Once that lifetime has passed (the service says so), the next batch gets a new
    // token before it is sent, not after a 401.
    eventually_async(limit, async || mock.live_tokens("ppe") == 0)
        .await
        .expect("timed out waiting for the token to expire");
    live.send(rounds[3]);
    eventually_async(limit, async || mock.decoded_items() == 160)
        .await
        .expect("timed out waiting for round 3 delivered");
    assert_eq!((mock.token_grants(), refused(&mock)), (4, 2));

    let report = live.finish().await;
    assert_eq!(report.flush.expect("the flusher ran").dead_letters, 0);
    assert_drained(&g.stats(), 160, 160, 0);
    assert_eq!(
        mock.token_requests(),
        mock.token_grants(),
        "no grant failed"
    );
    let requests = bulk_requests(&mock);
    assert!(requests.iter().all(|r| matches!(r.status, Some(200 | 401))));
    assert_eq!(tally(requests.iter().filter(|r| answered(r))).len(), 160);
}

/// A fresh token refused too is reported as credentials or permission, and nothing is
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_token_refused_too_is_reported_as_credentials_or_permission() {
    // Tokens come from the "prod" token endpoint while decoding goes to "ppe": spec 5.6,
    // a token from one environment is rejected by the other, however fresh.
    let mock = mock::start(MockConfig {
        environments: vec![MockEnvironment::demo(), MockEnvironment::named("prod")],
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts");
    let shots = trace(10, 0, 1);
    let k = Knobs {
        token_env: "prod",
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);
    let config = load(&g);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(pipeline::run(
        config.clone(),
        async {
            let _ = stopped.await;
        },
        RunOptions::default(),
    ));

    eventually_async(Duration::from_secs(10), async || {
        mock.decode_requests() >= 4 && stats_now(&g).is_some_and(|s| s.last_error.is_some())
    })
    .await
    .expect("timed out waiting for refused twice and reported");
    stop.send(()).unwrap();
    let report = tokio::time::timeout(RUN_LIMIT, run)
        .await
        .expect("the daemon stops")
        .unwrap()
        .expect("the daemon runs");

    let mut out = Vec::new();
    tapegate::cmd::status::status(&config, &tapegate::clock::SystemClock, true, &mut out).unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let last_error = status["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("credentials or permission"), "{status}");
    assert_eq!(
        (
            &status["pending"],
            &status["delivered"],
            &status["dead_letters"]
        ),
        (&10.into(), &0.into(), &0.into()),
        "{status}"
    );
    assert_eq!(report.flush.expect("the flusher ran").dead_letters, 0);

    // Each attempt: the cached token refused, one new token, refused again; then back
    // off. At most one grant per attempt (plus the first).
    let requests = bulk_requests(&mock);
    assert!(requests.iter().all(|r| r.status == Some(401)));
    assert_eq!(requests.len() % 2, 0, "attempts come in pairs");
    assert!(
        mock.token_grants() <= requests.len() as u64 / 2 + 1,
        "{} grants for {} refused requests",
        mock.token_grants(),
        requests.len()
    );
}

/// A service refusing every request is backed off, not dead-lettered capture by
/// capture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_refusing_every_request_is_backed_off_not_dead_lettered() {
    let mock = start_mock().await;
    // Every request is refused whole, whatever it holds.
    fail_every_request(
        &mock,
        Fault::Status {
            status: 400,
            retry_after: None,
        },
    );
    let shots = trace(40, 0, 1);
    let k = Knobs {
        max_batch: 8,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);
    let daemon = Running::start(&g);
    eventually_async(Duration::from_secs(20), async || {
        reports(&g, "refuses the request") && mock.decode_requests() >= 10
    })
    .await
    .expect("timed out waiting for the refusal to be reported");
    // Splitting found no half the service takes: no capture is blamed, all are kept.
    let s = stats_now(&g).expect("stats");
    assert_eq!(
        (s.dead_letters, s.pending),
        (0, shots.len() as u64),
        "{s:?}"
    );

    // The service heals: what was kept is delivered.
    mock.set_storm(None);
    eventually_async(Duration::from_secs(20), async || {
        stats_now(&g).is_some_and(|s| s.pending == 0)
    })
    .await
    .expect("timed out waiting for the kept captures to be delivered");
    daemon.stop(RUN_LIMIT).await;
    let s = g.stats();
    assert_eq!((s.delivered, s.dead_letters), (shots.len() as u64, 0));
}

/// A failing database write under delivery records the answer again and sends nothing
/// more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_database_write_records_the_answer_again_and_sends_nothing() {
    let mock = start_mock().await;
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &Knobs::default()).await;
    eventually_async(Duration::from_secs(10), async || stats_now(&g).is_some())
        .await
        .expect("timed out waiting for the outbox exists");
    // A real write failure of the real file: every transaction that would take a row
    // out of `pending` is aborted (as a full disk or an I/O error aborts it); admitting
    // captures still works.
    let db = rusqlite::Connection::open(StateReader::path_in(&g.state_dir())).unwrap();
    db.execute_batch(
        "CREATE TRIGGER fail_settle BEFORE DELETE ON pending BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END;",
    )
    .unwrap();
    let shots = trace(40, 0, 1);
    live.send(&shots);

    // The answer cannot be recorded: the flusher backs off and tries to record it
    // again, each time noting the error, and sends nothing meanwhile.
    let mut noted = HashSet::new();
    eventually_async(Duration::from_secs(20), async || {
        if let Some(s) = stats_now(&g) {
            if s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("could not record"))
            {
                noted.extend(s.last_error_at);
            }
        }
        noted.len() >= 3
    })
    .await
    .expect("timed out waiting for three failed recordings");
    let requests = mock.decode_requests();
    assert!(
        requests <= 2,
        "{requests} requests for 40 captures while their answer could not be recorded"
    );
    assert_eq!(stats_now(&g).unwrap().delivered, 0);

    db.execute_batch("DROP TRIGGER fail_settle;").unwrap();
    live.finish().await;
    assert_drained(&g.stats(), 40, 40, 0);
    assert_eq!(mock.decode_requests(), requests, "recorded, not sent again");
    assert_eq!(mock.decoded_items(), 40, "no capture decoded twice");
}

/// A "missing required headers" 400 on every request backs off and dead-letters
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_headers_400_on_every_request_dead_letters_nothing() {
    let mock = start_mock().await;
    fail_every_request(
        &mock,
        Fault::Refuse {
            status: 400,
            message: "Missing required headers: customer_id or authorized_groups".into(),
        },
    );
    let g = gateway(&mock, &trace(40, 0, 1), &Knobs::default());
    let daemon = Running::start(&g);
    eventually_async(Duration::from_secs(20), async || {
        mock.decode_requests() >= 5 && reports(&g, "refuses the request")
    })
    .await
    .expect("timed out waiting for several refusals, reported");
    let s = stats_now(&g).expect("stats");
    assert_eq!((s.dead_letters, s.pending), (0, 40), "{s:?}");
    let text = daemon.status(false);
    assert!(text.contains("Missing required headers"), "{text}");

    // The proxy is fixed: everything is delivered.
    mock.set_storm(None);
    eventually_async(Duration::from_secs(20), async || {
        stats_now(&g).is_some_and(|s| s.pending == 0)
    })
    .await
    .expect("timed out waiting for the captures to be delivered");
    daemon.stop(RUN_LIMIT).await;
    assert_drained(&g.stats(), 40, 40, 0);
}

/// A `Retry-After` of 600 s is honoured past `backoff_max`, and status and metrics say
/// until when.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_of_600_s_is_honoured_past_backoff_max() {
    // "Until when" is told by the daemon's clock.
    let day = crate::common::day::Day::one();
    let g = Gateway::new("");
    let clock = day.shared_clock(&g);
    let mock = start_mock().await;
    mock.push_fault(Fault::Status {
        status: 503,
        retry_after: Some("600".into()),
    });
    let http = free_http_addr();
    let k = Knobs {
        backoff_max_secs: 5,
        max_in_flight: 1,
        http: Some(http),
        clock: Some(clock),
        ..Knobs::default()
    };
    let mut live = Live::start(&mock, &g, &k).await;
    live.send(&trace(10, 0, 1));
    eventually_async(Duration::from_secs(10), async || {
        stats_now(&g).is_some_and(|s| s.last_error.is_some())
    })
    .await
    .expect("timed out waiting for the 503 to be reported");
    let error = stats_now(&g).and_then(|s| s.last_error).unwrap();
    // "server error 503 until 2026-…Z (the service's Retry-After)"
    let until_at: jiff::Timestamp = error
        .split_once(" until ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no time in {error:?}"));
    let wait = until_at.as_second() - day.now().as_second();
    assert!((590..=600).contains(&wait), "{error:?}: waits {wait} s");
    assert!(error.contains("Retry-After"), "{error}");
    // The metrics say the same, for alerting.
    let (_, metrics) = http_get(http, "/metrics").await.expect("/metrics answers");
    let paused: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tapegate_delivery_paused_until_timestamp_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no pause in\n{metrics}"));
    let ahead = paused as i64 - day.now().as_second();
    assert!((590..=600).contains(&ahead), "paused {ahead} s ahead");
    // Captures committed inside the pause wake the flusher and are not sent. (That the
    // pause lasts its 600 s past backoff_max is timing logic, checked with time passed
    // in: flush::plan::tests::pause::retry_after_is_honoured_beyond_backoff_max and
    // api::pause::tests.)
    live.send(&trace(20, 0, 2)[20..]);
    eventually_async(Duration::from_secs(10), async || {
        stats_now(&g).is_some_and(|s| s.admitted == 30)
    })
    .await
    .expect("timed out waiting for the new captures committed");
    assert_eq!(mock.decode_requests(), 1);
    assert_eq!(stats_now(&g).unwrap().pending, 30);
    // A pause does not hold up shutdown.
    live.stop(Duration::from_secs(5)).await;
    assert_eq!(mock.decode_requests(), 1);
    assert_eq!(g.stats().pending, 30);
}

/// In a fault storm with 8 batches in flight, nothing is sent inside a `Retry-After`
/// once it is read.
///
/// The storm of issue 19: 30 % of decode requests fail (503 and 429 with `Retry-After:
/// 2`, 500, a closed connection, an answer held 1.5 s), batches of 100, up to 8 in
/// flight. The client's decode gate logs each request it puts on the wire and each
/// answer it reads that asks for a pause, numbered in one sequence: no request numbered
/// after a pause may go before the pause ends. That is exact (no timing slack): both
/// events are taken under one lock, in the process that sends.
#[test]
fn with_8_batches_in_flight_nothing_is_sent_inside_a_retry_after() {
    let (_rt, mock) = mock_on_own_runtime(MockConfig::demo());
    let status = |status, retry_after: Option<&str>| Fault::Status {
        status,
        retry_after: retry_after.map(str::to_string),
    };
    mock.set_storm(Some(Storm {
        probability: 0.3,
        seed: 19,
        mix: vec![
            status(503, Some("2")),
            status(500, None),
            status(429, Some("2")),
            Fault::Close,
            Fault::Delay(Duration::from_millis(1500)),
        ],
    }));
    let shots = trace(500, 0, 8);
    let k = Knobs {
        max_batch: 100,
        max_in_flight: 8,
        request_timeout_secs: 10,
        backoff_max_secs: 2,
        ..Knobs::default()
    };
    let g = backlog_gateway(&mock, &shots, &k);
    let mut child = spawn_daemon(
        &g,
        &["run", "--until-drained"],
        "storm.log",
        &[("RUST_LOG", "info,tapegate::api::pause=trace")],
    );
    let status = wait_exit(&mut child, Duration::from_secs(120), &g, "storm.log");
    mock.set_storm(None);
    let log = log_of(&g, "storm.log");
    assert!(status.success(), "{status:?}: {log}");
    assert_drained(&g.stats(), shots.len(), shots.len(), 0);

    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    assert_capture_order(requests.iter().filter(|r| answered(r)), &shots, true);
    let (wires, pauses) = gate_events(&log);
    // Every request the service received went through the gate.
    let wired: HashSet<&str> = wires.iter().map(|w| w.correlation_id.as_str()).collect();
    for r in &requests {
        let id = r.correlation_id.as_deref().unwrap_or("");
        assert!(wired.contains(id), "{id} reached the service past the gate");
    }
    assert!(wires.len() as u64 >= mock.decode_requests());
    let inside = sent_inside_a_pause(&wires, &pauses);
    let asked = requests
        .iter()
        .filter(|r| {
            matches!(
                &r.fault,
                Some(Fault::Status {
                    retry_after: Some(_),
                    ..
                })
            )
        })
        .count();
    println!(
        "fault storm: {} captures, {} requests ({} answered with Retry-After: 2), {} pauses read; requests sent inside a Retry-After window after it was read: {}",
        shots.len(),
        wires.len(),
        asked,
        pauses.len(),
        inside.len()
    );
    assert!(
        pauses.len() >= 3,
        "{} pauses: the storm asked for too few",
        pauses.len()
    );
    assert!(
        inside.is_empty(),
        "{} requests sent inside a pause they came after, e.g. {:?}",
        inside.len(),
        &inside[..inside.len().min(3)]
    );
}

/// Every request refused turns `/healthz` 503 whatever the words, and 200 once delivery
/// resumes.
///
/// Issue 20: with every request refused (400) the gateway delivers nothing, and
/// `/healthz` says so whatever words the refusal carries: a proxy's "Bad Request" as
/// much as the spec's "Missing required headers". Health follows what the flusher
/// decides (it backs off), not the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_refused_turns_healthz_503_whatever_the_words() {
    for message in [
        "Bad Request",
        "Missing required headers: customer_id or authorized_groups",
    ] {
        let mock = start_mock().await;
        fail_every_request(
            &mock,
            Fault::Refuse {
                status: 400,
                message: message.into(),
            },
        );
        let http = free_http_addr();
        let k = Knobs {
            http: Some(http),
            ..Knobs::default()
        };
        let g = gateway(&mock, &trace(40, 0, 1), &k);
        let daemon = Running::start(&g);
        let limit = Duration::from_secs(20);
        let deadline = Instant::now() + limit;
        let body = loop {
            if let Some((503, body)) = http_get(http, "/healthz").await {
                break body;
            }
            assert!(
                Instant::now() < deadline,
                "{message}: /healthz never turned 503 ({} requests refused)",
                mock.decode_requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            body.contains("flush") && body.contains("http_400"),
            "{message}: {body}"
        );
        let s = stats_now(&g).unwrap();
        assert_eq!(
            (s.delivered, s.dead_letters, s.pending),
            (0, 0, 40),
            "{message}"
        );

        mock.set_storm(None);
        let deadline = Instant::now() + limit;
        loop {
            let healthy = matches!(http_get(http, "/healthz").await, Some((200, _)));
            if healthy && stats_now(&g).is_some_and(|s| s.pending == 0) {
                break;
            }
            assert!(Instant::now() < deadline, "{message}: never healthy again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon.stop(RUN_LIMIT).await;
        assert_drained(&g.stats(), 40, 40, 0);
    }
}

/// A delivery error that cannot be recorded is logged once, then once with the count
/// when it can.
///
/// Issue 20: while the delivery error cannot be written (the disk is full: every write
/// to the state database's `meta` table fails), "could not record the delivery error"
/// is logged once, and once more, with the count, when it can be again: not at every
/// backoff.
#[test]
fn a_delivery_error_that_cannot_be_recorded_is_logged_once() {
    let (_rt, mock) = mock_on_own_runtime(MockConfig::demo());
    let k = Knobs {
        max_in_flight: 1,
        backoff_max_secs: 1,
        ..Knobs::default()
    };
    let g = backlog_gateway(&mock, &trace(20, 0, 1), &k);
    fail_every_request(
        &mock,
        Fault::Status {
            status: 503,
            retry_after: None,
        },
    );
    let limit = Duration::from_secs(20);
    let mut child = spawn_daemon(&g, &["run"], "full.log", &[]);
    eventually(limit, || {
        stats_now(&g).is_some_and(|s| s.last_error.is_some())
    })
    .expect("timed out waiting for the first failure recorded");
    let db = rusqlite::Connection::open(StateReader::path_in(&g.state_dir())).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER full_insert BEFORE INSERT ON meta BEGIN SELECT RAISE(ABORT, 'database or disk is full (injected)'); END;
         CREATE TRIGGER full_update BEFORE UPDATE ON meta BEGIN SELECT RAISE(ABORT, 'database or disk is full (injected)'); END;",
    )
    .unwrap();
    let before = mock.decode_requests();
    eventually(limit, || mock.decode_requests() >= before + 5)
        .expect("timed out waiting for five more failures while full");
    db.execute_batch("DROP TRIGGER full_insert; DROP TRIGGER full_update;")
        .unwrap();
    let noted = stats_now(&g).and_then(|s| s.last_error_at);
    eventually(limit, || {
        stats_now(&g).is_some_and(|s| s.last_error_at > noted)
    })
    .expect("timed out waiting for a failure recorded again");
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, limit, &g, "full.log");
    assert!(status.success(), "{status:?}");
    let log = log_of(&g, "full.log");
    let failed = log
        .lines()
        .filter(|l| l.contains("could not record the delivery error"))
        .count();
    assert_eq!(failed, 1, "logged once while it lasted:\n{log}");
    let again = log
        .lines()
        .find(|l| l.contains("the delivery error is recorded for status again"))
        .unwrap_or_else(|| panic!("its end is logged:\n{log}"));
    let count: u64 = field(again, "failed")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("with the count: {again}"));
    assert!(count >= 4, "{again}");
}
