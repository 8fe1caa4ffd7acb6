//! The queue: admitting groups of captures (with eviction past the bounds, see
//! `retention.rs`), choosing
//! the next batch (each MAC once, oldest first) and settling what the service answered,
//! each in one transaction that keeps the counters exact.

use std::collections::HashSet;

use rusqlite::{params, Transaction};

use super::clock::{first_held, Retimed};
use super::dock::record_heard;
use super::retention::{evict_oldest, evict_past, Bound, Evictions};
use super::scan::Walk;
use super::store::{
    hold_id_floor, int_to_mac, mac_to_int, packet_text, packet_value, read_counters,
    release_id_floor, write_counters, write_tx, Counters,
};
use super::{FlusherState, OutboxError, Store, TapeRow, MAX_DEAD_LETTERS};
use crate::heard_now::HeardChanges;
use crate::record::{Capture, EpochMillis, Mac};

/// Rows of a commit group inserted by one statement (and the columns of each).
const INSERT_ROWS: usize = 50;
const INSERT_COLUMNS: usize = 8;

/// An INSERT of `rows` captures.
fn insert_sql(rows: usize) -> String {
    let row = "(?, ?, ?, ?, ?, ?, ?, ?)";
    format!(
        "INSERT INTO pending(mac, captured_at, product_id, packet, rssi, boot, boot_ms, held) VALUES {}",
        vec![row; rows].join(", ")
    )
}

/// A pending capture as the flusher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCapture {
    pub id: i64,
    pub capture: Capture,
}

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

/// What the service decoded, as far as the gateway keeps it: the tape's latest reading
/// (`tapegate tapes`, the status page). The readings themselves are the service's.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub qr_code: Option<String>,
    pub temp: Option<f64>,
    pub bat: Option<f64>,
}

/// What is recorded in the transaction that records the answers, beside them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnswerNotes {
    /// The flusher's state, for `status`.
    pub flusher: Option<FlusherState>,
    /// Tapes refused as unknown, and known again (`device add --nearest`).
    pub heard: HeardChanges,
}

/// What became of one pending capture.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered(Reading),
    /// Refused by the service; the text is the server's error.
    DeadLetter(String),
}

impl Store {
    /// Commits one group of captures, evicting the oldest pending rows past the bounds
    /// (`retention.rs`: `max_pending`, `max_age_secs`, `max_bytes`), never a row the
    /// flusher has claimed ([`Store::claim`]): those are being delivered, and a capture
    /// the service gets is never counted evicted. (The new rows are unclaimed, so the
    /// count bound always holds; only when every older row is claimed are new ones
    /// evicted.) Returns how many were evicted. On error nothing changed.
    pub fn enqueue(&mut self, group: &[Capture]) -> Result<u64, OutboxError> {
        self.enqueue_counted(group).map(|e| e.total())
    }

    /// [`Store::enqueue`], saying which bound evicted how many.
    pub fn enqueue_counted(&mut self, group: &[Capture]) -> Result<Evictions, OutboxError> {
        if group.is_empty() {
            return Ok(Evictions::default());
        }
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let clock = self.clock;
        let retention = self.retention;
        let mut evictions = Evictions::default();
        let (next, held_from, first_id) =
            (|| -> rusqlite::Result<(Counters, Option<i64>, Option<i64>)> {
                let current = read_counters(&tx)?;
                let mut next = current;
                let mut held_from = clock.first_held;
                let mut retimed = Retimed::default();
                hold_id_floor(&tx, self.id_floor)?;
                // Rows go in INSERT_ROWS at a time (one statement for many rows costs far
                // less than a statement each), the rest one by one. The ids of one
                // statement's rows follow each other.
                let mut first_id = None;
                let mut single = tx.prepare_cached(&insert_sql(1))?;
                let mut many = tx.prepare_cached(&insert_sql(INSERT_ROWS))?;
                for rows in group.chunks(INSERT_ROWS) {
                    let insert = if rows.len() == INSERT_ROWS {
                        &mut many
                    } else {
                        &mut single
                    };
                    for part in rows.chunks(if rows.len() == INSERT_ROWS {
                        INSERT_ROWS
                    } else {
                        1
                    }) {
                        let mut at = 1;
                        for c in part {
                            let live = c.boot_ms.is_some();
                            let captured_at = clock.captured_at(c, &mut retimed);
                            insert.raw_bind_parameter(at, mac_to_int(c.mac))?;
                            insert.raw_bind_parameter(at + 1, captured_at)?;
                            insert.raw_bind_parameter(at + 2, c.product_id.as_str())?;
                            insert.raw_bind_parameter(at + 3, packet_value(&c.packet))?;
                            insert.raw_bind_parameter(at + 4, c.rssi)?;
                            insert.raw_bind_parameter(at + 5, clock.boot_of(live))?;
                            insert.raw_bind_parameter(at + 6, c.boot_ms)?;
                            insert.raw_bind_parameter(at + 7, clock.holds(live))?;
                            at += INSERT_COLUMNS;
                        }
                        insert.raw_execute()?;
                        let last = tx.last_insert_rowid();
                        let first = last + 1 - part.len() as i64;
                        first_id.get_or_insert(first);
                        if held_from.is_none() {
                            let held = part.iter().position(|c| clock.holds(c.boot_ms.is_some()));
                            held_from = held.map(|i| first + i as i64);
                        }
                    }
                }
                release_id_floor(&tx, self.id_floor)?;
                retimed.count(&tx)?;
                next.admitted += group.len() as u64;
                let excess = next.pending().saturating_sub(self.options.max_pending);
                let claimed = &self.claimed;
                evict_oldest(
                    &tx,
                    excess,
                    Bound::Pending,
                    claimed,
                    &mut next,
                    &mut evictions,
                )?;
                evict_past(
                    &tx,
                    &retention,
                    self.options.clock.wall_ms(),
                    claimed,
                    &mut next,
                    &mut evictions,
                )?;
                if evictions.total() > 0 && held_from.is_some() {
                    held_from = first_held(&tx)?;
                }
                write_counters(&tx, &current, &next)?;
                Ok((next, held_from, first_id))
            })()
            .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        if evictions.total() > 0 {
            // Rows the flusher's walk remembered may be gone: it starts over.
            self.cursor.reset();
        } else if let Some(first) = first_id {
            // An id freed at the end of the table is given again: below the cursor.
            self.cursor.lower(first);
        }
        self.counters = next;
        self.clock.first_held = held_from;
        self.id_floor = 0;
        Ok(evictions)
    }

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

    /// Records what became of pending captures, in one transaction: a row leaves
    /// `pending` only here, together with its count (delivered) or its dead letter, and
    /// its claim is let go. A row already gone (its database replaced, say: a claimed
    /// row is never evicted) changes no counter. A delivered capture's reading becomes
    /// its tape's latest, kept in memory and written behind ([`super::latest`]).
    /// Returns how many rows left.
    pub fn settle(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
    ) -> Result<u64, OutboxError> {
        self.settle_noting(outcomes, now, &AnswerNotes::default())
    }

    /// [`Store::settle`], recording in the same transaction (one commit, one sync) the
    /// flusher's state for `status` and the tapes heard that `--nearest` needs.
    pub fn settle_noting(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
        notes: &AnswerNotes,
    ) -> Result<u64, OutboxError> {
        for (p, outcome) in outcomes {
            if let Outcome::Delivered(r) = outcome {
                // A reading the service decoded is kept even if its row was evicted
                // meanwhile; only the counter follows the row.
                let c = &p.capture;
                self.latest.note(TapeRow {
                    mac: c.mac,
                    qr_code: r.qr_code.clone(),
                    captured_at: c.ts_ms,
                    decoded_at: now,
                    rssi: c.rssi,
                    temp: r.temp,
                    bat: r.bat,
                });
            }
        }
        let write_latest = self.latest.due();
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let latest = &self.latest;
        let (removed, next) = (|| -> rusqlite::Result<(u64, Counters)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            let mut removed = 0;
            let mut delete = tx.prepare_cached("DELETE FROM pending WHERE id = ?1")?;
            let mut dead = tx.prepare_cached(
                "INSERT INTO dead_letters(mac, captured_at, product_id, packet, rssi, error, dead_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (p, outcome) in outcomes {
                let gone = delete.execute([p.id])? == 1;
                removed += u64::from(gone);
                let c = &p.capture;
                match outcome {
                    Outcome::Delivered(_) => next.delivered += u64::from(gone),
                    Outcome::DeadLetter(error) if gone => {
                        // The service's reason, bounded as every text from elsewhere.
                        let error = crate::text::bounded(error, crate::text::SHOWN_MAX_CHARS);
                        dead.execute(params![mac_to_int(c.mac), c.ts_ms, c.product_id, packet_value(&c.packet), c.rssi, error, now])?;
                        next.dead_lettered += 1;
                    }
                    Outcome::DeadLetter(_) => {}
                }
            }
            if next.dead_lettered > current.dead_lettered {
                next.dead_letters_dropped += cap_dead_letters(&tx, MAX_DEAD_LETTERS)?;
            }
            write_counters(&tx, &current, &next)?;
            if let Some(f) = &notes.flusher {
                f.write(&tx)?;
            }
            record_heard(&tx, &notes.heard, now)?;
            if write_latest {
                latest.write(&tx)?;
            }
            Ok((removed, next))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.counters = next;
        if write_latest {
            self.latest.written();
        }
        for (p, _) in outcomes {
            self.claimed.remove(&p.id);
        }
        if !self.cursor.is_empty() {
            let ids: Vec<i64> = outcomes.iter().map(|(p, _)| p.id).collect();
            self.cursor.claimed(&ids);
        }
        Ok(removed)
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

fn cap_dead_letters(tx: &Transaction<'_>, max: u64) -> rusqlite::Result<u64> {
    let stored: i64 = tx.query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))?;
    let excess = (stored as u64).saturating_sub(max);
    if excess == 0 {
        return Ok(0);
    }
    Ok(tx.execute(
        "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters ORDER BY id LIMIT ?1)",
        [excess as i64],
    )? as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::StoreOptions;

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

    #[test]
    fn an_answer_for_rows_already_gone_changes_no_count_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 10);
        s.enqueue(&[capture(1), capture(2)]).unwrap();
        let rows = s
            .claim_next_batch(2, 100, &HashSet::new(), &[])
            .unwrap()
            .rows;
        let delivered = Outcome::Delivered(Reading {
            qr_code: Some("TT".into()),
            temp: None,
            bat: None,
        });
        let settle = vec![
            (rows[0].clone(), delivered),
            (rows[1].clone(), Outcome::DeadLetter("refused".into())),
        ];
        assert_eq!(s.settle(&settle, 0).unwrap(), 2);
        // The same answer recorded again (or an answer for rows a replaced database no
        // longer holds): nothing left, nothing counted.
        assert_eq!(s.settle(&settle, 0).unwrap(), 0);
        let stats = s.stats().unwrap();
        assert_eq!(
            (
                stats.admitted,
                stats.delivered,
                stats.dead_letters,
                stats.evicted,
                stats.pending
            ),
            (2, 1, 1, 0, 0)
        );
        assert_eq!(stats.dead_letters_stored, 1);
    }
}
