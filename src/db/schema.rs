//! The schema, as the steps that build it, and migrating a database to it (`PRAGMA
//! user_version`). A leaf of the state database's layer (`db`): it touches only the
//! connection it is handed and says why a database cannot be used ([`Broken`]).

use std::path::Path;

use rusqlite::{Connection, ErrorCode};

use super::error::OutboxError;

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

/// The `user_version` of a database this tapegate has fully migrated (`debian/preinst`
/// holds the same number, to refuse installing a tapegate older than the database).
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

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

/// Clock repair: the boots seen, and beside each live capture its boot, its
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

/// The operator interface: the service's shared rate window, kept here so
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

/// The rate window becomes a sliding one (never more than 10 requests in any
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

/// Retention by age and size: evictions are counted by the bound that made
/// them as well as in `evicted`; every eviction before this step was for `max_pending`.
const MIGRATION_RETENTION: &str = "
INSERT INTO counters(name, value)
    SELECT 'evicted_max_pending', value FROM counters WHERE name = 'evicted';
INSERT INTO counters(name, value) VALUES ('evicted_max_age', 0), ('evicted_max_bytes', 0);
";

/// No reading history. Nothing read it (the service keeps the readings); each
/// tape's latest stays in `tapes`, written behind (`latest.rs`).
const MIGRATION_NO_READINGS: &str = "
DROP INDEX readings_by_decoded_at;
DROP TABLE readings;
";

pub(crate) fn migrate(conn: &Connection) -> Result<(), Broken> {
    // Each step in its own transaction with its version, so an interrupted upgrade
    // resumes at the step it did not finish. The version is read inside the step's
    // write transaction: a second process creating the database at the same moment
    // (the daemon's first start and an operator's `activate`) waits for the other's
    // step and then finds it done, rather than building the tables again or taking the
    // half-built schema for a foreign file.
    let mut migrated = false;
    loop {
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(Broken::from_sqlite)?;
        let stepped = next_step(conn).and_then(|step| match step {
            Some((to, sql)) => conn
                .execute_batch(&format!("{sql} PRAGMA user_version = {to};"))
                .map(|()| true)
                .map_err(Broken::from_sqlite),
            None => Ok(false),
        });
        match stepped {
            Ok(stepped) => {
                conn.execute_batch("COMMIT").map_err(Broken::from_sqlite)?;
                if !stepped {
                    break;
                }
                migrated = true;
            }
            Err(e) => {
                // The step's own error is the one to tell; a rollback that fails too
                // leaves the transaction to end with the connection.
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
    if migrated {
        // The new version into the main file now, not at some later checkpoint: the
        // package's preinst reads it from the file's header to refuse a downgrade.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(Broken::from_sqlite)?;
    }
    Ok(())
}

/// The schema version and how many schema objects there are, in one statement and so
/// one snapshot: read apart, another process's migration step could commit between
/// them and show version 0 beside its tables.
pub(crate) fn version_and_objects(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version), \
                (SELECT COUNT(*) FROM sqlite_master)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Inside a write transaction: the step that takes the database on from its version
/// (the version it leads to, and its SQL), or `None` when it is current.
fn next_step(conn: &Connection) -> Result<Option<(i64, &'static str)>, Broken> {
    let (version, tables) = version_and_objects(conn).map_err(Broken::from_sqlite)?;
    if version > SCHEMA_VERSION {
        return Err(Broken::Newer(version));
    }
    if version == 0 && tables > 0 {
        // A file that is not empty but has no schema of ours is not ours to reuse.
        return Err(Broken::Corrupt(format!(
            "it has {tables} schema objects but no tapegate schema version"
        )));
    }
    Ok(MIGRATIONS
        .get(version.max(0) as usize)
        .map(|step| (version + 1, *step)))
}

/// Why a database could not be opened.
pub(crate) enum Broken {
    /// Move it aside and start fresh.
    Corrupt(String),
    /// Its schema is newer than this tapegate's: written by a newer version. Left as it
    /// is, never opened for writing.
    Newer(i64),
    Other(String),
}

impl Broken {
    pub(crate) fn from_sqlite(e: rusqlite::Error) -> Broken {
        if is_corruption(&e) {
            Broken::Corrupt(e.to_string())
        } else {
            Broken::Other(e.to_string())
        }
    }

    pub(crate) fn into_error(self, path: &Path) -> OutboxError {
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

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}
