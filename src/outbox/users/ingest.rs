//! The ingest stage's handle: commit a group of captures, and say why the database
//! cannot be written when a commit fails. Nothing else.

use std::sync::Arc;

use super::board::Board;
use crate::db::why_unwritable;
use crate::outbox::{Evictions, Outbox, OutboxError};
use crate::record::Capture;

/// What the ingest stage may do to the outbox.
#[derive(Clone)]
pub struct IngestWriter {
    outbox: Outbox,
    board: Arc<Board>,
}

impl IngestWriter {
    pub(super) fn new(outbox: Outbox, board: Arc<Board>) -> IngestWriter {
        IngestWriter { outbox, board }
    }

    /// Commits `group` (evicting past the bounds); the group comes back with the
    /// result, so that a failed commit keeps it.
    pub async fn commit(
        &self,
        group: Vec<Capture>,
    ) -> (Result<Evictions, OutboxError>, Vec<Capture>) {
        let (result, group) = self
            .outbox
            .call(move |store| {
                let r = store.enqueue_counted(&group);
                Ok((r, group))
            })
            .await
            .unwrap_or_else(|e| (Err(e), Vec::new()));
        if result.is_ok() {
            self.board.changed();
        }
        (result, group)
    }

    /// Why this process cannot write the database, if that is the cause (a cure that
    /// waiting will not bring).
    pub async fn why_unwritable(&self) -> Option<String> {
        self.outbox
            .call(|s| Ok(why_unwritable(s.path())))
            .await
            .ok()
            .flatten()
    }
}
