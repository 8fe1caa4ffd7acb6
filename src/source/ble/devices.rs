/*!
What the BLE source remembers of each device between its adverts, bounded.
Memory only: it touches the records.

BlueZ gives a device's properties once (when it is discovered) and then only what
changed (`PropertiesChanged`), so each advert is completed from what is remembered of
the device, keyed by its MAC (the adapter's device objects are named by it). At most
`scanner.max_devices` devices are remembered; remembering one more forgets the least
recently heard, and the source asks BlueZ to forget it too (`Adapter1.RemoveDevice`),
so rotating MACs cannot grow either side.
*/

use std::collections::HashMap;

use bluez_async::DeviceInfo;
use hashlink::LruCache;

use super::signals::Props;
use crate::record::{Advertisement, EpochMillis, Mac};

/// What is remembered of a device between its adverts.
pub(super) struct Device {
    mac: Mac,
    name: Option<String>,
    rssi: Option<i16>,
    manufacturer_data: Vec<(u16, Vec<u8>)>,
    service_data: Vec<(String, Vec<u8>)>,
}

impl Device {
    pub fn from_info(info: DeviceInfo) -> Device {
        Device {
            mac: Mac::new(info.mac_address.into()),
            name: info.name,
            rssi: info.rssi,
            manufacturer_data: manufacturer_data(info.manufacturer_data),
            service_data: service_data(info.service_data),
        }
    }

    /// A device as a signal describes it whole (a new device object).
    pub fn from_props(mac: Mac, props: Props) -> Device {
        Device {
            mac,
            name: props.name,
            rssi: props.rssi,
            manufacturer_data: props.manufacturer_data.unwrap_or_default(),
            service_data: props.service_data.unwrap_or_default(),
        }
    }

    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// Takes what a signal changed.
    pub fn apply(&mut self, props: Props) {
        if let Some(r) = props.rssi {
            self.rssi = Some(r);
        }
        if props.name.is_some() {
            self.name = props.name;
        }
        if let Some(d) = props.manufacturer_data {
            self.manufacturer_data = d;
        }
        if let Some(d) = props.service_data {
            self.service_data = d;
        }
    }

    /// Whether the device was heard in this scan. A device BlueZ remembers but has not
    /// heard (paired, or cached from before) has no RSSI: its data is old, not an advert.
    pub fn heard(&self) -> bool {
        self.rssi.is_some()
    }

    /// The device's advert as remembered, heard at `ts_ms`.
    pub fn advert(&self, ts_ms: EpochMillis) -> Advertisement {
        Advertisement {
            ts_ms,
            mac: self.mac,
            rssi: self.rssi,
            name: self.name.clone(),
            manufacturer_data: self.manufacturer_data.clone(),
            service_data: self.service_data.clone(),
        }
    }
}

/// BlueZ's map in a stable order (by company identifier), so that equal data gives
/// equal adverts.
fn manufacturer_data(data: HashMap<u16, Vec<u8>>) -> Vec<(u16, Vec<u8>)> {
    sorted(data.into_iter().collect())
}

/// BlueZ's map by UUID (written lower case, 128-bit) in a stable order.
fn service_data<U: ToString>(data: HashMap<U, Vec<u8>>) -> Vec<(String, Vec<u8>)> {
    sorted(data.into_iter().map(|(u, v)| (u.to_string(), v)).collect())
}

fn sorted<K: Ord, V>(mut v: Vec<(K, V)>) -> Vec<(K, V)> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The remembered devices, least recently heard first out.
pub(super) struct Devices {
    known: LruCache<Mac, Device>,
    max: usize,
}

impl Devices {
    /// Remembers at most `max` devices (at least one).
    pub fn new(max: usize) -> Devices {
        Devices {
            known: LruCache::new_unbounded(),
            max: max.max(1),
        }
    }

    /// The device, marked as the most recently heard.
    pub fn get(&mut self, mac: &Mac) -> Option<&Device> {
        self.known.get(mac)
    }

    /// The device, marked as the most recently heard.
    pub fn get_mut(&mut self, mac: &Mac) -> Option<&mut Device> {
        self.known.get_mut(mac)
    }

    pub fn forget(&mut self, mac: &Mac) {
        self.known.remove(mac);
    }

    /// Forgets every device (a new BlueZ session names them afresh).
    pub fn clear(&mut self) {
        self.known.clear();
    }

    /// Remembers a device (replacing what was remembered of it); returns the least
    /// recently heard device forgotten to make room, for the caller to remove from
    /// BlueZ.
    pub fn remember(&mut self, device: Device) -> Option<Mac> {
        self.known.remove(&device.mac);
        // Only this inserts, so there is never more than `max`: one out makes room.
        let forgotten = if self.known.len() >= self.max {
            self.known.remove_lru().map(|(mac, _)| mac)
        } else {
            None
        };
        self.known.insert(device.mac, device);
        forgotten
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.known.len()
    }
}

#[cfg(test)]
mod tests {
    use bluez_async::{uuid_from_u16, AddressType, MacAddress};

    use super::*;

    fn id(n: u8) -> Mac {
        Mac::new([0xC0, 0xFF, 0xEE, 0, 0, n])
    }

    fn info(n: u8, rssi: Option<i16>) -> Device {
        Device::from_info(DeviceInfo {
            id: format!("hci0/dev_C0_FF_EE_00_00_{n:02X}").parse().unwrap(),
            mac_address: MacAddress::from([0xC0, 0xFF, 0xEE, 0, 0, n]),
            address_type: AddressType::Random,
            name: Some(format!("TT-{n}")),
            appearance: None,
            services: vec![],
            paired: false,
            connected: false,
            rssi,
            tx_power: None,
            manufacturer_data: HashMap::from([(0x0EF7, vec![n]), (0x004C, vec![2])]),
            service_data: HashMap::new(),
            services_resolved: false,
            alias: None,
            class: None,
            bonded: false,
            icon: None,
            trusted: false,
            blocked: false,
            legacy_pairing: false,
            modalias: None,
            wake_allowed: false,
        })
    }

    #[test]
    fn past_max_devices_the_least_recently_heard_is_forgotten() {
        let mut devices = Devices::new(2);
        assert_eq!(devices.remember(info(1, Some(-60))), None);
        assert_eq!(devices.remember(info(2, Some(-60))), None);
        // Hearing 1 again makes 2 the least recently heard.
        assert!(devices.get(&id(1)).is_some());
        assert_eq!(devices.remember(info(3, Some(-60))), Some(id(2)));
        assert_eq!(devices.len(), 2);
        assert!(devices.get(&id(2)).is_none());
        // Remembering a known device again forgets nobody.
        assert_eq!(devices.remember(info(1, Some(-50))), None);
        assert_eq!(devices.len(), 2);
    }

    #[test]
    fn an_advert_is_completed_from_what_is_remembered() {
        let mut devices = Devices::new(8);
        devices.remember(info(1, None));
        let d = devices.get_mut(&id(1)).unwrap();
        assert!(!d.heard(), "no RSSI: not heard in this scan");
        d.apply(Props {
            rssi: Some(-61),
            service_data: Some(vec![(uuid_from_u16(0xFEAA).to_string(), vec![0x10])]),
            ..Props::default()
        });
        let adv = d.advert(1_763_719_200_125);
        assert!(d.heard());
        assert_eq!(
            adv,
            Advertisement {
                ts_ms: 1_763_719_200_125,
                mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]),
                rssi: Some(-61),
                name: Some("TT-1".into()),
                // In company order, whatever BlueZ's map order.
                manufacturer_data: vec![(0x004C, vec![2]), (0x0EF7, vec![1])],
                service_data: vec![("0000feaa-0000-1000-8000-00805f9b34fb".into(), vec![0x10])],
            }
        );
    }

    #[test]
    fn a_new_session_forgets_every_device() {
        let mut devices = Devices::new(8);
        devices.remember(info(1, Some(-60)));
        devices.forget(&id(1));
        assert!(devices.get(&id(1)).is_none());
        devices.remember(info(2, Some(-60)));
        devices.clear();
        assert_eq!(devices.len(), 0);
    }
}
