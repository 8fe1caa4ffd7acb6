/*!
The operator room: the client of the rest of the service (spec 4.1, 4.2, 4.5, 4.6, 4.7)
for the commands a dock's people run, and the shared rate window of spec 8. It may touch
the transport (`crate::api`), the operator settings and the state database (for the rate
window only); nothing in the daemon's pipeline calls it.

One file per capability of the spec (locate, history, messages, add, label, show,
deactivate, configure), over the multi-device run they share and its words. Every call
goes through one send with the retry policy it declares, and through the shared rate
window; the request shapes the spec does not show, and how each reading of its open
points is read, are in one place (`assumed.rs`); what the client holds, its error and
the check of what a person typed are under them all. The client, [`Operator`], stands
over them with every entry point a command calls, in one file. This file only declares
the rooms and shows what they offer.
*/

mod add;
mod assumed;
mod base;
mod configure;
mod deactivate;
mod device_op;
mod devices;
mod entry;
mod history;
mod label;
mod locate;
mod messages;
pub mod rate;
mod send;
mod show;

pub use add::{AddDevice, AddOutcome};
pub use assumed::{ConfigChange, DeviceEntry, LabelDevice, LabelRecord, LabelState};
pub use base::{check_id, Interrupt, OperatorError, Progress};
pub use device_op::{hint, DeviceOp, DeviceOutcome, DeviceReport, DeviceRun};
pub use entry::Operator;
pub use history::{
    merge, month_windows, HistoricalEvent, HistoryFilter, HistoryQuery, HistoryRead, HistoryWindow,
};
pub use locate::{Asset, LocationEvent, ReadingMark, SensorReading, SENSORS};
pub use messages::{MessageSent, MessageType};
