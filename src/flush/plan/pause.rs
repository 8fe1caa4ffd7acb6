//! The pause of new sends, as pure state (after rumqttc's `MqttState`): the backoff of
//! a failure streak, never shorter than the service's `Retry-After`, and until when it
//! holds. It touches nothing but [`Backoff`]; time and jitter are passed in.

use std::time::Duration;

use tokio::time::Instant;

use super::step::Note;
use crate::util::backoff::{Backoff, RETRY_AFTER_MAX};

#[derive(Debug)]
pub(super) struct Pause {
    pub(super) backoff: Backoff,
    pub(super) until: Option<Instant>,
    /// A failure was noted and no batch answered since.
    pub(super) failing: bool,
}

impl Pause {
    pub(super) fn new(initial: Duration, max: Duration) -> Pause {
        Pause {
            backoff: Backoff::new(initial, max),
            until: None,
            failing: false,
        }
    }

    /// Until when new sends pause, if they still do at `now`.
    pub(super) fn until(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|t| *t > now)
    }

    /// The end of the last pause, past or not.
    pub(super) fn last_until(&self) -> Option<Instant> {
        self.until
    }

    /// New sends pause for the next backoff delay (never shorter than `retry_after`);
    /// a pause already longer stays. Returns the note that says so.
    pub(super) fn start(
        &mut self,
        cause: String,
        label: &'static str,
        retry_after: Option<Duration>,
        now: Instant,
        jitter: f64,
    ) -> Note {
        let delay = self.backoff.next_delay(jitter, retry_after);
        let server = retry_after.is_some_and(|r| r.min(RETRY_AFTER_MAX) >= delay);
        let until = now + delay;
        self.until = Some(self.until.map_or(until, |p| p.max(until)));
        self.failing = true;
        Note::BackOff {
            cause,
            label,
            delay,
            server,
        }
    }

    /// A batch was answered with items: the streak ends (a pause already set stays: the
    /// server's `Retry-After` holds even when a batch sent before it is answered after
    /// it). Returns whether a streak was running.
    pub(super) fn answered(&mut self) -> bool {
        self.backoff.reset();
        std::mem::take(&mut self.failing)
    }
}
