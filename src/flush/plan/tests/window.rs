//! The concurrency window: grown by one on fast clean answers (past 8 only on a slow
//! uplink, never wider than the tapes that fill it), halved once per round of failures.

use super::*;

#[test]
fn the_window_grows_by_one_on_fast_clean_answers_up_to_max_in_flight() {
    let mut p = Planner::new(FlushSettings {
        max_in_flight: 3,
        ..settings()
    });
    let pending = rows(0..400, 100);
    let mut t = Instant::now();
    assert_eq!(p.window(), 1);
    for want in [2, 3, 3] {
        let b = sent(fetch_and_offer(&mut p, &pending, t));
        // Every batch the window allows is sent (it is in use), then all answer.
        let mut batches = vec![b];
        while let Step::Send(b) = fetch_and_offer(&mut p, &pending, t) {
            batches.push(b);
        }
        t += Duration::from_millis(100);
        for b in batches {
            let res = p.answered(b.id, all_ok(&b), t, 1.0);
            p.recorded(&res.settle);
        }
        assert_eq!(p.window(), want);
    }
}

/// A planner with the shipped `flush.max_in_flight` (batches of 4), and that max.
fn at_shipped_max() -> (Planner, usize) {
    let max = crate::config::DEFAULTS.flush.max_in_flight as usize;
    let p = Planner::new(FlushSettings {
        max_in_flight: max,
        ..settings()
    });
    (p, max)
}

/// Catch-up over a slow uplink: with the shipped settings, answers that take
/// 200 ms every time but are clean grow the window past 8 (8 x 250 captures per 0.2 s is
/// 10,000/s; 15,000/s needs 12) up to `flush.max_in_flight`, never a MAC in two batches
/// at once; one round of 503s still halves it.
#[test]
fn slow_clean_answers_grow_the_window_and_trouble_halves_it() {
    let (mut p, max) = at_shipped_max();
    let pending = rows(0..2_000, 200);
    let mut t = Instant::now();
    for _ in 0..2 * max {
        let mut batches: Vec<Batch> = Vec::new();
        while let Step::Send(b) = fetch_and_offer(&mut p, &pending, t) {
            batches.push(b);
        }
        let macs: Vec<Mac> = batches
            .iter()
            .flat_map(|b| b.rows.iter().map(|r| r.capture.mac))
            .collect();
        let distinct: HashSet<&Mac> = macs.iter().collect();
        assert_eq!(distinct.len(), macs.len(), "a MAC in two batches in flight");
        t += Duration::from_millis(200);
        for b in batches {
            let res = p.answered(b.id, all_ok(&b), t, 1.0);
            p.recorded(&res.settle);
        }
    }
    assert!(
        max >= 12,
        "the shipped max_in_flight ({max}) caps 0.2 s answers below 15,000/s"
    );
    assert_eq!(
        p.window(),
        max,
        "slow but clean answers grow the window to its max"
    );
    let batches: Vec<Batch> = (0..max)
        .map(|_| sent(fetch_and_offer(&mut p, &pending, t)))
        .collect();
    t += Duration::from_millis(200);
    for b in &batches {
        p.answered(b.id, retry("server error 503", None), t, 1.0);
    }
    assert_eq!(p.window(), max / 2, "a round of 503s halves it once");
}

/// The window after `rounds` answers over a link of `link` latency to a gateway (or a
/// service) that gets through one answer per `each`, first in first out: an answer is
/// carried out `link` after its batch was sent, or `each` after the one before, the
/// later; a batch is sent whenever the window has room.
fn window_over(link: Duration, each: Duration, rounds: usize) -> usize {
    let (mut p, _) = at_shipped_max();
    let pending = rows(0..2_000, 200);
    let mut t = Instant::now();
    let mut last = t;
    let mut queue: std::collections::VecDeque<(Batch, Instant)> = Default::default();
    for _ in 0..rounds {
        while let Step::Send(b) = fetch_and_offer(&mut p, &pending, t) {
            last = (t + link).max(last + each);
            queue.push_back((b, last));
        }
        let (b, at) = queue.pop_front().expect("a batch in flight");
        t = at;
        let res = p.answered(b.id, all_ok(&b), t, 1.0);
        p.recorded(&res.settle);
    }
    p.window()
}

/// Answers that take longer the more batches are in flight (10 ms a batch: a gateway
/// whose CPU parses and settles them one after another, or a service that queues them)
/// are slow, but not from the link: a wider window only queues more batches in memory.
/// The window stops at 8, where answers slow to 50 ms and more come from the queue.
#[test]
fn answers_slowed_by_a_queue_of_batches_do_not_grow_the_window_past_8() {
    let w = window_over(Duration::ZERO, Duration::from_millis(10), 3_000);
    assert_eq!(w, 8, "latency that grows with the window is a queue");
}

/// A slow link to a gateway with a ceiling of its own (200 ms away, 10 ms a batch, as
/// a slow ARM core might): the window grows past 8 to about what keeps that pace (20
/// batches in 200 ms) and stops short of the max, where more would only wait.
#[test]
fn over_a_slow_link_the_window_grows_to_the_gateways_own_pace_and_no_further() {
    let w = window_over(Duration::from_millis(200), Duration::from_millis(10), 3_000);
    assert!(
        (18..=24).contains(&w),
        "window {w}: 200 ms / 10 ms is 20 batches"
    );
    let w = window_over(Duration::from_millis(200), Duration::from_millis(1), 3_000);
    let (_, max) = at_shipped_max();
    assert_eq!(
        w, max,
        "a gateway with room to spare is held back only by the max"
    );
}

/// A window is only as wide as the tapes free to fill its batches: with 10 tapes and
/// batches of 4, the third batch of a round is a part (2 tapes), and no wider window
/// would send anything but smaller batches.
#[test]
fn the_window_grows_no_wider_than_the_tapes_that_fill_its_batches() {
    let mut p = Planner::new(FlushSettings {
        max_in_flight: 32,
        ..settings()
    });
    let pending = rows(0..400, 10);
    let mut t = Instant::now();
    for _ in 0..20 {
        let mut batches: Vec<Batch> = Vec::new();
        while let Step::Send(b) = fetch_and_offer(&mut p, &pending, t) {
            batches.push(b);
        }
        t += Duration::from_millis(100);
        for b in batches {
            let res = p.answered(b.id, all_ok(&b), t, 1.0);
            p.recorded(&res.settle);
        }
    }
    assert_eq!(p.window(), 3, "two full batches and a part");
}

/// Fast answers (a near service) need no more than 8 batches in flight: the window
/// stays there however high `max_in_flight` is.
#[test]
fn fast_answers_grow_the_window_to_8_and_no_further() {
    let mut p = Planner::new(FlushSettings {
        max_in_flight: 32,
        ..settings()
    });
    let pending = rows(0..2_000, 200);
    let mut t = Instant::now();
    for _ in 0..40 {
        let mut batches: Vec<Batch> = Vec::new();
        while let Step::Send(b) = fetch_and_offer(&mut p, &pending, t) {
            batches.push(b);
        }
        t += Duration::from_millis(5);
        for b in batches {
            let res = p.answered(b.id, all_ok(&b), t, 1.0);
            p.recorded(&res.settle);
        }
    }
    assert_eq!(p.window(), 8);
}

#[test]
fn a_slow_answer_does_not_grow_the_window() {
    let mut p = Planner::new(settings());
    let pending = rows(0..400, 100);
    let mut t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    t += Duration::from_millis(100);
    p.answered(b.id, all_ok(&b), t, 1.0);
    assert_eq!(p.window(), 2);
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    t += Duration::from_secs(3);
    p.answered(b.id, all_ok(&b), t, 1.0);
    assert_eq!(
        p.window(),
        2,
        "thirty times slower than usual is no reason for more"
    );
}

#[test]
fn the_window_halves_on_a_503_429_or_timeout_once_per_round() {
    for cause in ["server error 503", "rate limited", "timeout"] {
        let mut p = Planner::new(settings());
        p.window.size = 8;
        let pending = rows(0..400, 100);
        let t = Instant::now();
        let batches: Vec<Batch> = (0..8)
            .map(|_| sent(fetch_and_offer(&mut p, &pending, t)))
            .collect();
        let t1 = t + Duration::from_millis(50);
        for b in &batches {
            p.answered(b.id, retry(cause, None), t1, 1.0);
        }
        assert_eq!(
            p.window(),
            4,
            "{cause}: eight failures of one round halve once"
        );
        // A batch sent after the decrease that fails again halves again.
        let t2 = p.paused_until(t1).expect("paused");
        let b = sent(fetch_and_offer(&mut p, &pending, t2));
        p.answered(b.id, retry(cause, None), t2, 1.0);
        assert_eq!(p.window(), 2, "{cause}");
    }
}
