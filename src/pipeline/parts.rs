//! What the stages and the daemon's services share, made once before anything runs: the
//! handles every part reads or feeds (outbox, metrics, the tapes heard, health), SIGHUP's
//! channels to the running stages, and the tokens that order shutdown. Plain values: no
//! task is started here.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::dedup::DedupSettings;
use crate::flush::FlushControl;
use crate::health::Admission;
use crate::heard_now::HeardNow;
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::outbox::Handles;
use crate::pipeline::reload::FlushSetup;
use crate::products::Products;
use crate::source::SourceHealth;
use crate::util::debug_hooks::DebugHooks;
use crate::util::systemd::{Liveness, Notifier};

/// The handles the stages and services share.
pub(super) struct Parts {
    pub notifier: Notifier,
    /// Every stage's beat, for the watchdog and `/healthz`.
    pub liveness: Liveness,
    pub source_health: Arc<SourceHealth>,
    /// The outbox's handles: each stage and service is handed its own.
    pub outbox: Handles,
    pub metrics: Arc<Metrics>,
    /// What the daemon recorded of itself at start (for the reloader).
    pub inventory: Option<Inventory>,
    pub tapes_heard: Arc<HeardNow>,
    /// Whether captures can be committed (the ingest stage's word, and the state
    /// directory's file system).
    pub admission: Arc<Admission>,
    /// The daemon's clock, handed to every stage and service.
    pub clock: SharedClock,
    /// What a test asks of a debug build.
    pub hooks: DebugHooks,
}

impl Parts {
    /// Makes the shared handles over an open `outbox`, gathering and recording the
    /// inventory on the way.
    pub(super) async fn new(
        config: &Config,
        outbox: Handles,
        clock: SharedClock,
        hooks: DebugHooks,
    ) -> Parts {
        let metrics = Arc::new(Metrics::new());
        let started_at = clock.wall_ms();
        let inventory =
            super::open::record_inventory(config, &outbox.stages(), &metrics, started_at).await;
        Parts {
            notifier: Notifier::from_env(),
            liveness: Liveness::default(),
            source_health: Arc::new(SourceHealth::default()),
            outbox,
            metrics,
            inventory,
            tapes_heard: Arc::new(HeardNow::default()),
            admission: Arc::new(Admission::watching(&config.gateway.state_dir)),
            clock,
            hooks,
        }
    }
}

/// What SIGHUP changes at once: each stage gets its own part of a reloaded config
/// (receivers), and the reloader holds the senders.
pub(super) struct Reloads {
    pub products: watch::Sender<Products>,
    pub dedup: watch::Sender<DedupSettings>,
    /// A new client and settings for the delivery stage, which restarts with them.
    pub flush: mpsc::UnboundedSender<FlushSetup>,
}

/// The receiving ends of [`Reloads`].
pub(super) struct Reloaded {
    pub products: watch::Receiver<Products>,
    pub dedup: watch::Receiver<DedupSettings>,
    pub flush: mpsc::UnboundedReceiver<FlushSetup>,
}

/// SIGHUP's channels, starting from `config`.
pub(super) fn reload_channels(config: &Config) -> (Reloads, Reloaded) {
    let (flush_restarts, flush_setups) = mpsc::unbounded_channel();
    let (products_tx, products_rx) = watch::channel(config.products.clone());
    let (dedup_tx, dedup_rx) = watch::channel(config.dedup);
    (
        Reloads {
            products: products_tx,
            dedup: dedup_tx,
            flush: flush_restarts,
        },
        Reloaded {
            products: products_rx,
            dedup: dedup_rx,
            flush: flush_setups,
        },
    )
}

/// The tokens that order shutdown: only the source (and the flusher's new sends) are
/// told to stop; what cannot finish within the grace is abandoned.
#[derive(Default)]
pub(super) struct Stops {
    pub source: CancellationToken,
    pub flush: CancellationToken,
    /// Past the grace: what cannot finish is abandoned (it stays pending).
    pub abandon: CancellationToken,
}

impl Stops {
    /// What the delivery stage is told: wake on `committed`, stop and abandon with these
    /// tokens, and (`until_drained`) end once nothing deliverable is pending.
    pub(super) fn flush_control(
        &self,
        committed: watch::Receiver<u64>,
        until_drained: bool,
    ) -> FlushControl {
        FlushControl {
            committed,
            stop: self.flush.clone(),
            abandon: self.abandon.clone(),
            until_drained,
        }
    }
}
