//! Pauses: backoff and `Retry-After` hold every new send (a queued part, what a fetch
//! found), and a failed recording or read of the outbox pauses too.

use super::*;

/// A transient failure pauses new sends with backoff and a clean answer ends the streak.
#[test]
fn a_transient_failure_pauses_sends_until_a_clean_answer() {
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
    assert_eq!(p.take_unclaimed(), found_ids, "its rows are handed back");
    assert!(p.in_flight_rows().is_empty() && p.unrecorded_rows().is_empty());
    assert!(found_ids.iter().all(|&i| !p.busy().contains(&mac(i as u8))));
}

#[test]
fn a_part_due_inside_a_pause_waits_and_rows_evicted_while_parked_are_never_sent() {
    let mut p = Planner::new(settings());
    let pending = rows(0..4, 4);
    let t = Instant::now();
    let b = sent(fetch_and_offer(&mut p, &pending, t));
    assert_eq!(p.in_flight_rows(), [0, 1, 2, 3]);
    p.answered(b.id, retry("server error 503", None), t, 1.0);
    // Parked: its MACs held, nothing handed back (it has no claim: its request let go).
    assert!(p.take_unclaimed().is_empty());
    assert!(p.in_flight_rows().is_empty());
    assert_eq!(p.busy().len(), 4);
    let due = t + Duration::from_secs(60);
    let part = next_sent(&mut p, due);
    assert_eq!(ids(&part), [0, 1, 2, 3]);
    // The outbox evicted rows 0 and 2 meanwhile: as its request goes they are dropped,
    // their MACs freed.
    let still: Vec<PendingCapture> = pending.iter().filter(|r| r.id % 2 == 1).cloned().collect();
    let batch = on_the_wire(&mut p, part, &still).expect("what is left goes");
    assert_eq!(ids(&batch), [1, 3]);
    assert_eq!(p.in_flight_rows(), [1, 3]);
    assert_eq!(p.busy().len(), 2);
    assert!(!p.busy().contains(&mac(0)) && !p.busy().contains(&mac(2)));

    // A part due while a pause holds waits; the pause over, it goes.
    let res = p.answered(batch.id, retry("server error 503", None), due, 1.0);
    assert!(res.backoff().is_some());
    let later = due + Duration::from_secs(60);
    p.pause.until = Some(later + Duration::from_secs(2));
    assert_eq!(
        p.next(later),
        Step::Wait(Some(later + Duration::from_secs(2)))
    );
    let part = next_sent(&mut p, later + Duration::from_secs(2));
    assert_eq!(ids(&part), [1], "failed twice: split to isolate");
    // Every row of it evicted: nothing is sent, and its MAC is free.
    assert_eq!(on_the_wire(&mut p, part, &[]), None);
    assert_eq!(p.in_flight(), 0);
    assert!(!p.busy().contains(&mac(1)));
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
