//! The flusher's inputs, how it is told to end and what it reports: plain data, a leaf
//! under the loop's files.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::ServiceClient;
use crate::clock::SharedClock;
use crate::config::{FlushSettings, MacFormat};
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::FlusherOutbox;
use crate::systemd::Beat;

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
