//! The latest-location read (spec 4.1): the location event of 2.1, typed, in AWB mode
//! or sensor mode, with the rules of each. A temporary fault reads as "nothing found"
//! in both modes (AWB rule 5: `404 AWB not found`; sensor rule 4: `assets: []`), so
//! each is asked once more after a backoff and only then means not found / no current
//! reading. Other failures (429, 5xx, no answer) are the send's (`send.rs`). It may
//! touch only the send.
//!
//! The asset id is checked ([`super::check_id`]) and percent-encoded byte for byte
//! into its path segment: never changed, never a dot segment that a URL library would
//! resolve away (`locate ..` must not ask for the collection).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::base::{check_id, Base, OperatorError};
use super::send::{Call, Policy, Sent};
use crate::api::{Account, ApiError};

/// The location event of spec 2.1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocationEvent {
    pub version: String,
    pub uuid: String,
    pub vendor_id: String,
    pub assets: Vec<Asset>,
}

/// One asset entry of a location event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Asset {
    /// The asset barcode; absent in AWB mode for a tag without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trk_asset_id: Option<String>,
    /// The tag's QR code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_asset_id: Option<String>,
    /// `location`, `aircargo-<STATUS>` or (sensor mode) `environment`.
    pub event_type: String,
    /// Local wall-clock time in `time_zone`, without offset.
    pub timestamp: String,
    pub time_zone: String,
    pub lat: f64,
    pub lon: f64,
    pub location_detailed: String,
    pub location: String,
    /// Sensor mode: exactly six, in the order of spec 2.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensors: Option<Vec<SensorReading>>,
}

/// A sensor reading: `data` in `units`; 0 when the device did not report it (spec
/// 2.1, latest location), -255 when the sensor is unavailable (an older description).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensorReading {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: f64,
    pub units: String,
}

/// What a reading's value says beside its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadingMark {
    Value,
    /// 0: a reading of 0, or not reported (spec 2.1 sends 0 for both).
    ZeroOrUnreported,
    /// -255: the sensor is unavailable (an older description of the service).
    Unavailable,
}

impl SensorReading {
    pub fn mark(&self) -> ReadingMark {
        if self.data == 0.0 {
            ReadingMark::ZeroOrUnreported
        } else if self.data == -255.0 {
            ReadingMark::Unavailable
        } else {
            ReadingMark::Value
        }
    }
}

/// The six readings of sensor mode, in order, with their units (spec 2.1).
pub const SENSORS: [(&str, &str); 6] = [
    ("ambient_temp", "°C"),
    ("probe_temp", "°C"),
    ("shock", "g"),
    ("humidity", "%"),
    ("pressure", "Pa"),
    ("light", "lx"),
];

/// Wait before the one repeat of an AWB 404 or an empty sensor answer.
const AWB_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `s` percent-encoded byte for byte, all but the unreserved characters of RFC 3986.
fn encode_segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, crate::util::text::UNRESERVED).to_string()
}

impl Base {
    /// The latest event of `asset_id` (an AWB, or with `sensor` a device's asset
    /// barcode). `Ok(None)`: AWB not found, or no current sensor reading (each after
    /// its one repeat).
    pub(super) async fn locate(
        &self,
        asset_id: &str,
        sensor: bool,
    ) -> Result<Option<LocationEvent>, OperatorError> {
        check_id("the asset id", asset_id).map_err(OperatorError::Usage)?;
        let mut url = self.client.url(&["external", "locations"])?;
        let path = format!("{}/{}", url.path(), encode_segment(asset_id));
        url.set_path(&path);
        if sensor {
            url.query_pairs_mut().append_pair("event", "sensor");
        }
        let shown = crate::util::text::shown(asset_id, 60);
        let call = Call {
            what: format!("locate {shown}"),
            method: Method::GET,
            url,
            account: Account::Headers,
            headers: Vec::new(),
            body: None,
            correlation_id: self.correlation_id("locate"),
        };
        let mut repeated = false;
        loop {
            let a = match self.send(Policy::READ, &call).await? {
                Sent::Answered { answer, .. } => answer,
                Sent::NoAnswer { cause, .. } | Sent::Lost { cause } => {
                    return Err(OperatorError::Refused(format!(
                        "locate {shown}: the service did not answer: {cause}"
                    )))
                }
                Sent::Interrupted { .. } => {
                    return Err(OperatorError::Interrupted(format!("locate {shown}")))
                }
            };
            let nothing = match a.status {
                StatusCode::OK => {
                    let event: LocationEvent = serde_json::from_slice(&a.body).map_err(|e| {
                        ApiError::BadAnswer(format!(
                            "the location answer is not the event of spec 2.1: {e}"
                        ))
                    })?;
                    if !event.assets.is_empty() {
                        return Ok(Some(event));
                    }
                    if !sensor {
                        return Err(OperatorError::Refused(format!(
                            "locate {shown}: the service answered 200 without an asset (spec 4.1 AWB rule 3 says at least one)"
                        )));
                    }
                    "no current reading"
                }
                StatusCode::NOT_FOUND if !sensor => "AWB not found",
                s => {
                    return Err(OperatorError::Refused(format!(
                        "locate {shown}: HTTP {}: {}",
                        s.as_u16(),
                        a.message
                    )))
                }
            };
            if repeated {
                return Ok(None);
            }
            // Spec 4.1 (AWB rule 5, sensor rule 4): a temporary fault reads the same.
            repeated = true;
            (self.on_retry)(&format!(
                "{shown}: {nothing}; asking once more in {} s (a temporary fault reads the same)",
                AWB_RETRY_AFTER.as_secs()
            ));
            tokio::select! {
                () = tokio::time::sleep(AWB_RETRY_AFTER) => {}
                () = self.interrupt.stop.cancelled() => {
                    return Err(OperatorError::Interrupted(format!("locate {shown}")))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sensor_event_of_the_spec_reads_with_its_units() {
        let body = r#"{"version":"1.0.0","uuid":"u","vendor_id":"v","assets":[{"trk_asset_id":"ASSET-0001",
          "vendor_asset_id":"TT1","event_type":"environment","timestamp":"2026-11-23T14:05:00",
          "time_zone":"Europe/Berlin","lat":50.05,"lon":8.57,"location_detailed":"Cold room 2","location":"FRA",
          "sensors":[{"type":"ambient_temp","data":4.2,"units":"°C"},{"type":"probe_temp","data":3.9,"units":"°C"},
            {"type":"shock","data":0,"units":"g"},{"type":"humidity","data":61,"units":"%"},
            {"type":"pressure","data":101325,"units":"Pa"},{"type":"light","data":0,"units":"lx"}]}]}"#;
        let e: LocationEvent = serde_json::from_str(body).unwrap();
        let sensors = e.assets[0].sensors.as_ref().unwrap();
        let got: Vec<(&str, &str)> = sensors
            .iter()
            .map(|s| (s.kind.as_str(), s.units.as_str()))
            .collect();
        assert_eq!(got, SENSORS);
        assert_eq!(sensors[4].data, 101_325.0);
        assert_eq!(sensors[2].mark(), ReadingMark::ZeroOrUnreported);
        assert_eq!(sensors[0].mark(), ReadingMark::Value);
    }

    #[test]
    fn an_asset_id_is_encoded_byte_for_byte() {
        assert_eq!(encode_segment("020-12345675"), "020-12345675");
        assert_eq!(encode_segment("a b/c?d%2E#"), "a%20b%2Fc%3Fd%252E%23");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
