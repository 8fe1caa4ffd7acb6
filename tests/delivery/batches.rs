//! Batches: every capture delivered once and in order, a batch halved until the service
//! takes it, a capture the service never takes isolated as a dead letter, catch-up.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{eventually_async, mock_with as mock_on_own_runtime, Gateway};
use tapegate::record::Mac;
use tapegate_mock::{Fault, MacFault, MockConfig, MockHandle};

use super::support::*;

/// A trace is delivered exactly once, in capture order, and unknown tapes become dead
/// letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_is_delivered_exactly_once_and_in_capture_order() {
    let mock = start_mock().await;
    let shots = trace(240, 16, 4);
    let k = Knobs {
        max_batch: 100,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);

    let report = run_until_drained(&g).await;

    let requests = bulk_requests(&mock);
    assert!(
        requests
            .iter()
            .all(|r| r.status == Some(200) && r.fault.is_none()),
        "no faults were injected, every request is answered"
    );
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    assert_capture_order(&requests, &shots, true);
    let sent = tally(&requests);
    for s in &shots {
        assert_eq!(sent.get(&s.key()), Some(&1), "{:?} sent once", s.key());
    }
    assert_eq!(sent.len(), shots.len());

    let registered: Vec<&Shot> = shots.iter().filter(|s| s.registered()).collect();
    let unregistered = shots.len() - registered.len();
    assert_eq!(mock.decoded_items(), registered.len() as u64);
    assert_drained(&g.stats(), shots.len(), registered.len(), unregistered);
    let store = g.store();
    assert_eq!(store.count_pending_rows().unwrap(), 0);
    let flush = report.flush.expect("the flusher ran");
    assert_eq!(
        (flush.delivered, flush.dead_letters, flush.failures),
        (registered.len() as u64, unregistered as u64, 0)
    );

    // Unknown tapes: dead letters with the server's error text, every capture of them.
    let dead = store.dead_letters(10_000).unwrap();
    let dead_keys: HashSet<Key> = dead
        .iter()
        .map(|d| (d.mac.plain(), d.packet.clone()))
        .collect();
    let want: HashSet<Key> = shots
        .iter()
        .filter(|s| !s.registered())
        .map(Shot::key)
        .collect();
    assert_eq!(dead_keys, want);
    for d in &dead {
        assert_eq!(d.error, NOT_FOUND, "{d:?}");
    }

    // Readings: the latest capture of every known tape, decoded.
    let latest: HashMap<Mac, &Shot> = registered.iter().map(|s| (s.mac, *s)).collect();
    let tapes = store.tapes(10_000).unwrap();
    assert_eq!(tapes.len(), latest.len());
    for t in &tapes {
        let s = latest[&t.mac];
        assert_eq!(t.qr_code, Some(format!("TT{}", t.mac.plain())));
        assert_eq!(t.captured_at, s.ts_ms, "{t:?}");
        assert_eq!(t.temp, Some(s.temp()), "{t:?}");
        assert_eq!(t.bat, Some(f64::from(s.battery)), "{t:?}");
    }
    assert!(tapes.iter().any(|t| t.temp.is_some_and(|c| c < 0.0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_halves_the_batch_until_accepted_and_the_refused_size_is_never_sent_again() {
    let mock = start_mock().await;
    mock.set_max_items(100);
    let shots = trace(300, 0, 2);
    let k = Knobs {
        max_batch: 250,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);

    run_until_drained(&g).await;

    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    let sizes: Vec<(usize, Option<u16>)> =
        requests.iter().map(|r| (r.items.len(), r.status)).collect();
    assert_eq!(
        sizes[..3],
        [(250, Some(413)), (125, Some(413)), (62, Some(200))],
        "{sizes:?}"
    );
    for (n, r) in requests.iter().enumerate() {
        if r.status != Some(413) {
            continue;
        }
        let refused = r.items.len();
        assert_eq!(requests[n + 1].items.len(), refused / 2, "{sizes:?}");
        assert!(
            requests[n + 1..].iter().all(|l| l.items.len() < refused),
            "a request of {refused} or more items after a 413 for {refused}: {sizes:?}"
        );
    }
    assert!(requests[2..].iter().all(answered), "{sizes:?}");
    let delivered = tally(requests.iter().filter(|r| answered(r)));
    assert_eq!(delivered.len(), shots.len());
    assert!(delivered.values().all(|&n| n == 1));
    assert_capture_order(requests.iter().filter(|r| answered(r)), &shots, true);
}

/// A capture the service refuses whole batches for is isolated by halving while
/// captures keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_that_fails_whole_batches_is_isolated_by_halving() {
    let mock = start_mock().await;
    let poison = registered_mac(37);
    mock.set_poison(Some(&poison.plain()));
    let g = Gateway::new("");
    let k = Knobs {
        max_batch: 50,
        ..Knobs::default()
    };
    let mut live = Live::start(&mock, &g, &k).await;
    // 64 tapes are heard, the poisoned one only once; the others keep being heard
    // (a capture every 20 ms) until the poisoned capture is isolated, as at a busy dock.
    let (mut sent, later): (Vec<Shot>, Vec<Shot>) = trace(64, 0, 40)
        .into_iter()
        .filter(|s| s.mac != poison || s.ts_ms < T0_MS + 60_000)
        .partition(|s| s.ts_ms < T0_MS + 60_000);
    live.send(&sent);
    let refused_sizes = |mock: &MockHandle| -> Vec<usize> {
        bulk_requests(mock)
            .iter()
            .filter(|r| r.status == Some(400))
            .map(|r| r.items.len())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    for s in later {
        if stats_now(&g).is_some_and(|st| st.dead_letters > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the poisoned capture was not isolated within 5 s while captures kept coming; \
             refused batch sizes so far: {:?}",
            refused_sizes(&mock)
        );
        live.send(std::slice::from_ref(&s));
        sent.push(s);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    live.finish().await;

    assert_drained(&g.stats(), sent.len(), sent.len() - 1, 1);
    let poisoned = sent.iter().find(|s| s.mac == poison).unwrap();
    let dead = g.store().dead_letters(100).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].mac, dead[0].packet.clone(), dead[0].error.clone()),
        (
            poison,
            poisoned.packet(),
            format!("Invalid ble_packet for {}", poison.plain())
        )
    );

    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &sent);
    // Refused exactly the requests holding the poisoned capture, halved each time down
    // to that capture alone; a refused batch is never sent again whole.
    for r in &requests {
        let holds = r.items.iter().any(|i| i.mac_id == poison.plain());
        assert_eq!(holds, r.status == Some(400), "{:?}", r.status);
    }
    let refused = refused_sizes(&mock);
    assert_eq!(refused.first(), Some(&k.max_batch), "{refused:?}");
    assert_eq!(refused.last(), Some(&1), "{refused:?}");
    assert!(
        refused.windows(2).all(|w| w[1] <= w[0].div_ceil(2)),
        "{refused:?}"
    );
    // Everything else delivered exactly once, in capture order.
    let delivered = tally(requests.iter().filter(|r| answered(r)));
    for s in &sent {
        let want = if s.mac == poison { None } else { Some(&1) };
        assert_eq!(delivered.get(&s.key()), want, "{:?}", s.key());
    }
    assert_capture_order(requests.iter().filter(|r| answered(r)), &sent, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_missing_from_a_200_answer_are_retried_and_delivered_later() {
    let mock = start_mock().await;
    let shots = trace(20, 0, 1);
    let g = gateway(&mock, &shots, &Knobs::default());
    mock.push_fault(Fault::DropItems(3));
    // Then an answer without any item at all.
    mock.push_fault(Fault::DropItems(usize::MAX));

    let report = run_until_drained(&g).await;

    let requests = bulk_requests(&mock);
    let shape: Vec<(usize, usize, Option<u16>)> = requests
        .iter()
        .map(|r| (r.items.len(), r.decoded, r.status))
        .collect();
    assert_eq!(
        shape,
        [(20, 17, Some(200)), (3, 0, Some(200)), (3, 3, Some(200))]
    );
    let left_out: HashSet<Key> = requests[0].items[17..].iter().map(key_of).collect();
    assert_eq!(keys(&requests[1]), left_out);
    assert_eq!(keys(&requests[2]), left_out);
    assert_drained(&g.stats(), 20, 20, 0);
    assert_eq!(mock.decoded_items(), 20, "no capture decoded twice");
    assert_eq!(report.flush.expect("the flusher ran").dead_letters, 0);
}

/// A trace of `others` captures (tapes heard four times each) and one capture of a tape
/// heard only once, in round 0: the one the service will choke on.
fn trace_with_one_poisoned_capture(others: u32) -> (Vec<Shot>, Mac) {
    let tapes = others / 4;
    let poison = registered_mac(tapes);
    let shots = trace(tapes + 1, 0, 4)
        .into_iter()
        .filter(|s| s.mac != poison || s.ts_ms < T0_MS + 60_000)
        .collect();
    (shots, poison)
}

/// Runs a trace in which the service always fails requests holding one capture
/// (`fault`), and checks that it is isolated and kept as a dead letter whose error names
/// `cause`, while every other capture is delivered exactly once.
async fn assert_isolated_as_a_dead_letter(fault: MacFault, k: Knobs, cause: &str) {
    let mock = start_mock().await;
    let (shots, poison) = trace_with_one_poisoned_capture(2000);
    mock.set_mac_fault(&poison.plain(), Some(fault));
    let g = gateway(&mock, &shots, &k);

    // Each failure of a request that times out costs the request timeout (1 s here), and
    // a loaded test machine runs 2,000 captures slowly: more time than a plain drain.
    run_until_drained_within(&g, Duration::from_secs(120)).await;

    assert_drained(&g.stats(), shots.len(), shots.len() - 1, 1);
    let dead = g.store().dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].mac, poison);
    assert!(
        dead[0].error.contains(cause) && dead[0].error.contains("attempts on its own"),
        "{}",
        dead[0].error
    );
    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    let delivered = tally(requests.iter().filter(|r| answered(r)));
    for s in shots.iter().filter(|s| s.mac != poison) {
        assert_eq!(delivered.get(&s.key()), Some(&1), "{:?}", s.key());
    }
    assert_capture_order(requests.iter().filter(|r| answered(r)), &shots, true);
    // Bisected down to the capture alone, tried alone `max_attempts` times, no more.
    let holding: Vec<usize> = requests
        .iter()
        .filter(|r| r.items.iter().any(|i| i.mac_id == poison.plain()))
        .map(|r| r.items.len())
        .collect();
    let alone = holding.iter().filter(|&&n| n == 1).count();
    assert!(
        alone >= k.max_attempts as usize && holding.len() <= 30,
        "requests holding the poisoned capture: {holding:?}"
    );
}

/// A capture that always gets 500 is isolated and dead-lettered with its cause while
/// 2000 others are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_that_always_gets_500_is_isolated_as_a_dead_letter() {
    let k = Knobs {
        max_batch: 100,
        ..Knobs::default()
    };
    assert_isolated_as_a_dead_letter(MacFault::Status(500), k, "server error 500").await;
}

/// A capture that always times out is isolated and dead-lettered with its cause while
/// 2000 others are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_that_always_times_out_is_isolated_as_a_dead_letter() {
    let k = Knobs {
        max_batch: 32,
        request_timeout_secs: 1,
        max_attempts: 3,
        ..Knobs::default()
    };
    let fault = MacFault::Delay(Duration::from_secs(3));
    assert_isolated_as_a_dead_letter(fault, k, "timeout").await;
}

/// An item always left out of answers is a dead letter after the bound, and its tape's
/// later captures are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_always_left_out_of_answers_is_a_dead_letter_after_the_bound() {
    let mock = start_mock().await;
    let g = Gateway::new("");
    let k = Knobs::default();
    let mut live = Live::start(&mock, &g, &k).await;
    let shots = trace(40, 0, 3);
    let rounds: Vec<&[Shot]> = shots.chunks(40).collect();
    let left_out = registered_mac(7);
    mock.set_mac_fault(&left_out.plain(), Some(MacFault::LeaveOut));

    live.send(rounds[0]);
    eventually_async(Duration::from_secs(20), async || {
        stats_now(&g).is_some_and(|s| s.dead_letters == 1)
    })
    .await
    .expect("timed out waiting for the left-out capture to be a dead letter");
    mock.set_mac_fault(&left_out.plain(), None);
    live.send(rounds[1]);
    live.send(rounds[2]);
    live.finish().await;

    assert_drained(&g.stats(), 120, 119, 1);
    let dead = g.store().dead_letters(10).unwrap();
    assert_eq!(
        (dead[0].mac, dead[0].error.as_str()),
        (
            left_out,
            "the service left this capture out of 5 answers in a row"
        )
    );
    let requests = bulk_requests(&mock);
    let first = rounds[0].iter().find(|s| s.mac == left_out).unwrap().key();
    let tries = requests.iter().filter(|r| keys(r).contains(&first)).count();
    assert_eq!(tries, 5, "left out of exactly max_attempts answers");
    let delivered = tally(requests.iter().filter(|r| answered(r)));
    for s in rounds[1].iter().chain(rounds[2]) {
        assert_eq!(delivered.get(&s.key()), Some(&1), "{:?}", s.key());
    }
}

/// Items answered with only a `mac_id` are retried, never delivered with an empty
/// reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_answered_with_only_a_mac_id_are_retried() {
    let mock = start_mock().await;
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &Knobs::default()).await;
    let shots = trace(20, 0, 1);
    let bare = registered_mac(3);
    let key = shots.iter().find(|s| s.mac == bare).unwrap().key();
    mock.set_mac_fault(&bare.plain(), Some(MacFault::OnlyMacId));

    live.send(&shots);
    eventually_async(Duration::from_secs(20), async || {
        bulk_requests(&mock)
            .iter()
            .filter(|r| r.status == Some(200) && keys(r).contains(&key))
            .count()
            >= 2
    })
    .await
    .expect("timed out waiting for two answers with only its mac_id");
    // Not delivered meanwhile: the capture is still pending, no reading stored.
    let s = stats_now(&g).expect("stats");
    assert_eq!((s.pending, s.delivered), (1, 19), "{s:?}");
    assert!(g.store().tapes(100).unwrap().iter().all(|t| t.mac != bare));
    mock.set_mac_fault(&bare.plain(), None);
    live.finish().await;

    assert_drained(&g.stats(), 20, 20, 0);
    let tape = g.store().tapes(100).unwrap();
    let t = tape.iter().find(|t| t.mac == bare).expect("its reading");
    assert_eq!(t.qr_code, Some(format!("TT{}", bare.plain())));
    assert!(t.temp.is_some() && t.bat.is_some(), "{t:?}");
    assert_eq!(mock.decoded_items(), 20);
}

/// Forty tapes with a hundred pending captures each drain in seconds under live input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_tapes_of_a_hundred_pending_captures_drain_in_seconds() {
    let mock = start_mock().await;
    let g = Gateway::new("");
    // The default wait for a part-full batch: every batch here is part-full (40 MACs).
    let k = Knobs {
        max_delay_secs: 5.0,
        ..Knobs::default()
    };
    let mut live = Live::start(&mock, &g, &k).await;
    let shots = trace(40, 0, 150);
    let (backlog, fresh) = shots.split_at(40 * 100);
    tokio::task::block_in_place(|| live.send(backlog));
    eventually_async(Duration::from_secs(20), async || {
        stats_now(&g).is_some_and(|s| s.admitted >= backlog.len() as u64)
    })
    .await
    .expect("timed out waiting for the backlog committed");
    let started = Instant::now();
    // Live input keeps coming, a round every 50 ms, while the backlog drains.
    let mut rounds = fresh.chunks(40);
    while stats_now(&g).is_none_or(|s| s.delivered < backlog.len() as u64) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the backlog did not drain in 10 s: {:?}",
            stats_now(&g)
        );
        if let Some(round) = rounds.next() {
            live.send(round);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for round in rounds {
        live.send(round);
    }
    live.finish().await;
    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
    let requests = bulk_requests(&mock);
    assert_capture_order(requests.iter().filter(|r| answered(r)), &shots, true);
    assert!(mock.overlaps().is_empty());
}

/// Dead letters are logged at WARN once per tape, with its MAC and the service's
/// reason.
#[test]
fn dead_letters_are_logged_at_warn_once_per_tape() {
    let (_rt, mock) = mock_on_own_runtime(MockConfig::demo());
    // 5 known and 3 unknown tapes, 3 captures each: 9 dead letters of 3 tapes.
    let shots = trace(5, 3, 3);
    let g = gateway(&mock, &shots, &Knobs::default());
    let mut child = spawn_daemon(&g, &["run", "--until-drained"], "run.log", &[]);
    let status = wait_exit(&mut child, Duration::from_secs(30), &g, "run.log");
    assert!(status.success(), "{status:?}: {}", log_of(&g, "run.log"));
    assert_drained(&g.stats(), 24, 15, 9);

    let log = log_of(&g, "run.log");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("kept as a dead letter"))
        .collect();
    assert_eq!(lines.len(), 3, "one line per tape in the period:\n{log}");
    for i in 0..3 {
        let mac = unregistered_mac(i);
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("mac={mac}")))
            .unwrap_or_else(|| panic!("no line for {mac}:\n{log}"));
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains(NOT_FOUND), "{line}");
        // The message itself (what `journalctl -u tapegate` shows; the fields follow
        // it) names the tape and the service's reason.
        let message = line.split(" mac=").next().unwrap_or_default();
        assert!(
            message.contains(&mac.to_string()) && message.contains(NOT_FOUND),
            "the message names neither the MAC nor the reason: {line}"
        );
    }
}
