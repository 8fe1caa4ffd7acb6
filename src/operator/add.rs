/*!
Add-device (spec 4.6, `POST /devices/v1/parcel`): query parameters, no body, the account
headers. A failure before anything reached the service (no token, DNS, refused
connection, TLS) is simply retried; only a request that may have reached it is repeated
with `retry=1`, and a 409 then is confirmed by a lookup (`show.rs`: the QR code carries
our tape id) or reported as "exists, maybe ours", never as a plain success. It may touch
the send, the lookup and the operator settings (the default application and tape type).
*/

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::assumed::DeviceEntry;
use super::base::{Base, OperatorError};
use super::send::{Call, Policy, Sent};
use crate::api::{Account, Answer};
use crate::record::Mac;

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

impl AddOutcome {
    /// The outcome an `answer` tells of `add`.
    fn of(add: &AddDevice, ok: bool, a: &Answer, correlation_id: &str) -> AddOutcome {
        AddOutcome {
            qrcode: add.qrcode.clone(),
            tape_id: add.tape_id.clone(),
            ok,
            status: Some(a.status.as_u16()),
            message: body_message(a),
            error_code: None,
            note: None,
            correlation_id: correlation_id.to_string(),
        }
    }

    /// Not added: it exists (`code`), as `note` says.
    fn exists(self, code: &str, note: String) -> AddOutcome {
        AddOutcome {
            ok: false,
            error_code: Some(code.into()),
            note: Some(note),
            ..self
        }
    }
}

impl Base {
    /// `device add` (spec 4.6). `Ok` with `ok: false` when the service refused this
    /// tape (the next may go); `Err` when nothing more should be sent (credentials, no
    /// answer, an interrupt).
    pub(super) async fn add_device(&self, add: &AddDevice) -> Result<AddOutcome, OperatorError> {
        let correlation_id = self.correlation_id("add");
        let call = self.add_call(add, &correlation_id)?;
        let shown_qr = crate::util::text::shown(&add.qrcode, 40);
        let (answer, lost_before) = answered(self.send(Policy::ADD, &call).await?, &shown_qr)?;
        let outcome = |ok: bool| AddOutcome::of(add, ok, &answer, &correlation_id);
        if answer.status.is_success() {
            let mut o = outcome(true);
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
                ..outcome(false)
            });
        }
        if !lost_before {
            return Ok(outcome(false).exists(
                "EXISTS",
                "it exists in the service already; `--override` deletes and recreates its record (its label goes with it)".into(),
            ));
        }
        self.after_conflict(add, outcome(true)).await
    }

    /// The request of `add`.
    fn add_call(&self, add: &AddDevice, correlation_id: &str) -> Result<Call, OperatorError> {
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
        let mut headers = vec![("X-Correlation-Id", correlation_id.to_string())];
        if let Some(f) = &add.facility {
            headers.push(("facility_id", f.clone()));
        }
        Ok(Call {
            what: format!("add {}", crate::util::text::shown(&add.qrcode, 40)),
            method: Method::POST,
            url,
            account: Account::Headers,
            headers,
            body: None,
            correlation_id: correlation_id.to_string(),
        })
    }

    /// A 409 after an attempt that may have been applied: ours, or someone's before?
    /// The lookup says whether the QR code carries the tape id sent. `conflict` is the
    /// 409's outcome, taken as a success when the lookup confirms it.
    async fn after_conflict(
        &self,
        add: &AddDevice,
        conflict: AddOutcome,
    ) -> Result<AddOutcome, OperatorError> {
        let records = match self
            .lookup(&[DeviceEntry {
                qrcode: add.qrcode.clone(),
                ..DeviceEntry::default()
            }])
            .await
        {
            Ok(r) => r,
            Err(OperatorError::Interrupted(_)) => {
                return Ok(conflict.exists(
                    "EXISTS_MAYBE_OURS",
                    "it exists; the earlier attempt, whose answer was lost, may have created it (interrupted before the lookup): check with `device show`".into(),
                ))
            }
            Err(e @ (OperatorError::Api(_) | OperatorError::State(_))) => return Err(e),
            Err(e) => {
                return Ok(conflict.exists(
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
                ..conflict
            },
            Some(mac) => conflict.exists(
                "EXISTS",
                format!(
                    "it exists with another tape id ({}), not the one sent; `--override` deletes and recreates its record",
                    crate::util::text::shown(&mac, 40)
                ),
            ),
            None => conflict.exists(
                "EXISTS_MAYBE_OURS",
                "it exists; the earlier attempt, whose answer was lost, may have created it, and the lookup does not show its tape id: check with `device show`".into(),
            ),
        })
    }
}

/// The answer of an add's send, and whether an earlier attempt's answer was lost; an
/// error when there is no answer to read (the text says whether it may have been added).
fn answered(sent: Sent, shown_qr: &str) -> Result<(Answer, bool), OperatorError> {
    let check = format!("check with `device show --qr {shown_qr}`");
    match sent {
        Sent::Answered {
            answer,
            lost_before,
        } => Ok((answer, lost_before)),
        Sent::NoAnswer { cause, lost_before } => {
            let maybe = if lost_before {
                format!("; it may or may not have been added: {check}")
            } else {
                "; it was not added".to_string()
            };
            Err(OperatorError::Refused(format!(
                "no answer to adding {shown_qr}: {cause}{maybe}"
            )))
        }
        Sent::Lost { cause } => Err(OperatorError::Refused(format!(
            "no answer to adding {shown_qr}: {cause}; it may or may not have been added: {check}"
        ))),
        Sent::Interrupted {
            in_flight,
            lost_before,
        } => {
            let maybe = if in_flight || lost_before {
                format!("{shown_qr} may or may not have been added: {check}")
            } else {
                format!("{shown_qr} was not added")
            };
            Err(OperatorError::Interrupted(maybe))
        }
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
        .map(|m| crate::util::text::bounded(&m, crate::util::text::SHOWN_MAX_CHARS))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
