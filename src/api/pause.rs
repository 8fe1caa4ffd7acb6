/*!
The service's `Retry-After`, honoured by every decode request of this process from the
instant an answer asking for it is read.

Why it is here, in the client, and not only in the flusher's planner: the planner learns
of an answer when the flusher's loop gets to it, and by then the loop may have launched
more (a fetch was under way), and a request task launched before may be just about to
send (it was waiting for a token, say). The gate closes in the request task that reads
the answer, before that task even reads the body; every decode request passes it last
thing before it goes on the wire, so that once a 429 (or a 503 with `Retry-After`) has
been read, nothing is sent to the decode endpoint before the time it names (capped at
[`RETRY_AFTER_MAX`], as everywhere). Only requests already on the wire when the answer
was read may land inside the pause. A 401 answered and retried with a new token passes
the gate again. A request waits for the gate holding nothing (its token, and what it
carries, are taken once the gate is open: `wire.rs`), so that a batch waiting out a
`Retry-After` holds no claim on its captures.

Both events, a request passing and an answer closing the gate, are numbered in one
sequence under the gate's lock, and logged at TRACE (`tapegate::api::pause`) with that
number and the time, so that a test (or an operator) can check the promise from the
log: no request numbered after a pause began was sent before it ended.
*/

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::util::backoff::RETRY_AFTER_MAX;

/// The instant the process's gate times are counted from (microseconds, in the log).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros(at: Instant) -> u64 {
    at.saturating_duration_since(epoch()).as_micros() as u64
}

/// The gate all decode requests of one client (and its clones) pass.
#[derive(Debug)]
pub(crate) struct DecodeGate {
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// No request passes before this.
    until: Option<Instant>,
    /// Events so far (passes and pauses), in the order they took the lock.
    seq: u64,
}

impl DecodeGate {
    pub(crate) fn new() -> DecodeGate {
        epoch();
        DecodeGate {
            state: Mutex::new(GateState::default()),
        }
    }

    /// No lock here is held across an await, so a poisoned state is still consistent.
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Until when requests wait, if they do now.
    pub(crate) fn closed_until(&self) -> Option<Instant> {
        let now = Instant::now();
        self.lock().until.filter(|u| *u > now)
    }

    /// Waits until no pause holds (before a request takes its token, and what it
    /// holds, so that a long pause leaves it with neither: `wire.rs`).
    pub(crate) async fn wait_open(&self, correlation_id: &str) {
        while let Some(until) = self.closed_until() {
            tracing::debug!(
                correlation_id,
                wait_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64,
                "decode request waits for the service's Retry-After"
            );
            tokio::time::sleep_until(until).await;
        }
    }

    /// Waits until no pause holds, then lets one request (`correlation_id`) through.
    #[cfg(test)]
    async fn pass(&self, correlation_id: &str) {
        loop {
            self.wait_open(correlation_id).await;
            if self.try_pass(correlation_id) {
                return;
            }
        }
    }

    /// Lets one request (`correlation_id`) through if no pause holds now (the caller
    /// sends it at once); `false` when one does, and nothing passed.
    pub(crate) fn try_pass(&self, correlation_id: &str) -> bool {
        let mut st = self.lock();
        let now = Instant::now();
        if st.until.is_some_and(|u| u > now) {
            return false;
        }
        st.seq += 1;
        tracing::trace!(
            gate_seq = st.seq,
            at_us = micros(now),
            correlation_id,
            "decode request on the wire"
        );
        true
    }

    /// An answer to `correlation_id` asked for `retry_after`: no request passes before
    /// then (capped at [`RETRY_AFTER_MAX`]; a later pause already set stays).
    pub(crate) fn hold(&self, retry_after: Duration, correlation_id: &str) {
        let mut st = self.lock();
        let now = Instant::now();
        let until = now + retry_after.min(RETRY_AFTER_MAX);
        let until = st.until.map_or(until, |u| u.max(until));
        st.until = Some(until);
        st.seq += 1;
        tracing::trace!(
            gate_seq = st.seq,
            at_us = micros(now),
            until_us = micros(until),
            correlation_id,
            "decode answer read: pause"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn once_a_pause_is_read_no_request_passes_before_it_ends_even_past_any_backoff_cap() {
        let gate = std::sync::Arc::new(DecodeGate::new());
        gate.pass("a").await;
        let t0 = Instant::now();
        gate.hold(Duration::from_secs(600), "a");
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move {
                gate.pass("b").await;
                Instant::now()
            }
        });
        // A shorter pause read later does not shorten it.
        tokio::time::sleep(Duration::from_secs(10)).await;
        gate.hold(Duration::from_secs(2), "c");
        assert_eq!(gate.closed_until(), Some(t0 + Duration::from_secs(600)));
        let passed = waiting.await.unwrap();
        assert_eq!(passed, t0 + Duration::from_secs(600));
        assert_eq!(gate.closed_until(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_past_an_hour_is_honoured_for_an_hour() {
        let gate = DecodeGate::new();
        let t0 = Instant::now();
        gate.hold(Duration::from_secs(86_400), "a");
        assert_eq!(gate.closed_until(), Some(t0 + RETRY_AFTER_MAX));
        gate.pass("b").await;
        assert_eq!(Instant::now(), t0 + RETRY_AFTER_MAX);
    }
}
