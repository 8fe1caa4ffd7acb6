/*!
What the mock's account holds when it starts: devices in every status of spec section 3,
tags on two AWBs and two sensor assets for the latest-location read, a year of history
for two tapes, and labels on five tapes of the demo's simulated fleet. Deterministic:
the same content every start, with times counted back from an anchor (the hour boundary
before the one the mock started in), so "an hour ago" is an hour ago.

The seeded tapes' MACs start `D0:5E:ED`; QR codes are `TT` + the plain MAC, as the
decode answer's `qr_code`. The demo's fleet (its MACs given by the demo,
[`MockConfig::demo_fleet`](crate::MockConfig)) keeps its other tapes as the decode
registry says: its `C0:DE:AD` tapes are unknown until `device add`, the rest exist
NOT_ACTIVATED without a label (see `devices.rs`). It touches the devices, locations and
history types it fills.
*/

use std::time::SystemTime;

use super::devices::{fleet_qrcode, Device, DeviceStatus};
use super::history::{HistorySeed, Series};
use super::locations::{EventKind, LocationSeed, Place, TagEvent};
use super::mac;

/// The application id of the seeded labels (one of [`crate::APP_IDS`]).
pub const SEED_APP: &str = "demo-app";

/// A device in each status of spec section 3 (QR code, status); all but the
/// NOT_ACTIVATED one are labelled `ASSET-10NN`.
pub const STATUS_DEVICES: [(&str, DeviceStatus); 7] = [
    ("TTD05EED000001", DeviceStatus::NotActivated),
    ("TTD05EED000002", DeviceStatus::Activated),
    ("TTD05EED000003", DeviceStatus::Deactivated),
    ("TTD05EED000004", DeviceStatus::ForceActivated),
    ("TTD05EED000005", DeviceStatus::ActiveWithNoAlerts),
    ("TTD05EED000006", DeviceStatus::Rejected),
    ("TTD05EED000007", DeviceStatus::ReuseOrExpired),
];

/// The tape with a reading and a busy history (an event every 30 minutes).
pub const SENSOR_TAPE: &str = "TTD05EED000101";
/// Its asset barcode (sensor mode) and customer asset id (history).
pub const SENSOR_ASSET: &str = "ASSET-0001";
/// A tape whose latest event has no position: sensor mode answers `assets: []`.
pub const UNPLACED_TAPE: &str = "TTD05EED000102";
pub const UNPLACED_ASSET: &str = "ASSET-0002";
/// An AWB with four tags, two of which the latest-location read returns.
pub const AWB: &str = "020-12345675";
/// The tags of [`AWB`]: returned (latest event an air-cargo RCS), returned (latest
/// is an activation, so the one before counts; no label, so no `trk_asset_id`),
/// skipped (latest has lat 0), skipped (only an end of journey).
pub const AWB_TAGS: [&str; 4] = [
    "TTD05EED000201",
    "TTD05EED000202",
    "TTD05EED000203",
    "TTD05EED000204",
];
/// An AWB none of whose tags can be returned: 404 `AWB not found`.
pub const AWB_UNPLACED: &str = "020-99999990";
/// Indices (from 0) of the demo fleet tapes seeded with labels `DEMO-00NN` (TT-0011..
/// TT-0015: beyond the ten that the demo may leave unregistered).
pub const DEMO_LABELLED: std::ops::Range<usize> = 10..15;

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

const DUBAI: Place = Place {
    zone: "Asia/Dubai",
    offset_hours: 4,
    lat: 25.2532,
    lon: 55.3657,
    location_detailed: "Dubai",
    location: "DXB Cargo Village",
};
const SINGAPORE: Place = Place {
    zone: "Asia/Singapore",
    offset_hours: 8,
    lat: 1.3644,
    lon: 103.9915,
    location_detailed: "Pharma zone B",
    location: "SIN Changi Cargo",
};
const NOWHERE: Place = Place {
    lat: 0.0,
    ..SINGAPORE
};
/// A place with a position and a zone name but no facility.
const NO_FACILITY: Place = Place {
    location: "",
    ..DUBAI
};
const UNKNOWN_ZONE: Place = Place {
    zone: "Etc/UTC",
    offset_hours: 0,
    ..SINGAPORE
};

/// The seeded content.
pub(crate) struct Seed {
    pub(crate) devices: Vec<Device>,
    pub(crate) locations: LocationSeed,
    pub(crate) history: HistorySeed,
}

impl Seed {
    /// The account anchored at `now`, the tapes [`DEMO_LABELLED`] of `demo_fleet` (MACs
    /// in the order the demo's fleet has them) labelled.
    pub(crate) fn new(now: SystemTime, demo_fleet: &[String]) -> Self {
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let anchor = now.div_euclid(HOUR) * HOUR - HOUR;
        let mut b = Builder {
            anchor,
            devices: Vec::new(),
            locations: LocationSeed::default(),
        };
        b.status_devices();
        b.sensor_assets();
        b.awb_tags();
        b.unplaced_awb();
        b.demo_fleet(demo_fleet);
        Seed {
            devices: b.devices,
            locations: b.locations,
            history: history(anchor),
        }
    }
}

/// The seed being built: events are counted back from `anchor`.
struct Builder {
    anchor: i64,
    devices: Vec<Device>,
    locations: LocationSeed,
}

const NONE: [f64; 6] = [0.0; 6];

impl Builder {
    fn event(&mut self, qr: &str, kind: EventKind, ago: i64, place: Place, sensors: [f64; 6]) {
        self.locations
            .events
            .entry(qr.to_string())
            .or_default()
            .push(TagEvent {
                kind,
                at: self.anchor - ago,
                place,
                sensors,
            });
    }

    /// A device in each status of spec section 3.
    fn status_devices(&mut self) {
        for (i, (qr, status)) in STATUS_DEVICES.iter().enumerate() {
            let d = Device::new(qr, &qr[2..], *status);
            self.devices.push(if *status == DeviceStatus::NotActivated {
                d
            } else {
                d.labelled(&format!("ASSET-{}", 1001 + i), SEED_APP)
            });
        }
    }

    /// The two sensor assets: one with a current reading, one whose latest event has no
    /// position.
    fn sensor_assets(&mut self) {
        let cold = [4.2, 3.9, 0.0, 61.0, 101_325.0, 0.0];
        self.devices.push(
            Device::new(SENSOR_TAPE, &SENSOR_TAPE[2..], DeviceStatus::Activated)
                .labelled(SENSOR_ASSET, SEED_APP),
        );
        self.event(SENSOR_TAPE, EventKind::Activation, 30 * DAY, DUBAI, NONE);
        self.event(
            SENSOR_TAPE,
            EventKind::Location,
            2 * HOUR,
            DUBAI,
            [5.0, 4.6, 0.0, 58.0, 101_300.0, 0.0],
        );
        self.event(SENSOR_TAPE, EventKind::Location, HOUR, SINGAPORE, cold);
        // The newest event ends the journey and does not count.
        self.event(SENSOR_TAPE, EventKind::EndOfJourney, 0, SINGAPORE, NONE);
        self.devices.push(
            Device::new(UNPLACED_TAPE, &UNPLACED_TAPE[2..], DeviceStatus::Activated)
                .labelled(UNPLACED_ASSET, SEED_APP),
        );
        self.event(UNPLACED_TAPE, EventKind::Location, DAY, DUBAI, cold);
        self.event(UNPLACED_TAPE, EventKind::Location, HOUR, NOWHERE, cold);
    }

    /// The tags of [`AWB`], two of which the latest-location read returns.
    fn awb_tags(&mut self) {
        for (i, qr) in AWB_TAGS.iter().enumerate() {
            let mut d = Device::new(qr, &qr[2..], DeviceStatus::Activated);
            d.customer_asset_id = Some(AWB.to_string());
            // The second tag has no asset barcode: no label.
            self.devices.push(if i == 1 {
                d
            } else {
                d.labelled(&format!("AWB-TAG-{}", i + 1), SEED_APP)
            });
        }
        self.event(AWB_TAGS[0], EventKind::Activation, 3 * DAY, DUBAI, NONE);
        self.event(AWB_TAGS[0], EventKind::Location, 2 * DAY, DUBAI, NONE);
        self.event(AWB_TAGS[0], EventKind::AirCargo("RCS"), DAY, DUBAI, NONE);
        self.event(
            AWB_TAGS[1],
            EventKind::Location,
            30 * HOUR,
            UNKNOWN_ZONE,
            NONE,
        );
        self.event(AWB_TAGS[1], EventKind::Activation, HOUR, SINGAPORE, NONE);
        self.event(AWB_TAGS[2], EventKind::Location, 2 * DAY, DUBAI, NONE);
        self.event(AWB_TAGS[2], EventKind::Location, 2 * HOUR, NOWHERE, NONE);
        self.event(AWB_TAGS[3], EventKind::EndOfJourney, HOUR, DUBAI, NONE);
    }

    /// The tags of [`AWB_UNPLACED`], none of which can be returned.
    fn unplaced_awb(&mut self) {
        let unplaced_awb = ["TTD05EED000205", "TTD05EED000206"];
        for (qr, status) in unplaced_awb
            .iter()
            .zip([DeviceStatus::Activated, DeviceStatus::Deactivated])
        {
            let mut d =
                Device::new(qr, &qr[2..], status).labelled(&format!("AWB-{}", &qr[10..]), SEED_APP);
            d.customer_asset_id = Some(AWB_UNPLACED.to_string());
            self.devices.push(d);
        }
        self.event(
            unplaced_awb[0],
            EventKind::Location,
            HOUR,
            NO_FACILITY,
            NONE,
        );
        // Placed, but the tag is no longer active.
        self.event(unplaced_awb[1], EventKind::Location, HOUR, DUBAI, NONE);
    }

    /// Labels on the tapes [`DEMO_LABELLED`] of the demo's fleet.
    fn demo_fleet(&mut self, fleet: &[String]) {
        for (i, mac) in fleet
            .iter()
            .enumerate()
            .take(DEMO_LABELLED.end)
            .skip(DEMO_LABELLED.start)
        {
            let qr = fleet_qrcode(mac);
            self.devices.push(
                Device::new(&qr, &mac::key(mac), DeviceStatus::Activated)
                    .labelled(&format!("DEMO-{:04}", i + 1), SEED_APP),
            );
        }
    }
}

/// The two tapes with a year of history.
fn history(anchor: i64) -> HistorySeed {
    HistorySeed {
        anchor,
        series: vec![
            Series {
                qrcode: SENSOR_TAPE.to_string(),
                customer_asset_id: SENSOR_ASSET.to_string(),
                interval_secs: 30 * 60,
                sensors: vec!["ambient_temp", "humidity"],
            },
            Series {
                qrcode: UNPLACED_TAPE.to_string(),
                customer_asset_id: UNPLACED_ASSET.to_string(),
                interval_secs: 6 * HOUR,
                sensors: vec!["ambient_temp", "probe_temp", "shock"],
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-29T12:00:00Z: the seed's anchor is given, not read.
    fn at() -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_953_600)
    }

    #[test]
    fn the_seed_holds_a_device_in_every_status() {
        let seed = Seed::new(at(), &[]);
        for status in DeviceStatus::ALL {
            assert!(
                seed.devices.iter().any(|d| d.status == status),
                "{status:?}"
            );
        }
    }

    #[test]
    fn the_demo_fleets_tapes_eleven_to_fifteen_are_labelled() {
        let fleet: Vec<String> = (1..=20)
            .map(|i| format!("C0:FF:EE:00:00:{i:02X}"))
            .collect();
        let seed = Seed::new(at(), &fleet);
        let labelled: Vec<(&str, &str)> = seed
            .devices
            .iter()
            .filter_map(|d| Some((d.qrcode.as_str(), d.label.as_ref()?.asset_barcode.as_str())))
            .filter(|(_, a)| a.starts_with("DEMO-"))
            .collect();
        assert_eq!(
            labelled,
            [
                ("TTC0FFEE00000B", "DEMO-0011"),
                ("TTC0FFEE00000C", "DEMO-0012"),
                ("TTC0FFEE00000D", "DEMO-0013"),
                ("TTC0FFEE00000E", "DEMO-0014"),
                ("TTC0FFEE00000F", "DEMO-0015"),
            ]
        );
    }
}
