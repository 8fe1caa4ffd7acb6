/*!
The operator room: the client of the rest of the service (spec 4.1, 4.2, 4.5, 4.6, 4.7)
for the commands a dock's people run, and the shared rate window of spec 8. It may touch
the transport (`crate::api`), the operator settings and the state database (for the rate
window only); nothing in the daemon's pipeline calls it.

One file per capability: `add.rs` (4.6), `label.rs` (label and relabel), `show.rs`,
`deactivate.rs` and `configure.rs` (4.7), over the multi-device run they share
(`devices.rs`); `locate.rs` (4.1), `history.rs` (4.2), `messages.rs` (4.5). Every call
goes through the one send of `send.rs` with the retry policy it declares; `rate.rs` is
the shared window; `assumed.rs` holds the request shapes the spec does not show and how
both readings of its open points are read. This file is the client ([`Operator`]), its
error, and the check of what a person typed.
*/

mod add;
mod assumed;
mod configure;
mod deactivate;
mod devices;
mod history;
mod label;
mod locate;
mod messages;
pub mod rate;
mod send;
mod show;

use std::sync::atomic::{AtomicU32, Ordering};

pub use add::{AddDevice, AddOutcome};
pub use assumed::{ConfigChange, DeviceEntry, LabelDevice, LabelRecord, LabelState};
pub use devices::{hint, DeviceOp, DeviceOutcome, DeviceReport, DeviceRun, Progress};
pub use history::{
    merge, month_windows, HistoricalEvent, HistoryFilter, HistoryQuery, HistoryRead, HistoryWindow,
};
pub use locate::{Asset, LocationEvent, ReadingMark, SensorReading, SENSORS};
pub use messages::{check_payload, MessageSent, MessageType};
pub use send::Interrupt;

use crate::api::{ApiError, ServiceClient};
use crate::config::OperatorSettings;
use crate::outbox::OutboxError;
use rate::RateGate;

/// Longest QR code, asset id or other identifier sent (characters).
pub const MAX_ID_CHARS: usize = 256;

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
    client: ServiceClient,
    gate: RateGate,
    settings: OperatorSettings,
    gateway_id: String,
    /// Told each wait for a retry ("the service answered 503; trying again in 2 s").
    on_retry: Box<dyn Fn(&str) + Send + Sync>,
    /// Told after each request of a multi-device run.
    on_progress: Box<dyn Fn(&Progress) + Send + Sync>,
    interrupt: Interrupt,
    /// Requests sent so far (every attempt).
    sent: AtomicU32,
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

    fn correlation_id(&self, what: &str) -> String {
        format!(
            "{}-{what}-{}-{:04x}",
            self.gateway_id,
            self.gate.clock().wall_ms(),
            fastrand::u16(..)
        )
    }

    fn requests(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
