/*!
Configure (spec 4.7, `POST /external/v1/devices/config`): one shared firmware and/or
metadata change for 1-100 devices, and each device's own asset barcode and display name;
only devices linked to the account are found. It touches the devices, the multi-device
rules and the request.
*/

use serde_json::Value;

use super::batch::{
    multi_status, parse_batch, require_a_change, result_body, str_field, Kind, Outcomes, Rule,
};
use super::devices::{Account, DEVICE_NOT_FOUND, MAX_STATUS_DEVICES};
use super::request::{OpRequest, Reply};

/// `POST /external/v1/devices/config`: one shared firmware and/or metadata change, and
/// each device's own asset barcode and display name, for 1-100 devices.
pub(crate) fn configure(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let top: [Rule; 2] = [
        ("firmware", Kind::Str, false),
        ("metadata", Kind::Obj, false),
    ];
    let rules: [Rule; 3] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, false),
        ("tape_displayname", Kind::Str, false),
    ];
    let readings = a.readings;
    let batch = match parse_batch(req, &readings, &top, &rules, MAX_STATUS_DEVICES).and_then(|b| {
        require_a_change(
            b,
            &["asset_barcode", "tape_displayname"],
            &["firmware", "metadata"],
        )
    }) {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let firmware = batch.top.get("firmware").and_then(Value::as_str);
    let metadata = batch.top.get("metadata");
    let mut outcomes = Outcomes::new();
    for d in &batch.devices {
        let qr = readings.qr_key(str_field(d, "qrcode"));
        let outcome = match a.devices.linked_mut(&qr, a.registry) {
            None => Some(DEVICE_NOT_FOUND),
            // The asset barcode lives on the label: a device without one has nothing
            // to carry it.
            Some(dev) if dev.label.is_none() && d.contains_key("asset_barcode") => {
                Some(DEVICE_NOT_FOUND)
            }
            Some(dev) => {
                if let Some(f) = firmware {
                    dev.firmware = f.to_string();
                }
                if let Some(m) = metadata {
                    dev.metadata = m.clone();
                }
                if let (Some(label), Some(v)) = (
                    dev.label.as_mut(),
                    d.get("asset_barcode").and_then(Value::as_str),
                ) {
                    label.asset_barcode = v.to_string();
                }
                if let Some(v) = d.get("tape_displayname").and_then(Value::as_str) {
                    dev.tape_displayname = Some(v.to_string());
                }
                None
            }
        };
        outcomes.push((qr, outcome));
    }
    Reply::json(multi_status(&outcomes), &result_body(&outcomes))
}
