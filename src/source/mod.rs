/*!
Where advertisements come from. Every source implements [`Source`]: it
sends what it hears ([`Heard`]) into a bounded channel until it ends or is told to stop.
Replay and simulation are first-class sources beside BLE, not test hacks;
[`from_settings`] builds the one `[scanner]` names, and [`SourceHealth`] is what a live
source shares of its trouble. A source
may touch the config, the product table, the clock and the records; nothing downstream.
*/

pub mod ble;
mod configured;
mod health;
pub mod replay;
pub mod sim;
mod stream;

pub use configured::{from_settings, Configured};
pub use health::SourceHealth;
pub use stream::{Heard, Source, SourceError, SourceReport};
