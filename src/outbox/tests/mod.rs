//! The outbox's tests that drive the store itself, beside it in the crate: the model
//! test holds the real SQLite store (and the real planner over it) against a simple
//! model.

mod heard;
mod model;

use crate::record::{Capture, Mac};

/// The `i`th tape of the outbox's tests: `C0:FF:EE:00:00:i`.
pub(super) fn mac(i: u8) -> Mac {
    Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
}

/// A tape's capture for the outbox's tests (product `tape`, RSSI -60, no boot time):
/// what differs between tests is the MAC, the time and the packet; one that needs
/// another RSSI says so with `..capture(…)`.
pub(super) fn capture(mac: Mac, ts_ms: i64, packet: impl Into<String>) -> Capture {
    Capture {
        mac,
        ts_ms,
        product_id: "tape".into(),
        packet: packet.into(),
        rssi: Some(-60),
        boot_ms: None,
    }
}
