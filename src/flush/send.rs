//! A batch's request: sent as a task of its own, and what its answer (or the task's
//! failure) means, handed to the planner.

use tokio::time::Instant;
use tracing::Instrument;

use super::answer::{classify, Action};
use super::inputs::Flusher;
use super::plan::Batch;
use super::shell::{Answered, Shell};
use crate::api::BulkItem;

impl Flusher {
    /// Sends `batch` as a task of its own.
    pub(super) fn send(&self, sh: &mut Shell, batch: Batch) {
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
                product_id: p.capture.product_id.to_string(),
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
}
