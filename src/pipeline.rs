/*!
The only place that creates channels, spawns stages and orders shutdown.

```text
 source ──adverts──► ingest (products, dedup, group commits) ──► outbox ──► flusher
```

Shutdown drains instead of dropping: only the source is told to stop; the ingest stage
ends when its input closes, after committing what it holds; the flusher finishes the
batch in flight (or abandons it, leaving its rows pending) within
`gateway.shutdown_grace_secs`; the outbox's owner thread closes the database last.
*/

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{ApiError, ServiceClient};
use crate::config::{Config, Password};
use crate::dedup::DedupSettings;
use crate::flush::{FlushControl, FlushReport, Flusher};
use crate::health::{self, HealthKeeper};
use crate::ingest::{self, IngestReport, IngestSettings};
use crate::outbox::{Outbox, OutboxError, Store, StoreOptions};
use crate::products::Products;
use crate::source::SourceHealth;
use crate::source::{self, Source, SourceError, SourceReport};
use crate::systemd::{self, Liveness, Notifier};

/// Advertisements in flight between the source and the ingest stage.
const ADVERT_CHANNEL: usize = 4096;

/// The ingest stage turns at least every commit interval; this long without a turn is
/// a stall (for the watchdog).
const INGEST_ALLOWANCE: Duration = Duration::from_secs(30);

/// Beyond a whole request and a whole backoff, how long the flusher may go without a turn.
const FLUSH_SLACK: Duration = Duration::from_secs(60);

/// How `run` behaves beyond the config.
#[derive(Default)]
pub struct RunOptions {
    /// Return once the source has ended and nothing deliverable is pending.
    pub until_drained: bool,
    /// Re-read the config on SIGHUP; `None`: SIGHUP is not handled here.
    pub reload: Option<Reload>,
}

/// What SIGHUP re-reads: the config file (with the process environment's
/// `TAPEGATE_*` overrides). A valid new config replaces the products, the dedup
/// settings and the log level at once, dropping nothing; a bad one is refused with an
/// ERROR line and the running one stays in force. Other changes wait for a restart.
pub struct Reload {
    pub path: PathBuf,
    /// Applies a new `log.level` (the log subscriber belongs to the binary).
    pub set_log_level: SetLogLevel,
}

/// Applies a log filter (`info`, `tapegate=debug`); the error says why it was not.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub source: SourceReport,
    pub ingest: IngestReport,
    /// `None` when no `[service]` is configured.
    pub flush: Option<FlushReport>,
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("cannot start the outbox thread: {0}")]
    OutboxThread(#[source] std::io::Error),
    #[error("cannot set up the service client: {0}")]
    Client(#[source] ApiError),
    #[error("cannot listen for {signal}: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A stage's task panicked or was cancelled; the cause is kept.
    #[error("the {stage} stage failed: {source}")]
    Stage {
        stage: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl RunError {
    /// The configured source cannot work on this machine (see
    /// [`SourceError::cannot_work_here`]): a restart will not help.
    pub fn source_cannot_work_here(&self) -> bool {
        matches!(self, RunError::Source(e) if e.cannot_work_here())
    }

    fn stage(stage: &'static str) -> impl FnOnce(tokio::task::JoinError) -> RunError {
        move |source| RunError::Stage { stage, source }
    }
}

/// Runs the daemon with `config` until `shutdown` resolves (or, with
/// `until_drained`, until the source has ended and nothing deliverable is pending).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
    options: RunOptions,
) -> Result<RunReport, RunError> {
    // Every log line of the daemon carries the gateway id (a journald field too).
    let span = tracing::info_span!("gateway", gateway_id = %config.gateway.id);
    run_in(config, shutdown, options).instrument(span).await
}

async fn run_in(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
    options: RunOptions,
) -> Result<RunReport, RunError> {
    let notifier = Notifier::from_env();
    let mut liveness = Liveness::default();
    let health = Arc::new(SourceHealth::default());
    let state_dir = config.gateway.state_dir.clone();
    let store_options = StoreOptions {
        durability: config.outbox.durability,
        max_pending: config.outbox.max_pending,
        max_page_count: None,
    };
    let (store, opened) =
        tokio::task::spawn_blocking(move || Store::open(&state_dir, store_options))
            .await
            .map_err(RunError::stage("outbox open"))??;
    if let Some(aside) = &opened.quarantined {
        tracing::error!(
            path = %opened.path.display(),
            moved_to = %aside.display(),
            reason = opened.quarantine_reason.as_deref().unwrap_or(""),
            "outbox database was corrupt: moved it aside and started a fresh one"
        );
    }
    tracing::info!(
        path = %opened.path.display(),
        pending = opened.pending,
        "outbox open"
    );
    let (outbox, owner) = Outbox::start(store).map_err(RunError::OutboxThread)?;

    if config.service.is_none() {
        tracing::warn!("no [service] configured: captures accumulate in the outbox until one is");
    }

    let client = config
        .service
        .as_ref()
        .map(ServiceClient::new)
        .transpose()
        .map_err(RunError::Client)?;

    // What SIGHUP changes at once: each stage gets its own part of a reloaded config.
    let (products_tx, products_rx) = watch::channel(config.products.clone());
    let (dedup_tx, dedup_rx) = watch::channel(config.dedup);
    if let Some(reload) = options.reload {
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|source| RunError::Signal {
                signal: "SIGHUP",
                source,
            })?;
        let stages = Reloaded {
            products: products_tx,
            dedup: dedup_tx,
        };
        tokio::spawn(reload_on_hangup(hangup, reload, stages).in_current_span());
    }

    let stop_source = CancellationToken::new();
    let stop_flush = CancellationToken::new();
    let abandon = CancellationToken::new();
    // Cancelled when the source fails: the daemon stops (and exits non-zero).
    let fatal = CancellationToken::new();
    let (adverts_tx, adverts_rx) = mpsc::channel(ADVERT_CHANNEL);
    let (committed_tx, committed_rx) = watch::channel(0u64);

    // The BLE source drops what no product matches; SIGHUP's products reach it too.
    let source = source::from_settings(&config.scanner)
        .with_filter(config.products.clone(), Some(products_rx.clone()))
        .with_health(health.clone());
    let live = source.is_live();
    let announces_start = source.announces_start();
    let source = {
        let stop = stop_source.clone();
        let fatal = fatal.clone();
        let notifier = notifier.clone();
        tokio::spawn(
            async move {
                let result = source.run(adverts_tx, stop).await.map_err(RunError::from);
                if let Err(e) = &result {
                    // The reason in the message itself: `journalctl -p warning -o cat`
                    // and `systemctl status` show the message, not the fields.
                    tracing::error!("the source failed, stopping: {e}");
                    // systemd keeps the last STATUS= after the exit: `systemctl status`
                    // then says why the unit failed (when systemd reads it before it
                    // reaps the process: without a barrier, not always).
                    notifier.status(&format!("the source failed: {e}"));
                    fatal.cancel();
                }
                result
            }
            .in_current_span(),
        )
    };
    let ingest = tokio::spawn(
        ingest::run(
            IngestSettings {
                products: config.products.clone(),
                dedup: config.dedup,
                commit_interval: config.outbox.commit_interval,
                live,
                beat: liveness.stage("ingest", INGEST_ALLOWANCE),
                reload_products: Some(products_rx),
                reload_dedup: Some(dedup_rx),
            },
            adverts_rx,
            outbox.clone(),
            committed_tx,
            abandon.clone(),
        )
        .in_current_span(),
    );
    let flusher = match (client, &config.service) {
        (Some(client), Some(service)) => {
            tracing::info!(
                environment = %service.environment,
                url = %client.decode_bulk_url(),
                "delivering to the service"
            );
            Some(tokio::spawn(
                Flusher {
                    client,
                    outbox: outbox.clone(),
                    settings: config.flush.clone(),
                    mac_format: service.mac_format,
                    gateway_id: config.gateway.id.clone(),
                    retention: config.readings.retention,
                    // A flusher may legitimately wait a whole request and a whole backoff.
                    beat: liveness.stage(
                        "flush",
                        service.request_timeout + config.flush.backoff_max + FLUSH_SLACK,
                    ),
                }
                .run(FlushControl {
                    committed: committed_rx,
                    stop: stop_flush.clone(),
                    abandon: abandon.clone(),
                    until_drained: options.until_drained,
                })
                .in_current_span(),
            ))
        }
        _ => None,
    };

    // READY once the outbox is open and checked and the source is up (the BLE source:
    // adapter found, discovery started), so that a source that cannot start fails the
    // unit's start instead of following a READY.
    {
        let notifier = notifier.clone();
        let health = health.clone();
        tokio::spawn(async move {
            if announces_start {
                health.started.notified().await;
            }
            notifier.ready();
        });
    }
    let service_tasks = CancellationToken::new();
    let status_task = tokio::spawn(
        health::report_status(
            notifier.clone(),
            outbox.clone(),
            HealthKeeper::new(health.clone()),
            service_tasks.clone(),
        )
        .in_current_span(),
    );
    if let Some(interval) = notifier.watchdog_interval() {
        let notifier = notifier.clone();
        let stop = service_tasks.clone();
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

    // Every stage, awaited in pipeline order: each ends after the one before it.
    let all = async {
        let source = source.await;
        let ingest = ingest.await;
        let flush = match flusher {
            Some(f) => Some(f.await),
            None => None,
        };
        (source, ingest, flush)
    };
    let mut all = std::pin::pin!(all);
    let mut finished = None;
    tokio::select! {
        r = &mut all, if options.until_drained => finished = Some(r),
        _ = shutdown => tracing::info!("shutting down: stopping the source, committing what is held, finishing the batch in flight"),
        _ = fatal.cancelled() => {}
    }
    notifier.stopping();
    stop_source.cancel();
    stop_flush.cancel();
    let (source_result, ingest_result, flush_result) = match finished {
        Some(r) => r,
        None => {
            let grace = config.gateway.shutdown_grace;
            match tokio::time::timeout(grace, &mut all).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(
                        grace_secs = grace.as_secs(),
                        "shutdown grace ran out; abandoning what cannot finish (it stays pending)"
                    );
                    abandon.cancel();
                    all.await
                }
            }
        }
    };
    service_tasks.cancel();
    // The status task keeps the scanner's last counts before the database closes.
    let _ = status_task.await;
    drop(outbox);
    // The owner thread closes the database (checkpointing the WAL) once every handle is gone.
    let _ = tokio::task::spawn_blocking(move || owner.join()).await;

    let ingest_report = ingest_result.map_err(RunError::stage("ingest"))?;
    let flush_report = flush_result.transpose().map_err(RunError::stage("flush"))?;
    let source_report = source_result.map_err(RunError::stage("source"))??;
    let flushed = flush_report.clone().unwrap_or_default();
    tracing::info!(
        adverts = ingest_report.adverts,
        unmatched = ingest_report.unmatched,
        deduplicated = ingest_report.deduplicated,
        accepted = ingest_report.accepted,
        evicted = ingest_report.evicted,
        malformed = source_report.malformed,
        delivered = flushed.delivered,
        dead_letters = flushed.dead_letters,
        "stopped"
    );
    Ok(RunReport {
        source: source_report,
        ingest: ingest_report,
        flush: flush_report,
    })
}

/// The parts of a reloaded config that the stages take at once.
struct Reloaded {
    products: watch::Sender<Products>,
    dedup: watch::Sender<DedupSettings>,
}

/// On SIGHUP: re-reads the config (see [`Reload`]) and hands a valid one's parts to the
/// stages.
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    reload: Reload,
    stages: Reloaded,
) {
    let path = &reload.path;
    while hangup.recv().await.is_some() {
        // Without the password, as `check --config-only` (the unit's `ExecReload=`)
        // validates: the same verdict, and a reload changes nothing of the service.
        match crate::config::load_with(path, std::env::vars(), Password::Skip) {
            Ok(new) => {
                if let Err(e) = (reload.set_log_level)(&new.log.level) {
                    tracing::warn!(error = %e, "log level not changed");
                }
                stages.products.send_replace(new.products);
                stages.dedup.send_replace(new.dedup);
                tracing::info!(path = %path.display(), "SIGHUP: config reloaded (products, dedup, log level; other changes take effect at the next start)");
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "SIGHUP: new config refused; the running one stays in force");
            }
        }
    }
}
