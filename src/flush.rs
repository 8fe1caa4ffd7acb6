/*!
The flusher: drains the outbox into the bulk decode endpoint.

One batch is in flight at a time. A batch is the oldest pending capture of each MAC (so
each MAC at most once, and a MAC's captures go in capture order), at most
`flush.max_batch` (or less after a 413), sent when full or when the oldest pending
capture has waited `flush.max_delay_secs`.

What each answer gets is decided by one function, [`classify`]; the loop only carries
it out:

| answer | action |
|---|---|
| 200, item decoded | reading stored, row removed |
| 200, item with `error` | dead letter with the server's error, row removed |
| 200, item missing | row stays, retried |
| 400 on the whole batch | split in halves until the refused items are alone; a refused single item is dead-lettered with the server's message (but after [`MAX_REFUSED_IN_A_ROW`] in a row with no success, the request is what is refused: back off and report, keep the captures) |
| 401 (after the client's one fresh-token retry) | back off, "credentials or permission" |
| 413 | halve the batch size for this run; that size is never sent again |
| 429, 5xx, timeout, connection error, unreadable answer | exponential backoff with full jitter, `Retry-After` honoured, capped at `backoff_max` |

A batch that keeps failing transiently is halved after [`HALVE_AFTER`] failures in a row,
so that one capture the service chokes on cannot hold back the others forever.
*/

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiError, BulkAnswerItem, BulkItem, ServiceClient};
use crate::backoff::Backoff;
use crate::clock::{now_ms, rfc3339};
use crate::config::{FlushSettings, MacFormat};
use crate::metrics::Metrics;
use crate::outbox::{Outbox, Outcome, PendingCapture, Reading};
use crate::systemd::Beat;

/// Consecutive transient failures after which the next batches are halved.
pub const HALVE_AFTER: u32 = 3;

/// Single captures refused whole (400) in a row, with no answered batch between them,
/// after which the refusal is taken to be of the request, not of the captures: the
/// flusher backs off and reports it instead of dead-lettering everything.
pub const MAX_REFUSED_IN_A_ROW: u32 = 10;

/// Rows looked at, at most, to fill one batch.
const SCAN_LIMIT: usize = 20_000;

/// How often an idle flusher looks for work that did not come through ingest (dead
/// letters re-queued from the CLI).
const IDLE_RECHECK: Duration = Duration::from_secs(5);

/// How often decoded readings past retention are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// What to do with a batch after its answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Settle each row: delivered, dead letter, or (absent from the map) retry.
    Settle(Vec<(usize, Outcome)>),
    /// Refused whole: split (a single item becomes a dead letter with this message).
    Split(String),
    /// Too large: never send this many again.
    Shrink,
    /// Back off and retry; the text is the operator-readable cause.
    Retry {
        cause: String,
        retry_after: Option<Duration>,
    },
}

/// Maps the answer to a batch sent with `mac_ids` to an action. Items are matched by
/// `mac_id`, not position; a row whose MAC is not in the answer is left to retry.
pub fn classify(mac_ids: &[String], answer: Result<Vec<BulkAnswerItem>, ApiError>) -> Action {
    match answer {
        Ok(items) => {
            let mut by_mac: HashMap<&str, &BulkAnswerItem> = HashMap::with_capacity(items.len());
            for item in &items {
                by_mac.insert(item.mac_id.as_str(), item);
            }
            let outcomes = mac_ids
                .iter()
                .enumerate()
                .filter_map(|(i, mac)| {
                    let item = by_mac.get(mac.as_str())?;
                    Some((
                        i,
                        match &item.result {
                            Ok(d) => Outcome::Delivered(Reading {
                                qr_code: d.qr_code.clone(),
                                temp: d.temp,
                                bat: d.bat,
                                raw: d.raw.to_string(),
                            }),
                            Err(e) => Outcome::DeadLetter(e.clone()),
                        },
                    ))
                })
                .collect();
            Action::Settle(outcomes)
        }
        Err(ApiError::Rejected { message, .. }) => Action::Split(message),
        Err(ApiError::TooLarge { .. }) => Action::Shrink,
        Err(e) => Action::Retry {
            cause: e.operator_cause(),
            retry_after: e.retry_after(),
        },
    }
}

/// The state of a run of failures.
struct Streak {
    backoff: Backoff,
    /// A failure was logged at WARN and no batch has been answered since.
    failing: bool,
    /// Single captures refused (400) since the last answered batch.
    refused_in_a_row: u32,
}

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
    pub retention: Duration,
    /// Touched on every turn, for the watchdog.
    pub beat: Beat,
    /// Request latency, batch sizes, failures by cause, for `/metrics` and `/healthz`.
    pub metrics: Arc<Metrics>,
}

/// How the flusher is told to end.
pub struct FlushControl {
    /// Bumped by ingest after each commit; closed when ingest has ended.
    pub committed: watch::Receiver<u64>,
    /// Stop after the batch in flight (shutdown).
    pub stop: CancellationToken,
    /// Drop the batch in flight (shutdown grace ran out); its rows stay pending.
    pub abandon: CancellationToken,
    /// End once ingest has ended and nothing is pending (`--until-drained`).
    pub until_drained: bool,
}

impl Flusher {
    /// Runs until stopped (or drained, with `until_drained`).
    pub async fn run(self, mut ctl: FlushControl) -> FlushReport {
        let mut report = FlushReport::default();
        let mut streak = Streak {
            backoff: Backoff::new(self.settings.backoff_initial, self.settings.backoff_max),
            failing: false,
            refused_in_a_row: 0,
        };
        let mut limit = self.settings.max_batch;
        // Sub-batches of a batch the server refused whole, sent before anything new.
        let mut splits: VecDeque<Vec<PendingCapture>> = VecDeque::new();
        let mut waiting_since: Option<Instant> = None;
        let mut ingest_done = false;
        let mut seq = 0u64;
        let mut next_prune = Instant::now();

        loop {
            self.beat.touch();
            if ctl.stop.is_cancelled() {
                break;
            }
            if Instant::now() >= next_prune {
                let before = now_ms() - self.retention.as_millis() as i64;
                if let Err(e) = self.outbox.call(move |s| s.prune_readings(before)).await {
                    tracing::warn!(error = %e, "could not prune old readings");
                }
                next_prune = Instant::now() + PRUNE_EVERY;
            }

            let halved = streak.backoff.failures() >= HALVE_AFTER;
            let size = if halved { (limit / 2).max(1) } else { limit };
            // Parts of a split batch are sent as they are, at once, until none is left.
            let from_splits = !splits.is_empty();
            let batch = match splits.pop_front() {
                Some(b) => b,
                None => match self
                    .outbox
                    .call(move |s| s.next_batch(size, SCAN_LIMIT))
                    .await
                {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the outbox; flusher stops");
                        break;
                    }
                },
            };

            if batch.is_empty() {
                waiting_since = None;
                if ctl.until_drained && ingest_done {
                    break;
                }
                ingest_done |= !self.wait_for_commit(&mut ctl, None, ingest_done).await;
                continue;
            }
            // A part-full batch waits for more, up to max_delay from when it was first seen.
            if batch.len() < size && !ingest_done && !from_splits {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                let due = since + self.settings.max_delay;
                if Instant::now() < due {
                    ingest_done |= !self.wait_for_commit(&mut ctl, Some(due), ingest_done).await;
                    continue;
                }
            }
            waiting_since = None;

            seq += 1;
            let correlation_id = format!("{}-{}-{seq}", self.gateway_id, now_ms());
            let mac_ids: Vec<String> = batch
                .iter()
                .map(|p| self.mac_format.format(p.capture.mac))
                .collect();
            let items: Vec<BulkItem> = batch
                .iter()
                .zip(&mac_ids)
                .map(|(p, mac_id)| BulkItem {
                    mac_id: mac_id.clone(),
                    ble_packet: p.capture.packet.clone(),
                    product_id: p.capture.product_id.clone(),
                    scan_time: (p.capture.ts_ms.div_euclid(1000)).to_string(),
                })
                .collect();

            let started = Instant::now();
            let request = self.metrics.request();
            let answer = tokio::select! {
                a = self.client.decode_bulk(&items, &correlation_id) => a,
                _ = ctl.abandon.cancelled() => {
                    tracing::warn!(correlation_id, items = items.len(), "shutdown: abandoned the batch in flight; its captures stay pending");
                    break;
                }
            };
            request.answered(&batch, &answer);
            report.batches += 1;
            match classify(&mac_ids, answer) {
                Action::Settle(outcomes) => {
                    let answered = outcomes.len();
                    let missing = batch.len() - answered;
                    let mut rows: Vec<Option<PendingCapture>> =
                        batch.into_iter().map(Some).collect();
                    let settle: Vec<(PendingCapture, Outcome)> = outcomes
                        .into_iter()
                        .filter_map(|(i, o)| rows[i].take().map(|p| (p, o)))
                        .collect();
                    let delivered = settle
                        .iter()
                        .filter(|(_, o)| matches!(o, Outcome::Delivered(_)))
                        .count();
                    let dead = settle.len() - delivered;
                    let now = now_ms();
                    let result = self
                        .outbox
                        .call(move |s| {
                            s.settle(&settle, now)?;
                            s.note_flush_ok(now)
                        })
                        .await;
                    if let Err(e) = result {
                        // The rows stay pending and are sent again: at-least-once.
                        tracing::warn!(correlation_id, error = %e, "could not record the answer; the batch will be sent again");
                        continue;
                    }
                    report.delivered += delivered as u64;
                    report.dead_letters += dead as u64;
                    tracing::debug!(
                        correlation_id,
                        items = items.len(),
                        delivered,
                        dead_letters = dead,
                        missing,
                        ms = started.elapsed().as_millis() as u64,
                        "batch answered"
                    );
                    if dead > 0 {
                        // Tapes of other customers pass every dock: refusals are normal,
                        // stored and counted, not lost.
                        tracing::debug!(
                            correlation_id,
                            dead_letters = dead,
                            "the service refused captures; kept as dead letters"
                        );
                    }
                    if answered == 0 {
                        // Nothing answered at all: treat like a failure so we do not spin.
                        let cause = "the service answered none of the items";
                        if self
                            .back_off(&mut streak, &mut report, &ctl, cause, None, &correlation_id)
                            .await
                        {
                            break;
                        }
                    } else {
                        if streak.failing {
                            tracing::info!(correlation_id, "delivery recovered");
                        }
                        streak.failing = false;
                        streak.refused_in_a_row = 0;
                        streak.backoff.reset();
                    }
                }
                Action::Split(message) => {
                    if batch.len() == 1 {
                        streak.refused_in_a_row += 1;
                        if streak.refused_in_a_row > MAX_REFUSED_IN_A_ROW {
                            // Every capture refused, one after another: the request is
                            // what the service refuses, not the captures. Keep them.
                            splits.clear();
                            let cause = format!("the service refuses every capture (400: {message}); check customer_id, authorized_groups and the products");
                            if self
                                .back_off(
                                    &mut streak,
                                    &mut report,
                                    &ctl,
                                    &cause,
                                    None,
                                    &correlation_id,
                                )
                                .await
                            {
                                break;
                            }
                            continue;
                        }
                        let now = now_ms();
                        let settle: Vec<(PendingCapture, Outcome)> = batch
                            .into_iter()
                            .map(|p| (p, Outcome::DeadLetter(message.clone())))
                            .collect();
                        if let Err(e) = self.outbox.call(move |s| s.settle(&settle, now)).await {
                            tracing::warn!(correlation_id, error = %e, "could not record a dead letter; will retry");
                            continue;
                        }
                        report.dead_letters += 1;
                        tracing::warn!(correlation_id, mac = %mac_ids[0], reason = %message, "the service refused a capture; kept as a dead letter");
                    } else {
                        tracing::info!(correlation_id, items = batch.len(), reason = %message, "the service refused the batch; splitting it to find the refused captures");
                        let mut first = batch;
                        let second = first.split_off(first.len() / 2);
                        splits.push_front(second);
                        splits.push_front(first);
                    }
                }
                Action::Shrink => {
                    let sent = batch.len();
                    if sent <= 1 {
                        let cause = "the service refuses even one item as too large (413)";
                        if self
                            .back_off(&mut streak, &mut report, &ctl, cause, None, &correlation_id)
                            .await
                        {
                            break;
                        }
                    } else {
                        limit = limit.min(sent / 2).max(1);
                        tracing::warn!(correlation_id, sent, new_limit = limit, "the service said the batch was too large (413); sending smaller batches from now on");
                        splits.push_front(batch);
                        // Re-cut what was queued to the new limit.
                        let queued: Vec<PendingCapture> = splits.drain(..).flatten().collect();
                        for chunk in queued.chunks(limit) {
                            splits.push_back(chunk.to_vec());
                        }
                    }
                }
                Action::Retry { cause, retry_after } => {
                    // A split part that fails transiently goes back to the front, so
                    // the search for the refused capture goes on where it was.
                    if from_splits {
                        splits.push_front(batch);
                    }
                    if self
                        .back_off(
                            &mut streak,
                            &mut report,
                            &ctl,
                            &cause,
                            retry_after,
                            &correlation_id,
                        )
                        .await
                    {
                        break;
                    }
                }
            }
        }
        report
    }

    /// After a failed batch: takes the next backoff delay, records the cause for
    /// `status` (with "until …" when the server said when), and sleeps. True if told
    /// to stop meanwhile.
    async fn back_off(
        &self,
        streak: &mut Streak,
        report: &mut FlushReport,
        ctl: &FlushControl,
        cause: &str,
        retry_after: Option<Duration>,
        correlation_id: &str,
    ) -> bool {
        report.failures += 1;
        let delay = streak.backoff.next_delay(fastrand::f64(), retry_after);
        let cause = match retry_after {
            Some(_) => format!(
                "{cause} until {}",
                rfc3339(now_ms() + delay.as_millis() as i64)
            ),
            None => cause.to_string(),
        };
        self.note_failure(&mut streak.failing, &cause, correlation_id, delay)
            .await;
        self.sleep(ctl, delay).await
    }

    /// Logs a failure (once per streak at WARN) and records it for `status`.
    async fn note_failure(
        &self,
        failing: &mut bool,
        cause: &str,
        correlation_id: &str,
        delay: Duration,
    ) {
        if !*failing {
            tracing::warn!(
                correlation_id,
                cause,
                retry_in_ms = delay.as_millis() as u64,
                "delivery failed; backing off"
            );
        } else {
            tracing::debug!(
                correlation_id,
                cause,
                retry_in_ms = delay.as_millis() as u64,
                "delivery failed again"
            );
        }
        *failing = true;
        let cause = cause.to_string();
        let now = now_ms();
        if let Err(e) = self.outbox.call(move |s| s.note_error(&cause, now)).await {
            tracing::warn!(error = %e, "could not record the delivery error");
        }
    }

    /// Sleeps `delay`; true if told to stop meanwhile.
    async fn sleep(&self, ctl: &FlushControl, delay: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(delay) => false,
            _ = ctl.stop.cancelled() => true,
        }
    }

    /// Waits for a commit, `until` (default: [`IDLE_RECHECK`] from now), or stop.
    /// Returns false once ingest has ended (its channel closed).
    async fn wait_for_commit(
        &self,
        ctl: &mut FlushControl,
        until: Option<Instant>,
        ingest_done: bool,
    ) -> bool {
        let until = until.unwrap_or_else(|| Instant::now() + IDLE_RECHECK);
        tokio::select! {
            r = ctl.committed.changed(), if !ingest_done => r.is_ok(),
            _ = tokio::time::sleep_until(until) => !ingest_done,
            _ = ctl.stop.cancelled() => !ingest_done,
        }
    }
}

#[cfg(test)]
mod tests {
    //! One test per row of the answer table in the module doc.
    use super::*;
    use crate::api::Decoded;
    use serde_json::json;

    fn macs() -> Vec<String> {
        vec!["C0FFEE000001".into(), "C0FFEE000002".into()]
    }

    fn decoded(qr: &str) -> Result<crate::api::Decoded, String> {
        let raw = json!({"qr_code": qr, "temp": 21.5, "bat": 90});
        Ok(Decoded::from_json(&raw))
    }

    #[test]
    fn a_decoded_item_is_delivered_with_its_reading() {
        let answer = vec![BulkAnswerItem {
            mac_id: "C0FFEE000002".into(),
            result: decoded("QR2"),
        }];
        let Action::Settle(outcomes) = classify(&macs(), Ok(answer)) else {
            panic!("not settled")
        };
        assert_eq!(outcomes.len(), 1);
        let (i, Outcome::Delivered(reading)) = &outcomes[0] else {
            panic!("not delivered: {outcomes:?}")
        };
        assert_eq!(*i, 1, "matched by mac_id, not position");
        assert_eq!(reading.qr_code.as_deref(), Some("QR2"));
        assert_eq!(reading.temp, Some(21.5));
        assert_eq!(reading.bat, Some(90.0));
    }

    #[test]
    fn an_item_with_an_error_is_a_dead_letter_with_the_servers_text() {
        let answer = vec![BulkAnswerItem {
            mac_id: "C0FFEE000001".into(),
            result: Err("device not found".into()),
        }];
        assert_eq!(
            classify(&macs(), Ok(answer)),
            Action::Settle(vec![(0, Outcome::DeadLetter("device not found".into()))])
        );
    }

    #[test]
    fn an_item_missing_from_the_answer_is_left_pending() {
        assert_eq!(classify(&macs(), Ok(vec![])), Action::Settle(vec![]));
    }

    #[test]
    fn a_400_on_the_whole_batch_splits_it() {
        let e = ApiError::Rejected {
            status: 400,
            message: "invalid packet".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Split("invalid packet".into())
        );
    }

    #[test]
    fn a_401_with_a_fresh_token_backs_off_as_credentials_or_permission() {
        let e = ApiError::Unauthorized {
            message: "Unauthorized access".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "credentials or permission".into(),
                retry_after: None
            }
        );
    }

    #[test]
    fn a_413_shrinks_the_batch() {
        let e = ApiError::TooLarge {
            message: "too many items".into(),
        };
        assert_eq!(classify(&macs(), Err(e)), Action::Shrink);
    }

    #[test]
    fn a_429_backs_off_no_less_than_retry_after() {
        let e = ApiError::transient("rate limited", Some(Duration::from_secs(30)));
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "rate limited".into(),
                retry_after: Some(Duration::from_secs(30))
            }
        );
    }

    #[test]
    fn a_5xx_a_timeout_or_a_connection_error_backs_off() {
        for cause in ["server error 503", "timeout", "service unreachable"] {
            let e = ApiError::transient(cause, None);
            assert_eq!(
                classify(&macs(), Err(e)),
                Action::Retry {
                    cause: cause.into(),
                    retry_after: None
                }
            );
        }
    }

    #[test]
    fn an_unreadable_answer_backs_off_and_settles_nothing() {
        let e = ApiError::BadAnswer("not JSON".into());
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "unreadable answer".into(),
                retry_after: None
            }
        );
    }
}
