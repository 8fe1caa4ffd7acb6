//! A batch's request: sent as a task of its own, claiming its rows as it goes on the
//! wire (`claims.rs`), and what its answer (or the task's failure) means, handed to the
//! planner.

use tokio::time::Instant;
use tracing::Instrument;

use super::answer::{classify, Action};
use super::claims::Claims;
use super::plan::Batch;
use super::shell::{Answered, Shell};
use super::Flusher;

impl Flusher {
    /// Sends `batch` as a task of its own. The task claims the batch's rows as its
    /// request goes on the wire, not before (`claims.rs`).
    pub(super) fn send(&self, sh: &mut Shell, batch: Batch) {
        sh.seq += 1;
        sh.report.batches += 1;
        let correlation_id = format!("{}-{}-{}", self.gateway_id, self.clock.wall_ms(), sh.seq);
        tracing::debug!(
            correlation_id,
            items = batch.rows.len(),
            in_flight = sh.plan.in_flight(),
            concurrency_limit = sh.plan.window(),
            "batch sent"
        );
        // What the task holds while the answer is awaited: the rows, shared with the
        // planner (not copied), until the request is built, then the encoded body and
        // the `mac_id`s, and the captures' times for the metrics. The answer is read
        // into its action in the task, so an answer waiting to be carried out holds
        // only what settling it needs.
        let mut claims = Claims::new(self.outbox.clone(), batch.rows, batch.seen, self.mac_format);
        let client = self.client.clone();
        let id = batch.id;
        let metrics = self.metrics.clone();
        let clock = self.clock.clone();
        let task = async move {
            let started = Instant::now();
            let request_metrics = metrics.request();
            let answer = client
                .decode_bulk_when_ready(&mut claims, &correlation_id)
                .await;
            let (action, ok) = match answer {
                Ok(None) => (claims.failed().map(not_sent), false),
                Ok(Some((request, items))) => {
                    let failure = items.is_empty().then_some("empty_answer");
                    request_metrics.answered(&claims.captured_at(), failure, clock.wall_ms());
                    (Some(classify(request.mac_ids(), Ok(items))), true)
                }
                Err(e) => {
                    request_metrics.answered(
                        &claims.captured_at(),
                        Some(e.label()),
                        clock.wall_ms(),
                    );
                    (Some(classify(&[], Err(e))), false)
                }
            };
            if !matches!(&action, Some(Action::Settle(o)) if !o.is_empty()) {
                // Nothing to record: the rows are let go at once, not with the planner.
                claims.release().await;
            }
            Answered {
                batch: id,
                items: claims.captured_at().len(),
                ok,
                action,
                gone: claims.gone().to_vec(),
                correlation_id,
                elapsed: started.elapsed(),
            }
        };
        let handle = sh.requests.spawn(task.in_current_span());
        sh.tasks.insert(handle.id(), id);
    }

    /// Carries out what an answer means.
    pub(super) async fn answered(
        &self,
        sh: &mut Shell,
        joined: Result<(tokio::task::Id, Answered), tokio::task::JoinError>,
    ) {
        let (action, batch, correlation_id) = match joined {
            Ok((task, a)) => {
                sh.tasks.remove(&task);
                tracing::debug!(
                    correlation_id = a.correlation_id,
                    items = a.items,
                    gone = a.gone.len(),
                    ms = a.elapsed.as_millis() as u64,
                    ok = a.ok,
                    "batch answered"
                );
                sh.plan.gone(a.batch, &a.gone);
                let Some(action) = a.action else {
                    // Every row was evicted while the batch waited: nothing was sent.
                    sh.report.batches -= 1;
                    return;
                };
                (action, a.batch, a.correlation_id)
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
}

/// A batch the outbox could not claim (it could not be read), or whose request could
/// not be built: nothing was sent; it waits and goes again.
fn not_sent(cause: String) -> Action {
    Action::Retry {
        cause,
        label: "outbox_read",
        retry_after: None,
        isolate: false,
    }
}
