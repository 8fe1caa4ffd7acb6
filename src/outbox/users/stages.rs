//! The pipeline's and the reloader's handle: record the inventory, set the bounds and
//! durability, keep the age and size bounds, read what is pending at the end.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::inventory::Inventory;
use crate::outbox::{Durability, Outbox, OutboxError, Retention};

/// What the pipeline and the reloader may do to the outbox.
#[derive(Clone)]
pub struct StageOutbox {
    outbox: Outbox,
}

impl StageOutbox {
    pub(super) fn new(outbox: Outbox) -> StageOutbox {
        StageOutbox { outbox }
    }

    /// Records what the daemon is and runs with, for `tapegate status`.
    pub async fn note_inventory(&self, inventory: Inventory) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| s.note_inventory(&inventory))
            .await
    }

    /// Sets the bounds and durability of a reloaded config.
    pub async fn set_bounds(
        &self,
        max_pending: u64,
        retention: Retention,
        durability: Durability,
    ) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| {
                s.set_max_pending(max_pending);
                s.set_retention(retention);
                s.set_durability(durability)
            })
            .await
    }

    /// Captures pending now (0 if the outbox has closed).
    pub async fn pending(&self) -> u64 {
        self.outbox.call(|s| Ok(s.pending())).await.unwrap_or(0)
    }

    /// Keeps the age and size bounds every `every` until `stop`.
    pub async fn keep_bounds(self, every: Duration, stop: CancellationToken) {
        crate::outbox::keep_bounds(self.outbox, every, stop).await
    }
}
