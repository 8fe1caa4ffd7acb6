//! What the `ble` source is given: its part of `[scanner]`, the products an advert must
//! match, and the pace it reads at. Touches the config and the product table only.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::{AdvertsPath, ScanMode, ScannerSettings};
use crate::products::Products;
use crate::record::{Advertisement, Capture};

/// Reads of the path (D-Bus messages, management frames) at most per turn before the
/// source looks at its other inputs again (stop, the watcher, the ladder's deadline).
pub(super) const EVENTS_PER_TURN: usize = 256;
/// While adverts flow, the path is read at most this often (see the module doc).
pub const READ_EVERY: Duration = Duration::from_millis(100);
/// How long stopping waits for BlueZ to stop the scan.
pub(super) const STOP_SCAN_WAIT: Duration = Duration::from_secs(2);
/// Drops are logged at most this often.
pub(super) const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// What the `ble` source needs from `[scanner]`.
#[derive(Debug, Clone)]
pub struct BleSettings {
    /// `hci0`; `None`: the first adapter.
    pub adapter: Option<String>,
    /// `None`: silence never restarts the scan.
    pub silence: Option<Duration>,
    pub give_up: Duration,
    pub max_devices: usize,
    pub adverts: AdvertsPath,
    pub scan: ScanMode,
}

impl BleSettings {
    pub fn from_scanner(s: &ScannerSettings) -> BleSettings {
        BleSettings {
            adapter: s.adapter.clone(),
            silence: s.silence,
            give_up: s.give_up,
            max_devices: s.max_devices.max(1),
            adverts: s.adverts,
            scan: s.scan,
        }
    }
}

/// The products an advert must match to be sent on.
pub(super) struct Filter {
    pub(super) products: Products,
    pub(super) reload: Option<watch::Receiver<Products>>,
    /// Adverts matching no product are sent on too (without a capture).
    pub(super) keep_unmatched: bool,
}

impl Filter {
    /// The capture of `adv` under the first product it matches, `None` if it matches none.
    pub(super) fn capture(&mut self, adv: &Advertisement) -> Option<Capture> {
        if let Some(r) = &mut self.reload {
            if r.has_changed().unwrap_or(false) {
                self.products = r.borrow_and_update().clone();
            }
        }
        self.products.capture(adv)
    }
}
