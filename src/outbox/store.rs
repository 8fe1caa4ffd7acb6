//! The SQLite store itself: synchronous, one connection. The daemon drives it from one
//! owner thread ([`super::Outbox`]); the CLI opens its own for `status` and
//! `dead-letters`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction};

use super::{Durability, OutboxError, DB_FILE, MAX_DEAD_LETTERS};
use crate::clock::now_ms;
use crate::record::{Capture, EpochMillis, Mac};

const SCHEMA_VERSION: i64 = 1;

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

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub durability: Durability,
    pub max_pending: u64,
    /// Caps the database file (SQLite `max_page_count`); a write past it fails with
    /// `SQLITE_FULL` exactly as a full disk does. `None`: no cap.
    pub max_page_count: Option<u32>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Full,
            max_pending: 1_000_000,
            max_page_count: None,
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

/// A pending capture as the flusher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCapture {
    pub id: i64,
    pub capture: Capture,
}

/// A decoded reading to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub qr_code: Option<String>,
    pub temp: Option<f64>,
    pub bat: Option<f64>,
    /// The server's item, as JSON text, so nothing it sent is lost.
    pub raw: String,
}

/// What became of one pending capture.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered(Reading),
    /// Refused by the service; the text is the server's error.
    DeadLetter(String),
}

/// A stored dead letter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    pub id: i64,
    pub mac: Mac,
    pub captured_at: EpochMillis,
    pub product_id: String,
    pub packet: String,
    pub rssi: Option<i16>,
    pub error: String,
    pub dead_at: EpochMillis,
}

/// The latest reading of one tape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TapeRow {
    pub mac: Mac,
    pub qr_code: Option<String>,
    pub captured_at: EpochMillis,
    pub decoded_at: EpochMillis,
    pub rssi: Option<i16>,
    pub temp: Option<f64>,
    pub bat: Option<f64>,
}

/// Counters and state for `tapegate status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub admitted: u64,
    pub delivered: u64,
    pub dead_letters: u64,
    pub evicted: u64,
    pub pending: u64,
    pub dead_letters_stored: u64,
    pub dead_letters_dropped: u64,
    /// Capture time of the oldest pending capture.
    pub oldest_pending_at: Option<EpochMillis>,
    pub last_flush_ok_at: Option<EpochMillis>,
    pub last_error: Option<String>,
    pub last_error_at: Option<EpochMillis>,
    pub tapes: u64,
    /// The BLE scanner's liveness ladder, accumulated across restarts.
    pub scanner: ScannerCounts,
    pub scanner_last_trouble: Option<String>,
    pub scanner_last_trouble_at: Option<EpochMillis>,
}

/// What the BLE scanner has been through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScannerCounts {
    /// Scans restarted (liveness ladder step 1).
    pub restarts: u64,
    /// Adapters re-acquired with a new BlueZ connection (step 2).
    pub reacquires: u64,
    /// Adverts dropped because the pipeline did not keep up.
    pub dropped: u64,
    /// Devices forgotten to bound memory.
    pub forgotten: u64,
}

/// The `counters` table. Write transactions read it afresh (the CLI may have changed
/// it); the copy in [`Store`] is the state after our last commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    admitted: u64,
    delivered: u64,
    dead_lettered: u64,
    evicted: u64,
    dead_letters_dropped: u64,
}

impl Counters {
    fn pending(&self) -> u64 {
        self.admitted - self.delivered - self.dead_lettered - self.evicted
    }
}

/// The outbox database.
pub struct Store {
    conn: Connection,
    options: StoreOptions,
    counters: Counters,
    path: PathBuf,
}

fn mac_to_int(mac: Mac) -> i64 {
    let o = mac.octets();
    o.iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b))
}

fn int_to_mac(v: i64) -> Mac {
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
        std::fs::create_dir_all(state_dir).map_err(|e| OutboxError::Unusable {
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
                let aside = quarantine(&path).map_err(|e| OutboxError::Unusable {
                    path: path.clone(),
                    reason: format!("it is corrupt ({reason}) and cannot be moved aside: {e}"),
                })?;
                report.quarantined = Some(aside);
                report.quarantine_reason = Some(reason);
                Self::open_checked(&path, &options).map_err(|b| b.into_error(&path))?
            }
            Err(b) => return Err(b.into_error(&path)),
        };
        report.pending = store.counters.pending();
        Ok((store, report))
    }

    fn open_checked(path: &Path, options: &StoreOptions) -> Result<Store, Broken> {
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
            path: path.to_path_buf(),
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
        conn.busy_timeout(Duration::from_secs(5))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
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
            path,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pending rows as the counters say (equal to the row count at every commit).
    pub fn pending(&self) -> u64 {
        self.counters.pending()
    }

    pub fn set_max_pending(&mut self, max_pending: u64) {
        self.options.max_pending = max_pending;
    }

    /// Commits one group of captures, evicting the oldest pending rows past
    /// `max_pending`. Returns how many were evicted. On error nothing changed.
    pub fn enqueue(&mut self, group: &[Capture]) -> Result<u64, OutboxError> {
        if group.is_empty() {
            return Ok(0);
        }
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let (evicted, next) = (|| -> rusqlite::Result<(u64, Counters)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO pending(mac, captured_at, product_id, packet, rssi) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for c in group {
                    insert.execute(params![mac_to_int(c.mac), c.ts_ms, c.product_id, c.packet, c.rssi])?;
                }
            }
            next.admitted += group.len() as u64;
            let excess = next.pending().saturating_sub(self.options.max_pending);
            let evicted = if excess > 0 {
                tx.execute(
                    "DELETE FROM pending WHERE id IN (SELECT id FROM pending ORDER BY id LIMIT ?1)",
                    [excess as i64],
                )? as u64
            } else {
                0
            };
            next.evicted += evicted;
            write_counters(&tx, &current, &next)?;
            Ok((evicted, next))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.counters = next;
        Ok(evicted)
    }

    /// The next batch: the oldest pending capture of each MAC, oldest first, at most
    /// `max` and each MAC once. Looks at most `scan_limit` rows deep.
    pub fn next_batch(
        &self,
        max: usize,
        scan_limit: usize,
    ) -> Result<Vec<PendingCapture>, OutboxError> {
        let mut out = Vec::with_capacity(max.min(256));
        let mut macs = HashSet::with_capacity(max);
        let mut after = i64::MIN;
        let mut scanned = 0usize;
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, mac, captured_at, product_id, packet, rssi FROM pending WHERE id > ?1 ORDER BY id LIMIT 1024",
        )?;
        loop {
            let rows: Vec<PendingCapture> = stmt
                .query_map([after], row_to_pending)?
                .collect::<Result<_, _>>()?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            scanned += rows.len();
            for r in rows {
                if macs.insert(r.capture.mac) {
                    out.push(r);
                    if out.len() == max {
                        return Ok(out);
                    }
                }
            }
            if scanned >= scan_limit {
                break;
            }
        }
        Ok(out)
    }

    /// Records what became of pending captures, in one transaction: a row leaves
    /// `pending` only here, together with its reading or dead letter. A row already
    /// gone (evicted while in flight) changes no counter. Returns how many rows left.
    pub fn settle(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
    ) -> Result<u64, OutboxError> {
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let (removed, next) = (|| -> rusqlite::Result<(u64, Counters)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            let mut removed = 0;
            let mut delete = tx.prepare_cached("DELETE FROM pending WHERE id = ?1")?;
            let mut reading = tx.prepare_cached(
                "INSERT INTO readings(mac, qr_code, captured_at, decoded_at, rssi, temp, bat, raw) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            let mut tape = tx.prepare_cached(
                "INSERT INTO tapes(mac, qr_code, captured_at, decoded_at, rssi, temp, bat, raw) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(mac) DO UPDATE SET qr_code = excluded.qr_code, captured_at = excluded.captured_at,
                   decoded_at = excluded.decoded_at, rssi = excluded.rssi, temp = excluded.temp, bat = excluded.bat, raw = excluded.raw
                 WHERE excluded.captured_at >= tapes.captured_at",
            )?;
            let mut dead = tx.prepare_cached(
                "INSERT INTO dead_letters(mac, captured_at, product_id, packet, rssi, error, dead_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (p, outcome) in outcomes {
                let gone = delete.execute([p.id])? == 1;
                removed += u64::from(gone);
                let c = &p.capture;
                let mac = mac_to_int(c.mac);
                match outcome {
                    Outcome::Delivered(r) => {
                        // A reading the service decoded is kept even if its row was
                        // evicted meanwhile; only the counter follows the row.
                        let row = params![mac, r.qr_code, c.ts_ms, now, c.rssi, r.temp, r.bat, r.raw];
                        reading.execute(row)?;
                        tape.execute(row)?;
                        next.delivered += u64::from(gone);
                    }
                    Outcome::DeadLetter(error) if gone => {
                        dead.execute(params![mac, c.ts_ms, c.product_id, c.packet, c.rssi, error, now])?;
                        next.dead_lettered += 1;
                    }
                    Outcome::DeadLetter(_) => {}
                }
            }
            if next.dead_lettered > current.dead_lettered {
                next.dead_letters_dropped += cap_dead_letters(&tx, MAX_DEAD_LETTERS)?;
            }
            write_counters(&tx, &current, &next)?;
            Ok((removed, next))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.counters = next;
        Ok(removed)
    }

    /// Records a successful flush.
    pub fn note_flush_ok(&mut self, at: EpochMillis) -> Result<(), OutboxError> {
        set_meta(&self.conn, "last_flush_ok_at", &at.to_string())?;
        Ok(())
    }

    /// Records the operator-readable cause of the latest failure.
    pub fn note_error(&mut self, cause: &str, at: EpochMillis) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        set_meta(&tx, "last_error", cause)?;
        set_meta(&tx, "last_error_at", &at.to_string())?;
        tx.commit()?;
        Ok(())
    }

    /// Adds to the scanner's counts kept for `status` (they accumulate across restarts
    /// of the daemon), and records its last trouble.
    pub fn add_scanner_counts(
        &mut self,
        counts: &ScannerCounts,
        last_trouble: Option<(&str, EpochMillis)>,
    ) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        for (key, n) in [
            ("scanner_restarts", counts.restarts),
            ("scanner_reacquires", counts.reacquires),
            ("scanner_dropped", counts.dropped),
            ("scanner_forgotten", counts.forgotten),
        ] {
            if n > 0 {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES (?1, ?2)
                     ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + CAST(excluded.value AS INTEGER)",
                    params![key, n.to_string()],
                )?;
            }
        }
        if let Some((reason, at)) = last_trouble {
            set_meta(&tx, "scanner_last_trouble", reason)?;
            set_meta(&tx, "scanner_last_trouble_at", &at.to_string())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Deletes readings decoded before `before` (the latest of each tape stays in `tapes`).
    pub fn prune_readings(&mut self, before: EpochMillis) -> Result<u64, OutboxError> {
        Ok(self
            .conn
            .execute("DELETE FROM readings WHERE decoded_at < ?1", [before])? as u64)
    }

    /// Counters and state, read in one transaction.
    pub fn stats(&self) -> Result<Stats, OutboxError> {
        let tx = self.conn.unchecked_transaction()?;
        let c = read_counters(&tx)?;
        let meta = |k: &str| -> rusqlite::Result<Option<String>> {
            tx.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
                .optional()
        };
        let int_meta = |k: &str| -> rusqlite::Result<Option<i64>> {
            Ok(meta(k)?.and_then(|v| v.parse().ok()))
        };
        let stats = Stats {
            admitted: c.admitted,
            delivered: c.delivered,
            dead_letters: c.dead_lettered,
            evicted: c.evicted,
            pending: c.pending(),
            dead_letters_stored: tx
                .query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))?,
            dead_letters_dropped: c.dead_letters_dropped,
            oldest_pending_at: tx
                .query_row(
                    "SELECT captured_at FROM pending ORDER BY id LIMIT 1",
                    [],
                    |r| r.get(0),
                )
                .optional()?,
            last_flush_ok_at: int_meta("last_flush_ok_at")?,
            last_error: meta("last_error")?,
            last_error_at: int_meta("last_error_at")?,
            tapes: tx.query_row("SELECT COUNT(*) FROM tapes", [], |r| r.get(0))?,
            scanner: ScannerCounts {
                restarts: int_meta("scanner_restarts")?.unwrap_or(0) as u64,
                reacquires: int_meta("scanner_reacquires")?.unwrap_or(0) as u64,
                dropped: int_meta("scanner_dropped")?.unwrap_or(0) as u64,
                forgotten: int_meta("scanner_forgotten")?.unwrap_or(0) as u64,
            },
            scanner_last_trouble: meta("scanner_last_trouble")?,
            scanner_last_trouble_at: int_meta("scanner_last_trouble_at")?,
        };
        tx.finish()?;
        Ok(stats)
    }

    /// Rows in `pending` counted one by one (for checks and tests; `stats` is cheaper).
    pub fn count_pending_rows(&self) -> Result<u64, OutboxError> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM pending", [], |r| r.get(0))?)
    }

    /// Every pending capture in admission order (for tests and small tools).
    pub fn pending_captures(&self) -> Result<Vec<PendingCapture>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, mac, captured_at, product_id, packet, rssi FROM pending ORDER BY id",
        )?;
        let rows = stmt
            .query_map([], row_to_pending)?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Stored dead letters, newest first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, mac, captured_at, product_id, packet, rssi, error, dead_at FROM dead_letters ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt
            .query_map([limit as i64], |r| {
                Ok(DeadLetter {
                    id: r.get(0)?,
                    mac: int_to_mac(r.get(1)?),
                    captured_at: r.get(2)?,
                    product_id: r.get(3)?,
                    packet: r.get(4)?,
                    rssi: r.get(5)?,
                    error: r.get(6)?,
                    dead_at: r.get(7)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Moves dead letters (all, or those of `mac`) back to `pending`, in one
    /// transaction. Returns how many.
    pub fn retry_dead_letters(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        let filter = mac.map(mac_to_int);
        let tx = write_tx(&mut self.conn)?;
        let moved = tx.execute(
            "INSERT INTO pending(mac, captured_at, product_id, packet, rssi)
             SELECT mac, captured_at, product_id, packet, rssi FROM dead_letters
             WHERE ?1 IS NULL OR mac = ?1 ORDER BY id",
            [filter],
        )? as u64;
        tx.execute(
            "DELETE FROM dead_letters WHERE ?1 IS NULL OR mac = ?1",
            [filter],
        )?;
        let current = read_counters(&tx)?;
        let mut next = current;
        // Re-queued captures count as pending again, so the invariant holds; only
        // those still counted as dead letters can move back.
        let back = moved.min(current.dead_lettered);
        next.dead_lettered -= back;
        next.admitted += moved - back;
        write_counters(&tx, &current, &next)?;
        tx.commit()?;
        self.counters = next;
        Ok(moved)
    }

    /// Deletes stored dead letters (all, or those of `mac`). Counters keep counting
    /// them as refused. Returns how many.
    pub fn purge_dead_letters(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        let filter = mac.map(mac_to_int);
        Ok(self.conn.execute(
            "DELETE FROM dead_letters WHERE ?1 IS NULL OR mac = ?1",
            [filter],
        )? as u64)
    }

    /// Tapes by most recent capture.
    pub fn tapes(&self, limit: usize) -> Result<Vec<TapeRow>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT mac, qr_code, captured_at, decoded_at, rssi, temp, bat FROM tapes ORDER BY captured_at DESC LIMIT ?1",
        )?;
        let rows = stmt
            .query_map([limit as i64], |r| {
                Ok(TapeRow {
                    mac: int_to_mac(r.get(0)?),
                    qr_code: r.get(1)?,
                    captured_at: r.get(2)?,
                    decoded_at: r.get(3)?,
                    rssi: r.get(4)?,
                    temp: r.get(5)?,
                    bat: r.get(6)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

/// A write transaction that takes the write lock at once, so that counters read in it
/// cannot be changed by another connection (the CLI) before it commits.
fn write_tx(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
}

fn row_to_pending(r: &rusqlite::Row<'_>) -> rusqlite::Result<PendingCapture> {
    Ok(PendingCapture {
        id: r.get(0)?,
        capture: Capture {
            mac: int_to_mac(r.get(1)?),
            ts_ms: r.get(2)?,
            product_id: r.get(3)?,
            packet: r.get(4)?,
            rssi: r.get(5)?,
        },
    })
}

/// Why a database could not be opened.
enum Broken {
    /// Move it aside and start fresh.
    Corrupt(String),
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
    match version {
        0 => {
            // A file that is not empty but has no schema of ours is not ours to reuse.
            let tables: i64 = conn
                .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(Broken::from_sqlite)?;
            if tables > 0 {
                return Err(Broken::Corrupt(format!(
                    "it has {tables} schema objects but no tapegate schema version"
                )));
            }
            conn.execute_batch(&format!(
                "BEGIN; {MIGRATION_1} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))
            .map_err(Broken::from_sqlite)
        }
        SCHEMA_VERSION => Ok(()),
        newer => Err(Broken::Other(format!(
            "its schema version {newer} is newer than this tapegate knows ({SCHEMA_VERSION}); upgrade tapegate"
        ))),
    }
}

fn read_counters(conn: &Connection) -> rusqlite::Result<Counters> {
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
fn write_counters(tx: &Transaction<'_>, old: &Counters, new: &Counters) -> rusqlite::Result<()> {
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

fn cap_dead_letters(tx: &Transaction<'_>, max: u64) -> rusqlite::Result<u64> {
    let stored: i64 = tx.query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))?;
    let excess = (stored as u64).saturating_sub(max);
    if excess == 0 {
        return Ok(0);
    }
    Ok(tx.execute(
        "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters ORDER BY id LIMIT ?1)",
        [excess as i64],
    )? as u64)
}

fn set_meta(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [key, value],
    )?;
    Ok(())
}

/// Moves a corrupt database (and its WAL and shared-memory files) aside; returns the
/// new path of the main file.
fn quarantine(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = now_ms();
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

    #[test]
    fn mac_survives_the_integer_column() {
        let m: Mac = "C0:FF:EE:00:00:01".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
        let m: Mac = "FF:FF:FF:FF:FF:FF".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
    }
}
