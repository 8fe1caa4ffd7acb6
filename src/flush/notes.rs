//! What a note of the planner logs, and a backoff's cause recorded for `status`.

use std::time::Duration;

use tokio::time::Instant;

use super::plan::Note;
use super::shell::Shell;
use super::Flusher;
use crate::clock::rfc3339;
use crate::outbox::OutboxError;

impl Flusher {
    /// Logs one note of the planner (and records a backoff's cause for `status`).
    pub(super) async fn note(&self, sh: &mut Shell, note: Note, correlation_id: &str) {
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
            } => self.backed_off(sh, cause, delay, server, correlation_id).await,
        }
    }

    /// Logs a backoff (at WARN when delivery starts failing), pauses the metrics and
    /// records its cause for `status`, with the flusher's state when that is due.
    async fn backed_off(
        &self,
        sh: &mut Shell,
        cause: String,
        delay: Duration,
        server: bool,
        correlation_id: &str,
    ) {
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
        self.metrics.set_paused_until(at + delay.as_millis() as i64);
        let state = sh.state();
        self.outbox.publish(state);
        let now = Instant::now();
        let due = sh.state.due(state, now);
        let unclaim = sh.plan.take_unclaimed();
        let written = self.outbox.note_error(unclaim, cause, at, due).await;
        if let (Ok(()), Some(due)) = (&written, due) {
            sh.state.written(due, now);
        }
        error_noted(sh, written);
    }
}

/// Logged when recording the error starts failing and when it works again, not at
/// every backoff while the disk stays full.
fn error_noted(sh: &mut Shell, written: Result<(), OutboxError>) {
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
