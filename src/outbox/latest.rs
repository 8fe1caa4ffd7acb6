//! The latest reading of each tape (`tapes`), written behind. The daemon keeps the
//! readings it has not written yet in memory and writes them together: inside the next
//! transaction that records answers once [`LATEST_EVERY`] has passed since the oldest
//! of them (or [`LATEST_MAX`] tapes wait), in one of their own when no answer comes
//! (the owner thread asks after every job), and when the outbox closes. A tape heard
//! every few seconds so costs one row write a minute instead of one per capture, and a
//! backlog's thousands of tapes one write of each per minute, not one per batch:
//! scattered row updates are what wears an SD card (each dirtied page is written twice,
//! to the WAL and at the checkpoint).
//!
//! A tape's *first* reading (a tape the table may not hold yet: one this daemon has not
//! written or seen written) is written with the answer that brought it, so that the
//! count of tapes (`status`, /metrics, the page, the demo's progress line) is never
//! behind: new tapes are few, and each is written so once.
//!
//! What this gives up: a crash (not a stop) loses at most the last minute of *latest
//! readings*, never a capture, a count or a tape (those are written with the answers).
//! The daemon's own readers (the status page) see the unwritten readings; another
//! process (`tapegate tapes`) reads the table, at most a minute behind the daemon.
//!
//! A leaf: it touches only the `db` codecs and the outbox's words; the store holds it.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rusqlite::{params, Transaction};
use tokio::time::Instant;

use super::words::TapeRow;
use crate::db::mac_to_int;
use crate::record::Mac;

/// Unwritten readings wait at most this long (then the next transaction writes them).
pub const LATEST_EVERY: Duration = Duration::from_secs(60);

/// In a debug build, milliseconds to use instead of [`LATEST_EVERY`] (0: written with
/// every answer), for tests that read `tapes` from another process while the daemon
/// runs ([`crate::util::debug_hooks::DebugHooks::latest_every`]).
pub const LATEST_EVERY_ENV: &str = crate::util::debug_hooks::LATEST_EVERY_ENV;

/// Tapes with an unwritten reading at most (memory; then they are written sooner).
/// A backlog of more tapes than this writes them more often, not more of them: each
/// write holds every tape once. A larger bound writes no fewer bytes per capture for a
/// drain of many tapes and holds more memory (`docs/benchmarks.md`).
pub const LATEST_MAX: usize = 4096;

/// The readings not yet written, newest per tape. In a B-tree, not a hash table: it
/// grows a node at a time where a hash table doubles (holding both tables for the
/// moment of the move, which was the daemon's largest allocation draining a backlog;
/// `docs/benchmarks.md`), and it is in MAC order, the order they are written in.
#[derive(Debug)]
pub(super) struct Latest {
    /// How long unwritten readings wait ([`LATEST_EVERY`] unless a test asks less).
    every: Duration,
    unwritten: BTreeMap<Mac, TapeRow>,
    /// When the oldest unwritten reading came.
    since: Option<Instant>,
    /// Tapes the table holds a row of (written or seen written by this store), at
    /// most [`KNOWN_MAX`]: forgotten all at once past it, then learnt again.
    known: HashSet<Mac>,
    /// The first readings of tapes not known, to write with the answers at hand.
    first: Vec<TapeRow>,
}

/// Tapes remembered as in the table at most (about 10 bytes each).
const KNOWN_MAX: usize = 65_536;

impl Latest {
    pub(super) fn new(every: Duration) -> Latest {
        Latest {
            every,
            unwritten: BTreeMap::new(),
            since: None,
            known: HashSet::new(),
            first: Vec::new(),
        }
    }

    /// A tape's reading: kept unless an unwritten one of a later capture is held.
    pub(super) fn note(&mut self, row: TapeRow) {
        self.since.get_or_insert_with(Instant::now);
        if !self.known.contains(&row.mac) && !self.unwritten.contains_key(&row.mac) {
            self.first.push(row.clone());
        }
        match self.unwritten.get_mut(&row.mac) {
            Some(held) if held.captured_at > row.captured_at => {}
            Some(held) => *held = row,
            None => {
                self.unwritten.insert(row.mac, row);
            }
        }
    }

    /// Whether the unwritten readings are due to be written.
    pub(super) fn due(&self) -> bool {
        self.unwritten.len() >= LATEST_MAX || self.since.is_some_and(|s| s.elapsed() >= self.every)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.unwritten.is_empty()
    }

    /// Writes the unwritten readings in `tx`, each unless the table holds one of a
    /// later capture. Call [`Latest::written`] once `tx` has committed.
    pub(super) fn write(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        // In MAC order: neighbours in the table are written together.
        write_rows(
            tx,
            "INSERT INTO tapes(mac, qr_code, captured_at, decoded_at, rssi, temp, bat, raw) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '')
             ON CONFLICT(mac) DO UPDATE SET qr_code = excluded.qr_code, captured_at = excluded.captured_at,
               decoded_at = excluded.decoded_at, rssi = excluded.rssi, temp = excluded.temp, bat = excluded.bat, raw = ''
             WHERE excluded.captured_at >= tapes.captured_at",
            self.unwritten.values(),
        )
    }

    /// Writes in `tx` the first readings of tapes not known (a row the table already
    /// holds is left as it is). Call [`Latest::firsts_written`] once `tx` has committed.
    pub(super) fn write_firsts(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        if self.first.is_empty() {
            return Ok(());
        }
        write_rows(
            tx,
            "INSERT OR IGNORE INTO tapes(mac, qr_code, captured_at, decoded_at, rssi, temp, bat, raw) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '')",
            &self.first,
        )
    }

    /// The transaction that wrote the first readings has committed.
    pub(super) fn firsts_written(&mut self) {
        let first = std::mem::take(&mut self.first);
        self.learn(first.iter().map(|r| r.mac));
    }

    /// The transaction that wrote them has committed.
    pub(super) fn written(&mut self) {
        let unwritten = std::mem::take(&mut self.unwritten);
        self.learn(unwritten.into_keys());
        self.first.clear();
        self.since = None;
    }

    /// Remembers `macs` as in the table.
    fn learn(&mut self, macs: impl Iterator<Item = Mac>) {
        for mac in macs {
            if self.known.len() >= KNOWN_MAX {
                self.known = HashSet::new();
            }
            self.known.insert(mac);
        }
    }

    /// The unwritten reading of `mac`, if any.
    pub(super) fn get(&self, mac: &Mac) -> Option<&TapeRow> {
        self.unwritten.get(mac)
    }

    /// Every unwritten reading.
    pub(super) fn rows(&self) -> impl Iterator<Item = &TapeRow> {
        self.unwritten.values()
    }
}

/// Runs `sql` (the seven columns of a reading as ?1-?7) for each of `rows` in `tx`.
fn write_rows<'a>(
    tx: &Transaction<'_>,
    sql: &str,
    rows: impl IntoIterator<Item = &'a TapeRow>,
) -> rusqlite::Result<()> {
    let mut write = tx.prepare_cached(sql)?;
    for r in rows {
        write.execute(params![
            mac_to_int(r.mac),
            r.qr_code,
            r.captured_at,
            r.decoded_at,
            r.rssi,
            r.temp,
            r.bat
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::outbox::tests as fixture;
    use crate::outbox::{Outcome, PendingCapture, Reading, Store, StoreOptions};
    use crate::record::{Capture, Mac};

    use fixture::mac;

    fn capture(i: u8, ts_ms: i64) -> Capture {
        fixture::capture(mac(i), ts_ms, "00")
    }

    fn decoded(temp: f64) -> Outcome {
        Outcome::Delivered(Reading {
            qr_code: Some("QR".into()),
            temp: Some(temp),
            bat: None,
        })
    }

    /// Settles every pending capture (oldest of each MAC first) with `temp` as
    /// its capture time in seconds.
    fn deliver_all(store: &mut Store) {
        loop {
            let batch: Vec<PendingCapture> = store.next_batch(250, 10_000).unwrap();
            if batch.is_empty() {
                return;
            }
            let settled: Vec<_> = batch
                .into_iter()
                .map(|p| {
                    let temp = p.capture.ts_ms as f64 / 1000.0;
                    (p, decoded(temp))
                })
                .collect();
            store.settle(&settled, 9_000).unwrap();
        }
    }

    fn temps(store: &Store) -> Vec<(Mac, Option<f64>)> {
        let mut t: Vec<_> = store
            .tapes(100)
            .unwrap()
            .into_iter()
            .map(|t| (t.mac, t.temp))
            .collect();
        t.sort_by_key(|(m, _)| *m);
        t
    }

    #[test]
    fn latest_readings_are_written_behind_and_the_daemon_reads_them_before() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .enqueue(&[capture(1, 1_000), capture(1, 3_000), capture(2, 2_000)])
            .unwrap();
        deliver_all(&mut store);
        // The daemon sees the newest reading of each tape at once...
        let newest = vec![(mac(1), Some(3.0)), (mac(2), Some(2.0))];
        assert_eq!(temps(&store), newest);
        let known = store.tapes_known(&[mac(1)]).unwrap();
        assert_eq!(known[0].reading.as_ref().unwrap().temp, Some(3.0));
        // ...another process sees every tape at once, with its first reading (written
        // with the answer that brought it), and its newest once written...
        let other = || Store::open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(
            temps(&other()),
            vec![(mac(1), Some(1.0)), (mac(2), Some(2.0))]
        );
        assert_eq!(other().stats().unwrap().tapes, 2);
        store.write_latest().unwrap();
        assert_eq!(temps(&other()), newest);
        // ...and a reading of an earlier capture never replaces a later one.
        store.enqueue(&[capture(1, 2_000)]).unwrap();
        deliver_all(&mut store);
        assert_eq!(temps(&store), newest);
        drop(store);
        assert_eq!(temps(&other()), newest, "written when the store closes");
    }

    #[test]
    fn past_latest_max_tapes_they_are_written_with_the_answers() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let n = super::LATEST_MAX;
        // Every tape twice: a first reading at 1 s, then a second at 2 s.
        let pass = |at: i64| -> Vec<Capture> {
            (0..n)
                .map(|i| {
                    let b = (i as u32).to_be_bytes();
                    Capture {
                        mac: Mac::new([0xC0, 0xFF, b[1], b[2], b[3], 0]),
                        ..capture(0, at)
                    }
                })
                .collect()
        };
        for chunk in pass(1_000).chunks(1000) {
            store.enqueue(chunk).unwrap();
        }
        let other = Store::open_existing(dir.path()).unwrap().unwrap();
        let batch = store.next_batch(250, 100_000).unwrap();
        let settled: Vec<_> = batch.into_iter().map(|p| (p, decoded(1.0))).collect();
        store.settle(&settled, 9_000).unwrap();
        assert_eq!(other.stats().unwrap().tapes, 250, "new tapes at once");
        deliver_all(&mut store);
        assert_eq!(other.stats().unwrap().tapes, n as u64);
        for chunk in pass(2_000).chunks(1000) {
            store.enqueue(chunk).unwrap();
        }
        let batch = store.next_batch(250, 100_000).unwrap();
        let settled: Vec<_> = batch.into_iter().map(|p| (p, decoded(2.0))).collect();
        store.settle(&settled, 9_000).unwrap();
        let waiting =
            |t: &[crate::outbox::TapeRow]| t.iter().filter(|t| t.temp == Some(1.0)).count();
        assert_eq!(waiting(&other.tapes(n).unwrap()), n, "250 readings wait");
        deliver_all(&mut store);
        assert_eq!(
            waiting(&other.tapes(n).unwrap()),
            0,
            "written with the answer that made {n} wait"
        );
    }

    #[test]
    fn a_tapes_first_reading_is_written_at_once_and_later_ones_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let other = || Store::open_existing(dir.path()).unwrap().unwrap();
        store.enqueue(&[capture(1, 1_000)]).unwrap();
        deliver_all(&mut store);
        assert_eq!(temps(&other()), vec![(mac(1), Some(1.0))]);
        store
            .enqueue(&[capture(1, 5_000), capture(2, 4_000)])
            .unwrap();
        deliver_all(&mut store);
        assert_eq!(
            temps(&other()),
            vec![(mac(1), Some(1.0)), (mac(2), Some(4.0))],
            "a known tape's new reading waits; a new tape's is written"
        );
        // A tape whose row is already there (another run wrote it) keeps the newer one.
        drop(store);
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store.enqueue(&[capture(1, 3_000)]).unwrap();
        deliver_all(&mut store);
        assert_eq!(
            temps(&other()),
            vec![(mac(1), Some(5.0)), (mac(2), Some(4.0))]
        );
    }
}
