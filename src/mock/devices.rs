/*!
The devices of the account and the calls that change them: add-device (spec 4.6), label,
relabel and label lookup, deactivate and configure (4.7), with the state machine of
spec section 3 and the per-device results of 2.5 and section 7.

Which devices exist: the seeded ones ([`super::seed`]), the ones added with add-device,
and every QR code `TT<MAC>` whose MAC the decode registry knows (the simulated fleet),
which starts NOT_ACTIVATED with no label: spec 3 has ACTIVATED mean "labelled and linked
to the account", so a tape without a label is never ACTIVATED (its packets decode all
the same: the decode registry is the mock's own choice of what the service knows). A request that breaks a rule of the whole request (device
count, duplicate QR code, a missing or mistyped field) changes nothing and gets 400
`Validation failed`; otherwise each device gets its own outcome.

The request and answer shapes of 4.7 are not shown by the spec; the ones here are the
project's choice, written down in the README ("Request shapes that are assumptions").
*/

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::ops::{validation_failed, OpRequest, Reply};
use super::readings::{LookupShape, Readings};
use super::service::State;
use super::{Registry, APP_IDS, FW_VER};
use crate::record::Mac;

/// Devices per label, relabel and lookup request (spec section 8).
pub const MAX_LABEL_DEVICES: usize = 20;
/// Devices per deactivate and configure request (spec section 8).
pub const MAX_STATUS_DEVICES: usize = 100;

/// Per-device error codes (spec section 7).
pub const QRMAC_NOT_FOUND: &str = "QRMAC_NOT_FOUND";
pub const ALREADY_LABELLED: &str = "ALREADY_LABELLED";
pub const ALREADY_IN_TARGET_STATE: &str = "ALREADY_IN_TARGET_STATE";
pub const INVALID_TRANSITION: &str = "INVALID_TRANSITION";
pub const DEVICE_NOT_FOUND: &str = "DEVICE_NOT_FOUND";

/// Device status (spec section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceStatus {
    NotActivated,
    Activated,
    Deactivated,
    ForceActivated,
    ActiveWithNoAlerts,
    Rejected,
    ReuseOrExpired,
}

impl DeviceStatus {
    pub const ALL: [DeviceStatus; 7] = [
        DeviceStatus::NotActivated,
        DeviceStatus::Activated,
        DeviceStatus::Deactivated,
        DeviceStatus::ForceActivated,
        DeviceStatus::ActiveWithNoAlerts,
        DeviceStatus::Rejected,
        DeviceStatus::ReuseOrExpired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceStatus::NotActivated => "NOT_ACTIVATED",
            DeviceStatus::Activated => "ACTIVATED",
            DeviceStatus::Deactivated => "DEACTIVATED",
            DeviceStatus::ForceActivated => "FORCE_ACTIVATED",
            DeviceStatus::ActiveWithNoAlerts => "ACTIVE_WITH_NO_ALERTS",
            DeviceStatus::Rejected => "REJECTED",
            DeviceStatus::ReuseOrExpired => "REUSE_OR_EXPIRED",
        }
    }

    /// The statuses whose events are processed and that deactivate moves to DEACTIVATED.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            DeviceStatus::Activated
                | DeviceStatus::ForceActivated
                | DeviceStatus::ActiveWithNoAlerts
        )
    }
}

/// A label: the device's asset and application, and optionally one shipment (spec 2.4).
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub asset_barcode: String,
    pub application_id: String,
    pub shipment: Option<Value>,
}

/// A device of the account.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub qrcode: String,
    /// Plain form: 12 upper-case hex digits (or the UUID given as `tape_id`).
    pub mac: String,
    pub status: DeviceStatus,
    pub label: Option<Label>,
    pub firmware: String,
    pub metadata: Value,
    pub tape_displayname: Option<String>,
    /// `abc` of add-device: the AWB (or other customer asset id) the tape travels with.
    pub customer_asset_id: Option<String>,
}

impl Device {
    /// A device as the service holds it before any label or configuration.
    pub fn new(qrcode: &str, mac: &str, status: DeviceStatus) -> Self {
        Device {
            qrcode: qrcode.to_string(),
            mac: mac.to_string(),
            status,
            label: None,
            firmware: FW_VER.to_string(),
            metadata: json!({}),
            tape_displayname: None,
            customer_asset_id: None,
        }
    }

    pub fn labelled(mut self, asset_barcode: &str, application_id: &str) -> Self {
        self.label = Some(Label {
            asset_barcode: asset_barcode.to_string(),
            application_id: application_id.to_string(),
            shipment: None,
        });
        self
    }

    /// Linked to the account: NOT_ACTIVATED devices are registered but not linked, so
    /// the account's edit calls do not find them.
    fn linked(&self) -> bool {
        self.status != DeviceStatus::NotActivated
    }

    /// The lookup's entry of this device, named `qrcode` (as sent or normalised), in
    /// the shape the reading says.
    fn show(&self, qrcode: &str, shape: LookupShape) -> Value {
        let mut entry = json!({
            "qrcode": qrcode,
            "status": self.status.as_str(),
            "mac": self.mac,
            "firmware": self.firmware,
            "metadata": self.metadata,
            "tape_displayname": self.tape_displayname,
        });
        let label = |l: &Label| {
            json!({
                "asset_barcode": l.asset_barcode,
                "application_id": l.application_id,
                "shipment": l.shipment,
            })
        };
        match shape {
            LookupShape::Nested => entry["label"] = self.label.as_ref().map_or(Value::Null, label),
            LookupShape::Flat => {
                for k in ["asset_barcode", "application_id", "shipment"] {
                    entry[k] = self
                        .label
                        .as_ref()
                        .map_or(Value::Null, |l| label(l)[k].clone());
                }
            }
        }
        entry
    }
}

/// The QR code the simulated fleet's tape of this MAC carries (the decode answer's
/// `qr_code`).
pub fn fleet_qrcode(mac: &Mac) -> String {
    format!("TT{}", mac.plain())
}

/// The devices of the account, by QR code.
#[derive(Debug, Default)]
pub(super) struct Devices {
    by_qr: HashMap<String, Device>,
}

impl Devices {
    pub(super) fn insert(&mut self, device: Device) {
        self.by_qr.insert(device.qrcode.clone(), device);
    }

    pub(super) fn get(&self, qr: &str, registry: &Registry) -> Option<Device> {
        self.by_qr
            .get(qr)
            .cloned()
            .or_else(|| self.fleet_device(qr, registry))
    }

    /// The device of `qr`, materialising a fleet tape on first touch.
    fn get_mut(&mut self, qr: &str, registry: &Registry) -> Option<&mut Device> {
        if !self.by_qr.contains_key(qr) {
            let device = self.fleet_device(qr, registry)?;
            self.insert(device);
        }
        self.by_qr.get_mut(qr)
    }

    /// The device of `qr` if it is linked to the account (what the edit calls see).
    fn linked_mut(&mut self, qr: &str, registry: &Registry) -> Option<&mut Device> {
        self.get_mut(qr, registry).filter(|d| d.linked())
    }

    /// A tape of the simulated fleet that the service decodes: `TT` + a registered MAC
    /// that no explicit device holds.
    fn fleet_device(&self, qr: &str, registry: &Registry) -> Option<Device> {
        let mac = qr.strip_prefix("TT")?;
        let plain = mac.len() == 12
            && mac
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_lowercase());
        if !plain || !registry.is_registered(mac) || self.holding_mac(mac).is_some() {
            return None;
        }
        Some(Device::new(qr, mac, DeviceStatus::NotActivated))
    }

    fn holding_mac(&self, mac: &str) -> Option<&Device> {
        self.by_qr.values().find(|d| d.mac == mac)
    }

    /// Devices whose label carries `asset_barcode`.
    pub(super) fn with_asset_barcode(&self, asset_barcode: &str) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .by_qr
            .values()
            .filter(|d| {
                d.label
                    .as_ref()
                    .is_some_and(|l| l.asset_barcode == asset_barcode)
            })
            .collect();
        v.sort_by(|a, b| a.qrcode.cmp(&b.qrcode));
        v
    }

    /// Active devices travelling with the AWB `awb`.
    pub(super) fn on_awb(&self, awb: &str) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .by_qr
            .values()
            .filter(|d| d.status.is_active() && d.customer_asset_id.as_deref() == Some(awb))
            .collect();
        v.sort_by(|a, b| a.qrcode.cmp(&b.qrcode));
        v
    }
}

// ---- validation of the multi-device bodies ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Obj,
    Bool,
    Arr,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Str => "a non-empty string",
            Kind::Obj => "an object",
            Kind::Bool => "a boolean",
            Kind::Arr => "an array",
        }
    }

    fn accepts(self, v: &Value) -> bool {
        match self {
            Kind::Str => v.as_str().is_some_and(|s| !s.is_empty()),
            Kind::Obj => v.is_object(),
            Kind::Bool => v.is_boolean(),
            Kind::Arr => v.is_array(),
        }
    }
}

/// (name, kind, required)
type Rule = (&'static str, Kind, bool);

/// Collects the `{field, message}` items of a validation failure.
#[derive(Debug, Default)]
struct Problems(Vec<Value>);

impl Problems {
    fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0
            .push(json!({"field": field, "message": message.into()}));
    }

    /// `Ok` when nothing was found, else the 400 `Validation failed` answer.
    fn verdict(self) -> Result<(), Reply> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(validation_failed(self.0))
        }
    }

    /// Checks `obj` against `rules`, naming fields under `prefix`; unknown keys too.
    fn check(&mut self, obj: &Map<String, Value>, rules: &[Rule], prefix: &str) {
        for (name, kind, required) in rules {
            let field = format!("{prefix}{name}");
            match obj.get(*name) {
                None if *required => self.add(&field, "is required"),
                Some(v) if !kind.accepts(v) => self.add(&field, format!("must be {}", kind.name())),
                _ => {}
            }
        }
        for key in obj.keys() {
            if !rules.iter().any(|(n, _, _)| n == key) {
                self.add(&format!("{prefix}{key}"), "is not a known field");
            }
        }
    }
}

/// A checked multi-device body: the top-level object and its devices.
struct Batch {
    top: Map<String, Value>,
    devices: Vec<Map<String, Value>>,
}

impl Batch {
    /// The devices' QR codes as the service keys and echoes them.
    fn qrcodes(&self, readings: &Readings) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| readings.qr_key(str_field(d, "qrcode")))
            .collect()
    }
}

fn str_field<'a>(obj: &'a Map<String, Value>, name: &str) -> &'a str {
    obj.get(name).and_then(Value::as_str).unwrap_or_default()
}

/// Parses and checks a multi-device body; the 400 answer if any rule is broken.
fn parse_batch(
    req: &OpRequest<'_>,
    readings: &Readings,
    top_rules: &[Rule],
    device_rules: &[Rule],
    max: usize,
) -> Result<Batch, Reply> {
    let body: Value = req.json_body()?;
    let mut problems = Problems::default();
    let Value::Object(top) = body else {
        problems.add("", "the body must be a JSON object");
        return Err(validation_failed(problems.0));
    };
    let mut rules = top_rules.to_vec();
    rules.push(("devices", Kind::Arr, true));
    problems.check(&top, &rules, "");
    let mut devices = Vec::new();
    if let Some(Value::Array(items)) = top.get("devices") {
        if items.is_empty() || items.len() > max {
            problems.add(
                "devices",
                format!("must hold 1 to {max} devices, not {}", items.len()),
            );
        }
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let prefix = format!("devices[{i}].");
            let Value::Object(obj) = item else {
                problems.add(&format!("devices[{i}]"), "must be an object");
                continue;
            };
            problems.check(obj, device_rules, &prefix);
            let qr = str_field(obj, "qrcode");
            if !qr.is_empty() && !seen.insert(readings.qr_key(qr)) {
                problems.add(&format!("{prefix}qrcode"), format!("duplicate qrcode {qr}"));
            }
            devices.push(obj.clone());
        }
    }
    problems.verdict().map(|()| Batch { top, devices })
}

/// Whether an `application_id` is one the operator issued; a problem if not.
fn check_app_ids(batch: &Batch) -> Result<(), Reply> {
    let mut problems = Problems::default();
    for (i, d) in batch.devices.iter().enumerate() {
        if let Some(app) = d.get("application_id").and_then(Value::as_str) {
            if !APP_IDS.contains(&app) {
                problems.add(
                    &format!("devices[{i}].application_id"),
                    format!("unknown application {app}"),
                );
            }
        }
    }
    problems.verdict()
}

/// One outcome per device, in request order: `None` is success.
type Outcomes = Vec<(String, Option<&'static str>)>;

/// The partial-success body of spec 2.5.
fn result_body(outcomes: &Outcomes) -> Value {
    let errors: Vec<Value> = outcomes
        .iter()
        .filter_map(|(qr, e)| e.map(|code| json!({"qrcode": qr, "error_code": code})))
        .collect();
    let failed = errors.len();
    json!({"errors": errors, "successful": outcomes.len() - failed, "failed": failed})
}

/// 200 when every device succeeded, 207 otherwise (spec section 7).
fn multi_status(outcomes: &Outcomes) -> u16 {
    if outcomes.iter().all(|(_, e)| e.is_none()) {
        200
    } else {
        207
    }
}

// ---- the endpoints ----

/// `POST /external/v1/devices/label`: label 1-20 devices.
pub(super) fn label(s: &mut State, req: &OpRequest<'_>) -> Reply {
    let rules: [Rule; 4] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, true),
        ("application_id", Kind::Str, true),
        ("shipment", Kind::Obj, false),
    ];
    let readings = s.ops.readings;
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
        let outcome = match s.ops.devices.get_mut(&qr, &s.registry) {
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
pub(super) fn relabel(s: &mut State, req: &OpRequest<'_>) -> Reply {
    let rules: [Rule; 4] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, false),
        ("application_id", Kind::Str, false),
        ("shipment", Kind::Obj, false),
    ];
    let readings = s.ops.readings;
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
        let label = s
            .ops
            .devices
            .linked_mut(&qr, &s.registry)
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

/// Refuses a body in which no device (nor the shared `top` fields) changes anything.
fn require_a_change(
    batch: Batch,
    device_fields: &[&str],
    top_fields: &[&str],
) -> Result<Batch, Reply> {
    let shared = top_fields.iter().any(|f| batch.top.contains_key(*f));
    let mut problems = Problems::default();
    if !shared {
        for (i, d) in batch.devices.iter().enumerate() {
            if !device_fields.iter().any(|f| d.contains_key(*f)) {
                problems.add(
                    &format!("devices[{i}]"),
                    format!(
                        "nothing to change: give one of {}",
                        [top_fields, device_fields].concat().join(", ")
                    ),
                );
            }
        }
    }
    problems.verdict().map(|()| batch)
}

/// `GET /external/v1/devices/label?qrcode=A&qrcode=B`: look up 1-20 labels.
pub(super) fn show(s: &mut State, req: &OpRequest<'_>) -> Reply {
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
    let readings = s.ops.readings;
    let mut outcomes = Outcomes::new();
    let mut entries = Vec::new();
    for qr in qrcodes {
        let qr = readings.qr_key(&qr);
        match s.ops.devices.get(&qr, &s.registry) {
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

/// `POST /external/v1/devices/status`: deactivate 1-100 devices.
pub(super) fn deactivate(s: &mut State, req: &OpRequest<'_>) -> Reply {
    let readings = s.ops.readings;
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
        let outcome = match s.ops.devices.get_mut(&qr, &s.registry) {
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

/// `POST /external/v1/devices/config`: one shared firmware and/or metadata change, and
/// each device's own asset barcode and display name, for 1-100 devices.
pub(super) fn configure(s: &mut State, req: &OpRequest<'_>) -> Reply {
    let top: [Rule; 2] = [
        ("firmware", Kind::Str, false),
        ("metadata", Kind::Obj, false),
    ];
    let rules: [Rule; 3] = [
        ("qrcode", Kind::Str, true),
        ("asset_barcode", Kind::Str, false),
        ("tape_displayname", Kind::Str, false),
    ];
    let readings = s.ops.readings;
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
        let outcome = match s.ops.devices.linked_mut(&qr, &s.registry) {
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

// ---- add device (spec 4.6) ----

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

/// `POST /devices/v1/parcel`: add (activate) a tape, from query parameters.
///
/// `retry` (spec 4.6: "retry flag, default 0") has no meaning the spec shows. The mock's
/// documented choice: `retry=1` says the request repeats one whose answer was lost, and
/// changes nothing else: a device that exists is 409 with or without it, whoever
/// created it. So a client cannot take a 409 after `retry=1` for its own success; it
/// has to look (the strict reading: a service that deduplicated retries would only
/// make such a client's life easier).
pub(super) fn add(s: &mut State, req: &OpRequest<'_>) -> Reply {
    if let Err(answer) = req.account_headers() {
        return answer;
    }
    if !req.body.iter().all(u8::is_ascii_whitespace) {
        return Reply::error(400, "This call takes query parameters, not a body");
    }
    let mut params: HashMap<String, String> = HashMap::new();
    for (k, v) in req.query_pairs() {
        if !PARCEL_REQUIRED.contains(&k.as_str()) && !PARCEL_OPTIONAL.contains(&k.as_str()) {
            return Reply::error(400, &format!("Unknown parameter: {k}"));
        }
        if params.insert(k.clone(), v).is_some() {
            return Reply::error(400, &format!("Parameter given twice: {k}"));
        }
    }
    if let Some(missing) = PARCEL_REQUIRED
        .iter()
        .find(|k| params.get(**k).is_none_or(|v| v.is_empty()))
    {
        return Reply::error(400, &format!("Missing required parameter: {missing}"));
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
        v => return Reply::error(400, &format!("Invalid dstatus: {v}; expected 0 or 1")),
    };
    let override_ = match flag("override").and_then(|o| flag("retry").map(|_| o)) {
        Ok(o) => o,
        Err(answer) => return answer,
    };
    if p("tp") != "Parcel" {
        return Reply::error(400, &format!("Invalid tp: {}; expected Parcel", p("tp")));
    }
    if !APP_IDS.contains(&p("appId")) {
        return Reply::error(400, &format!("Invalid appId: {}", p("appId")));
    }
    let Some(mac) = tape_key(p("tape_id")) else {
        return Reply::error(
            400,
            &format!(
                "Invalid tape_id: {}; expected a MAC address or a UUID",
                p("tape_id")
            ),
        );
    };
    if !req.is_account() {
        return Reply::error(404, "Customer not found");
    }
    let qr = p("qrcode");
    let devices = &mut s.ops.devices;
    let exists = devices.get(qr, &s.registry).is_some()
        || devices.holding_mac(&mac).is_some()
        || devices.get(&format!("TT{mac}"), &s.registry).is_some();
    if exists && !override_ {
        return Reply::json(
            409,
            &json!({"code": 409, "message": "Device already exists"}),
        );
    }
    // Override deletes and recreates: whatever held the QR code or the MAC goes.
    devices.by_qr.retain(|_, d| d.qrcode != qr && d.mac != mac);
    let mut device = Device::new(qr, &mac, status);
    device.customer_asset_id = params.get("abc").filter(|v| !v.is_empty()).cloned();
    if let Some(fw) = params.get("fw_version").filter(|v| !v.is_empty()) {
        device.firmware = fw.clone();
    }
    devices.insert(device);
    if status.is_active() {
        // From now on the service decodes this tape's packets.
        s.registry.register(&mac);
    }
    let (code, message) = if exists {
        (200, "Device recreated")
    } else {
        (201, "Device created")
    };
    Reply::json(code, &json!({"code": code, "message": message}))
}

/// The key of a `tape_id`: a MAC in plain form, or a UUID lower-cased.
fn tape_key(tape_id: &str) -> Option<String> {
    if let Ok(mac) = tape_id.parse::<Mac>() {
        return Some(mac.plain());
    }
    uuid::Uuid::parse_str(tape_id).ok().map(|u| u.to_string())
}
