//! Composition, when a batch goes, and what is handed back: a MAC in one batch at a
//! time, a part-full batch waits up to `max_delay` (its rows handed back meanwhile), and
//! an answer is held until it is recorded.

use super::*;

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
fn rows_found_but_not_sent_are_handed_back_and_an_answer_is_held_until_recorded() {
    let mut p = Planner::new(settings());
    let t = Instant::now();
    // Two captures of two tapes: part-full, it waits, and hands them back meanwhile.
    let pending = rows(0..2, 10);
    assert!(matches!(
        fetch_and_offer(&mut p, &pending, t),
        Step::Wait(_)
    ));
    assert_eq!(p.take_unclaimed(), [0, 1]);
    let due = t + Duration::from_secs(5);
    let b = sent(fetch_and_offer(&mut p, &pending, due));
    assert_eq!(p.in_flight_rows(), [0, 1]);
    let res = p.answered(b.id, all_ok(&b), due, 1.0);
    assert_eq!(
        (p.in_flight_rows(), p.unrecorded_rows()),
        (Vec::<i64>::new(), Vec::<i64>::new()),
        "settled, not yet in flight"
    );
    p.record_failed(res.settle.clone(), "disk full".into(), due, 1.0);
    assert_eq!(p.unrecorded_rows(), [0, 1], "kept until recorded");
    p.recorded(&res.settle);
    assert!(
        p.take_unclaimed().is_empty(),
        "the outbox lets go as it records"
    );
}
