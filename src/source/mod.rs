/*!
Where advertisements come from. Every source implements [`Source`]: it sends what it
hears ([`Heard`]) into a bounded channel until it ends or is told to stop. Replay and
simulation are first-class sources beside BLE, not test hacks; [`from_settings`] builds
the one `[scanner]` names.
*/

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{ScannerSettings, SourceKind};
use crate::products::Products;
use crate::record::{Advertisement, Capture, EpochMillis};

pub mod ble;
pub mod replay;
pub mod sim;

/// A stream of advertisements.
pub trait Source: Send {
    /// Sends every advertisement to `out` until the source ends, `stop` is cancelled or
    /// `out` is closed. Returns what it did.
    fn run(
        self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<SourceReport, SourceError>> + Send;
}

/// One advertisement as a source sends it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heard {
    pub advert: Advertisement,
    /// The capture of the first product the advert matched, when the source matched it
    /// already (the BLE source filters early): the ingest stage takes it as it is
    /// instead of matching again. `None`: not matched yet (replay, simulation, a scan
    /// without a filter). Boxed, so that what travels the channel for every advert of
    /// a replay stays small (a move of it is then no `memcpy` call).
    pub capture: Option<Box<Capture>>,
}

impl From<Advertisement> for Heard {
    fn from(advert: Advertisement) -> Heard {
        Heard {
            advert,
            capture: None,
        }
    }
}

/// The source `[scanner]` names.
pub fn from_settings(scanner: &ScannerSettings) -> Configured {
    match scanner.source {
        SourceKind::Ble => Configured::Ble(ble::Ble::new(ble::BleSettings::from_scanner(scanner))),
        SourceKind::Replay => Configured::Replay(replay::Replay::new(
            scanner.replay_path.clone().unwrap_or_else(|| "-".into()),
        )),
        SourceKind::Sim => Configured::Sim(sim::Sim::new(scanner.sim.clone())),
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

/// What a live source has been through, shared with the pipeline, which keeps it in
/// the state database for `tapegate status` (the BLE liveness ladder's steps).
#[derive(Debug, Default)]
pub struct SourceHealth {
    /// Scans restarted (ladder step 1).
    pub restarts: AtomicU64,
    /// Adapters re-acquired with a new BlueZ connection (ladder step 2).
    pub reacquires: AtomicU64,
    /// Adverts dropped because the pipeline did not keep up with the radio.
    pub dropped: AtomicU64,
    /// Devices forgotten to bound memory (rotating MACs).
    pub forgotten: AtomicU64,
    /// Why the ladder last started, and when.
    pub last_trouble: Mutex<Option<(String, EpochMillis)>>,
    /// Where the BLE source reads adverts: `"mgmt"` (the kernel's management socket) or
    /// `"dbus"`; `None` before it started.
    pub adverts_path: Mutex<Option<&'static str>>,
    /// Advertising reports heard (every advert, before the products filter).
    pub reports: AtomicU64,
    /// Reports per second, as last measured by the health keeper.
    pub reports_per_sec: Mutex<Option<f64>>,
    /// Notified once the source is up (the BLE source: adapter found, discovery
    /// started), for READY.
    pub started: tokio::sync::Notify,
}

impl SourceHealth {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Where adverts are read now (see [`SourceHealth::adverts_path`]).
    pub fn set_adverts_path(&self, path: &'static str) {
        if let Ok(mut p) = self.adverts_path.lock() {
            *p = Some(path);
        }
    }

    pub fn adverts_path(&self) -> Option<&'static str> {
        self.adverts_path.lock().ok().and_then(|p| *p)
    }

    pub fn reports_per_sec(&self) -> Option<f64> {
        self.reports_per_sec.lock().ok().and_then(|r| *r)
    }

    pub fn trouble(&self, reason: &str) {
        if let Ok(mut t) = self.last_trouble.lock() {
            *t = Some((reason.to_string(), crate::clock::now_ms()));
        }
    }
}

impl SourceError {
    /// Whether the source cannot work on this machine as configured (no D-Bus, BlueZ
    /// absent, access denied, no adapter, no replay input): starting again will not
    /// help, unlike a scanner lost while running ([`SourceError::GaveUp`]).
    pub fn cannot_work_here(&self) -> bool {
        matches!(
            self,
            SourceError::Replay { .. }
                | SourceError::SystemBus(_)
                | SourceError::BluezNotRunning
                | SourceError::AccessDenied(_)
                | SourceError::NoAdapter { .. }
                | SourceError::Mgmt(_)
        )
    }
}

/// What a source did before it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceReport {
    /// Advertisements sent on.
    pub adverts: u64,
    /// Input that could not be read (malformed replay lines), each logged.
    pub malformed: u64,
}

/// Why a source could not run.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read replay input {path}: {source}")]
    Replay {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to the D-Bus system bus ({0}): is dbus running (`systemctl status dbus`)? DBUS_SYSTEM_BUS_ADDRESS, when set, must point at it")]
    SystemBus(String),
    #[error("BlueZ is not running: nothing owns org.bluez on the D-Bus system bus; start it with `systemctl start bluetooth` (and `systemctl enable bluetooth` so it starts at boot)")]
    BluezNotRunning,
    #[error("D-Bus denied access to BlueZ ({0}): run tapegate as root or as a user in the `bluetooth` group (`usermod -aG bluetooth USER`, or `SupplementaryGroups=bluetooth` in the systemd unit)")]
    AccessDenied(String),
    #[error("no Bluetooth adapter{}: BlueZ reports {}; check `bluetoothctl list`, `rfkill unblock bluetooth`, and that the adapter is plugged in (or set scanner.adapter)", .wanted.as_deref().map(|w| format!(" named {w:?}")).unwrap_or_default(), if .found.is_empty() { "none".to_string() } else { .found.join(", ") })]
    NoAdapter {
        /// `scanner.adapter`, if set.
        wanted: Option<String>,
        /// The adapters BlueZ has.
        found: Vec<String>,
    },
    #[error("BlueZ failed: {0}")]
    Bluez(String),
    #[error("scanner.adverts = \"mgmt\", but {0}; run tapegate with CAP_NET_ADMIN (the shipped unit grants it) on a kernel with Bluetooth, or set scanner.adverts = \"auto\"")]
    Mgmt(String),
    #[error("the BLE scanner could not be brought back for {secs} s after {reason}; exiting so that the service is restarted")]
    GaveUp { reason: String, secs: u64 },
}
