//! The clock keeper's handle: record this boot, and apply the clock's verdict (hold or
//! release captures). Nothing else.

use std::sync::Arc;

use super::board::Board;
use crate::outbox::{BootStart, ClockChange, Outbox, OutboxError, Released};

/// What the clock keeper may do to the outbox.
#[derive(Clone)]
pub struct ClockOutbox {
    outbox: Outbox,
    board: Arc<Board>,
}

impl ClockOutbox {
    pub(super) fn new(outbox: Outbox, board: Arc<Board>) -> ClockOutbox {
        ClockOutbox { outbox, board }
    }

    /// Records the boot `boot_id` and learns what the database knows of it.
    pub async fn begin_boot(&self, boot_id: String) -> Result<BootStart, OutboxError> {
        self.outbox.call(move |s| s.begin_boot(&boot_id)).await
    }

    /// Applies a change of the clock's verdict: captures held or released.
    pub async fn apply_clock(&self, change: ClockChange) -> Result<Released, OutboxError> {
        let released = self.outbox.call(move |s| s.apply_clock(&change)).await?;
        self.board.changed();
        Ok(released)
    }
}
