//! The times of the last requests in the service's shared rate window (spec 8),
//! `rate_sends`, kept in the state database so that separate CLI runs share it:
//! [`RateWindow`], the operator commands' handle on that table and nothing else, over a
//! connection of its own. It touches the database layer only.

use std::path::Path;

use rusqlite::params;

use rusqlite::Connection;

use crate::db::{open, write_tx, OutboxError};
use crate::record::EpochMillis;

/// The operator commands' handle on the rate window (`rate_sends`): synchronous, one
/// connection; its user keeps it off the async threads.
pub(crate) struct RateWindow {
    conn: Connection,
}

impl RateWindow {
    /// The state database of `state_dir`: the daemon's, or a new one when the daemon has
    /// not run yet (the window must be shared all the same).
    pub(crate) fn open(state_dir: &Path) -> Result<RateWindow, OutboxError> {
        Ok(RateWindow {
            conn: open::existing_or_new(state_dir)?,
        })
    }

    /// Reads and replaces the times of an identity's last rate-limited requests in one
    /// write transaction, so two CLI runs cannot both take the last slot. `decide` gets
    /// the stored times and returns the times to store (or `None` to leave them) and its
    /// answer.
    pub(crate) fn sends<R>(
        &mut self,
        identity: &str,
        decide: impl FnOnce(Vec<EpochMillis>) -> (Option<Vec<EpochMillis>>, R),
    ) -> Result<R, OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        let stored: Vec<EpochMillis> = tx
            .prepare_cached("SELECT sent_at FROM rate_sends WHERE identity = ?1 ORDER BY sent_at")?
            .query_map([identity], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let (next, answer) = decide(stored.clone());
        if let Some(next) = next.filter(|n| *n != stored) {
            tx.execute("DELETE FROM rate_sends WHERE identity = ?1", [identity])?;
            let mut insert =
                tx.prepare_cached("INSERT INTO rate_sends(identity, sent_at) VALUES (?1, ?2)")?;
            for at in next {
                insert.execute(params![identity, at])?;
            }
        }
        tx.commit()?;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, RateWindow) {
        let dir = tempfile::tempdir().unwrap();
        let store = RateWindow::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn the_rate_sends_are_read_and_written_in_one_transaction() {
        let (_dir, mut store) = store();
        let seen = store.sends("id", |s| (Some(vec![7, 5]), s)).unwrap();
        assert!(seen.is_empty());
        let seen = store.sends("id", |s| (None, s)).unwrap();
        assert_eq!(seen, [5, 7]);
        assert!(store.sends("other", |s| (None, s)).unwrap().is_empty());
        store.sends("id", |_| (Some(vec![9]), ())).unwrap();
        assert_eq!(store.sends("id", |s| (None, s)).unwrap(), [9]);
    }
}
