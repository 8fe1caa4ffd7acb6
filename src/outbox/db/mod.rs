//! The outbox's database: the connection and its pragmas, the schema and its migrations,
//! the counters' and meta rows, how a MAC and a packet are kept in columns and the
//! outbox's error. Every other
//! outbox file stands on it; it imports none of them (only config's `Durability` and the
//! domain's words).

mod codec;
mod counters;
mod error;
mod schema;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, Transaction};

pub(super) use codec::{
    int_to_mac, mac_to_int, packet_text, packet_value, packet_value_in, PACKET_STACK,
};
pub(super) use counters::{add_counter, read_counters, set_meta, write_counters, Counters};
pub use error::OutboxError;
pub(super) use schema::{version_and_objects, Broken, SCHEMA_VERSION};

use crate::config::Durability;

/// A commit group holds at most this many captures.
pub const GROUP_MAX: usize = 1000;

/// Stored dead letters at most; past it the oldest are dropped (and counted).
pub const MAX_DEAD_LETTERS: u64 = 100_000;

/// The daemon's page cache, in KiB (`PRAGMA cache_size`; SQLite's default is 2000).
/// The daemon's work is local: ingest appends to the end of `pending`, the flusher reads
/// it from a cursor and deletes what it read, and the tapes' latest readings are written
/// together, in MAC order (`latest.rs`). A larger cache saves none of that work but is
/// filled all the same (by `quick_check` at open, by a long ingest), and was the largest
/// part of the daemon's heap: a drain takes the same CPU with this one and less
/// resident memory (`docs/benchmarks.md`).
/// A page the cache does not hold is read from the operating system's cache.
const CACHE_KIB: u32 = 512;

/// The database file inside `gateway.state_dir`.
pub const DB_FILE: &str = "outbox.db";

/// Opens the database at `path` (created empty if it is not there) in WAL mode with
/// the pragmas of `durability` and `max_page_count` and a page cache of [`CACHE_KIB`]
/// (set first: the check fills it), checks it (`quick_check`) and
/// migrates it to this tapegate's schema.
pub(super) fn connect(
    path: &Path,
    durability: Durability,
    max_page_count: Option<u32>,
) -> Result<Connection, Broken> {
    let conn = Connection::open(path).map_err(Broken::from_sqlite)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(Broken::from_sqlite)?;
    let mode = wal_mode(&conn).map_err(Broken::from_sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Broken::Other(format!(
            "cannot use WAL journal (got {mode})"
        )));
    }
    let sync = synchronous(durability);
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA temp_store=MEMORY;"
    ))
    .map_err(Broken::from_sqlite)?;
    if let Some(pages) = max_page_count {
        conn.query_row(&format!("PRAGMA max_page_count={pages}"), [], |_| Ok(()))
            .map_err(Broken::from_sqlite)?;
    }
    conn.execute_batch(&format!("PRAGMA cache_size=-{CACHE_KIB};"))
        .map_err(Broken::from_sqlite)?;
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(Broken::from_sqlite)?;
    if check != "ok" {
        return Err(Broken::Corrupt(format!("quick_check: {check}")));
    }
    schema::migrate(&conn)?;
    Ok(conn)
}

/// How long opening waits, at most, for another process that holds a new database
/// while switching it to WAL (steps of this, this many times).
const WAL_WAIT_STEP: Duration = Duration::from_millis(10);
const WAL_WAIT_STEPS: u32 = 500;

/// Switches the database to WAL (a no-op once it is) and returns the mode it is in.
/// On a database just created, another process opening it at the same moment holds a
/// lock that makes the switch fail at once as busy (SQLite calls no busy handler for
/// it): tried again, a step at a time, for as long as the busy timeout.
fn wal_mode(conn: &Connection) -> rusqlite::Result<String> {
    let mut tries = 0;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)) {
            Err(e)
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && tries < WAL_WAIT_STEPS =>
            {
                tries += 1;
                std::thread::sleep(WAL_WAIT_STEP);
            }
            result => return result,
        }
    }
}

/// `PRAGMA synchronous` for `durability`.
pub(super) fn synchronous(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's default page cache was the largest part of the daemon's heap,
    /// filled by the check at open: the daemon's connection has the small one from the
    /// start.
    #[test]
    fn the_daemons_connection_has_a_small_page_cache_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let Ok(conn) = connect(&dir.path().join(DB_FILE), Durability::Full, None) else {
            panic!("cannot open a fresh database");
        };
        let size: i64 = conn
            .query_row("PRAGMA cache_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(size, -i64::from(CACHE_KIB), "negative: KiB");
    }
}
