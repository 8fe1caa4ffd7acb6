/*!
The words of a multi-device call (spec 4.7), shared by the run (`devices.rs`) and the
files of each call (`label.rs`, `show.rs`, `deactivate.rs`, `configure.rs`): which call
([`DeviceOp`]) and how it is sent, one chunk's request and the [`Call`] it becomes,
what each device became ([`DeviceOutcome`], with what to do about it) and the report of
a run. A leaf of the room: it may touch the client, the send's types and the shapes of
`assumed.rs`, none of the files that use it.
*/

use bytes::Bytes;
use reqwest::Method;
use serde::Serialize;
use serde_json::Value;

use super::assumed::LabelRecord;
use super::base::{Base, OperatorError};
use super::send::{Call, Policy};
use crate::api::{Account, ApiError};

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

    pub(super) fn policy(&self) -> Policy {
        match self {
            DeviceOp::Label { .. } => Policy::LABEL,
            _ => Policy::DEVICES_IDEMPOTENT,
        }
    }
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

/// The request of one chunk of a multi-device call, before it becomes a [`Call`].
pub(super) struct Request {
    pub method: Method,
    pub path: &'static [&'static str],
    pub query: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

impl Base {
    /// The call that sends `request`, one chunk of `op`.
    pub(super) fn call_of(&self, op: &DeviceOp, request: Request) -> Result<Call, ApiError> {
        let mut url = self.client.url(request.path)?;
        if !request.query.is_empty() {
            url.query_pairs_mut().extend_pairs(request.query);
        }
        let body = request
            .body
            .map(|b| serde_json::to_vec(&b).map(Bytes::from))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        Ok(Call {
            what: op.name().to_string(),
            method: request.method,
            url,
            account: Account::Token,
            headers: Vec::new(),
            body,
            correlation_id: self.correlation_id(op.name()),
        })
    }
}

/// How a chunk ended: its devices' outcomes, and the error that stops the run.
#[derive(Default)]
pub(super) struct ChunkEnd {
    pub outcomes: Vec<DeviceOutcome>,
    pub stop: Option<OperatorError>,
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
    pub(super) fn ok(qrcode: &str) -> Self {
        DeviceOutcome {
            qrcode: qrcode.to_string(),
            ok: true,
            error_code: None,
            note: None,
            hint: None,
            record: None,
        }
    }

    pub(super) fn failed(qrcode: &str, code: &str, note: Option<String>) -> Self {
        DeviceOutcome {
            qrcode: qrcode.to_string(),
            ok: false,
            error_code: Some(code.to_string()),
            note,
            hint: None,
            record: None,
        }
    }

    pub(super) fn with_hint(mut self, op: &DeviceOp) -> Self {
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
