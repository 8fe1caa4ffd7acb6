//! The state database, the one SQLite file in `gateway.state_dir`: opening it (for the
//! daemon, for the CLI, for a command that may be the first), who may create and write
//! it and the file system under it, the connection and its pragmas, the schema and its
//! migrations, the counters' and meta rows, how a MAC and a packet are kept in columns,
//! and the error all of it reports. The outbox and the side tables stand on it; it
//! imports neither (only config's `Durability`, the system clock and the domain's words).
//! Only those two reach it (the layout guard holds that).
//!
//! # Schema (`PRAGMA user_version` = 6)
//! The outbox's tables, then the side tables' (`rate_sends`, `heard`; the inventory is a
//! `meta` row).
//!
//! | table | holds |
//! |---|---|
//! | `pending` | captures not yet delivered: `id` (admission order), `mac` (48-bit integer), `captured_at` (epoch ms), `product_id`, `packet` (the `ble_packet` as sent), `rssi` |
//! | `dead_letters` | captures the service refused, with its `error` and `dead_at` |
//! | `tapes` | the latest reading of each tape, written behind: the daemon holds the readings it has not written in memory and writes them at most a minute later, with the answers or on their own, and when it stops (`latest.rs`; no history of readings is kept: the service keeps them) |
//! | `counters` | `admitted`, `delivered`, `dead_lettered`, `evicted`, `dead_letters_dropped`; `evicted_max_pending`, `evicted_max_age`, `evicted_max_bytes` (which bound evicted) |
//! | `meta` | `last_flush_ok_at`, `last_error`, `last_error_at`; the flusher's batches in flight and concurrency limit (`flush_in_flight`, `flush_concurrency`, and `last_flush_ok_at`: written at once for a new limit or the first delivery, else within `flush::STATE_EVERY` (5 s) of a change, and at stop; the running daemon's readers take them from memory); the BLE scanner's ladder counts (`scanner_*`); `clock_state` |
//! | `boots` | each boot seen (`boot_id` from the kernel) and `synced_at`, when its clock was first seen synchronised |
//! | `rate_sends` | per API identity, the times of its last requests that count in the service's shared rate window (spec 8; at most 10 each, see `api::rate`); shared by every CLI run |
//! | `heard` | the tapes heard in the last ten minutes (`side_tables::heard::HEARD_KEEP_MS`) that the service refused as unknown (not found): when last heard, strongest recent RSSI, `known` (1 once decoded since); written only in the transaction that records such a refusal (the daemon keeps every tape it hears in memory, `heard_now.rs`), read by `device add --nearest` |

mod access;
mod codec;
mod counters;
mod error;
pub(crate) mod open;
mod schema;
mod storage;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, Transaction};

pub(crate) use access::{create_state_dir, why_unwritable};
pub(crate) use codec::{
    int_to_mac, mac_to_int, packet_text, packet_value, packet_value_in, PACKET_STACK,
};
pub(crate) use counters::{add_counter, read_counters, set_meta, write_counters, Counters};
pub use error::OutboxError;
pub(crate) use schema::Broken;
#[cfg(test)]
pub(crate) use schema::SCHEMA_VERSION;
pub(crate) use storage::why_read_only;

use crate::config::Durability;

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
pub(crate) fn connect(
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
pub(crate) fn synchronous(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
}

/// Makes the next row inserted into `pending` in `tx` take an id of at least `floor`:
/// a row at `floor - 1` holds the place until [`release_id_floor`] removes it in the
/// same transaction, after the new rows are in.
pub(crate) fn hold_id_floor(tx: &Transaction<'_>, floor: i64) -> rusqlite::Result<()> {
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
pub(crate) fn release_id_floor(tx: &Transaction<'_>, floor: i64) -> rusqlite::Result<()> {
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
pub(crate) fn write_tx(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
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
