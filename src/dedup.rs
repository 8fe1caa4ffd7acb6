/*!
Per-MAC deduplication on capture time. Pure and synchronous: time is passed in, and it
is capture time, so replaying the same input gives the same admissions. For a live
capture that time is its boot time ([`Capture::order_ms`]), which never steps back.
It touches the records only.

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
mod tests;
