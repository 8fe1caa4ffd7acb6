//! The real binary killed or stopped while batches are in flight: nothing lost, order
//! kept, a stopped batch still pending.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{eventually, mock_with as mock_on_own_runtime};
use tapegate_mock::{Fault, MockConfig};

use super::support::*;

#[test]
fn kill_9_while_flushing_loses_nothing_and_resends_at_most_one_batch_per_kill() {
    let (_rt, mock) = mock_on_own_runtime(MockConfig::demo());
    let shots = trace(300, 0, 2);
    // One batch at a time: the bound is one resent batch per kill.
    let k = Knobs {
        max_batch: 50,
        request_timeout_secs: 30,
        max_in_flight: 1,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);
    let empty = g.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let limit = Duration::from_secs(20);

    let mut kills = 0;
    for life in 0..2 {
        // Three slow answers, then one the daemon is still waiting for when it dies.
        for _ in 0..3 {
            mock.push_fault(Fault::Delay(Duration::from_millis(200)));
        }
        mock.push_fault(Fault::Delay(Duration::from_secs(30)));
        let before = mock.decode_requests();
        let log = format!("life-{life}.log");
        let mut child = spawn_daemon(&g, &["run"], &log, &[]);
        if life == 0 {
            // Every capture committed first: this test is about delivery, not ingest.
            eventually(limit, || {
                stats_now(&g).is_some_and(|s| s.admitted == shots.len() as u64)
            })
            .expect("timed out waiting for the trace committed");
        }
        eventually(limit, || {
            mock.decode_requests() == before + 4 && mock.pending_faults() == 0
        })
        .expect("timed out waiting for a batch in flight");
        signal(&child, libc::SIGKILL);
        let status = wait_exit(&mut child, limit, &g, &log);
        assert_eq!(status.code(), None, "killed by a signal");
        kills += 1;
        let s = g.stats();
        assert!(
            s.delivered >= 150 * (life + 1) && s.pending > 0,
            "life {life} delivered three batches and died flushing: {s:?}"
        );
        // Later lives replay nothing: the trace was consumed.
        g.write_config(&delivery_config(&mock, &empty, &k));
    }

    let mut child = spawn_daemon(&g, &["run", "--until-drained"], "last.log", &[]);
    let status = wait_exit(&mut child, limit, &g, "last.log");
    assert!(status.success(), "{status:?}: {}", log_of(&g, "last.log"));

    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
    assert_eq!(g.store().count_pending_rows().unwrap(), 0);
    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    let decoded = tally(requests.iter().filter(|r| answered(r)));
    for s in &shots {
        assert!(decoded.contains_key(&s.key()), "{:?} lost", s.key());
    }
    let duplicates: usize = decoded.values().map(|n| n - 1).sum();
    assert!(
        duplicates <= kills * k.max_batch,
        "{duplicates} captures decoded twice after {kills} kills"
    );
}

/// SIGTERM during a slow flush exits 0 within the grace and keeps the batch in flight
/// pending.
#[test]
fn sigterm_during_a_slow_flush_exits_0_and_keeps_the_batch_pending() {
    let (_rt, mock) = mock_on_own_runtime(MockConfig::demo());
    let shots = trace(40, 0, 1);
    let k = Knobs {
        request_timeout_secs: 30,
        ..Knobs::default()
    };
    let g = gateway(&mock, &shots, &k);
    let grace = Duration::from_secs(1);
    // The answer takes far longer than the shutdown grace.
    mock.push_fault(Fault::Delay(Duration::from_secs(10)));
    let limit = Duration::from_secs(20);

    let mut child = spawn_daemon(
        &g,
        &["run"],
        "first.log",
        &[("TAPEGATE_GATEWAY__SHUTDOWN_GRACE_SECS", "1")],
    );
    eventually(limit, || {
        mock.decode_requests() == 1
            && stats_now(&g).is_some_and(|s| s.admitted == shots.len() as u64)
    })
    .expect("timed out waiting for the batch in flight");
    let asked = Instant::now();
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, limit, &g, "first.log");
    let took = asked.elapsed();
    assert!(status.success(), "{status:?}: {}", log_of(&g, "first.log"));
    assert!(
        took < grace + Duration::from_secs(3),
        "exited {took:?} after SIGTERM with a {grace:?} grace"
    );
    // The batch in flight was abandoned, not lost.
    let s = g.stats();
    assert_eq!((s.admitted, s.pending, s.delivered), (40, 40, 0), "{s:?}");

    let empty = g.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    g.write_config(&delivery_config(&mock, &empty, &k));
    let mut child = spawn_daemon(&g, &["run", "--until-drained"], "second.log", &[]);
    let status = wait_exit(&mut child, limit, &g, "second.log");
    assert!(status.success(), "{status:?}: {}", log_of(&g, "second.log"));
    assert_drained(&g.stats(), 40, 40, 0);
    let delivered = tally(bulk_requests(&mock).iter().filter(|r| answered(r)));
    let want: HashSet<Key> = shots.iter().map(Shot::key).collect();
    assert_eq!(delivered.keys().cloned().collect::<HashSet<_>>(), want);
}

/// With slow answers and kill -9 twice while 8 batches are in flight, nothing is lost,
/// order is kept and no MAC is in two batches at once.
#[test]
fn kill_9_twice_with_8_slow_batches_in_flight_loses_nothing() {
    let (_rt, mock, shots, k, g) = slow_backlog();
    let limit = Duration::from_secs(30);

    for life in 0..2 {
        let log = format!("life-{life}.log");
        let mut child = spawn_daemon(&g, &["run"], &log, &[]);
        // The window has grown to 8 (the state database says so) and 8 batches are in
        // flight.
        eventually(limit, || {
            mock.requests_in_progress() == 8
                && stats_now(&g).is_some_and(|s| s.flush_concurrency == Some(8))
        })
        .expect("timed out waiting for 8 batches in flight");
        signal(&child, libc::SIGKILL);
        let status = wait_exit(&mut child, limit, &g, &log);
        assert_eq!(status.code(), None, "killed by a signal");
        let s = g.stats();
        assert!(s.delivered > 0 && s.pending > 0, "life {life}: {s:?}");
        // `status` shows the limit and the batches in flight (as last recorded).
        let status = g.status_json();
        assert_eq!(status["concurrency_limit"], 8, "{status}");
        assert!(
            status["in_flight"].as_u64().is_some_and(|n| n >= 1),
            "{status}"
        );
        // The mock lets go of the dead daemon's requests before the next life starts.
        eventually(limit, || mock.requests_in_progress() == 0)
            .expect("timed out waiting for the killed requests dropped");
    }
    let mut child = spawn_daemon(&g, &["run", "--until-drained"], "last.log", &[]);
    let status = wait_exit(&mut child, Duration::from_secs(60), &g, "last.log");
    assert!(status.success(), "{status:?}: {}", log_of(&g, "last.log"));

    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
    assert_eq!(
        mock.overlaps(),
        Vec::<String>::new(),
        "a MAC in two batches in flight"
    );
    let requests = bulk_requests(&mock);
    assert_batches_well_formed(&requests, k.max_batch, &shots);
    assert_capture_order(&requests, &shots, false);
    let delivered = tally(requests.iter().filter(|r| r.status == Some(200)));
    for s in &shots {
        assert!(delivered.contains_key(&s.key()), "{:?} lost", s.key());
    }
    let duplicates: usize = delivered.values().map(|n| n - 1).sum();
    assert!(
        duplicates <= 2 * 8 * k.max_batch,
        "{duplicates} captures sent twice after two kills"
    );
    let status = g.status_json();
    assert_eq!(status["in_flight"], 0, "{status}");
}

/// SIGTERM with 8 batches in flight exits 0 within the grace and keeps them all
/// pending.
#[test]
fn sigterm_with_8_batches_in_flight_exits_0_and_keeps_them_pending() {
    let (_rt, mock, shots, _, g) = slow_backlog();
    let limit = Duration::from_secs(30);
    let mut child = spawn_daemon(
        &g,
        &["run"],
        "first.log",
        &[("TAPEGATE_GATEWAY__SHUTDOWN_GRACE_SECS", "1")],
    );
    eventually(limit, || {
        stats_now(&g).is_some_and(|s| s.flush_concurrency == Some(8))
    })
    .expect("timed out waiting for the window at 8");
    // From now on answers take far longer than the grace: 8 batches wait for theirs.
    mock.set_answer_delay(Some(Duration::from_secs(20)));
    let switched = std::time::SystemTime::now();
    let before = g.stats();
    eventually(limit, || {
        let slow = bulk_requests(&mock)
            .iter()
            .filter(|r| r.at >= switched)
            .count();
        slow >= 8 && mock.requests_in_progress() == 8
    })
    .expect("timed out waiting for 8 batches held");
    let asked = Instant::now();
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, limit, &g, "first.log");
    let took = asked.elapsed();
    assert!(status.success(), "{status:?}: {}", log_of(&g, "first.log"));
    assert!(
        took < Duration::from_secs(4),
        "exited {took:?} after SIGTERM, grace 1 s"
    );
    let log = log_of(&g, "first.log");
    assert!(log.contains("abandoned the batches in flight"), "{log}");
    // Abandoned, not lost: every capture is delivered or still pending.
    let s = g.stats();
    assert_eq!(s.delivered + s.pending, shots.len() as u64, "{s:?}");
    assert!(s.delivered >= before.delivered);

    mock.set_answer_delay(None);
    let mut child = spawn_daemon(&g, &["run", "--until-drained"], "second.log", &[]);
    let status = wait_exit(&mut child, Duration::from_secs(60), &g, "second.log");
    assert!(status.success(), "{status:?}: {}", log_of(&g, "second.log"));
    assert_drained(&g.stats(), shots.len(), shots.len(), 0);
}
