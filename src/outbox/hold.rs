//! What the store keeps in memory of the clock's hold ([`ClockRows`]): this boot, whether
//! live captures committed now are held, the first held row, and the last release, by
//! which a capture committed after it is timed. A leaf: it touches only the `db` rows
//! and the domain's words; `clock.rs` records boots and applies the keeper's verdicts.
//!
//! A release also reaches what is not yet committed: a capture received before it (its
//! boot time says so) but committed after, from the ingest stage's open group or from
//! what dedup holds, was stamped under the hold just as the held rows were, and is
//! re-timed the same way when it is committed ([`ClockRows::captured_at`]), never sent
//! with the wrong time it was stamped with.
//!
//! Held rows are always the newest: a hold applies to every live capture committed
//! while it lasts and a release frees every held row at once, so `next_batch` stops at
//! the first held row instead of walking past them ([`ClockRows::first_held`]). That
//! also keeps each tape's captures in capture order across a hold. (Dead letters
//! re-queued during a hold land after it and wait for the release with the rest.)

use rusqlite::Transaction;

use crate::db::add_counter;
use crate::record::{Capture, EpochMillis};

/// What the store keeps in memory about held rows and this boot.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ClockRows {
    /// `boots.id` of this boot, once `Store::begin_boot` has recorded it.
    pub(super) boot: Option<i64>,
    /// Live captures committed now are held.
    pub(super) hold_new: bool,
    /// The lowest id of a held row, if any is held.
    pub(super) first_held: Option<i64>,
    /// The last release of a hold: live captures received (boot time) before it are
    /// re-timed as the held rows were when they are committed after it.
    pub(super) released: Option<Release>,
}

/// A release of held captures, for captures received before it and committed after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Release {
    /// Boot time of the clock reading that released.
    pub(super) boot_ms: i64,
    /// Wall minus boot time of that reading.
    pub(super) offset_ms: i64,
    /// The clock was synchronised (re-timed captures count as repaired, else estimated).
    pub(super) synced: bool,
}

/// Captures re-timed as they were committed (see [`ClockRows::captured_at`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Retimed {
    repaired: u64,
    estimated: u64,
}

impl Retimed {
    /// Adds them to the clock counters, in the committing transaction.
    pub(super) fn count(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        add_counter(tx, "clock_repaired", self.repaired)?;
        add_counter(tx, "clock_estimated", self.estimated)
    }
}

impl ClockRows {
    /// Whether a capture committed now is held.
    pub(super) fn holds(&self, live: bool) -> bool {
        self.hold_new && live
    }

    /// The `boot` column of a capture committed now.
    pub(super) fn boot_of(&self, live: bool) -> Option<i64> {
        self.boot.filter(|_| live)
    }

    /// The `captured_at` of `c` committed now: its wall time as stamped, unless it is a
    /// live capture received before the last release of a hold and committed after it
    /// (not held now): then, like the held rows that release re-timed, its boot time
    /// plus the releasing clock's offset. Counted in `retimed`.
    pub(super) fn captured_at(&self, c: &Capture, retimed: &mut Retimed) -> EpochMillis {
        match (c.boot_ms, self.released) {
            (Some(boot_ms), Some(r)) if !self.hold_new && boot_ms <= r.boot_ms => {
                if r.synced {
                    retimed.repaired += 1;
                } else {
                    retimed.estimated += 1;
                }
                boot_ms.saturating_add(r.offset_ms)
            }
            _ => c.ts_ms,
        }
    }

    /// `next_batch` reads rows below this id.
    pub(super) fn deliverable_below(&self) -> i64 {
        self.first_held.unwrap_or(i64::MAX)
    }
}

/// The lowest id of a held row (the partial index `pending_held` answers it).
pub(super) fn first_held(tx: &Transaction<'_>) -> rusqlite::Result<Option<i64>> {
    tx.query_row("SELECT MIN(id) FROM pending WHERE held = 1", [], |r| {
        r.get(0)
    })
}
