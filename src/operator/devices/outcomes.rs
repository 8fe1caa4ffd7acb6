/*!
What each device of a multi-device call became ([`DeviceOutcome`], defined in
`device_op.rs`), read from an answer:
the per-device result of spec 2.5 matched to the devices sent by QR code, checked
against its counts, with each call's own rules (`deactivate.rs`, `label.rs`,
`show.rs`). It may touch only the shapes of `assumed.rs` and those rules.
*/

use reqwest::StatusCode;

use super::super::assumed::{self, DeviceEntry, Results};
use super::super::device_op::{DeviceOp, DeviceOutcome};
use super::super::{deactivate, label, show};
use crate::api::Answer;

/// How the per-device results of an answer match the devices sent.
struct Matched<'a> {
    /// The `error_code` named for each device sent, in their order.
    codes: Vec<Option<String>>,
    /// QR codes the answer names that are none of ours.
    unmatched: Vec<&'a str>,
    /// Whether `successful` and `failed` agree with what was matched.
    consistent: bool,
}

impl<'a> Matched<'a> {
    fn of(devices: &[DeviceEntry], results: &'a Results) -> Matched<'a> {
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
        Matched {
            codes,
            unmatched,
            consistent,
        }
    }

    /// Why the results are not confirmed, for a person.
    fn mismatch(&self, results: &Results, sent: usize) -> String {
        let named = self.codes.iter().flatten().count();
        let unmatched: Vec<String> = self
            .unmatched
            .iter()
            .take(5)
            .map(|q| crate::util::text::shown(q, 40))
            .collect();
        format!(
            "not confirmed: the answer counts {} successful and {} failed of {sent} sent, and names {named} of ours{}",
            results.successful,
            results.failed,
            if unmatched.is_empty() {
                String::new()
            } else {
                format!(" (errors for {}, which is none of ours)", unmatched.join(", "))
            }
        )
    }
}

/// The per-device outcomes of an answer (not 401, 429 or 5xx: those the send handled).
pub(in crate::operator) fn outcomes(
    op: &DeviceOp,
    devices: &[DeviceEntry],
    answer: &Answer,
) -> Vec<DeviceOutcome> {
    let status = answer.status;
    let results = if status.is_success() || status == StatusCode::BAD_REQUEST {
        assumed::parse_results(&answer.body)
    } else {
        None
    };
    let Some(results) = results else {
        return no_results(op, devices, answer);
    };
    let matched = Matched::of(devices, &results);
    let records = if *op == DeviceOp::Show {
        show::records(devices, answer)
    } else {
        vec![None; devices.len()]
    };
    devices
        .iter()
        .zip(&matched.codes)
        .zip(records)
        .map(|((d, code), record)| {
            let mut o = match code.as_deref() {
                Some(code) => deactivate::already_done(op, &d.qrcode, code)
                    .unwrap_or_else(|| DeviceOutcome::failed(&d.qrcode, code, None).with_hint(op)),
                None if matched.consistent => DeviceOutcome::ok(&d.qrcode),
                None => DeviceOutcome::failed(
                    &d.qrcode,
                    "UNCONFIRMED",
                    Some(matched.mismatch(&results, devices.len())),
                )
                .with_hint(op),
            };
            label::note_override(op, &mut o);
            if *op == DeviceOp::Show {
                show::check_entry(&mut o, record.as_ref());
            }
            o.record = record;
            o
        })
        .collect()
}

/// Every device's outcome when the answer carries no per-device result. Decided by
/// structure: a validation failure carries `errors` that are not per-device results
/// (spec 7); the message is only shown.
fn no_results(op: &DeviceOp, devices: &[DeviceEntry], answer: &Answer) -> Vec<DeviceOutcome> {
    let status = answer.status;
    let (code, note) =
        if status == StatusCode::BAD_REQUEST && assumed::is_validation_failure(&answer.body) {
            ("VALIDATION_FAILED", answer.message.clone())
        } else if status == StatusCode::BAD_REQUEST {
            ("REJECTED", answer.message.clone())
        } else if status.is_success() {
            (
                "UNEXPECTED_ANSWER",
                "the answer is not the per-device result of spec 2.5".into(),
            )
        } else {
            (
                "UNEXPECTED_ANSWER",
                format!("HTTP {}: {}", status.as_u16(), answer.message),
            )
        };
    devices
        .iter()
        .map(|d| DeviceOutcome::failed(&d.qrcode, code, Some(note.clone())).with_hint(op))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{answer, entry};
    use super::*;

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
}
