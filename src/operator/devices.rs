/*!
The operator's client ([`Operator`]): the device calls of spec 4.6 (add) and 4.7 (label,
relabel, show, deactivate, configure) with the rules DESIGN.md's "The operator
interface" lists, whoever calls it:

- every call goes through the one send of `send.rs` with its declared retry policy:
  429 (with `Retry-After`), 5xx and lost answers are retried where that is safe, and
  every label/status/config request takes a slot of the shared rate window
  ([`super::rate`]);
- a QR code given twice is sent once; devices go 1-20 (label, relabel, show) or 1-100
  (deactivate, configure) a request; configure groups devices by their shared change;
- results are per device, by `error_code` (never by message), matched to the devices
  sent by QR code as sent or as the service normalised it, and only when `successful`
  and `failed` agree with what was matched (otherwise the devices are reported
  unconfirmed); `ALREADY_IN_TARGET_STATE` of a deactivate is success;
- label is never repeated blindly: after a lost answer the devices are looked up and
  only those without any label (or, with override, without ours) go again; a device the
  lookup cannot speak for is reported "unknown whether applied", never sent again;
- add-device: a failure before anything reached the service (no token, DNS, refused
  connection, TLS) is simply retried; only a request that may have reached it is
  repeated with `retry=1`, and a 409 then is confirmed by a lookup (the QR code carries
  our tape id) or reported as "exists, maybe ours", never as a plain success;
- a run that stops part-way (an error no retry fixes, no answer, an interrupt) still
  reports every device: those done, and those not sent.

The shapes the spec does not show are in `assumed.rs`; locate, history and messages are
files of their own.
*/

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::assumed::{self, ConfigChange, DeviceEntry, LabelRecord, LabelState};
use super::rate::RateGate;
use super::send::{Call, Interrupt, Policy, Sent};
use crate::api::{Account, Answer, ApiError, ServiceClient};
use crate::clock::now_ms;
use crate::config::OperatorSettings;
use crate::outbox::OutboxError;
use crate::record::Mac;

/// Rounds of a label chunk at most: the first, and the repeats for the devices the
/// lookup showed unlabelled after a lost answer.
const LABEL_ROUNDS: u32 = 3;
/// Longest QR code, asset id or other identifier sent (characters).
pub const MAX_ID_CHARS: usize = 256;

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

    fn policy(&self) -> Policy {
        match self {
            DeviceOp::Label { .. } => Policy::LABEL,
            _ => Policy::DEVICES_IDEMPOTENT,
        }
    }
}

/// What became of one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceOutcome {
    pub qrcode: String,
    pub ok: bool,
    /// The service's `error_code` (also `ALREADY_IN_TARGET_STATE`, which is success);
    /// ours, in capitals too, when no per-device code came: `VALIDATION_FAILED`,
    /// `REJECTED`, `UNEXPECTED_ANSWER`, `UNCONFIRMED` (the answer's counts disagree with
    /// the results it names), `NO_ANSWER` (may or may not be applied),
    /// `UNKNOWN_IF_APPLIED`, `LABEL_UNREADABLE`, `NOT_SENT` (the run stopped first),
    /// `REFUSED` (the run's error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// A few words for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
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
            hint: None,
            record: None,
        }
    }

    fn failed(qrcode: &str, code: &str, note: Option<String>) -> Self {
        DeviceOutcome {
            qrcode: qrcode.to_string(),
            ok: false,
            error_code: Some(code.to_string()),
            note,
            hint: None,
            record: None,
        }
    }

    fn with_hint(mut self, op: &DeviceOp) -> Self {
        self.hint = self.error_code.as_deref().and_then(|c| hint(op, c));
        self
    }
}

/// What to do about a per-device error code.
pub fn hint(op: &DeviceOp, code: &str) -> Option<String> {
    let h = match (code, op) {
        ("ALREADY_LABELLED", _) => {
            "it has a label already: `device show` shows it; `device label --override` replaces it (its status stays as it is)"
        }
        ("INVALID_TRANSITION", _) => {
            "only ACTIVATED, FORCE_ACTIVATED and ACTIVE_WITH_NO_ALERTS devices can be deactivated: `device show` shows its status"
        }
        ("QRMAC_NOT_FOUND", _) => {
            "the service does not know this QR code: check it, or activate the tape with `device add`"
        }
        ("DEVICE_NOT_FOUND", DeviceOp::Relabel) => {
            "it has no label in this account: `device label` creates one"
        }
        ("DEVICE_NOT_FOUND", _) => {
            "the service does not know this QR code in this account (a tape needs a label first)"
        }
        ("VALIDATION_FAILED", _) => "the service refused the request as a whole; nothing was changed",
        ("UNCONFIRMED" | "NO_ANSWER" | "UNKNOWN_IF_APPLIED", _) => {
            "check with `device show` before sending it again"
        }
        ("NOT_SENT", _) => "run the command again for the devices not sent",
        _ => return None,
    };
    Some(h.to_string())
}

/// The outcome of a multi-device call: one entry per distinct QR code, in the order
/// given.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceReport {
    pub operation: &'static str,
    pub devices: Vec<DeviceOutcome>,
    /// Requests sent (the repeats and the lookups included).
    pub requests: u32,
    /// Why the run stopped before its end, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Stopped by an interrupt (Ctrl-C).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl DeviceReport {
    pub fn all_ok(&self) -> bool {
        self.devices.iter().all(|d| d.ok)
    }
}

/// A multi-device run: the report (always complete: every device has an outcome), and
/// the error that stopped it early, if one did.
#[derive(Debug)]
pub struct DeviceRun {
    pub report: DeviceReport,
    pub error: Option<OperatorError>,
}

/// Where a multi-device run is, told after each request's devices are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub ok: usize,
    pub requests: u32,
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

/// What became of one add.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AddOutcome {
    pub qrcode: String,
    pub tape_id: String,
    pub ok: bool,
    /// The HTTP status of the last answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The service's message.
    pub message: String,
    /// `EXISTS` (409), `EXISTS_MAYBE_OURS` (409 after a lost answer, not confirmed),
    /// `REFUSED` (another 4xx).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
    /// The service refused the call, or did not answer; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// Stopped by an interrupt (Ctrl-C) before the end.
    #[error("interrupted: {0}")]
    Interrupted(String),
}

impl OperatorError {
    /// The code a device this error stopped is reported with.
    fn code(&self) -> &'static str {
        match self {
            OperatorError::Interrupted(_) => "NOT_SENT",
            _ => "REFUSED",
        }
    }
}

/// The operator's client: the service client, the shared rate window, and the operator
/// settings of the environment.
pub struct Operator {
    pub(super) client: ServiceClient,
    pub(super) gate: RateGate,
    pub(super) settings: OperatorSettings,
    gateway_id: String,
    /// Told each wait for a retry ("the service answered 503; trying again in 2 s").
    pub(super) on_retry: Box<dyn Fn(&str) + Send + Sync>,
    /// Told after each request of a multi-device run.
    on_progress: Box<dyn Fn(&Progress) + Send + Sync>,
    pub(super) interrupt: Interrupt,
    /// Requests sent so far (every attempt).
    pub(super) sent: AtomicU32,
}

/// Distinct QR codes, first occurrence kept, in the order given.
fn distinct(entries: Vec<DeviceEntry>) -> Vec<DeviceEntry> {
    let mut seen = HashSet::new();
    entries
        .into_iter()
        .filter(|e| seen.insert(e.qrcode.clone()))
        .collect()
}

/// Checks an identifier that goes to the service (a QR code, an asset id, an AWB) as
/// the person gave it: never sent changed, so refused here when it cannot be meant
/// (empty, space around it, a control or invisible character, `.` or `..`, longer than
/// [`MAX_ID_CHARS`]). The error names the value, made safe to show.
pub fn check_id(kind: &str, value: &str) -> Result<(), String> {
    let shown = || crate::text::shown(value, 40);
    if value.is_empty() {
        return Err(format!("{kind} is empty"));
    }
    if value.chars().count() > MAX_ID_CHARS {
        return Err(format!(
            "{kind} {} is {} characters long; at most {MAX_ID_CHARS} are taken",
            shown(),
            value.chars().count()
        ));
    }
    if matches!(crate::text::inert(value), std::borrow::Cow::Owned(_)) {
        return Err(format!(
            "{kind} {} holds a control or invisible character",
            shown()
        ));
    }
    if value.trim() != value {
        return Err(format!("{kind} {:?} has space around it", shown()));
    }
    if value == "." || value == ".." {
        return Err(format!("{kind} cannot be {value:?}"));
    }
    Ok(())
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
            on_progress: Box::new(|_| {}),
            interrupt: Interrupt::default(),
            sent: AtomicU32::new(0),
        }
    }

    /// This client, stopped by `interrupt`.
    pub fn with_interrupt(self, interrupt: Interrupt) -> Operator {
        Operator { interrupt, ..self }
    }

    /// This client, telling `on_progress` after each request of a multi-device run.
    pub fn with_progress(self, on_progress: Box<dyn Fn(&Progress) + Send + Sync>) -> Operator {
        Operator {
            on_progress,
            ..self
        }
    }

    pub fn settings(&self) -> &OperatorSettings {
        &self.settings
    }

    /// The shared rate window.
    pub fn gate(&self) -> &RateGate {
        &self.gate
    }

    pub(super) fn correlation_id(&self, what: &str) -> String {
        format!(
            "{}-{what}-{}-{:04x}",
            self.gateway_id,
            now_ms(),
            fastrand::u16(..)
        )
    }

    fn requests(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }

    /// One multi-device call over `entries`, split and repeated as the rules say. The
    /// report holds every device; a run that stopped early says why in `error`.
    pub async fn devices(&self, op: DeviceOp, entries: Vec<DeviceEntry>) -> DeviceRun {
        let entries = distinct(entries);
        let first_request = self.requests();
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
        let wanted: Vec<String> = order
            .iter()
            .flat_map(|k| groups[k].1.iter().map(|e| e.qrcode.clone()))
            .collect();
        let mut outcomes: HashMap<String, DeviceOutcome> = HashMap::new();
        let mut error = None;
        'run: for key in &order {
            let (change, group) = &groups[key];
            for chunk in group.chunks(op.max_devices()) {
                if self.interrupt.is_stopped() {
                    error = Some(OperatorError::Interrupted("nothing more was sent".into()));
                    break 'run;
                }
                let end = self.chunk(&op, change, chunk).await;
                for o in end.outcomes {
                    outcomes.insert(o.qrcode.clone(), o);
                }
                (self.on_progress)(&Progress {
                    done: outcomes.len(),
                    total: wanted.len(),
                    ok: outcomes.values().filter(|o| o.ok).count(),
                    requests: self.requests() - first_request,
                });
                if end.stop.is_some() {
                    error = end.stop;
                    break 'run;
                }
            }
        }
        let not_sent = |q: &str| {
            let why = match &error {
                Some(OperatorError::Interrupted(_)) => "interrupted before it was sent".to_string(),
                Some(e) => format!("not sent: the run stopped ({e})"),
                None => "no result for it".to_string(),
            };
            DeviceOutcome::failed(q, "NOT_SENT", Some(why)).with_hint(&op)
        };
        report.devices = wanted
            .iter()
            .map(|q| outcomes.remove(q).unwrap_or_else(|| not_sent(q)))
            .collect();
        report.requests = self.requests() - first_request;
        report.error = error.as_ref().map(ToString::to_string);
        report.interrupted = matches!(error, Some(OperatorError::Interrupted(_)));
        DeviceRun { report, error }
    }

    /// One request's devices to the end: sent under the call's policy, and (label)
    /// after a lost answer looked up and repeated only for those without the label.
    async fn chunk(
        &self,
        op: &DeviceOp,
        change: &ConfigChange,
        devices: &[DeviceEntry],
    ) -> ChunkEnd {
        let mut remaining: Vec<DeviceEntry> = devices.to_vec();
        let mut end = ChunkEnd::default();
        for _ in 0..LABEL_ROUNDS {
            let call = match self.devices_call(op, change, &remaining) {
                Ok(c) => c,
                Err(e) => return end.stopped(op, &remaining, e.into()),
            };
            let lost_cause = match self.send(op.policy(), &call).await {
                Err(e) => return end.stopped(op, &remaining, e),
                Ok(Sent::Answered { answer, .. }) => {
                    end.outcomes.extend(outcomes(op, &remaining, &answer));
                    return end;
                }
                Ok(Sent::NoAnswer { cause, lost_before }) => {
                    let note = if lost_before {
                        format!("no answer ({cause}); it may or may not have been applied")
                    } else {
                        format!("no answer ({cause}); not applied")
                    };
                    let code = if lost_before { "NO_ANSWER" } else { "NOT_SENT" };
                    end.outcomes.extend(remaining.iter().map(|d| {
                        DeviceOutcome::failed(&d.qrcode, code, Some(note.clone())).with_hint(op)
                    }));
                    end.stop = Some(OperatorError::Refused(format!(
                        "{}: the service did not answer: {cause}",
                        op.name()
                    )));
                    return end;
                }
                Ok(Sent::Interrupted {
                    in_flight,
                    lost_before,
                }) => {
                    let (code, note) = if in_flight || lost_before {
                        (
                            "UNKNOWN_IF_APPLIED",
                            "interrupted while its request was on its way: it may or may not have been applied",
                        )
                    } else {
                        ("NOT_SENT", "interrupted before it was sent")
                    };
                    end.outcomes.extend(remaining.iter().map(|d| {
                        DeviceOutcome::failed(&d.qrcode, code, Some(note.into())).with_hint(op)
                    }));
                    end.stop = Some(OperatorError::Interrupted(format!("{} stopped", op.name())));
                    return end;
                }
                Ok(Sent::Lost { cause }) => cause,
            };
            // A label whose answer was lost may have been applied: look before sending
            // again, and send again only what the lookup shows unlabelled.
            let override_label = matches!(
                op,
                DeviceOp::Label {
                    override_label: true
                }
            );
            let looked = match self.lookup(&remaining).await {
                Ok(records) => records,
                Err(e) => {
                    let note = format!(
                        "the answer was lost ({lost_cause}) and the lookup failed: it may or may not be labelled"
                    );
                    end.outcomes.extend(remaining.iter().map(|d| {
                        DeviceOutcome::failed(&d.qrcode, "UNKNOWN_IF_APPLIED", Some(note.clone()))
                            .with_hint(op)
                    }));
                    end.stop = Some(e);
                    return end;
                }
            };
            let mut again = Vec::new();
            for (d, record) in remaining.into_iter().zip(looked) {
                match judge_label(&d, record.as_ref(), override_label) {
                    Judged::Applied => end.outcomes.push(DeviceOutcome {
                        note: Some("labelled (the answer was lost; the lookup confirms it)".into()),
                        ..DeviceOutcome::ok(&d.qrcode)
                    }),
                    Judged::NotApplied => again.push(d),
                    Judged::Other(asset) => end.outcomes.push(
                        DeviceOutcome::failed(
                            &d.qrcode,
                            "ALREADY_LABELLED",
                            Some(format!(
                                "carries another label (asset {}), not the one sent",
                                crate::text::shown(&asset, 60)
                            )),
                        )
                        .with_hint(op),
                    ),
                    Judged::Unknown => end.outcomes.push(
                        DeviceOutcome::failed(
                            &d.qrcode,
                            "UNKNOWN_IF_APPLIED",
                            Some(format!(
                                "the answer was lost ({lost_cause}) and the lookup cannot say whether it is labelled; not sent again (that could label it twice)"
                            )),
                        )
                        .with_hint(op),
                    ),
                }
            }
            if again.is_empty() {
                return end;
            }
            (self.on_retry)(&format!(
                "label: the answer was lost ({lost_cause}); the lookup shows {} device(s) without the label: sending them again",
                again.len()
            ));
            remaining = again;
        }
        let note = format!("answers lost {LABEL_ROUNDS} times");
        end.outcomes.extend(remaining.iter().map(|d| {
            DeviceOutcome::failed(&d.qrcode, "UNKNOWN_IF_APPLIED", Some(note.clone())).with_hint(op)
        }));
        end
    }

    /// The lookup (GET label) of `devices`: for each, its record when the answer had a
    /// readable entry for it.
    async fn lookup(
        &self,
        devices: &[DeviceEntry],
    ) -> Result<Vec<Option<LabelRecord>>, OperatorError> {
        let mut out = Vec::with_capacity(devices.len());
        for chunk in devices.chunks(DeviceOp::Show.max_devices()) {
            let call = self.devices_call(&DeviceOp::Show, &ConfigChange::default(), chunk)?;
            match self.send(Policy::DEVICES_IDEMPOTENT, &call).await? {
                Sent::Answered { answer, .. } if answer.status.is_success() => {
                    out.extend(records(chunk, &answer));
                }
                Sent::Answered { answer, .. } => {
                    return Err(OperatorError::Refused(format!(
                        "the lookup was refused (HTTP {}): {}",
                        answer.status.as_u16(),
                        answer.message
                    )))
                }
                Sent::NoAnswer { cause, .. } | Sent::Lost { cause } => {
                    return Err(OperatorError::Refused(format!(
                        "the lookup did not answer: {cause}"
                    )))
                }
                Sent::Interrupted { .. } => {
                    return Err(OperatorError::Interrupted("during the lookup".into()))
                }
            }
        }
        Ok(out)
    }

    /// The request of a multi-device call.
    fn devices_call(
        &self,
        op: &DeviceOp,
        change: &ConfigChange,
        devices: &[DeviceEntry],
    ) -> Result<Call, ApiError> {
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
        Ok(Call {
            what: op.name().to_string(),
            method,
            url,
            account: Account::Token,
            headers: Vec::new(),
            body,
            correlation_id: self.correlation_id(op.name()),
        })
    }

    /// `device add` (spec 4.6): query parameters, no body, the account headers. `Ok`
    /// with `ok: false` when the service refused this tape (the next may go); `Err`
    /// when nothing more should be sent (credentials, no answer, an interrupt).
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
        let correlation_id = self.correlation_id("add");
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
        }
        let mut headers = vec![("X-Correlation-Id", correlation_id.clone())];
        if let Some(f) = &add.facility {
            headers.push(("facility_id", f.clone()));
        }
        let call = Call {
            what: format!("add {}", crate::text::shown(&add.qrcode, 40)),
            method: Method::POST,
            url,
            account: Account::Headers,
            headers,
            body: None,
            correlation_id: correlation_id.clone(),
        };
        let outcome = |ok: bool, a: &Answer| AddOutcome {
            qrcode: add.qrcode.clone(),
            tape_id: add.tape_id.clone(),
            ok,
            status: Some(a.status.as_u16()),
            message: body_message(a),
            error_code: None,
            note: None,
            correlation_id: correlation_id.clone(),
        };
        let shown_qr = crate::text::shown(&add.qrcode, 40);
        let (answer, lost_before) = match self.send(Policy::ADD, &call).await? {
            Sent::Answered {
                answer,
                lost_before,
            } => (answer, lost_before),
            Sent::NoAnswer { cause, lost_before } => {
                let maybe = if lost_before {
                    format!("; it may or may not have been added: check with `device show --qr {shown_qr}`")
                } else {
                    "; it was not added".to_string()
                };
                return Err(OperatorError::Refused(format!(
                    "no answer to adding {shown_qr}: {cause}{maybe}"
                )));
            }
            Sent::Lost { cause } => {
                return Err(OperatorError::Refused(format!(
                    "no answer to adding {shown_qr}: {cause}; it may or may not have been added: check with `device show --qr {shown_qr}`"
                )))
            }
            Sent::Interrupted {
                in_flight,
                lost_before,
            } => {
                let maybe = if in_flight || lost_before {
                    format!("{shown_qr} may or may not have been added: check with `device show --qr {shown_qr}`")
                } else {
                    format!("{shown_qr} was not added")
                };
                return Err(OperatorError::Interrupted(maybe));
            }
        };
        if answer.status.is_success() {
            let mut o = outcome(true, &answer);
            if lost_before {
                o.note = Some("an earlier attempt's answer was lost; this one was answered".into());
            }
            return Ok(o);
        }
        if answer.status != StatusCode::CONFLICT {
            return Ok(AddOutcome {
                error_code: Some("REFUSED".into()),
                note: Some(format!(
                    "the service refused to add it (HTTP {})",
                    answer.status.as_u16()
                )),
                ..outcome(false, &answer)
            });
        }
        let exists = |code: &str, note: String| AddOutcome {
            error_code: Some(code.into()),
            note: Some(note),
            ..outcome(false, &answer)
        };
        if !lost_before {
            return Ok(exists(
                "EXISTS",
                "it exists in the service already; `--override` deletes and recreates its record (its label goes with it)".into(),
            ));
        }
        // 409 after an attempt that may have been applied: ours, or someone's before?
        // The lookup says whether the QR code carries the tape id sent.
        let records = match self
            .lookup(&[DeviceEntry {
                qrcode: add.qrcode.clone(),
                ..DeviceEntry::default()
            }])
            .await
        {
            Ok(r) => r,
            Err(OperatorError::Interrupted(_)) => {
                return Ok(exists(
                    "EXISTS_MAYBE_OURS",
                    "it exists; the earlier attempt, whose answer was lost, may have created it (interrupted before the lookup): check with `device show`".into(),
                ))
            }
            Err(e @ (OperatorError::Api(_) | OperatorError::State(_))) => return Err(e),
            Err(e) => {
                return Ok(exists(
                    "EXISTS_MAYBE_OURS",
                    format!("it exists; the earlier attempt, whose answer was lost, may have created it ({e}): check with `device show`"),
                ))
            }
        };
        let held = records
            .into_iter()
            .next()
            .flatten()
            .and_then(|r| r.mac)
            .filter(|m| !m.is_empty());
        Ok(match held {
            Some(mac) if same_tape(&mac, &add.tape_id) => AddOutcome {
                note: Some(
                    "it exists with the tape id sent: created by the earlier attempt, whose answer was lost (or added so before)".into(),
                ),
                ..outcome(true, &answer)
            },
            Some(mac) => exists(
                "EXISTS",
                format!(
                    "it exists with another tape id ({}), not the one sent; `--override` deletes and recreates its record",
                    crate::text::shown(&mac, 40)
                ),
            ),
            None => exists(
                "EXISTS_MAYBE_OURS",
                "it exists; the earlier attempt, whose answer was lost, may have created it, and the lookup does not show its tape id: check with `device show`".into(),
            ),
        })
    }
}

/// How a chunk ended: its devices' outcomes, and the error that stops the run.
#[derive(Default)]
struct ChunkEnd {
    outcomes: Vec<DeviceOutcome>,
    stop: Option<OperatorError>,
}

impl ChunkEnd {
    /// The run stops with `e`: the devices of this chunk not settled get its code.
    fn stopped(mut self, op: &DeviceOp, devices: &[DeviceEntry], e: OperatorError) -> ChunkEnd {
        let note = e.to_string();
        self.outcomes.extend(
            devices.iter().map(|d| {
                DeviceOutcome::failed(&d.qrcode, e.code(), Some(note.clone())).with_hint(op)
            }),
        );
        self.stop = Some(e);
        self
    }
}

/// Whether the tape id a record holds is the one sent: the same MAC however written,
/// or the same UUID without regard to case.
fn same_tape(held: &str, sent: &str) -> bool {
    match (held.parse::<Mac>(), sent.parse::<Mac>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => held.eq_ignore_ascii_case(sent),
    }
}

/// `message` of a success body (`{code, message}`), or the error answer's message.
fn body_message(a: &Answer) -> String {
    if !a.message.is_empty() {
        return a.message.clone();
    }
    serde_json::from_slice::<Value>(&a.body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .map(|m| crate::text::bounded(&m, crate::text::SHOWN_MAX_CHARS))
        .unwrap_or_default()
}

/// What a lookup says of a label sent whose answer was lost.
#[derive(Debug, PartialEq)]
enum Judged {
    /// It carries the label as sent.
    Applied,
    /// It carries no label (or, with override, not ours): sending again is safe.
    NotApplied,
    /// It carries another label (this asset barcode): ours was not applied.
    Other(String),
    /// The lookup cannot say.
    Unknown,
}

/// Whether `shipment` as looked up carries every field sent with the same value (the
/// service may add its own fields: spec 2.4 does not show them).
fn carries_shipment(sent: &Value, held: Option<&Value>) -> Option<bool> {
    let held = held?.as_object()?;
    let sent = sent.as_object()?;
    Some(sent.iter().all(|(k, v)| held.get(k) == Some(v)))
}

fn judge_label(d: &DeviceEntry, record: Option<&LabelRecord>, override_label: bool) -> Judged {
    let Some(record) = record else {
        return Judged::Unknown;
    };
    if record.error_code.is_some() {
        // Not found by the lookup: the label cannot have been applied to it.
        return Judged::NotApplied;
    }
    let label = match record.label_state() {
        LabelState::Unknown => return Judged::Unknown,
        LabelState::Unlabelled => return Judged::NotApplied,
        LabelState::Labelled(l) => l,
    };
    let other = |asset: &Option<String>| {
        if override_label {
            Judged::NotApplied
        } else {
            Judged::Other(asset.clone().unwrap_or_default())
        }
    };
    if label.asset_barcode != d.asset_barcode {
        return other(&label.asset_barcode);
    }
    if let Some(app) = &d.application_id {
        match &label.application_id {
            None => return Judged::Unknown,
            Some(a) if a != app => return other(&label.asset_barcode),
            Some(_) => {}
        }
    }
    if let Some(shipment) = &d.shipment {
        match carries_shipment(shipment, label.shipment.as_ref()) {
            None => return Judged::Unknown,
            Some(false) => return other(&label.asset_barcode),
            Some(true) => {}
        }
    }
    Judged::Applied
}

/// The lookup's record of each device of `devices`, matched by QR code (as sent or as
/// the service normalised it).
fn records(devices: &[DeviceEntry], answer: &Answer) -> Vec<Option<LabelRecord>> {
    let mut out: Vec<Option<LabelRecord>> = vec![None; devices.len()];
    let sent: Vec<&str> = devices.iter().map(|d| d.qrcode.as_str()).collect();
    let mut taken = vec![false; devices.len()];
    for r in assumed::parse_lookup(&answer.body)
        .unwrap_or_default()
        .into_iter()
        .flatten()
    {
        if let Some(i) = assumed::match_qr(&r.qrcode, &sent, &taken) {
            taken[i] = true;
            out[i] = Some(r);
        }
    }
    out
}

/// The per-device outcomes of an answer (not 401, 429 or 5xx: those the send handled).
fn outcomes(op: &DeviceOp, devices: &[DeviceEntry], answer: &Answer) -> Vec<DeviceOutcome> {
    let status = answer.status;
    let all = |code: &str, note: String| -> Vec<DeviceOutcome> {
        devices
            .iter()
            .map(|d| DeviceOutcome::failed(&d.qrcode, code, Some(note.clone())).with_hint(op))
            .collect()
    };
    let results = if status.is_success() || status == StatusCode::BAD_REQUEST {
        assumed::parse_results(&answer.body)
    } else {
        None
    };
    let Some(results) = results else {
        // Decided by structure: a validation failure carries `errors` that are not
        // per-device results (spec 7); the message is only shown.
        return if status == StatusCode::BAD_REQUEST && assumed::is_validation_failure(&answer.body)
        {
            all("VALIDATION_FAILED", answer.message.clone())
        } else if status == StatusCode::BAD_REQUEST {
            all("REJECTED", answer.message.clone())
        } else if status.is_success() {
            all(
                "UNEXPECTED_ANSWER",
                "the answer is not the per-device result of spec 2.5".into(),
            )
        } else {
            all(
                "UNEXPECTED_ANSWER",
                format!("HTTP {}: {}", status.as_u16(), answer.message),
            )
        };
    };
    let sent: Vec<&str> = devices.iter().map(|d| d.qrcode.as_str()).collect();
    let mut taken = vec![false; devices.len()];
    let mut codes: Vec<Option<String>> = vec![None; devices.len()];
    let mut unmatched = Vec::new();
    for (q, code) in &results.errors {
        match assumed::match_qr(q, &sent, &taken) {
            Some(i) => {
                taken[i] = true;
                codes[i] = Some(code.clone());
            }
            None => unmatched.push(q.as_str()),
        }
    }
    let named = codes.iter().flatten().count() as u64;
    let consistent = unmatched.is_empty()
        && results.failed == named
        && results.successful + results.failed == devices.len() as u64;
    let mismatch = || {
        let unmatched: Vec<String> = unmatched
            .iter()
            .take(5)
            .map(|q| crate::text::shown(q, 40))
            .collect();
        format!(
            "not confirmed: the answer counts {} successful and {} failed of {} sent, and names {named} of ours{}",
            results.successful,
            results.failed,
            devices.len(),
            if unmatched.is_empty() {
                String::new()
            } else {
                format!(" (errors for {}, which is none of ours)", unmatched.join(", "))
            }
        )
    };
    let records = if *op == DeviceOp::Show {
        records(devices, answer)
    } else {
        vec![None; devices.len()]
    };
    devices
        .iter()
        .zip(codes)
        .zip(records)
        .map(|((d, code), record)| {
            let mut o = match code.as_deref() {
                // Spec 3: deactivating a deactivated device is success.
                Some("ALREADY_IN_TARGET_STATE") if *op == DeviceOp::Deactivate => DeviceOutcome {
                    error_code: Some("ALREADY_IN_TARGET_STATE".into()),
                    note: Some("already deactivated".into()),
                    ..DeviceOutcome::ok(&d.qrcode)
                },
                Some(code) => DeviceOutcome::failed(&d.qrcode, code, None).with_hint(op),
                None if consistent => DeviceOutcome::ok(&d.qrcode),
                None => DeviceOutcome::failed(&d.qrcode, "UNCONFIRMED", Some(mismatch())).with_hint(op),
            };
            if o.ok {
                if let DeviceOp::Label {
                    override_label: true,
                } = op
                {
                    o.note = Some(
                        "label set; its status is unchanged (a DEACTIVATED device stays deactivated: no call here reactivates it)".into(),
                    );
                }
            }
            if *op == DeviceOp::Show && o.ok {
                match &record {
                    None => {
                        o = DeviceOutcome::failed(
                            &d.qrcode,
                            "UNEXPECTED_ANSWER",
                            Some("the lookup has no readable entry for it".into()),
                        )
                    }
                    Some(r) if r.label_unreadable => {
                        o = DeviceOutcome::failed(
                            &d.qrcode,
                            "LABEL_UNREADABLE",
                            Some("its entry holds a label in neither known shape".into()),
                        )
                    }
                    Some(_) => {}
                }
            }
            o.record = record;
            o
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert!(got[0].hint.as_deref().unwrap().contains("device add"));
    }

    #[test]
    fn counts_that_disagree_with_the_errors_named_are_never_success() {
        let ds = [entry("TT1"), entry("TT2")];
        for body in [
            // An error keyed by the tape's MAC.
            r#"{"errors":[{"qrcode":"C0FFEE000001","error_code":"QRMAC_NOT_FOUND"}],"successful":1,"failed":1}"#,
            // Counts of more failures than named.
            r#"{"errors":[],"successful":1,"failed":1}"#,
            // Counts of fewer devices than sent.
            r#"{"errors":[],"successful":1,"failed":0}"#,
        ] {
            let got = outcomes(&DeviceOp::Deactivate, &ds, &answer(207, body));
            assert!(got.iter().all(|o| !o.ok), "{body}: {got:?}");
            assert!(got
                .iter()
                .all(|o| o.error_code.as_deref() == Some("UNCONFIRMED")));
        }
        let body = r#"{"errors":[{"qrcode":"tt1","error_code":"INVALID_TRANSITION"}],"successful":1,"failed":1}"#;
        let got = outcomes(&DeviceOp::Deactivate, &ds, &answer(207, body));
        assert_eq!(got[0].error_code.as_deref(), Some("INVALID_TRANSITION"));
        assert!(got[1].ok, "{got:?}");
    }

    #[test]
    fn a_validation_failure_is_known_by_its_structure_not_its_message() {
        let mut a = answer(
            400,
            r#"{"message":"Échec de validation","code":400,"errors":[{"field":"devices","message":"x"}]}"#,
        );
        a.message = "Échec de validation".into();
        let got = outcomes(&DeviceOp::Relabel, &[entry("A")], &a);
        assert_eq!(got[0].error_code.as_deref(), Some("VALIDATION_FAILED"));
        let mut a = answer(400, r#"{"message":"Validation failed","code":400}"#);
        a.message = "Validation failed".into();
        let got = outcomes(&DeviceOp::Relabel, &[entry("A")], &a);
        assert_eq!(got[0].error_code.as_deref(), Some("REJECTED"));
    }

    fn record(label: Option<assumed::LabelDevice>) -> LabelRecord {
        LabelRecord {
            qrcode: "A".into(),
            label,
            ..LabelRecord::default()
        }
    }

    #[test]
    fn a_label_counts_as_applied_only_when_the_lookup_shows_it_shipment_included() {
        let d = DeviceEntry {
            asset_barcode: Some("AWB-1".into()),
            application_id: Some("app".into()),
            shipment: Some(json!({"awb": "123"})),
            ..entry("A")
        };
        let label = |asset: &str, shipment: Option<Value>| {
            Some(assumed::LabelDevice {
                asset_barcode: Some(asset.into()),
                application_id: Some("app".into()),
                shipment,
            })
        };
        assert_eq!(judge_label(&d, None, false), Judged::Unknown);
        assert_eq!(
            judge_label(&d, Some(&record(None)), false),
            Judged::NotApplied
        );
        let ours = record(label("AWB-1", Some(json!({"awb": "123", "id": 9}))));
        assert_eq!(judge_label(&d, Some(&ours), false), Judged::Applied);
        let other_shipment = record(label("AWB-1", Some(json!({"awb": "999"}))));
        assert_eq!(
            judge_label(&d, Some(&other_shipment), false),
            Judged::Other("AWB-1".into())
        );
        assert_eq!(
            judge_label(&d, Some(&other_shipment), true),
            Judged::NotApplied
        );
        let no_shipment = record(label("AWB-1", None));
        assert_eq!(judge_label(&d, Some(&no_shipment), false), Judged::Unknown);
        let unreadable = LabelRecord {
            label_unreadable: true,
            ..record(None)
        };
        assert_eq!(judge_label(&d, Some(&unreadable), false), Judged::Unknown);
    }

    #[test]
    fn ids_that_cannot_be_meant_are_refused_naming_them() {
        assert_eq!(check_id("QR code", "TTC0FFEE000001"), Ok(()));
        assert_eq!(check_id("asset id", "a b/c?d%41"), Ok(()));
        for bad in ["", ".", "..", "a\nb", "a\tb", " TT1", "TT1 ", "a\u{202e}b"] {
            assert!(check_id("QR code", bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(10_000);
        let err = check_id("QR code", &long).unwrap_err();
        assert!(err.contains("10000 characters") && err.len() < 200, "{err}");
        assert!(check_id("QR code", "a\u{1b}[31m")
            .unwrap_err()
            .contains("\\e"));
    }

    #[test]
    fn a_tape_id_is_the_same_however_a_mac_is_written() {
        assert!(same_tape("C0DEAD000001", "c0:de:ad:00:00:01"));
        assert!(!same_tape("C0DEAD000002", "C0:DE:AD:00:00:01"));
        assert!(same_tape(
            "6f1c2a9e-0000-4000-8000-000000000001",
            "6F1C2A9E-0000-4000-8000-000000000001"
        ));
    }
}
