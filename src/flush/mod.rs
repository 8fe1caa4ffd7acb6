/*!
The flusher: drains the outbox into the bulk decode endpoint, several batches in flight.

Its decisions are a pure planner ([`plan`]: batch composition, the split queue, the
413 limit, isolation of failing captures, attempt bounds, backoff, the concurrency
window), and what an answer means is one function ([`answer::classify`]). This file
is the shell that carries the plan out: it fetches batches from the outbox, sends each
as its own task, records each answer in the outbox (a row leaves `pending` only in the
transaction that stores its reading or dead letter), logs, and keeps its state (the
batches in flight, the concurrency limit, the last good flush) published in memory and
written for `status` within a bound. It touches the outbox only through its handle
([`FlusherOutbox`]: fetch, claim, settle, note). Its rooms, by seam: the loop's state
beside the planner, a batch's request task and its answer, the claims that task takes on
the wire, what a planner's note logs and records.

| answer | action |
|---|---|
| 200, item decoded | reading stored, row removed |
| 200, item with `error` | dead letter with the server's error, row removed |
| 200, item missing (or with neither `qr_code` nor `error`) | row stays, retried; after `flush.max_attempts` such answers a dead letter |
| 400 on the whole batch | split in halves until the refused items are alone; a capture refused alone is a dead letter with the server's message once the service has taken a request of ours sent since its first refusal; until then (every half refused alike: the request is what it refuses, whatever the message says) it is kept, new sends pause and the cause is reported |
| 401 (after the client's one fresh-token retry) | back off, "credentials or permission" |
| 413 | halve the batch size for this run; that size is never sent again |
| 429, 5xx, timeout, connection error, unreadable answer | back off (full jitter, `Retry-After` honoured even past `backoff_max`, for the whole gateway: see below), fewer batches in flight; a batch that keeps failing while others are answered is split to isolate the capture, which becomes a dead letter after `flush.max_attempts` failures on its own |

Every decision is taken by kind (status, endpoint, transport, the structure of the
answer, the evidence of a split), never by the words of a message (spec 7).

The promises, and what keeps each:
- **`Retry-After` is a pause of the whole gateway.** The request task that reads a 429
  (or a 503 with `Retry-After`) closes the client's decode gate at once (`api::pause`):
  a request already launched but not yet on the wire waits there. The planner, once it
  has the answer, launches nothing until then: no new batch, no parked or split part,
  nothing a fetch under way found. Only requests already on the wire may land inside
  the pause.
- **One fate per capture, and the oldest evicted first.** The outbox never evicts a
  claimed row, and only a request on the wire claims: it claims its batch's rows once
  its token is in hand and no pause holds (`claims.rs`, `api::wire`), and sends only
  those still pending; the claims end when the outcome is recorded, or at once when the
  answer settles nothing. A batch waiting (to fill, parked, split, out a backoff or a
  `Retry-After`, for a token) holds none, so the outbox evicts in age order whatever
  waits, and rows evicted from a batch are dropped from it, never sent.
- **Health follows what the flusher decides**: an answer it backs off from is a
  failure, one that settles captures is progress (`Metrics::delivery_failed`,
  `Metrics::delivery_progressed`), whatever the service's words.

Shutdown: `stop` ends new sends and waits for the answers of the batches in flight;
`abandon` drops them (their rows stay pending and are sent again at the next start).
*/

pub mod answer;
mod claims;
mod control;
mod deadlog;
mod notes;
pub mod plan;
mod send;
mod shell;
mod state;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::ServiceClient;
use crate::clock::SharedClock;
use crate::config::{FlushSettings, MacFormat};
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::{AnswerNotes, FlusherOutbox, OutboxError, Outcome, PendingCapture};
use crate::util::systemd::Beat;

pub use answer::{classify, Action};
pub use control::{FlushControl, FlushReport};
pub use deadlog::{DeadLetterLog, DEAD_LETTER_LOG_EVERY};
pub use plan::{Batch, BatchId, Note, Planner, Resolution, Step};
pub use state::STATE_EVERY;

use shell::Shell;

/// Rows looked at, at most, to fill one batch.
const SCAN_LIMIT: usize = 20_000;

/// The longest the flusher waits without a turn (for the watchdog, and to notice work
/// that did not come through ingest, such as dead letters re-queued from the CLI).
const IDLE_RECHECK: Duration = Duration::from_secs(5);

/// What a turn of the loop leads to.
enum Turn {
    /// Take the next step at once.
    Again,
    /// Wait for something to happen, at most until then.
    Wait(Option<Instant>),
    /// The flusher ends.
    End,
}

/// The flusher: its inputs, and the loop in `run`.
pub struct Flusher {
    pub client: ServiceClient,
    pub outbox: FlusherOutbox,
    pub settings: FlushSettings,
    pub mac_format: MacFormat,
    pub gateway_id: String,
    /// The tapes heard: told what the service said of each (for `device add --nearest`).
    pub heard: Arc<HeardNow>,
    /// Touched on every turn, for the watchdog.
    pub beat: Beat,
    /// Request latency, batch sizes, failures by cause, for `/metrics` and `/healthz`.
    pub metrics: Arc<Metrics>,
    /// The daemon's clock (correlation ids, the times `status` shows, pruning).
    pub clock: SharedClock,
}

impl Flusher {
    /// Runs until stopped (or drained, with `until_drained`).
    pub async fn run(self, mut ctl: FlushControl) -> FlushReport {
        let mut sh = Shell::new(&self.settings);
        loop {
            self.beat.touch();
            let now = Instant::now();
            let stopping = ctl.stop.is_cancelled();
            if stopping && sh.requests.is_empty() {
                break;
            }
            let step = if stopping {
                Step::Wait(None)
            } else {
                sh.plan.next(now)
            };
            let until = match self.take(&mut sh, step, now, &ctl).await {
                Turn::Again => continue,
                Turn::End => break,
                Turn::Wait(until) => until,
            };
            let until = self.keep_state(&mut sh, until).await;
            if !self.wait(&mut sh, &mut ctl, now, until, stopping).await {
                break;
            }
        }
        self.stopped(&mut sh).await;
        sh.report
    }

    /// Carries out one step of the planner.
    async fn take(&self, sh: &mut Shell, step: Step, now: Instant, ctl: &FlushControl) -> Turn {
        match step {
            Step::Send(batch) => {
                self.send(sh, batch);
                Turn::Again
            }
            Step::Record(settle) => {
                self.record(sh, settle, "").await;
                Turn::Again
            }
            Step::Fetch { max } => self.fetch(sh, max, now, ctl).await,
            Step::Wait(until) => Turn::Wait(until),
        }
    }

    /// Fetches the next batch and offers it to the planner.
    async fn fetch(&self, sh: &mut Shell, max: usize, now: Instant, ctl: &FlushControl) -> Turn {
        let (busy, unclaim) = (sh.plan.busy().clone(), sh.plan.take_unclaimed());
        let fetched = match self.outbox.fetch(max, SCAN_LIMIT, busy, unclaim).await {
            Ok(f) => f,
            Err(OutboxError::Closed) => return closed(),
            Err(e) => {
                // A read that fails (I/O) may work later: back off, not spin.
                let cause = format!("cannot read the outbox: {e}");
                let res = sh.plan.read_failed(cause, now, fastrand::f64());
                self.carry_out(sh, res, "").await;
                return Turn::Again;
            }
        };
        let empty = fetched.rows.is_empty();
        // Time has passed (the fetch), and a pause may have begun: the planner decides
        // at the time it decides.
        match sh.plan.offer(fetched, sh.ingest_done, Instant::now()) {
            Step::Send(batch) => {
                self.send(sh, batch);
                Turn::Again
            }
            Step::Wait(_) if empty && ctl.until_drained && sh.ingest_done && sh.plan.is_idle() => {
                Turn::End
            }
            Step::Wait(until) => Turn::Wait(until),
            Step::Fetch { .. } | Step::Record(_) => Turn::Wait(None),
        }
    }

    /// Waits for an answer, a commit, the time `until` (capped for the watchdog) or
    /// shutdown; `false` when the batches in flight were abandoned.
    async fn wait(
        &self,
        sh: &mut Shell,
        ctl: &mut FlushControl,
        now: Instant,
        until: Option<Instant>,
        stopping: bool,
    ) -> bool {
        let cap = now + IDLE_RECHECK;
        let until = until.map_or(cap, |u| u.min(cap));
        tokio::select! {
            Some(joined) = sh.requests.join_next_with_id(), if !sh.requests.is_empty() => {
                self.answered(sh, joined).await;
            }
            r = ctl.committed.changed(), if !sh.ingest_done => {
                sh.ingest_done = r.is_err();
                sh.plan.committed();
            }
            _ = tokio::time::sleep_until(until) => {}
            _ = ctl.stop.cancelled(), if !stopping => {}
            _ = ctl.abandon.cancelled() => {
                tracing::warn!(
                    batches = sh.requests.len(),
                    "shutdown: abandoned the batches in flight; their captures stay pending"
                );
                sh.requests.abort_all();
                sh.plan.abandon_in_flight();
                return false;
            }
        }
        true
    }

    /// Publishes the state to this daemon's readers and writes it for `status` when it
    /// is due (`state.rs`); returns `until`, brought forward to when a write falls due.
    async fn keep_state(&self, sh: &mut Shell, until: Option<Instant>) -> Option<Instant> {
        let state = sh.state();
        self.outbox.publish(state);
        let now = Instant::now();
        if let Some(due) = sh.state.due(state, now) {
            if self.outbox.note_state(due).await.is_ok() {
                sh.state.written(due, now);
            }
        }
        match sh.state.due_at(&state, now) {
            Some(at) if at > now => Some(until.map_or(at, |u| u.min(at))),
            _ => until,
        }
    }

    /// Writes the final state: nothing in flight, and the last delivery.
    async fn stopped(&self, sh: &mut Shell) {
        let state = sh.state.now(0, sh.plan.window());
        self.outbox.publish(state);
        if let Err(e) = self.outbox.note_state(state).await {
            tracing::debug!(error = %e, "could not record the flusher's state");
        }
    }

    /// Logs the notes of a resolution, tells the metrics (and so `/healthz`) whether
    /// delivery failed or progressed, and records its outcomes.
    async fn carry_out(&self, sh: &mut Shell, res: Resolution, correlation_id: &str) {
        if let Some(label) = res.backoff() {
            self.metrics.delivery_failed(label);
        } else if res.progress {
            self.metrics.delivery_progressed();
        }
        for note in res.notes {
            self.note(sh, note, correlation_id).await;
        }
        if !res.settle.is_empty() {
            self.record(sh, res.settle, correlation_id).await;
        }
    }

    /// Records outcomes in the outbox (one transaction), handing back the claims the
    /// planner let go of in the same call. If that fails, the planner keeps them and
    /// pauses; they are recorded again, never sent again. `correlation_id` names the
    /// request whose answer this is (empty for a retried recording), for the
    /// dead-letter log lines.
    async fn record(
        &self,
        sh: &mut Shell,
        settle: Vec<(PendingCapture, Outcome)>,
        correlation_id: &str,
    ) {
        let delivered = settle
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Delivered(_)))
            .count();
        let at = self.clock.wall_ms();
        // The state as it will be once this is recorded (kept only if it is).
        let mut state_notes_after = sh.state;
        if delivered > 0 {
            state_notes_after.delivered(at);
        }
        let state = state_notes_after.now(sh.plan.in_flight(), sh.plan.window());
        let now = Instant::now();
        let due = state_notes_after.due(state, now);
        let notes = AnswerNotes {
            flusher: due,
            heard: self.heard.changes(&settle),
        };
        let unclaim = sh.plan.take_unclaimed();
        let written = self.outbox.settle(unclaim, settle.clone(), at, notes).await;
        if let Err(e) = written {
            let cause = format!("could not record the service's answer: {e}");
            let res = sh
                .plan
                .record_failed(settle, cause, Instant::now(), fastrand::f64());
            if let Some(label) = res.backoff() {
                self.metrics.delivery_failed(label);
            }
            for note in res.notes {
                self.note(sh, note, "").await;
            }
            return;
        }
        if let Some(due) = due {
            state_notes_after.written(due, now);
        }
        sh.state = state_notes_after;
        self.outbox.publish(state);
        sh.plan.recorded(&settle);
        self.heard.answered(&settle);
        sh.report.delivered += delivered as u64;
        let now = Instant::now();
        for (row, outcome) in &settle {
            if let Outcome::DeadLetter(reason) = outcome {
                sh.report.dead_letters += 1;
                sh.dead_log
                    .log(row.capture.mac, reason, correlation_id, now);
            }
        }
    }
}

/// The outbox has closed (shutdown, or its thread died): the flusher ends.
fn closed() -> Turn {
    tracing::error!("the outbox has closed; flusher stops");
    Turn::End
}
