//! The flusher's handle: fetch batches, claim a request's rows and let go, settle their outcomes, note a
//! delivery error, and its own state: published in memory at once (for the readers of
//! this daemon), written for `tapegate status` only when the flusher says it is due
//! (`flush/state.rs`). Nothing else.

use std::collections::HashSet;
use std::sync::Arc;

use super::board::Board;
use crate::outbox::{
    AnswerNotes, Fetched, FlusherState, Outbox, OutboxError, Outcome, PendingCapture, RowKey, Seen,
};
use crate::record::{EpochMillis, Mac};

/// What the flusher may do to the outbox.
#[derive(Clone)]
pub struct FlusherOutbox {
    outbox: Outbox,
    board: Arc<Board>,
}

impl FlusherOutbox {
    pub(super) fn new(outbox: Outbox, board: Arc<Board>) -> FlusherOutbox {
        FlusherOutbox { outbox, board }
    }

    /// Claims the rows of a request about to go on the wire, read when the outbox was
    /// at `seen`; returns the ids of those still pending (see `Store::claim`).
    pub async fn claim(&self, rows: Vec<RowKey>, seen: Seen) -> Result<Vec<i64>, OutboxError> {
        self.outbox.call(move |s| s.claim(&rows, seen)).await
    }

    /// Lets go of the claims on `ids` (a request that must wait after all, or whose
    /// answer settles nothing).
    pub async fn let_go(&self, ids: Vec<i64>) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| {
                s.unclaim(&ids);
                Ok(())
            })
            .await
    }

    /// Fetches the next batch of at most `max` rows, none of a MAC in `busy`, looking
    /// at most at `scan_limit` rows, after taking back `unclaim`. Claims nothing.
    pub async fn fetch(
        &self,
        max: usize,
        scan_limit: usize,
        busy: HashSet<Mac>,
        unclaim: Vec<i64>,
    ) -> Result<Fetched, OutboxError> {
        self.outbox
            .call(move |s| s.fetch_next_batch(max, scan_limit, &busy, &unclaim))
            .await
    }

    /// Records outcomes (one transaction) with `notes`, after letting go of `unclaim`.
    pub async fn settle(
        &self,
        unclaim: Vec<i64>,
        rows: Vec<(PendingCapture, Outcome)>,
        at: EpochMillis,
        notes: AnswerNotes,
    ) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| {
                s.unclaim(&unclaim);
                s.settle_noting(&rows, at, &notes).map(drop)
            })
            .await?;
        self.board.changed();
        Ok(())
    }

    /// Records the cause of a failed delivery for `status` (and the flusher's state,
    /// when due), after letting go of `unclaim`.
    pub async fn note_error(
        &self,
        unclaim: Vec<i64>,
        cause: String,
        at: EpochMillis,
        state: Option<FlusherState>,
    ) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| {
                s.unclaim(&unclaim);
                s.note_error(&cause, at)?;
                state.map_or(Ok(()), |state| s.note_flusher(&state))
            })
            .await?;
        self.board.changed();
        Ok(())
    }

    /// Writes the flusher's state for `tapegate status`.
    pub async fn note_state(&self, state: FlusherState) -> Result<(), OutboxError> {
        self.outbox.call(move |s| s.note_flusher(&state)).await
    }

    /// Publishes the flusher's state to this daemon's readers (no database).
    pub fn publish(&self, state: FlusherState) {
        self.board.flusher.send_if_modified(|now| {
            let changed = *now != Some(state);
            *now = Some(state);
            changed
        });
    }
}
