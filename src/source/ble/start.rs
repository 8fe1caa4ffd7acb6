//! The `ble` source as the pipeline sees it: [`Ble`], built from its settings, given the
//! products to filter by and the health to share, and run as a [`Source`]: the adapter
//! found, the path chosen, the scan started, the loop run, the scan stopped and what it
//! did reported. Touches the source's own rooms.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::bluez;
use super::devices::Devices;
use super::ladder::Ladder;
use super::mgmt;
use super::mgmt::wire::Pattern;
use super::passive;
use super::scanner::{Scanner, Stats};
use super::session::{connect, open, How};
use super::settings::{BleSettings, Filter};
use super::side::{Monitor, Side};
use crate::clock::SharedClock;
use crate::config::{AdvertsPath, ScanMode};
use crate::products::Products;
use crate::source::{Heard, Source, SourceError, SourceHealth, SourceReport};

/// The BLE source.
pub struct Ble {
    settings: BleSettings,
    filter: Option<Filter>,
    health: Arc<SourceHealth>,
    /// Stamps each advert heard.
    clock: SharedClock,
    /// The management socket the unit's start step stored, taken from systemd.
    stored: Option<OwnedFd>,
    /// A debug build's stand-in for the kernel's management socket.
    mgmt_peer: Option<PathBuf>,
    /// Where a passive scan's monitor is recorded (see `side.rs`).
    monitor_record: Option<PathBuf>,
}

impl Ble {
    pub fn new(settings: BleSettings, clock: SharedClock) -> Ble {
        Ble {
            settings,
            filter: None,
            health: Arc::default(),
            clock,
            stored: None,
            mgmt_peer: None,
            monitor_record: None,
        }
    }

    /// Reads management frames from `peer` instead of the kernel (a debug build's hook).
    pub fn with_mgmt_peer(mut self, peer: Option<PathBuf>) -> Ble {
        self.mgmt_peer = peer;
        self
    }

    /// Reads the side channel from `socket` (the one the unit's start step stored)
    /// rather than opening one.
    pub fn with_stored_socket(mut self, socket: Option<OwnedFd>) -> Ble {
        self.stored = socket;
        self
    }

    /// Records the handle of a passive scan's monitor in `path`, so that the next
    /// start removes one this process could not (killed) from the kernel.
    pub fn with_monitor_record(mut self, path: PathBuf) -> Ble {
        self.monitor_record = Some(path);
        self
    }

    /// Sends on the adverts that match no product too (without a capture), while the
    /// products still make a passive scan's monitor (`tapegate scan --all`).
    pub fn keeping_unmatched(mut self) -> Ble {
        if let Some(f) = &mut self.filter {
            f.keep_unmatched = true;
        }
        self
    }

    /// Shares the ladder's counts (for `tapegate status`).
    pub fn with_health(mut self, health: Arc<SourceHealth>) -> Ble {
        self.health = health;
        self
    }

    /// Sends on only the adverts that match one of `products` (and of each new set
    /// that `reload` delivers, when given), each with the capture that match built.
    pub fn with_filter(
        mut self,
        products: Products,
        reload: Option<watch::Receiver<Products>>,
    ) -> Ble {
        self.filter = Some(Filter {
            products,
            reload,
            keep_unmatched: false,
        });
        self
    }

    /// The side channel for `adapter`, as `scanner.adverts` asks; `None`: D-Bus.
    async fn side_channel(&mut self, adapter: &str) -> Result<Option<Side>, SourceError> {
        if self.settings.adverts == AdvertsPath::Dbus {
            if self.stored.take().is_some() {
                tracing::debug!("the management socket from the unit's start step is closed: adverts are read over D-Bus");
            }
            return Ok(None);
        }
        let origin = mgmt::Origin::choose(self.mgmt_peer.clone(), self.stored.take());
        match &origin {
            mgmt::Origin::Unix(path) => {
                tracing::warn!(path = %path.display(), "reading management frames from {} instead of the kernel", mgmt::SOCKET_ENV)
            }
            mgmt::Origin::Systemd(_) => {
                tracing::debug!("the kernel's management socket came from the unit's start step")
            }
            mgmt::Origin::Kernel => {}
        }
        let opened = match mgmt::index_of(adapter) {
            Ok(index) => {
                let reports = mgmt::Reports::new(index, self.settings.max_devices);
                mgmt::Channel::open(origin, reports)
                    .await
                    .map(|channel| Side {
                        channel,
                        index,
                        monitor: None,
                        record: self.monitor_record.clone(),
                        busy: false,
                        record_read: false,
                        maybe_left: None,
                    })
            }
            Err(e) => Err(e),
        };
        match opened {
            Ok(side) => Ok(Some(side)),
            Err(why) if self.settings.adverts == AdvertsPath::Mgmt => {
                Err(SourceError::Mgmt(why.to_string()))
            }
            Err(why) => {
                tracing::info!(reason = %why, "reading adverts over D-Bus: the kernel's management socket cannot be used here");
                Ok(None)
            }
        }
    }

    /// The passive scan's monitor patterns, when `scanner.scan` asks for a passive scan
    /// and it can be had (the side channel open, every product with a company
    /// identifier); `None`: discovery.
    fn passive_patterns(&self, side: &mut Option<Side>) -> Option<Vec<Pattern>> {
        let patterns = match (&*side, self.settings.scan) {
            (Some(_), ScanMode::Passive) => {
                let patterns = self
                    .filter
                    .as_ref()
                    .and_then(|f| passive::patterns(&f.products));
                if patterns.is_none() {
                    tracing::info!("scanning actively: passive scanning needs every product's company identifier");
                }
                patterns
            }
            (None, ScanMode::Passive) => {
                tracing::warn!("scanning actively: passive scanning needs the kernel's management socket (see above)");
                None
            }
            (_, ScanMode::Active) => None,
        };
        if let (Some(s), Some(_)) = (side.as_mut(), &patterns) {
            s.monitor = Some(Monitor::Missing);
            if let Some(version) = passive::kernel_version() {
                if passive::duplicate_filter_kept(&version) {
                    tracing::warn!(kernel = %version, "this kernel may keep the controller's duplicate filter on in passive scans (kernels before 5.14, and from 5.16 until 6.11, 6.10.5, 6.6.46, 6.1.105): a tape's changed data may go unheard until the scan restarts; use scanner.scan = \"active\" if captures stall");
                }
            }
        }
        patterns
    }
}

impl Source for Ble {
    async fn run(
        mut self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        let wanted = self.settings.adapter.clone();
        let (adapter_name, owner) =
            tokio::task::spawn_blocking(move || bluez::preflight(wanted.as_deref()))
                .await
                .map_err(|e| SourceError::Bluez(format!("preflight task failed: {e}")))??;
        let mut side = self.side_channel(&adapter_name).await?;
        let patterns = self.passive_patterns(&mut side);
        let how = How {
            subscribe: side.is_none(),
            discovery: patterns.is_none(),
        };
        let watcher = bluez::Watcher::new(adapter_name.clone());
        let mut manager = Some(
            connect()
                .await
                .map_err(|e| SourceError::Bluez(e.to_string()))?,
        );
        let (session, known) = open(manager.as_ref(), &adapter_name, how)
            .await
            .map_err(SourceError::Bluez)?;
        let path = if side.is_some() { "mgmt" } else { "dbus" };
        self.health.set_adverts_path(path);
        let mut scanner = Scanner {
            filter: self.filter,
            out,
            watcher,
            adapter_name,
            session: Some(session),
            side,
            patterns,
            devices: Devices::new(self.settings.max_devices),
            ladder: Ladder::new(
                self.settings.silence,
                self.settings.give_up,
                owner,
                Instant::now(),
                how.discovery,
            ),
            settings: self.settings,
            stats: Stats::default(),
            last_drop_log: None,
            health: self.health,
            clock: self.clock,
            next_read: None,
        };
        begin(&mut scanner, path).await;
        let result = if known.into_iter().all(|info| scanner.known(info)) {
            scanner.run(&mut manager, stop).await
        } else {
            Ok(())
        };
        scanner.stop_scan().await;
        report(&scanner, result)
    }
}

/// Starts a passive scan's monitor (discovery instead when the kernel refuses it), says
/// how the scan runs, and tells the pipeline the source is up.
async fn begin(scanner: &mut Scanner, path: &str) {
    if let Err(why) = scanner.start_monitor().await {
        // A kernel without advertisement monitors (before 5.10), or one that has no
        // room for another: discovery after all.
        scanner.fall_back_to_discovery(&why).await;
    }
    let scan = if scanner.patterns.is_some() {
        "passive"
    } else {
        "active"
    };
    tracing::info!(
        adapter = %scanner.adapter_name,
        adverts = %path,
        scan = %scan,
        "scanning for BLE advertisements"
    );
    // Read after the scan started: the ladder judges the scan by it.
    scanner.watcher.probe().await;
    scanner.health.started.notify_one();
}

/// Logs what the scan did, and the source's report of it.
fn report(scanner: &Scanner, result: Result<(), SourceError>) -> Result<SourceReport, SourceError> {
    let st = &scanner.stats;
    let side = scanner
        .side
        .as_ref()
        .map(|s| s.channel.counts())
        .unwrap_or_default();
    tracing::info!(
        adverts = st.adverts,
        reports = st.reports,
        not_matching = st.not_matching,
        dropped = st.dropped,
        restarts = st.restarts,
        reacquires = st.reacquires,
        forgotten = st.forgotten,
        malformed_frames = side.malformed,
        "BLE scan ended"
    );
    result.map(|()| SourceReport {
        adverts: st.adverts,
        malformed: side.malformed,
    })
}
