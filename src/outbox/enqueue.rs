//! Admitting a group of captures: one transaction that inserts the rows (many to a
//! statement), times and holds them as the clock's hold says (`hold.rs`), evicts the
//! oldest past the bounds (`retention.rs`) and keeps the counters exact. It touches
//! `db`, `hold.rs`, `retention.rs` and the [`Store`] it writes.

use std::collections::HashSet;

use rusqlite::Transaction;

use super::db::{
    hold_id_floor, mac_to_int, packet_value, read_counters, release_id_floor, write_counters,
    write_tx, Counters, OutboxError,
};
use super::hold::{first_held, ClockRows, Retimed};
use super::retention::{evict_oldest, evict_past, Bound, Evictions};
use super::store::{Store, StoreOptions};
use crate::config::Retention;
use crate::record::Capture;

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

/// What inserting a group left to know: the id of its first row, and the first held
/// row's id (the one known before, or the group's first held row).
struct Inserted {
    first_id: Option<i64>,
    held_from: Option<i64>,
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
    /// [`Store::enqueue`], saying which bound evicted how many.
    pub fn enqueue_counted(&mut self, group: &[Capture]) -> Result<Evictions, OutboxError> {
        if group.is_empty() {
            return Ok(Evictions::default());
        }
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let mut evictions = Evictions::default();
        let (next, inserted) = (|| -> rusqlite::Result<(Counters, Inserted)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            let mut inserted = insert_group(&tx, group, &self.clock, self.id_floor)?;
            next.admitted += group.len() as u64;
            let bounds = (&self.options, &self.retention, &self.claimed);
            evict_past_bounds(&tx, bounds, &mut next, &mut evictions)?;
            if evictions.total() > 0 && inserted.held_from.is_some() {
                inserted.held_from = first_held(&tx)?;
            }
            write_counters(&tx, &current, &next)?;
            Ok((next, inserted))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.enqueued(next, &inserted, &evictions);
        Ok(evictions)
    }

    /// What the store keeps in memory follows a committed group.
    fn enqueued(&mut self, next: Counters, inserted: &Inserted, evictions: &Evictions) {
        if evictions.total() > 0 {
            // Rows the flusher's walk remembered may be gone: it starts over.
            self.cursor.reset();
        } else if let Some(first) = inserted.first_id {
            // An id freed at the end of the table is given again: below the cursor.
            self.cursor.lower(first);
        }
        self.counters = next;
        self.clock.first_held = inserted.held_from;
        self.id_floor = 0;
    }
}

/// Inserts `group` in `tx`, [`INSERT_ROWS`] at a time (one statement for many rows
/// costs far less than a statement each), the rest one by one; the ids of one
/// statement's rows follow each other. Each row is timed and held as `clock` says, its
/// id at least `id_floor`; captures re-timed are counted.
fn insert_group(
    tx: &Transaction<'_>,
    group: &[Capture],
    clock: &ClockRows,
    id_floor: i64,
) -> rusqlite::Result<Inserted> {
    let mut held_from = clock.first_held;
    let mut retimed = Retimed::default();
    hold_id_floor(tx, id_floor)?;
    let mut first_id = None;
    let mut single = tx.prepare_cached(&insert_sql(1))?;
    let mut many = tx.prepare_cached(&insert_sql(INSERT_ROWS))?;
    for rows in group.chunks(INSERT_ROWS) {
        let (insert, step) = if rows.len() == INSERT_ROWS {
            (&mut many, INSERT_ROWS)
        } else {
            (&mut single, 1)
        };
        for part in rows.chunks(step) {
            let mut at = 1;
            for c in part {
                bind_capture(insert, at, c, clock, &mut retimed)?;
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
    release_id_floor(tx, id_floor)?;
    retimed.count(tx)?;
    Ok(Inserted {
        first_id,
        held_from,
    })
}

/// Binds the columns of capture `c` from parameter `at` of `insert`.
#[inline]
fn bind_capture(
    insert: &mut rusqlite::CachedStatement<'_>,
    at: usize,
    c: &Capture,
    clock: &ClockRows,
    retimed: &mut Retimed,
) -> rusqlite::Result<()> {
    let live = c.boot_ms.is_some();
    let captured_at = clock.captured_at(c, retimed);
    insert.raw_bind_parameter(at, mac_to_int(c.mac))?;
    insert.raw_bind_parameter(at + 1, captured_at)?;
    insert.raw_bind_parameter(at + 2, c.product_id.as_str())?;
    insert.raw_bind_parameter(at + 3, packet_value(&c.packet))?;
    insert.raw_bind_parameter(at + 4, c.rssi)?;
    insert.raw_bind_parameter(at + 5, clock.boot_of(live))?;
    insert.raw_bind_parameter(at + 6, c.boot_ms)?;
    insert.raw_bind_parameter(at + 7, clock.holds(live))
}

/// Evicts past the bounds after a group is in: `max_pending` by count, then the age and
/// size bounds as of now, never a claimed row.
fn evict_past_bounds(
    tx: &Transaction<'_>,
    (options, retention, claimed): (&StoreOptions, &Retention, &HashSet<i64>),
    next: &mut Counters,
    evictions: &mut Evictions,
) -> rusqlite::Result<()> {
    let excess = next.pending().saturating_sub(options.max_pending);
    evict_oldest(tx, excess, Bound::Pending, claimed, next, evictions)?;
    let now = options.clock.wall_ms();
    evict_past(tx, retention, now, claimed, next, evictions)
}
