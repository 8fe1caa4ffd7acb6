//! The operator's client, [`Operator`]: every entry point a command calls, in one place,
//! over what the capability files share (`base.rs`, whose `Base` each capability file
//! extends with its own steps). It touches `base.rs` and the words of the capabilities.

use jiff::Timestamp;
use serde_json::Value;

use super::add::{AddDevice, AddOutcome};
use super::assumed::DeviceEntry;
use super::base::{Base, Interrupt, OperatorError, Progress};
use super::device_op::{DeviceOp, DeviceRun};
use super::history::{HistoryQuery, HistoryRead};
use super::locate::LocationEvent;
use super::messages::{MessageSent, MessageType};
use super::rate::RateGate;
use crate::api::ServiceClient;
use crate::config::OperatorSettings;

/// The operator's client: the service client, the shared rate window, and the operator
/// settings of the environment.
pub struct Operator {
    base: Base,
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
            base: Base::new(client, gate, settings, gateway_id, on_retry),
        }
    }

    /// This client, stopped by `interrupt`.
    pub fn with_interrupt(self, interrupt: Interrupt) -> Operator {
        Operator {
            base: self.base.with_interrupt(interrupt),
        }
    }

    /// This client, telling `on_progress` after each request of a multi-device run.
    pub fn with_progress(self, on_progress: Box<dyn Fn(&Progress) + Send + Sync>) -> Operator {
        Operator {
            base: self.base.with_progress(on_progress),
        }
    }

    pub fn settings(&self) -> &OperatorSettings {
        self.base.settings()
    }

    /// The shared rate window.
    pub fn gate(&self) -> &RateGate {
        self.base.gate()
    }

    /// `device add` (spec 4.6). `Ok` with `ok: false` when the service refused this
    /// tape (the next may go); `Err` when nothing more should be sent (credentials, no
    /// answer, an interrupt).
    pub async fn add_device(&self, add: &AddDevice) -> Result<AddOutcome, OperatorError> {
        self.base.add_device(add).await
    }

    /// One multi-device call (label, show, deactivate, configure) over `entries`, split
    /// and repeated as the rules say. The report holds every device; a run that stopped
    /// early says why in `error`.
    pub async fn devices(&self, op: DeviceOp, entries: Vec<DeviceEntry>) -> DeviceRun {
        self.base.devices(op, entries).await
    }

    /// The events of `q`, merged and in time order, the requests sent, and what could
    /// not be completed.
    pub async fn history(
        &self,
        q: &HistoryQuery,
        now: Timestamp,
    ) -> Result<HistoryRead, OperatorError> {
        self.base.history(q, now).await
    }

    /// The latest event of `asset_id` (an AWB, or with `sensor` a device's asset
    /// barcode). `Ok(None)`: AWB not found, or no current sensor reading (each after
    /// its one repeat).
    pub async fn locate(
        &self,
        asset_id: &str,
        sensor: bool,
    ) -> Result<Option<LocationEvent>, OperatorError> {
        self.base.locate(asset_id, sensor).await
    }

    /// Sends one integration message; returns what the service answered.
    pub async fn message(&self, t: MessageType, data: Value) -> Result<MessageSent, OperatorError> {
        self.base.message(t, data).await
    }
}
