/*!
The request and answer shapes the spec does not show, in one place (spec 4.7: "Request
and response field shapes of the label calls (all three methods): not shown", and the
same of the status and config calls). Each is our assumption, agreed with the mock
service; a real account's first answer corrects them here, in one edit, and nowhere
else. The README lists them.

What the spec does show is kept as it says: the per-device result of 2.5
(`{errors: [{qrcode, error_code}], successful, failed}`) as the answer of every
multi-device call, 207 for partial success, the label 400 that carries the 207 body, and
the device fields named in 2.4 (`asset_barcode`, `shipment`, `qrcode`, `firmware`,
`metadata`, `tape_displayname`), which are the names used below.

Assumed:
- label (`POST /external/v1/devices/label`): `{"override": bool, "devices": [{"qrcode",
  "asset_barcode", "application_id", "shipment"?}]}`.
- relabel (`PUT`, same path): `{"devices": [{"qrcode", "asset_barcode"?,
  "application_id"?, "shipment"?}]}`.
- show (`GET`, same path): no body; `?qrcode=A&qrcode=B`; the answer is the 2.5 result
  plus `devices`: one entry per requested QR code in request order, `{"qrcode",
  "status", "mac", "label": {"asset_barcode", "application_id", "shipment"} | null,
  "firmware", "metadata", "tape_displayname"}`, or `{"qrcode", "error_code"}`.
- deactivate (`POST /external/v1/devices/status`): `{"action": "DEACTIVATE", "devices":
  [{"qrcode"}]}`.
- configure (`POST /external/v1/devices/config`): `{"firmware"?, "metadata"?, "devices":
  [{"qrcode", "asset_barcode"?, "tape_displayname"?}]}`.
- status codes: 200 when no device failed, 207 when any did.
- a validation failure's `errors` items are `{"field", "message"}`.
- history's 400 `data.status` is a string such as `BAD_REQUEST`.
*/

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// One device as the operator gives it (a `--qr` or a CSV row); each call takes the
/// fields it sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceEntry {
    pub qrcode: String,
    pub asset_barcode: Option<String>,
    pub application_id: Option<String>,
    pub shipment: Option<Value>,
    pub firmware: Option<String>,
    pub metadata: Option<Value>,
    pub tape_displayname: Option<String>,
}

/// A label as the lookup reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LabelDevice {
    #[serde(default)]
    pub asset_barcode: Option<String>,
    #[serde(default)]
    pub application_id: Option<String>,
    #[serde(default)]
    pub shipment: Option<Value>,
}

/// One entry of the lookup's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LabelRecord {
    pub qrcode: String,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub label: Option<LabelDevice>,
    #[serde(default)]
    pub firmware: Option<String>,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub tape_displayname: Option<String>,
    #[serde(default)]
    pub error_code: Option<String>,
}

/// The change a configure request applies to all its devices (spec 4.7: "one shared
/// `firmware` and/or `metadata` change").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigChange {
    pub firmware: Option<String>,
    pub metadata: Option<Value>,
}

/// The per-device result of spec 2.5.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Results {
    /// `(qrcode, error_code)` of each failed device.
    pub errors: Vec<(String, String)>,
}

fn put(map: &mut Map<String, Value>, key: &str, v: &Option<impl Serialize>) {
    if let Some(v) = v {
        map.insert(key.into(), json!(v));
    }
}

fn device(d: &DeviceEntry, fields: &[&str]) -> Value {
    let mut m = Map::new();
    m.insert("qrcode".into(), json!(d.qrcode));
    for f in fields {
        match *f {
            "asset_barcode" => put(&mut m, f, &d.asset_barcode),
            "application_id" => put(&mut m, f, &d.application_id),
            "shipment" => put(&mut m, f, &d.shipment),
            "tape_displayname" => put(&mut m, f, &d.tape_displayname),
            _ => {}
        }
    }
    Value::Object(m)
}

fn devices(ds: &[DeviceEntry], fields: &[&str]) -> Value {
    Value::Array(ds.iter().map(|d| device(d, fields)).collect())
}

const LABEL_FIELDS: &[&str] = &["asset_barcode", "application_id", "shipment"];

pub(crate) fn label_body(ds: &[DeviceEntry], override_label: bool) -> Value {
    json!({"override": override_label, "devices": devices(ds, LABEL_FIELDS)})
}

pub(crate) fn relabel_body(ds: &[DeviceEntry]) -> Value {
    json!({"devices": devices(ds, LABEL_FIELDS)})
}

pub(crate) fn show_query(ds: &[DeviceEntry]) -> Vec<(&'static str, String)> {
    ds.iter().map(|d| ("qrcode", d.qrcode.clone())).collect()
}

pub(crate) fn status_body(ds: &[DeviceEntry]) -> Value {
    json!({"action": "DEACTIVATE", "devices": devices(ds, &[])})
}

pub(crate) fn config_body(change: &ConfigChange, ds: &[DeviceEntry]) -> Value {
    let mut m = Map::new();
    put(&mut m, "firmware", &change.firmware);
    put(&mut m, "metadata", &change.metadata);
    m.insert(
        "devices".into(),
        devices(ds, &["asset_barcode", "tape_displayname"]),
    );
    Value::Object(m)
}

/// The 2.5 result in `body`, if it is one (`successful` and `failed` numbers, `errors`
/// an array of `{qrcode, error_code}`).
pub(crate) fn parse_results(body: &[u8]) -> Option<Results> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.get("successful")?.as_u64()?;
    v.get("failed")?.as_u64()?;
    let errors = v
        .get("errors")?
        .as_array()?
        .iter()
        .map(|e| {
            Some((
                e.get("qrcode")?.as_str()?.to_string(),
                e.get("error_code")?.as_str()?.to_string(),
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Results { errors })
}

/// The lookup's `devices`, if the body has them.
pub(crate) fn parse_lookup(body: &[u8]) -> Option<Vec<LabelRecord>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    serde_json::from_value(v.get("devices")?.clone()).ok()
}

/// The message of history's own 400 shape, `{"data": {"message", "status"}}`.
pub(crate) fn history_error_message(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    Some(v.get("data")?.get("message")?.as_str()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(q: &str) -> DeviceEntry {
        DeviceEntry {
            qrcode: q.into(),
            asset_barcode: Some("AWB-1".into()),
            application_id: Some("app".into()),
            firmware: Some("1.5".into()),
            ..DeviceEntry::default()
        }
    }

    #[test]
    fn each_body_carries_only_the_fields_of_its_call() {
        let ds = [entry("TT1")];
        assert_eq!(
            label_body(&ds, true),
            json!({"override": true, "devices": [{"qrcode": "TT1", "asset_barcode": "AWB-1", "application_id": "app"}]})
        );
        assert_eq!(
            status_body(&ds),
            json!({"action": "DEACTIVATE", "devices": [{"qrcode": "TT1"}]})
        );
        let change = ConfigChange {
            firmware: Some("1.5".into()),
            metadata: None,
        };
        assert_eq!(
            config_body(&change, &ds),
            json!({"firmware": "1.5", "devices": [{"qrcode": "TT1", "asset_barcode": "AWB-1"}]})
        );
    }

    #[test]
    fn a_result_needs_its_counts_and_a_validation_failure_is_not_one() {
        let r = parse_results(
            br#"{"errors":[{"qrcode":"A","error_code":"QRMAC_NOT_FOUND"}],"successful":0,"failed":1}"#,
        )
        .unwrap();
        assert_eq!(r.errors, [("A".to_string(), "QRMAC_NOT_FOUND".to_string())]);
        assert_eq!(
            parse_results(
                br#"{"message":"Validation failed","code":400,"errors":[{"field":"devices[0].qrcode","message":"x"}]}"#
            ),
            None
        );
    }
}
