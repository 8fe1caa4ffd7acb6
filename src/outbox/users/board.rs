//! What the running daemon publishes of itself in memory, shared by the handles: the
//! flusher's state and a count of this daemon's writes that `STATUS=` shows.

use tokio::sync::watch;

use crate::outbox::FlusherState;

/// What the running daemon publishes of itself, in memory.
#[derive(Debug)]
pub(super) struct Board {
    /// The flusher's state as it is now (`None` until a flusher has run).
    pub(super) flusher: watch::Sender<Option<FlusherState>>,
    /// Bumped after every write of this daemon that changes what `STATUS=` shows (a
    /// commit, a settle, a noted error, a clock release).
    pub(super) changes: watch::Sender<u64>,
}

impl Board {
    pub(super) fn new() -> Board {
        Board {
            flusher: watch::Sender::new(None),
            changes: watch::Sender::new(0),
        }
    }

    pub(super) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}
