/*!
The request and answer shapes the spec does not show, in one place (spec 4.7: "Request
and response field shapes of the label calls (all three methods): not shown", and the
same of the status and config calls). Each is our assumption, agreed with the mock
service; a real account's first answer corrects them here, in one edit, and nowhere
else. The README lists them. Pure: it touches nothing but JSON.

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
  "status", "mac", "firmware", "metadata", "tape_displayname"}` and the label, or
  `{"qrcode", "error_code"}`.
- deactivate (`POST /external/v1/devices/status`): `{"action": "DEACTIVATE", "devices":
  [{"qrcode"}]}`.
- configure (`POST /external/v1/devices/config`): `{"firmware"?, "metadata"?, "devices":
  [{"qrcode", "asset_barcode"?, "tape_displayname"?}]}`.
- status codes: 200 when no device failed, 207 when any did (a result is read from its
  body whatever the 2xx, and from a 400 that carries one).
- history's 400 is `{"data": {"message", "status"}}` (spec 4.2), its `status` a string.

Read both ways, because a real service may have chosen either (the mock plays each,
`mock/readings.rs`), and the client is right under both:
- the lookup's label: nested, `"label": {"asset_barcode", "application_id",
  "shipment"} | null`, or flat, those fields on the entry itself (spec 2.4 lists them as
  fields of one label record). An entry that is neither (a label field of another
  type, no label fields on a device whose status says labelled) is unreadable: the
  client never takes it for "not labelled" ([`LabelState::Unknown`]).
- the QR code a result names: as sent, or the service's normalised form (trimmed, any
  case): matched exactly first, then without regard to case and surrounding space when
  that names exactly one device sent ([`match_qr`]). `successful` and `failed` are
  checked against what was matched; a disagreement is reported, never read as success.
- a validation failure (400 with `errors` that are not per-device results) is told from
  any other 400 by that structure, never by its `message` (spec 7).
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

/// A label as the lookup reports it (nested or flat, read into one shape).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LabelDevice {
    #[serde(default)]
    pub asset_barcode: Option<String>,
    #[serde(default)]
    pub application_id: Option<String>,
    #[serde(default)]
    pub shipment: Option<Value>,
}

/// What the lookup says of a device's label.
#[derive(Debug, Clone, PartialEq)]
pub enum LabelState {
    Labelled(LabelDevice),
    Unlabelled,
    /// The entry cannot be read as either shape: whether it is labelled is unknown.
    Unknown,
}

/// One entry of the lookup's answer, read from either shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LabelRecord {
    /// As the service named it (sent or normalised).
    pub qrcode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The label, whichever shape the service used; `null` when unlabelled or unknown.
    pub label: Option<LabelDevice>,
    /// The entry could not be read as a label or as its absence.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub label_unreadable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tape_displayname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

impl LabelRecord {
    pub fn label_state(&self) -> LabelState {
        match (&self.label, self.label_unreadable) {
            (_, true) => LabelState::Unknown,
            (Some(l), false) => LabelState::Labelled(l.clone()),
            (None, false) => LabelState::Unlabelled,
        }
    }
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
    /// `(qrcode, error_code)` of each failed device, the QR code as the service named it.
    pub errors: Vec<(String, String)>,
    pub successful: u64,
    pub failed: u64,
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
    let successful = v.get("successful")?.as_u64()?;
    let failed = v.get("failed")?.as_u64()?;
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
    Some(Results {
        errors,
        successful,
        failed,
    })
}

/// Whether a refused request's body is a validation failure (spec 7: `errors` beside
/// the message, items that are not per-device results): by structure, not by message.
pub(crate) fn is_validation_failure(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("errors").cloned())
        .is_some_and(|e| e.is_array())
        && parse_results(body).is_none()
}

/// The index in `sent` of the device a result names `named`: the same QR code, or else
/// the only one that is the same without regard to case and surrounding space (a
/// service that echoes its normalised form). `taken` marks devices already matched.
pub(crate) fn match_qr(named: &str, sent: &[&str], taken: &[bool]) -> Option<usize> {
    if let Some(i) = sent.iter().position(|q| *q == named) {
        return (!taken[i]).then_some(i);
    }
    let fold = |q: &str| q.trim().to_lowercase();
    let want = fold(named);
    let mut hits = sent
        .iter()
        .enumerate()
        .filter(|(i, q)| !taken[*i] && fold(q) == want);
    match (hits.next(), hits.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}

/// The lookup's `devices` entries, each read from either shape (`None`: not an object
/// with a `qrcode`).
pub(crate) fn parse_lookup(body: &[u8]) -> Option<Vec<Option<LabelRecord>>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    Some(
        v.get("devices")?
            .as_array()?
            .iter()
            .map(lookup_entry)
            .collect(),
    )
}

fn opt_str(m: &Map<String, Value>, k: &str) -> Option<String> {
    m.get(k).and_then(Value::as_str).map(str::to_string)
}

fn lookup_entry(v: &Value) -> Option<LabelRecord> {
    let m = v.as_object()?;
    let qrcode = opt_str(m, "qrcode")?;
    let status = opt_str(m, "status");
    let label_of = |l: &Map<String, Value>| -> Option<LabelDevice> {
        let text = |k: &str| match l.get(k) {
            None | Some(Value::Null) => Some(None),
            Some(Value::String(s)) => Some(Some(s.clone())),
            Some(_) => None,
        };
        let shipment = match l.get("shipment") {
            None | Some(Value::Null) => None,
            Some(s @ Value::Object(_)) => Some(s.clone()),
            Some(_) => return None,
        };
        Some(LabelDevice {
            asset_barcode: Some(text("asset_barcode")??),
            application_id: text("application_id")?,
            shipment,
        })
    };
    let state = match m.get("label") {
        Some(Value::Object(l)) => label_of(l).map_or(LabelState::Unknown, LabelState::Labelled),
        Some(Value::Null) => LabelState::Unlabelled,
        Some(_) => LabelState::Unknown,
        // Flat: the label record's fields on the entry.
        None => match m.get("asset_barcode") {
            Some(Value::String(_)) => label_of(m).map_or(LabelState::Unknown, LabelState::Labelled),
            Some(Value::Null) => LabelState::Unlabelled,
            Some(_) => LabelState::Unknown,
            // No label field in either shape: only a status that cannot carry a label
            // (spec 3: NOT_ACTIVATED is "not labelled") says it has none; an error entry
            // has none to show.
            None if status.as_deref() == Some("NOT_ACTIVATED") || m.contains_key("error_code") => {
                LabelState::Unlabelled
            }
            None => LabelState::Unknown,
        },
    };
    let (label, label_unreadable) = match state {
        LabelState::Labelled(l) => (Some(l), false),
        LabelState::Unlabelled => (None, false),
        LabelState::Unknown => (None, true),
    };
    Some(LabelRecord {
        qrcode,
        status,
        mac: opt_str(m, "mac"),
        label,
        label_unreadable,
        firmware: opt_str(m, "firmware"),
        metadata: m.get("metadata").filter(|v| !v.is_null()).cloned(),
        tape_displayname: opt_str(m, "tape_displayname"),
        error_code: opt_str(m, "error_code"),
    })
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
        let body = br#"{"errors":[{"qrcode":"A","error_code":"QRMAC_NOT_FOUND"}],"successful":0,"failed":1}"#;
        let r = parse_results(body).unwrap();
        assert_eq!(r.errors, [("A".to_string(), "QRMAC_NOT_FOUND".to_string())]);
        assert_eq!((r.successful, r.failed), (0, 1));
        assert!(!is_validation_failure(body));
        let invalid = br#"{"message":"Reworded by a proxy","code":400,"errors":[{"field":"devices[0].qrcode","message":"x"}]}"#;
        assert_eq!(parse_results(invalid), None);
        assert!(is_validation_failure(invalid));
        assert!(!is_validation_failure(
            br#"{"message":"Validation failed","code":400}"#
        ));
    }

    #[test]
    fn a_result_naming_the_normalised_qr_code_matches_the_one_device_it_can_be() {
        let sent = ["ttc0ffee000001", " TT2", "Tt3", "tT3"];
        let none = [false; 4];
        assert_eq!(match_qr("ttc0ffee000001", &sent, &none), Some(0));
        assert_eq!(match_qr("TTC0FFEE000001", &sent, &none), Some(0));
        assert_eq!(match_qr("TT2", &sent, &none), Some(1));
        // Two devices it could be: none.
        assert_eq!(match_qr("TT3", &sent, &none), None);
        // Keyed by a MAC: none.
        assert_eq!(match_qr("C0FFEE000001", &sent, &none), None);
        assert_eq!(match_qr("TT2", &sent, &[false, true, false, false]), None);
    }

    fn record(v: Value) -> LabelRecord {
        lookup_entry(&v).unwrap()
    }

    /// The lookup reads a nested or a flat label and never takes the unreadable for none.
    #[test]
    fn the_lookup_reads_nested_or_flat_labels_never_unreadable_as_none() {
        let label = LabelState::Labelled(LabelDevice {
            asset_barcode: Some("AWB-1".into()),
            application_id: Some("app".into()),
            shipment: Some(json!({"awb": "1"})),
        });
        let nested = record(json!({"qrcode": "A", "status": "ACTIVATED",
            "label": {"asset_barcode": "AWB-1", "application_id": "app", "shipment": {"awb": "1"}}}));
        assert_eq!(nested.label_state(), label);
        let flat = record(json!({"qrcode": "A", "status": "ACTIVATED",
            "asset_barcode": "AWB-1", "application_id": "app", "shipment": {"awb": "1"}}));
        assert_eq!(flat.label_state(), label);
        for none in [
            json!({"qrcode": "A", "status": "NOT_ACTIVATED", "label": null}),
            json!({"qrcode": "A", "status": "NOT_ACTIVATED", "asset_barcode": null}),
            json!({"qrcode": "A", "status": "NOT_ACTIVATED"}),
            json!({"qrcode": "A", "error_code": "DEVICE_NOT_FOUND"}),
        ] {
            assert_eq!(
                record(none.clone()).label_state(),
                LabelState::Unlabelled,
                "{none}"
            );
        }
        for unknown in [
            json!({"qrcode": "A", "status": "ACTIVATED"}),
            json!({"qrcode": "A", "status": "ACTIVATED", "label": "AWB-1"}),
            json!({"qrcode": "A", "status": "ACTIVATED", "asset_barcode": 7}),
            json!({"qrcode": "A", "label": {"application_id": "app"}}),
        ] {
            assert_eq!(
                record(unknown.clone()).label_state(),
                LabelState::Unknown,
                "{unknown}"
            );
        }
        assert_eq!(lookup_entry(&json!(["A"])), None);
    }
}
