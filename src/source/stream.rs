//! What every source is: a [`Source`] sends what it hears ([`Heard`]) into a bounded
//! channel until it ends or is told to stop, then says what it did ([`SourceReport`]) or
//! why it could not ([`SourceError`]). Touches only the domain's records.

use std::future::Future;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::record::{Advertisement, Capture};

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
