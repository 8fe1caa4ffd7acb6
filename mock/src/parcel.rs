/*!
Add-device (spec 4.6, `POST /devices/v1/parcel`): a tape activated from query
parameters, with the account headers; 409 when it exists, unless `override=1`, which
deletes and recreates its record. An active tape's packets decode from then on (the
decode registry learns its MAC). It touches the devices, the config's application ids,
the MAC helpers and the request.
*/

use std::collections::HashMap;

use serde_json::json;

use super::config::APP_IDS;
use super::devices::{Account, Device, DeviceStatus};
use super::mac;
use super::request::{OpRequest, Reply};

const PARCEL_REQUIRED: [&str; 6] = ["qrcode", "tape_id", "appId", "dstatus", "tt", "tp"];
const PARCEL_OPTIONAL: [&str; 11] = [
    "abc",
    "retry",
    "override",
    "abcd",
    "iu",
    "apn",
    "agps",
    "macad",
    "fw_version",
    "tracked_application_id",
    "notes",
];

/// An add's parameters, checked.
struct Parcel {
    params: HashMap<String, String>,
    status: DeviceStatus,
    override_: bool,
    /// The tape's key: a MAC in plain form, or a UUID lower-cased.
    mac: String,
}

/// `POST /devices/v1/parcel`: add (activate) a tape, from query parameters.
///
/// `retry` (spec 4.6: "retry flag, default 0") has no meaning the spec shows. The mock's
/// documented choice: `retry=1` says the request repeats one whose answer was lost, and
/// changes nothing else: a device that exists is 409 with or without it, whoever
/// created it. So a client cannot take a 409 after `retry=1` for its own success; it
/// has to look (the strict reading: a service that deduplicated retries would only
/// make such a client's life easier).
pub(crate) fn add(a: Account<'_>, req: &OpRequest<'_>) -> Reply {
    let parcel = match parcel(req) {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if !req.is_account() {
        return Reply::error(404, "Customer not found");
    }
    let Parcel {
        params,
        status,
        override_,
        mac,
    } = parcel;
    let qr = params.get("qrcode").map(String::as_str).unwrap_or_default();
    let devices = a.devices;
    let exists = devices.get(qr, a.registry).is_some()
        || devices.holding_mac(&mac).is_some()
        || devices.get(&format!("TT{mac}"), a.registry).is_some();
    if exists && !override_ {
        return Reply::json(
            409,
            &json!({"code": 409, "message": "Device already exists"}),
        );
    }
    // Override deletes and recreates: whatever held the QR code or the MAC goes.
    devices.remove_holding(qr, &mac);
    let mut device = Device::new(qr, &mac, status);
    device.customer_asset_id = params.get("abc").filter(|v| !v.is_empty()).cloned();
    if let Some(fw) = params.get("fw_version").filter(|v| !v.is_empty()) {
        device.firmware = fw.clone();
    }
    devices.insert(device);
    if status.is_active() {
        // From now on the service decodes this tape's packets.
        a.registry.register(&mac);
    }
    let (code, message) = if exists {
        (200, "Device recreated")
    } else {
        (201, "Device created")
    };
    Reply::json(code, &json!({"code": code, "message": message}))
}

/// The parameters of an add, every rule checked (the account headers, no body, known
/// and single parameters, the required ones, their values); the 400 when one is broken.
fn parcel(req: &OpRequest<'_>) -> Result<Parcel, Reply> {
    req.account_headers()?;
    if !req.body.iter().all(u8::is_ascii_whitespace) {
        return Err(Reply::error(
            400,
            "This call takes query parameters, not a body",
        ));
    }
    let mut params: HashMap<String, String> = HashMap::new();
    for (k, v) in req.query_pairs() {
        if !PARCEL_REQUIRED.contains(&k.as_str()) && !PARCEL_OPTIONAL.contains(&k.as_str()) {
            return Err(Reply::error(400, &format!("Unknown parameter: {k}")));
        }
        if params.insert(k.clone(), v).is_some() {
            return Err(Reply::error(400, &format!("Parameter given twice: {k}")));
        }
    }
    if let Some(missing) = PARCEL_REQUIRED
        .iter()
        .find(|k| params.get(**k).is_none_or(|v| v.is_empty()))
    {
        return Err(Reply::error(
            400,
            &format!("Missing required parameter: {missing}"),
        ));
    }
    let p = |k: &str| params.get(k).map(String::as_str).unwrap_or_default();
    let flag = |k: &str| match params.get(k).map(String::as_str) {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(Reply::error(
            400,
            &format!("Invalid {k}: {v}; expected 0 or 1"),
        )),
    };
    let status = match p("dstatus") {
        "1" => DeviceStatus::Activated,
        "0" => DeviceStatus::NotActivated,
        v => {
            return Err(Reply::error(
                400,
                &format!("Invalid dstatus: {v}; expected 0 or 1"),
            ))
        }
    };
    let override_ = flag("override").and_then(|o| flag("retry").map(|_| o))?;
    if p("tp") != "Parcel" {
        return Err(Reply::error(
            400,
            &format!("Invalid tp: {}; expected Parcel", p("tp")),
        ));
    }
    if !APP_IDS.contains(&p("appId")) {
        return Err(Reply::error(400, &format!("Invalid appId: {}", p("appId"))));
    }
    let Some(mac) = tape_key(p("tape_id")) else {
        return Err(Reply::error(
            400,
            &format!(
                "Invalid tape_id: {}; expected a MAC address or a UUID",
                p("tape_id")
            ),
        ));
    };
    Ok(Parcel {
        params,
        status,
        override_,
        mac,
    })
}

/// The key of a `tape_id`: a MAC in plain form, or a UUID lower-cased.
fn tape_key(tape_id: &str) -> Option<String> {
    if let Some(mac) = mac::plain(tape_id) {
        return Some(mac);
    }
    uuid::Uuid::parse_str(tape_id).ok().map(|u| u.to_string())
}
