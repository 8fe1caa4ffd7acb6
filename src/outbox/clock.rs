//! The outbox's side of clock repair: the boots it has seen, which captures are held
//! from delivery while the clock is not trusted, and releasing them (their wall time
//! recomputed from boot time when the clock is synced) in one transaction.
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

use rusqlite::{params, OptionalExtension, Transaction};

use super::store::write_tx;
use super::{OutboxError, Store};
use crate::record::{Capture, EpochMillis};

/// What the store keeps in memory about held rows and this boot.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ClockRows {
    /// `boots.id` of this boot, once [`Store::begin_boot`] has recorded it.
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
    boot_ms: i64,
    /// Wall minus boot time of that reading.
    offset_ms: i64,
    /// The clock was synchronised (re-timed captures count as repaired, else estimated).
    synced: bool,
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
    pub fn begin_boot(&mut self, boot_id: &str) -> Result<BootStart, OutboxError> {
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
    pub fn apply_clock(&mut self, change: &ClockChange) -> Result<Released, OutboxError> {
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

fn add_counter(tx: &Transaction<'_>, name: &str, n: u64) -> rusqlite::Result<()> {
    if n > 0 {
        tx.execute(
            "UPDATE counters SET value = value + ?2 WHERE name = ?1",
            params![name, n as i64],
        )?;
    }
    Ok(())
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
mod tests {
    use super::*;
    use crate::outbox::StoreOptions;
    use crate::record::{Capture, Mac};

    const DAY: i64 = 86_400_000;
    /// The clock's wrong reading at boot: three weeks behind the true time.
    const WRONG_WALL_AT_BOOT: i64 = 1_700_000_000_000;
    const TRUE_WALL_AT_BOOT: i64 = WRONG_WALL_AT_BOOT + 21 * DAY;

    fn live(mac: u8, boot_ms: i64) -> Capture {
        Capture {
            mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, mac]),
            ts_ms: WRONG_WALL_AT_BOOT + boot_ms,
            product_id: "tape".into(),
            packet: format!("{boot_ms:X}"),
            rssi: None,
            boot_ms: Some(boot_ms),
        }
    }

    fn change(hold: bool, synced: bool, wall_ms: i64, boot_ms: i64) -> ClockChange {
        ClockChange {
            hold,
            synced,
            state: "test".into(),
            offset_ms: wall_ms - boot_ms,
            boot_ms,
            wall_ms,
        }
    }

    fn open_with(dir: &tempfile::TempDir, options: StoreOptions) -> Store {
        Store::open(dir.path(), options).unwrap().0
    }

    fn open(dir: &tempfile::TempDir) -> Store {
        open_with(dir, StoreOptions::default())
    }

    /// Boot "boot-a" begun, and holding from its start with the clock three weeks behind.
    fn holding(mut s: Store) -> Store {
        s.begin_boot("boot-a").unwrap();
        s.apply_clock(&change(true, false, WRONG_WALL_AT_BOOT, 0))
            .unwrap();
        s
    }

    /// Releases with the clock reading `wall_ms` at `boot_ms`; `(repaired, estimated)`.
    fn release(s: &mut Store, synced: bool, wall_ms: i64, boot_ms: i64) -> (u64, u64) {
        let r = s
            .apply_clock(&change(false, synced, wall_ms, boot_ms))
            .unwrap();
        (r.repaired, r.estimated)
    }

    fn batch_times(s: &Store) -> Vec<i64> {
        let b = s.next_batch(250, 100_000).unwrap();
        b.iter().map(|p| p.capture.ts_ms).collect()
    }

    /// Groups past one INSERT statement's rows (`queue.rs`): a hold that begins after
    /// some of a group's rows were written still starts at the first held row.
    #[test]
    fn a_large_group_is_held_from_its_first_held_row() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir);
        s.begin_boot("boot-a").unwrap();
        let group: Vec<Capture> = (0..120).map(|i| live(i as u8, 1_000 + i)).collect();
        s.enqueue(&group).unwrap();
        assert_eq!(s.clock.first_held, None);
        let mut s = holding(s);
        s.enqueue(&group).unwrap();
        assert_eq!(
            s.clock.first_held,
            Some(121),
            "the first row of the held group"
        );
        let held = s.pending_captures().unwrap();
        assert_eq!(held.len(), 240);
        assert!(
            held.iter().zip(1..).all(|(p, id)| p.id == id),
            "ids in order"
        );
        assert_eq!(held[130].capture.packet, format!("{:X}", 1_010));
        assert_eq!(batch_times(&s).len(), 120, "the group before the hold only");
    }

    #[test]
    fn held_captures_are_accepted_but_not_handed_to_the_flusher() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir);
        s.begin_boot("boot-a").unwrap();
        s.enqueue(&[live(1, 1_000)]).unwrap();
        s.apply_clock(&change(true, false, WRONG_WALL_AT_BOOT + 2_000, 2_000))
            .unwrap();
        s.enqueue(&[live(2, 3_000), live(3, 4_000)]).unwrap();
        assert_eq!(s.pending(), 3);
        assert_eq!(batch_times(&s), vec![WRONG_WALL_AT_BOOT + 1_000]);
        assert_eq!(s.stats().unwrap().clock.held, 2);
    }

    #[test]
    fn a_synced_release_re_times_this_boots_captures_from_boot_time_and_counts_them_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = holding(open(&dir));
        s.enqueue(&[live(1, 90_000), live(2, 95_000)]).unwrap();
        assert!(batch_times(&s).is_empty());

        // Synced at boot time 600 s to the true time: three weeks ahead.
        let released = release(&mut s, true, TRUE_WALL_AT_BOOT + 600_000, 600_000);
        assert_eq!(released, (2, 0));
        assert_eq!(
            batch_times(&s),
            vec![TRUE_WALL_AT_BOOT + 90_000, TRUE_WALL_AT_BOOT + 95_000]
        );
        let st = s.stats().unwrap().clock;
        assert_eq!((st.held, st.repaired, st.estimated), (0, 2, 0));
        assert_eq!(st.state.as_deref(), Some("test"));
        // The boot is remembered as synced.
        assert!(s.begin_boot("boot-a").unwrap().synced_this_boot);
    }

    #[test]
    fn a_capture_received_before_a_release_and_committed_after_it_is_re_timed_as_the_held_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = holding(open(&dir));
        s.enqueue(&[live(1, 90_000)]).unwrap();
        // Received at boot time 95 s and 99 s, under the hold: still in an open group (or
        // held by dedup) when the clock syncs at 100 s...
        let open_group = [live(2, 95_000), live(3, 99_000)];
        assert_eq!(
            release(&mut s, true, TRUE_WALL_AT_BOOT + 100_000, 100_000),
            (1, 0)
        );
        // ...and committed after it, with a capture received after the release.
        let after = Capture {
            ts_ms: TRUE_WALL_AT_BOOT + 101_000,
            ..live(4, 101_000)
        };
        s.enqueue(&[open_group[0].clone(), open_group[1].clone(), after])
            .unwrap();
        assert_eq!(
            batch_times(&s),
            vec![
                TRUE_WALL_AT_BOOT + 90_000,
                TRUE_WALL_AT_BOOT + 95_000,
                TRUE_WALL_AT_BOOT + 99_000,
                TRUE_WALL_AT_BOOT + 101_000
            ],
            "nothing is sent with the wrong time it was stamped with"
        );
        let st = s.stats().unwrap().clock;
        assert_eq!((st.held, st.repaired, st.estimated), (0, 3, 0));
    }

    #[test]
    fn captures_of_an_earlier_boot_that_never_synced_are_released_with_their_estimate() {
        let dir = tempfile::tempdir().unwrap();
        holding(open(&dir)).enqueue(&[live(1, 5_000)]).unwrap();
        let mut s = open(&dir);
        let start = s.begin_boot("boot-b").unwrap();
        assert!(!start.synced_this_boot);
        assert!(batch_times(&s).is_empty(), "still held after a restart");
        assert_eq!(release(&mut s, true, TRUE_WALL_AT_BOOT, 1_000), (0, 1));
        assert_eq!(batch_times(&s), vec![WRONG_WALL_AT_BOOT + 5_000]);
    }

    #[test]
    fn an_unsynced_release_re_times_by_the_clock_as_it_reads_and_counts_them_estimated() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = holding(open(&dir));
        s.enqueue(&[live(1, 5_000)]).unwrap();
        // Someone set the clock an hour forward by hand; no sync vouches for it.
        let hour = 3_600_000;
        let released = release(&mut s, false, WRONG_WALL_AT_BOOT + hour + 9_000, 9_000);
        assert_eq!(released, (0, 1));
        assert_eq!(batch_times(&s), vec![WRONG_WALL_AT_BOOT + hour + 5_000]);
    }

    #[test]
    fn replayed_captures_carry_their_recorded_times_and_are_never_held() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = holding(open(&dir));
        let recorded = Capture {
            boot_ms: None,
            ts_ms: 1_763_719_200_125,
            ..live(1, 0)
        };
        s.enqueue(&[recorded]).unwrap();
        assert_eq!(batch_times(&s), vec![1_763_719_200_125]);
    }

    #[test]
    fn evicting_held_rows_keeps_the_bound_of_what_is_deliverable_right() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            max_pending: 2,
            ..StoreOptions::default()
        };
        let mut s = holding(open_with(&dir, options));
        s.enqueue(&[live(1, 1_000), live(2, 2_000)]).unwrap();
        assert_eq!(s.enqueue(&[live(3, 3_000)]).unwrap(), 1);
        release(&mut s, true, TRUE_WALL_AT_BOOT + 10_000, 10_000);
        assert_eq!(
            batch_times(&s),
            vec![TRUE_WALL_AT_BOOT + 2_000, TRUE_WALL_AT_BOOT + 3_000]
        );
    }

    #[test]
    fn the_newest_recorded_time_is_the_high_water_mark_of_a_new_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir);
        assert_eq!(s.begin_boot("boot-a").unwrap().high_water_ms, None);
        s.enqueue(&[live(1, 1_000), live(2, 7_000)]).unwrap();
        s.note_flush_ok(WRONG_WALL_AT_BOOT + 3_000).unwrap();
        assert_eq!(
            s.begin_boot("boot-b").unwrap().high_water_ms,
            Some(WRONG_WALL_AT_BOOT + 7_000)
        );
    }
}
