//! The [`Store`] type over the connection the database layer opens (`db::open`: for
//! the daemon, creating, checking, migrating and moving a corrupt file aside; for the
//! CLI, an existing file only), and writing the tapes' latest readings it holds. It
//! touches `db` and the in-memory parts it holds (`hold.rs`, `latest.rs`, `cursor.rs`);
//! the other rooms of the outbox are further `impl Store` blocks over it (a database
//! replaced under the daemon is `reopen.rs`).
//!
//! Synchronous, one connection: the daemon drives it from one owner thread
//! ([`super::Outbox`]); the CLI opens its own for `status` and `dead-letters`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::cursor::Cursor;
use super::hold::ClockRows;
use super::latest::Latest;
use super::words::Seen;
use crate::clock::SharedClock;
use crate::config::{Durability, Retention};
use crate::db::open;
use crate::db::{read_counters, write_tx, Broken, Counters, OutboxError};

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub durability: Durability,
    pub max_pending: u64,
    /// Caps the database file (SQLite `max_page_count`); a write past it fails with
    /// `SQLITE_FULL` exactly as a full disk does. `None`: no cap.
    pub max_page_count: Option<u32>,
    /// The clock the age bound is measured by (the daemon's, handed in).
    pub clock: SharedClock,
    /// How long the tapes' unwritten readings wait ([`super::LATEST_EVERY`]; a debug
    /// build's test may ask for less).
    pub latest_every: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Full,
            max_pending: 1_000_000,
            max_page_count: None,
            clock: crate::clock::system(),
            latest_every: super::LATEST_EVERY,
        }
    }
}

/// What opening found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub path: PathBuf,
    /// Where a corrupt database was moved, if one was.
    pub quarantined: Option<PathBuf>,
    /// Why it was moved.
    pub quarantine_reason: Option<String>,
    /// Rows pending at open.
    pub pending: u64,
}

/// The outbox database.
pub(super) struct Store {
    pub(super) conn: Connection,
    pub(super) options: StoreOptions,
    pub(super) counters: Counters,
    pub(super) clock: ClockRows,
    /// The age and size bounds (`retention.rs`); none until set.
    pub(super) retention: Retention,
    pub(super) path: PathBuf,
    /// Device and inode of the file opened at `path`: a file deleted or replaced under
    /// the daemon is noticed by comparing them. `None` for the CLI's connections, and
    /// after a reopen that failed (so the next job tries again).
    pub(super) identity: Option<(u64, u64)>,
    /// After a reopen, the first id of the fresh database's `pending` rows: ids of the
    /// old file may still be in flight, and must not name new rows when they settle.
    pub(super) id_floor: i64,
    /// The rows the flusher has claimed (in a request on the wire, or answered and not
    /// yet recorded): never evicted. In memory only: nothing is claimed at a start.
    pub(super) claimed: HashSet<i64>,
    /// Bumped whenever rows leave `pending` other than by the flusher's answers (an
    /// eviction, a database replaced): see [`Seen`].
    pub(super) seen: Seen,
    /// Tapes' latest readings not yet written to `tapes` (`latest.rs`).
    pub(super) latest: Latest,
    /// Where the flusher's next fetch resumes (`scan.rs`).
    pub(super) cursor: Cursor,
}

impl Store {
    /// Opens (creating `state_dir` and the database if needed), checks and migrates.
    /// A corrupt database is moved aside and a fresh one started; the report says so.
    pub(crate) fn open(
        state_dir: &Path,
        options: StoreOptions,
    ) -> Result<(Store, OpenReport), OutboxError> {
        let stamp = options.clock.wall_ms();
        let path = open::path_in(state_dir);
        let opened = open::writable(state_dir, options.durability, options.max_page_count, stamp)?;
        let identity = file_identity(&path);
        let store = Self::over(opened.conn, options, path.clone(), identity)?;
        let (quarantined, quarantine_reason) = opened.quarantined.unzip();
        let report = OpenReport {
            path,
            quarantined,
            quarantine_reason,
            pending: store.counters.pending(),
        };
        Ok((store, report))
    }

    /// Opens the database at `path` for writing (`db::open::file`), checked and migrated.
    pub(super) fn open_checked(path: &Path, options: &StoreOptions) -> Result<Store, Broken> {
        let conn = open::file(path, options.durability, options.max_page_count)?;
        let counters = read_counters(&conn).map_err(Broken::from_sqlite)?;
        Ok(Store::from_parts(
            conn,
            options.clone(),
            counters,
            path.to_path_buf(),
            file_identity(path),
        ))
    }

    /// Opens an existing database for the CLI without creating or migrating anything
    /// (`db::open::existing`). `Ok(None)` when there is no database yet.
    pub(super) fn open_existing(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = open::path_in(state_dir);
        open::existing(state_dir)?
            .map(|conn| Self::over(conn, StoreOptions::default(), path, None))
            .transpose()
    }

    /// Opens an existing database to read it only (`db::open::existing_read_only`).
    pub(super) fn open_existing_read_only(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = open::path_in(state_dir);
        open::existing_read_only(state_dir)?
            .map(|conn| Self::over(conn, StoreOptions::default(), path, None))
            .transpose()
    }

    /// The daemon's database of `state_dir`, or a new one when the daemon has not run
    /// yet (the device commands).
    pub(super) fn open_or_create(state_dir: &Path) -> Result<Store, OutboxError> {
        let conn = open::existing_or_new(state_dir)?;
        Self::over(
            conn,
            StoreOptions::default(),
            open::path_in(state_dir),
            None,
        )
    }

    /// A store over `conn` with its counters read.
    fn over(
        conn: Connection,
        options: StoreOptions,
        path: PathBuf,
        identity: Option<(u64, u64)>,
    ) -> Result<Store, OutboxError> {
        let counters = read_counters(&conn)?;
        Ok(Store::from_parts(conn, options, counters, path, identity))
    }

    /// A store over `conn`, with nothing held in memory yet.
    pub(super) fn from_parts(
        conn: Connection,
        options: StoreOptions,
        counters: Counters,
        path: PathBuf,
        identity: Option<(u64, u64)>,
    ) -> Store {
        let latest = Latest::new(options.latest_every);
        Store {
            conn,
            options,
            counters,
            clock: ClockRows::default(),
            retention: Retention::default(),
            path,
            identity,
            id_floor: 0,
            claimed: HashSet::new(),
            seen: Seen::default(),
            latest,
            cursor: Cursor::default(),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the tapes' latest readings held in memory when they are due (`latest.rs`):
    /// the owner thread asks after every job, so that they are written within a minute
    /// or so even when no answer comes to carry them.
    pub(super) fn write_latest_if_due(&mut self) -> Result<(), OutboxError> {
        if self.latest.due() {
            self.write_latest()?;
        }
        Ok(())
    }

    /// Writes the tapes' latest readings held in memory, in a transaction of their own
    /// (when the outbox closes, and when they are due and no answer carries them).
    pub(super) fn write_latest(&mut self) -> Result<(), OutboxError> {
        if self.latest.is_empty() {
            return Ok(());
        }
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        self.latest.write(&tx).map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.latest.written();
        Ok(())
    }

    /// Pending rows as the counters say (equal to the row count at every commit).
    pub(super) fn pending(&self) -> u64 {
        self.counters.pending()
    }

    pub(super) fn set_max_pending(&mut self, max_pending: u64) {
        self.options.max_pending = max_pending;
    }

    /// Sets the age and size bounds (`retention.rs`; at start, and on a reload).
    pub(crate) fn set_retention(&mut self, retention: Retention) {
        self.retention = retention;
    }
}

impl Drop for Store {
    /// A store dropped (a test's, a tool's) writes the latest readings it holds; the
    /// daemon's owner thread writes them itself at close, and says when it cannot.
    fn drop(&mut self) {
        let _ = self.write_latest();
    }
}

/// Device and inode of the file at `path`, if it can be read.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
