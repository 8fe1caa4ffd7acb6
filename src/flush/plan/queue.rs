//! The queue of parked, split and isolating parts ([`Queued`]), each due at its own
//! time, and the bound on what it holds. Part of [`Planner`]: it touches the queue, the
//! rows to hand back and the busy MACs, nothing of the window or the pause. A part here
//! holds no claim on its rows: the outbox may evict them while it waits, and its request
//! claims what is left as it goes (see [`Planner::gone`]).

use std::time::Duration;

use tokio::time::Instant;

use super::step::{Origin, Queued};
use super::Planner;
use crate::outbox::{PendingCapture, Seen};

impl Planner {
    /// Earliest time a queued batch is due, if any waits.
    pub(super) fn next_queued(&self) -> Option<Instant> {
        self.queue.iter().map(|q| q.not_before).min()
    }

    /// The delay of a parked batch after `failures` failures: half fixed, half jitter,
    /// never a tight loop, never in step with the others.
    pub(super) fn park_delay(&self, failures: u32, jitter: f64) -> Duration {
        let exp = self
            .settings
            .backoff_initial
            .saturating_mul(1u32 << failures.min(20))
            .min(self.settings.backoff_max);
        exp / 2 + exp.mul_f64(jitter.clamp(0.0, 1.0)) / 2
    }

    /// Parks `rows` (read at `seen`) until `not_before`, their MACs held, so that other
    /// captures go first: either they are answered (and the parked ones then know where
    /// they stand) or the service is down for everyone. Past the bound, left to the
    /// outbox instead.
    pub(super) fn park(
        &mut self,
        rows: Vec<PendingCapture>,
        origin: Origin,
        seen: Seen,
        not_before: Instant,
    ) {
        if self.held_rows() + rows.len() > self.park_max() {
            return self.release(rows);
        }
        self.queue.push_back(Queued {
            rows,
            origin,
            seen,
            not_before,
        });
    }

    /// Rows held in the queue.
    pub(super) fn held_rows(&self) -> usize {
        self.queue.iter().map(|q| q.rows.len()).sum()
    }

    /// Rows the queue may hold when parking failed batches: memory stays bounded in an
    /// outage of any length.
    pub(super) fn park_max(&self) -> usize {
        2 * self.settings.max_in_flight.max(1) * self.settings.max_batch.max(1)
    }

    /// Splits `rows` in halves, both sent before anything new, the first half first.
    pub(super) fn bisect(
        &mut self,
        mut rows: Vec<PendingCapture>,
        origin: Origin,
        seen: Seen,
        now: Instant,
    ) {
        let second = rows.split_off(rows.len() / 2);
        for half in [second, rows] {
            self.queue.push_front(Queued {
                rows: half,
                origin,
                seen,
                not_before: now,
            });
        }
    }
}
