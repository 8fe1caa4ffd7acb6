//! Refusals: a 400 splits the batch down to the capture (a dead letter only with
//! evidence), and a 413 halves the batch size limit for the run.

use super::*;

/// A 400 splits the batch and a capture refused alone is a dead letter once others are
/// taken.
#[test]
fn a_400_splits_the_batch_and_one_refused_alone_is_a_dead_letter() {
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

/// A poisoned capture is dead lettered at once when its sibling half is answered first.
#[test]
fn a_poisoned_capture_is_dead_lettered_once_its_sibling_is_answered() {
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

/// A service refusing every request whatever it holds gets no dead letter and a growing
/// pause.
#[test]
fn a_service_refusing_everything_gets_no_dead_letter_but_a_pause() {
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
