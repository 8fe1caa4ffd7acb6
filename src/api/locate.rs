//! The latest-location read (spec 4.1): the location event of 2.1, typed, in AWB mode
//! or sensor mode, with the rules of each: AWB `404 AWB not found` is retried once
//! after a backoff (4.1 rule 5: a temporary fault reads as that 404) and then means not
//! found; sensor mode's `assets: []` means no current reading (it never answers 404).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::devices::{Operator, OperatorError};
use super::ApiError;

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

/// A sensor reading: `data` in `units`; 0 when the device did not report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensorReading {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: f64,
    pub units: String,
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

/// Wait before the one retry of an AWB 404.
const AWB_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Operator {
    /// The latest event of `asset_id` (an AWB, or with `sensor` a device's asset
    /// barcode). `Ok(None)`: AWB not found (after its one retry), or no current sensor
    /// reading.
    pub async fn locate(
        &self,
        asset_id: &str,
        sensor: bool,
    ) -> Result<Option<LocationEvent>, OperatorError> {
        let mut url = self.client.url(&["external", "locations", asset_id])?;
        if sensor {
            url.query_pairs_mut().append_pair("event", "sensor");
        }
        let mut awb_retried = false;
        loop {
            let a = self.send_safe("locate", Method::GET, &url, None).await?;
            match a.status {
                StatusCode::OK => {
                    let event: LocationEvent = serde_json::from_slice(&a.body).map_err(|e| {
                        ApiError::BadAnswer(format!(
                            "the location answer is not the event of spec 2.1: {e}"
                        ))
                    })?;
                    return Ok((!event.assets.is_empty()).then_some(event));
                }
                StatusCode::NOT_FOUND if !sensor && awb_retried => return Ok(None),
                StatusCode::NOT_FOUND if !sensor => {
                    // Spec 4.1.5: a temporary fault also reads as 404; once more.
                    awb_retried = true;
                    (self.on_retry)(&format!(
                        "{asset_id}: AWB not found; asking once more in {} s (a temporary fault reads the same)",
                        AWB_RETRY_AFTER.as_secs()
                    ));
                    tokio::time::sleep(AWB_RETRY_AFTER).await;
                }
                s => {
                    return Err(OperatorError::Refused(format!(
                        "locate {asset_id}: HTTP {}: {}",
                        s.as_u16(),
                        a.message
                    )))
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
    }
}
