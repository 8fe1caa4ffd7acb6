/*!
The only place that creates channels, spawns stages and orders shutdown.

```text
 source ──adverts──► ingest (products, dedup, group commits) ──► outbox ──► flusher
```

Shutdown drains instead of dropping: only the source is told to stop; the ingest stage
ends when its input closes, after committing what it holds; the flusher finishes the
batch in flight (or abandons it, leaving its rows pending) within
`gateway.shutdown_grace_secs`; the outbox's owner thread closes the database last.

Every stage is a task, and the tasks are watched together, not awaited in order: a
stage that dies (a panic, a source that fails) is logged at ERROR with its name and
cause the moment it happens, the others are stopped in the same order, and the run
returns an error so that the process exits non-zero and systemd restarts it. A stage
that ends normally (a replay that reached its end) is marked done for the watchdog.
The daemon holds the state directory's lock ([`StateLock`]) for its whole run.
*/

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tracing::Instrument;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{ApiError, ServiceClient};
use crate::clock::{ClockKeeper, SharedClock};
use crate::config::Config;
use crate::flush::{FlushControl, FlushReport};
use crate::health::{self, HealthKeeper};
use crate::heard_now::HeardNow;
use crate::http::{self, BindError, HttpState};
use crate::ingest::{self, IngestReport, IngestSettings};
use crate::metrics::Metrics;
use crate::outbox::{LockError, Outbox, OutboxError, StateLock, Store, StoreOptions};
use crate::record::EpochMillis;
use crate::reload;
use crate::source::SourceHealth;
use crate::source::{self, Source, SourceError, SourceReport};
use crate::systemd::{self, Beat, Liveness, Notifier};

/// Advertisements in flight between the source and the ingest stage.
const ADVERT_CHANNEL: usize = 4096;

/// The ingest stage turns on every input and commit, and says when it is idle; this
/// long holding work without a turn is a stall (for the watchdog).
const INGEST_ALLOWANCE: Duration = Duration::from_secs(30);

/// How often the outbox's age and size bounds are looked at besides each commit (more
/// often for a short `max_age_secs`).
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Beyond a whole request and a whole backoff, how long the flusher may go without a turn.
const FLUSH_SLACK: Duration = Duration::from_secs(60);

/// The exit code of `run --until-drained` stopped by a signal before it drained, so that
/// a script can tell "drained" (0) from "stopped" (captures may still be pending). `run`
/// without it exits 0 on SIGTERM (DESIGN.md, "Signals").
pub const EXIT_UNDRAINED: u8 = 4;

/// The exit code of `run` when this user cannot write the state directory or its
/// database (the unit does not restart on it: the error says what fixes it).
pub const EXIT_STATE_NOT_WRITABLE: u8 = 5;

/// How `run` behaves beyond the config.
pub struct RunOptions {
    /// Return once the source has ended and nothing deliverable is pending.
    pub until_drained: bool,
    /// Re-read the config on SIGHUP; `None`: SIGHUP is not handled here.
    pub reload: Option<Reload>,
    /// The clock every stage reads (the machine's by default; the binary's entry point
    /// may hand in the test clock of a debug build).
    pub clock: SharedClock,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            until_drained: false,
            reload: None,
            clock: crate::clock::system(),
        }
    }
}

/// What SIGHUP re-reads: the config file (with the process environment's
/// `TAPEGATE_*` overrides). A valid new config is applied as [`crate::reload`] says
/// (at once, or by restarting the delivery stage, the HTTP server or the pusher in
/// process), dropping nothing; a bad one is refused with an ERROR line and the running
/// one stays in force. What cannot change in a running daemon waits for a restart.
pub struct Reload {
    pub path: PathBuf,
    /// Applies a new `log.level` (the log subscriber belongs to the binary).
    pub set_log_level: SetLogLevel,
}

pub use crate::reload::SetLogLevel;

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub source: SourceReport,
    pub ingest: IngestReport,
    /// `None` when no `[service]` is configured.
    pub flush: Option<FlushReport>,
    /// A stop signal (SIGTERM, SIGINT: the `shutdown` future) ended the run, rather than
    /// the drain of `--until-drained`.
    pub stopped: bool,
    /// Captures still pending in the outbox when the run ended.
    pub pending: u64,
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Another daemon owns the state directory.
    #[error(transparent)]
    Locked(#[from] LockError),
    #[error("cannot start the outbox thread: {0}")]
    OutboxThread(#[source] std::io::Error),
    #[error("cannot set up the service client: {0}")]
    Client(#[source] ApiError),
    #[error(transparent)]
    Http(#[from] BindError),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::SetupError),
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

    /// The state database was written by a newer tapegate: a restart will not help.
    pub fn database_too_new(&self) -> bool {
        matches!(self, RunError::Outbox(OutboxError::SchemaTooNew { .. }))
    }

    /// This user cannot write the state directory or its database (owner, mode, a
    /// read-only file system): a restart will not help until someone fixes it as the
    /// error says.
    pub fn state_not_writable(&self) -> bool {
        matches!(
            self,
            RunError::Outbox(OutboxError::NotWritable { .. })
                | RunError::Locked(LockError::NotWritable { .. })
        )
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
    // Held until this function returns: after the outbox has closed.
    let _owner_of_state_dir = StateLock::acquire(&config.gateway.state_dir)?;
    let notifier = Notifier::from_env();
    let time = options.clock.clone();
    let mut liveness = Liveness::default();
    let health = Arc::new(SourceHealth::default());
    let state_dir = config.gateway.state_dir.clone();
    let store_options = StoreOptions {
        durability: config.outbox.durability,
        max_pending: config.outbox.max_pending,
        max_page_count: None,
        clock: time.clone(),
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
    let mut store = store;
    store.set_retention(config.outbox.retention());
    let (outbox, owner) = Outbox::start(store).map_err(RunError::OutboxThread)?;

    if config.service.is_none() {
        tracing::warn!("no [service] configured: captures accumulate in the outbox until one is");
    }

    let metrics = Arc::new(Metrics::new());
    let inventory = record_inventory(&config, &outbox, &metrics, time.wall_ms()).await;
    let tapes_heard = Arc::new(HeardNow::default());
    let admission = Arc::new(health::Admission::default());
    // Bound before anything runs, so that a port in use stops the daemon at once.
    let http_listener = match config.http.listen {
        Some(addr) => Some(http::bind(addr).await?),
        None => None,
    };

    let pusher = config
        .telemetry
        .clone()
        .map(|t| {
            crate::telemetry::Pusher::new(t, &config.gateway.id, metrics.clone(), time.clone())
        })
        .transpose()?;

    let client = config
        .service
        .as_ref()
        .map(|s| ServiceClient::new(s).map(|c| c.with_metrics(metrics.clone())))
        .transpose()
        .map_err(RunError::Client)?;
    let (flush_restarts, flush_setups) = tokio::sync::mpsc::unbounded_channel();

    // What SIGHUP changes at once: each stage gets its own part of a reloaded config.
    let (products_tx, products_rx) = watch::channel(config.products.clone());
    let (dedup_tx, dedup_rx) = watch::channel(config.dedup);
    let stop_source = CancellationToken::new();
    let stop_flush = CancellationToken::new();
    let abandon = CancellationToken::new();
    let (adverts_tx, adverts_rx) = mpsc::channel(ADVERT_CHANNEL);
    let (committed_tx, committed_rx) = watch::channel(0u64);
    let mut stages = Stages::default();

    // The BLE source drops what no product matches; SIGHUP's products reach it too.
    let source = source::from_settings(&config.scanner, time.clone())
        .with_filter(config.products.clone(), Some(products_rx.clone()))
        .with_health(health.clone());
    let live = source.is_live();
    let announces_start = source.announces_start();
    let clock = start_clock(&config, time.clone(), &outbox, &metrics).await;
    {
        let stop = stop_source.clone();
        let run = async move { source.run(adverts_tx, stop).await.map_err(RunError::from) };
        stages.spawn("source", run, Ended::Source, None);
    }
    let ingest_beat = liveness.stage("ingest", INGEST_ALLOWANCE);
    stages.spawn(
        "ingest",
        ingest::run(
            IngestSettings {
                products: config.products.clone(),
                dedup: config.dedup,
                commit_interval: config.outbox.commit_interval,
                live,
                clock,
                time: time.clone(),
                beat: ingest_beat.clone(),
                reload_products: Some(products_rx),
                reload_dedup: Some(dedup_rx),
                metrics: metrics.clone(),
                tapes_heard: tapes_heard.clone(),
                admission: admission.clone(),
            },
            adverts_rx,
            outbox.clone(),
            committed_tx,
            abandon.clone(),
        ),
        Ended::Ingest,
        Some(ingest_beat),
    );
    if let (Some(client), Some(service)) = (client, &config.service) {
        tracing::info!(
            environment = %service.environment,
            url = %client.decode_bulk_url(),
            "delivering to the service"
        );
        // A flusher may legitimately wait a whole request and a whole backoff.
        let beat = liveness.stage(
            "flush",
            service.request_timeout + config.flush.backoff_max + FLUSH_SLACK,
        );
        let flush_beat = beat.clone();
        // The delivery stage: a flusher that a reload may replace (src/reload.rs).
        let flusher = reload::flush_stage(
            reload::FlushStage {
                outbox: outbox.clone(),
                gateway_id: config.gateway.id.clone(),
                beat,
                metrics: metrics.clone(),
                clock: time.clone(),
                grace: config.gateway.shutdown_grace,
            },
            reload::FlushSetup {
                client,
                settings: config.flush.clone(),
                mac_format: service.mac_format,
                retention: config.readings.retention,
            },
            flush_setups,
            FlushControl {
                committed: committed_rx,
                stop: stop_flush.clone(),
                abandon: abandon.clone(),
                until_drained: options.until_drained,
            },
        );
        stages.spawn("flush", flusher, Ended::Flush, Some(flush_beat));
    }

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
            HealthKeeper::new(health.clone(), time.clone()),
            service_tasks.clone(),
        )
        .in_current_span(),
    );
    let http_state = Arc::new(HttpState {
        gateway_id: config.gateway.id.clone(),
        source: config.scanner.source.name().to_string(),
        outbox: outbox.clone(),
        liveness: liveness.clone(),
        admission: admission.clone(),
        metrics: metrics.clone(),
        heard: tapes_heard.clone(),
        source_health: health.clone(),
        clock: time.clone(),
    });
    // The server and the pusher, which a reload may restart (src/reload.rs).
    let services = Arc::new(tokio::sync::Mutex::new(reload::Services::new(
        service_tasks.clone(),
        http_state,
        outbox.clone(),
    )));
    {
        let mut s = services.lock().await;
        if let Some(listener) = http_listener {
            s.serve(listener).await;
        }
        s.push(pusher).await;
    }
    let reload_task = if let Some(reload) = options.reload {
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|source| RunError::Signal {
                signal: "SIGHUP",
                source,
            })?;
        let reloader = reload::Reloader {
            path: reload.path,
            set_log_level: reload.set_log_level,
            products: products_tx,
            dedup: dedup_tx,
            flush: config.service.is_some().then_some(flush_restarts),
            services: services.clone(),
            outbox: outbox.clone(),
            metrics: metrics.clone(),
            clock: time.clone(),
            running: config.clone(),
            inventory,
        };
        Some(tokio::spawn(
            reloader
                .run(hangup, service_tasks.clone())
                .in_current_span(),
        ))
    } else {
        None
    };
    // The age and size bounds, kept while nothing is committed too (a dock hearing
    // nothing while its uplink is down).
    if config.outbox.max_age.is_some() || config.outbox.max_bytes.is_some() {
        let every = config.outbox.max_age.map_or(RETENTION_EVERY, |age| {
            (age / 4).clamp(Duration::from_secs(1), RETENTION_EVERY)
        });
        tokio::spawn(
            crate::outbox::keep_bounds(outbox.clone(), every, service_tasks.clone())
                .in_current_span(),
        );
    }
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

    // Every stage is watched at once, not awaited in order: one that dies (a panic, a
    // failed source) is noticed when it happens, and the daemon stops and exits
    // non-zero so that systemd restarts it, instead of running on without it.
    let mut stopper = Stopper {
        notifier: notifier.clone(),
        stop_source,
        stop_flush,
        grace: config.gateway.shutdown_grace,
        deadline: None,
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopped = false;
    let mut abandoned = false;
    let mut failure: Option<RunError> = None;
    let (mut source_report, mut ingest_report, mut flush_report) = (None, None, None);
    loop {
        // Without --until-drained, a daemon whose stages have all ended (a replay
        // without a [service]) waits for its stop signal like any other.
        if stages.running.is_empty() && (options.until_drained || stopper.deadline.is_some()) {
            break;
        }
        let grace_over = async {
            match stopper.deadline {
                Some(at) if !abandoned => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            next = stages.running.next(), if !stages.running.is_empty() => {
                let Some((stage, ended)) = next else { break };
                match ended {
                    Ok(Ended::Source(Ok(report))) => source_report = Some(report),
                    Ok(Ended::Source(Err(e))) => {
                        // The reason in the message itself: `journalctl -p warning -o cat`
                        // and `systemctl status` show the message, not the fields.
                        tracing::error!(stage, "the source failed, stopping: {e}");
                        // systemd keeps the last STATUS= after the exit: `systemctl status`
                        // then says why the unit failed (when systemd reads it before it
                        // reaps the process: without a barrier, not always).
                        notifier.status(&format!("the source failed: {e}"));
                        failure.get_or_insert(e);
                        stopper.begin();
                    }
                    Ok(Ended::Ingest(report)) => ingest_report = Some(report),
                    Ok(Ended::Flush(report)) => flush_report = Some(report),
                    Err(source) => {
                        tracing::error!(stage, error = %source, "the {stage} stage died; stopping the daemon (exit 1) so that it is restarted");
                        failure.get_or_insert(RunError::Stage { stage, source });
                        stopper.begin();
                    }
                }
            }
            _ = &mut shutdown, if stopper.deadline.is_none() => {
                stopped = true;
                tracing::info!("shutting down: stopping the source, committing what is held, finishing the batch in flight");
                stopper.begin();
            }
            _ = grace_over => {
                tracing::warn!(
                    grace_secs = stopper.grace.as_secs(),
                    "shutdown grace ran out; abandoning what cannot finish (it stays pending)"
                );
                abandon.cancel();
                abandoned = true;
            }
        }
    }
    service_tasks.cancel();
    // The status task keeps the scanner's last counts before the database closes.
    let _ = status_task.await;
    if let Some(task) = reload_task {
        let _ = task.await;
    }
    services.lock().await.stop_all().await;
    drop(services);
    let pending = outbox.call(|s| Ok(s.pending())).await.unwrap_or(0);
    drop(outbox);
    // The owner thread closes the database (checkpointing the WAL) once every handle is gone.
    let _ = tokio::task::spawn_blocking(move || owner.join()).await;

    if let Some(e) = failure {
        return Err(e);
    }
    let source_report = source_report.unwrap_or_default();
    let ingest_report = ingest_report.unwrap_or_default();
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
        pending,
        "stopped"
    );
    if options.until_drained && stopped {
        tracing::warn!(
            pending,
            "stopped by a signal before the outbox was drained (--until-drained exits {EXIT_UNDRAINED})"
        );
    }
    Ok(RunReport {
        source: source_report,
        ingest: ingest_report,
        flush: flush_report,
        stopped,
        pending,
    })
}

/// Gathers the inventory (`bluetoothd --version` included, off the runtime), shows it
/// in the metrics and records it for `tapegate status`. A failure to record it is
/// logged; nothing else depends on it.
async fn record_inventory(
    config: &Config,
    outbox: &Outbox,
    metrics: &Metrics,
    started_at: EpochMillis,
) -> Option<crate::inventory::Inventory> {
    let c = config.clone();
    let inventory =
        tokio::task::spawn_blocking(move || crate::inventory::Inventory::gather(&c, started_at))
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
    if let Err(e) = outbox.call(move |s| s.note_inventory(&record)).await {
        tracing::warn!(error = %e, "cannot record the inventory in the state database");
    }
    Some(inventory)
}

/// Starts the clock keeper (DESIGN.md, "Time on a gateway without a real-time clock").
/// If the outbox cannot record this boot, captures are not held: accepted and sent as
/// the clock says, which is what a gateway did before clock repair.
async fn start_clock(
    config: &Config,
    clock: SharedClock,
    outbox: &Outbox,
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

/// How a stage's task ended, when it did not die.
enum Ended {
    Source(Result<SourceReport, RunError>),
    Ingest(IngestReport),
    Flush(FlushReport),
}

type StageEnd = (&'static str, Result<Ended, tokio::task::JoinError>);

/// The running stages, each a task, watched together.
#[derive(Default)]
struct Stages {
    running: FuturesUnordered<BoxFuture<'static, StageEnd>>,
}

impl Stages {
    /// Spawns `stage` as a task named `name`; its end is reported as `ended` of its
    /// output. A stage that ends normally marks its `beat` done: a finished stage (the
    /// ingest after a replay reached its end) is not a stuck one, and the watchdog goes
    /// on pinging for the stages still running.
    fn spawn<T: Send + 'static>(
        &mut self,
        name: &'static str,
        stage: impl Future<Output = T> + Send + 'static,
        ended: fn(T) -> Ended,
        beat: Option<Beat>,
    ) {
        let task = tokio::spawn(
            async move {
                debug_hook::panic_if_asked(name);
                let out = stage.await;
                if let Some(beat) = beat {
                    beat.done();
                }
                out
            }
            .in_current_span(),
        );
        self.running
            .push(Box::pin(async move { (name, task.await.map(ended)) }));
    }
}

/// Begins the ordered shutdown once: only the source is told to stop (the stages behind
/// it end as their input closes); the flusher finishes its batch within the grace.
struct Stopper {
    notifier: Notifier,
    stop_source: CancellationToken,
    stop_flush: CancellationToken,
    grace: Duration,
    /// When the grace runs out; `None` while not stopping.
    deadline: Option<tokio::time::Instant>,
}

impl Stopper {
    fn begin(&mut self) {
        if self.deadline.is_some() {
            return;
        }
        self.notifier.stopping();
        self.stop_source.cancel();
        self.stop_flush.cancel();
        self.deadline = Some(tokio::time::Instant::now() + self.grace);
    }
}

/// A way for the end-to-end tests to make a stage die as a real bug would (debug
/// builds only): `TAPEGATE_DEBUG_PANIC_STAGE=flush` panics the flush stage at its start.
mod debug_hook {
    #[cfg(debug_assertions)]
    pub fn panic_if_asked(stage: &str) {
        if std::env::var("TAPEGATE_DEBUG_PANIC_STAGE").is_ok_and(|s| s == stage) {
            panic!("TAPEGATE_DEBUG_PANIC_STAGE asked the {stage} stage to panic");
        }
    }

    #[cfg(not(debug_assertions))]
    pub fn panic_if_asked(_stage: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_ends_normally_leaves_the_watchdog_satisfied() {
        let mut liveness = Liveness::default();
        let beat = liveness.stage("ingest", Duration::from_secs(30));
        let still_running = liveness.stage("flush", Duration::from_secs(30));
        let mut stages = Stages::default();
        stages.spawn(
            "ingest",
            async { IngestReport::default() },
            Ended::Ingest,
            Some(beat),
        );
        let (name, ended) = stages.running.next().await.unwrap();
        assert_eq!(name, "ingest");
        assert!(matches!(ended, Ok(Ended::Ingest(_))));
        // Long after the ingest stage ended, only a stage still running must beat.
        tokio::time::advance(Duration::from_secs(120)).await;
        still_running.touch();
        assert_eq!(liveness.check(tokio::time::Instant::now()), Ok(()));
    }

    #[tokio::test]
    async fn a_stage_that_panics_is_reported_with_its_name_and_message() {
        let mut stages = Stages::default();
        stages.spawn(
            "flush",
            async {
                if true {
                    panic!("boom in flush");
                }
                FlushReport::default()
            },
            Ended::Flush,
            None,
        );
        let (name, ended) = stages.running.next().await.unwrap();
        assert_eq!(name, "flush");
        let err = ended.err().expect("a panic");
        assert!(
            err.is_panic() && err.to_string().contains("boom in flush"),
            "{err}"
        );
    }
}
