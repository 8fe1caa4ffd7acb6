//! Finding the next batch without walking the same rows again and again.
//!
//! A batch is the oldest pending capture of each MAC that is not busy (in a batch in
//! flight), oldest first. Without an index on `mac` (one would be written with every
//! capture, scattered over the file: what an SD card can least afford), the only way
//! to find them is to walk `pending` in id order. The walk passes over the rows of busy
//! MACs, and with many batches in flight those are most of the rows at the front: a
//! fetch that started from the front each time walked thousands of rows to take 250.
//!
//! So the flusher's fetches resume where the last one stopped ([`Cursor`]): every row
//! still pending below its `low` is either claimed (in flight) or was passed over
//! because its MAC was busy, and the rows passed over are remembered, per MAC in id
//! order. A fetch takes first the oldest remembered row of each MAC no longer busy
//! (all older than anything at or past `low`), then walks on from `low`. Each row is
//! walked once, not once per fetch.
//!
//! What moves `low` back (and forgets the rows remembered at or past it): rows handed
//! back (a claim let go: the part waits, or the batch failed) and rows inserted below
//! it (an id freed at the end of the table is given again by SQLite). What starts over
//! from the front: an eviction, and anything written by another connection
//! (`tapegate dead-letters retry`, read from `PRAGMA data_version`). What it costs: the
//! remembered rows, at most [`PASSED_MAX`]; past that (one tape holding most of the
//! backlog, say) fetches walk from the front for a while, as they always did.
//!
//! It touches `db`, `cursor.rs` and the [`Store`] it walks; `fetch.rs` reads the rows
//! it chose.

use std::collections::HashSet;

use super::cursor::{Cursor, PASSED_MAX, PLAIN_FETCHES};
use super::store::Store;
use crate::db::{int_to_mac, OutboxError};
use crate::record::Mac;

/// What a walk of `pending` found.
pub(super) struct Walk {
    pub chosen: Vec<i64>,
    pub complete: bool,
    pub backlog: bool,
}

/// Where a walk stands.
struct Walking<'a> {
    max: usize,
    busy: &'a HashSet<Mac>,
    chosen: Vec<i64>,
    macs: HashSet<Mac>,
    backlog: bool,
}

impl Store {
    /// Walks `pending` from the front in id order for the oldest row of each MAC not in
    /// `busy`, at most `max`, looking at most `scan_limit` rows.
    pub(super) fn walk(
        &self,
        max: usize,
        scan_limit: usize,
        busy: &HashSet<Mac>,
    ) -> Result<Walk, OutboxError> {
        let mut w = Walking::new(max, busy);
        let (complete, _) = self.walk_from(i64::MIN, scan_limit, &mut w, None)?;
        Ok(w.done(complete))
    }

    /// [`Store::walk`] for the flusher: resumes where the last one stopped (see the
    /// module doc). The chosen rows are to be claimed.
    pub(super) fn walk_on(
        &mut self,
        max: usize,
        scan_limit: usize,
        busy: &HashSet<Mac>,
    ) -> Result<Walk, OutboxError> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))?;
        if self.cursor.data_version != Some(version) {
            self.cursor.reset();
            self.cursor.data_version = Some(version);
        }
        if self.cursor.plain > 0 {
            self.cursor.plain -= 1;
            return self.walk(max, scan_limit, busy);
        }
        let mut w = Walking::new(max, busy);
        // The oldest row passed over of each MAC no longer busy, oldest first: all of
        // them older than any row at or past `low`.
        let mut heads: Vec<(i64, Mac, usize)> = self
            .cursor
            .queues
            .iter()
            .filter(|(mac, _)| !busy.contains(*mac))
            .filter_map(|(mac, q)| q.front().map(|id| (*id, *mac, q.len())))
            .collect();
        heads.sort_unstable_by_key(|h| h.0);
        if heads.len() > max {
            for &(id, mac, rows) in &heads[..max] {
                w.take(id, mac, rows);
            }
            let walk = w.done(false);
            self.cursor.claimed(&walk.chosen);
            return Ok(walk);
        }
        for &(id, mac, rows) in &heads {
            w.take(id, mac, rows);
        }
        let mut cursor = std::mem::take(&mut self.cursor);
        let walked = self.walk_from(cursor.low, scan_limit, &mut w, Some(&mut cursor));
        self.cursor = cursor;
        let (complete, overflow) = walked?;
        if overflow {
            // Too many rows to remember: from the front for a while.
            self.cursor.reset();
            self.cursor.plain = PLAIN_FETCHES;
            return self.walk(max, scan_limit, busy);
        }
        let walk = w.done(complete);
        self.cursor.claimed(&walk.chosen);
        Ok(walk)
    }

    /// Walks rows from `start` (inclusive) into `w`; with a cursor, remembers the rows
    /// passed over and where the walk stopped. Returns whether every row was seen, and
    /// whether the cursor would have remembered more than [`PASSED_MAX`] rows (then it
    /// is to be reset).
    fn walk_from(
        &self,
        start: i64,
        scan_limit: usize,
        w: &mut Walking<'_>,
        mut cursor: Option<&mut Cursor>,
    ) -> Result<(bool, bool), OutboxError> {
        // The walk reads only `id` and `mac`; the chosen rows are read whole afterwards.
        let mut after = start.saturating_sub(1);
        let mut scanned = 0usize;
        // Held captures (`clock.rs`) are not deliverable, nor is anything after the
        // first of them: the walk stops there.
        let below = self.clock.deliverable_below();
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, mac FROM pending WHERE id > ?1 AND id < ?2 AND held = 0 ORDER BY id LIMIT 4096",
        )?;
        // The first row not looked at.
        let mut stop = start;
        let complete = 'scan: loop {
            let mut rows = stmt.query([after, below])?;
            let mut any = false;
            while let Some(r) = rows.next()? {
                any = true;
                let id: i64 = r.get(0)?;
                let mac = int_to_mac(r.get(1)?);
                after = id;
                scanned += 1;
                if w.busy.contains(&mac) || w.macs.contains(&mac) {
                    // Busy, or in this batch (busy once it is sent).
                    w.backlog |= w.macs.contains(&mac);
                    // (A claimed row is in flight: not to be taken when its MAC is free.)
                    if let Some(c) = cursor
                        .as_deref_mut()
                        .filter(|_| !self.claimed.contains(&id))
                    {
                        if c.passed.len() >= PASSED_MAX {
                            return Ok((false, true));
                        }
                        c.pass(mac, id);
                    }
                } else if w.chosen.len() == w.max {
                    stop = id;
                    break 'scan false;
                } else {
                    w.chosen.push(id);
                    w.macs.insert(mac);
                }
                stop = id + 1;
            }
            if !any {
                // Every pending row was seen.
                break 'scan true;
            }
            if scanned >= scan_limit {
                break 'scan false;
            }
        };
        if let Some(c) = cursor {
            c.low = stop.max(start);
        }
        Ok((complete, false))
    }
}

impl<'a> Walking<'a> {
    fn new(max: usize, busy: &'a HashSet<Mac>) -> Walking<'a> {
        Walking {
            max,
            busy,
            chosen: Vec::with_capacity(max.min(256)),
            macs: HashSet::with_capacity(max),
            backlog: false,
        }
    }

    /// Takes a remembered row: the oldest of its MAC, with `rows` remembered in all.
    fn take(&mut self, id: i64, mac: Mac, rows: usize) {
        self.chosen.push(id);
        self.macs.insert(mac);
        self.backlog |= rows > 1;
    }

    fn done(mut self, complete: bool) -> Walk {
        self.chosen.sort_unstable();
        Walk {
            chosen: self.chosen,
            complete,
            backlog: self.backlog,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The resumed walk held to the walk from the front: whatever happened to the
    //! outbox and to the batches, a fetch finds exactly what a walk of every row finds.
    use crate::outbox::tests as fixture;
    use std::collections::HashSet;

    use proptest::prelude::*;

    use crate::outbox::{
        Durability, Fetched, Outcome, PendingCapture, RowKey, Seen, Store, StoreOptions,
    };
    use crate::record::{Capture, Mac};

    #[derive(Debug, Clone)]
    enum Op {
        /// Captures of these MACs, one commit group.
        Enqueue(Vec<u8>),
        /// Fetch at most n; `keep`: send it (its MACs busy), else hand it back.
        Fetch { max: usize, keep: bool },
        /// The oldest batch in flight answered: each row delivered, refused or left
        /// out (handed back), by the pattern.
        Answer(Vec<u8>),
        /// The oldest batch in flight fails and waits (claims handed back, MACs busy).
        Park,
        /// The oldest parked batch is claimed again and sent.
        Resend,
        /// The oldest parked batch is given up (its MACs free again).
        Unpark,
        /// `tapegate dead-letters retry` from another connection, or this one.
        RetryDead { other: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop::collection::vec(0u8..12, 1..25).prop_map(Op::Enqueue),
            5 => (1usize..8, prop::bool::weighted(0.8)).prop_map(|(max, keep)| Op::Fetch { max, keep }),
            4 => prop::collection::vec(0u8..4, 8).prop_map(Op::Answer),
            1 => Just(Op::Park),
            1 => Just(Op::Resend),
            1 => Just(Op::Unpark),
            1 => any::<bool>().prop_map(|other| Op::RetryDead { other }),
        ]
    }

    fn capture(mac: u8, seq: usize) -> Capture {
        Capture {
            rssi: None,
            ..fixture::capture(fixture::mac(mac), 1_000 + seq as i64, format!("{seq:04X}"))
        }
    }

    fn macs(rows: &[PendingCapture]) -> impl Iterator<Item = Mac> + '_ {
        rows.iter().map(|r| r.capture.mac)
    }

    /// What a fetch promises: the rows and whether they are all; the backlog when so.
    fn promised(f: &Fetched) -> (&[PendingCapture], bool, bool) {
        (&f.rows, f.complete, f.complete && f.backlog)
    }

    /// The table emptied (ids are given again from 1) and another connection re-queued
    /// a dead letter: below where the walk had got to, and found all the same.
    #[test]
    fn rows_another_connection_inserts_below_the_walk_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .enqueue(&(0..5).map(|i| capture(i, i.into())).collect::<Vec<_>>())
            .unwrap();
        let none = HashSet::new();
        let rows = store.fetch_next_batch(10, 100, &none, &[]).unwrap().rows;
        assert_eq!(rows.len(), 5);
        let refused = rows
            .into_iter()
            .map(|r| (r, Outcome::DeadLetter("refused".into())))
            .collect::<Vec<_>>();
        store.settle(&refused, 0).unwrap();
        assert!(store
            .fetch_next_batch(10, 100, &none, &[])
            .unwrap()
            .rows
            .is_empty());
        let mut cli = Store::open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(cli.retry_dead_letters(None).unwrap(), 5);
        let again = store.fetch_next_batch(10, 100, &none, &[]).unwrap().rows;
        assert_eq!(again.first().map(|r| r.id), Some(1), "ids given again");
        assert_eq!(again.len(), 5);
    }

    /// A batch answered row by row as `pattern` says: delivered, refused or left out.
    fn answer(store: &mut Store, batch: Vec<PendingCapture>, pattern: &[u8]) {
        let mut settle = Vec::new();
        let mut back = Vec::new();
        for (row, p) in batch.into_iter().zip(pattern.iter().cycle()) {
            match p {
                0 | 1 => settle.push((
                    row,
                    Outcome::Delivered(crate::outbox::Reading {
                        qr_code: None,
                        temp: None,
                        bat: None,
                    }),
                )),
                2 => settle.push((row, Outcome::DeadLetter("refused".into()))),
                _ => back.push(row.id),
            }
        }
        store.unclaim(&back);
        store.settle(&settle, 0).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn a_resumed_walk_finds_what_a_walk_from_the_front_finds(ops in prop::collection::vec(op(), 1..80)) {
            let dir = tempfile::tempdir().unwrap();
            let options = StoreOptions {
                durability: Durability::Normal,
                // Small: eviction happens, and the table empties and gives ids again.
                max_pending: 40,
                max_page_count: None,
                ..StoreOptions::default()
            };
            let (mut store, _) = Store::open(dir.path(), options).unwrap();
            let mut in_flight: Vec<Vec<PendingCapture>> = Vec::new();
            let mut parked: Vec<Vec<PendingCapture>> = Vec::new();
            let mut seq = 0;
            for op in ops {
                let busy: HashSet<Mac> = in_flight
                    .iter()
                    .chain(&parked)
                    .flat_map(|b| macs(b))
                    .collect();
                match op {
                    Op::Enqueue(m) => {
                        let group: Vec<Capture> = m
                            .iter()
                            .map(|&mac| {
                                seq += 1;
                                capture(mac, seq)
                            })
                            .collect();
                        store.enqueue(&group).unwrap();
                    }
                    Op::Fetch { max, keep } => {
                        let want = store.next_batch_excluding(max, 10_000, &busy).unwrap();
                        let got = store.fetch_next_batch(max, 10_000, &busy, &[]).unwrap();
                        prop_assert_eq!(promised(&got), promised(&want));
                        if keep && !got.rows.is_empty() {
                            // Sent at once: its request claims it.
                            let keys: Vec<RowKey> = got.rows.iter().map(PendingCapture::key).collect();
                            store.claim(&keys, got.seen).unwrap();
                            in_flight.push(got.rows);
                        } else {
                            let ids: Vec<i64> = got.rows.iter().map(|r| r.id).collect();
                            store.unclaim(&ids);
                        }
                    }
                    Op::Answer(pattern) if !in_flight.is_empty() => {
                        answer(&mut store, in_flight.remove(0), &pattern);
                    }
                    Op::Park if !in_flight.is_empty() => {
                        let batch = in_flight.remove(0);
                        let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
                        store.unclaim(&ids);
                        parked.push(batch);
                    }
                    Op::Resend if !parked.is_empty() => {
                        let batch = parked.remove(0);
                        let keys: Vec<RowKey> = batch.iter().map(PendingCapture::key).collect();
                        let present = store.claim(&keys, Seen::default()).unwrap();
                        let rows: Vec<PendingCapture> =
                            batch.into_iter().filter(|r| present.contains(&r.id)).collect();
                        if !rows.is_empty() {
                            in_flight.push(rows);
                        }
                    }
                    Op::Unpark if !parked.is_empty() => {
                        parked.remove(0);
                    }
                    Op::RetryDead { other } => {
                        if other {
                            let mut cli = Store::open_existing(dir.path()).unwrap().unwrap();
                            cli.retry_dead_letters(None).unwrap();
                        } else {
                            store.retry_dead_letters(None).unwrap();
                        }
                    }
                    Op::Answer(_) | Op::Park | Op::Resend | Op::Unpark => {}
                }
            }
        }
    }
}
