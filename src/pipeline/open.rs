//! What the daemon opens before any stage runs, and closes after the last has ended: the
//! outbox (its owner thread), the inventory, the clock keeper, and what faces outward (the
//! HTTP listener, the telemetry pusher, the service client), so that a port in use or
//! bad service settings stop the daemon before anything starts.

use std::sync::Arc;

use tokio::net::TcpListener;

use super::error::RunError;
use crate::api::ServiceClient;
use crate::clock::{ClockKeeper, SharedClock};
use crate::config::Config;
use crate::http;
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::outbox::{ClockOutbox, Handles, Outbox, StageOutbox, StoreOptions};
use crate::record::EpochMillis;
use crate::telemetry::Pusher;
use crate::util::debug_hooks::DebugHooks;

/// Opens the state database (moving a corrupt one aside), applies the retention and
/// starts the outbox's owner thread; the thread's handle is for [`close`].
pub(super) async fn outbox(
    config: &Config,
    clock: &SharedClock,
    hooks: &DebugHooks,
) -> Result<(Outbox, std::thread::JoinHandle<()>), RunError> {
    let state_dir = config.gateway.state_dir.clone();
    let store_options = StoreOptions {
        durability: config.outbox.durability,
        max_pending: config.outbox.max_pending,
        max_page_count: None,
        clock: clock.clone(),
        latest_every: hooks.latest_every.unwrap_or(crate::outbox::LATEST_EVERY),
    };
    let retention = config.outbox.retention();
    let opened =
        tokio::task::spawn_blocking(move || Outbox::open(&state_dir, store_options, retention))
            .await
            .map_err(RunError::stage("outbox open"))??;
    let report = &opened.report;
    if let Some(aside) = &report.quarantined {
        tracing::error!(
            path = %report.path.display(),
            moved_to = %aside.display(),
            reason = report.quarantine_reason.as_deref().unwrap_or(""),
            "outbox database was corrupt: moved it aside and started a fresh one"
        );
    }
    tracing::info!(
        path = %report.path.display(),
        pending = report.pending,
        "outbox open"
    );
    let (outbox, owner) = opened.start().map_err(RunError::OutboxThread)?;

    if config.service.is_none() {
        tracing::warn!("no [service] configured: captures accumulate in the outbox until one is");
    }
    Ok((outbox, owner))
}

/// Reads what is still pending, lets go of the last handle and waits for the owner
/// thread, which closes the database (checkpointing the WAL) once every handle is gone.
pub(super) async fn close(outbox: Outbox, owner: std::thread::JoinHandle<()>) -> u64 {
    let pending = Handles::new(&outbox).stages().pending().await;
    drop(outbox);
    let _ = tokio::task::spawn_blocking(move || owner.join()).await;
    pending
}

/// What faces outward, made before any stage runs.
pub(super) struct Outward {
    /// Bound before anything runs, so that a port in use stops the daemon at once.
    pub http_listener: Option<TcpListener>,
    pub pusher: Option<Pusher>,
    /// `None` without a `[service]`.
    pub client: Option<ServiceClient>,
}

impl Outward {
    pub(super) async fn open(
        config: &Config,
        metrics: &Arc<Metrics>,
        clock: &SharedClock,
    ) -> Result<Outward, RunError> {
        let http_listener = match config.http.listen {
            Some(addr) => Some(http::bind(addr).await?),
            None => None,
        };

        let pusher = config
            .telemetry
            .clone()
            .map(|t| Pusher::new(t, &config.gateway.id, metrics.clone(), clock.clone()))
            .transpose()?;

        let client = config
            .service
            .as_ref()
            .map(|s| ServiceClient::new(s, clock.clone()).map(|c| c.with_metrics(metrics.clone())))
            .transpose()
            .map_err(RunError::Client)?;
        Ok(Outward {
            http_listener,
            pusher,
            client,
        })
    }
}

/// Gathers the inventory (`bluetoothd --version` included, off the runtime), shows it
/// in the metrics and records it for `tapegate status`. A failure to record it is
/// logged; nothing else depends on it.
pub(super) async fn record_inventory(
    config: &Config,
    outbox: &StageOutbox,
    metrics: &Metrics,
    started_at: EpochMillis,
) -> Option<Inventory> {
    let c = config.clone();
    let inventory = tokio::task::spawn_blocking(move || Inventory::gather(&c, started_at))
        .await
        .ok()?;
    metrics.set_inventory(&inventory);
    tracing::info!(
        version = %inventory.version,
        commit = %inventory.commit,
        config_hash = %inventory.config_hash,
        kernel = %inventory.kernel,
        bluez = %inventory.bluez,
        adapter = %inventory.adapter,
        "inventory"
    );
    let record = inventory.clone();
    if let Err(e) = outbox.note_inventory(record).await {
        tracing::warn!(error = %e, "cannot record the inventory in the state database");
    }
    Some(inventory)
}

/// Starts the clock keeper (DESIGN.md, "Time on a gateway without a real-time clock").
/// If the outbox cannot record this boot, captures are not held: accepted and sent as
/// the clock says, which is what a gateway did before clock repair.
pub(super) async fn start_clock(
    config: &Config,
    clock: SharedClock,
    outbox: ClockOutbox,
    metrics: &Arc<Metrics>,
) -> Option<ClockKeeper> {
    match ClockKeeper::start(clock, config.gateway.clock, outbox).await {
        Ok((mut keeper, released)) => {
            tracing::info!(clock = %keeper.verdict(), released, "clock judged at start");
            keeper.report_to(metrics.clone());
            Some(keeper)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot record this boot in the outbox: captures are sent with the clock as it is");
            None
        }
    }
}
