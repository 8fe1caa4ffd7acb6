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
                        for r in b.rows.iter() {
                            for o in &in_flight {
                                prop_assert!(o.rows.iter().all(|x| x.capture.mac != r.capture.mac), "a MAC in two batches in flight");
                            }
                        }
                        in_flight.push(b);
                    }
                    Step::Record(s) => p.recorded(&s),
                    Step::Wait(u) => { t = u.unwrap_or(t).max(t + Duration::from_millis(1)); break; }
                    Step::Fetch { .. } => break,
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
