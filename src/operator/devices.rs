/*!
The multi-device run that label, relabel, show, deactivate and configure share (spec
4.7), with the rules DESIGN.md's "The operator interface" lists, whoever calls it. It
may touch the send (`send.rs`), the words of a multi-device call (`device_op.rs`), the
shapes of `assumed.rs` and the capability files, which give each call its request and
its own rules; none of them touches it.

- every request goes through the one send with its call's declared retry policy:
  429 (with `Retry-After`), 5xx and lost answers are retried where that is safe, and
  every request takes a slot of the shared rate window (`rate.rs`);
- a QR code given twice is sent once; devices go 1-20 (label, relabel, show) or 1-100
  (deactivate, configure) a request; configure groups devices by their shared change
  (`configure.rs`);
- results are per device, by `error_code` (never by message), matched to the devices
  sent by QR code as sent or as the service normalised it, and only when `successful`
  and `failed` agree with what was matched (otherwise the devices are reported
  unconfirmed); `ALREADY_IN_TARGET_STATE` of a deactivate is success
  (`deactivate.rs`);
- label is never repeated blindly: after a lost answer the devices are looked up and
  only those without any label (or, with override, without ours) go again
  (`label.rs`);
- a run that stops part-way (an error no retry fixes, no answer, an interrupt) still
  reports every device: those done, and those not sent.
*/

use std::collections::{HashMap, HashSet};

use super::assumed::{ConfigChange, DeviceEntry};
use super::base::{Base, OperatorError, Progress};
use super::device_op::{ChunkEnd, DeviceOp, DeviceOutcome, DeviceReport, DeviceRun, Request};
use super::send::{Call, Sent};
use super::{configure, deactivate, label, show};
use crate::api::ApiError;

mod outcomes;

pub(super) use outcomes::outcomes;

/// Distinct QR codes, first occurrence kept, in the order given.
fn distinct(entries: Vec<DeviceEntry>) -> Vec<DeviceEntry> {
    let mut seen = HashSet::new();
    entries
        .into_iter()
        .filter(|e| seen.insert(e.qrcode.clone()))
        .collect()
}

/// The request of `op` for `devices` (one chunk, one shared `change`): each call's own
/// file builds it.
fn request(op: &DeviceOp, change: &ConfigChange, devices: &[DeviceEntry]) -> Request {
    match op {
        DeviceOp::Label { override_label } => label::label_request(devices, *override_label),
        DeviceOp::Relabel => label::relabel_request(devices),
        DeviceOp::Show => show::request(devices),
        DeviceOp::Deactivate => deactivate::request(devices),
        DeviceOp::Configure => configure::request(change, devices),
    }
}

impl Base {
    /// One multi-device call over `entries`, split and repeated as the rules say. The
    /// report holds every device; a run that stopped early says why in `error`.
    pub(super) async fn devices(&self, op: DeviceOp, entries: Vec<DeviceEntry>) -> DeviceRun {
        let first_request = self.requests();
        let groups = configure::groups(&op, distinct(entries));
        let wanted: Vec<String> = groups
            .iter()
            .flat_map(|(_, group)| group.iter().map(|e| e.qrcode.clone()))
            .collect();
        let mut outcomes: HashMap<String, DeviceOutcome> = HashMap::new();
        let mut error = None;
        'run: for (change, group) in &groups {
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
        let report = DeviceReport {
            operation: op.name(),
            devices: wanted
                .iter()
                .map(|q| outcomes.remove(q).unwrap_or_else(|| not_sent(q)))
                .collect(),
            requests: self.requests() - first_request,
            error: error.as_ref().map(ToString::to_string),
            interrupted: matches!(error, Some(OperatorError::Interrupted(_))),
        };
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
        for _ in 0..label::ROUNDS {
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
                Ok(Sent::Lost { cause }) => cause,
                Ok(unanswered) => return end.unanswered(op, &remaining, unanswered),
            };
            // A label whose answer was lost may have been applied: look before sending
            // again, and send again only what the lookup shows unlabelled.
            match self.look_again(op, remaining, &lost_cause, &mut end).await {
                Some(again) => remaining = again,
                None => return end,
            }
        }
        let note = format!("answers lost {} times", label::ROUNDS);
        end.outcomes.extend(remaining.iter().map(|d| {
            DeviceOutcome::failed(&d.qrcode, "UNKNOWN_IF_APPLIED", Some(note.clone())).with_hint(op)
        }));
        end
    }

    /// The request of a multi-device call.
    pub(super) fn devices_call(
        &self,
        op: &DeviceOp,
        change: &ConfigChange,
        devices: &[DeviceEntry],
    ) -> Result<Call, ApiError> {
        self.call_of(op, request(op, change, devices))
    }
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

    /// The send ended without an answer ([`Sent::NoAnswer`], [`Sent::Interrupted`]): each
    /// device says whether it may have been applied, and the run stops.
    fn unanswered(mut self, op: &DeviceOp, devices: &[DeviceEntry], sent: Sent) -> ChunkEnd {
        let (code, note, stop) = match sent {
            Sent::NoAnswer { cause, lost_before } => {
                let (code, note) = if lost_before {
                    (
                        "NO_ANSWER",
                        format!("no answer ({cause}); it may or may not have been applied"),
                    )
                } else {
                    ("NOT_SENT", format!("no answer ({cause}); not applied"))
                };
                let stop = OperatorError::Refused(format!(
                    "{}: the service did not answer: {cause}",
                    op.name()
                ));
                (code, note, stop)
            }
            Sent::Interrupted {
                in_flight,
                lost_before,
            } => {
                let (code, note) = if in_flight || lost_before {
                    (
                        "UNKNOWN_IF_APPLIED",
                        "interrupted while its request was on its way: it may or may not have been applied",
                    )
                } else {
                    ("NOT_SENT", "interrupted before it was sent")
                };
                let stop = OperatorError::Interrupted(format!("{} stopped", op.name()));
                (code, note.to_string(), stop)
            }
            Sent::Answered { .. } | Sent::Lost { .. } => {
                unreachable!("answered or lost: not unanswered")
            }
        };
        self.outcomes.extend(
            devices
                .iter()
                .map(|d| DeviceOutcome::failed(&d.qrcode, code, Some(note.clone())).with_hint(op)),
        );
        self.stop = Some(stop);
        self
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::api::Answer;
    use bytes::Bytes;
    use reqwest::StatusCode;

    pub(in crate::operator) fn entry(q: &str) -> DeviceEntry {
        DeviceEntry {
            qrcode: q.into(),
            ..DeviceEntry::default()
        }
    }

    pub(in crate::operator) fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            retry_after: None,
            body: Bytes::from(body.to_string()),
            message: String::new(),
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
}
