/*!
Show (spec 4.7, `GET /external/v1/devices/label`): the label lookup, 1-20 devices a
request, in the shared rate window, safe to repeat. It is also how label and add-device
look before they claim what a lost answer did. It may touch the send, the shapes of
`assumed.rs` (the lookup's entry is read both ways there) and the multi-device call's words
(`device_op.rs`).
*/

use reqwest::Method;

use super::assumed::{self, DeviceEntry, LabelRecord};
use super::base::{Base, OperatorError};
use super::device_op::{DeviceOp, DeviceOutcome, Request};
use super::send::{Policy, Sent};
use crate::api::Answer;

/// The request of one chunk: no body, the QR codes in the query.
pub(super) fn request(devices: &[DeviceEntry]) -> Request {
    Request {
        method: Method::GET,
        path: &["external", "v1", "devices", "label"],
        query: assumed::show_query(devices),
        body: None,
    }
}

/// A device the answer counts as successful is shown only with an entry that can be
/// read.
pub(super) fn check_entry(o: &mut DeviceOutcome, record: Option<&LabelRecord>) {
    if !o.ok {
        return;
    }
    match record {
        None => {
            *o = DeviceOutcome::failed(
                &o.qrcode,
                "UNEXPECTED_ANSWER",
                Some("the lookup has no readable entry for it".into()),
            )
        }
        Some(r) if r.label_unreadable => {
            *o = DeviceOutcome::failed(
                &o.qrcode,
                "LABEL_UNREADABLE",
                Some("its entry holds a label in neither known shape".into()),
            )
        }
        Some(_) => {}
    }
}

impl Base {
    /// The lookup (GET label) of `devices`: for each, its record when the answer had a
    /// readable entry for it.
    pub(super) async fn lookup(
        &self,
        devices: &[DeviceEntry],
    ) -> Result<Vec<Option<LabelRecord>>, OperatorError> {
        let mut out = Vec::with_capacity(devices.len());
        for chunk in devices.chunks(DeviceOp::Show.max_devices()) {
            let call = self.call_of(&DeviceOp::Show, request(chunk))?;
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
}

/// The lookup's record of each device of `devices`, matched by QR code (as sent or as
/// the service normalised it).
pub(super) fn records(devices: &[DeviceEntry], answer: &Answer) -> Vec<Option<LabelRecord>> {
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
