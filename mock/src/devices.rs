/*!
The devices of the account (spec section 3): their statuses, labels and configuration,
and which exist: the seeded ones (`seed.rs`), the ones added with add-device, and every
QR code `TT<MAC>` whose MAC the decode registry knows (the simulated fleet), which
starts NOT_ACTIVATED with no label: spec 3 has ACTIVATED mean "labelled and linked to
the account", so a tape without a label is never ACTIVATED (its packets decode all the
same: the decode registry is the mock's own choice of what the service knows).

The calls that change them are files of their own (`parcel.rs` add-device, `labels.rs`
label, relabel and lookup, `deactivate.rs`, `configure.rs`), over the rules of a
multi-device body (`batch.rs`). This file touches only the config's registry, the MAC
helpers and the readings (the lookup's shape).
*/

use std::collections::HashMap;

use serde_json::{json, Value};

use super::config::{Registry, FW_VER};
use super::mac;
use super::readings::{LookupShape, Readings};

/// Devices per label, relabel and lookup request (spec section 8).
pub const MAX_LABEL_DEVICES: usize = 20;
/// Devices per deactivate and configure request (spec section 8).
pub const MAX_STATUS_DEVICES: usize = 100;

/// Per-device error codes (spec section 7).
pub const QRMAC_NOT_FOUND: &str = "QRMAC_NOT_FOUND";
pub const ALREADY_LABELLED: &str = "ALREADY_LABELLED";
pub const ALREADY_IN_TARGET_STATE: &str = "ALREADY_IN_TARGET_STATE";
pub const INVALID_TRANSITION: &str = "INVALID_TRANSITION";
pub const DEVICE_NOT_FOUND: &str = "DEVICE_NOT_FOUND";

/// Device status (spec section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceStatus {
    NotActivated,
    Activated,
    Deactivated,
    ForceActivated,
    ActiveWithNoAlerts,
    Rejected,
    ReuseOrExpired,
}

impl DeviceStatus {
    pub const ALL: [DeviceStatus; 7] = [
        DeviceStatus::NotActivated,
        DeviceStatus::Activated,
        DeviceStatus::Deactivated,
        DeviceStatus::ForceActivated,
        DeviceStatus::ActiveWithNoAlerts,
        DeviceStatus::Rejected,
        DeviceStatus::ReuseOrExpired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceStatus::NotActivated => "NOT_ACTIVATED",
            DeviceStatus::Activated => "ACTIVATED",
            DeviceStatus::Deactivated => "DEACTIVATED",
            DeviceStatus::ForceActivated => "FORCE_ACTIVATED",
            DeviceStatus::ActiveWithNoAlerts => "ACTIVE_WITH_NO_ALERTS",
            DeviceStatus::Rejected => "REJECTED",
            DeviceStatus::ReuseOrExpired => "REUSE_OR_EXPIRED",
        }
    }

    /// The statuses whose events are processed and that deactivate moves to DEACTIVATED.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            DeviceStatus::Activated
                | DeviceStatus::ForceActivated
                | DeviceStatus::ActiveWithNoAlerts
        )
    }
}

/// A label: the device's asset and application, and optionally one shipment (spec 2.4).
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub asset_barcode: String,
    pub application_id: String,
    pub shipment: Option<Value>,
}

/// A device of the account.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub qrcode: String,
    /// Plain form: 12 upper-case hex digits (or the UUID given as `tape_id`).
    pub mac: String,
    pub status: DeviceStatus,
    pub label: Option<Label>,
    pub firmware: String,
    pub metadata: Value,
    pub tape_displayname: Option<String>,
    /// `abc` of add-device: the AWB (or other customer asset id) the tape travels with.
    pub customer_asset_id: Option<String>,
}

impl Device {
    /// A device as the service holds it before any label or configuration.
    pub fn new(qrcode: &str, mac: &str, status: DeviceStatus) -> Self {
        Device {
            qrcode: qrcode.to_string(),
            mac: mac.to_string(),
            status,
            label: None,
            firmware: FW_VER.to_string(),
            metadata: json!({}),
            tape_displayname: None,
            customer_asset_id: None,
        }
    }

    pub fn labelled(mut self, asset_barcode: &str, application_id: &str) -> Self {
        self.label = Some(Label {
            asset_barcode: asset_barcode.to_string(),
            application_id: application_id.to_string(),
            shipment: None,
        });
        self
    }

    /// Linked to the account: NOT_ACTIVATED devices are registered but not linked, so
    /// the account's edit calls do not find them.
    fn linked(&self) -> bool {
        self.status != DeviceStatus::NotActivated
    }

    /// The lookup's entry of this device, named `qrcode` (as sent or normalised), in
    /// the shape the reading says.
    pub(crate) fn show(&self, qrcode: &str, shape: LookupShape) -> Value {
        let mut entry = json!({
            "qrcode": qrcode,
            "status": self.status.as_str(),
            "mac": self.mac,
            "firmware": self.firmware,
            "metadata": self.metadata,
            "tape_displayname": self.tape_displayname,
        });
        let label = |l: &Label| {
            json!({
                "asset_barcode": l.asset_barcode,
                "application_id": l.application_id,
                "shipment": l.shipment,
            })
        };
        match shape {
            LookupShape::Nested => entry["label"] = self.label.as_ref().map_or(Value::Null, label),
            LookupShape::Flat => {
                for k in ["asset_barcode", "application_id", "shipment"] {
                    entry[k] = self
                        .label
                        .as_ref()
                        .map_or(Value::Null, |l| label(l)[k].clone());
                }
            }
        }
        entry
    }
}

/// The QR code the simulated fleet's tape of this MAC (any form) carries (the decode
/// answer's `qr_code`).
pub fn fleet_qrcode(mac: &str) -> String {
    format!("TT{}", mac::key(mac))
}

/// The devices of the account, by QR code.
#[derive(Debug, Default)]
pub(crate) struct Devices {
    by_qr: HashMap<String, Device>,
}

impl Devices {
    pub(crate) fn insert(&mut self, device: Device) {
        self.by_qr.insert(device.qrcode.clone(), device);
    }

    pub(crate) fn get(&self, qr: &str, registry: &Registry) -> Option<Device> {
        self.by_qr
            .get(qr)
            .cloned()
            .or_else(|| self.fleet_device(qr, registry))
    }

    /// The device of `qr`, materialising a fleet tape on first touch.
    pub(crate) fn get_mut(&mut self, qr: &str, registry: &Registry) -> Option<&mut Device> {
        if !self.by_qr.contains_key(qr) {
            let device = self.fleet_device(qr, registry)?;
            self.insert(device);
        }
        self.by_qr.get_mut(qr)
    }

    /// The device of `qr` if it is linked to the account (what the edit calls see).
    pub(crate) fn linked_mut(&mut self, qr: &str, registry: &Registry) -> Option<&mut Device> {
        self.get_mut(qr, registry).filter(|d| d.linked())
    }

    /// A tape of the simulated fleet that the service decodes: `TT` + a registered MAC
    /// that no explicit device holds.
    fn fleet_device(&self, qr: &str, registry: &Registry) -> Option<Device> {
        let mac = qr.strip_prefix("TT")?;
        let plain = mac.len() == 12
            && mac
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_lowercase());
        if !plain || !registry.is_registered(mac) || self.holding_mac(mac).is_some() {
            return None;
        }
        Some(Device::new(qr, mac, DeviceStatus::NotActivated))
    }

    pub(crate) fn holding_mac(&self, mac: &str) -> Option<&Device> {
        self.by_qr.values().find(|d| d.mac == mac)
    }

    /// Deletes whatever holds the QR code `qr` or the MAC `mac` (an add's override
    /// deletes and recreates).
    pub(crate) fn remove_holding(&mut self, qr: &str, mac: &str) {
        self.by_qr.retain(|_, d| d.qrcode != qr && d.mac != mac);
    }

    /// Devices whose label carries `asset_barcode`.
    pub(crate) fn with_asset_barcode(&self, asset_barcode: &str) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .by_qr
            .values()
            .filter(|d| {
                d.label
                    .as_ref()
                    .is_some_and(|l| l.asset_barcode == asset_barcode)
            })
            .collect();
        v.sort_by(|a, b| a.qrcode.cmp(&b.qrcode));
        v
    }

    /// Active devices travelling with the AWB `awb`.
    pub(crate) fn on_awb(&self, awb: &str) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .by_qr
            .values()
            .filter(|d| d.status.is_active() && d.customer_asset_id.as_deref() == Some(awb))
            .collect();
        v.sort_by(|a, b| a.qrcode.cmp(&b.qrcode));
        v
    }
}

/// What the device calls work on: the account's devices, the decode registry (which
/// tapes exist; an add makes its tape decodable) and the readings played.
pub(crate) struct Account<'a> {
    pub devices: &'a mut Devices,
    pub registry: &'a mut Registry,
    pub readings: Readings,
}
