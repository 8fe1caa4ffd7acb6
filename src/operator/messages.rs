//! Integration messages (spec 4.5): the payload is checked against the shapes the spec
//! lists before it is sent (every field listed is taken as required: the spec shows no
//! other rule), and `message_type` goes both as a header and in the body. A message is
//! not idempotent and nothing marks a repeat, so it is sent again only when it cannot
//! have been applied (429, no connection); after a 5xx or a lost answer it is reported
//! as "may or may not have arrived", never sent twice. It may touch only the send.

use bytes::Bytes;
use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Value};

use super::base::{Base, OperatorError};
use super::send::{Call, Policy, Sent};
use crate::api::Account;

/// The three message types of spec 4.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MessageType {
    /// A device's sensor reading (temperature, humidity).
    DeviceData,
    /// A shipment manifest (asset, shipment, container, shipped date).
    ManifestData,
    /// An air cargo booking event (the booking, its flights, shipper and consignee).
    Aircargo,
}

impl MessageType {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageType::DeviceData => "DEVICE_DATA",
            MessageType::ManifestData => "MANIFEST_DATA",
            MessageType::Aircargo => "AIRCARGO",
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Str,
    Int,
    Num,
    Obj,
}

fn need(v: &Value, path: &str, kind: Kind) -> Result<(), String> {
    let mut at = v;
    for part in path.split('.') {
        at = at.get(part).ok_or_else(|| format!("{path} is missing"))?;
    }
    let (ok, what) = match kind {
        Kind::Str => (at.is_string(), "a string"),
        Kind::Int => (at.is_i64() || at.is_u64(), "an integer (epoch seconds)"),
        Kind::Num => (at.is_number(), "a number"),
        Kind::Obj => (at.is_object(), "an object"),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{path} must be {what}, got {at}"))
    }
}

/// Checks `data` against the shape of `t` in spec 4.5; the error names the field.
fn check_payload(t: MessageType, data: &Value) -> Result<(), String> {
    if !data.is_object() {
        return Err("the payload must be a JSON object (the `data` of the message)".into());
    }
    let fields: &[(&str, Kind)] = match t {
        MessageType::ManifestData => &[
            ("asset_barcode", Kind::Str),
            ("shipped_date", Kind::Int),
            ("shipment_id", Kind::Str),
            ("container_id", Kind::Str),
        ],
        MessageType::DeviceData => &[
            ("device_id", Kind::Str),
            ("sensor_data", Kind::Obj),
            ("sensor_data.temperature", Kind::Num),
            ("sensor_data.humidity", Kind::Num),
            ("timestamp", Kind::Int),
        ],
        MessageType::Aircargo => &[
            ("bookingPublishEvent", Kind::Obj),
            ("bookingPublishEvent.bookingDetails", Kind::Obj),
            ("bookingPublishEvent.bookingDetails.awb", Kind::Str),
            ("bookingPublishEvent.eventMetadata", Kind::Obj),
            ("bookingPublishEvent.eventMetadata.id", Kind::Str),
            ("bookingPublishEvent.eventMetadata.timestamp", Kind::Str),
            ("bookingPublishEvent.eventMetadata.type", Kind::Str),
        ],
    };
    for (path, kind) in fields {
        need(data, path, *kind)?;
    }
    Ok(())
}

/// What the service answered a message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageSent {
    pub message_type: &'static str,
    pub status: u16,
    /// The service's `message`.
    pub message: String,
    pub correlation_id: String,
}

impl Base {
    /// Sends one integration message; returns what the service answered.
    pub(super) async fn message(
        &self,
        t: MessageType,
        data: Value,
    ) -> Result<MessageSent, OperatorError> {
        check_payload(t, &data)
            .map_err(|e| OperatorError::Usage(format!("{} payload: {e}", t.as_str())))?;
        let call = Call {
            what: format!("{} message", t.as_str()),
            method: Method::POST,
            url: self.client.url(&["external", "messages"])?,
            account: Account::Headers,
            headers: vec![("message_type", t.as_str().to_string())],
            body: Some(Bytes::from(
                json!({"message_type": t.as_str(), "data": data}).to_string(),
            )),
            correlation_id: self.correlation_id("message"),
        };
        let maybe =
            "the message may or may not have arrived (not sent again: it is not idempotent)";
        let a = match self.send(Policy::MESSAGE, &call).await? {
            Sent::Answered { answer, .. } => answer,
            Sent::Lost { cause } => {
                return Err(OperatorError::Refused(format!("{cause}: {maybe}")))
            }
            Sent::NoAnswer { cause, lost_before } => {
                return Err(OperatorError::Refused(if lost_before {
                    format!("{cause}: {maybe}")
                } else {
                    format!("{cause}: the message was not sent")
                }))
            }
            Sent::Interrupted {
                in_flight,
                lost_before,
            } => {
                return Err(OperatorError::Interrupted(if in_flight || lost_before {
                    maybe.to_string()
                } else {
                    "the message was not sent".to_string()
                }))
            }
        };
        if !a.status.is_success() {
            return Err(OperatorError::Refused(format!(
                "the service refused the {} message (HTTP {}): {}",
                t.as_str(),
                a.status.as_u16(),
                a.message
            )));
        }
        let v: Value = serde_json::from_slice(&a.body).unwrap_or_default();
        Ok(MessageSent {
            message_type: t.as_str(),
            status: a.status.as_u16(),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .map(|m| crate::util::text::bounded(m, crate::util::text::SHOWN_MAX_CHARS))
                .unwrap_or_else(|| "accepted".to_string()),
            correlation_id: call.correlation_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_missing_a_field_of_the_spec_names_it() {
        let ok = json!({"device_id": "TT1", "sensor_data": {"temperature": 4.5, "humidity": 60}, "timestamp": 1763719200});
        assert_eq!(check_payload(MessageType::DeviceData, &ok), Ok(()));
        let bad = json!({"device_id": "TT1", "sensor_data": {"temperature": "4.5", "humidity": 60}, "timestamp": 1});
        assert_eq!(
            check_payload(MessageType::DeviceData, &bad),
            Err("sensor_data.temperature must be a number, got \"4.5\"".into())
        );
        let bad = json!({"asset_barcode": "A", "shipped_date": 1.5, "shipment_id": "S", "container_id": "C"});
        assert!(check_payload(MessageType::ManifestData, &bad)
            .unwrap_err()
            .starts_with("shipped_date must be an integer"));
        assert_eq!(
            check_payload(MessageType::Aircargo, &json!({"bookingPublishEvent": {}})),
            Err("bookingPublishEvent.bookingDetails is missing".into())
        );
    }
}
