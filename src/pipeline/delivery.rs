//! The delivery stage's wiring: with a `[service]`, a flusher over the outbox that a
//! reload may replace (src/pipeline/reload.rs), woken by the capture path's commits.

use std::time::Duration;

use tokio::sync::mpsc;

use super::parts::Parts;
use super::supervise::{Ended, Stages};
use crate::api::ServiceClient;
use crate::config::Config;
use crate::flush::FlushControl;
use crate::pipeline::reload::{self, FlushSetup};

/// Beyond a whole request and a whole backoff, how long the flusher may go without a turn.
const FLUSH_SLACK: Duration = Duration::from_secs(60);

/// Spawns the delivery stage into `stages`, if there is a client and a `[service]`.
pub(super) fn start(
    config: &Config,
    parts: &mut Parts,
    client: Option<ServiceClient>,
    flush_setups: mpsc::UnboundedReceiver<FlushSetup>,
    control: FlushControl,
    stages: &mut Stages,
) {
    let (Some(client), Some(service)) = (client, &config.service) else {
        return;
    };
    tracing::info!(
        environment = %service.environment,
        url = %client.decode_bulk_url(),
        "delivering to the service"
    );
    // A flusher may legitimately wait a whole request and a whole backoff.
    let beat = parts.liveness.stage(
        "flush",
        service.request_timeout + config.flush.backoff_max + FLUSH_SLACK,
    );
    let flush_beat = beat.clone();
    // The delivery stage: a flusher that a reload may replace (src/pipeline/reload.rs).
    let flusher = reload::flush_stage(
        reload::FlushStage {
            outbox: parts.outbox.flusher(),
            gateway_id: config.gateway.id.clone(),
            beat,
            metrics: parts.metrics.clone(),
            heard: parts.tapes_heard.clone(),
            clock: parts.clock.clone(),
            grace: config.gateway.shutdown_grace,
        },
        reload::FlushSetup {
            client,
            settings: config.flush.clone(),
            mac_format: service.mac_format,
        },
        flush_setups,
        control,
    );
    stages.spawn("flush", flusher, Ended::Flush, Some(flush_beat));
}
