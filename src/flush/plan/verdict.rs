//! What an answer means for the captures of the batch it answers: settled, left out,
//! refused (split, dead letter or parked), shrunk (413), or failed (parked, isolated,
//! paused). Part of [`Planner`]: the only room that counts attempts and weighs evidence.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::step::{BatchId, InFlight, Note, Origin, Queued, Resolution};
use super::Planner;
use crate::flush::answer::Action;
use crate::outbox::{Outcome, PendingCapture};
use crate::util::backoff::RETRY_AFTER_MAX;

/// A transient failure of a batch.
struct Failure {
    cause: String,
    label: &'static str,
    retry_after: Option<Duration>,
    /// It may be caused by what the batch holds (a 5xx, a timeout...), so the batch may
    /// be split to isolate a capture.
    blame: bool,
}

impl Planner {
    /// What `action`, the answer to `batch` (taken out of flight as `id`), does to its
    /// rows: the step of [`Planner::answered`].
    pub(super) fn judge(
        &mut self,
        id: BatchId,
        batch: InFlight,
        action: Action,
        now: Instant,
        jitter: f64,
    ) -> Resolution {
        let mut res = Resolution::default();
        match action {
            Action::Settle(outcomes) => self.settle(id, batch, outcomes, now, &mut res),
            Action::Refused(reason) => self.refused(batch, reason, now, jitter, &mut res),
            Action::Shrink => self.shrink(batch, now, jitter, &mut res),
            Action::Retry {
                cause,
                label,
                retry_after,
                isolate,
            } => {
                let failure = Failure {
                    cause,
                    label,
                    retry_after,
                    // An answer that says when to come back (429, 503 with Retry-After)
                    // is about the service, never about a capture.
                    blame: isolate && retry_after.is_none(),
                };
                self.failed(batch, failure, now, jitter, &mut res)
            }
        }
        res
    }

    /// Whether a batch sent after `row` first failed has been answered.
    fn evidence(&self, row: &PendingCapture) -> bool {
        self.attempts
            .get(&row.id)
            .is_some_and(|a| a.failures > 0 && self.answered_ok > a.failed_after)
    }

    /// Counts a failure (or refusal) of each of `rows`; returns the most any has had.
    fn count_failures(&mut self, rows: &[PendingCapture]) -> u32 {
        let launched = self.next_id;
        let mut most = 0;
        for r in rows {
            let a = self.attempts.entry(r.id).or_default();
            if a.failures == 0 {
                a.failed_after = launched;
            }
            a.failures += 1;
            most = most.max(a.failures);
        }
        self.bound_attempts();
        most
    }

    fn settle(
        &mut self,
        id: BatchId,
        batch: InFlight,
        outcomes: Vec<(usize, Outcome)>,
        now: Instant,
        res: &mut Resolution,
    ) {
        // A capture already left out of an answer that answered others, sent alone and
        // answered with an empty list, is left out again: the service works, it just
        // leaves that one out.
        let left_out_again = batch.rows.len() == 1
            && batch
                .rows
                .iter()
                .all(|r| self.attempts.get(&r.id).is_some_and(|a| a.left_out > 0));
        if outcomes.is_empty() && !left_out_again {
            // Nothing answered at all: a failure, so that we do not spin.
            let cause = "the service answered none of the items".to_string();
            let failure = Failure {
                cause,
                label: "empty_answer",
                retry_after: None,
                blame: true,
            };
            return self.failed(batch, failure, now, 1.0, res);
        }
        let latency = now.saturating_duration_since(batch.sent_at);
        let outcomes_answered = outcomes.len();
        let clean = outcomes_answered == batch.rows.len();
        let mut rows: Vec<Option<PendingCapture>> = Arc::unwrap_or_clone(batch.rows)
            .into_iter()
            .map(Some)
            .collect();
        for (i, outcome) in outcomes {
            if let Some(row) = rows.get_mut(i).and_then(Option::take) {
                res.settle.push((row, outcome));
            }
        }
        let max_attempts = self.settings.max_attempts;
        for row in rows.into_iter().flatten() {
            let a = self.attempts.entry(row.id).or_default();
            a.left_out += 1;
            if a.left_out >= max_attempts {
                let reason = format!(
                    "the service left this capture out of {} answers in a row",
                    a.left_out
                );
                res.settle.push((row, Outcome::DeadLetter(reason)));
            } else {
                self.release(vec![row]);
            }
        }
        res.progress = !res.settle.is_empty();
        if outcomes_answered == 0 {
            // Not evidence that the service works; not a failure either.
            return;
        }
        self.answered_ok = self.answered_ok.max(id);
        if self.pause.answered() {
            res.notes.push(Note::Recovered);
        }
        let grows = clean && batch.window_full;
        let max_in_flight = self.settings.max_in_flight;
        res.notes
            .extend(self.window.answered(latency, grows, max_in_flight));
    }

    /// A 400 for the whole batch: split it; a capture refused alone is a dead letter
    /// with evidence, or parked (and new sends pause) without.
    fn refused(
        &mut self,
        batch: InFlight,
        reason: String,
        now: Instant,
        jitter: f64,
        res: &mut Resolution,
    ) {
        let rows = Arc::unwrap_or_clone(batch.rows);
        self.count_failures(&rows);
        if rows.len() > 1 {
            res.notes.push(Note::Split {
                items: rows.len(),
                reason,
            });
            return self.bisect(rows, Origin::Split, batch.seen, now);
        }
        let Some(row) = rows.first() else { return };
        if self.evidence(row) {
            res.progress = true;
            res.settle.extend(
                rows.into_iter()
                    .map(|r| (r, Outcome::DeadLetter(reason.clone()))),
            );
            return;
        }
        // Refused alone, and the service has taken no request of ours since: the
        // request may be what it refuses (the same answer whatever the batch holds).
        // Keep the capture, pause, and let the next answer bring the evidence.
        let cause = format!("the service refuses the request (400: {reason}) and has taken none since; no capture is known to be at fault: check customer_id, authorized_groups and any proxy between");
        res.notes
            .push(self.pause.start(cause, "http_400", None, now, jitter));
        // Its own schedule, so that other captures go first and can bring the evidence.
        let failures = self.attempts.get(&row.id).map_or(1, |a| a.failures);
        let due =
            (now + self.park_delay(failures, jitter)).max(self.pause.last_until().unwrap_or(now));
        self.park(rows, Origin::Split, batch.seen, due);
    }

    fn shrink(&mut self, batch: InFlight, now: Instant, jitter: f64, res: &mut Resolution) {
        let sent = batch.rows.len();
        if sent <= 1 {
            self.release(Arc::unwrap_or_clone(batch.rows));
            let cause = "the service refuses even one item as too large (413)".to_string();
            return res
                .notes
                .push(self.pause.start(cause, "http_413", None, now, jitter));
        }
        self.limit = self.limit.min(sent / 2).max(1);
        res.notes.push(Note::Shrunk {
            sent,
            limit: self.limit,
        });
        // Re-cut this batch and what was queued to the new limit, keeping the order.
        let mut parts = vec![Queued {
            rows: Arc::unwrap_or_clone(batch.rows),
            origin: batch.origin,
            seen: batch.seen,
            not_before: now,
        }];
        parts.extend(self.queue.drain(..));
        for q in parts {
            for chunk in q.rows.chunks(self.limit) {
                self.queue.push_back(Queued {
                    rows: chunk.to_vec(),
                    origin: q.origin,
                    seen: q.seen,
                    not_before: q.not_before,
                });
            }
        }
    }

    fn failed(
        &mut self,
        batch: InFlight,
        failure: Failure,
        now: Instant,
        jitter: f64,
        res: &mut Resolution,
    ) {
        let Failure {
            cause,
            label,
            retry_after,
            blame,
        } = failure;
        // Evidence that this batch, not the service, is the trouble: its captures
        // failed before, and a batch sent since was answered. Only then does a capture
        // alone count an attempt towards its dead letter (an outage is nobody's fault),
        // and a larger batch get split at once.
        let suspect = blame && batch.rows.iter().any(|r| self.evidence(r));
        let counts_alone = suspect && batch.rows.len() == 1;
        // A batch that fails again is split even without that evidence (after the pause):
        // if nothing else is pending, only its own halves can bring the evidence.
        let failed_before = blame
            && batch
                .rows
                .iter()
                .any(|r| self.attempts.get(&r.id).is_some_and(|a| a.failures > 0));
        let failures = self.count_failures(&batch.rows);
        if !suspect {
            res.notes.extend(self.window.decrease(batch.sent_at, now));
            res.notes.push(
                self.pause
                    .start(cause.clone(), label, retry_after, now, jitter),
            );
        }
        let rows = Arc::unwrap_or_clone(batch.rows);
        if failed_before && rows.len() > 1 {
            res.notes.push(Note::Isolating {
                items: rows.len(),
                cause,
            });
            return self.bisect(rows, Origin::Isolate, batch.seen, now);
        }
        if counts_alone {
            let Some(row) = rows.first() else { return };
            let a = self.attempts.entry(row.id).or_default();
            a.alone += 1;
            if a.alone >= self.settings.max_attempts {
                let reason = format!("gave up after {} attempts on its own: {cause}", a.alone);
                res.progress = true;
                res.settle.extend(
                    rows.into_iter()
                        .map(|r| (r, Outcome::DeadLetter(reason.clone()))),
                );
                return;
            }
        }
        let delay_floor = retry_after.unwrap_or_default().min(RETRY_AFTER_MAX);
        let delay = self.park_delay(failures, jitter).max(delay_floor);
        self.park(rows, batch.origin, batch.seen, now + delay);
    }
}
