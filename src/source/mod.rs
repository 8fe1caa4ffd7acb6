/*!
Where advertisements come from. Every source implements [`Source`]: it sends
advertisements into a bounded channel until it ends or is told to stop. Replay and
simulation are first-class sources beside BLE, not test hacks.
*/

use std::future::Future;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::record::{Advertisement, EpochMillis};

pub mod ble;
pub mod replay;
pub mod sim;

/// A stream of advertisements.
pub trait Source: Send {
    /// Sends every advertisement to `out` until the source ends, `stop` is cancelled or
    /// `out` is closed. Returns what it did.
    fn run(
        self,
        out: mpsc::Sender<Advertisement>,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<SourceReport, SourceError>> + Send;
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
}

impl SourceHealth {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn trouble(&self, reason: &str) {
        if let Ok(mut t) = self.last_trouble.lock() {
            *t = Some((reason.to_string(), crate::clock::now_ms()));
        }
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
    #[error("the BLE scanner could not be brought back for {secs} s after {reason}; exiting so that the service is restarted")]
    GaveUp { reason: String, secs: u64 },
}
