//! One small handle per user of the outbox, each with the few calls that user needs; the
//! owner thread ([`super::Outbox`]) is the transport inside them. They may touch the
//! store's public methods only, and the [`Board`]: what the running daemon publishes of
//! itself in memory (the flusher's state, a change count) so that its readers (`STATUS=`,
//! the page, `/metrics`) need no database round trip for it.

mod board;
mod clock;
mod flusher;
mod ingest;
mod reader;
mod scanner;
mod stages;

use std::sync::Arc;

pub use clock::ClockOutbox;
pub use flusher::FlusherOutbox;
pub use ingest::IngestWriter;
pub use reader::{overlay as overlay_flusher, Reader};
pub use scanner::ScannerNotes;
pub use stages::StageOutbox;

use super::Outbox;
use board::Board;

/// Makes the handles over one owner thread; they share one [`Board`].
#[derive(Clone)]
pub struct Handles {
    outbox: Outbox,
    board: Arc<Board>,
}

impl Handles {
    pub fn new(outbox: &Outbox) -> Handles {
        Handles {
            outbox: outbox.clone(),
            board: Arc::new(Board::new()),
        }
    }

    /// The ingest stage's: commit a group, say why the database cannot be written.
    pub fn ingest(&self) -> IngestWriter {
        IngestWriter::new(self.outbox.clone(), self.board.clone())
    }

    /// The flusher's: claim, fetch, settle, note its errors and state.
    pub fn flusher(&self) -> FlusherOutbox {
        FlusherOutbox::new(self.outbox.clone(), self.board.clone())
    }

    /// The clock keeper's: record the boot, apply the clock's verdict.
    pub fn clock(&self) -> ClockOutbox {
        ClockOutbox::new(self.outbox.clone(), self.board.clone())
    }

    /// The readers' (`STATUS=`, the page, `/metrics`, telemetry): the counters and state.
    pub fn reader(&self) -> Reader {
        Reader::new(self.outbox.clone(), self.board.clone())
    }

    /// The health keeper's: the BLE scanner's counts and rate, for `tapegate status`.
    pub fn scanner(&self) -> ScannerNotes {
        ScannerNotes::new(self.outbox.clone())
    }

    /// The pipeline's and the reloader's: the inventory, the bounds, what is pending.
    pub fn stages(&self) -> StageOutbox {
        StageOutbox::new(self.outbox.clone())
    }
}
