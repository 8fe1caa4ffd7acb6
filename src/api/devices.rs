/*!
The operator's client ([`Operator`]): the device calls of spec 4.6 (add) and 4.7 (label,
relabel, show, deactivate, configure) with the rules DESIGN.md's "The operator
interface" lists, whoever calls it:

- every label/status/config request takes a slot of the shared rate window first
  ([`super::rate`]); a 429 anyway fills the window and the request waits and goes again;
- a QR code given twice is sent once; devices go 1-20 (label, relabel, show) or 1-100
  (deactivate, configure) a request; configure groups devices by their shared change;
- results are per device, by `error_code` (never by message); `ALREADY_IN_TARGET_STATE`
  of a deactivate is success; 207 and the label 400 carrying the 207 body are results;
- label is never repeated blindly: after a lost answer (timeout, 5xx, connection) the
  devices are looked up and only those not carrying the label sent go again; the other
  calls are safe to repeat and are retried with backoff;
- add-device's 409 says to use `--override`; a repeat after a lost answer sends
  `retry=1`.

The shapes the spec does not show are in `assumed.rs`; locate, history and messages are
files of their own.
*/

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::assumed::{self, ConfigChange, DeviceEntry, LabelRecord};
use super::rate::RateGate;
use super::{Account, Answer, ApiError, ServiceClient};
use crate::backoff::Backoff;
use crate::clock::now_ms;
use crate::config::OperatorSettings;
use crate::outbox::OutboxError;

/// Sends of one request at most (the first and the repeats after 429, 5xx or a lost
/// answer).
const MAX_ATTEMPTS: u32 = 6;
/// Sends of a read at most (a read is safe to repeat after a 5xx or a lost answer).
const READ_ATTEMPTS: u32 = 4;
/// First wait after a 5xx or a lost answer, doubling with full jitter...
const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// ...up to this.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A multi-device call.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceOp {
    Label { override_label: bool },
    Relabel,
    Show,
    Deactivate,
    Configure,
}

impl DeviceOp {
    /// Devices per request at most (spec 8).
    pub fn max_devices(&self) -> usize {
        match self {
            DeviceOp::Label { .. } | DeviceOp::Relabel | DeviceOp::Show => 20,
            DeviceOp::Deactivate | DeviceOp::Configure => 100,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            DeviceOp::Label { .. } => "label",
            DeviceOp::Relabel => "relabel",
            DeviceOp::Show => "show",
            DeviceOp::Deactivate => "deactivate",
            DeviceOp::Configure => "configure",
        }
    }

    /// Whether sending it twice can change more than sending it once.
    fn repeat_is_safe(&self) -> bool {
        !matches!(self, DeviceOp::Label { .. })
    }
}

/// What became of one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceOutcome {
    pub qrcode: String,
    pub ok: bool,
    /// The service's `error_code` (also `ALREADY_IN_TARGET_STATE`, which is success);
    /// ours, in capitals too, when no per-device code came (`VALIDATION_FAILED`,
    /// `REJECTED`, `NO_ANSWER`, `RATE_LIMITED`, `UNEXPECTED_ANSWER`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// A few words for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the lookup (`device show`) reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<LabelRecord>,
}

impl DeviceOutcome {
    fn ok(qrcode: &str) -> Self {
        DeviceOutcome {
            qrcode: qrcode.to_string(),
            ok: true,
            error_code: None,
            note: None,
            record: None,
        }
    }

    fn failed(qrcode: &str, code: &str, note: Option<String>) -> Self {
        DeviceOutcome {
            qrcode: qrcode.to_string(),
            ok: false,
            error_code: Some(code.to_string()),
            note,
            record: None,
        }
    }
}

/// The outcome of a multi-device call: one entry per distinct QR code, in the order
/// given.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceReport {
    pub operation: &'static str,
    pub devices: Vec<DeviceOutcome>,
    /// Requests sent (including the repeats).
    pub requests: u32,
}

impl DeviceReport {
    pub fn all_ok(&self) -> bool {
        self.devices.iter().all(|d| d.ok)
    }
}

/// `device add` (spec 4.6).
#[derive(Debug, Clone, Default)]
pub struct AddDevice {
    pub qrcode: String,
    /// MAC (as `mac_format` writes it) or UUID of the tape.
    pub tape_id: String,
    pub app_id: Option<String>,
    pub tape_type: Option<String>,
    /// `abc`: the customer asset identifier.
    pub asset: Option<String>,
    /// `abcd`.
    pub description: Option<String>,
    pub facility: Option<String>,
    pub override_existing: bool,
}

/// What add-device answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AddOutcome {
    pub qrcode: String,
    pub tape_id: String,
    pub status: u16,
    pub message: String,
    pub correlation_id: String,
}

/// Why an operator call failed as a whole (per-device failures are in the report).
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("the state database (it holds the service's shared rate window): {0}")]
    State(#[from] OutboxError),
    /// The input cannot be sent as it is (usage: exit 2).
    #[error("{0}")]
    Usage(String),
    /// The service refused the call; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// Spec 4.6 409: the device exists.
    #[error("{qrcode} already exists in the service ({message}); pass --override to delete and recreate its record (its label goes with it)")]
    Exists { qrcode: String, message: String },
}

/// The operator's client: the service client, the shared rate window, and the operator
/// settings of the environment.
pub struct Operator {
    pub(super) client: ServiceClient,
    gate: RateGate,
    pub(super) settings: OperatorSettings,
    gateway_id: String,
    /// Told each wait for a retry ("the service answered 503; trying again in 2 s").
    pub(super) on_retry: Box<dyn Fn(&str) + Send + Sync>,
}

/// Distinct QR codes, first occurrence kept, in the order given.
fn distinct(entries: Vec<DeviceEntry>) -> Vec<DeviceEntry> {
    let mut seen = HashSet::new();
    entries
        .into_iter()
        .filter(|e| seen.insert(e.qrcode.clone()))
        .collect()
}

/// Whether a failed request may have been applied without our hearing of it.
fn answer_lost(e: &ApiError) -> bool {
    matches!(e, ApiError::Transient { .. })
}

fn server_error(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT
}

impl Operator {
    pub fn new(
        client: ServiceClient,
        gate: RateGate,
        settings: OperatorSettings,
        gateway_id: String,
        on_retry: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Operator {
        Operator {
            client,
            gate,
            settings,
            gateway_id,
            on_retry,
        }
    }

    pub fn settings(&self) -> &OperatorSettings {
        &self.settings
    }

    pub(super) fn correlation_id(&self, what: &str) -> String {
        format!(
            "{}-{what}-{}-{:04x}",
            self.gateway_id,
            now_ms(),
            fastrand::u16(..)
        )
    }

    /// Waits the next backoff delay, telling the operator why.
    pub(super) async fn back_off(&self, backoff: &mut Backoff, why: &str) {
        let delay = backoff.next_delay(fastrand::f64(), None);
        (self.on_retry)(&format!(
            "{why}; trying again in {:.1} s",
            delay.as_secs_f64()
        ));
        tokio::time::sleep(delay).await;
    }

    /// A request that is safe to repeat (a read): sent again with backoff after a 5xx
    /// or a lost answer, [`READ_ATTEMPTS`] times at most. Returns the last answer (a
    /// 5xx only when every attempt got one).
    pub(super) async fn send_safe(
        &self,
        what: &str,
        method: Method,
        url: &url::Url,
        body: Option<Bytes>,
    ) -> Result<Answer, OperatorError> {
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let correlation_id = self.correlation_id(what);
            let answer = self
                .client
                .call(
                    method.clone(),
                    url,
                    Account::Headers,
                    &[],
                    body.clone(),
                    &correlation_id,
                )
                .await;
            let why = match answer {
                Ok(a) if server_error(a.status) && attempt < READ_ATTEMPTS => {
                    format!("the service answered {}", a.status.as_u16())
                }
                Ok(a) => return Ok(a),
                Err(e) if answer_lost(&e) && attempt < READ_ATTEMPTS => e.operator_cause(),
                Err(e) => return Err(e.into()),
            };
            self.back_off(&mut backoff, &format!("{what}: {why}")).await;
        }
    }

    /// One multi-device call over `entries`, split and repeated as the rules say.
    pub async fn devices(
        &self,
        op: DeviceOp,
        entries: Vec<DeviceEntry>,
    ) -> Result<DeviceReport, OperatorError> {
        let entries = distinct(entries);
        let mut report = DeviceReport {
            operation: op.name(),
            ..DeviceReport::default()
        };
        // Configure: one request carries one shared change, so devices are grouped by
        // theirs (a CSV may give each row its own).
        let mut groups: BTreeMap<String, (ConfigChange, Vec<DeviceEntry>)> = BTreeMap::new();
        let mut order = Vec::new();
        for e in entries {
            let change = match op {
                DeviceOp::Configure => ConfigChange {
                    firmware: e.firmware.clone(),
                    metadata: e.metadata.clone(),
                },
                _ => ConfigChange::default(),
            };
            let key = format!("{:?}|{:?}", change.firmware, change.metadata);
            if !groups.contains_key(&key) {
                order.push(key.clone());
            }
            groups.entry(key).or_insert((change, Vec::new())).1.push(e);
        }
        let mut outcomes: BTreeMap<String, DeviceOutcome> = BTreeMap::new();
        let wanted: Vec<String> = order
            .iter()
            .flat_map(|k| groups[k].1.iter().map(|e| e.qrcode.clone()))
            .collect();
        for key in order {
            let (change, group) = &groups[&key];
            for chunk in group.chunks(op.max_devices()) {
                for o in self.chunk(&op, change, chunk, &mut report.requests).await? {
                    outcomes.insert(o.qrcode.clone(), o);
                }
            }
        }
        report.devices = wanted
            .iter()
            .map(|q| {
                outcomes.remove(q).unwrap_or_else(|| {
                    DeviceOutcome::failed(q, "NO_ANSWER", Some("no result for it".into()))
                })
            })
            .collect();
        Ok(report)
    }

    /// One request's devices to the end: sent, repeated after 429, and (label) after a
    /// lost answer looked up and repeated only for those not labelled.
    async fn chunk(
        &self,
        op: &DeviceOp,
        change: &ConfigChange,
        devices: &[DeviceEntry],
        requests: &mut u32,
    ) -> Result<Vec<DeviceOutcome>, OperatorError> {
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        let mut remaining: Vec<DeviceEntry> = devices.to_vec();
        let mut done: Vec<DeviceOutcome> = Vec::new();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts > MAX_ATTEMPTS {
                let note = format!("no answer after {MAX_ATTEMPTS} attempts");
                done.extend(
                    remaining
                        .iter()
                        .map(|d| DeviceOutcome::failed(&d.qrcode, "NO_ANSWER", Some(note.clone()))),
                );
                return Ok(done);
            }
            self.gate.acquire().await?;
            *requests += 1;
            let sent = self.send_devices(op, change, &remaining).await;
            let lost = match sent {
                Ok(answer) if answer.status == StatusCode::TOO_MANY_REQUESTS => {
                    self.gate.refused()?;
                    (self.on_retry)(
                        "the service's rate window was full (429); waiting for the next",
                    );
                    continue;
                }
                Ok(answer) if server_error(answer.status) => {
                    format!("the service answered {}", answer.status.as_u16())
                }
                Ok(answer) => {
                    done.extend(outcomes(op, &remaining, &answer));
                    return Ok(done);
                }
                Err(e) if answer_lost(&e) => e.operator_cause(),
                Err(e) => return Err(e.into()),
            };
            if !op.repeat_is_safe() {
                // The label may have been applied: look before sending again.
                let looked = self.lookup(&remaining, requests).await?;
                let mut rest = Vec::new();
                for d in remaining {
                    match looked.get(&d.qrcode) {
                        Some(r) if carries_label(&d, Some(r)) => done.push(DeviceOutcome {
                            note: Some(
                                "labelled (the answer was lost; the lookup confirms it)".into(),
                            ),
                            ..DeviceOutcome::ok(&d.qrcode)
                        }),
                        Some(_) => rest.push(d),
                        // Not even the lookup answered: sending again could label twice.
                        None => done.push(DeviceOutcome::failed(
                            &d.qrcode,
                            "NO_ANSWER",
                            Some(
                                "the label may or may not be applied; check with `device show`"
                                    .into(),
                            ),
                        )),
                    }
                }
                remaining = rest;
                if remaining.is_empty() {
                    return Ok(done);
                }
            }
            self.back_off(&mut backoff, &format!("{}: {lost}", op.name()))
                .await;
        }
    }

    /// The lookup of `devices` (GET label), by QR code.
    async fn lookup(
        &self,
        devices: &[DeviceEntry],
        requests: &mut u32,
    ) -> Result<BTreeMap<String, LabelRecord>, OperatorError> {
        let mut out = BTreeMap::new();
        for chunk in devices.chunks(DeviceOp::Show.max_devices()) {
            let found =
                Box::pin(self.chunk(&DeviceOp::Show, &ConfigChange::default(), chunk, requests))
                    .await?;
            for o in found {
                if let Some(r) = o.record {
                    out.insert(o.qrcode, r);
                }
            }
        }
        Ok(out)
    }

    async fn send_devices(
        &self,
        op: &DeviceOp,
        change: &ConfigChange,
        devices: &[DeviceEntry],
    ) -> Result<Answer, ApiError> {
        let label = ["external", "v1", "devices", "label"];
        let (method, path, body): (Method, &[&str], Option<Value>) = match op {
            DeviceOp::Label { override_label } => (
                Method::POST,
                &label,
                Some(assumed::label_body(devices, *override_label)),
            ),
            DeviceOp::Relabel => (Method::PUT, &label, Some(assumed::relabel_body(devices))),
            DeviceOp::Show => (Method::GET, &label, None),
            DeviceOp::Deactivate => (
                Method::POST,
                &["external", "v1", "devices", "status"],
                Some(assumed::status_body(devices)),
            ),
            DeviceOp::Configure => (
                Method::POST,
                &["external", "v1", "devices", "config"],
                Some(assumed::config_body(change, devices)),
            ),
        };
        let mut url = self.client.url(path)?;
        if *op == DeviceOp::Show {
            url.query_pairs_mut()
                .extend_pairs(assumed::show_query(devices));
        }
        let body = body
            .map(|b| serde_json::to_vec(&b).map(Bytes::from))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        let correlation_id = self.correlation_id(op.name());
        let answer = self
            .client
            .call(method, &url, Account::Token, &[], body, &correlation_id)
            .await;
        match &answer {
            Ok(a) => tracing::debug!(
                correlation_id,
                devices = devices.len(),
                status = a.status.as_u16(),
                "{} answered",
                op.name()
            ),
            Err(e) => {
                tracing::debug!(correlation_id, devices = devices.len(), cause = %e.operator_cause(), "{} failed", op.name())
            }
        }
        answer
    }

    /// `device add` (spec 4.6): query parameters, no body, the account headers.
    pub async fn add_device(&self, add: &AddDevice) -> Result<AddOutcome, OperatorError> {
        let app_id = add
            .app_id
            .clone()
            .or_else(|| self.settings.default_app_id.clone())
            .ok_or_else(|| {
                OperatorError::Usage(
                    "no application id: pass --app-id or set default_app_id in [service.environments.<name>]".into(),
                )
            })?;
        let tape_type = add
            .tape_type
            .clone()
            .unwrap_or_else(|| self.settings.default_tape_type.clone());
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        let correlation_id = self.correlation_id("add");
        let mut lost_before = false;
        for _ in 0..MAX_ATTEMPTS {
            let mut url = self.client.url(&["devices", "v1", "parcel"])?;
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("qrcode", &add.qrcode)
                    .append_pair("tape_id", &add.tape_id)
                    .append_pair("appId", &app_id)
                    .append_pair("dstatus", "1")
                    .append_pair("tt", &tape_type)
                    .append_pair("tp", "Parcel");
                if let Some(a) = &add.asset {
                    q.append_pair("abc", a);
                }
                if let Some(d) = &add.description {
                    q.append_pair("abcd", d);
                }
                if add.override_existing {
                    q.append_pair("override", "1");
                }
                if lost_before {
                    q.append_pair("retry", "1");
                }
            }
            let mut headers = vec![("X-Correlation-Id", correlation_id.clone())];
            if let Some(f) = &add.facility {
                headers.push(("facility_id", f.clone()));
            }
            let answer = self
                .client
                .call(
                    Method::POST,
                    &url,
                    Account::Headers,
                    &headers,
                    None,
                    &correlation_id,
                )
                .await;
            let outcome = |a: &Answer| AddOutcome {
                qrcode: add.qrcode.clone(),
                tape_id: add.tape_id.clone(),
                status: a.status.as_u16(),
                message: body_message(a),
                correlation_id: correlation_id.clone(),
            };
            let why = match answer {
                Ok(a) if a.status.is_success() => return Ok(outcome(&a)),
                Ok(a) if a.status == StatusCode::CONFLICT && lost_before => {
                    // Our own earlier request, whose answer was lost, created it.
                    let mut o = outcome(&a);
                    o.message = format!(
                        "{} (created by the earlier request, whose answer was lost)",
                        o.message
                    );
                    return Ok(o);
                }
                Ok(a) if a.status == StatusCode::CONFLICT => {
                    return Err(OperatorError::Exists {
                        qrcode: add.qrcode.clone(),
                        message: a.message,
                    })
                }
                Ok(a) if server_error(a.status) => {
                    lost_before = true;
                    format!("the service answered {}", a.status.as_u16())
                }
                Ok(a) => {
                    return Err(OperatorError::Refused(format!(
                        "the service refused to add {} (HTTP {}): {}",
                        add.qrcode,
                        a.status.as_u16(),
                        a.message
                    )))
                }
                Err(e) if answer_lost(&e) => {
                    lost_before = true;
                    e.operator_cause()
                }
                Err(e) => return Err(e.into()),
            };
            self.back_off(&mut backoff, &format!("add {}: {why}", add.qrcode))
                .await;
        }
        Err(OperatorError::Refused(format!(
            "no answer to adding {} after {MAX_ATTEMPTS} attempts",
            add.qrcode
        )))
    }
}

/// `message` of a success body (`{code, message}`), or empty.
fn body_message(a: &Answer) -> String {
    if !a.message.is_empty() {
        return a.message.clone();
    }
    serde_json::from_slice::<Value>(&a.body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// Whether the lookup shows `d` labelled as we asked.
fn carries_label(d: &DeviceEntry, record: Option<&LabelRecord>) -> bool {
    let Some(label) = record.and_then(|r| r.label.as_ref()) else {
        return false;
    };
    label.asset_barcode == d.asset_barcode
        && (d.application_id.is_none() || label.application_id == d.application_id)
}

/// The per-device outcomes of an answer (not 429, not 5xx).
fn outcomes(op: &DeviceOp, devices: &[DeviceEntry], answer: &Answer) -> Vec<DeviceOutcome> {
    let status = answer.status;
    let all = |code: &str, note: String| -> Vec<DeviceOutcome> {
        devices
            .iter()
            .map(|d| DeviceOutcome::failed(&d.qrcode, code, Some(note.clone())))
            .collect()
    };
    let results = match status.as_u16() {
        200 | 207 | 400 => assumed::parse_results(&answer.body),
        _ => None,
    };
    let Some(results) = results else {
        return match status.as_u16() {
            400 if answer.message.starts_with("Validation failed") => {
                all("VALIDATION_FAILED", answer.message.clone())
            }
            400 => all("REJECTED", answer.message.clone()),
            200 | 207 => all(
                "UNEXPECTED_ANSWER",
                "the answer is not the per-device result of spec 2.5".into(),
            ),
            s => all("UNEXPECTED_ANSWER", format!("HTTP {s}: {}", answer.message)),
        };
    };
    let errors: BTreeMap<&str, &str> = results
        .errors
        .iter()
        .map(|(q, c)| (q.as_str(), c.as_str()))
        .collect();
    let mut records: BTreeMap<String, LabelRecord> = BTreeMap::new();
    if *op == DeviceOp::Show {
        for r in assumed::parse_lookup(&answer.body).unwrap_or_default() {
            records.entry(r.qrcode.clone()).or_insert(r);
        }
    }
    devices
        .iter()
        .map(|d| {
            let mut o = match errors.get(d.qrcode.as_str()) {
                None => DeviceOutcome::ok(&d.qrcode),
                // Spec 3: deactivating a deactivated device is success.
                Some(&"ALREADY_IN_TARGET_STATE") if *op == DeviceOp::Deactivate => DeviceOutcome {
                    error_code: Some("ALREADY_IN_TARGET_STATE".into()),
                    note: Some("already deactivated".into()),
                    ..DeviceOutcome::ok(&d.qrcode)
                },
                Some(code) => DeviceOutcome::failed(&d.qrcode, code, None),
            };
            o.record = records.remove(&d.qrcode);
            o
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(q: &str) -> DeviceEntry {
        DeviceEntry {
            qrcode: q.into(),
            ..DeviceEntry::default()
        }
    }

    #[test]
    fn a_qr_code_given_twice_is_kept_once_in_the_order_given() {
        let got: Vec<String> = distinct(vec![entry("B"), entry("A"), entry("B")])
            .into_iter()
            .map(|e| e.qrcode)
            .collect();
        assert_eq!(got, ["B", "A"]);
    }

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            retry_after: None,
            body: Bytes::from(body.to_string()),
            message: String::new(),
        }
    }

    #[test]
    fn already_in_target_state_is_success_for_deactivate_only() {
        let body = r#"{"errors":[{"qrcode":"A","error_code":"ALREADY_IN_TARGET_STATE"}],"successful":1,"failed":1}"#;
        let ds = [entry("A"), entry("B")];
        let got = outcomes(&DeviceOp::Deactivate, &ds, &answer(207, body));
        assert!(got.iter().all(|o| o.ok), "{got:?}");
        let got = outcomes(&DeviceOp::Configure, &ds, &answer(207, body));
        assert_eq!(
            (got[0].ok, got[0].error_code.as_deref(), got[1].ok),
            (false, Some("ALREADY_IN_TARGET_STATE"), true)
        );
    }

    #[test]
    fn the_label_400_with_the_207_body_is_a_per_device_result() {
        let body = r#"{"errors":[{"qrcode":"A","error_code":"QRMAC_NOT_FOUND"}],"successful":0,"failed":1}"#;
        let got = outcomes(
            &DeviceOp::Label {
                override_label: false,
            },
            &[entry("A")],
            &answer(400, body),
        );
        assert_eq!(got[0].error_code.as_deref(), Some("QRMAC_NOT_FOUND"));
    }

    #[test]
    fn a_label_counts_as_applied_only_when_the_lookup_shows_it() {
        let d = DeviceEntry {
            asset_barcode: Some("AWB-1".into()),
            application_id: Some("app".into()),
            ..entry("A")
        };
        let mut r = LabelRecord {
            qrcode: "A".into(),
            ..LabelRecord::default()
        };
        assert!(!carries_label(&d, Some(&r)));
        r.label = Some(assumed::LabelDevice {
            asset_barcode: Some("AWB-1".into()),
            application_id: Some("app".into()),
            shipment: None,
        });
        assert!(carries_label(&d, Some(&r)));
        r.label.as_mut().unwrap().asset_barcode = Some("AWB-2".into());
        assert!(!carries_label(&d, Some(&r)));
    }
}
