/*!
Deactivate (spec 4.7, `POST /external/v1/devices/status`): 1-100 devices, the only
action `DEACTIVATE`, with the transitions of spec 3 (`ALREADY_IN_TARGET_STATE` for a
deactivated device, `INVALID_TRANSITION` for one that is not active). It touches the
devices, the multi-device rules and the request.
*/

use serde_json::json;

use super::batch::{multi_status, parse_batch, result_body, str_field, Kind, Outcomes};
use super::devices::{
    Account, Device, DeviceStatus, ALREADY_IN_TARGET_STATE, DEVICE_NOT_FOUND, INVALID_TRANSITION,
    MAX_STATUS_DEVICES,
};
use super::request::{validation_failed, OpRequest, Reply};

/// `POST /external/v1/devices/status`: deactivate 1-100 devices.
pub(crate) fn deactivate(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let readings = a.readings;
    let batch = match parse_batch(
        req,
        &readings,
        &[("action", Kind::Str, true)],
        &[("qrcode", Kind::Str, true)],
        MAX_STATUS_DEVICES,
    ) {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let action = str_field(&batch.top, "action");
    if action != "DEACTIVATE" {
        return validation_failed(vec![json!({
            "field": "action",
            "message": format!("unsupported action {action}; the only action is DEACTIVATE"),
        })]);
    }
    let mut outcomes = Outcomes::new();
    for qr in batch.qrcodes(&readings) {
        let outcome = match a.devices.get_mut(&qr, a.registry) {
            None => Some(DEVICE_NOT_FOUND),
            Some(device) => apply_deactivate(device),
        };
        outcomes.push((qr, outcome));
    }
    Reply::json(multi_status(&outcomes), &result_body(&outcomes))
}

/// The transition table of spec section 3 for DEACTIVATE.
fn apply_deactivate(device: &mut Device) -> Option<&'static str> {
    match device.status {
        s if s.is_active() => {
            device.status = DeviceStatus::Deactivated;
            None
        }
        DeviceStatus::Deactivated => Some(ALREADY_IN_TARGET_STATE),
        _ => Some(INVALID_TRANSITION),
    }
}
