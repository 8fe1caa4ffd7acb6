/*!
Configure (spec 4.7, `POST /external/v1/devices/config`): 1-100 devices a request, safe
to repeat (it sets values). One request carries one shared change (firmware, metadata),
so the devices are grouped by theirs (a CSV may give each row its own). It may touch
only the shapes of `assumed.rs` and the multi-device call's words (`device_op.rs`).
*/

use reqwest::Method;

use super::assumed::{self, ConfigChange, DeviceEntry};
use super::device_op::{DeviceOp, Request};

/// The request of one chunk.
pub(super) fn request(change: &ConfigChange, devices: &[DeviceEntry]) -> Request {
    Request {
        method: Method::POST,
        path: &["external", "v1", "devices", "config"],
        query: Vec::new(),
        body: Some(assumed::config_body(change, devices)),
    }
}

/// The devices of a run grouped by the change their request carries, groups and
/// devices in the order given. Only configure carries one; every other call is one
/// group with no change.
pub(super) fn groups(
    op: &DeviceOp,
    entries: Vec<DeviceEntry>,
) -> Vec<(ConfigChange, Vec<DeviceEntry>)> {
    let mut groups: Vec<(ConfigChange, Vec<DeviceEntry>)> = Vec::new();
    for e in entries {
        let change = match op {
            DeviceOp::Configure => ConfigChange {
                firmware: e.firmware.clone(),
                metadata: e.metadata.clone(),
            },
            _ => ConfigChange::default(),
        };
        match groups.iter_mut().find(|(c, _)| *c == change) {
            Some((_, group)) => group.push(e),
            None => groups.push((change, vec![e])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::super::devices::tests::entry;
    use super::*;
    use serde_json::json;

    #[test]
    fn devices_are_grouped_by_their_change_in_the_order_given() {
        let with = |q: &str, firmware: Option<&str>, metadata| DeviceEntry {
            firmware: firmware.map(str::to_string),
            metadata,
            ..entry(q)
        };
        let entries = vec![
            with("A", Some("1.2"), None),
            with("B", None, Some(json!({"k": 1}))),
            with("C", Some("1.2"), None),
        ];
        let got: Vec<Vec<String>> = groups(&DeviceOp::Configure, entries.clone())
            .into_iter()
            .map(|(_, g)| g.into_iter().map(|e| e.qrcode).collect())
            .collect();
        assert_eq!(got, [vec!["A", "C"], vec!["B"]]);
        let one = groups(&DeviceOp::Deactivate, entries);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].0, ConfigChange::default());
    }
}
