//! The seeder's handle ([`Seeder`]): a state directory's database written with no daemon
//! running, as the daemon's stages would write it. The end-to-end tests and the
//! benchmarks seed a gateway's outbox with it (a backlog to deliver, dead letters and
//! notes for `status` to show, a database a bound or a full disk meets) and read back on
//! the same connection; nothing of the daemon or the commands holds one. It touches the
//! [`Store`] it wraps, its opening (`store.rs`) and the owner thread (`handle.rs`).

use std::path::Path;

use super::handle::Outbox;
use super::status::Stats;
use super::store::{OpenReport, Store, StoreOptions};
use super::words::{Outcome, PendingCapture};
use crate::db::OutboxError;
use crate::record::{Capture, EpochMillis};

/// What seeds a state directory's outbox: admits captures, takes batches and records
/// their answers and the flusher's notes, as the daemon would; reads the counters and
/// the pending rows on its own connection.
pub struct Seeder {
    store: Store,
}

impl Seeder {
    /// Opens the database of `state_dir` as the daemon does (creating the directory and
    /// the database if needed, checking and migrating it, moving a corrupt one aside).
    pub fn open(
        state_dir: &Path,
        options: StoreOptions,
    ) -> Result<(Seeder, OpenReport), OutboxError> {
        let (store, report) = Store::open(state_dir, options)?;
        Ok((Seeder { store }, report))
    }

    /// Hands the database to an owner thread, as the daemon does at start: the stages'
    /// handles ([`super::Handles`]) reach it from there. The thread ends when the last
    /// [`Outbox`] is dropped.
    pub fn start(self) -> std::io::Result<(Outbox, std::thread::JoinHandle<()>)> {
        Outbox::start(self.store)
    }

    /// Where the database is.
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    /// Commits one group of captures as the ingest stage does, evicting past the bounds.
    /// Returns how many were evicted; on error nothing changed.
    pub fn enqueue(&mut self, group: &[Capture]) -> Result<u64, OutboxError> {
        self.store.enqueue(group)
    }

    /// The batch the flusher would take: the oldest pending capture of each MAC, oldest
    /// first, at most `max`, none held; looks at most `scan_limit` rows deep.
    pub fn next_batch(
        &self,
        max: usize,
        scan_limit: usize,
    ) -> Result<Vec<PendingCapture>, OutboxError> {
        self.store.next_batch(max, scan_limit)
    }

    /// Records what became of pending captures, in one transaction, as the flusher does
    /// with an answer. Returns how many rows left `pending`.
    pub fn settle(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
    ) -> Result<u64, OutboxError> {
        self.store.settle(outcomes, now)
    }

    /// Records a successful flush at `at`, for `status`.
    pub fn note_flush_ok(&mut self, at: EpochMillis) -> Result<(), OutboxError> {
        self.store.note_flush_ok(at)
    }

    /// Records the cause of a failed delivery at `at`, for `status`.
    pub fn note_error(&mut self, cause: &str, at: EpochMillis) -> Result<(), OutboxError> {
        self.store.note_error(cause, at)
    }

    /// Counters and state, read in one transaction.
    pub fn stats(&self) -> Result<Stats, OutboxError> {
        self.store.stats()
    }

    /// Every pending capture in admission order.
    pub fn pending_captures(&self) -> Result<Vec<PendingCapture>, OutboxError> {
        self.store.pending_captures()
    }
}
