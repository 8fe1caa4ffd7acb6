/*!
The rules of a multi-device body (spec 4.7, 8, 7): the fields each call takes and their
types, 1-20 or 1-100 devices, no QR code twice, application ids the operator issued,
"something to change"; a broken rule changes nothing and gets 400 `Validation failed`
with its `errors`. Also the per-device result of spec 2.5 and its status (200, or 207
when any device failed). It touches the request, the config's application ids and the
readings (how QR codes are keyed).
*/

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::config::APP_IDS;
use super::readings::Readings;
use super::request::{validation_failed, OpRequest, Reply};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
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
pub(crate) type Rule = (&'static str, Kind, bool);

/// Collects the `{field, message}` items of a validation failure.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub Vec<Value>);

impl Problems {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0
            .push(json!({"field": field, "message": message.into()}));
    }

    /// `Ok` when nothing was found, else the 400 `Validation failed` answer.
    pub fn verdict(self) -> Result<(), Reply> {
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
pub(crate) struct Batch {
    pub top: Map<String, Value>,
    pub devices: Vec<Map<String, Value>>,
}

impl Batch {
    /// The devices' QR codes as the service keys and echoes them.
    pub fn qrcodes(&self, readings: &Readings) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| readings.qr_key(str_field(d, "qrcode")))
            .collect()
    }
}

pub(crate) fn str_field<'a>(obj: &'a Map<String, Value>, name: &str) -> &'a str {
    obj.get(name).and_then(Value::as_str).unwrap_or_default()
}

/// Parses and checks a multi-device body; the 400 answer if any rule is broken.
pub(crate) fn parse_batch(
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
pub(crate) fn check_app_ids(batch: &Batch) -> Result<(), Reply> {
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
pub(crate) type Outcomes = Vec<(String, Option<&'static str>)>;

/// The partial-success body of spec 2.5.
pub(crate) fn result_body(outcomes: &Outcomes) -> Value {
    let errors: Vec<Value> = outcomes
        .iter()
        .filter_map(|(qr, e)| e.map(|code| json!({"qrcode": qr, "error_code": code})))
        .collect();
    let failed = errors.len();
    json!({"errors": errors, "successful": outcomes.len() - failed, "failed": failed})
}

/// 200 when every device succeeded, 207 otherwise (spec section 7).
pub(crate) fn multi_status(outcomes: &Outcomes) -> u16 {
    if outcomes.iter().all(|(_, e)| e.is_none()) {
        200
    } else {
        207
    }
}

/// Refuses a body in which no device (nor the shared `top` fields) changes anything.
pub(crate) fn require_a_change(
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
