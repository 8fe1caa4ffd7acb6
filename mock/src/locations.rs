/*!
The latest-location read (spec 4.1) in its two modes.

AWB mode: every active tag travelling with the AWB (its add-device `abc`) is
considered; each tag's latest event that is neither an activation nor an end of journey
is used, and the tag is returned only if that event has a position (a lat or lon of
exactly 0 is none), a location and a facility. No tag: 404 `AWB not found`.

Sensor mode (`event=sensor`): the device labelled with that asset barcode; its latest
event (same exclusions) with the six readings, or `assets: []` when that event lacks a
position, location or facility, even if older ones have them. Never 404.

Timestamps are local wall-clock time in the event's zone. The seeded zones have no
daylight saving time, so a fixed offset per zone is exact without a zone database.
It touches the devices (which tags travel with an AWB, which asset a label names) and
the request.
*/

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::devices::Devices;
use super::request::{OpRequest, Reply};

/// `version` of every location event (spec 2.1).
pub const LOCATION_VERSION: &str = "1.0.0";
/// The fixed `uuid` of every location answer (spec 2.1: a constant, not a request id).
pub const LOCATION_UUID: &str = "9b0c5f0e-4c1a-4d8e-a1f3-2f6b7c8d9e01";
/// The operator's `vendor_id` in every location answer.
pub const VENDOR_ID: &str = "tapegate-mock-vendor";

/// Sensor types in the order of spec 2.1, with their units.
pub const SENSORS: [(&str, &str); 6] = [
    ("ambient_temp", "°C"),
    ("probe_temp", "°C"),
    ("shock", "g"),
    ("humidity", "%"),
    ("pressure", "Pa"),
    ("light", "lx"),
];

/// What an event of a tag is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Location,
    /// An event with an air-cargo status code (e.g. `RCS`, `DLV`).
    AirCargo(&'static str),
    /// Not counted by the latest-location read.
    Activation,
    /// Not counted by the latest-location read.
    EndOfJourney,
}

/// A place events happen at: an IANA zone without DST and its offset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Place {
    pub zone: &'static str,
    pub offset_hours: i8,
    pub lat: f64,
    pub lon: f64,
    /// Zone name in the mesh, or city.
    pub location_detailed: &'static str,
    /// Facility, or state and country.
    pub location: &'static str,
}

/// One event of a tag.
#[derive(Debug, Clone, PartialEq)]
pub struct TagEvent {
    pub kind: EventKind,
    /// UTC, epoch seconds.
    pub at: i64,
    pub place: Place,
    /// In the order of [`SENSORS`]; 0 for a reading the device did not report.
    pub sensors: [f64; 6],
}

impl TagEvent {
    fn counts(&self) -> bool {
        !matches!(self.kind, EventKind::Activation | EventKind::EndOfJourney)
    }

    /// A position (lat 0 or lon 0 is none), a location and a facility.
    fn is_placed(&self) -> bool {
        let p = &self.place;
        p.lat != 0.0 && p.lon != 0.0 && !p.location.is_empty() && !p.location_detailed.is_empty()
    }

    fn local_time(&self) -> String {
        let offset = jiff::tz::Offset::constant(self.place.offset_hours);
        jiff::Timestamp::from_second(self.at)
            .map(|t| {
                t.to_zoned(jiff::tz::TimeZone::fixed(offset))
                    .strftime("%Y-%m-%dT%H:%M:%S")
                    .to_string()
            })
            .unwrap_or_default()
    }
}

/// The recent events of the seeded tags, by QR code.
#[derive(Debug, Default)]
pub(crate) struct LocationSeed {
    pub(crate) events: HashMap<String, Vec<TagEvent>>,
}

impl LocationSeed {
    /// The latest event of `qr` that counts (spec 4.1 AWB rule 1, sensor rule 1).
    fn latest(&self, qr: &str) -> Option<&TagEvent> {
        self.events
            .get(qr)?
            .iter()
            .filter(|e| e.counts())
            .max_by_key(|e| e.at)
    }
}

/// `GET /external/locations/{asset_id}[?event=sensor]`.
pub(crate) fn locate(devices: &Devices, seed: &LocationSeed, req: &OpRequest<'_>) -> Reply {
    if let Err(answer) = req.account_headers() {
        return answer;
    }
    let mut sensor = false;
    for (k, v) in req.query_pairs() {
        match (k.as_str(), v.as_str()) {
            ("event", "sensor") => sensor = true,
            ("event", other) => {
                return Reply::error(
                    400,
                    &format!("Unsupported event: {other}; the only value is sensor"),
                )
            }
            (other, _) => return Reply::error(400, &format!("Unknown parameter: {other}")),
        }
    }
    let asset_id = req.arg;
    let mine = req.is_account();
    let assets: Vec<Value> = if sensor {
        // At most one entry: the device with that asset barcode whose latest event is
        // the newest (one device per barcode in practice).
        let devices = if mine {
            devices.with_asset_barcode(asset_id)
        } else {
            Vec::new()
        };
        devices
            .into_iter()
            .filter_map(|d| Some((d, seed.latest(&d.qrcode)?)))
            .max_by_key(|(_, e)| e.at)
            .filter(|(_, e)| e.is_placed())
            .map(|(d, e)| entry(&d.qrcode, Some(asset_id), e, true))
            .into_iter()
            .collect()
    } else {
        let tags = if mine {
            devices.on_awb(asset_id)
        } else {
            Vec::new()
        };
        tags.into_iter()
            .filter_map(|d| {
                let e = seed.latest(&d.qrcode).filter(|e| e.is_placed())?;
                let barcode = d.label.as_ref().map(|l| l.asset_barcode.as_str());
                Some(entry(&d.qrcode, barcode, e, false))
            })
            .collect()
    };
    if !sensor && assets.is_empty() {
        return Reply::error(404, "AWB not found");
    }
    located(assets)
}

/// The answer of a location read during a temporary server fault (spec 4.1 AWB rule 5,
/// sensor rule 4): what the service says when it finds nothing.
pub(crate) fn temporary_fault(parts: &hyper::http::request::Parts) -> Reply {
    let sensor = parts.uri.query().is_some_and(|q| {
        url::form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "event" && v == "sensor")
    });
    if sensor {
        located(Vec::new())
    } else {
        Reply::error(404, "AWB not found")
    }
}

/// A 200 answer of spec 2.1 with these asset entries.
fn located(assets: Vec<Value>) -> Reply {
    Reply::json(
        200,
        &json!({
            "version": LOCATION_VERSION,
            "uuid": LOCATION_UUID,
            "vendor_id": VENDOR_ID,
            "assets": assets,
        }),
    )
}

/// One asset entry of spec 2.1.
fn entry(qr: &str, trk_asset_id: Option<&str>, e: &TagEvent, sensor: bool) -> Value {
    let mut m = Map::new();
    if let Some(id) = trk_asset_id {
        m.insert("trk_asset_id".into(), json!(id));
    }
    let event_type = match (sensor, e.kind) {
        (true, _) => "environment".to_string(),
        (false, EventKind::AirCargo(status)) => format!("aircargo-{status}"),
        (false, _) => "location".to_string(),
    };
    m.insert("vendor_asset_id".into(), json!(qr));
    m.insert("event_type".into(), json!(event_type));
    m.insert("timestamp".into(), json!(e.local_time()));
    m.insert("time_zone".into(), json!(e.place.zone));
    m.insert("lat".into(), json!(e.place.lat));
    m.insert("lon".into(), json!(e.place.lon));
    m.insert("location_detailed".into(), json!(e.place.location_detailed));
    m.insert("location".into(), json!(e.place.location));
    if sensor {
        let readings: Vec<Value> = SENSORS
            .iter()
            .zip(e.sensors)
            .map(|((t, units), data)| json!({"type": t, "data": data, "units": units}))
            .collect();
        m.insert("sensors".into(), Value::Array(readings));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_time_is_the_wall_clock_of_the_zone_without_offset_or_z() {
        let e = TagEvent {
            kind: EventKind::Location,
            at: 1_763_719_200, // 2025-11-21T10:00:00Z
            place: Place {
                zone: "Asia/Dubai",
                offset_hours: 4,
                lat: 25.0,
                lon: 55.0,
                location_detailed: "Dubai",
                location: "DXB",
            },
            sensors: [0.0; 6],
        };
        assert_eq!(e.local_time(), "2025-11-21T14:00:00");
    }
}
