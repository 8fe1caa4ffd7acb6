//! A database deleted or replaced under the running daemon: noticed before each job
//! (one `stat`), logged at ERROR, and a fresh one started at the path, its ids above
//! the old file's. It touches `db` and the [`Store`] it reopens.

use rusqlite::Connection;

use super::store::Store;
use crate::db::create_state_dir;

impl Store {
    /// Why the file at our path is no longer the one we write to (deleted, or replaced
    /// by another file), or `None` while it is. One `stat`: cheap enough to ask before
    /// every commit.
    pub(super) fn replaced(&self) -> Option<&'static str> {
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
    pub(super) fn reopen_if_replaced(&mut self) -> bool {
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
        self.seen.0 += 1;
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
}

#[cfg(test)]
mod tests {
    use crate::outbox::tests as fixture;
    use crate::outbox::{Store, StoreOptions};

    fn capture(i: u8) -> crate::record::Capture {
        crate::record::Capture {
            rssi: None,
            ..fixture::capture(fixture::mac(i), 1_763_719_200_000 + i64::from(i), "F70E")
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

        std::fs::remove_file(crate::db::open::path_in(dir.path())).unwrap();
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
}
