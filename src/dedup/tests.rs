//! Tests of `dedup.rs`, with a property test against a simple model.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const TAPE: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01]);

fn settings(window_ms: i64, min_interval_ms: i64) -> DedupSettings {
    DedupSettings {
        window_ms,
        min_interval_ms,
        max_tracked: 1000,
    }
}

fn cap(mac: Mac, ts_ms: EpochMillis, packet: &str) -> Capture {
    Capture {
        mac,
        ts_ms,
        product_id: "tape".into(),
        packet: packet.to_string(),
        rssi: Some(-60),
        boot_ms: None,
    }
}

fn mac(n: u8) -> Mac {
    Mac::new([0xC0, 0, 0, 0, 0, n])
}

/// Offers `(ts, packet)` of [`TAPE`] in order; returns `(ts, packet)` of what was
/// admitted.
fn run(d: &mut Dedup, offers: &[(EpochMillis, &str)]) -> Vec<(EpochMillis, String)> {
    let mut out = Vec::new();
    for &(ts, packet) in offers {
        d.offer(cap(TAPE, ts, packet), &mut out);
    }
    out.into_iter().map(|c| (c.ts_ms, c.packet)).collect()
}

fn admitted(pairs: &[(EpochMillis, &str)]) -> Vec<(EpochMillis, String)> {
    pairs.iter().map(|&(t, p)| (t, p.to_string())).collect()
}

#[test]
fn a_wall_clock_stepping_back_neither_holds_nor_drops_live_captures() {
    // Live captures carry boot time; the wall clock steps back an hour between the
    // first and the second. By wall time "B" would be throttled for an hour and
    // the return to "A" dropped as a duplicate; by boot time both are new states.
    let mut d = Dedup::new(settings(10_000, 5_000));
    let wall = 1_763_719_200_000;
    let live = |boot: i64, wall: i64, p: &str| Capture {
        boot_ms: Some(boot),
        ..cap(TAPE, wall, p)
    };
    let mut out = Vec::new();
    d.offer(live(100_000, wall, "A"), &mut out);
    d.offer(live(106_000, wall - 3_600_000 + 6_000, "B"), &mut out);
    d.offer(live(112_000, wall - 3_600_000 + 12_000, "A"), &mut out);
    d.offer(live(113_000, wall - 3_600_000 + 13_000, "A"), &mut out);
    let got: Vec<(Option<i64>, &str)> =
        out.iter().map(|c| (c.boot_ms, c.packet.as_str())).collect();
    assert_eq!(
        got,
        vec![
            (Some(100_000), "A"),
            (Some(106_000), "B"),
            (Some(112_000), "A")
        ]
    );
    assert_eq!(d.held(), 0);
    assert_eq!(d.stats().dropped_duplicate, 1);
}

#[test]
fn a_packet_equal_to_the_last_admitted_within_the_window_is_dropped() {
    let mut d = Dedup::new(settings(60_000, 0));
    let out = run(&mut d, &[(0, "A"), (1_000, "A"), (59_999, "A")]);
    assert_eq!(out, admitted(&[(0, "A")]));
    assert_eq!(d.stats().dropped_duplicate, 2);
}

#[test]
fn the_same_packet_is_admitted_again_once_the_window_has_passed() {
    let mut d = Dedup::new(settings(60_000, 0));
    let out = run(&mut d, &[(0, "A"), (60_000, "A"), (61_000, "A")]);
    assert_eq!(out, admitted(&[(0, "A"), (60_000, "A")]));
}

#[test]
fn the_window_counts_from_the_last_admission_not_the_last_advert() {
    let mut d = Dedup::new(settings(10_000, 0));
    let out = run(
        &mut d,
        &[(0, "A"), (9_000, "A"), (11_000, "A"), (12_000, "B")],
    );
    assert_eq!(out, admitted(&[(0, "A"), (11_000, "A"), (12_000, "B")]));
}

#[test]
fn a_changed_packet_inside_the_min_interval_is_held_not_admitted() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let out = run(&mut d, &[(0, "A"), (1_000, "B")]);
    assert_eq!(out, admitted(&[(0, "A")]));
    assert_eq!(d.held(), 1);
    assert_eq!(d.stats().throttled, 1);
}

/// The newest held capture is admitted when the interval ends and older ones are not.
#[test]
fn the_newest_held_capture_is_admitted_when_the_interval_ends() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let mut out = run(&mut d, &[(0, "A"), (1_000, "B"), (2_000, "C")]);
    let mut released = Vec::new();
    d.release_due(4_999, &mut released);
    assert!(released.is_empty(), "the interval has not ended yet");
    d.release_due(5_000, &mut released);
    out.extend(released.into_iter().map(|c| (c.ts_ms, c.packet)));
    assert_eq!(out, admitted(&[(0, "A"), (2_000, "C")]));
    assert_eq!(d.held(), 0);
    assert_eq!(d.stats().held_replaced, 1);
}

#[test]
fn a_held_capture_goes_out_before_a_later_capture_of_its_mac() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let out = run(&mut d, &[(0, "A"), (1_000, "B"), (7_000, "C")]);
    // B is admitted at 5 000 (end of interval), so C at 7 000 is inside the next one.
    assert_eq!(out, admitted(&[(0, "A"), (1_000, "B")]));
    let mut released = Vec::new();
    d.release_due(9_999, &mut released);
    assert!(released.is_empty());
    d.release_due(10_000, &mut released);
    assert_eq!(released[0].packet, "C");
}

#[test]
fn a_held_capture_is_admitted_at_the_end_of_the_interval_so_one_per_interval_holds() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let out = run(
        &mut d,
        &[
            (0, "A"),
            (4_000, "B"),
            (5_000, "C"),
            (9_999, "D"),
            (10_000, "E"),
        ],
    );
    // B goes out at 5 000 when C arrives; C is held and replaced by D; D goes out
    // at 10 000 when E arrives; E is held until 15 000.
    assert_eq!(out, admitted(&[(0, "A"), (4_000, "B"), (9_999, "D")]));
    let mut released = Vec::new();
    d.release_due(14_999, &mut released);
    assert!(released.is_empty());
    d.release_due(15_000, &mut released);
    assert_eq!(released[0].packet, "E");
    let times: Vec<EpochMillis> = d.ledger.admissions.iter().map(|a| a.1).collect();
    assert_eq!(times, vec![0, 5_000, 10_000, 15_000]);
    assert_eq!(d.stats().held_replaced, 1);
}

#[test]
fn going_back_to_the_admitted_packet_drops_it_and_discards_the_held_one() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let mut out = run(&mut d, &[(0, "A"), (1_000, "B"), (2_000, "A")]);
    let mut released = Vec::new();
    d.release_due(100_000, &mut released);
    d.drain(&mut released);
    out.extend(released.into_iter().map(|c| (c.ts_ms, c.packet)));
    assert_eq!(out, admitted(&[(0, "A")]));
    let s = d.stats();
    assert_eq!((s.dropped_duplicate, s.held_discarded), (1, 1));
    assert_eq!(d.held(), 0);
}

#[test]
fn with_window_and_interval_at_zero_every_advert_is_admitted_and_nothing_tracked() {
    let mut d = Dedup::new(settings(0, 0));
    let offers = [(0, "A"), (0, "A"), (1, "A"), (1, "B"), (0, "B")];
    assert_eq!(run(&mut d, &offers), admitted(&offers));
    assert_eq!(d.stats().tracked, 0);
}

#[test]
fn the_tracked_macs_stay_within_max_tracked_and_an_evicted_held_capture_is_admitted() {
    let mut d = Dedup::new(DedupSettings {
        window_ms: 60_000,
        min_interval_ms: 5_000,
        max_tracked: 2,
    });
    let mut out = Vec::new();
    d.offer(cap(mac(1), 0, "A"), &mut out);
    d.offer(cap(mac(1), 1_000, "B"), &mut out); // held
    d.offer(cap(mac(2), 1_100, "A"), &mut out);
    assert_eq!(out.len(), 2);
    d.offer(cap(mac(3), 1_200, "A"), &mut out); // evicts mac 1, least recently offered
    let got: Vec<(Mac, &str)> = out.iter().map(|c| (c.mac, c.packet.as_str())).collect();
    assert_eq!(
        got,
        vec![(mac(1), "A"), (mac(2), "A"), (mac(1), "B"), (mac(3), "A")]
    );
    let s = d.stats();
    assert_eq!((s.tracked, s.evicted, d.held()), (2, 1, 0));
    // The stale heap entry of the evicted hold releases nothing.
    let mut released = Vec::new();
    d.release_due(1_000_000, &mut released);
    assert!(released.is_empty());
}

#[test]
fn recently_offered_macs_are_kept_over_older_ones() {
    let mut d = Dedup::new(DedupSettings {
        window_ms: 60_000,
        min_interval_ms: 0,
        max_tracked: 2,
    });
    let mut out = Vec::new();
    d.offer(cap(mac(1), 0, "A"), &mut out);
    d.offer(cap(mac(2), 1, "A"), &mut out);
    d.offer(cap(mac(1), 2, "A"), &mut out); // dropped, and mac 1 is now the newest
    d.offer(cap(mac(3), 3, "A"), &mut out); // evicts mac 2
    d.offer(cap(mac(1), 4, "A"), &mut out); // still remembered: dropped
    d.offer(cap(mac(2), 5, "A"), &mut out); // forgotten: admitted again
    let got: Vec<Mac> = out.iter().map(|c| c.mac).collect();
    assert_eq!(got, vec![mac(1), mac(2), mac(3), mac(2)]);
}

#[test]
fn macs_whose_window_and_interval_have_passed_are_forgotten() {
    let mut d = Dedup::new(settings(10_000, 5_000));
    let mut out = Vec::new();
    d.offer(cap(mac(1), 0, "A"), &mut out);
    d.offer(cap(mac(2), 1_000, "A"), &mut out);
    d.offer(cap(mac(2), 2_000, "B"), &mut out); // held
    d.release_due(9_999, &mut out);
    assert_eq!(d.stats().tracked, 2);
    d.release_due(10_000, &mut out);
    assert_eq!(
        d.stats().tracked,
        1,
        "mac 1 is forgotten, mac 2 still matters"
    );
    d.release_due(16_000, &mut out);
    assert_eq!(d.stats().tracked, 0);
    assert_eq!(out.len(), 3);
}

#[test]
fn drain_admits_every_held_capture() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let mut out = Vec::new();
    for n in 1..=3 {
        d.offer(cap(mac(n), 0, "A"), &mut out);
        d.offer(cap(mac(n), 1_000, "B"), &mut out);
    }
    assert_eq!((out.len(), d.held()), (3, 3));
    out.clear();
    d.drain(&mut out);
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|c| c.packet == "B"));
    assert_eq!(d.held(), 0);
    // Drained captures were admitted at the end of their interval.
    d.offer(cap(mac(1), 4_000, "C"), &mut out);
    assert_eq!(d.held(), 1);
}

#[test]
fn new_settings_keep_what_is_held_and_move_its_due_time() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let mut out = Vec::new();
    d.offer(cap(TAPE, 0, "A"), &mut out);
    d.offer(cap(TAPE, 1_000, "B"), &mut out);
    d.set_settings(settings(60_000, 2_000));
    out.clear();
    d.release_due(2_000, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].packet, "B");
    assert_eq!(d.settings(), settings(60_000, 2_000));
}

#[test]
fn stale_due_times_do_not_pile_up() {
    let mut d = Dedup::new(settings(60_000, 5_000));
    let mut out = Vec::new();
    for i in 0..10_000 {
        let t = i * 10_000;
        d.offer(cap(TAPE, t, "A"), &mut out);
        d.offer(cap(TAPE, t + 1, "B"), &mut out); // held
        d.offer(cap(TAPE, t + 2, "A"), &mut out); // back: held discarded
    }
    assert_eq!(d.due.len(), 10_000, "offer leaves stale entries");
    d.release_due(0, &mut out);
    assert!(d.due.len() <= 1024);
}

/// One step of a random run: offer a packet after `dt`, or release due captures.
#[derive(Debug, Clone)]
enum Step {
    Offer { dt: i64, mac: u8, packet: u8 },
    Release { dt: i64 },
}

fn steps(macs: u8) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0i64..3_000, 0..macs, 0u8..3)
            .prop_map(|(dt, mac, packet)| Step::Offer { dt, mac, packet }),
        1 => (0i64..3_000).prop_map(|dt| Step::Release { dt }),
    ];
    proptest::collection::vec(step, 0..200)
}

/// Runs `steps` on increasing capture times, then drains; checks what holds for
/// every run and returns the admissions log and what was pushed to `out`.
fn check_run(d: &mut Dedup, steps: &[Step]) -> Vec<Capture> {
    let mut now = 1_000_000;
    let mut out = Vec::new();
    let mut offered = 0u64;
    let mut last_offered: HashMap<Mac, String> = HashMap::new();
    for step in steps {
        let before = out.len();
        match *step {
            Step::Offer { dt, mac: m, packet } => {
                now += dt;
                let packet = format!("P{packet}");
                last_offered.insert(mac(m), packet.clone());
                d.offer(cap(mac(m), now, &packet), &mut out);
                offered += 1;
            }
            Step::Release { dt } => {
                now += dt;
                d.release_due(now, &mut out);
            }
        }
        let log = &d.ledger.admissions;
        for (c, (_, at, _)) in out[before..]
            .iter()
            .zip(&log[log.len() - (out.len() - before)..])
        {
            assert!(c.ts_ms <= *at, "admitted before it was captured");
        }
    }
    d.drain(&mut out);
    let s = d.stats();
    assert_eq!(
        offered,
        s.admitted + s.dropped_duplicate + s.held_replaced + s.held_discarded,
        "every capture is admitted or dropped by a rule: {s:?}"
    );
    assert_eq!(s.admitted as usize, out.len());
    for (m, packet) in last_offered {
        let last = out.iter().rev().find(|c| c.mac == m).map(|c| &c.packet);
        assert_eq!(last, Some(&packet), "the last state of {m} is admitted");
    }
    let mut last_ts: HashMap<Mac, EpochMillis> = HashMap::new();
    for c in &out {
        let prev = last_ts.insert(c.mac, c.ts_ms).unwrap_or(EpochMillis::MIN);
        assert!(prev <= c.ts_ms, "per-MAC admission order is capture order");
    }
    out
}

proptest! {
    /// One tape is never admitted twice within `min_interval`, and its last state is admitted.
    #[test]
    fn one_tape_is_admitted_once_per_interval_and_its_last_state_too(
        window in 0i64..10_000,
        interval in 0i64..6_000,
        steps in steps(1),
    ) {
        let mut d = Dedup::new(settings(window, interval));
        check_run(&mut d, &steps);
        let log = &d.ledger.admissions;
        for pair in log.windows(2) {
            let ((_, a, pa), (_, b, pb)) = (&pair[0], &pair[1]);
            prop_assert!(b - a >= interval, "admitted at {a} and {b}");
            prop_assert!(
                window == 0 || pa != pb || b - a >= window,
                "{pa} admitted twice within the window, at {a} and {b}"
            );
        }
    }

    #[test]
    fn a_small_max_tracked_never_loses_a_held_capture_or_a_last_state(
        window in 0i64..10_000,
        interval in 0i64..6_000,
        max_tracked in 1usize..4,
        steps in steps(6),
    ) {
        let mut d = Dedup::new(DedupSettings { window_ms: window, min_interval_ms: interval, max_tracked });
        check_run(&mut d, &steps);
        prop_assert!(d.stats().tracked <= max_tracked);
    }
}
