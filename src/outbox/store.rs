//! The [`Store`] type and opening it for the daemon: creating the state directory and
//! the database, checking and migrating it (`db`), moving a corrupt one aside, and
//! writing the tapes' latest readings it holds. It touches `db`, the in-memory parts
//! it holds (`hold.rs`, `latest.rs`, `cursor.rs`) and `access.rs`; the other rooms of
//! the outbox are further `impl Store` blocks over it (the CLI's opens are `existing.rs`,
//! a database replaced under the daemon `reopen.rs`).
//!
//! Synchronous, one connection: the daemon drives it from one owner thread
//! ([`super::Outbox`]); the CLI opens its own for `status` and `dead-letters`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::access::{create_private_file, create_state_dir, why_unwritable};
use super::cursor::Cursor;
use super::db::{self, read_counters, write_tx, Broken, Counters, OutboxError, DB_FILE};
use super::hold::ClockRows;
use super::latest::Latest;
use super::words::Seen;
use crate::clock::SharedClock;
use crate::config::{Durability, Retention};

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
    /// The database path inside `state_dir`.
    pub(super) fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join(DB_FILE)
    }

    /// Opens (creating `state_dir` and the database if needed), checks and migrates.
    /// A corrupt database is moved aside and a fresh one started; the report says so.
    pub(crate) fn open(
        state_dir: &Path,
        options: StoreOptions,
    ) -> Result<(Store, OpenReport), OutboxError> {
        let path = Self::path_in(state_dir);
        create_state_dir(state_dir).map_err(|e| OutboxError::Unusable {
            path: path.clone(),
            reason: format!("cannot create {}: {e}", state_dir.display()),
        })?;
        let mut report = OpenReport {
            path: path.clone(),
            ..OpenReport::default()
        };
        let store = match Self::open_checked(&path, &options) {
            Ok(s) => s,
            Err(Broken::Corrupt(reason)) => {
                let aside = quarantine(&path, options.clock.wall_ms()).map_err(|e| {
                    OutboxError::Unusable {
                        path: path.clone(),
                        reason: format!("it is corrupt ({reason}) and cannot be moved aside: {e}"),
                    }
                })?;
                report.quarantined = Some(aside);
                report.quarantine_reason = Some(reason);
                Self::open_checked(&path, &options).map_err(|b| b.into_error(&path))?
            }
            Err(b) => {
                // Most often a file this user cannot write: say whose it is and the fix.
                return Err(match why_unwritable(&path) {
                    Some(why) => OutboxError::NotWritable { path, why },
                    None => b.into_error(&path),
                });
            }
        };
        // SQLite opens a file it may read but not write read-only, silently: every
        // commit would then fail. Said now, with the fix.
        let read_only = store
            .conn
            .is_readonly(rusqlite::DatabaseName::Main)
            .unwrap_or(false);
        if let Some(why) = why_unwritable(&path)
            .or_else(|| read_only.then(|| "SQLite could open it only read-only".to_string()))
        {
            return Err(OutboxError::NotWritable { path, why });
        }
        report.pending = store.counters.pending();
        Ok((store, report))
    }

    /// Opens the database at `path` for writing (`db::connect`), checked and migrated.
    pub(super) fn open_checked(path: &Path, options: &StoreOptions) -> Result<Store, Broken> {
        create_private_file(path).map_err(Broken::Other)?;
        let conn = db::connect(path, options.durability, options.max_page_count)?;
        let counters = read_counters(&conn).map_err(Broken::from_sqlite)?;
        Ok(Store::from_parts(
            conn,
            options.clone(),
            counters,
            path.to_path_buf(),
            file_identity(path),
        ))
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

/// Moves a corrupt database (and its WAL and shared-memory files) aside; returns the
/// new path of the main file.
fn quarantine(path: &Path, stamp: i64) -> std::io::Result<PathBuf> {
    let aside = PathBuf::from(format!("{}.corrupt-{stamp}", path.display()));
    std::fs::rename(path, &aside)?;
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", path.display()));
        if side.exists() {
            let to = PathBuf::from(format!("{}{suffix}", aside.display()));
            std::fs::rename(&side, &to)?;
        }
    }
    Ok(aside)
}
