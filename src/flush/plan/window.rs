//! The concurrency window (AIMD, after vector's adaptive request concurrency), as pure
//! state (after rumqttc's `MqttState`): how many batches may be in flight, grown by one
//! on fast clean answers and halved once per round of failures. Touches nothing else.

use std::time::Duration;

use tokio::time::Instant;

use super::step::Note;

/// The window grows past this many batches only while answers are slow (the usual
/// answer takes [`SLOW_ANSWER`] or more): below it, this many batches of 250 already
/// carry 40,000 captures/s, more than a gateway encodes, and a wider window only costs
/// (fetches past busy tapes, smaller batches, connections).
const FAST_WINDOW: usize = 8;
const SLOW_ANSWER: Duration = Duration::from_millis(50);

/// Past [`FAST_WINDOW`], the window grows only while the answers' latency says fewer
/// than this many batches wait in a queue (after TCP Vegas: `size x (usual - least) /
/// usual`, `least` the quickest answer to a full batch). A slow link adds latency
/// whatever the window, and a wider window carries more; a busy gateway (a Pi's CPU,
/// answers parsed and settled one after another) or a busy service adds latency in
/// proportion to the window, and a wider one only queues more batches in memory (seen on
/// a daemon slowed to a quarter of a core; `docs/benchmarks.md`).
const QUEUED_MAX: f64 = 2.0;

#[derive(Debug)]
pub(super) struct Window {
    /// Batches in flight at most now, `1..=max_in_flight`.
    pub(super) size: usize,
    /// When the window last halved: batches sent before it do not halve it again.
    last_decrease: Option<Instant>,
    /// Smoothed latency of clean answers.
    rtt: Option<Duration>,
    /// The quickest clean answer to a full batch since the window last halved (the
    /// link's own latency, as near as the gateway can tell).
    least: Option<Duration>,
}

impl Window {
    pub(super) fn new() -> Window {
        Window {
            size: 1,
            last_decrease: None,
            rtt: None,
            least: None,
        }
    }

    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// A batch was answered with items after `latency`. `grows`: it was answered in
    /// full, and it was a full batch sent while the window was in use. The window
    /// grows by one (up to `max_in_flight`) when the answer was no slower than twice
    /// the usual, and past [`FAST_WINDOW`] only on a slow uplink that is not already
    /// queueing batches ([`QUEUED_MAX`]).
    pub(super) fn answered(
        &mut self,
        latency: Duration,
        grows: bool,
        max_in_flight: usize,
    ) -> Option<Note> {
        let usual = self.rtt.unwrap_or(latency);
        self.rtt = Some((usual * 7 + latency) / 8);
        if grows {
            self.least = Some(self.least.map_or(latency, |l| l.min(latency)));
        }
        let wider = self.size < FAST_WINDOW || (usual >= SLOW_ANSWER && !self.queueing(usual));
        if grows && latency <= usual * 2 && wider {
            let to = (self.size + 1).min(max_in_flight.max(1));
            return self.set(to);
        }
        None
    }

    /// Whether answers as slow as `usual` say more than [`QUEUED_MAX`] batches wait
    /// in a queue, the link's own latency being the quickest answer seen.
    fn queueing(&self, usual: Duration) -> bool {
        let least = self.least.unwrap_or(usual).min(usual);
        let queued = self.size as f64 * (usual - least).as_secs_f64() / usual.as_secs_f64();
        queued > QUEUED_MAX
    }

    /// Halves the window, once per round: a batch sent before the last decrease is
    /// news of the same trouble. The link may have changed: its latency is learnt
    /// again.
    pub(super) fn decrease(&mut self, sent_at: Instant, now: Instant) -> Option<Note> {
        if self.last_decrease.is_some_and(|d| sent_at < d) {
            return None;
        }
        self.last_decrease = Some(now);
        self.least = None;
        self.set((self.size / 2).max(1))
    }

    fn set(&mut self, to: usize) -> Option<Note> {
        if to == self.size {
            return None;
        }
        let from = std::mem::replace(&mut self.size, to);
        Some(Note::Window { from, to })
    }
}
