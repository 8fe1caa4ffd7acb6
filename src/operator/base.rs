/*!
What every capability file of the operator's client shares: `Base` (the service
client, the rate window, the settings, the callbacks a command gives), its error
([`OperatorError`]), the interruption of a run ([`Interrupt`]), where a multi-device run
is ([`Progress`]) and the check of an identifier a person typed ([`check_id`]). The
floor of the operator room: it may touch the transport (`crate::api`), the operator
settings and the rate window (`rate.rs`), nothing of the capability files above it.
*/

use std::sync::atomic::{AtomicU32, Ordering};

use tokio_util::sync::CancellationToken;

use super::rate::RateGate;
use crate::api::{ApiError, ServiceClient};
use crate::config::OperatorSettings;
use crate::outbox::OutboxError;

/// Longest QR code, asset id or other identifier sent (characters).
const MAX_ID_CHARS: usize = 256;

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
    pub(super) fn code(&self) -> &'static str {
        match self {
            OperatorError::Interrupted(_) => "NOT_SENT",
            _ => "REFUSED",
        }
    }
}

/// What the operator's client ([`super::Operator`]) holds, and every capability file
/// extends: the service client, the shared rate window, and the operator settings of
/// the environment.
pub(super) struct Base {
    pub(super) client: ServiceClient,
    pub(super) gate: RateGate,
    pub(super) settings: OperatorSettings,
    gateway_id: String,
    /// Told each wait for a retry ("the service answered 503; trying again in 2 s").
    pub(super) on_retry: Box<dyn Fn(&str) + Send + Sync>,
    /// Told after each request of a multi-device run.
    pub(super) on_progress: Box<dyn Fn(&Progress) + Send + Sync>,
    pub(super) interrupt: Interrupt,
    /// Requests sent so far (every attempt).
    pub(super) sent: AtomicU32,
}

/// Checks an identifier that goes to the service (a QR code, an asset id, an AWB) as
/// the person gave it: never sent changed, so refused here when it cannot be meant
/// (empty, space around it, a control or invisible character, `.` or `..`, longer than
/// [`MAX_ID_CHARS`]). The error names the value, made safe to show.
pub fn check_id(kind: &str, value: &str) -> Result<(), String> {
    let shown = || crate::util::text::shown(value, 40);
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
    if matches!(crate::util::text::inert(value), std::borrow::Cow::Owned(_)) {
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

impl Base {
    pub(super) fn new(
        client: ServiceClient,
        gate: RateGate,
        settings: OperatorSettings,
        gateway_id: String,
        on_retry: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Base {
        Base {
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
    pub(super) fn with_interrupt(self, interrupt: Interrupt) -> Base {
        Base { interrupt, ..self }
    }

    /// This client, telling `on_progress` after each request of a multi-device run.
    pub(super) fn with_progress(self, on_progress: Box<dyn Fn(&Progress) + Send + Sync>) -> Base {
        Base {
            on_progress,
            ..self
        }
    }

    pub(super) fn settings(&self) -> &OperatorSettings {
        &self.settings
    }

    /// The shared rate window.
    pub(super) fn gate(&self) -> &RateGate {
        &self.gate
    }

    pub(super) fn correlation_id(&self, what: &str) -> String {
        format!(
            "{}-{what}-{}-{:04x}",
            self.gateway_id,
            self.gate.clock().wall_ms(),
            fastrand::u16(..)
        )
    }

    pub(super) fn requests(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// A run's interruption, shared by the command and the client: `stop` (the first
/// Ctrl-C) sends nothing new and ends waits at once, `abandon` (the second) also gives
/// up a request in flight.
#[derive(Debug, Clone, Default)]
pub struct Interrupt {
    pub stop: CancellationToken,
    pub abandon: CancellationToken,
}

impl Interrupt {
    pub fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// Where a multi-device run is, told after each request's devices are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub ok: usize,
    pub requests: u32,
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
