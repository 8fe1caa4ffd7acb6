//! The outbox's side of clock repair: the boots it has seen, which captures are held
//! from delivery while the clock is not trusted, and releasing them (their wall time
//! recomputed from boot time when the clock is synced) in one transaction.
//!
//! The in-memory side of a hold (this boot, the first held row, the last release, and
//! how a capture committed now is timed) is `hold.rs`; this room records boots, applies
//! the clock keeper's verdicts to the rows and reads the clock's state for `status`.
//!
//! It touches `db`, `hold.rs` and the [`Store`] it writes; `status.rs` reads
//! [`ClockStatus`] from it.

use rusqlite::{params, OptionalExtension};

use super::hold::{first_held, ClockRows, Release};
use super::store::Store;
use crate::db::{add_counter, write_tx, OutboxError};
use crate::record::EpochMillis;

/// What the clock keeper needs from the database at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootStart {
    /// This boot's clock has been seen synchronised (by an earlier run).
    pub synced_this_boot: bool,
    /// The newest wall time the database has recorded: readings decoded, the last
    /// good flush, live captures not held.
    pub high_water_ms: Option<EpochMillis>,
}

/// A verdict of the clock keeper, for the store to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockChange {
    /// Hold live captures committed from now on; `false` also releases every held row.
    pub hold: bool,
    /// The clock is synchronised: this boot's held rows are *repaired*, and the boot is
    /// marked synced.
    pub synced: bool,
    /// The state as `status` shows it.
    pub state: String,
    /// Wall minus boot time now: a held row of this boot gets `boot_ms + offset_ms`.
    pub offset_ms: i64,
    /// Boot time now: live captures received before it and committed after a release
    /// are re-timed too.
    pub boot_ms: i64,
    pub wall_ms: EpochMillis,
}

/// What a release did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Rows of this boot re-timed by a synchronised clock.
    pub repaired: u64,
    /// Rows sent with their best estimate: an earlier boot that never synced, or a
    /// clock used unsynchronised.
    pub estimated: u64,
}

impl Store {
    /// Records this boot (`boot_id` from the kernel) and reads what the clock keeper
    /// needs. Live captures committed after it carry this boot.
    pub(super) fn begin_boot(&mut self, boot_id: &str) -> Result<BootStart, OutboxError> {
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        tx.execute(
            "INSERT INTO boots(boot_id) VALUES (?1) ON CONFLICT(boot_id) DO NOTHING",
            [boot_id],
        )?;
        let (boot, synced_at): (i64, Option<i64>) = tx.query_row(
            "SELECT id, synced_at FROM boots WHERE boot_id = ?1",
            [boot_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        // Startup only: the pending scan has no index, and is not repeated.
        let high_water_ms: Option<i64> = tx.query_row(
            "SELECT MAX(t) FROM (
                SELECT MAX(decoded_at) AS t FROM tapes
                UNION ALL SELECT MAX(captured_at) FROM pending WHERE boot IS NOT NULL AND held = 0
                UNION ALL SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'last_flush_ok_at')",
            [],
            |r| r.get(0),
        )?;
        let first = first_held(&tx)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.clock = ClockRows {
            boot: Some(boot),
            hold_new: self.clock.hold_new,
            first_held: first,
            released: self.clock.released,
        };
        Ok(BootStart {
            synced_this_boot: synced_at.is_some(),
            high_water_ms,
        })
    }

    /// Applies a verdict of the clock keeper in one transaction: whether new live
    /// captures are held, the state `status` shows, and, when not holding, the release
    /// of every held row (counted `clock_repaired` or `clock_estimated`).
    pub(super) fn apply_clock(&mut self, change: &ClockChange) -> Result<Released, OutboxError> {
        let boot = self.clock.boot;
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let released = (|| -> rusqlite::Result<Released> {
            let mut released = Released::default();
            if !change.hold {
                // This boot's rows: wall = boot_ms + (wall_now - boot_now).
                let this_boot = tx.execute(
                    "UPDATE pending SET captured_at = boot_ms + ?1, held = 0
                     WHERE held = 1 AND boot = ?2 AND boot_ms IS NOT NULL",
                    params![change.offset_ms, boot],
                )? as u64;
                // Earlier boots' rows: nothing ties their boot time to a true time.
                let others = tx.execute("UPDATE pending SET held = 0 WHERE held = 1", [])? as u64;
                released = if change.synced {
                    Released {
                        repaired: this_boot,
                        estimated: others,
                    }
                } else {
                    Released {
                        repaired: 0,
                        estimated: this_boot + others,
                    }
                };
                add_counter(&tx, "clock_repaired", released.repaired)?;
                add_counter(&tx, "clock_estimated", released.estimated)?;
            }
            if change.synced {
                tx.execute(
                    "UPDATE boots SET synced_at = ?1 WHERE id = ?2 AND synced_at IS NULL",
                    params![change.wall_ms, boot],
                )?;
            }
            tx.execute(
                "INSERT INTO meta(key, value) VALUES ('clock_state', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [&change.state],
            )?;
            Ok(released)
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        if self.clock.hold_new && !change.hold {
            self.clock.released = Some(Release {
                boot_ms: change.boot_ms,
                offset_ms: change.offset_ms,
                synced: change.synced,
            });
        }
        self.clock.hold_new = change.hold;
        if !change.hold {
            self.clock.first_held = None;
        }
        Ok(released)
    }
}

/// The clock as the daemon last recorded it, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClockStatus {
    /// The keeper's verdict, e.g. `unsynchronised, no time service: trusted`.
    pub state: Option<String>,
    /// Pending captures held from delivery now.
    pub held: u64,
    /// Captures released with their wall time recomputed by a synchronised clock.
    pub repaired: u64,
    /// Captures released with their best estimate.
    pub estimated: u64,
}

/// Reads [`ClockStatus`] (inside the caller's read transaction).
pub(super) fn clock_status(conn: &rusqlite::Connection) -> rusqlite::Result<ClockStatus> {
    let counter = |name: &str| -> rusqlite::Result<u64> {
        let v: Option<i64> = conn
            .query_row("SELECT value FROM counters WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(v.unwrap_or(0).max(0) as u64)
    };
    let held: i64 = conn.query_row("SELECT COUNT(*) FROM pending WHERE held = 1", [], |r| {
        r.get(0)
    })?;
    Ok(ClockStatus {
        state: conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'clock_state'",
                [],
                |r| r.get(0),
            )
            .optional()?,
        held: held.max(0) as u64,
        repaired: counter("clock_repaired")?,
        estimated: counter("clock_estimated")?,
    })
}

#[cfg(test)]
mod tests;
