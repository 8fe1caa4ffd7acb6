//! The flusher's state (when it last delivered, batches in flight, the concurrency
//! limit): published in memory at every change, for this daemon's readers (`STATUS=`, the
//! page, `/metrics`), and written to the database for `tapegate status` (another process)
//! only when it changes meaningfully (the concurrency limit, the first delivery) or, while
//! it differs from what was written, at most once every [`STATE_EVERY`]; and at stop. So
//! `status` shows the batches in flight and the last good flush at most [`STATE_EVERY`]
//! late (a kill -9 may leave it that stale); the settle path writes it at most that often.

use std::time::Duration;

use tokio::time::Instant;

use crate::outbox::FlusherState;
use crate::record::EpochMillis;

/// The flusher's state is written at most this often, unless it changed meaningfully.
pub const STATE_EVERY: Duration = Duration::from_secs(5);

/// What was last written of the flusher's state, and when it last delivered.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct StateNotes {
    /// When a batch was last delivered, by the daemon's clock.
    last_ok: Option<EpochMillis>,
    written: Option<(FlusherState, Instant)>,
}

impl StateNotes {
    /// A batch was delivered at `at`.
    pub(super) fn delivered(&mut self, at: EpochMillis) {
        self.last_ok = Some(at);
    }

    /// The state now, from the planner's counts.
    pub(super) fn now(&self, in_flight: usize, concurrency: usize) -> FlusherState {
        FlusherState {
            ok_at: self.last_ok,
            in_flight,
            concurrency,
        }
    }

    /// When `state` is to be written, seen at `now`: at once for the first or a
    /// meaningful change, [`STATE_EVERY`] after the last write for any other; `None`
    /// when it is what was written.
    pub(super) fn due_at(&self, state: &FlusherState, now: Instant) -> Option<Instant> {
        let Some((w, at)) = self.written else {
            return Some(now);
        };
        if w == *state {
            None
        } else if w.concurrency != state.concurrency || (w.ok_at.is_none() && state.ok_at.is_some())
        {
            Some(at)
        } else {
            Some(at + STATE_EVERY)
        }
    }

    /// `state` if it is due at `now`.
    pub(super) fn due(&self, state: FlusherState, now: Instant) -> Option<FlusherState> {
        self.due_at(&state, now)
            .filter(|at| *at <= now)
            .map(|_| state)
    }

    /// `state` was written at `now`.
    pub(super) fn written(&mut self, state: FlusherState, now: Instant) {
        self.written = Some((state, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state is written at once when it changes meaningfully else at most every few
    /// seconds.
    #[tokio::test(start_paused = true)]
    async fn the_state_is_written_at_once_on_a_change_else_every_few_seconds() {
        let mut notes = StateNotes::default();
        let t0 = Instant::now();
        let first = notes.now(1, 2);
        assert_eq!(notes.due(first, t0), Some(first), "the first is written");
        notes.written(first, t0);
        assert_eq!(notes.due(first, t0), None, "unchanged: nothing to write");
        let more = notes.now(2, 2);
        assert_eq!(notes.due(more, t0 + Duration::from_secs(1)), None);
        assert_eq!(notes.due_at(&more, t0), Some(t0 + STATE_EVERY));
        assert_eq!(notes.due(more, t0 + STATE_EVERY), Some(more));
        let wider = notes.now(2, 3);
        assert_eq!(notes.due(wider, t0), Some(wider), "a new limit at once");
        notes.delivered(42);
        let ok = notes.now(1, 2);
        assert_eq!(ok.ok_at, Some(42));
        assert_eq!(notes.due(ok, t0), Some(ok), "the first delivery at once");
        notes.written(ok, t0);
        notes.delivered(43);
        assert_eq!(
            notes.due(notes.now(1, 2), t0),
            None,
            "later ones within the bound"
        );
    }
}
