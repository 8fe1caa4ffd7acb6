//! The readers' handle (`STATUS=`, the status page, `/metrics`, telemetry): the counters
//! and state, with the flusher's state as it is now in memory (not as last written), and
//! what the database knows of the tapes heard. Reads only.

use std::sync::Arc;

use tokio::sync::watch;

use super::board::Board;
use crate::outbox::{FlusherState, Outbox, OutboxError, Stats, TapeKnown};
use crate::record::Mac;

/// What the readers may ask of the outbox.
#[derive(Clone)]
pub struct Reader {
    outbox: Outbox,
    board: Arc<Board>,
}

impl Reader {
    pub(super) fn new(outbox: Outbox, board: Arc<Board>) -> Reader {
        Reader { outbox, board }
    }

    /// Counters and state; the flusher's part from memory while one runs.
    pub async fn stats(&self) -> Result<Stats, OutboxError> {
        let mut stats = self.outbox.call(|s| s.stats()).await?;
        self.overlay(&mut stats);
        Ok(stats)
    }

    /// [`Reader::stats`], and what the database knows of each of `macs` (the page).
    pub async fn stats_and_known(
        &self,
        macs: Vec<Mac>,
    ) -> Result<(Stats, Vec<TapeKnown>), OutboxError> {
        let (mut stats, known) = self
            .outbox
            .call(move |s| Ok((s.stats()?, s.tapes_known(&macs)?)))
            .await?;
        self.overlay(&mut stats);
        Ok((stats, known))
    }

    /// The flusher's state as it is now, if one has run.
    pub fn flusher(&self) -> Option<FlusherState> {
        *self.board.flusher.borrow()
    }

    /// Changes when this daemon wrote something `STATUS=` shows.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.board.changes.subscribe()
    }

    fn overlay(&self, stats: &mut Stats) {
        if let Some(live) = self.flusher() {
            overlay(stats, &live);
        }
    }
}

/// The flusher's state in memory over what the database last recorded of it.
pub fn overlay(stats: &mut Stats, live: &FlusherState) {
    stats.last_flush_ok_at = stats.last_flush_ok_at.max(live.ok_at);
    stats.flush_in_flight = Some(live.in_flight as u64);
    stats.flush_concurrency = Some(live.concurrency as u64);
}
