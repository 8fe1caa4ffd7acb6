/*!
Per-MAC deduplication on capture time. Pure and synchronous: time is passed in, and it
is capture time, so replaying the same input gives the same admissions. For a live
capture that time is its boot time ([`Capture::order_ms`]), which never steps back.

A tape adverts several times a second and its packet changes far less often; the
service wants each state of a tape, not each advert. Per MAC, [`Dedup`] keeps the last
*admitted* packet and its admission time:

- **Window.** A packet equal to the last admitted one, within `window_ms` of that
  admission, is dropped.
- **Interval.** At most one capture per `min_interval_ms` is admitted. A capture that
  arrives inside the interval is *held*; a newer one replaces it; the held one is
  admitted when the interval ends, with the end of the interval as its admission time
  (so the next interval starts there). The latest state of a tape is never lost to
  throttling.
- **Back to the admitted state.** A capture equal to the last admitted packet (within
  the window) that arrives while a different packet is held means the tape went back to
  the admitted state: the capture is dropped and the held one discarded, because the
  latest state is already admitted. Admitting the held one would make the service
  believe the tape is in a state it has already left.
- Both at 0: every capture is admitted and nothing is tracked.

Held captures are released by [`Dedup::offer`] (a held capture of the same MAC whose
interval has ended goes out before the new one), by [`Dedup::release_due`] (a min-heap of
due times, invalidated lazily, so a call costs only the captures it releases) and by
[`Dedup::drain`] (shutdown, end of the source).

Memory is bounded: at most `max_tracked` MACs are tracked, least recently offered
evicted first. An evicted MAC's held capture is admitted at once (early rather than
lost). Entries whose window and interval have both passed and that hold nothing are
pruned: forgetting them changes no decision.
*/

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashlink::LinkedHashMap;

use crate::record::{Capture, EpochMillis, Mac};

/// Validated `[dedup]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupSettings {
    /// A packet equal to the last admitted one of the MAC within this window is dropped.
    pub window_ms: i64,
    /// At most one admitted capture of a MAC per this interval.
    pub min_interval_ms: i64,
    /// How many MACs are tracked at most (memory bound).
    pub max_tracked: usize,
}

/// What dedup has done since it was created.
///
/// Every offered capture ends up counted exactly once: `offered = admitted +
/// dropped_duplicate + held_replaced + held_discarded + held` (the last one from
/// [`Dedup::held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupStats {
    /// Captures admitted (pushed to `out`), held ones included.
    pub admitted: u64,
    /// Captures dropped because they equalled the last admitted packet within the window.
    pub dropped_duplicate: u64,
    /// Captures that arrived inside the min interval and were held.
    pub throttled: u64,
    /// Held captures dropped because a newer capture of the MAC replaced them.
    pub held_replaced: u64,
    /// Held captures dropped because the tape went back to its admitted state.
    pub held_discarded: u64,
    /// MACs forgotten to stay within `max_tracked` (their held capture was admitted).
    pub evicted: u64,
    /// MACs tracked now.
    pub tracked: usize,
}

/// What is remembered of one MAC.
#[derive(Debug)]
struct Tracked {
    /// The last admitted packet.
    packet: String,
    /// When that packet was admitted (its capture time, or the end of the interval it
    /// was held through).
    admitted_at: EpochMillis,
    /// The newest capture waiting for the interval to end.
    held: Option<Capture>,
    /// Which heap entry is valid for `held`.
    hold_gen: u64,
}

impl Tracked {
    fn due(&self, min_interval_ms: i64) -> EpochMillis {
        self.admitted_at.saturating_add(min_interval_ms.max(0))
    }
}

/// Per-MAC deduplication; see the module doc.
#[derive(Debug)]
pub struct Dedup {
    settings: DedupSettings,
    /// Least recently offered first.
    macs: LinkedHashMap<Mac, Tracked>,
    /// When held captures are due; an entry is valid while its MAC holds a capture of
    /// the same generation.
    due: BinaryHeap<Reverse<(EpochMillis, u64, Mac)>>,
    next_gen: u64,
    held: usize,
    ledger: Ledger,
}

/// Where admissions go: `out`, the counters, and in tests a log of admission times.
#[derive(Debug, Default)]
struct Ledger {
    stats: DedupStats,
    #[cfg(test)]
    admissions: Vec<(Mac, EpochMillis, String)>,
}

impl Ledger {
    fn admit(&mut self, capture: Capture, at: EpochMillis, out: &mut Vec<Capture>) {
        let _ = at; // only the tests' log keeps the admission time
        #[cfg(test)]
        self.admissions
            .push((capture.mac, at, capture.packet.clone()));
        self.stats.admitted += 1;
        out.push(capture);
    }
}

impl Dedup {
    pub fn new(settings: DedupSettings) -> Self {
        Dedup {
            settings,
            macs: LinkedHashMap::new(),
            due: BinaryHeap::new(),
            next_gen: 0,
            held: 0,
            ledger: Ledger::default(),
        }
    }

    /// Offers one capture, at its capture time. Admitted captures are pushed to `out`:
    /// first a held capture of the same MAC whose interval ended at or before this
    /// capture's time, then this capture if it is admitted now. A held capture of
    /// another MAC may also be pushed when that MAC is evicted to make room.
    pub fn offer(&mut self, capture: Capture, out: &mut Vec<Capture>) {
        let DedupSettings {
            window_ms,
            min_interval_ms,
            ..
        } = self.settings;
        // Boot time for live captures: a wall clock stepping back must not make a new
        // capture look older than the last admitted one.
        let (t, mac) = (capture.order_ms(), capture.mac);
        if window_ms <= 0 && min_interval_ms <= 0 && self.macs.is_empty() {
            self.ledger.admit(capture, t, out);
            return;
        }
        self.prune(t);
        let Some(entry) = self.macs.to_back(&mac) else {
            self.make_room(out);
            self.macs.insert(
                mac,
                Tracked {
                    packet: capture.packet.clone(),
                    admitted_at: t,
                    held: None,
                    hold_gen: 0,
                },
            );
            self.ledger.admit(capture, t, out);
            return;
        };

        let due = entry.due(min_interval_ms);
        if due <= t {
            if let Some(held) = entry.held.take() {
                self.held -= 1;
                admit_tracked(entry, &mut self.ledger, held, due, out);
            }
        }

        if window_ms > 0
            && capture.packet == entry.packet
            && t.saturating_sub(entry.admitted_at) < window_ms
        {
            self.ledger.stats.dropped_duplicate += 1;
            if entry.held.take().is_some() {
                self.held -= 1;
                self.ledger.stats.held_discarded += 1;
            }
            return;
        }

        let due = entry.due(min_interval_ms);
        if t < due {
            self.ledger.stats.throttled += 1;
            if entry.held.replace(capture).is_some() {
                self.ledger.stats.held_replaced += 1;
            } else {
                self.held += 1;
                self.next_gen += 1;
                entry.hold_gen = self.next_gen;
                self.due.push(Reverse((due, self.next_gen, mac)));
            }
            return;
        }

        admit_tracked(entry, &mut self.ledger, capture, t, out);
    }

    /// Admits every held capture whose interval has ended by `now_ms` (the newest
    /// capture time seen, or boot time now for live sources), and forgets MACs that
    /// no longer matter.
    pub fn release_due(&mut self, now_ms: EpochMillis, out: &mut Vec<Capture>) {
        while let Some(&Reverse((due, gen, mac))) = self.due.peek() {
            if due > now_ms {
                break;
            }
            self.due.pop();
            let Some(entry) = self.macs.get_mut(&mac) else {
                continue;
            };
            if entry.hold_gen != gen {
                continue;
            }
            if let Some(held) = entry.held.take() {
                self.held -= 1;
                admit_tracked(entry, &mut self.ledger, held, due, out);
            }
        }
        self.prune(now_ms);
        // Stale heap entries (held captures released by `offer`, replaced by a return
        // to the admitted state, or evicted) are dropped lazily; keep them bounded.
        if self.due.len() > 2 * self.held + 1024 {
            self.rebuild_due();
        }
    }

    /// Admits every held capture now, whether or not its interval has ended (the
    /// source ended, or shutdown). The admission time of each is still the end of its
    /// interval, so later offers keep the one-per-interval rule.
    pub fn drain(&mut self, out: &mut Vec<Capture>) {
        let interval = self.settings.min_interval_ms;
        for (_, entry) in self.macs.iter_mut() {
            if let Some(held) = entry.held.take() {
                let due = entry.due(interval);
                admit_tracked(entry, &mut self.ledger, held, due, out);
            }
        }
        self.held = 0;
        self.due.clear();
    }

    /// New settings (config reload), keeping what is tracked and held. A smaller
    /// `max_tracked` takes effect as new MACs arrive.
    pub fn set_settings(&mut self, settings: DedupSettings) {
        let interval_changed = settings.min_interval_ms != self.settings.min_interval_ms;
        self.settings = settings;
        if interval_changed {
            self.rebuild_due();
        }
    }

    pub fn settings(&self) -> DedupSettings {
        self.settings
    }

    pub fn stats(&self) -> DedupStats {
        DedupStats {
            tracked: self.macs.len(),
            ..self.ledger.stats
        }
    }

    /// How many captures are held now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Forgets the least recently offered MACs whose window and interval have both
    /// passed by `now_ms` and that hold nothing; stops at the first that still matters,
    /// so the cost is what it removes.
    fn prune(&mut self, now_ms: EpochMillis) {
        let keep_for = self
            .settings
            .window_ms
            .max(self.settings.min_interval_ms)
            .max(0);
        while let Some((_, entry)) = self.macs.front() {
            if entry.held.is_some() || now_ms.saturating_sub(entry.admitted_at) < keep_for {
                break;
            }
            self.macs.pop_front();
        }
    }

    /// Evicts least recently offered MACs until one more fits; a held capture of an
    /// evicted MAC is admitted rather than lost.
    fn make_room(&mut self, out: &mut Vec<Capture>) {
        let max = self.settings.max_tracked.max(1);
        while self.macs.len() >= max {
            let Some((_, mut entry)) = self.macs.pop_front() else {
                break;
            };
            self.ledger.stats.evicted += 1;
            if let Some(held) = entry.held.take() {
                self.held -= 1;
                let due = entry.due(self.settings.min_interval_ms);
                self.ledger.admit(held, due, out);
            }
        }
    }

    fn rebuild_due(&mut self) {
        let interval = self.settings.min_interval_ms;
        self.due = self
            .macs
            .iter()
            .filter(|(_, e)| e.held.is_some())
            .map(|(mac, e)| Reverse((e.due(interval), e.hold_gen, *mac)))
            .collect();
    }
}

/// Records `capture` as the MAC's last admitted state and admits it.
fn admit_tracked(
    entry: &mut Tracked,
    ledger: &mut Ledger,
    capture: Capture,
    at: EpochMillis,
    out: &mut Vec<Capture>,
) {
    entry.packet.clear();
    entry.packet.push_str(&capture.packet);
    entry.admitted_at = at;
    ledger.admit(capture, at, out);
}

#[cfg(test)]
mod tests {
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
            product_id: "tape".to_string(),
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

    #[test]
    fn the_newest_held_capture_is_admitted_when_the_interval_ends_and_older_ones_are_not() {
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
        #[test]
        fn one_tape_is_never_admitted_twice_within_min_interval_and_its_last_state_is_admitted(
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
}
