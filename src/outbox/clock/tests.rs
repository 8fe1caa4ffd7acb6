//! The outbox's side of clock repair, checked on a real database: holds, releases,
//! re-timing and the high-water mark of a new run.

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

/// A synced release re-times this boot's captures from boot time and counts them repaired.
#[test]
fn a_synced_release_re_times_this_boots_captures_from_boot_time() {
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

/// A capture received before a release and committed after it is re-timed as the held ones.
#[test]
fn a_capture_committed_just_after_a_release_is_re_timed_too() {
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

/// A recorded capture (replayed: no boot time) is inserted without the clock's columns,
/// a live one with them (`enqueue.rs`): whatever the mix in a group and its chunks, every
/// row reads back as if all eight had been bound, held or not.
#[test]
fn recorded_and_live_captures_mixed_in_a_group_keep_their_clock_columns() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let mut s = holding(s);
    let recorded = |i: i64| Capture {
        boot_ms: None,
        ts_ms: TRUE_WALL_AT_BOOT + i,
        ..live(i as u8, i)
    };
    // 50 recorded (one statement), 50 mixed, 30 recorded, 7 mixed (row by row).
    let group: Vec<Capture> = (0..137)
        .map(|i| match i {
            0..50 | 100..130 => recorded(i),
            _ if i % 3 == 0 => recorded(i),
            _ => live(i as u8, 1_000 + i),
        })
        .collect();
    s.enqueue(&group).unwrap();
    let boot: i64 = s
        .conn
        .query_row("SELECT id FROM boots WHERE boot_id = 'boot-a'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let mut stmt = s
        .conn
        .prepare("SELECT captured_at, boot, boot_ms, held FROM pending ORDER BY id")
        .unwrap();
    let rows: Vec<(i64, Option<i64>, Option<i64>, bool)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), group.len());
    for (c, row) in group.iter().zip(&rows) {
        let want = match c.boot_ms {
            None => (c.ts_ms, None, None, false),
            Some(boot_ms) => (c.ts_ms, Some(boot), Some(boot_ms), true),
        };
        assert_eq!(*row, want, "{c:?}");
    }
}
