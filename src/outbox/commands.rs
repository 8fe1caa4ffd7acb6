//! The commands' handles: a command (`status`, `tapes`, `dead-letters`, `check`,
//! `support-bundle`, `device`, the demo) opens its own short-lived connection, which WAL
//! allows while the daemon runs, and holds it as one of these, named for its role, so
//! that no command can do to the database more than its few calls. Synchronous: the
//! commands are. It touches the [`Store`] it wraps and its opens (`store.rs`), and the
//! side tables a device command reads.

use std::path::Path;

use super::fleet::{BootRecord, DeadLetterSummary};
use super::status::{DeadLetter, Stats};
use super::store::Store;
use super::words::{PendingCapture, TapeRow};
use crate::db::OutboxError;
use crate::inventory::Inventory;
use crate::record::{EpochMillis, Mac};
use crate::side_tables::{self, HeardTape};

/// What the commands that report read (`status`, `tapes`, `dead-letters list`, `check`,
/// `support-bundle`, the demo's lines), and the end-to-end tests beside a running
/// daemon: reads only.
pub struct StateReader {
    store: Store,
}

impl StateReader {
    /// The database of `state_dir`, to read only (`Store::open_existing_read_only`: it
    /// works for a user who may read the state directory but not write it). `Ok(None)`
    /// when there is no database yet.
    pub(crate) fn open_read_only(state_dir: &Path) -> Result<Option<StateReader>, OutboxError> {
        Ok(Store::open_existing_read_only(state_dir)?.map(|store| StateReader { store }))
    }

    /// The database of `state_dir`, opened as the daemon's user opens it, creating and
    /// migrating nothing. `Ok(None)` when there is no database yet.
    pub fn open(state_dir: &Path) -> Result<Option<StateReader>, OutboxError> {
        Ok(Store::open_existing(state_dir)?.map(|store| StateReader { store }))
    }

    /// Where the database of `state_dir` is (whether or not it exists).
    pub fn path_in(state_dir: &Path) -> std::path::PathBuf {
        crate::db::open::path_in(state_dir)
    }

    /// Counters and state.
    pub fn stats(&self) -> Result<Stats, OutboxError> {
        self.store.stats()
    }

    /// The inventory the daemon last recorded, if any (and if this version can read it).
    pub(crate) fn inventory(&self) -> Result<Option<Inventory>, OutboxError> {
        self.store.inventory()
    }

    /// Tapes by most recent capture.
    pub fn tapes(&self, limit: usize) -> Result<Vec<TapeRow>, OutboxError> {
        self.store.tapes(limit)
    }

    /// Stored dead letters, newest first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, OutboxError> {
        self.store.dead_letters(limit)
    }

    /// The stored dead letters summed up, the lists cut at `top`.
    pub(crate) fn dead_letter_summary(&self, top: usize) -> Result<DeadLetterSummary, OutboxError> {
        self.store.dead_letter_summary(top)
    }

    /// Every pending capture in admission order (for tests and small tools).
    pub fn pending_captures(&self) -> Result<Vec<PendingCapture>, OutboxError> {
        self.store.pending_captures()
    }

    /// Rows in `pending` counted one by one (for checks and tests; `stats` is cheaper).
    pub fn count_pending_rows(&self) -> Result<u64, OutboxError> {
        self.store.count_pending_rows()
    }

    /// The last `n` boots recorded, newest first.
    pub(crate) fn boots(&self, n: usize) -> Result<Vec<BootRecord>, OutboxError> {
        self.store.boots(n)
    }

    /// The oldest capture the flusher would send next, if any is pending.
    pub(crate) fn oldest_pending(&self) -> Result<Option<PendingCapture>, OutboxError> {
        Ok(self.store.next_batch(1, 1)?.into_iter().next())
    }
}

/// `dead-letters retry` and `dead-letters purge`: moves the stored dead letters back to
/// `pending`, or deletes them.
pub(crate) struct DeadLetterDesk {
    store: Store,
}

impl DeadLetterDesk {
    /// The database of `state_dir`, creating and migrating nothing. `Ok(None)` when
    /// there is no database yet.
    pub(crate) fn open(state_dir: &Path) -> Result<Option<DeadLetterDesk>, OutboxError> {
        Ok(Store::open_existing(state_dir)?.map(|store| DeadLetterDesk { store }))
    }

    /// Moves dead letters (all, or those of `mac`) back to `pending`. Returns how many.
    pub(crate) fn retry(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        self.store.retry_dead_letters(mac)
    }

    /// Deletes stored dead letters (all, or those of `mac`). Returns how many.
    pub(crate) fn purge(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        self.store.purge_dead_letters(mac)
    }
}

/// What the device commands (`device add`, its `--nearest`, the demo's dock) read and
/// change: the tapes heard that the service refused as unknown, and a new device's
/// dead letters, re-queued.
pub(crate) struct DeviceState {
    store: Store,
}

impl DeviceState {
    /// The state database of `state_dir`: the daemon's, or a new one when the daemon has
    /// not run yet.
    pub(crate) fn open(state_dir: &Path) -> Result<DeviceState, OutboxError> {
        Ok(DeviceState {
            store: Store::open_or_create(state_dir)?,
        })
    }

    /// The database of `state_dir`, creating and migrating nothing (the demo's dock).
    /// `Ok(None)` when there is no database yet.
    #[cfg(feature = "mock")]
    pub(crate) fn open_existing(state_dir: &Path) -> Result<Option<DeviceState>, OutboxError> {
        Ok(Store::open_existing(state_dir)?.map(|store| DeviceState { store }))
    }

    /// Tapes heard at or after `since` (capture time), loudest first.
    pub(crate) fn heard_since(&self, since: EpochMillis) -> Result<Vec<HeardTape>, OutboxError> {
        side_tables::heard::since(&self.store.conn, since)
    }

    /// Moves the dead letters of `mac` (a device the service knows now) back to
    /// `pending`. Returns how many.
    pub(crate) fn retry_dead_letters(&mut self, mac: Mac) -> Result<u64, OutboxError> {
        self.store.retry_dead_letters(Some(mac))
    }
}
