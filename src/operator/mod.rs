/*!
The operator room: the client of the rest of the service (spec 4.1, 4.2, 4.5, 4.6, 4.7)
for the commands a dock's people run, and the shared rate window of spec 8. It may touch
the transport (`crate::api`), the operator settings and the state database (for the rate
window only); nothing in the daemon's pipeline calls it.
*/

mod assumed;
mod devices;
mod history;
mod locate;
mod messages;
pub mod rate;
mod send;

pub use assumed::{ConfigChange, DeviceEntry, LabelDevice, LabelRecord, LabelState};
pub use devices::{
    check_id, hint, AddDevice, AddOutcome, DeviceOp, DeviceOutcome, DeviceReport, DeviceRun,
    Operator, OperatorError, Progress, MAX_ID_CHARS,
};
pub use history::{
    merge, month_windows, HistoricalEvent, HistoryFilter, HistoryQuery, HistoryRead, HistoryWindow,
};
pub use locate::{Asset, LocationEvent, ReadingMark, SensorReading, SENSORS};
pub use messages::{check_payload, MessageSent, MessageType};
pub use send::Interrupt;
