//! Opening the outbox: the [`Store`] type, creating and migrating the schema
//! (`PRAGMA user_version`), and moving a corrupt database aside. Also the helpers every
//! part of the store shares: the counters, the write transaction and the MAC column.
//! The queue (`queue.rs`) and the operator's reads and changes (`operator.rs`) are
//! further `impl Store` blocks.
//!
//! Synchronous, one connection: the daemon drives it from one owner thread
//! ([`super::Outbox`]); the CLI opens its own for `status` and `dead-letters`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, Transaction};

use super::access::{create_private_file, create_state_dir, why_unwritable};
use super::clock::ClockRows;
use super::latest::Latest;
use super::scan::Cursor;
use super::{Durability, OutboxError, DB_FILE};
use crate::clock::SharedClock;
use crate::record::Mac;

/// The schema, as the steps that build it: `MIGRATIONS[i]` takes a database from
/// `user_version` `i` to `i + 1`. Steps are only ever appended, and each adds (tables,
/// columns, indexes) rather than rewrites, so an older database upgrades in place.
const MIGRATIONS: &[&str] = &[
    MIGRATION_1,
    MIGRATION_CLOCK,
    MIGRATION_OPERATOR,
    MIGRATION_RATE_SENDS,
    MIGRATION_RETENTION,
    MIGRATION_NO_READINGS,
];

/// How long `open_existing` waits for a database being created or migrated beside it
/// (steps of this, this many times): migrating takes milliseconds.
const MIGRATION_WAIT_STEP: Duration = Duration::from_millis(20);
const MIGRATION_WAIT_STEPS: u32 = 100;

/// The `user_version` of a database this tapegate has fully migrated (`debian/preinst`
/// holds the same number, to refuse installing a tapegate older than the database).
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

const MIGRATION_1: &str = "
CREATE TABLE pending (
    id          INTEGER PRIMARY KEY,
    mac         INTEGER NOT NULL,
    captured_at INTEGER NOT NULL,
    product_id  TEXT NOT NULL,
    packet      TEXT NOT NULL,
    rssi        INTEGER
);
CREATE TABLE dead_letters (
    id          INTEGER PRIMARY KEY,
    mac         INTEGER NOT NULL,
    captured_at INTEGER NOT NULL,
    product_id  TEXT NOT NULL,
    packet      TEXT NOT NULL,
    rssi        INTEGER,
    error       TEXT NOT NULL,
    dead_at     INTEGER NOT NULL
);
CREATE TABLE readings (
    id          INTEGER PRIMARY KEY,
    mac         INTEGER NOT NULL,
    qr_code     TEXT,
    captured_at INTEGER NOT NULL,
    decoded_at  INTEGER NOT NULL,
    rssi        INTEGER,
    temp        REAL,
    bat         REAL,
    raw         TEXT NOT NULL
);
CREATE INDEX readings_by_decoded_at ON readings(decoded_at);
CREATE TABLE tapes (
    mac         INTEGER PRIMARY KEY,
    qr_code     TEXT,
    captured_at INTEGER NOT NULL,
    decoded_at  INTEGER NOT NULL,
    rssi        INTEGER,
    temp        REAL,
    bat         REAL,
    raw         TEXT NOT NULL
);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters(name, value) VALUES
    ('admitted', 0), ('delivered', 0), ('dead_lettered', 0), ('evicted', 0),
    ('dead_letters_dropped', 0);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
";

/// Clock repair (issue 13): the boots seen, and beside each live capture its boot, its
/// boot-relative time and whether it is held from delivery (see `clock.rs`).
const MIGRATION_CLOCK: &str = "
CREATE TABLE boots (
    id          INTEGER PRIMARY KEY,
    boot_id     TEXT NOT NULL UNIQUE,
    synced_at   INTEGER
);
ALTER TABLE pending ADD COLUMN boot INTEGER;
ALTER TABLE pending ADD COLUMN boot_ms INTEGER;
ALTER TABLE pending ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
CREATE INDEX pending_held ON pending(id) WHERE held = 1;
INSERT INTO counters(name, value) VALUES ('clock_repaired', 0), ('clock_estimated', 0);
";

/// The operator interface (issue 11): the service's shared rate window, kept here so
/// that separate CLI runs share it, and the tapes heard lately, written by the daemon for
/// `device add --nearest`.
const MIGRATION_OPERATOR: &str = "
CREATE TABLE rate_window (
    identity    TEXT PRIMARY KEY,
    started_at  INTEGER NOT NULL,
    used        INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE heard (
    mac         INTEGER PRIMARY KEY,
    last_at     INTEGER NOT NULL,
    best_rssi   INTEGER,
    best_at     INTEGER NOT NULL,
    known       INTEGER
);
CREATE INDEX heard_by_last_at ON heard(last_at);
";

/// Issue 21: the rate window becomes a sliding one (never more than 10 requests in any
/// window's length, whatever the service's alignment), so it keeps the time of each of
/// the last requests instead of a window's start and count.
const MIGRATION_RATE_SENDS: &str = "
DROP TABLE rate_window;
CREATE TABLE rate_sends (
    identity    TEXT NOT NULL,
    sent_at     INTEGER NOT NULL
);
CREATE INDEX rate_sends_by_identity ON rate_sends(identity);
";

/// Retention by age and size (issue 24): evictions are counted by the bound that made
/// them as well as in `evicted`; every eviction before this step was for `max_pending`.
const MIGRATION_RETENTION: &str = "
INSERT INTO counters(name, value)
    SELECT 'evicted_max_pending', value FROM counters WHERE name = 'evicted';
INSERT INTO counters(name, value) VALUES ('evicted_max_age', 0), ('evicted_max_bytes', 0);
";

/// Issue 22: no reading history. Nothing read it (the service keeps the readings); each
/// tape's latest stays in `tapes`, written behind (`latest.rs`).
const MIGRATION_NO_READINGS: &str = "
DROP INDEX readings_by_decoded_at;
DROP TABLE readings;
";

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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Full,
            max_pending: 1_000_000,
            max_page_count: None,
            clock: crate::clock::system(),
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

/// The `counters` table. Write transactions read it afresh (the CLI may have changed
/// it); the copy in [`Store`] is the state after our last commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) admitted: u64,
    pub(super) delivered: u64,
    pub(super) dead_lettered: u64,
    pub(super) evicted: u64,
    pub(super) dead_letters_dropped: u64,
}

impl Counters {
    pub(super) fn pending(&self) -> u64 {
        self.admitted - self.delivered - self.dead_lettered - self.evicted
    }
}

/// The outbox database.
pub struct Store {
    pub(super) conn: Connection,
    pub(super) options: StoreOptions,
    pub(super) counters: Counters,
    pub(super) clock: ClockRows,
    /// The age and size bounds (`retention.rs`); none until set.
    pub(super) retention: super::Retention,
    path: PathBuf,
    /// Device and inode of the file opened at `path`: a file deleted or replaced under
    /// the daemon is noticed by comparing them. `None` for the CLI's connections, and
    /// after a reopen that failed (so the next job tries again).
    identity: Option<(u64, u64)>,
    /// After a reopen, the first id of the fresh database's `pending` rows: ids of the
    /// old file may still be in flight, and must not name new rows when they settle.
    pub(super) id_floor: i64,
    /// The rows the flusher has claimed (in a batch in flight, or settled and not yet
    /// recorded): never evicted. In memory only: nothing is claimed at a start.
    pub(super) claimed: HashSet<i64>,
    /// Tapes' latest readings not yet written to `tapes` (`latest.rs`).
    pub(super) latest: Latest,
    /// Where the flusher's next fetch resumes (`scan.rs`).
    pub(super) cursor: Cursor,
}

/// The `packet` column (of `pending` and `dead_letters`): a packet written as upper-case
/// hex digits (the default `ble_packet` encoding) is kept as its bytes, half the bytes on
/// the card; any other text as it is. [`packet_text`] reads back the same text.
pub(super) fn packet_value(text: &str) -> rusqlite::types::ToSqlOutput<'_> {
    use rusqlite::types::{ToSqlOutput, Value, ValueRef};
    let digits = text.as_bytes();
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    };
    if digits.is_empty() || digits.len() % 2 != 0 {
        return ToSqlOutput::Borrowed(ValueRef::Text(digits));
    }
    let mut bytes = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks_exact(2) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => bytes.push(hi << 4 | lo),
            _ => return ToSqlOutput::Borrowed(ValueRef::Text(digits)),
        }
    }
    ToSqlOutput::Owned(Value::Blob(bytes))
}

/// The text of a `packet` column written by [`packet_value`].
pub(super) fn packet_text(
    v: rusqlite::types::ValueRef<'_>,
) -> rusqlite::types::FromSqlResult<String> {
    use rusqlite::types::{FromSql, ValueRef};
    match v {
        ValueRef::Blob(b) => Ok(crate::record::hex_upper(b)),
        other => String::column_result(other),
    }
}

/// The `mac` column holds the 48-bit address as an integer.
pub(super) fn mac_to_int(mac: Mac) -> i64 {
    let o = mac.octets();
    o.iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b))
}

pub(super) fn int_to_mac(v: i64) -> Mac {
    let mut o = [0u8; 6];
    for (i, b) in o.iter_mut().enumerate() {
        *b = (v >> (8 * (5 - i))) as u8;
    }
    Mac::new(o)
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

impl Store {
    /// The database path inside `state_dir`.
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join(DB_FILE)
    }

    /// Opens (creating `state_dir` and the database if needed), checks and migrates.
    /// A corrupt database is moved aside and a fresh one started; the report says so.
    pub fn open(
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

    fn open_checked(path: &Path, options: &StoreOptions) -> Result<Store, Broken> {
        create_private_file(path).map_err(Broken::Other)?;
        let conn = Connection::open(path).map_err(Broken::from_sqlite)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(Broken::from_sqlite)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(Broken::from_sqlite)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Broken::Other(format!(
                "cannot use WAL journal (got {mode})"
            )));
        }
        let sync = match options.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.execute_batch(&format!(
            "PRAGMA synchronous={sync}; PRAGMA temp_store=MEMORY;"
        ))
        .map_err(Broken::from_sqlite)?;
        if let Some(pages) = options.max_page_count {
            conn.query_row(&format!("PRAGMA max_page_count={pages}"), [], |_| Ok(()))
                .map_err(Broken::from_sqlite)?;
        }
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(Broken::from_sqlite)?;
        if check != "ok" {
            return Err(Broken::Corrupt(format!("quick_check: {check}")));
        }
        migrate(&conn)?;
        let counters = read_counters(&conn).map_err(Broken::from_sqlite)?;
        Ok(Store {
            conn,
            options: options.clone(),
            counters,
            clock: ClockRows::default(),
            retention: Default::default(),
            path: path.to_path_buf(),
            identity: file_identity(path),
            id_floor: 0,
            claimed: HashSet::new(),
            latest: Latest::default(),
            cursor: Cursor::default(),
        })
    }

    /// Opens an existing database for the CLI without creating or migrating anything.
    /// `Ok(None)` when there is no database yet.
    pub fn open_existing(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = Self::path_in(state_dir);
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Self::existing(conn, path)
    }

    /// Opens an existing database to read it only (`status`, `tapes`, `dead-letters
    /// list`, `check`), creating nothing, so that it works for a user who may read the
    /// state directory but not write it. Such a user cannot make the shared-memory file
    /// (`-shm`) a WAL database is read through: while the daemon runs it is there (and
    /// read as it is); when it is not, no one is writing, and the file is read as it
    /// lies on disk (SQLite's `immutable`), unless a write-ahead log left by a daemon
    /// that did not close it holds what the file lacks (then the error says whom to run
    /// as). `Ok(None)` when there is no database yet.
    pub fn open_existing_read_only(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = Self::path_in(state_dir);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(None);
        };
        let side = |suffix: &str| PathBuf::from(format!("{}{suffix}", path.display()));
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // The owner and root create the `-shm` as the owner's (SQLite hands it over).
        let euid = unsafe { libc::geteuid() };
        let may_create = {
            use std::os::unix::fs::MetadataExt;
            euid == 0 || euid == meta.uid()
        };
        let conn = if may_create || side("-shm").exists() {
            Connection::open_with_flags(&path, flags)?
        } else if side("-wal").metadata().is_ok_and(|m| m.len() > 0) {
            return Err(OutboxError::Unusable {
                path,
                reason: "the daemon is not running and left a write-ahead log (-wal) that only its user can apply: run this as that user or root, or start the daemon".into(),
            });
        } else {
            Connection::open_with_flags(
                format!("file:{}?immutable=1", uri_path(&path)),
                flags | OpenFlags::SQLITE_OPEN_URI,
            )?
        };
        Self::existing(conn, path)
    }

    fn existing(conn: Connection, path: PathBuf) -> Result<Option<Store>, OutboxError> {
        conn.busy_timeout(Duration::from_secs(5))?;
        let read_version = || conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0));
        let mut version = read_version()?;
        if version == 0 {
            // The daemon has created the file but not yet committed its schema (it is
            // starting right now), or the file is empty: either way nothing is stored yet.
            let tables: i64 =
                conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))?;
            if tables == 0 {
                return Ok(None);
            }
        }
        // A daemon starting beside us may be migrating it, one step a transaction:
        // give it the moment that takes before calling the version wrong.
        for _ in 0..MIGRATION_WAIT_STEPS {
            if version == 0 || version >= SCHEMA_VERSION {
                break;
            }
            std::thread::sleep(MIGRATION_WAIT_STEP);
            version = read_version()?;
        }
        if version != SCHEMA_VERSION {
            return Err(OutboxError::Unusable {
                path,
                reason: format!("schema version {version}, this tapegate reads {SCHEMA_VERSION}"),
            });
        }
        let counters = read_counters(&conn)?;
        Ok(Some(Store {
            conn,
            options: StoreOptions::default(),
            counters,
            clock: ClockRows::default(),
            retention: Default::default(),
            path,
            identity: None,
            id_floor: 0,
            claimed: HashSet::new(),
            latest: Latest::default(),
            cursor: Cursor::default(),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the file at our path is no longer the one we write to (deleted, or replaced
    /// by another file), or `None` while it is. One `stat`: cheap enough to ask before
    /// every commit.
    pub fn replaced(&self) -> Option<&'static str> {
        let ours = self.identity?;
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("deleted"),
            Err(_) => None,
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                ((m.dev(), m.ino()) != ours).then_some("replaced by another file")
            }
        }
    }

    /// When the database file was deleted or replaced under the daemon: logs it at
    /// ERROR and starts a fresh database at the path, so that what comes next is kept
    /// (writing on into an unlinked file would lose it at stop, silently). What the old
    /// file held is beyond reach. Returns whether a fresh database was opened.
    pub fn reopen_if_replaced(&mut self) -> bool {
        if self.identity.is_none() && self.id_floor == 0 {
            return false;
        }
        let why = match self.replaced() {
            Some(why) => why,
            // A reopen that failed before: try again.
            None if self.identity.is_none() => "unusable",
            None => return false,
        };
        // New rows start above every id the old file handed out, some of which may be
        // in a batch in flight.
        let floor = self
            .conn
            .query_row("SELECT IFNULL(MAX(id), 0) + 1 FROM pending", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_or(0)
            .max(self.id_floor);
        tracing::error!(
            path = %self.path.display(),
            why,
            pending_lost = self.counters.pending(),
            "the outbox database was {why} under the running daemon: what it held is gone; starting a fresh one"
        );
        // The old connection is closed first: its WAL must not meet the new file.
        let placeholder = Connection::open_in_memory();
        let Ok(placeholder) = placeholder else {
            return false;
        };
        drop(std::mem::replace(&mut self.conn, placeholder));
        self.identity = None;
        // Ids of the old file name no row of the new one.
        self.claimed.clear();
        self.cursor.reset();
        self.id_floor = floor.max(1);
        if let Some(dir) = self.path.parent() {
            let _ = create_state_dir(dir);
        }
        match Self::open_checked(&self.path, &self.options) {
            Ok(mut fresh) => {
                // `fresh` goes with the placeholder (and nothing to write).
                std::mem::swap(&mut self.conn, &mut fresh.conn);
                self.counters = fresh.counters;
                self.identity = fresh.identity;
                true
            }
            Err(b) => {
                tracing::error!(
                    error = %b.into_error(&self.path),
                    "cannot start a fresh outbox database; writes fail and are retried"
                );
                false
            }
        }
    }

    /// Writes the tapes' latest readings held in memory when they are due (`latest.rs`):
    /// the owner thread asks after every job, so that they are written within a minute
    /// or so even when no answer comes to carry them.
    pub fn write_latest_if_due(&mut self) -> Result<(), OutboxError> {
        if self.latest.due() {
            self.write_latest()?;
        }
        Ok(())
    }

    /// Writes the tapes' latest readings held in memory, in a transaction of their own
    /// (when the outbox closes, and when they are due and no answer carries them).
    pub fn write_latest(&mut self) -> Result<(), OutboxError> {
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
    pub fn pending(&self) -> u64 {
        self.counters.pending()
    }

    pub fn set_max_pending(&mut self, max_pending: u64) {
        self.options.max_pending = max_pending;
    }
}

impl Drop for Store {
    /// A store dropped (a test's, a tool's) writes the latest readings it holds; the
    /// daemon's owner thread writes them itself at close, and says when it cannot.
    fn drop(&mut self) {
        let _ = self.write_latest();
    }
}

/// `path` for a `file:` URI: every byte but the plainest percent-encoded (SQLite
/// decodes them back into the bytes of the name).
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Device and inode of the file at `path`, if it can be read.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Makes the next row inserted into `pending` in `tx` take an id of at least `floor`:
/// a row at `floor - 1` holds the place until [`release_id_floor`] removes it in the
/// same transaction, after the new rows are in.
pub(super) fn hold_id_floor(tx: &Transaction<'_>, floor: i64) -> rusqlite::Result<()> {
    if floor > 1 {
        tx.execute(
            "INSERT INTO pending(id, mac, captured_at, product_id, packet, rssi)
             SELECT ?1, 0, 0, '', '', NULL WHERE NOT EXISTS (SELECT 1 FROM pending WHERE id >= ?1)",
            [floor - 1],
        )?;
    }
    Ok(())
}

/// Removes the place holder of [`hold_id_floor`].
pub(super) fn release_id_floor(tx: &Transaction<'_>, floor: i64) -> rusqlite::Result<()> {
    if floor > 1 {
        tx.execute(
            "DELETE FROM pending WHERE id = ?1 AND product_id = '' AND packet = ''",
            [floor - 1],
        )?;
    }
    Ok(())
}

/// A write transaction that takes the write lock at once, so that counters read in it
/// cannot be changed by another connection (the CLI) before it commits.
pub(super) fn write_tx(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
}

/// Why a database could not be opened.
enum Broken {
    /// Move it aside and start fresh.
    Corrupt(String),
    /// Its schema is newer than this tapegate's: written by a newer version. Left as it
    /// is, never opened for writing.
    Newer(i64),
    Other(String),
}

impl Broken {
    fn from_sqlite(e: rusqlite::Error) -> Broken {
        if is_corruption(&e) {
            Broken::Corrupt(e.to_string())
        } else {
            Broken::Other(e.to_string())
        }
    }

    fn into_error(self, path: &Path) -> OutboxError {
        let reason = match self {
            Broken::Corrupt(r) => format!("corrupt: {r}"),
            Broken::Newer(found) => {
                return OutboxError::SchemaTooNew {
                    path: path.to_path_buf(),
                    found,
                    known: SCHEMA_VERSION,
                }
            }
            Broken::Other(r) => r,
        };
        OutboxError::Unusable {
            path: path.to_path_buf(),
            reason,
        }
    }
}

fn migrate(conn: &Connection) -> Result<(), Broken> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(Broken::from_sqlite)?;
    if version > SCHEMA_VERSION {
        return Err(Broken::Newer(version));
    }
    if version == 0 {
        // A file that is not empty but has no schema of ours is not ours to reuse.
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(Broken::from_sqlite)?;
        if tables > 0 {
            return Err(Broken::Corrupt(format!(
                "it has {tables} schema objects but no tapegate schema version"
            )));
        }
    }
    // Each step in its own transaction with its version, so an interrupted upgrade
    // resumes at the step it did not finish.
    for (from, step) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let to = from + 1;
        conn.execute_batch(&format!(
            "BEGIN; {step} PRAGMA user_version = {to}; COMMIT;"
        ))
        .map_err(Broken::from_sqlite)?;
    }
    if version < SCHEMA_VERSION {
        // The new version into the main file now, not at some later checkpoint: the
        // package's preinst reads it from the file's header to refuse a downgrade.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(Broken::from_sqlite)?;
    }
    Ok(())
}

pub(super) fn read_counters(conn: &Connection) -> rusqlite::Result<Counters> {
    let mut c = Counters::default();
    let mut stmt = conn.prepare_cached("SELECT name, value FROM counters")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let name: String = r.get(0)?;
        let v: i64 = r.get(1)?;
        let v = v.max(0) as u64;
        match name.as_str() {
            "admitted" => c.admitted = v,
            "delivered" => c.delivered = v,
            "dead_lettered" => c.dead_lettered = v,
            "evicted" => c.evicted = v,
            "dead_letters_dropped" => c.dead_letters_dropped = v,
            _ => {}
        }
    }
    Ok(c)
}

/// Writes the counters that changed from `old` to `new`.
pub(super) fn write_counters(
    tx: &Transaction<'_>,
    old: &Counters,
    new: &Counters,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached("UPDATE counters SET value = ?2 WHERE name = ?1")?;
    for (name, o, n) in [
        ("admitted", old.admitted, new.admitted),
        ("delivered", old.delivered, new.delivered),
        ("dead_lettered", old.dead_lettered, new.dead_lettered),
        ("evicted", old.evicted, new.evicted),
        (
            "dead_letters_dropped",
            old.dead_letters_dropped,
            new.dead_letters_dropped,
        ),
    ] {
        if o != n {
            stmt.execute(params![name, n as i64])?;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(i: u8) -> crate::record::Capture {
        crate::record::Capture {
            mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i]),
            ts_ms: 1_763_719_200_000 + i64::from(i),
            product_id: "tape".into(),
            packet: "F70E".into(),
            rssi: None,
            boot_ms: None,
        }
    }

    #[test]
    fn a_deleted_database_is_replaced_by_a_fresh_one_whose_ids_start_above_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .enqueue(&[capture(1), capture(2), capture(3)])
            .unwrap();
        assert!(!store.reopen_if_replaced(), "nothing happened to the file");

        std::fs::remove_file(Store::path_in(dir.path())).unwrap();
        assert_eq!(store.replaced(), Some("deleted"));
        assert!(store.reopen_if_replaced());
        assert_eq!(store.pending(), 0);
        store.enqueue(&[capture(4)]).unwrap();
        store.enqueue(&[capture(5)]).unwrap();
        let ids: Vec<i64> = store
            .pending_captures()
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(
            ids,
            [4, 5],
            "a batch of the old file in flight names none of these"
        );
        assert_eq!(store.pending(), 2);
        assert_eq!(store.count_pending_rows().unwrap(), 2);
        assert_eq!(store.replaced(), None);
    }

    #[test]
    fn a_packet_reads_back_as_the_text_it_was_whatever_it_is_kept_as() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (packet TEXT NOT NULL)")
            .unwrap();
        for text in [
            "F70E4956E29F84211E44FFB51E",
            "f70e4956",
            "F70e",
            "F70",
            "",
            "9w5WQw==",
            "0G",
            "00",
        ] {
            conn.execute("DELETE FROM t", []).unwrap();
            conn.execute("INSERT INTO t VALUES (?1)", [packet_value(text)])
                .unwrap();
            let (back, kind): (String, String) = conn
                .query_row("SELECT packet, typeof(packet) FROM t", [], |r| {
                    Ok((packet_text(r.get_ref(0)?)?, r.get(1)?))
                })
                .unwrap();
            assert_eq!(back, text);
            let upper_hex = !text.is_empty()
                && text.len() % 2 == 0
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
            assert_eq!(kind, if upper_hex { "blob" } else { "text" }, "{text}");
        }
    }

    #[test]
    fn mac_survives_the_integer_column() {
        let m: Mac = "C0:FF:EE:00:00:01".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
        let m: Mac = "FF:FF:FF:FF:FF:FF".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
    }
}
