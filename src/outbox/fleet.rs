//! What the fleet's tools read of the state database through the store: the stored
//! dead letters in a few lines, the boots seen, the inventory the daemon recorded at
//! start (kept by `side_tables::inventory`), and `outbox.durability` set on a reload.
//!
//! It touches `db`, the side tables, the inventory's type and the [`Store`] it reads.

use super::store::Store;
use crate::config::Durability;
use crate::db::{int_to_mac, read_counters, synchronous, OutboxError};
use crate::inventory::Inventory;
use crate::side_tables;

impl Store {
    /// Sets `outbox.durability` on the open database (a reload).
    pub(super) fn set_durability(&mut self, durability: Durability) -> Result<(), OutboxError> {
        let sync = synchronous(durability);
        self.conn
            .execute_batch(&format!("PRAGMA synchronous={sync};"))?;
        self.options.durability = durability;
        Ok(())
    }

    /// Records the running daemon's inventory (`side_tables::inventory`).
    pub(super) fn note_inventory(&mut self, inventory: &Inventory) -> Result<(), OutboxError> {
        side_tables::inventory::note(&self.conn, inventory)
    }

    /// The inventory the daemon last recorded, if any.
    pub(super) fn inventory(&self) -> Result<Option<Inventory>, OutboxError> {
        side_tables::inventory::read(&self.conn)
    }
}

/// The stored dead letters in a few lines, for the support bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterSummary {
    /// Dead letters stored now.
    pub stored: u64,
    /// Refused captures ever (stored or not).
    pub total: u64,
    pub oldest_dead_at: Option<crate::record::EpochMillis>,
    pub newest_dead_at: Option<crate::record::EpochMillis>,
    /// The most frequent errors: (the service's error, how many), most first.
    pub by_error: Vec<(String, u64)>,
    /// The tapes with the most dead letters: (MAC, how many), most first.
    pub by_mac: Vec<(String, u64)>,
}

/// A boot the state database has seen, and when its clock was first seen synchronised
/// (when its held captures were repaired).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BootRecord {
    pub boot_id: String,
    pub synced_at: Option<crate::record::EpochMillis>,
}

impl Store {
    /// [`DeadLetterSummary`], the lists cut at `top`.
    pub(super) fn dead_letter_summary(&self, top: usize) -> Result<DeadLetterSummary, OutboxError> {
        let c = &self.conn;
        let (stored, oldest, newest): (u64, Option<i64>, Option<i64>) = c.query_row(
            "SELECT COUNT(*), MIN(dead_at), MAX(dead_at) FROM dead_letters",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        let grouped = |sql: &str| -> Result<Vec<(String, u64)>, OutboxError> {
            let mut stmt = c.prepare(sql)?;
            let rows = stmt
                .query_map([top as i64], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        };
        let by_error = grouped(
            "SELECT error, COUNT(*) AS n FROM dead_letters GROUP BY error ORDER BY n DESC, error LIMIT ?1",
        )?;
        let mut stmt = c.prepare(
            "SELECT mac, COUNT(*) AS n FROM dead_letters GROUP BY mac ORDER BY n DESC, mac LIMIT ?1",
        )?;
        let by_mac = stmt
            .query_map([top as i64], |r| {
                Ok((int_to_mac(r.get(0)?).to_string(), r.get::<_, u64>(1)?))
            })?
            .collect::<Result<_, _>>()?;
        Ok(DeadLetterSummary {
            stored,
            total: read_counters(c)?.dead_lettered,
            oldest_dead_at: oldest,
            newest_dead_at: newest,
            by_error,
            by_mac,
        })
    }

    /// The last `n` boots recorded, newest first.
    pub(super) fn boots(&self, n: usize) -> Result<Vec<BootRecord>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare("SELECT boot_id, synced_at FROM boots ORDER BY id DESC LIMIT ?1")?;
        let rows = stmt
            .query_map([n as i64], |r| {
                Ok(BootRecord {
                    boot_id: r.get(0)?,
                    synced_at: r.get(1)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::SCHEMA_VERSION;
    use crate::outbox::StoreOptions;

    fn header_version(db: &std::path::Path) -> u32 {
        let bytes = std::fs::read(db).unwrap();
        u32::from_be_bytes(bytes[60..64].try_into().unwrap())
    }

    /// The package refuses a downgrade by the schema this tapegate reads: the number in
    /// `debian/preinst` is this one.
    #[test]
    fn the_package_knows_the_schema_this_tapegate_reads() {
        let preinst = include_str!("../../debian/preinst");
        assert!(
            preinst
                .lines()
                .any(|l| l == format!("SCHEMA={SCHEMA_VERSION}")),
            "debian/preinst must say SCHEMA={SCHEMA_VERSION}"
        );
    }

    /// A database written by a newer tapegate is refused with its version and ours, and
    /// left exactly as it was.
    #[test]
    fn a_newer_database_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        drop(store);
        let db = crate::db::open::path_in(dir.path());
        {
            let c = rusqlite::Connection::open(&db).unwrap();
            c.execute_batch(&format!(
                "INSERT INTO pending(mac, captured_at, product_id, packet) VALUES (1, 2, 'tape', 'F70E');
                 PRAGMA user_version = {};",
                SCHEMA_VERSION + 1
            ))
            .unwrap();
        }
        let before = std::fs::read(&db).unwrap();
        let err = Store::open(dir.path(), StoreOptions::default())
            .err()
            .expect("refused");
        match &err {
            OutboxError::SchemaTooNew { found, known, .. } => {
                assert_eq!((*found, *known), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("{other:?}"),
        }
        let shown = err.to_string();
        assert!(
            shown.contains("newer tapegate") && shown.contains("untouched"),
            "{shown}"
        );
        assert_eq!(std::fs::read(&db).unwrap(), before, "the file was changed");
        assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("corrupt")));
    }

    /// An outbox of the previous schema migrates in place: rows and counters kept, the
    /// evictions so far counted against `max_pending`, and the new version in the file's
    /// header at once (where the package's preinst reads it).
    #[test]
    fn the_previous_schema_migrates_keeping_rows_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        drop(store);
        let db = crate::db::open::path_in(dir.path());
        {
            // Back to the schema before retention (4), as the tapegate before it left it
            // (with the reading history that schema 6 drops).
            let c = rusqlite::Connection::open(&db).unwrap();
            c.execute_batch(
                "DELETE FROM counters WHERE name LIKE 'evicted_max_%';
                 CREATE TABLE readings (id INTEGER PRIMARY KEY, mac INTEGER NOT NULL, qr_code TEXT,
                     captured_at INTEGER NOT NULL, decoded_at INTEGER NOT NULL, rssi INTEGER,
                     temp REAL, bat REAL, raw TEXT NOT NULL);
                 CREATE INDEX readings_by_decoded_at ON readings(decoded_at);
                 INSERT INTO readings(mac, captured_at, decoded_at, raw) VALUES (1, 2, 3, '{}');
                 INSERT INTO pending(mac, captured_at, product_id, packet) VALUES (1, 2, 'tape', 'F70E');
                 UPDATE counters SET value = 8 WHERE name = 'admitted';
                 UPDATE counters SET value = 7 WHERE name = 'evicted';
                 PRAGMA user_version = 4;",
            )
            .unwrap();
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
        }
        assert_eq!(header_version(&db), 4);
        let (store, report) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(report.pending, 1);
        assert_eq!(header_version(&db), SCHEMA_VERSION as u32);
        let evicted_by: i64 = store
            .conn
            .query_row(
                "SELECT value FROM counters WHERE name = 'evicted_max_pending'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(evicted_by, 7);
        assert_eq!(store.stats().unwrap().evicted, 7);
        let readings: i64 = store
            .conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'readings%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(readings, 0, "the reading history is dropped (schema 6)");
    }
}
