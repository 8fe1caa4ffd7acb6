//! The daemon's services beside the stages: READY and STATUS= for systemd, the HTTP
//! server and the telemetry pusher (which a reload may restart), SIGHUP's reloader, the
//! outbox's age and size bounds, and the watchdog. All stop together, after the stages.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::RunError;
use super::open::Outward;
use super::options::Reload;
use super::parts::{Parts, Reloads};
use crate::config::Config;
use crate::health::{self, HealthKeeper};
use crate::http::HttpState;
use crate::outbox::StageOutbox;
use crate::pipeline::reload;
use crate::util::systemd::{self, Liveness, Notifier};

/// How often the outbox's age and size bounds are looked at besides each commit (more
/// often for a short `max_age_secs`).
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// The services running beside the stages, to be stopped after them.
pub(super) struct Running {
    tasks: CancellationToken,
    status_task: JoinHandle<()>,
    reload_task: Option<JoinHandle<()>>,
    services: Arc<tokio::sync::Mutex<reload::Services>>,
}

/// Starts the services; `announces_start`: the source says when it is up, and READY
/// waits for it; `reload`: re-read the config on SIGHUP.
pub(super) async fn start(
    config: &Config,
    parts: Parts,
    outward: Outward,
    announces_start: bool,
    reload: Option<Reload>,
    reloads: Reloads,
) -> Result<Running, RunError> {
    announce_ready(&parts, announces_start);
    let tasks = CancellationToken::new();
    let status_task = tokio::spawn(
        health::report_status(
            parts.notifier.clone(),
            parts.outbox.reader(),
            parts.outbox.scanner(),
            HealthKeeper::new(parts.source_health.clone(), parts.clock.clone()),
            tasks.clone(),
        )
        .in_current_span(),
    );
    let http_state = Arc::new(HttpState {
        gateway_id: config.gateway.id.clone(),
        source: config.scanner.source.name().to_string(),
        outbox: parts.outbox.reader(),
        liveness: parts.liveness.clone(),
        admission: parts.admission.clone(),
        metrics: parts.metrics.clone(),
        heard: parts.tapes_heard.clone(),
        source_health: parts.source_health.clone(),
        clock: parts.clock.clone(),
    });
    // The server and the pusher, which a reload may restart (src/pipeline/reload.rs).
    let services = Arc::new(tokio::sync::Mutex::new(reload::Services::new(
        tasks.clone(),
        http_state,
        parts.outbox.reader(),
    )));
    {
        let mut s = services.lock().await;
        if let Some(listener) = outward.http_listener {
            s.serve(listener).await;
        }
        s.push(outward.pusher).await;
    }
    let reload_task = match reload {
        Some(reload) => Some(reloader(
            config, &parts, reload, reloads, &services, &tasks,
        )?),
        None => None,
    };
    keep_bounds(config, parts.outbox.stages(), &tasks);
    watchdog(&parts.notifier, parts.liveness, &tasks);
    Ok(Running {
        tasks,
        status_task,
        reload_task,
        services,
    })
}

impl Running {
    /// Stops every service: the status task keeps the scanner's last counts before the
    /// database closes; the server and the pusher stop last.
    pub(super) async fn stop(self) {
        self.tasks.cancel();
        let _ = self.status_task.await;
        if let Some(task) = self.reload_task {
            let _ = task.await;
        }
        self.services.lock().await.stop_all().await;
    }
}

/// READY once the outbox is open and checked and the source is up (the BLE source:
/// adapter found, discovery started), so that a source that cannot start fails the
/// unit's start instead of following a READY.
fn announce_ready(parts: &Parts, announces_start: bool) {
    let notifier = parts.notifier.clone();
    let health = parts.source_health.clone();
    tokio::spawn(async move {
        if announces_start {
            health.started.notified().await;
        }
        notifier.ready();
    });
}

/// Starts SIGHUP's reloader (see [`crate::pipeline::reload`]).
fn reloader(
    config: &Config,
    parts: &Parts,
    reload: Reload,
    reloads: Reloads,
    services: &Arc<tokio::sync::Mutex<reload::Services>>,
    tasks: &CancellationToken,
) -> Result<JoinHandle<()>, RunError> {
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(
        |source| RunError::Signal {
            signal: "SIGHUP",
            source,
        },
    )?;
    let reloader = reload::Reloader {
        path: reload.path,
        set_log_level: reload.set_log_level,
        products: reloads.products,
        dedup: reloads.dedup,
        flush: config.service.is_some().then_some(reloads.flush),
        services: services.clone(),
        outbox: parts.outbox.stages(),
        metrics: parts.metrics.clone(),
        clock: parts.clock.clone(),
        running: config.clone(),
        inventory: parts.inventory.clone(),
    };
    Ok(tokio::spawn(
        reloader.run(hangup, tasks.clone()).in_current_span(),
    ))
}

/// The age and size bounds, kept while nothing is committed too (a dock hearing
/// nothing while its uplink is down).
fn keep_bounds(config: &Config, outbox: StageOutbox, tasks: &CancellationToken) {
    if config.outbox.max_age.is_some() || config.outbox.max_bytes.is_some() {
        let every = config.outbox.max_age.map_or(RETENTION_EVERY, |age| {
            (age / 4).clamp(Duration::from_secs(1), RETENTION_EVERY)
        });
        tokio::spawn(outbox.keep_bounds(every, tasks.clone()).in_current_span());
    }
}

/// Pings systemd's watchdog while every stage makes progress.
fn watchdog(notifier: &Notifier, liveness: Liveness, tasks: &CancellationToken) {
    if let Some(interval) = notifier.watchdog_interval() {
        let notifier = notifier.clone();
        let stop = tasks.clone();
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = systemd::watchdog(notifier, liveness, interval) => {}
                    _ = stop.cancelled() => {}
                }
            }
            .in_current_span(),
        );
    }
}
