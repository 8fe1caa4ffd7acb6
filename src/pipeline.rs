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

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SourceKind};
use crate::ingest::{self, IngestReport, IngestSettings};
use crate::outbox::{Outbox, OutboxError, Store, StoreOptions};
use crate::source::replay::Replay;
use crate::source::sim::Sim;
use crate::source::{Source, SourceError, SourceReport};

/// Advertisements in flight between the source and the ingest stage.
const ADVERT_CHANNEL: usize = 4096;

/// How `run` behaves beyond the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Return once the source has ended and nothing deliverable is pending.
    pub until_drained: bool,
    /// Test hook: cap the database size (see [`StoreOptions::max_page_count`]).
    pub max_page_count: Option<u32>,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub source: SourceReport,
    pub ingest: IngestReport,
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("the {0} source is not available in this build")]
    SourceUnavailable(&'static str),
    #[error("a pipeline stage failed: {0}")]
    Stage(String),
}

/// Runs the daemon with `config` until `shutdown` resolves (or, with
/// `until_drained`, until the source has ended and nothing deliverable is pending).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
    options: RunOptions,
) -> Result<RunReport, RunError> {
    let state_dir = config.gateway.state_dir.clone();
    let store_options = StoreOptions {
        durability: config.outbox.durability,
        max_pending: config.outbox.max_pending,
        max_page_count: options.max_page_count,
    };
    let (store, opened) =
        tokio::task::spawn_blocking(move || Store::open(&state_dir, store_options))
            .await
            .map_err(|e| RunError::Stage(e.to_string()))??;
    if let Some(aside) = &opened.quarantined {
        tracing::error!(
            path = %opened.path.display(),
            moved_to = %aside.display(),
            reason = opened.quarantine_reason.as_deref().unwrap_or(""),
            "outbox database was corrupt: moved it aside and started a fresh one"
        );
    }
    tracing::info!(
        gateway = %config.gateway.id,
        path = %opened.path.display(),
        pending = opened.pending,
        "outbox open"
    );
    let (outbox, owner) = Outbox::start(store)
        .map_err(|e| RunError::Stage(format!("cannot start outbox thread: {e}")))?;

    if config.service.is_none() {
        tracing::warn!("no [service] configured: captures accumulate in the outbox until one is");
    }

    let stop_source = CancellationToken::new();
    let abandon = CancellationToken::new();
    let (adverts_tx, adverts_rx) = mpsc::channel(ADVERT_CHANNEL);
    let (committed_tx, _committed_rx) = watch::channel(0u64);

    let live = match config.scanner.source {
        SourceKind::Ble => true,
        SourceKind::Sim => config.scanner.sim.realtime,
        SourceKind::Replay => false,
    };
    let source = {
        let stop = stop_source.clone();
        let scanner = config.scanner.clone();
        tokio::spawn(async move {
            match scanner.source {
                SourceKind::Replay => {
                    let path = scanner.replay_path.unwrap_or_else(|| "-".into());
                    Replay::new(path)
                        .run(adverts_tx, stop)
                        .await
                        .map_err(RunError::from)
                }
                SourceKind::Sim => Sim::new(scanner.sim)
                    .run(adverts_tx, stop)
                    .await
                    .map_err(RunError::from),
                SourceKind::Ble => Err(RunError::SourceUnavailable("ble")),
            }
        })
    };
    let ingest = tokio::spawn(ingest::run(
        IngestSettings {
            products: config.products.clone(),
            dedup: config.dedup,
            commit_interval: config.outbox.commit_interval,
            live,
        },
        adverts_rx,
        outbox.clone(),
        committed_tx,
        abandon.clone(),
    ));

    // The source's result decides whether the run failed; stages behind it drain.
    let mut source = source;
    let mut source_result = None;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopping = false;
    if options.until_drained {
        tokio::select! {
            r = &mut source => source_result = Some(r),
            _ = &mut shutdown => stopping = true,
        }
    } else {
        tokio::select! {
            r = &mut source => {
                source_result = Some(r);
                if !matches!(source_result, Some(Ok(Ok(_)))) {
                    stopping = true;
                } else {
                    tracing::info!("source ended; running until stopped");
                    shutdown.as_mut().await;
                    stopping = true;
                }
            }
            _ = &mut shutdown => stopping = true,
        }
    }
    if stopping {
        tracing::info!("shutting down: stopping the source and committing what is held");
    }
    stop_source.cancel();

    let grace = config.gateway.shutdown_grace;
    let drained = async {
        let source_result = match source_result {
            Some(r) => r,
            None => source.await,
        };
        let ingest_report = ingest.await;
        (source_result, ingest_report)
    };
    let mut drained = std::pin::pin!(drained);
    let (source_result, ingest_report) = match tokio::time::timeout(grace, &mut drained).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "shutdown grace ran out; abandoning what cannot finish"
            );
            abandon.cancel();
            drained.await
        }
    };
    drop(outbox);
    // The owner thread closes the database (checkpointing the WAL) once every handle is gone.
    let _ = tokio::task::spawn_blocking(move || owner.join()).await;

    let ingest_report = ingest_report.map_err(|e| RunError::Stage(format!("ingest: {e}")))?;
    let source_report = source_result.map_err(|e| RunError::Stage(format!("source: {e}")))??;
    tracing::info!(
        adverts = ingest_report.adverts,
        unmatched = ingest_report.unmatched,
        deduplicated = ingest_report.deduplicated,
        accepted = ingest_report.accepted,
        evicted = ingest_report.evicted,
        malformed = source_report.malformed,
        "stopped"
    );
    Ok(RunReport {
        source: source_report,
        ingest: ingest_report,
    })
}
