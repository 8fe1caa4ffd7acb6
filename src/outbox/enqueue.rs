//! Admitting a group of captures: one transaction that inserts the rows (many to a
//! statement), times and holds them as the clock's hold says (`hold.rs`), evicts the
//! oldest past the bounds (`retention.rs`) and keeps the counters exact. It touches
//! `db`, `hold.rs`, `retention.rs` and the [`Store`] it writes.

use std::collections::HashSet;

use rusqlite::Transaction;

use super::hold::{first_held, ClockRows, Retimed};
use super::retention::{evict_oldest, evict_past, Bound, Evictions};
use super::store::{Store, StoreOptions};
use crate::config::Retention;
use crate::db::{
    hold_id_floor, mac_to_int, packet_value_in, read_counters, release_id_floor, write_counters,
    write_tx, Counters, OutboxError, PACKET_STACK,
};
use crate::record::Capture;

/// A commit group holds at most this many captures.
pub const GROUP_MAX: usize = 1000;

/// Rows of a commit group inserted by one statement.
const INSERT_ROWS: usize = 50;

/// The columns a capture fills: a live one all eight; a recorded one (replayed,
/// imported: no boot time) the first five, the clock's three (`boot`, `boot_ms`,
/// `held`) keeping their defaults (NULL, NULL, 0), which are what it would bind.
const LIVE_COLUMNS: usize = 8;
const RECORDED_COLUMNS: usize = 5;

/// An INSERT of `rows` captures of `columns` columns each.
fn insert_sql(rows: usize, columns: usize) -> String {
    let names = [
        "mac",
        "captured_at",
        "product_id",
        "packet",
        "rssi",
        "boot",
        "boot_ms",
        "held",
    ];
    let row = format!("({})", vec!["?"; columns].join(", "));
    format!(
        "INSERT INTO pending({}) VALUES {}",
        names[..columns].join(", "),
        vec![row; rows].join(", ")
    )
}

/// The four INSERTs (one row or [`INSERT_ROWS`]; live or recorded), written once.
fn insert_sqls() -> &'static [[String; 2]; 2] {
    static SQL: std::sync::OnceLock<[[String; 2]; 2]> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        [LIVE_COLUMNS, RECORDED_COLUMNS]
            .map(|columns| [insert_sql(1, columns), insert_sql(INSERT_ROWS, columns)])
    })
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
    pub(super) fn enqueue(&mut self, group: &[Capture]) -> Result<u64, OutboxError> {
        self.enqueue_counted(group).map(|e| e.total())
    }

    /// [`Store::enqueue`], saying which bound evicted how many.
    pub(super) fn enqueue_counted(&mut self, group: &[Capture]) -> Result<Evictions, OutboxError> {
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
            // Rows the flusher's walk remembered, or holds, may be gone: it starts over,
            // and claims look its rows up.
            self.cursor.reset();
            self.seen.0 += 1;
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
    // Prepared when first used: [live, recorded] x [one row, INSERT_ROWS].
    let mut statements: [[Option<rusqlite::CachedStatement<'_>>; 2]; 2] = Default::default();
    for rows in group.chunks(INSERT_ROWS) {
        let recorded = rows.iter().all(|c| c.boot_ms.is_none());
        let full = rows.len() == INSERT_ROWS;
        let columns = if recorded {
            RECORDED_COLUMNS
        } else {
            LIVE_COLUMNS
        };
        let insert = match &mut statements[usize::from(recorded)][usize::from(full)] {
            Some(insert) => insert,
            empty => empty.insert(
                tx.prepare_cached(&insert_sqls()[usize::from(recorded)][usize::from(full)])?,
            ),
        };
        for part in rows.chunks(if full { INSERT_ROWS } else { 1 }) {
            let mut at = 1;
            for c in part {
                bind_capture(insert, at, columns, c, clock, &mut retimed)?;
                at += columns;
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

/// Binds capture `c` from parameter `at` on: its first `columns` columns (see
/// [`LIVE_COLUMNS`]).
#[inline]
fn bind_capture(
    insert: &mut rusqlite::CachedStatement<'_>,
    at: usize,
    columns: usize,
    c: &Capture,
    clock: &ClockRows,
    retimed: &mut Retimed,
) -> rusqlite::Result<()> {
    let live = c.boot_ms.is_some();
    let captured_at = clock.captured_at(c, retimed);
    let mut stack = [0u8; PACKET_STACK];
    insert.raw_bind_parameter(at, mac_to_int(c.mac))?;
    insert.raw_bind_parameter(at + 1, captured_at)?;
    insert.raw_bind_parameter(at + 2, &*c.product_id)?;
    insert.raw_bind_parameter(at + 3, packet_value_in(&c.packet, &mut stack))?;
    insert.raw_bind_parameter(at + 4, c.rssi)?;
    if columns == RECORDED_COLUMNS {
        debug_assert!(!live && clock.boot_of(live).is_none() && !clock.holds(live));
        return Ok(());
    }
    insert.raw_bind_parameter(at + 5, clock.boot_of(live))?;
    insert.raw_bind_parameter(at + 6, c.boot_ms)?;
    insert.raw_bind_parameter(at + 7, clock.holds(live))
}

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
