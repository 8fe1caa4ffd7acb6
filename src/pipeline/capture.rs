//! The capture path's wiring: the source, and the ingest stage behind it (products,
//! dedup, group commits into the outbox), joined by a bounded channel. Starts the clock
//! keeper the ingest stage asks before holding a capture.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::error::RunError;
use super::open::start_clock;
use super::parts::{Parts, Reloaded, Stops};
use super::supervise::{Ended, Stages};
use crate::config::Config;
use crate::ingest::{self, IngestSettings};
use crate::source::{self, Source};

/// Advertisements in flight between the source and the ingest stage.
const ADVERT_CHANNEL: usize = 4096;

/// The ingest stage turns on every input and commit, and says when it is idle; this
/// long holding work without a turn is a stall (for the watchdog).
const INGEST_ALLOWANCE: Duration = Duration::from_secs(30);

/// What the capture path gives the rest of the daemon.
pub(super) struct Started {
    /// Captures committed so far (the flusher wakes on it).
    pub committed: watch::Receiver<u64>,
    /// The source says when it is up (the BLE source: adapter found, discovery
    /// started); READY waits for it.
    pub announces_start: bool,
}

/// Spawns the source and the ingest stage into `stages`.
pub(super) async fn start(
    config: &Config,
    parts: &mut Parts,
    reloaded: &Reloaded,
    stops: &Stops,
    stages: &mut Stages,
    mgmt_socket: Option<std::os::fd::OwnedFd>,
) -> Started {
    let (adverts_tx, adverts_rx) = mpsc::channel(ADVERT_CHANNEL);
    let (committed_tx, committed_rx) = watch::channel(0u64);

    // The BLE source drops what no product matches; SIGHUP's products reach it too.
    let source = source::from_settings(&config.scanner, parts.clock.clone())
        .with_filter(config.products.clone(), Some(reloaded.products.clone()))
        .with_health(parts.source_health.clone())
        .with_stored_socket(mgmt_socket)
        .with_debug_hooks(&parts.hooks)
        .with_state_dir(&config.gateway.state_dir);
    let live = source.is_live();
    let announces_start = source.announces_start();
    let clock = start_clock(
        config,
        parts.clock.clone(),
        parts.outbox.clock(),
        &parts.metrics,
    )
    .await;
    {
        let stop = stops.source.clone();
        let run = async move { source.run(adverts_tx, stop).await.map_err(RunError::from) };
        stages.spawn("source", run, Ended::Source, None);
    }
    let ingest_beat = parts.liveness.stage("ingest", INGEST_ALLOWANCE);
    stages.spawn(
        "ingest",
        ingest::run(
            IngestSettings {
                products: config.products.clone(),
                dedup: config.dedup,
                commit_interval: config.outbox.commit_interval,
                live,
                clock,
                time: parts.clock.clone(),
                beat: ingest_beat.clone(),
                reload_products: Some(reloaded.products.clone()),
                reload_dedup: Some(reloaded.dedup.clone()),
                metrics: parts.metrics.clone(),
                tapes_heard: parts.tapes_heard.clone(),
                admission: parts.admission.clone(),
            },
            adverts_rx,
            parts.outbox.ingest(),
            committed_tx,
            stops.abandon.clone(),
        ),
        Ended::Ingest,
        Some(ingest_beat),
    );
    Started {
        committed: committed_rx,
        announces_start,
    }
}
