//! A batch's request: sent as a task of its own, and what its answer (or the task's
//! failure) means, handed to the planner.

use tokio::time::Instant;
use tracing::Instrument;

use super::answer::{classify, Action};
use super::inputs::Flusher;
use super::plan::Batch;
use super::shell::{Answered, Shell};
use crate::api::{BulkItem, BulkRequest};
use crate::record::EpochMillis;

impl Flusher {
    /// Sends `batch` as a task of its own.
    pub(super) fn send(&self, sh: &mut Shell, batch: Batch) {
        sh.seq += 1;
        sh.report.batches += 1;
        let correlation_id = format!("{}-{}-{}", self.gateway_id, self.clock.wall_ms(), sh.seq);
        let items: Vec<BulkItem> = batch
            .rows
            .iter()
            .map(|p| BulkItem {
                mac_id: self.mac_format.format(p.capture.mac),
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
        // What the task holds while the answer is awaited: the encoded body and the
        // `mac_id`s, and the captures' times for the metrics; the rows themselves stay
        // with the planner, once. The answer is read into its action in the task, so an
        // answer waiting to be carried out holds only what settling it needs.
        let request = BulkRequest::encode(&items);
        drop(items);
        let captured_at: Vec<EpochMillis> = batch.rows.iter().map(|p| p.capture.ts_ms).collect();
        let client = self.client.clone();
        let id = batch.id;
        let metrics = self.metrics.clone();
        let clock = self.clock.clone();
        let task = async move {
            let started = Instant::now();
            let request_metrics = metrics.request();
            let answer = match &request {
                Ok(r) => client.decode_bulk_request(r, &correlation_id).await,
                Err(e) => Err(e.clone()),
            };
            let failure = match &answer {
                Ok(items) if items.is_empty() => Some("empty_answer"),
                Ok(_) => None,
                Err(e) => Some(e.label()),
            };
            request_metrics.answered(&captured_at, failure, clock.wall_ms());
            let ok = answer.is_ok();
            let mac_ids = request.as_ref().map_or(&[][..], |r| r.mac_ids());
            Answered {
                batch: id,
                items: captured_at.len(),
                ok,
                action: classify(mac_ids, answer),
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
                    ms = a.elapsed.as_millis() as u64,
                    ok = a.ok,
                    "batch answered"
                );
                (a.action, a.batch, a.correlation_id)
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
