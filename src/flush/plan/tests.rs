//! One test per rule of the planner's module doc, time passed in; and a property test
//! of per-MAC order under any interleaving of answers, against a simple model.

use super::*;
use crate::flush::answer::Action;
use crate::outbox::Reading;
use crate::record::Capture;

fn settings() -> FlushSettings {
    FlushSettings {
        max_batch: 4,
        max_delay: Duration::from_secs(5),
        backoff_initial: Duration::from_millis(500),
        backoff_max: Duration::from_secs(5),
        max_in_flight: 8,
        max_attempts: 3,
    }
}

fn mac(i: u8) -> Mac {
    Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
}

fn row(id: i64, m: u8) -> PendingCapture {
    PendingCapture {
        id,
        capture: Capture {
            mac: mac(m),
            ts_ms: id,
            product_id: "tape".into(),
            packet: format!("{id:02X}"),
            rssi: None,
            boot_ms: None,
        },
    }
}

/// Rows `ids` of MACs `id % macs`.
fn rows(ids: std::ops::Range<i64>, macs: i64) -> Vec<PendingCapture> {
    ids.map(|i| row(i, (i % macs) as u8)).collect()
}

fn fetched(rows: Vec<PendingCapture>, complete: bool, backlog: bool) -> Fetched {
    Fetched {
        rows,
        complete,
        backlog,
    }
}

fn delivered() -> Outcome {
    Outcome::Delivered(Reading {
        qr_code: Some("QR".into()),
        temp: None,
        bat: None,
    })
}

/// Every row of `b` decoded.
fn all_ok(b: &Batch) -> Action {
    Action::Settle((0..b.rows.len()).map(|i| (i, delivered())).collect())
}

fn retry(cause: &str, retry_after: Option<Duration>) -> Action {
    Action::Retry {
        cause: cause.into(),
        label: "http_5xx",
        retry_after,
        isolate: true,
    }
}

fn sent(step: Step) -> Batch {
    match step {
        Step::Send(b) => b,
        other => panic!("expected a batch to send, got {other:?}"),
    }
}

/// Fetches (as the outbox would) from `pending` and offers what it finds; claims a
/// queued part's rows that are still in `pending` and launches them.
fn fetch_and_offer(p: &mut Planner, pending: &[PendingCapture], now: Instant) -> Step {
    loop {
        match p.next(now) {
            Step::Fetch { max } => {
                let f = fetch(pending, p.busy(), max);
                return p.offer(f, false, now);
            }
            Step::Claim(part) => {
                let present: Vec<i64> = part
                    .ids()
                    .into_iter()
                    .filter(|id| pending.iter().any(|r| r.id == *id))
                    .collect();
                if let Some(b) = p.claimed(part, &present, now) {
                    return Step::Send(b);
                }
            }
            other => return other,
        }
    }
}

/// The next step, which must be a queued part sent whole.
fn next_sent(p: &mut Planner, now: Instant) -> Batch {
    match p.next(now) {
        Step::Claim(part) => {
            let ids = part.ids();
            p.claimed(part, &ids, now).expect("a batch to send")
        }
        other => panic!("expected a queued part to send, got {other:?}"),
    }
}

/// The outbox's `next_batch_excluding` over a list.
fn fetch(pending: &[PendingCapture], busy: &HashSet<Mac>, max: usize) -> Fetched {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut backlog = false;
    for r in pending {
        if busy.contains(&r.capture.mac) {
            continue;
        }
        if seen.insert(r.capture.mac) {
            if out.len() == max {
                return fetched(out, false, backlog);
            }
            out.push(r.clone());
        } else {
            backlog = true;
        }
    }
    fetched(out, true, backlog)
}

fn ids(b: &Batch) -> Vec<i64> {
    b.rows.iter().map(|r| r.id).collect()
}

#[test]
fn batches_in_flight_never_share_a_mac() {
    let mut p = Planner::new(settings());
    p.window.size = 8;
    let pending = rows(0..40, 10);
    let t = Instant::now();
    let a = sent(fetch_and_offer(&mut p, &pending, t));
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    assert_eq!(ids(&a), [0, 1, 2, 3]);
    assert_eq!(ids(&b), [4, 5, 6, 7]);
    let c = sent(fetch_and_offer(&mut p, &pending, t));
    assert_eq!(
        ids(&c),
        [8, 9],
        "only two MACs are free; they are all there is"
    );
    // Every MAC is busy now, and that fetch saw every row: nothing more to fetch until
    // an answer or a commit.
    assert_eq!(
        p.next(t),
        Step::Wait(Some(t + EXHAUSTED_RECHECK)),
        "no fetch"
    );
    assert_eq!(p.in_flight(), 3);
    p.committed();
    assert_eq!(p.next(t), Step::Fetch { max: 4 });
    p.answered(a.id, all_ok(&a), t, 1.0);
    assert_eq!(p.next(t), Step::Fetch { max: 4 }, "an answer frees MACs");
}

#[test]
fn a_part_full_batch_waits_up_to_max_delay() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let pending = rows(0..2, 10);
    let due = t + Duration::from_secs(5);
    assert_eq!(fetch_and_offer(&mut p, &pending, t), Step::Wait(Some(due)));
    let later = t + Duration::from_secs(2);
    assert_eq!(
        fetch_and_offer(&mut p, &pending, later),
        Step::Wait(Some(due)),
        "the delay runs from when it was first seen"
    );
    let b = sent(fetch_and_offer(&mut p, &pending, due));
    assert_eq!(ids(&b), [0, 1]);
}

#[test]
fn a_batch_holding_every_pending_mac_with_more_behind_goes_at_once() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    // Two tapes, five captures each: the batch cannot get fuller by waiting.
    let b = sent(fetch_and_offer(&mut p, &rows(0..10, 2), t));
    assert_eq!(ids(&b), [0, 1]);
}

#[test]
fn once_ingest_has_ended_a_part_full_batch_goes_at_once() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let Step::Fetch { max } = p.next(t) else {
        panic!()
    };
    let f = fetch(&rows(0..1, 10), p.busy(), max);
    assert!(matches!(p.offer(f, true, t), Step::Send(_)));
}

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

/// Catch-up over a slow uplink (issue 22): with the shipped settings, answers that take
/// 200 ms every time but are clean grow the window past 8 (8 x 250 captures per 0.2 s is
/// 10,000/s; 15,000/s needs 12) up to `flush.max_in_flight`, never a MAC in two batches
/// at once; one round of 503s still halves it.
#[test]
fn slow_clean_answers_grow_the_window_past_8_to_the_shipped_max_and_trouble_halves_it() {
    let max = crate::config::DEFAULTS.flush.max_in_flight as usize;
    let mut p = Planner::new(FlushSettings {
        max_in_flight: max,
        ..settings()
    });
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

#[test]
fn a_transient_failure_pauses_new_sends_with_backoff_and_a_clean_answer_ends_the_streak() {
    let mut p = Planner::new(settings());
    let pending = rows(0..8, 8);
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    let res = p.answered(b.id, retry("server error 500", None), t, 1.0);
    assert_eq!(
        res.notes,
        [Note::BackOff {
            cause: "server error 500".into(),
            label: "http_5xx",
            delay: Duration::from_millis(500),
            server: false
        }]
    );
    assert_eq!(p.next(t), Step::Wait(Some(t + Duration::from_millis(500))));
    // The failed batch is parked on its own schedule; other captures go first.
    let t1 = t + Duration::from_millis(500);
    let b2 = sent(fetch_and_offer(&mut p, &pending, t1));
    assert_eq!(ids(&b2), [4, 5, 6, 7]);
    let res = p.answered(b2.id, retry("server error 500", None), t1, 1.0);
    assert!(
        matches!(res.notes[..], [Note::BackOff { delay, .. }] if delay == Duration::from_secs(1))
    );
    let t2 = t1 + Duration::from_secs(1);
    let again = next_sent(&mut p, t2);
    assert_eq!(ids(&again), [0, 1, 2, 3], "the first batch is due again");
    let res = p.answered(again.id, all_ok(&again), t2, 1.0);
    assert!(res.notes.contains(&Note::Recovered));
    assert_eq!(p.pause.backoff.failures(), 0);
}

#[test]
fn retry_after_is_honoured_beyond_backoff_max() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &rows(0..8, 8), t));
    let res = p.answered(
        b.id,
        retry("server error 503", Some(Duration::from_secs(600))),
        t,
        1.0,
    );
    assert_eq!(
        res.notes,
        [Note::BackOff {
            cause: "server error 503".into(),
            label: "http_5xx",
            delay: Duration::from_secs(600),
            server: true
        }]
    );
    assert_eq!(p.next(t), Step::Wait(Some(t + Duration::from_secs(600))));
}

#[test]
fn a_retry_after_pause_holds_even_when_a_batch_sent_before_it_succeeds() {
    let mut p = Planner::new(settings());
    p.window.size = 2;
    let pending = rows(0..8, 8);
    let t = Instant::now();
    let a = sent(fetch_and_offer(&mut p, &pending, t));
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    p.answered(
        a.id,
        retry("rate limited", Some(Duration::from_secs(60))),
        t,
        1.0,
    );
    p.answered(b.id, all_ok(&b), t, 1.0);
    assert_eq!(p.next(t), Step::Wait(Some(t + Duration::from_secs(60))));
}

#[test]
fn a_pause_that_begins_while_a_fetch_is_under_way_holds_what_the_fetch_found() {
    let mut p = Planner::new(settings());
    p.window.size = 2;
    let pending = rows(0..8, 8);
    let t = Instant::now();
    let a = sent(fetch_and_offer(&mut p, &pending, t));
    // A fetch starts; while it is under way, a 429 with Retry-After: 2 is answered.
    let Step::Fetch { max } = p.next(t) else {
        panic!("a fetch")
    };
    let found = fetch(&pending, p.busy(), max);
    let found_ids: Vec<i64> = found.rows.iter().map(|r| r.id).collect();
    assert_eq!(found_ids, [4, 5, 6, 7]);
    p.answered(
        a.id,
        retry("rate limited", Some(Duration::from_secs(2))),
        t,
        1.0,
    );
    p.take_unclaimed();
    let t1 = t + Duration::from_millis(1);
    assert_eq!(
        p.offer(found, false, t1),
        Step::Wait(Some(t + Duration::from_secs(2))),
        "nothing is launched inside the pause"
    );
    assert_eq!(p.take_unclaimed(), found_ids, "its claims are handed back");
    assert!(p.claimed_rows().is_empty());
    assert!(found_ids.iter().all(|&i| !p.busy().contains(&mac(i as u8))));
}

#[test]
fn a_part_due_inside_a_pause_waits_and_rows_evicted_while_parked_are_never_sent() {
    let mut p = Planner::new(settings());
    let pending = rows(0..4, 4);
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    assert_eq!(p.claimed_rows(), [0, 1, 2, 3]);
    p.answered(b.id, retry("server error 503", None), t, 1.0);
    // Parked: its MACs held, its rows no longer claimed (the outbox may evict them).
    assert_eq!(p.take_unclaimed(), [0, 1, 2, 3]);
    assert!(p.claimed_rows().is_empty());
    assert_eq!(p.busy().len(), 4);
    let due = t + Duration::from_secs(60);
    let Step::Claim(part) = p.next(due) else {
        panic!("the parked part is due")
    };
    assert_eq!(part.ids(), [0, 1, 2, 3]);
    // The outbox evicted rows 0 and 2 meanwhile: they are dropped, their MACs freed.
    let batch = p.claimed(part, &[1, 3], due).expect("what is left goes");
    assert_eq!(ids(&batch), [1, 3]);
    assert_eq!(p.claimed_rows(), [1, 3]);
    assert_eq!(p.busy().len(), 2);
    assert!(!p.busy().contains(&mac(0)) && !p.busy().contains(&mac(2)));

    // A part claimed just as a pause began (an answer came in between) waits again.
    let res = p.answered(batch.id, retry("server error 503", None), due, 1.0);
    assert!(res.backoff().is_some());
    p.take_unclaimed();
    let later = due + Duration::from_secs(60);
    let Step::Claim(part) = p.next(later) else {
        panic!("due again")
    };
    assert_eq!(part.ids(), [1], "failed twice: split to isolate");
    p.pause.until = Some(later + Duration::from_secs(2));
    assert_eq!(p.claimed(part, &[1], later), None);
    assert_eq!(p.take_unclaimed(), [1]);
    assert_eq!(
        p.next(later),
        Step::Wait(Some(later + Duration::from_secs(2)))
    );
}

#[test]
fn rows_found_but_not_sent_are_handed_back_and_only_rows_in_flight_or_unrecorded_stay_claimed() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    // Two captures of two tapes: part-full, it waits, and lets go of them meanwhile.
    let pending = rows(0..2, 10);
    assert!(matches!(
        fetch_and_offer(&mut p, &pending, t),
        Step::Wait(_)
    ));
    assert_eq!(p.take_unclaimed(), [0, 1]);
    let due = t + Duration::from_secs(5);
    let b = sent(fetch_and_offer(&mut p, &pending, due));
    assert_eq!(p.claimed_rows(), [0, 1]);
    let res = p.answered(b.id, all_ok(&b), due, 1.0);
    assert_eq!(
        p.claimed_rows(),
        Vec::<i64>::new(),
        "settled, not yet in flight"
    );
    p.record_failed(res.settle.clone(), "disk full".into(), due, 1.0);
    assert_eq!(p.claimed_rows(), [0, 1], "kept until recorded");
    p.recorded(&res.settle);
    assert!(
        p.take_unclaimed().is_empty(),
        "the outbox lets go as it records"
    );
}

#[test]
fn a_400_splits_the_batch_and_a_capture_refused_alone_is_a_dead_letter_once_others_are_taken() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let refused = || Action::Refused("Invalid ble_packet".into());
    let b = sent(fetch_and_offer(&mut p, &rows(0..4, 4), t));
    let res = p.answered(b.id, refused(), t, 1.0);
    assert!(res.settle.is_empty());
    assert!(matches!(res.notes[..], [Note::Split { items: 4, .. }]));
    assert_eq!(res.backoff(), None, "a split is sent at once");
    // The halves go before anything new, first half first.
    let h1 = next_sent(&mut p, t);
    assert_eq!(ids(&h1), [0, 1]);
    p.answered(h1.id, refused(), t, 1.0);
    let q1 = next_sent(&mut p, t);
    assert_eq!(ids(&q1), [0]);
    // Refused alone, and the service has taken nothing since: no evidence against the
    // capture yet. It is kept, and new sends pause.
    let res = p.answered(q1.id, refused(), t, 1.0);
    assert!(res.settle.is_empty(), "{:?}", res.settle);
    assert_eq!(res.backoff(), Some("http_400"));
    let t1 = p.paused_until(t).expect("paused");
    // Its sibling goes first, and is taken: that is the evidence.
    let q2 = next_sent(&mut p, t1);
    assert_eq!(ids(&q2), [1]);
    let res = p.answered(q2.id, all_ok(&q2), t1, 1.0);
    assert!(res.progress);
    p.recorded(&res.settle);
    let h2 = next_sent(&mut p, t1);
    assert_eq!(ids(&h2), [2, 3]);
    p.answered(h2.id, all_ok(&h2), t1, 1.0);
    // Capture 0 is due again on its own schedule, refused again: now a dead letter.
    let t2 = t1 + Duration::from_secs(5);
    let again = next_sent(&mut p, t2);
    assert_eq!(ids(&again), [0]);
    let res = p.answered(again.id, refused(), t2, 1.0);
    assert_eq!(
        res.settle,
        [(row(0, 0), Outcome::DeadLetter("Invalid ble_packet".into()))]
    );
    assert!(res.progress);
    assert_eq!(res.backoff(), None);
}

#[test]
fn a_poisoned_capture_is_dead_lettered_at_once_when_its_sibling_half_is_answered_first() {
    let mut p = Planner::new(settings());
    p.window.size = 2;
    let t = Instant::now();
    let refused = || Action::Refused("Invalid ble_packet".into());
    // Two tapes with more behind: the batch is as full as it gets.
    let b = sent(fetch_and_offer(&mut p, &rows(0..4, 2), t));
    assert_eq!(ids(&b), [0, 1]);
    p.answered(b.id, refused(), t, 1.0);
    let poison = next_sent(&mut p, t);
    let good = next_sent(&mut p, t);
    p.answered(good.id, all_ok(&good), t, 1.0);
    let res = p.answered(poison.id, refused(), t, 1.0);
    assert!(matches!(&res.settle[..], [(r, Outcome::DeadLetter(_))] if r.id == 0));
    assert_eq!(p.paused_until(t), None, "nothing paused");
}

#[test]
fn a_service_refusing_every_request_whatever_it_holds_gets_no_dead_letter_and_a_growing_pause() {
    // Every request refused (400) alike: missing headers, a proxy, a wrong account. The
    // message is no help (spec 7 gives an invalid packet the same body); the evidence is:
    // no half is ever taken.
    for message in [
        "Missing required headers",
        "Bad Request",
        "Invalid ble_packet",
    ] {
        let mut p = Planner::new(settings());
        let pending = rows(0..16, 16);
        let mut t = Instant::now();
        let mut pauses = Vec::new();
        let mut requests = 0;
        while pauses.len() < 6 {
            match fetch_and_offer(&mut p, &pending, t) {
                Step::Send(b) => {
                    requests += 1;
                    let res = p.answered(b.id, Action::Refused(message.into()), t, 1.0);
                    assert!(
                        res.settle.is_empty(),
                        "{message}: dead-lettered {:?}",
                        res.settle
                    );
                    assert!(!res.progress);
                    if let Some(label) = res.backoff() {
                        assert_eq!(label, "http_400");
                        pauses.push(p.paused_until(t).expect("paused") - t);
                    }
                }
                Step::Wait(u) => t = u.unwrap_or(t + Duration::from_secs(1)).max(t),
                other => panic!("{other:?}"),
            }
        }
        assert!(
            pauses.windows(2).all(|w| w[1] >= w[0]) && pauses[5] > pauses[0],
            "{message}: pauses {pauses:?}"
        );
        assert!(
            requests < 60,
            "{message}: {requests} requests for six pauses"
        );
        assert!(p.pause.failing);
    }
}

#[test]
fn a_413_halves_the_limit_and_that_size_is_never_sent_again() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let pending = rows(0..40, 40);
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    let res = p.answered(b.id, Action::Shrink, t, 1.0);
    assert_eq!(res.notes, [Note::Shrunk { sent: 4, limit: 2 }]);
    assert_eq!(p.limit(), 2);
    let a = next_sent(&mut p, t);
    assert_eq!(ids(&a), [0, 1]);
    p.answered(a.id, all_ok(&a), t, 1.0);
    let b = next_sent(&mut p, t);
    assert_eq!(ids(&b), [2, 3]);
    assert_eq!(p.next(t), Step::Fetch { max: 2 });
}

#[test]
fn a_413_for_a_single_item_backs_off() {
    let mut p = Planner::new(FlushSettings {
        max_batch: 1,
        ..settings()
    });
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &rows(0..4, 4), t));
    let res = p.answered(b.id, Action::Shrink, t, 1.0);
    assert!(matches!(res.notes[..], [Note::BackOff { .. }]));
    assert_eq!(p.limit(), 1);
}

/// Drives `p` until `poison` (a row id) is settled, answering every batch holding it
/// with `fail` and every other batch as decoded. Returns the outcome of the poison,
/// the batch sizes that failed, and how long it took.
fn isolate(
    p: &mut Planner,
    pending: &mut Vec<PendingCapture>,
    poison: i64,
    fail: Action,
) -> (Outcome, Vec<usize>, Duration) {
    let t0 = Instant::now();
    let mut t = t0;
    let mut failed_sizes = Vec::new();
    for _ in 0..10_000 {
        match fetch_and_offer(p, pending, t) {
            Step::Send(b) => {
                let holds = b.rows.iter().any(|r| r.id == poison);
                let action = if holds { fail.clone() } else { all_ok(&b) };
                if holds {
                    failed_sizes.push(b.rows.len());
                }
                // Answers come 10 ms later.
                t += Duration::from_millis(10);
                let res = p.answered(b.id, action, t, 1.0);
                p.recorded(&res.settle);
                for (r, o) in res.settle {
                    pending.retain(|x| x.id != r.id);
                    if r.id == poison {
                        return (o, failed_sizes, t - t0);
                    }
                }
            }
            Step::Wait(until) => t = until.unwrap_or(t + Duration::from_millis(10)).max(t),
            other => panic!("{other:?}"),
        }
    }
    panic!(
        "the poison was never settled; {} failed batches, the last {:?}",
        failed_sizes.len(),
        &failed_sizes[failed_sizes.len().saturating_sub(10)..]
    );
}

#[test]
fn a_capture_that_always_gets_500_while_others_succeed_is_isolated_and_dead_lettered_with_its_cause(
) {
    let mut p = Planner::new(FlushSettings {
        max_batch: 16,
        ..settings()
    });
    // 64 tapes with 4 captures each; the poison is the first capture of tape 5.
    let mut pending = rows(0..256, 64);
    let (outcome, failed, took) = isolate(&mut p, &mut pending, 5, retry("server error 500", None));
    let Outcome::DeadLetter(reason) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(reason.contains("server error 500"), "{reason}");
    assert!(reason.contains("3 attempts on its own"), "{reason}");
    assert_eq!(failed.first(), Some(&16));
    assert!(failed.contains(&1), "{failed:?}");
    assert!(
        took < Duration::from_secs(60),
        "isolated in {took:?}: minutes, not hours"
    );
    // Everything else kept flowing: only the poison's MAC waited for it.
    assert!(
        pending.iter().all(|r| r.capture.mac == mac(5)),
        "{:?}",
        pending.len()
    );
}

#[test]
fn a_capture_that_always_times_out_while_others_succeed_is_dead_lettered_too() {
    let mut p = Planner::new(FlushSettings {
        max_batch: 16,
        ..settings()
    });
    let mut pending = rows(0..128, 32);
    let (outcome, _, _) = isolate(&mut p, &mut pending, 40, retry("timeout", None));
    assert!(matches!(outcome, Outcome::DeadLetter(r) if r.contains("timeout")));
}

#[test]
fn a_failing_capture_is_isolated_even_when_its_batch_is_all_that_is_pending() {
    let mut p = Planner::new(settings());
    // One batch, one capture of each of four tapes; the first always fails. Only the
    // halves of its own batch can show that the service works.
    let mut pending = rows(0..4, 4);
    let (outcome, failed, _) = isolate(&mut p, &mut pending, 0, retry("server error 500", None));
    assert!(matches!(outcome, Outcome::DeadLetter(_)), "{outcome:?}");
    assert_eq!(failed[..3], [4, 4, 2], "failed twice whole, then split");
    assert!(pending.iter().all(|r| r.id == 0) || pending.is_empty());
}

#[test]
fn a_rate_limit_or_a_refused_token_never_isolates_or_dead_letters_a_capture() {
    let mut p = Planner::new(settings());
    // Other tapes are answered between the failures: still nobody's fault.
    let mut pending = rows(0..64, 16);
    let poison = 0;
    let not_the_batchs = Action::Retry {
        cause: "rate limited".into(),
        label: "http_429",
        retry_after: None,
        isolate: false,
    };
    let mut t = Instant::now();
    for _ in 0..200 {
        match fetch_and_offer(&mut p, &pending, t) {
            Step::Send(b) => {
                let holds = b.rows.iter().any(|r| r.id == poison);
                let action = if holds {
                    not_the_batchs.clone()
                } else {
                    all_ok(&b)
                };
                let res = p.answered(b.id, action, t, 1.0);
                assert!(res
                    .notes
                    .iter()
                    .all(|n| !matches!(n, Note::Isolating { .. })));
                assert!(
                    res.settle.iter().all(|(r, _)| r.id != poison),
                    "dead-lettered"
                );
                p.recorded(&res.settle);
                let done: Vec<i64> = res.settle.iter().map(|(r, _)| r.id).collect();
                pending.retain(|r| !done.contains(&r.id));
            }
            Step::Wait(u) => t = u.unwrap_or(t + Duration::from_secs(1)),
            other => panic!("{other:?}"),
        }
    }
    assert!(pending.iter().any(|r| r.id == poison));
}

#[test]
fn in_an_outage_nothing_is_dead_lettered_however_often_it_fails() {
    let mut p = Planner::new(settings());
    let pending = rows(0..4, 4);
    let mut t = Instant::now();
    for _ in 0..50 {
        match fetch_and_offer(&mut p, &pending, t) {
            Step::Send(b) => {
                let res = p.answered(b.id, retry("server error 503", None), t, 1.0);
                assert!(res.settle.is_empty());
            }
            Step::Wait(u) => t = u.unwrap_or(t + Duration::from_secs(1)),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn an_item_always_left_out_is_a_dead_letter_after_the_bound_and_its_mac_goes_on() {
    let mut p = Planner::new(settings());
    let mut pending = rows(0..8, 2);
    let t = Instant::now();
    let mut answers = 0;
    loop {
        let b = sent(fetch_and_offer(&mut p, &pending, t));
        // Row 0 is always left out.
        let outcomes: Vec<(usize, Outcome)> = b
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.id != 0)
            .map(|(i, _)| (i, delivered()))
            .collect();
        answers += 1;
        let res = p.answered(b.id, Action::Settle(outcomes), t, 1.0);
        p.recorded(&res.settle);
        let done: Vec<i64> = res.settle.iter().map(|(r, _)| r.id).collect();
        pending.retain(|r| !done.contains(&r.id));
        if let Some((_, o)) = res.settle.iter().find(|(r, _)| r.id == 0) {
            assert_eq!(
                *o,
                Outcome::DeadLetter(
                    "the service left this capture out of 3 answers in a row".into()
                )
            );
            break;
        }
    }
    assert_eq!(answers, 3);
    // The MAC's next capture goes in the next batch.
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    assert!(b.rows.iter().any(|r| r.capture.mac == mac(0)));
}

#[test]
fn a_capture_left_out_and_then_sent_alone_counts_empty_answers_as_left_out() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let mut pending = rows(0..2, 2);
    let Step::Fetch { max } = p.next(t) else {
        panic!("fetch")
    };
    let b = sent(p.offer(fetch(&pending, p.busy(), max), true, t));
    let res = p.answered(b.id, Action::Settle(vec![(1, delivered())]), t, 1.0);
    p.recorded(&res.settle);
    pending.retain(|r| r.id != 1);
    for n in 2..=3 {
        let Step::Fetch { max } = p.next(t) else {
            panic!("fetch")
        };
        let b = sent(p.offer(fetch(&pending, p.busy(), max), true, t));
        assert_eq!(ids(&b), [0]);
        let res = p.answered(b.id, Action::Settle(vec![]), t, 1.0);
        assert!(res.notes.is_empty(), "not a failure: {:?}", res.notes);
        if n == 3 {
            assert!(matches!(&res.settle[..], [(r, Outcome::DeadLetter(_))] if r.id == 0));
        }
    }
}

#[test]
fn an_answer_with_no_item_at_all_is_a_failure_not_a_count_against_the_captures() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &rows(0..4, 4), t));
    let res = p.answered(b.id, Action::Settle(vec![]), t, 1.0);
    assert!(res.settle.is_empty());
    assert!(matches!(res.notes[..], [Note::BackOff { .. }]));
    assert!(p.attempts.values().all(|a| a.left_out == 0));
}

#[test]
fn a_failed_recording_pauses_and_records_the_same_outcomes_again_without_resending() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let pending = rows(0..4, 4);
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    let res = p.answered(b.id, all_ok(&b), t, 1.0);
    assert_eq!(res.settle.len(), 4);
    let res2 = p.record_failed(res.settle.clone(), "disk full".into(), t, 1.0);
    assert!(matches!(res2.notes[..], [Note::BackOff { .. }]));
    // Paused: no fetch, no send; the MACs stay busy.
    let until = p.paused_until(t).expect("paused");
    assert_eq!(p.next(t), Step::Wait(Some(until)));
    assert_eq!(p.busy().len(), 4);
    let Step::Record(again) = p.next(until) else {
        panic!("record again")
    };
    assert_eq!(again, res.settle);
    // Failing again backs off longer.
    p.record_failed(again, "disk full".into(), until, 1.0);
    let until2 = p.paused_until(until).expect("paused");
    assert_eq!(until2 - until, Duration::from_secs(1));
    let Step::Record(again) = p.next(until2) else {
        panic!()
    };
    p.recorded(&again);
    assert!(p.is_idle() && p.busy().is_empty());
}

#[test]
fn a_failed_read_of_the_outbox_pauses_new_sends() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    let res = p.read_failed("disk I/O error".into(), t, 1.0);
    assert!(
        matches!(res.notes[..], [Note::BackOff { delay, .. }] if delay == Duration::from_millis(500))
    );
    assert_eq!(p.next(t), Step::Wait(Some(t + Duration::from_millis(500))));
}

mod model {
    //! Per-MAC order under any interleaving of answers: the planner against a model
    //! in which the outbox is a list and the service answers in any order.
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Answer {
        Ok,
        LeaveOutFirst,
        Fail,
        Split,
        Shrink,
    }

    fn answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            4 => Just(Answer::Ok),
            1 => Just(Answer::LeaveOutFirst),
            1 => Just(Answer::Fail),
            1 => Just(Answer::Split),
            1 => Just(Answer::Shrink),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn captures_of_a_mac_are_settled_in_order_and_never_in_two_batches_at_once(
            macs in 1i64..6,
            n in 1i64..40,
            script in proptest::collection::vec((answer(), any::<prop::sample::Index>()), 1..300),
        ) {
            let mut p = Planner::new(FlushSettings { max_batch: 4, ..settings() });
            p.window.size = 4;
            let mut pending = rows(0..n, macs);
            let mut in_flight: Vec<Batch> = Vec::new();
            let mut settled: Vec<PendingCapture> = Vec::new();
            let mut t = Instant::now();
            for (a, pick) in script {
                // Send what the plan allows.
                loop {
                    match fetch_and_offer(&mut p, &pending, t) {
                        Step::Send(b) => {
                            for r in &b.rows {
                                for o in &in_flight {
                                    prop_assert!(o.rows.iter().all(|x| x.capture.mac != r.capture.mac), "a MAC in two batches in flight");
                                }
                            }
                            in_flight.push(b);
                        }
                        Step::Record(s) => p.recorded(&s),
                        Step::Wait(u) => { t = u.unwrap_or(t).max(t + Duration::from_millis(1)); break; }
                        Step::Fetch { .. } | Step::Claim(_) => break,
                    }
                }
                if in_flight.is_empty() { continue; }
                let b = in_flight.remove(pick.index(in_flight.len()));
                let action = match a {
                    Answer::Ok => all_ok(&b),
                    Answer::LeaveOutFirst => Action::Settle((1..b.rows.len()).map(|i| (i, delivered())).collect()),
                    Answer::Fail => retry("server error 503", None),
                    Answer::Split => Action::Refused("Invalid ble_packet".into()),
                    Answer::Shrink => Action::Shrink,
                };
                let res = p.answered(b.id, action, t, 0.5);
                p.recorded(&res.settle);
                for (r, _) in res.settle {
                    // The oldest pending capture of its MAC, always.
                    let oldest = pending.iter().find(|x| x.capture.mac == r.capture.mac).map(|x| x.id);
                    prop_assert_eq!(oldest, Some(r.id), "settled out of order");
                    pending.retain(|x| x.id != r.id);
                    settled.push(r);
                }
            }
            // Per MAC, the settled captures are in capture order.
            for m in 0..macs {
                let ts: Vec<i64> = settled.iter().filter(|r| r.capture.mac == mac(m as u8)).map(|r| r.capture.ts_ms).collect();
                prop_assert!(ts.windows(2).all(|w| w[0] < w[1]), "{:?}", ts);
            }
        }
    }
}
