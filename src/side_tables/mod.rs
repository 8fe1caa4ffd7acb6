/*!
The state database's tables beside the outbox: what the daemon and the commands keep in
the same file (one place to back up, one schema, migrated together by the database layer,
`crate::db`) that is not a capture on its way to the service.

- the service's shared rate window (`rate_sends`), which separate CLI runs share:
  [`RateWindow`], the operator commands' handle, over a connection of its own;
- the tapes heard lately that the service refused as unknown (`heard`): written by the
  outbox inside the transaction that settles their answer, read by
  `device add --nearest` ([`heard`]);
- the inventory the daemon recorded at start, for the fleet's tools ([`inventory`]).

Each is a few functions over a connection or a transaction its caller holds; none holds
state of its own but the rate window's connection.
*/

pub(crate) mod heard;
pub(crate) mod inventory;
mod rate_window;

pub use heard::{HeardChanges, HeardTape};
pub(crate) use rate_window::RateWindow;
