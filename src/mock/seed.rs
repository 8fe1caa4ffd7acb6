/*!
What the mock's account holds when it starts: devices in every status of spec section 3,
tags on two AWBs and two sensor assets for the latest-location read, a year of history
for two tapes, and labels on five tapes of the demo's simulated fleet. Deterministic:
the same content every start, with times counted back from an anchor (the hour boundary
before the one the mock started in), so "an hour ago" is an hour ago.

The seeded tapes' MACs start `D0:5E:ED`; QR codes are `TT` + the plain MAC, as the
decode answer's `qr_code`. The demo's fleet (sim seed 1) keeps its other tapes as the
decode registry says: its `C0:DE:AD` tapes are unknown until `device add`, the rest
exist ACTIVATED without a label (see `devices.rs`).
*/

use std::time::SystemTime;

use super::devices::{fleet_qrcode, Device, DeviceStatus};
use super::history::{HistorySeed, Series};
use super::locations::{EventKind, LocationSeed, Place, TagEvent};
use crate::source::sim::{Sim, SimSettings};

/// The application id of the seeded labels (one of [`super::APP_IDS`]).
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
/// Seed of the demo's simulated fleet (the default `sim_seed`).
pub const DEMO_SIM_SEED: u64 = 1;
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
pub(super) struct Seed {
    pub(super) devices: Vec<Device>,
    pub(super) locations: LocationSeed,
    pub(super) history: HistorySeed,
}

impl Seed {
    pub(super) fn new(now: SystemTime) -> Self {
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let anchor = now.div_euclid(HOUR) * HOUR - HOUR;
        let mut devices = Vec::new();
        let mut locations = LocationSeed::default();
        let mut event = |qr: &str, kind, ago: i64, place, sensors| {
            locations
                .events
                .entry(qr.to_string())
                .or_default()
                .push(TagEvent {
                    kind,
                    at: anchor - ago,
                    place,
                    sensors,
                });
        };

        for (i, (qr, status)) in STATUS_DEVICES.iter().enumerate() {
            let d = Device::new(qr, &qr[2..], *status);
            devices.push(if *status == DeviceStatus::NotActivated {
                d
            } else {
                d.labelled(&format!("ASSET-{}", 1001 + i), SEED_APP)
            });
        }

        let cold = [4.2, 3.9, 0.0, 61.0, 101_325.0, 0.0];
        devices.push(
            Device::new(SENSOR_TAPE, &SENSOR_TAPE[2..], DeviceStatus::Activated)
                .labelled(SENSOR_ASSET, SEED_APP),
        );
        event(
            SENSOR_TAPE,
            EventKind::Activation,
            30 * DAY,
            DUBAI,
            [0.0; 6],
        );
        event(
            SENSOR_TAPE,
            EventKind::Location,
            2 * HOUR,
            DUBAI,
            [5.0, 4.6, 0.0, 58.0, 101_300.0, 0.0],
        );
        event(SENSOR_TAPE, EventKind::Location, HOUR, SINGAPORE, cold);
        // The newest event ends the journey and does not count.
        event(SENSOR_TAPE, EventKind::EndOfJourney, 0, SINGAPORE, [0.0; 6]);
        devices.push(
            Device::new(UNPLACED_TAPE, &UNPLACED_TAPE[2..], DeviceStatus::Activated)
                .labelled(UNPLACED_ASSET, SEED_APP),
        );
        event(UNPLACED_TAPE, EventKind::Location, DAY, DUBAI, cold);
        event(UNPLACED_TAPE, EventKind::Location, HOUR, NOWHERE, cold);

        for (i, qr) in AWB_TAGS.iter().enumerate() {
            let mut d = Device::new(qr, &qr[2..], DeviceStatus::Activated);
            d.customer_asset_id = Some(AWB.to_string());
            // The second tag has no asset barcode: no label.
            devices.push(if i == 1 {
                d
            } else {
                d.labelled(&format!("AWB-TAG-{}", i + 1), SEED_APP)
            });
        }
        let none = [0.0; 6];
        event(AWB_TAGS[0], EventKind::Activation, 3 * DAY, DUBAI, none);
        event(AWB_TAGS[0], EventKind::Location, 2 * DAY, DUBAI, none);
        event(AWB_TAGS[0], EventKind::AirCargo("RCS"), DAY, DUBAI, none);
        event(
            AWB_TAGS[1],
            EventKind::Location,
            30 * HOUR,
            UNKNOWN_ZONE,
            none,
        );
        event(AWB_TAGS[1], EventKind::Activation, HOUR, SINGAPORE, none);
        event(AWB_TAGS[2], EventKind::Location, 2 * DAY, DUBAI, none);
        event(AWB_TAGS[2], EventKind::Location, 2 * HOUR, NOWHERE, none);
        event(AWB_TAGS[3], EventKind::EndOfJourney, HOUR, DUBAI, none);

        let unplaced_awb = ["TTD05EED000205", "TTD05EED000206"];
        for (qr, status) in unplaced_awb
            .iter()
            .zip([DeviceStatus::Activated, DeviceStatus::Deactivated])
        {
            let mut d =
                Device::new(qr, &qr[2..], status).labelled(&format!("AWB-{}", &qr[10..]), SEED_APP);
            d.customer_asset_id = Some(AWB_UNPLACED.to_string());
            devices.push(d);
        }
        event(
            unplaced_awb[0],
            EventKind::Location,
            HOUR,
            NO_FACILITY,
            none,
        );
        // Placed, but the tag is no longer active.
        event(unplaced_awb[1], EventKind::Location, HOUR, DUBAI, none);

        for (i, mac) in demo_fleet()
            .into_iter()
            .enumerate()
            .skip(DEMO_LABELLED.start)
        {
            let qr = fleet_qrcode(&mac);
            devices.push(
                Device::new(&qr, &mac.plain(), DeviceStatus::Activated)
                    .labelled(&format!("DEMO-{:04}", i + 1), SEED_APP),
            );
        }

        let history = HistorySeed {
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
        };
        Seed {
            devices,
            locations,
            history,
        }
    }
}

/// The first tapes of the demo's fleet, up to the last labelled one.
fn demo_fleet() -> Vec<crate::record::Mac> {
    Sim::fleet(&SimSettings {
        tapes: DEMO_LABELLED.end,
        interval_ms: 1000,
        change_every: 1,
        unregistered: 0,
        others_ratio: 0.0,
        seed: DEMO_SIM_SEED,
        duration_ms: None,
        realtime: false,
        start_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::DEFAULTS;

    #[test]
    fn the_seed_holds_a_device_in_every_status() {
        let seed = Seed::new(SystemTime::now());
        for status in DeviceStatus::ALL {
            assert!(
                seed.devices.iter().any(|d| d.status == status),
                "{status:?}"
            );
        }
    }

    #[test]
    fn the_labelled_demo_tapes_are_tapes_of_the_demo_fleet_whatever_it_leaves_unregistered() {
        assert_eq!(DEFAULTS.scanner.sim_seed, DEMO_SIM_SEED);
        let fleet = Sim::fleet(&SimSettings {
            tapes: 200,
            interval_ms: 1000,
            change_every: 3,
            unregistered: 10,
            others_ratio: 0.3,
            seed: DEMO_SIM_SEED,
            duration_ms: None,
            realtime: true,
            start_ms: 0,
        });
        let seeded = demo_fleet();
        for i in DEMO_LABELLED {
            assert_eq!(fleet[i], seeded[i], "tape {i}");
        }
    }
}
