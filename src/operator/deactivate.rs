/*!
Deactivate (spec 4.7, `POST /external/v1/devices/status`): 1-100 devices a request,
safe to repeat (spec 7), and `ALREADY_IN_TARGET_STATE` is success (spec 3: the device
is where it was asked to go). It may touch only the shapes of `assumed.rs` and the
multi-device call's words (`device_op.rs`).
*/

use reqwest::Method;

use super::assumed::{self, DeviceEntry};
use super::device_op::{DeviceOp, DeviceOutcome, Request};

/// The request of one chunk.
pub(super) fn request(devices: &[DeviceEntry]) -> Request {
    Request {
        method: Method::POST,
        path: &["external", "v1", "devices", "status"],
        query: Vec::new(),
        body: Some(assumed::status_body(devices)),
    }
}

/// A per-device `code` that is success for `op`: spec 3's `ALREADY_IN_TARGET_STATE` of
/// a deactivate.
pub(super) fn already_done(op: &DeviceOp, qrcode: &str, code: &str) -> Option<DeviceOutcome> {
    (*op == DeviceOp::Deactivate && code == "ALREADY_IN_TARGET_STATE").then(|| DeviceOutcome {
        error_code: Some("ALREADY_IN_TARGET_STATE".into()),
        note: Some("already deactivated".into()),
        ..DeviceOutcome::ok(qrcode)
    })
}

#[cfg(test)]
mod tests {
    use super::super::devices::outcomes;
    use super::super::devices::tests::{answer, entry};
    use super::*;

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
}
