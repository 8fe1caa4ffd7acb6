//! The one source `[scanner]` names, built by [`from_settings`] and run as a [`Source`]
//! whatever it is. Touches the config, the clock it hands them and the three sources.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{ble, replay, sim};
use super::{Heard, Source, SourceError, SourceHealth, SourceReport};
use crate::clock::SharedClock;
use crate::config::{ScannerSettings, SourceKind};
use crate::products::Products;
use crate::util::debug_hooks::DebugHooks;

/// The source `[scanner]` names, reading the time from `clock`.
pub fn from_settings(scanner: &ScannerSettings, clock: SharedClock) -> Configured {
    match scanner.source {
        SourceKind::Ble => Configured::Ble(ble::Ble::new(
            ble::BleSettings::from_scanner(scanner),
            clock,
        )),
        SourceKind::Replay => Configured::Replay(replay::Replay::new(
            scanner.replay_path.clone().unwrap_or_else(|| "-".into()),
            clock,
        )),
        SourceKind::Sim => Configured::Sim(sim::Sim::new(scanner.sim.clone(), clock)),
    }
}

/// One of the sources, as [`from_settings`] builds it.
pub enum Configured {
    Ble(ble::Ble),
    Replay(replay::Replay),
    Sim(sim::Sim),
}

impl Configured {
    /// Whether the source hears the radio as it happens (the BLE source, a simulation in
    /// real time), so that held captures are released on the wall clock rather than
    /// only on the capture times seen.
    pub fn is_live(&self) -> bool {
        match self {
            Configured::Ble(_) => true,
            Configured::Replay(_) => false,
            Configured::Sim(s) => s.settings.realtime,
        }
    }

    /// Lets a source that can drop early what matches none of `products` (and of each
    /// new set `reload` delivers) do so, sending on the captures it built (the BLE
    /// source); the others leave matching to the ingest stage.
    pub fn with_filter(
        self,
        products: Products,
        reload: Option<watch::Receiver<Products>>,
    ) -> Configured {
        match self {
            Configured::Ble(b) => Configured::Ble(b.with_filter(products, reload)),
            other => other,
        }
    }

    /// Applies a debug build's hooks (the BLE source's stand-in for the kernel).
    pub fn with_debug_hooks(self, hooks: &DebugHooks) -> Configured {
        match self {
            Configured::Ble(b) => Configured::Ble(b.with_mgmt_peer(hooks.mgmt_socket.clone())),
            other => other,
        }
    }

    /// Hands the BLE source the management socket the unit's start step stored; any
    /// other source closes it (taken from systemd's store all the same: a socket left
    /// there would refuse the next start step's).
    pub fn with_stored_socket(self, socket: Option<OwnedFd>) -> Configured {
        match self {
            Configured::Ble(b) => Configured::Ble(b.with_stored_socket(socket)),
            other => {
                if socket.is_some() {
                    tracing::debug!("the management socket from the unit's start step is closed: the source is not BLE");
                }
                other
            }
        }
    }

    /// Lets the BLE source record its passive scan's monitor in `state_dir`.
    pub fn with_state_dir(self, state_dir: &Path) -> Configured {
        match self {
            Configured::Ble(b) => {
                Configured::Ble(b.with_monitor_record(state_dir.join("ble-monitor")))
            }
            other => other,
        }
    }

    /// Lets a source that filters by products send on what matches none too (the BLE
    /// source, whose passive scan still needs the products).
    pub fn keeping_unmatched(self) -> Configured {
        match self {
            Configured::Ble(b) => Configured::Ble(b.keeping_unmatched()),
            other => other,
        }
    }

    /// Whether the source says when it is up through [`SourceHealth::started`] (BLE,
    /// once discovery has started); the others are up as soon as they run.
    pub fn announces_start(&self) -> bool {
        matches!(self, Configured::Ble(_))
    }

    /// Shares what a live source goes through (the BLE ladder's counts) with `health`.
    pub fn with_health(self, health: Arc<SourceHealth>) -> Configured {
        match self {
            Configured::Ble(b) => Configured::Ble(b.with_health(health)),
            other => other,
        }
    }
}

impl Source for Configured {
    async fn run(
        self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        match self {
            Configured::Ble(s) => s.run(out, stop).await,
            Configured::Replay(s) => s.run(out, stop).await,
            Configured::Sim(s) => s.run(out, stop).await,
        }
    }
}
