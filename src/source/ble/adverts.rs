//! What an advert does once read: a device remembered (D-Bus path) and its advert
//! completed, matched against the products, sent on or dropped and counted when the
//! pipeline cannot keep up. Touches the scanner's devices, filter and channel out.

use bluez_async::DeviceId;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::devices::Device;
use super::scanner::Scanner;
use super::session::device_id;
use super::settings::DROP_LOG_EVERY;
use super::signals::Change;
use crate::record::{Advertisement, Mac};
use crate::source::{Heard, SourceHealth};

impl Scanner {
    /// Handles a device BlueZ knew when the scan started; `false` once nobody reads
    /// the adverts any more.
    pub(super) fn known(&mut self, info: bluez_async::DeviceInfo) -> bool {
        let device = Device::from_info(info);
        let (mac, heard) = (device.mac(), device.heard());
        self.remember(device);
        if !heard {
            return true;
        }
        let now = Instant::now();
        self.ladder.heard(now);
        self.send_device(mac, now)
    }

    /// Handles one change of a device; `Some(heard)`, or `None` once nobody reads the
    /// adverts any more.
    pub(super) async fn change(&mut self, change: Change) -> Option<bool> {
        let now = Instant::now();
        let mac = match change {
            Change::Removed { mac } => {
                // BlueZ forgot it (30 s unseen): its next advert is a new object.
                self.devices.forget(&mac);
                return Some(false);
            }
            Change::Added { mac, props } => {
                // Its properties are all in the signal: nothing to read from BlueZ.
                let heard = props.rssi.is_some();
                self.remember(Device::from_props(mac, props));
                if !heard {
                    return Some(false);
                }
                mac
            }
            Change::Changed { mac, props } => {
                let advert = props.is_advert();
                if !self.device(&mac).await {
                    return Some(false);
                }
                if let Some(d) = self.devices.get_mut(&mac) {
                    d.apply(props);
                }
                if !advert {
                    return Some(false);
                }
                mac
            }
        };
        self.send_device(mac, now).then_some(true)
    }

    /// Sends on the advert of a remembered device; `false` once nobody reads them.
    fn send_device(&mut self, mac: Mac, now: Instant) -> bool {
        match self.devices.get(&mac) {
            Some(d) => {
                let advert = d.advert(self.clock.wall_ms());
                self.emit(advert, now)
            }
            None => true,
        }
    }

    /// Sends on one advert heard at `now` if it matches a product; `false` once nobody
    /// reads the adverts any more.
    pub(super) fn emit(&mut self, advert: Advertisement, now: Instant) -> bool {
        self.stats.reports += 1;
        SourceHealth::count(&self.health.reports);
        let capture = match &mut self.filter {
            Some(f) => match f.capture(&advert) {
                Some(capture) => Some(Box::new(capture)),
                None => {
                    self.stats.not_matching += 1;
                    if !f.keep_unmatched {
                        return true;
                    }
                    None
                }
            },
            None => None,
        };
        match self.out.try_send(Heard { advert, capture }) {
            Ok(()) => self.stats.adverts += 1,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.dropped += 1;
                SourceHealth::count(&self.health.dropped);
                if self
                    .last_drop_log
                    .is_none_or(|t| now.duration_since(t) >= DROP_LOG_EVERY)
                {
                    tracing::warn!(
                        dropped = self.stats.dropped - self.stats.dropped_logged,
                        "adverts dropped: the pipeline is not keeping up with the radio"
                    );
                    self.stats.dropped_logged = self.stats.dropped;
                    self.last_drop_log = Some(now);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
        }
        true
    }

    /// Makes sure `mac` is remembered (reading its properties from BlueZ if not);
    /// `false` if it cannot be.
    async fn device(&mut self, mac: &Mac) -> bool {
        if self.devices.get(mac).is_some() {
            return true;
        }
        let Some(adapter) = self.adapter() else {
            return false;
        };
        let id = device_id(&self.adapter_name, mac);
        let Ok(id) = id.parse::<DeviceId>() else {
            return false;
        };
        match adapter.session.get_device_info(&id).await {
            Ok(info) => {
                self.remember(Device::from_info(info));
                true
            }
            Err(e) => {
                tracing::debug!(device = %id, error = %e, "cannot read a device's properties");
                false
            }
        }
    }

    /// Remembers a device; the one forgotten to make room is removed from BlueZ too.
    fn remember(&mut self, device: Device) {
        if let Some(old) = self.devices.remember(device) {
            self.stats.forgotten += 1;
            SourceHealth::count(&self.health.forgotten);
            self.watcher.remove(&device_id(&self.adapter_name, &old));
        }
    }
}
