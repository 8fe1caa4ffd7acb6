/*!
Label and relabel (spec 4.7, `POST` and `PUT /external/v1/devices/label`): 1-20 devices
a request, in the shared rate window. Relabel sets values and is repeated like any
idempotent call; label is not idempotent (spec 7), so it is never repeated blindly:
after a lost answer the devices are looked up (`show.rs`) and only those without any
label (or, with override, without ours) go again; a device the lookup cannot speak for
is reported "unknown whether applied", never sent again. It may touch the lookup, the
shapes of `assumed.rs` and the multi-device call's words (`device_op.rs`).
*/

use reqwest::Method;
use serde_json::Value;

use super::assumed::{self, DeviceEntry, LabelRecord, LabelState};
use super::base::Base;
use super::device_op::{ChunkEnd, DeviceOp, DeviceOutcome, Request};

/// Rounds of a label chunk at most: the first, and the repeats for the devices the
/// lookup showed unlabelled after a lost answer.
pub(super) const ROUNDS: u32 = 3;

const LABEL_PATH: &[&str] = &["external", "v1", "devices", "label"];

/// The label request of one chunk.
pub(super) fn label_request(devices: &[DeviceEntry], override_label: bool) -> Request {
    Request {
        method: Method::POST,
        path: LABEL_PATH,
        query: Vec::new(),
        body: Some(assumed::label_body(devices, override_label)),
    }
}

/// The relabel request of one chunk.
pub(super) fn relabel_request(devices: &[DeviceEntry]) -> Request {
    Request {
        method: Method::PUT,
        path: LABEL_PATH,
        query: Vec::new(),
        body: Some(assumed::relabel_body(devices)),
    }
}

/// A label with override that succeeded says what it left alone.
pub(super) fn note_override(op: &DeviceOp, o: &mut DeviceOutcome) {
    if o.ok
        && *op
            == (DeviceOp::Label {
                override_label: true,
            })
    {
        o.note = Some(
            "label set; its status is unchanged (a DEACTIVATED device stays deactivated: no call here reactivates it)".into(),
        );
    }
}

impl Base {
    /// After a label's answer was lost (`lost_cause`): the devices looked up, those
    /// the lookup settles added to `end`, and those to send again returned (`None`:
    /// none, or the lookup failed and `end` says why).
    pub(super) async fn look_again(
        &self,
        op: &DeviceOp,
        remaining: Vec<DeviceEntry>,
        lost_cause: &str,
        end: &mut ChunkEnd,
    ) -> Option<Vec<DeviceEntry>> {
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
                return None;
            }
        };
        let mut again = Vec::new();
        for (d, record) in remaining.into_iter().zip(looked) {
            match judge_label(&d, record.as_ref(), override_label) {
                Judged::NotApplied => again.push(d),
                judged => end.outcomes.push(settled(op, &d, judged, lost_cause)),
            }
        }
        if again.is_empty() {
            return None;
        }
        (self.on_retry)(&format!(
            "label: the answer was lost ({lost_cause}); the lookup shows {} device(s) without the label: sending them again",
            again.len()
        ));
        Some(again)
    }
}

/// The outcome of a device the lookup settled (anything but [`Judged::NotApplied`]).
fn settled(op: &DeviceOp, d: &DeviceEntry, judged: Judged, lost_cause: &str) -> DeviceOutcome {
    match judged {
        Judged::Applied => DeviceOutcome {
            note: Some("labelled (the answer was lost; the lookup confirms it)".into()),
            ..DeviceOutcome::ok(&d.qrcode)
        },
        Judged::Other(asset) => DeviceOutcome::failed(
            &d.qrcode,
            "ALREADY_LABELLED",
            Some(format!(
                "carries another label (asset {}), not the one sent",
                crate::util::text::shown(&asset, 60)
            )),
        )
        .with_hint(op),
        Judged::Unknown | Judged::NotApplied => DeviceOutcome::failed(
            &d.qrcode,
            "UNKNOWN_IF_APPLIED",
            Some(format!(
                "the answer was lost ({lost_cause}) and the lookup cannot say whether it is labelled; not sent again (that could label it twice)"
            )),
        )
        .with_hint(op),
    }
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

#[cfg(test)]
mod tests {
    use super::super::devices::tests::entry;
    use super::*;
    use serde_json::json;

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
}
