/*!
The flusher: drains the outbox into the bulk decode endpoint, several batches in flight.

Its decisions are a pure planner ([`plan`]: batch composition, the split queue, the
413 limit, isolation of failing captures, attempt bounds, backoff, the concurrency
window), and what an answer means is one function ([`answer::classify`]). This file
is the shell that carries the plan out: it fetches batches from the outbox, sends each
as its own task, records each answer in the outbox (a row leaves `pending` only in the
transaction that stores its reading or dead letter), logs, and keeps `status` told of
the batches in flight and the concurrency limit.

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
- **One fate per capture.** A fetch claims the rows it returns in the outbox, and the
  outbox never evicts a claimed row; claims end when the outcome is recorded or the
  planner hands them back (carried by the next outbox call, so the normal path costs no
  extra call). A parked or split part claims its rows again before it is sent, and
  rows evicted while it waited are dropped, never sent.
- **Health follows what the flusher decides**: an answer it backs off from is a
  failure, one that settles captures is progress (`Metrics::delivery_failed`,
  `Metrics::delivery_progressed`), whatever the service's words.

Shutdown: `stop` ends new sends and waits for the answers of the batches in flight;
`abandon` drops them (their rows stay pending and are sent again at the next start).
*/

pub mod answer;
mod deadlog;
pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::{ApiError, BulkAnswerItem, BulkItem, ServiceClient};
use crate::clock::{rfc3339, SharedClock};
use crate::config::{FlushSettings, MacFormat};
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::{AnswerNotes, FlusherState, Outbox, OutboxError, Outcome, PendingCapture};
use crate::systemd::Beat;

pub use answer::{classify, Action};
pub use deadlog::{DeadLetterLog, DEAD_LETTER_LOG_EVERY};
pub use plan::{Batch, BatchId, Note, Part, Planner, Resolution, Step};

/// Rows looked at, at most, to fill one batch.
const SCAN_LIMIT: usize = 20_000;

/// The longest the flusher waits without a turn (for the watchdog, and to notice work
/// that did not come through ingest, such as dead letters re-queued from the CLI).
const IDLE_RECHECK: Duration = Duration::from_secs(5);

/// What the flusher did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub batches: u64,
    pub delivered: u64,
    pub dead_letters: u64,
    pub failures: u64,
}

/// The flusher's inputs.
pub struct Flusher {
    pub client: ServiceClient,
    pub outbox: Outbox,
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

/// How the flusher is told to end.
pub struct FlushControl {
    /// Bumped by ingest after each commit; closed when ingest has ended.
    pub committed: watch::Receiver<u64>,
    /// Send nothing new; end once the batches in flight are answered (shutdown).
    pub stop: CancellationToken,
    /// Drop the batches in flight (shutdown grace ran out); their rows stay pending.
    pub abandon: CancellationToken,
    /// End once ingest has ended and nothing is pending (`--until-drained`).
    pub until_drained: bool,
}

/// A batch's request, answered (or failed).
struct Answered {
    batch: BatchId,
    mac_ids: Vec<String>,
    correlation_id: String,
    answer: Result<Vec<BulkAnswerItem>, ApiError>,
    elapsed: Duration,
}

/// The loop's state beside the planner.
struct Shell {
    plan: Planner,
    report: FlushReport,
    requests: JoinSet<Answered>,
    /// Which batch each request task carries (a task that panics still names it).
    tasks: HashMap<tokio::task::Id, BatchId>,
    dead_log: DeadLetterLog,
    /// A failure was logged at WARN and no batch has been answered since.
    warned: bool,
    /// Writes of the delivery error (for `status`) that failed in a row.
    unnoted: FailedInARow,
    seq: u64,
}

/// A failure that repeats while a condition lasts (a full disk), logged once when it
/// begins and once when it ends, with how many times it happened.
#[derive(Debug, Default)]
struct FailedInARow(u64);

impl FailedInARow {
    /// One more failure: `true` for the first of a run.
    fn failed(&mut self) -> bool {
        self.0 += 1;
        self.0 == 1
    }

    /// It worked: how many failures the run that ended had, if one did.
    fn worked(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.0)).filter(|n| *n > 0)
    }
}

impl Flusher {
    /// Runs until stopped (or drained, with `until_drained`).
    pub async fn run(self, mut ctl: FlushControl) -> FlushReport {
        let mut sh = Shell {
            plan: Planner::new(self.settings.clone()),
            report: FlushReport::default(),
            requests: JoinSet::new(),
            tasks: HashMap::new(),
            dead_log: DeadLetterLog::default(),
            warned: false,
            unnoted: FailedInARow::default(),
            seq: 0,
        };
        let mut ingest_done = false;

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
            let until = match step {
                Step::Send(batch) => {
                    self.send(&mut sh, batch);
                    continue;
                }
                Step::Record(settle) => {
                    self.record(&mut sh, settle, "").await;
                    continue;
                }
                Step::Claim(part) => {
                    let (ids, unclaim) = (part.ids(), sh.plan.take_unclaimed());
                    match self.outbox.call(move |s| s.claim(&ids, &unclaim)).await {
                        Ok(present) => {
                            if let Some(batch) = sh.plan.claimed(part, &present, Instant::now()) {
                                self.send(&mut sh, batch);
                            }
                        }
                        Err(OutboxError::Closed) => {
                            tracing::error!("the outbox has closed; flusher stops");
                            break;
                        }
                        Err(e) => {
                            let cause = format!("cannot read the outbox: {e}");
                            let res = sh.plan.claim_failed(part, cause, now, fastrand::f64());
                            self.carry_out(&mut sh, res, "").await;
                        }
                    }
                    continue;
                }
                Step::Fetch { max } => {
                    let busy = sh.plan.busy().clone();
                    let unclaim = sh.plan.take_unclaimed();
                    let fetched = self
                        .outbox
                        .call(move |s| s.claim_next_batch(max, SCAN_LIMIT, &busy, &unclaim))
                        .await;
                    let fetched = match fetched {
                        Ok(f) => f,
                        Err(OutboxError::Closed) => {
                            tracing::error!("the outbox has closed; flusher stops");
                            break;
                        }
                        Err(e) => {
                            // A read that fails (I/O) may work later: back off, not spin.
                            let cause = format!("cannot read the outbox: {e}");
                            let res = sh.plan.read_failed(cause, now, fastrand::f64());
                            self.carry_out(&mut sh, res, "").await;
                            continue;
                        }
                    };
                    let empty = fetched.rows.is_empty();
                    // Time has passed (the fetch), and a pause may have begun: the
                    // planner decides at the time it decides.
                    match sh.plan.offer(fetched, ingest_done, Instant::now()) {
                        Step::Send(batch) => {
                            self.send(&mut sh, batch);
                            continue;
                        }
                        Step::Wait(until) => {
                            if empty && ctl.until_drained && ingest_done && sh.plan.is_idle() {
                                break;
                            }
                            until
                        }
                        Step::Fetch { .. } | Step::Record(_) | Step::Claim(_) => None,
                    }
                }
                Step::Wait(until) => until,
            };
            let cap = now + IDLE_RECHECK;
            let until = until.map_or(cap, |u| u.min(cap));
            tokio::select! {
                Some(joined) = sh.requests.join_next_with_id(), if !sh.requests.is_empty() => {
                    self.answered(&mut sh, joined).await;
                }
                r = ctl.committed.changed(), if !ingest_done => {
                    ingest_done = r.is_err();
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
                    break;
                }
            }
        }
        let state = FlusherState {
            ok_at: None,
            in_flight: 0,
            concurrency: sh.plan.window(),
        };
        if let Err(e) = self.outbox.call(move |s| s.note_flusher(&state)).await {
            tracing::debug!(error = %e, "could not record the flusher's state");
        }
        sh.report
    }

    /// Sends `batch` as a task of its own.
    fn send(&self, sh: &mut Shell, batch: Batch) {
        sh.seq += 1;
        sh.report.batches += 1;
        let correlation_id = format!("{}-{}-{}", self.gateway_id, self.clock.wall_ms(), sh.seq);
        let mac_ids: Vec<String> = batch
            .rows
            .iter()
            .map(|p| self.mac_format.format(p.capture.mac))
            .collect();
        let items: Vec<BulkItem> = batch
            .rows
            .iter()
            .zip(&mac_ids)
            .map(|(p, mac_id)| BulkItem {
                mac_id: mac_id.clone(),
                ble_packet: p.capture.packet.clone(),
                product_id: p.capture.product_id.clone(),
                scan_time: (p.capture.ts_ms.div_euclid(1000)).to_string(),
            })
            .collect();
        tracing::debug!(
            correlation_id,
            items = items.len(),
            in_flight = sh.plan.in_flight(),
            concurrency_limit = sh.plan.window(),
            "batch sent"
        );
        let client = self.client.clone();
        let id = batch.id;
        let metrics = self.metrics.clone();
        let clock = self.clock.clone();
        let rows = batch.rows.clone();
        let task = async move {
            let started = Instant::now();
            let request = metrics.request();
            let answer = client.decode_bulk(&items, &correlation_id).await;
            let failure = match &answer {
                Ok(items) if items.is_empty() => Some("empty_answer"),
                Ok(_) => None,
                Err(e) => Some(e.label()),
            };
            request.answered(&rows, failure, clock.wall_ms());
            Answered {
                batch: id,
                mac_ids,
                correlation_id,
                answer,
                elapsed: started.elapsed(),
            }
        };
        let handle = sh.requests.spawn(task.in_current_span());
        sh.tasks.insert(handle.id(), id);
    }

    /// Carries out what an answer means.
    async fn answered(
        &self,
        sh: &mut Shell,
        joined: Result<(tokio::task::Id, Answered), tokio::task::JoinError>,
    ) {
        let (action, batch, correlation_id) = match joined {
            Ok((task, a)) => {
                sh.tasks.remove(&task);
                tracing::debug!(
                    correlation_id = a.correlation_id,
                    items = a.mac_ids.len(),
                    ms = a.elapsed.as_millis() as u64,
                    ok = a.answer.is_ok(),
                    "batch answered"
                );
                (classify(&a.mac_ids, a.answer), a.batch, a.correlation_id)
            }
            Err(e) => {
                // A request task that panicked: its batch failed like a lost answer.
                let Some(batch) = sh.tasks.remove(&e.id()) else {
                    return;
                };
                tracing::error!(error = %e, "a request task failed; its batch will be sent again");
                let cause = "request task failed".to_string();
                let action = Action::Retry {
                    cause,
                    label: "task_failed",
                    retry_after: None,
                    isolate: false,
                };
                (action, batch, String::new())
            }
        };
        let res = sh
            .plan
            .answered(batch, action, Instant::now(), fastrand::f64());
        self.carry_out(sh, res, &correlation_id).await;
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
        let rows = settle.clone();
        let at = self.clock.wall_ms();
        let notes = AnswerNotes {
            flusher: Some(FlusherState {
                ok_at: (delivered > 0).then_some(at),
                in_flight: sh.plan.in_flight(),
                concurrency: sh.plan.window(),
            }),
            heard: self.heard.changes(&settle),
        };
        let unclaim = sh.plan.take_unclaimed();
        let written = self
            .outbox
            .call(move |s| {
                s.unclaim(&unclaim);
                s.settle_noting(&rows, at, &notes)
            })
            .await;
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

    /// Logs one note of the planner (and records a backoff's cause for `status`).
    async fn note(&self, sh: &mut Shell, note: Note, correlation_id: &str) {
        match note {
            Note::Split { items, reason } => tracing::info!(
                correlation_id,
                items,
                reason,
                "the service refused the batch (400); splitting it to find what it refuses"
            ),
            Note::Isolating { items, cause } => tracing::info!(
                correlation_id,
                items,
                cause,
                "a batch keeps failing while others are delivered; splitting it to find the capture at fault"
            ),
            Note::Shrunk { sent, limit } => tracing::warn!(
                correlation_id,
                sent,
                new_limit = limit,
                "the service said the batch was too large (413); sending smaller batches from now on"
            ),
            Note::Window { from, to } if to < from => tracing::info!(
                from,
                to,
                in_flight = sh.plan.in_flight(),
                "fewer batches in flight while the service struggles"
            ),
            Note::Window { from, to } => tracing::debug!(
                from,
                to,
                in_flight = sh.plan.in_flight(),
                "more batches in flight"
            ),
            Note::Recovered => {
                if std::mem::take(&mut sh.warned) {
                    tracing::info!(correlation_id, "delivery recovered");
                }
            }
            Note::BackOff {
                cause,
                delay,
                server,
                ..
            } => {
                sh.report.failures += 1;
                let cause = if server {
                    format!(
                        "{cause} until {} (the service's Retry-After)",
                        rfc3339(self.clock.wall_ms() + delay.as_millis() as i64)
                    )
                } else {
                    cause
                };
                let retry_in_ms = delay.as_millis() as u64;
                let (in_flight, window) = (sh.plan.in_flight(), sh.plan.window());
                if std::mem::replace(&mut sh.warned, true) {
                    tracing::debug!(correlation_id, cause, retry_in_ms, "delivery failed again");
                } else {
                    tracing::warn!(
                        correlation_id,
                        cause,
                        retry_in_ms,
                        in_flight,
                        concurrency_limit = window,
                        "delivery failed; backing off"
                    );
                }
                let at = self.clock.wall_ms();
                self.metrics
                    .set_paused_until(at + delay.as_millis() as i64);
                let state = FlusherState {
                    ok_at: None,
                    in_flight,
                    concurrency: window,
                };
                let unclaim = sh.plan.take_unclaimed();
                let written = self
                    .outbox
                    .call(move |s| {
                        s.unclaim(&unclaim);
                        s.note_error(&cause, at)?;
                        s.note_flusher(&state)
                    })
                    .await;
                // Logged when it starts failing and when it works again, not at every
                // backoff while the disk stays full.
                match written {
                    Err(e) => {
                        if sh.unnoted.failed() {
                            tracing::warn!(
                                error = %e,
                                "could not record the delivery error for status; not logged again until it can be"
                            );
                        }
                    }
                    Ok(()) => {
                        if let Some(failed) = sh.unnoted.worked() {
                            tracing::info!(
                                failed,
                                "the delivery error is recorded for status again, after {failed} failed attempts"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_failure_is_told_when_it_begins_and_when_it_ends_with_its_count() {
        let mut f = FailedInARow::default();
        assert_eq!(f.worked(), None, "nothing to tell");
        assert!(f.failed(), "the first failure is logged");
        assert!(!f.failed());
        assert!(!f.failed());
        assert_eq!(f.worked(), Some(3));
        assert_eq!(f.worked(), None);
        assert!(f.failed(), "a new run is logged again");
    }
}
