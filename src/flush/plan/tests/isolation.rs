//! Isolation and the left out: a capture the service chokes on is isolated and dead
//! lettered with its cause, an outage counts against nobody, and an item always left
//! out is a dead letter after the bound.

use super::*;

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

/// A capture that always gets 500 while others succeed is isolated and dead lettered with
/// its cause.
#[test]
fn a_capture_always_answered_500_is_isolated_and_dead_lettered() {
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
