/*!
The label calls of spec 4.7 on `/external/v1/devices/label`: label (`POST`, 1-20
devices, the transition of spec 3 for a new label; every device unknown is the 400 that
carries the 207 body), relabel (`PUT`, edits a label in place) and the lookup (`GET`,
its entry in the shape the reading says). The shapes are the project's choice
(docs/service.md, "Request shapes that are assumptions"; the README lists them). It
touches the devices, the multi-device rules and the request.
*/

use serde_json::{json, Map, Value};

use super::batch::{
    check_app_ids, multi_status, parse_batch, require_a_change, result_body, str_field, Kind,
    Outcomes, Problems, Rule,
};
use super::devices::DeviceStatus;
use super::devices::{
    Account, Device, Label, ALREADY_LABELLED, DEVICE_NOT_FOUND, MAX_LABEL_DEVICES, QRMAC_NOT_FOUND,
};
use super::request::{OpRequest, Reply};

/// `POST /external/v1/devices/label`: label 1-20 devices.
pub(crate) fn label(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let rules: [Rule; 4] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, true),
        ("application_id", Kind::Str, true),
        ("shipment", Kind::Obj, false),
    ];
    let readings = a.readings;
    let batch = match parse_batch(
        req,
        &readings,
        &[("override", Kind::Bool, false)],
        &rules,
        MAX_LABEL_DEVICES,
    )
    .and_then(|b| check_app_ids(&b).map(|()| b))
    {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let override_ = batch
        .top
        .get("override")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut outcomes = Outcomes::new();
    for d in &batch.devices {
        let qr = readings.qr_key(str_field(d, "qrcode"));
        let outcome = match a.devices.get_mut(&qr, a.registry) {
            None => Some(QRMAC_NOT_FOUND),
            Some(device) => apply_label(device, d, override_),
        };
        outcomes.push((qr, outcome));
    }
    let body = result_body(&outcomes);
    let all_not_found = outcomes.iter().all(|(_, e)| *e == Some(QRMAC_NOT_FOUND));
    if all_not_found {
        // Spec section 7: the label call where every device is unknown is a 400 that
        // carries the 207 body.
        return Reply::json(400, &body);
    }
    Reply::json(multi_status(&outcomes), &body)
}

/// The transition table of spec section 3 for a label request.
fn apply_label(
    device: &mut Device,
    d: &Map<String, Value>,
    override_: bool,
) -> Option<&'static str> {
    if device.label.is_some() && !override_ {
        return Some(ALREADY_LABELLED);
    }
    device.label = Some(Label {
        asset_barcode: str_field(d, "asset_barcode").to_string(),
        application_id: str_field(d, "application_id").to_string(),
        shipment: d.get("shipment").cloned(),
    });
    // Only a new label activates; an override never changes the status (a DEACTIVATED
    // device is not reactivated).
    if device.status == DeviceStatus::NotActivated {
        device.status = DeviceStatus::Activated;
    }
    None
}

/// `PUT /external/v1/devices/label`: edit 1-20 labels.
pub(crate) fn relabel(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let rules: [Rule; 4] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, false),
        ("application_id", Kind::Str, false),
        ("shipment", Kind::Obj, false),
    ];
    let readings = a.readings;
    let batch = match parse_batch(req, &readings, &[], &rules, MAX_LABEL_DEVICES)
        .and_then(|b| check_app_ids(&b).map(|()| b))
        .and_then(|b| require_a_change(b, &["asset_barcode", "application_id", "shipment"], &[]))
    {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let mut outcomes = Outcomes::new();
    for d in &batch.devices {
        let qr = readings.qr_key(str_field(d, "qrcode"));
        let label = a
            .devices
            .linked_mut(&qr, a.registry)
            .and_then(|dev| dev.label.as_mut());
        let outcome = match label {
            None => Some(DEVICE_NOT_FOUND),
            Some(label) => {
                if let Some(v) = d.get("asset_barcode").and_then(Value::as_str) {
                    label.asset_barcode = v.to_string();
                }
                if let Some(v) = d.get("application_id").and_then(Value::as_str) {
                    label.application_id = v.to_string();
                }
                if let Some(v) = d.get("shipment") {
                    label.shipment = Some(v.clone());
                }
                None
            }
        };
        outcomes.push((qr, outcome));
    }
    Reply::json(multi_status(&outcomes), &result_body(&outcomes))
}

/// `GET /external/v1/devices/label?qrcode=A&qrcode=B`: look up 1-20 labels.
pub(crate) fn show(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let mut problems = Problems::default();
    let mut qrcodes = Vec::new();
    for (k, v) in req.query_pairs() {
        if k == "qrcode" && !v.is_empty() {
            qrcodes.push(v);
        } else if k == "qrcode" {
            problems.add("qrcode", "must not be empty");
        } else {
            problems.add(&k, "is not a known parameter");
        }
    }
    if qrcodes.is_empty() || qrcodes.len() > MAX_LABEL_DEVICES {
        problems.add(
            "qrcode",
            format!(
                "give 1 to {MAX_LABEL_DEVICES} qrcode parameters, not {}",
                qrcodes.len()
            ),
        );
    }
    if let Err(answer) = problems.verdict() {
        return answer;
    }
    let readings = a.readings;
    let mut outcomes = Outcomes::new();
    let mut entries = Vec::new();
    for qr in qrcodes {
        let qr = readings.qr_key(&qr);
        match a.devices.get(&qr, a.registry) {
            Some(d) => {
                entries.push(d.show(&qr, readings.lookup));
                outcomes.push((qr, None));
            }
            None => {
                entries.push(json!({"qrcode": qr, "error_code": DEVICE_NOT_FOUND}));
                outcomes.push((qr, Some(DEVICE_NOT_FOUND)));
            }
        }
    }
    let mut body = result_body(&outcomes);
    body["devices"] = Value::Array(entries);
    Reply::json(multi_status(&outcomes), &body)
}
