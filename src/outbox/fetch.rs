//! Fetching for the flusher: the next batch (each MAC once, oldest first, none held),
//! read whole in one query; and the claims on the rows on their way to the service (in
//! memory, no write). It touches `db`, the walk of `scan.rs`, the outbox's words and the
//! [`Store`] it reads.
//!
//! A fetch claims nothing: a batch found may wait (to fill, out a backoff, for a token)
//! and a batch that waits holds no claim. Its request claims its rows as it goes on the
//! wire ([`Store::claim`]), and sends only those the outbox still holds; the claim ends
//! when the answer is recorded ([`Store::settle`]) or read as a failure
//! ([`Store::unclaim`]).

use std::collections::HashSet;

use super::scan::Walk;
use super::store::Store;
use super::words::{PendingCapture, RowKey, Seen};
use crate::db::{int_to_mac, mac_to_int, packet_text, OutboxError};
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
    /// When the rows were read, for claiming them later ([`super::FlusherOutbox::claim`]).
    pub seen: Seen,
}

impl Store {
    /// The next batch: the oldest pending capture of each MAC, oldest first, at most
    /// `max` and each MAC once, none held for the clock (`clock.rs`). Looks at most
    /// `scan_limit` rows deep.
    pub(super) fn next_batch(
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
    /// front ([`Store::fetch_next_batch`] resumes where its last walk stopped).
    pub(super) fn next_batch_excluding(
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
            seen: self.seen,
        })
    }

    /// [`Store::next_batch_excluding`] for the flusher: after taking back the rows in
    /// `unclaim` (see [`Store::unclaim`]), resuming where its last walk stopped
    /// (`scan.rs`). Claims nothing (see the module doc).
    pub(super) fn fetch_next_batch(
        &mut self,
        max: usize,
        scan_limit: usize,
        busy: &HashSet<Mac>,
        unclaim: &[i64],
    ) -> Result<Fetched, OutboxError> {
        self.unclaim(unclaim);
        let walk = self.walk_on(max, scan_limit, busy)?;
        self.fetched(walk)
    }

    /// Claims the rows `rows`, read when the outbox was at `seen`, that it still holds,
    /// and returns their ids: a request takes them on the wire now. A claimed row is
    /// never evicted, until its outcome is recorded ([`Store::settle`]) or its claim let
    /// go ([`Store::unclaim`]): so the flusher sends only rows the outbox holds, and a
    /// row it sent is never counted evicted. In memory: no write; and when nothing but
    /// the flusher's answers has left `pending` since `seen`, no read either (the rows
    /// are its own: no other batch settles them).
    pub(super) fn claim(&mut self, rows: &[RowKey], seen: Seen) -> Result<Vec<i64>, OutboxError> {
        let present: Vec<i64> = if seen == self.seen {
            rows.iter().map(|r| r.id).collect()
        } else {
            self.still_pending(rows)?
        };
        self.claimed.extend(present.iter().copied());
        self.cursor.claimed(&present);
        Ok(present)
    }

    /// The ids of `rows` still pending as they were read (the same tape and capture
    /// time under that id), in the order given.
    fn still_pending(&self, rows: &[RowKey]) -> Result<Vec<i64>, OutboxError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id, mac, captured_at FROM pending WHERE id IN ({})",
            vec!["?"; rows.len()].join(",")
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let found: HashSet<(i64, i64, i64)> = stmt
            .query_map(rusqlite::params_from_iter(rows.iter().map(|r| r.id)), |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows
            .iter()
            .filter(|r| found.contains(&(r.id, mac_to_int(r.mac), r.captured_at)))
            .map(|r| r.id)
            .collect())
    }

    /// Lets go of the claims on `ids` (a request answered with a failure, or rows whose
    /// answer left them out), and takes back those the flusher no longer holds: they
    /// may be evicted again, and a later fetch finds them.
    pub(super) fn unclaim(&mut self, ids: &[i64]) {
        for id in ids {
            self.claimed.remove(id);
            self.cursor.lower(*id);
        }
    }

    /// The rows claimed now, in id order (for the tests' checks).
    #[cfg(test)]
    pub(super) fn claimed(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.claimed.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Rows in `pending` counted one by one (for checks and tests; `stats` is cheaper).
    pub(super) fn count_pending_rows(&self) -> Result<u64, OutboxError> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM pending", [], |r| r.get(0))?)
    }

    /// Every pending capture in admission order (for tests and small tools).
    pub(super) fn pending_captures(&self) -> Result<Vec<PendingCapture>, OutboxError> {
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
    use crate::outbox::tests as fixture;
    use crate::outbox::{Outcome, StoreOptions};

    fn capture(i: u8) -> Capture {
        Capture {
            rssi: None,
            ..fixture::capture(
                fixture::mac(i),
                1_763_719_200_000 + i64::from(i),
                format!("{i:02X}"),
            )
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

    /// Fetches at most `max` rows and claims them, as a request going on the wire at
    /// once does.
    fn fetch_and_claim(s: &mut Store, max: usize) -> Vec<i64> {
        let f = s.fetch_next_batch(max, 100, &HashSet::new(), &[]).unwrap();
        let keys: Vec<RowKey> = f.rows.iter().map(PendingCapture::key).collect();
        s.claim(&keys, f.seen).unwrap()
    }

    /// Claims the pending rows `ids` (looked up: read at no particular time).
    fn claim_ids(s: &mut Store, ids: &[i64]) -> Vec<i64> {
        let keys: Vec<RowKey> = s
            .pending_captures()
            .unwrap()
            .iter()
            .filter(|p| ids.contains(&p.id))
            .map(PendingCapture::key)
            .collect();
        s.claim(&keys, Seen(u64::MAX)).unwrap()
    }

    #[test]
    fn a_claimed_row_is_never_evicted_and_the_bound_still_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 4);
        s.enqueue(&(1..=4).map(capture).collect::<Vec<_>>())
            .unwrap();
        let taken = fetch_and_claim(&mut s, 2);
        assert_eq!(taken, [1, 2]);
        assert_eq!(s.claimed(), [1, 2]);
        // Two more: the oldest rows not claimed go instead (3 and 4).
        assert_eq!(s.enqueue(&[capture(5), capture(6)]).unwrap(), 2);
        assert_eq!(pending_ids(&s), [1, 2, 5, 6]);
        // Every older row claimed: the bound holds all the same, with the new ones.
        claim_ids(&mut s, &[5, 6]);
        assert_eq!(s.enqueue(&[capture(7)]).unwrap(), 1);
        assert_eq!(pending_ids(&s), [1, 2, 5, 6]);
        let stats = s.stats().unwrap();
        assert_eq!((stats.pending, stats.evicted, stats.admitted), (4, 3, 7));
    }

    /// A batch found and not yet on the wire (waiting to fill, out a backoff, for a
    /// token) holds no claim: the oldest rows go, its own among them, and claiming it
    /// as it goes takes only what is left, looked up because rows left meanwhile.
    #[test]
    fn a_batch_found_claims_only_when_sent_and_only_rows_still_held() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 4);
        s.enqueue(&(1..=4).map(capture).collect::<Vec<_>>())
            .unwrap();
        let f = s.fetch_next_batch(2, 100, &HashSet::new(), &[]).unwrap();
        assert!(s.claimed().is_empty(), "a fetch claims nothing");
        let keys: Vec<RowKey> = f.rows.iter().map(PendingCapture::key).collect();
        assert_eq!(s.enqueue(&[capture(5)]).unwrap(), 1);
        assert_eq!(
            pending_ids(&s),
            [2, 3, 4, 5],
            "the oldest went: the batch's own"
        );
        assert_ne!(s.seen, f.seen);
        assert_eq!(s.claim(&keys, f.seen).unwrap(), [2]);
        assert_eq!(s.claimed(), [2]);
        // Nothing left since: a claim looks nothing up and takes every row.
        let f = s
            .fetch_next_batch(2, 100, &HashSet::from([capture(2).mac]), &[])
            .unwrap();
        let keys: Vec<RowKey> = f.rows.iter().map(PendingCapture::key).collect();
        assert_eq!(s.claim(&keys, f.seen).unwrap(), [3, 4]);
    }

    /// SQLite gives an id freed at the end of the table again: a row read before, and
    /// evicted since, is not taken for the new row that has its id.
    #[test]
    fn a_row_given_the_id_of_one_evicted_is_not_claimed_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 2);
        s.enqueue(&[capture(1), capture(2)]).unwrap();
        let f = s.fetch_next_batch(2, 100, &HashSet::new(), &[]).unwrap();
        let keys: Vec<RowKey> = f.rows.iter().map(PendingCapture::key).collect();
        // Two newer ones evict both; the newest go too, and ids 1 and 2 are free again.
        s.enqueue(&[capture(3), capture(4)]).unwrap();
        let settle: Vec<(PendingCapture, Outcome)> = s
            .pending_captures()
            .unwrap()
            .into_iter()
            .map(|p| (p, Outcome::DeadLetter("refused".into())))
            .collect();
        s.settle(&settle, 0).unwrap();
        s.enqueue(&[capture(7), capture(8)]).unwrap();
        assert_eq!(pending_ids(&s), [1, 2], "the ids are given again");
        assert!(s.claim(&keys, f.seen).unwrap().is_empty());
    }

    /// Recording an outcome or letting go ends a claim and only rows still held are
    /// claimed.
    #[test]
    fn an_outcome_or_letting_go_ends_a_claim() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 3);
        s.enqueue(&(1..=3).map(capture).collect::<Vec<_>>())
            .unwrap();
        let f = s.fetch_next_batch(3, 100, &HashSet::new(), &[]).unwrap();
        let keys: Vec<RowKey> = f.rows.iter().map(PendingCapture::key).collect();
        s.claim(&keys, f.seen).unwrap();
        let row = f.rows[0].clone();
        s.settle(&[(row, Outcome::DeadLetter("refused".into()))], 0)
            .unwrap();
        assert_eq!(s.claimed(), [2, 3]);
        // Letting go (a part parked by the flusher): row 2 may go now.
        s.unclaim(&[2]);
        s.enqueue(&[capture(4), capture(5)]).unwrap();
        assert_eq!(pending_ids(&s), [3, 4, 5]);
        // Claiming again before a send: only what the outbox still holds.
        s.unclaim(&[3]);
        let key = |id: i64| RowKey {
            id,
            mac: capture(id as u8).mac,
            captured_at: capture(id as u8).ts_ms,
        };
        assert_eq!(s.claim(&[key(2), key(3), key(4)], f.seen).unwrap(), [3, 4]);
        assert_eq!(s.claimed(), [3, 4]);
    }
}
