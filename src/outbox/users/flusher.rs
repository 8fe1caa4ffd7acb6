//! The flusher's handle: claim and fetch batches, settle their outcomes, note a
//! delivery error, and its own state: published in memory at once (for the readers of
//! this daemon), written for `tapegate status` only when the flusher says it is due
//! (`flush/state.rs`). Nothing else.

use std::collections::HashSet;
use std::sync::Arc;

use super::board::Board;
use crate::outbox::{
    AnswerNotes, Fetched, FlusherState, Outbox, OutboxError, Outcome, PendingCapture,
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

    /// Claims the rows `ids` still pending (a parked or split part), after letting go of
    /// `unclaim`; returns those claimed.
    pub async fn claim(&self, ids: Vec<i64>, unclaim: Vec<i64>) -> Result<Vec<i64>, OutboxError> {
        self.outbox.call(move |s| s.claim(&ids, &unclaim)).await
    }

    /// Fetches and claims the next batch of at most `max` rows, none of a MAC in `busy`,
    /// looking at most at `scan_limit` rows, after letting go of `unclaim`.
    pub async fn fetch(
        &self,
        max: usize,
        scan_limit: usize,
        busy: HashSet<Mac>,
        unclaim: Vec<i64>,
    ) -> Result<Fetched, OutboxError> {
        self.outbox
            .call(move |s| s.claim_next_batch(max, scan_limit, &busy, &unclaim))
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
