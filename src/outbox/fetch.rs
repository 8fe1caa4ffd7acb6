//! Fetching for the flusher: the next batch (each MAC once, oldest first, none held),
//! read whole in one query, and the claims on the rows in flight (in memory, no write).
//! It touches `db`, the walk of `scan.rs`, the outbox's words and the [`Store`] it reads.

use std::collections::HashSet;

use super::db::{int_to_mac, packet_text, OutboxError};
use super::scan::Walk;
use super::store::Store;
use super::words::PendingCapture;
use crate::record::{Capture, Mac};

/// What [`Store::next_batch_excluding`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    /// The oldest pending capture of each MAC not busy, oldest first.
    pub rows: Vec<PendingCapture>,
    /// Every pending row was looked at: no MAC outside `busy` has a capture that is
    /// not in `rows`' MACs.
    pub complete: bool,
    /// With `complete`: some MAC of `rows` has more captures pending behind the one
    /// taken. (Without it, only what the walk happened to see: not to be relied on.)
    pub backlog: bool,
}

impl Store {
    /// The next batch: the oldest pending capture of each MAC, oldest first, at most
    /// `max` and each MAC once, none held for the clock (`clock.rs`). Looks at most
    /// `scan_limit` rows deep.
    pub fn next_batch(
        &self,
        max: usize,
        scan_limit: usize,
    ) -> Result<Vec<PendingCapture>, OutboxError> {
        Ok(self
            .next_batch_excluding(max, scan_limit, &HashSet::new())?
            .rows)
    }

    /// Like [`Store::next_batch`], skipping every capture of the MACs in `busy` (those
    /// in a batch in flight: a MAC is in at most one, so its captures keep their
    /// order). Also says whether the batch is as full as it can get. Walks from the
    /// front ([`Store::claim_next_batch`] resumes where its last walk stopped).
    pub fn next_batch_excluding(
        &self,
        max: usize,
        scan_limit: usize,
        busy: &HashSet<Mac>,
    ) -> Result<Fetched, OutboxError> {
        let walk = self.walk(max, scan_limit, busy)?;
        self.fetched(walk)
    }

    /// The chosen rows, read whole: one query (not one per row); a full batch is almost
    /// always the same length, so its statement stays cached.
    fn fetched(&self, walk: Walk) -> Result<Fetched, OutboxError> {
        let rows = if walk.chosen.is_empty() {
            Vec::new()
        } else {
            let sql = format!(
                "SELECT id, mac, captured_at, product_id, packet, rssi, boot_ms FROM pending WHERE id IN ({}) ORDER BY id",
                vec!["?"; walk.chosen.len()].join(",")
            );
            let mut read = self.conn.prepare_cached(&sql)?;
            let rows = read
                .query_map(
                    rusqlite::params_from_iter(walk.chosen.iter()),
                    row_to_pending,
                )?
                .collect::<Result<_, _>>()?;
            rows
        };
        Ok(Fetched {
            rows,
            complete: walk.complete,
            backlog: walk.backlog,
        })
    }

    /// [`Store::next_batch_excluding`] for the flusher: after letting go of the claims
    /// in `unclaim`, resuming where its last walk stopped (`scan.rs`), and claiming the
    /// rows it returns (see [`Store::claim`]).
    pub fn claim_next_batch(
        &mut self,
        max: usize,
        scan_limit: usize,
        busy: &HashSet<Mac>,
        unclaim: &[i64],
    ) -> Result<Fetched, OutboxError> {
        self.unclaim(unclaim);
        let walk = self.walk_on(max, scan_limit, busy)?;
        let fetched = self.fetched(walk)?;
        self.claimed.extend(fetched.rows.iter().map(|r| r.id));
        Ok(fetched)
    }

    /// Claims the rows `ids` that are still pending, after letting go of the claims in
    /// `unclaim`, and returns them. A claimed row is never evicted, until its outcome is
    /// recorded ([`Store::settle`]) or its claim let go ([`Store::unclaim`]): so the
    /// flusher sends only rows the outbox holds, and a row it sent is never counted
    /// evicted. In memory: no write.
    pub fn claim(&mut self, ids: &[i64], unclaim: &[i64]) -> Result<Vec<i64>, OutboxError> {
        self.unclaim(unclaim);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id FROM pending WHERE id IN ({}) ORDER BY id",
            vec!["?"; ids.len()].join(",")
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let present: Vec<i64> = stmt
            .query_map(rusqlite::params_from_iter(ids.iter()), |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        self.claimed.extend(present.iter().copied());
        self.cursor.claimed(&present);
        Ok(present)
    }

    /// Lets go of the claims on `ids`: those rows may be evicted again (and fetched).
    pub fn unclaim(&mut self, ids: &[i64]) {
        for id in ids {
            self.claimed.remove(id);
            self.cursor.lower(*id);
        }
    }

    /// The rows claimed now, in id order (for checks).
    pub fn claimed(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.claimed.iter().copied().collect();
        ids.sort_unstable();
        ids
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
            "SELECT id, mac, captured_at, product_id, packet, rssi, boot_ms FROM pending ORDER BY id",
        )?;
        let rows = stmt
            .query_map([], row_to_pending)?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

fn row_to_pending(r: &rusqlite::Row<'_>) -> rusqlite::Result<PendingCapture> {
    Ok(PendingCapture {
        id: r.get(0)?,
        capture: Capture {
            mac: int_to_mac(r.get(1)?),
            ts_ms: r.get(2)?,
            product_id: r.get(3)?,
            packet: packet_text(r.get_ref(4)?)?,
            rssi: r.get(5)?,
            boot_ms: r.get(6)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{Outcome, StoreOptions};

    fn capture(i: u8) -> Capture {
        Capture {
            mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i]),
            ts_ms: 1_763_719_200_000 + i64::from(i),
            product_id: "tape".into(),
            packet: format!("{i:02X}"),
            rssi: None,
            boot_ms: None,
        }
    }

    fn open(dir: &tempfile::TempDir, max_pending: u64) -> Store {
        let options = StoreOptions {
            max_pending,
            ..StoreOptions::default()
        };
        Store::open(dir.path(), options).unwrap().0
    }

    fn pending_ids(s: &Store) -> Vec<i64> {
        s.pending_captures().unwrap().iter().map(|p| p.id).collect()
    }

    #[test]
    fn a_claimed_row_is_never_evicted_and_the_bound_still_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 4);
        s.enqueue(&(1..=4).map(capture).collect::<Vec<_>>())
            .unwrap();
        let f = s.claim_next_batch(2, 100, &HashSet::new(), &[]).unwrap();
        let taken: Vec<i64> = f.rows.iter().map(|r| r.id).collect();
        assert_eq!(taken, [1, 2]);
        assert_eq!(s.claimed(), [1, 2]);
        // Two more: the oldest rows not claimed go instead (3 and 4).
        assert_eq!(s.enqueue(&[capture(5), capture(6)]).unwrap(), 2);
        assert_eq!(pending_ids(&s), [1, 2, 5, 6]);
        // Every older row claimed: the bound holds all the same, with the new ones.
        s.claim(&[5, 6], &[]).unwrap();
        assert_eq!(s.enqueue(&[capture(7)]).unwrap(), 1);
        assert_eq!(pending_ids(&s), [1, 2, 5, 6]);
        let stats = s.stats().unwrap();
        assert_eq!((stats.pending, stats.evicted, stats.admitted), (4, 3, 7));
    }

    #[test]
    fn recording_an_outcome_or_letting_go_ends_a_claim_and_only_rows_still_held_are_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 3);
        s.enqueue(&(1..=3).map(capture).collect::<Vec<_>>())
            .unwrap();
        let f = s.claim_next_batch(3, 100, &HashSet::new(), &[]).unwrap();
        let row = f.rows[0].clone();
        s.settle(&[(row, Outcome::DeadLetter("refused".into()))], 0)
            .unwrap();
        assert_eq!(s.claimed(), [2, 3]);
        // Letting go (a part parked by the flusher): row 2 may go now.
        s.unclaim(&[2]);
        s.enqueue(&[capture(4), capture(5)]).unwrap();
        assert_eq!(pending_ids(&s), [3, 4, 5]);
        // Claiming again before a send: only what the outbox still holds.
        assert_eq!(s.claim(&[2, 3, 4], &[3]).unwrap(), [3, 4]);
        assert_eq!(s.claimed(), [3, 4]);
    }
}
