//! The delivery stage as a reload sees it: a flusher, replaced by a new one (new client,
//! new settings) when `[service]` or `[flush]` change, the old
//! one's batches answered or abandoned first. Touches the flusher and the service client.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::ServiceClient;
use crate::clock::SharedClock;
use crate::config::{Config, FlushSettings, MacFormat};
use crate::flush::{FlushControl, FlushReport, Flusher};
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::FlusherOutbox;
use crate::util::systemd::Beat;

/// What the delivery stage runs with; a new one restarts it.
pub struct FlushSetup {
    pub client: ServiceClient,
    pub settings: FlushSettings,
    pub mac_format: MacFormat,
}

impl FlushSetup {
    /// The setup of `config`; `None` without a `[service]`.
    pub fn of(
        config: &Config,
        metrics: &Arc<Metrics>,
        clock: SharedClock,
    ) -> Result<Option<FlushSetup>, String> {
        let Some(service) = &config.service else {
            return Ok(None);
        };
        let client = ServiceClient::new(service, clock)
            .map_err(|e| e.to_string())?
            .with_metrics(metrics.clone());
        Ok(Some(FlushSetup {
            client,
            settings: config.flush.clone(),
            mac_format: service.mac_format,
        }))
    }
}

/// The delivery stage's fixed parts.
pub struct FlushStage {
    pub outbox: FlusherOutbox,
    pub gateway_id: String,
    pub beat: Beat,
    pub metrics: Arc<Metrics>,
    /// The tapes heard, told what the service said of each.
    pub heard: Arc<HeardNow>,
    /// The daemon's clock.
    pub clock: SharedClock,
    /// How long a flusher being replaced may take to have its batches answered.
    pub grace: Duration,
}

/// The delivery stage: a flusher, replaced by a new one for each setup `next` brings.
/// Ends as a flusher does (stopped, or drained with `until_drained`), with the reports
/// of every flusher it ran added up.
pub async fn flush_stage(
    stage: FlushStage,
    first: FlushSetup,
    mut next: mpsc::UnboundedReceiver<FlushSetup>,
    control: FlushControl,
) -> FlushReport {
    let mut total = FlushReport::default();
    let mut setup = first;
    loop {
        let stop = control.stop.child_token();
        let abandon = control.abandon.child_token();
        let flusher = Flusher {
            client: setup.client,
            outbox: stage.outbox.clone(),
            settings: setup.settings,
            mac_format: setup.mac_format,
            gateway_id: stage.gateway_id.clone(),
            heard: stage.heard.clone(),
            beat: stage.beat.clone(),
            metrics: stage.metrics.clone(),
            clock: stage.clock.clone(),
        }
        .run(FlushControl {
            committed: control.committed.clone(),
            stop: stop.clone(),
            abandon: abandon.clone(),
            until_drained: control.until_drained,
        });
        tokio::pin!(flusher);
        let mut replacement: Option<FlushSetup> = None;
        let mut grace_ends: Option<tokio::time::Instant> = None;
        let report = loop {
            let grace = async {
                match grace_ends {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                report = &mut flusher => break report,
                new = next.recv(), if replacement.is_none() && !control.stop.is_cancelled() => {
                    let Some(mut new) = new else { continue };
                    // Only the newest of several quick reloads matters.
                    while let Ok(newer) = next.try_recv() {
                        new = newer;
                    }
                    replacement = Some(new);
                    stop.cancel();
                    grace_ends = Some(tokio::time::Instant::now() + stage.grace);
                }
                () = grace => {
                    tracing::warn!(
                        grace_secs = stage.grace.as_secs(),
                        "reload: the batches in flight were not answered in time; abandoned (their captures stay pending)"
                    );
                    abandon.cancel();
                    grace_ends = None;
                }
            }
        };
        total.batches += report.batches;
        total.delivered += report.delivered;
        total.dead_letters += report.dead_letters;
        total.failures += report.failures;
        match replacement {
            Some(new) if !control.stop.is_cancelled() => {
                tracing::info!("reload: delivery restarted with the new settings");
                setup = new;
            }
            _ => return total,
        }
    }
}
