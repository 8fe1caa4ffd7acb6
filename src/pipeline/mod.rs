/*!
The daemon's wiring: the only place that creates channels, spawns stages and orders
shutdown. It may touch every stage and service (source, ingest, flush, the outbox, http,
reload, telemetry, health); nothing but the commands imports it.

```text
 source ──adverts──► ingest (products, dedup, group commits) ──► outbox ──► flusher
```

[`run`] is a sequence of named steps, each in a file of its own: open what the stages
need (the outbox, the inventory, the clock keeper, and what faces outward: the HTTP
listener, the pusher, the service client); make the parts they share (handles, SIGHUP's
channels, the stop tokens); start capture (the source and the ingest stage), delivery
(the flusher) and the services (READY and STATUS=, the HTTP server, the pusher, the
reloader, the outbox's bounds, the watchdog); then supervise (watching the stages, the
ordered shutdown). Why a run fails is [`RunError`].

Shutdown drains instead of dropping: the source is told to stop, and the ingest stage
ends when its input closes, after committing what it holds; the flusher sends nothing
new and waits for the answers of its batches in flight (or abandons them, leaving their
rows pending) within `gateway.shutdown_grace_secs`; the outbox's owner thread closes
the database last.

Every stage is a task, and the tasks are watched together, not awaited in order: a
stage that dies (a panic, a source that fails) is logged at ERROR with its name and
cause the moment it happens, the others are stopped in the same order, and the run
returns an error so that the process exits non-zero and systemd restarts it. A stage
that ends normally (a replay that reached its end) is marked done for the watchdog.
The daemon holds the state directory's lock ([`StateLock`]) for its whole run.
*/

mod capture;
mod delivery;
mod error;
mod open;
mod options;
mod parts;
pub mod reload;
mod services;
mod supervise;

use std::future::Future;

use tracing::Instrument;

use crate::config::Config;
use crate::flush::FlushReport;
use crate::ingest::IngestReport;
use crate::outbox::StateLock;
use crate::source::SourceReport;

pub use error::RunError;
pub use options::{Reload, RunOptions, SetLogLevel};

// The daemon's own stops exit with sysexits(3) numbers, so that systemd names them for
// what they are in the journal and `systemctl status` ("status=69/UNAVAILABLE"), where
// small numbers read as LSB's ("3/NOTIMPLEMENTED"). Those a restart cannot mend are in
// the unit's `RestartPreventExitStatus=`.

/// `run --until-drained` stopped by a signal before it drained (EX_TEMPFAIL), so that a
/// script can tell "drained" (0) from "stopped" (captures may still be pending). `run`
/// without it exits 0 on SIGTERM (DESIGN.md, "Signals").
pub const EXIT_UNDRAINED: u8 = 75;

/// `run` cannot work because the configured source cannot work on this machine: no
/// Bluetooth adapter, BlueZ absent, D-Bus access denied, no replay file
/// (EX_UNAVAILABLE).
pub const EXIT_SOURCE_UNUSABLE: u8 = 69;

/// `run` cannot create or write the state directory or its database: another user's,
/// a read-only mode or file system (EX_CANTCREAT; the error says what fixes it).
pub const EXIT_STATE_NOT_WRITABLE: u8 = 73;

/// `run` refused a state database written by a newer tapegate, a downgrade: it is left
/// untouched (EX_DATAERR).
pub const EXIT_DATABASE_TOO_NEW: u8 = 65;

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

/// The daemon, stage by stage: hold the state directory, open the outbox and what
/// faces outward, start the capture path, then delivery, then the services; watch the
/// stages until they end; stop the services, close the outbox and report.
async fn run_in(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
    mut options: RunOptions,
) -> Result<RunReport, RunError> {
    // Held until this function returns: after the outbox has closed.
    let _owner_of_state_dir = StateLock::acquire(&config.gateway.state_dir)?;
    let (outbox, owner) = open::outbox(&config, &options.clock, &options.hooks).await?;
    let mut parts = parts::Parts::new(
        &config,
        crate::outbox::Handles::new(&outbox),
        options.clock.clone(),
        options.hooks.clone(),
    )
    .await;
    let mut outward = open::Outward::open(&config, &parts.metrics, &options.clock).await?;
    let (reloads, reloaded) = parts::reload_channels(&config);
    let stops = parts::Stops::default();

    let mut stages = supervise::Stages::new(options.hooks.clone());
    let stored = options.mgmt_socket.take();
    let capture = capture::start(&config, &mut parts, &reloaded, &stops, &mut stages, stored).await;
    let control = stops.flush_control(capture.committed, options.until_drained);
    let client = outward.client.take();
    delivery::start(
        &config,
        &mut parts,
        client,
        reloaded.flush,
        control,
        &mut stages,
    );

    let stopper = supervise::Stopper::new(
        parts.notifier.clone(),
        &stops,
        config.gateway.shutdown_grace,
    );
    let services = services::start(
        &config,
        parts,
        outward,
        capture.announces_start,
        options.reload,
        reloads,
    )
    .await?;
    let outcome = supervise::watch(
        stages,
        stopper,
        shutdown,
        options.until_drained,
        &stops.abandon,
    )
    .await;
    services.stop().await;
    let pending = open::close(outbox, owner).await;
    report(outcome, pending, options.until_drained)
}

/// What the run did, logged and returned; or the first stage's failure.
fn report(
    outcome: supervise::Outcome,
    pending: u64,
    until_drained: bool,
) -> Result<RunReport, RunError> {
    if let Some(e) = outcome.failure {
        return Err(e);
    }
    let source_report = outcome.source.unwrap_or_default();
    let ingest_report = outcome.ingest.unwrap_or_default();
    let flushed = outcome.flush.clone().unwrap_or_default();
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
    if until_drained && outcome.stopped {
        tracing::warn!(
            pending,
            "stopped by a signal before the outbox was drained (--until-drained exits {EXIT_UNDRAINED})"
        );
    }
    Ok(RunReport {
        source: source_report,
        ingest: ingest_report,
        flush: outcome.flush,
        stopped: outcome.stopped,
        pending,
    })
}
