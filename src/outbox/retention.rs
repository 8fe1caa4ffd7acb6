//! Retention: the outbox's three bounds and the one way rows are evicted.
//!
//! - `outbox.max_pending`: at most this many rows pending;
//! - `outbox.max_age_secs`: a capture older than this (by its capture time) is not kept
//!   once it is at the front of the queue (the oldest admitted); held rows (their time
//!   is not trusted yet, see `clock.rs`) are never aged out;
//! - `outbox.max_bytes`: the database's used pages at most this many bytes (what fills
//!   an SD card), so that a dock on a small card never fills it. Only pending captures
//!   are evicted for it; the other tables have bounds of their own (dead letters by
//!   count, the tapes heard by the last minutes, one latest reading per tape), small
//!   beside a backlog.
//!
//! Past any of them the *oldest* pending rows (admission order) are evicted, by
//! [`evict_oldest`] and nothing else, in the transaction that found the bound exceeded,
//! and counted in `evicted` and in the counter of that bound (`evicted_max_pending`,
//! `evicted_max_age`, `evicted_max_bytes`). The bounds are kept at each commit of a
//! group and, for a gateway that hears nothing, by [`keep_bounds`] now and then.
//!
//! Only rows claimed are passed over: those in a request on the wire, or whose answer is
//! being recorded (`fetch.rs`). A batch waiting (to fill, out a backoff, out the
//! service's `Retry-After`, for a token) holds no claim, and loses what is evicted from
//! it: the flusher claims its rows again as the request goes, and sends only those still
//! pending. So in an outage of any length the oldest go, whatever the flusher holds back.
//!
//! It touches `db`, `hold.rs`, the owner thread (`handle.rs`, for [`keep_bounds`]) and
//! the [`Store`] it writes; `enqueue.rs` calls [`evict_oldest`] and [`evict_past`].

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::{params, Transaction};
use tokio_util::sync::CancellationToken;

use super::handle::Outbox;
use super::hold::first_held;
use super::store::Store;
use crate::config::Retention;
use crate::db::{read_counters, write_counters, write_tx, Counters, OutboxError};
use crate::record::EpochMillis;

/// Rows evicted, by the bound that evicted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Evictions {
    pub max_pending: u64,
    pub max_age: u64,
    pub max_bytes: u64,
}

impl Evictions {
    pub fn total(&self) -> u64 {
        self.max_pending + self.max_age + self.max_bytes
    }

    /// "max_pending 3, max_age 0, max_bytes 12", for a log line.
    pub fn describe(&self) -> String {
        format!(
            "max_pending {}, max_age {}, max_bytes {}",
            self.max_pending, self.max_age, self.max_bytes
        )
    }
}

/// Which bound evicted: `outbox.max_pending`, `max_age_secs`, `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    Pending,
    Age,
    Bytes,
}

impl Bound {
    fn counter(self) -> &'static str {
        match self {
            Bound::Pending => "evicted_max_pending",
            Bound::Age => "evicted_max_age",
            Bound::Bytes => "evicted_max_bytes",
        }
    }
}

/// Deletes the `n` oldest pending rows (admission order) that the flusher has not
/// claimed, and counts them in `next` (`evicted`) and in `bound`'s own counter. The only
/// way a row is evicted. Returns how many went (fewer than `n` when claimed rows are
/// all that is left).
pub(super) fn evict_oldest(
    tx: &Transaction<'_>,
    n: u64,
    bound: Bound,
    claimed: &HashSet<i64>,
    next: &mut Counters,
    evictions: &mut Evictions,
) -> rusqlite::Result<u64> {
    if n == 0 {
        return Ok(0);
    }
    if claimed.is_empty() {
        let gone = tx.execute(
            "DELETE FROM pending WHERE id IN (SELECT id FROM pending ORDER BY id LIMIT ?1)",
            [n as i64],
        )? as u64;
        return count(tx, gone, bound, next, evictions);
    }
    let mut ids = Vec::with_capacity(n.min(4096) as usize);
    {
        let mut oldest = tx.prepare_cached("SELECT id FROM pending ORDER BY id")?;
        let mut rows = oldest.query([])?;
        while (ids.len() as u64) < n {
            let Some(r) = rows.next()? else { break };
            let id: i64 = r.get(0)?;
            if !claimed.contains(&id) {
                ids.push(id);
            }
        }
    }
    delete_ids(tx, &ids, bound, next, evictions)
}

/// Deletes the rows `ids` and counts them as evicted by `bound`.
fn delete_ids(
    tx: &Transaction<'_>,
    ids: &[i64],
    bound: Bound,
    next: &mut Counters,
    evictions: &mut Evictions,
) -> rusqlite::Result<u64> {
    let mut delete = tx.prepare_cached("DELETE FROM pending WHERE id = ?1")?;
    let mut gone = 0;
    for id in ids {
        gone += delete.execute([id])? as u64;
    }
    count(tx, gone, bound, next, evictions)
}

fn count(
    tx: &Transaction<'_>,
    gone: u64,
    bound: Bound,
    next: &mut Counters,
    evictions: &mut Evictions,
) -> rusqlite::Result<u64> {
    next.evicted += gone;
    tx.execute(
        "UPDATE counters SET value = value + ?2 WHERE name = ?1",
        params![bound.counter(), gone as i64],
    )?;
    match bound {
        Bound::Pending => evictions.max_pending += gone,
        Bound::Age => evictions.max_age += gone,
        Bound::Bytes => evictions.max_bytes += gone,
    }
    Ok(gone)
}

/// Bytes of the database's pages in use (its file's size less its free pages), as this
/// transaction sees it.
pub(super) fn used_bytes(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    let pragma = |name: &str| -> rusqlite::Result<i64> {
        tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
    };
    let pages = pragma("page_count")? - pragma("freelist_count")?;
    Ok((pages.max(0) as u64) * (pragma("page_size")?.max(0) as u64))
}

/// Evicts past the age and size bounds (max_pending is the caller's), in `tx`, never a
/// row in `claimed`.
pub(super) fn evict_past(
    tx: &Transaction<'_>,
    retention: &Retention,
    now: EpochMillis,
    claimed: &HashSet<i64>,
    next: &mut Counters,
    evictions: &mut Evictions,
) -> rusqlite::Result<()> {
    if let Some(max_age) = retention.max_age_ms {
        let cutoff = now - max_age;
        // The leading run of old, unheld rows (claimed ones passed over), a window at a
        // time, from the oldest admitted.
        let mut after = 0i64;
        loop {
            let mut stmt = tx.prepare_cached(
                "SELECT id, captured_at, held FROM pending WHERE id > ?1 ORDER BY id LIMIT 512",
            )?;
            let rows: Vec<(i64, i64, bool)> = stmt
                .query_map([after], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?;
            let mut old = Vec::new();
            let mut young_seen = false;
            for (id, at, held) in &rows {
                if claimed.contains(id) {
                    continue;
                }
                if *at >= cutoff || *held {
                    young_seen = true;
                    break;
                }
                old.push(*id);
            }
            delete_ids(tx, &old, Bound::Age, next, evictions)?;
            match rows.last() {
                Some((last, _, _)) if !young_seen && rows.len() == 512 => after = *last,
                _ => break,
            }
        }
    }
    if let Some(max_bytes) = retention.max_bytes {
        // Deleting from the front frees whole pages; a few rounds bring it under.
        for _ in 0..1000 {
            let pending = next.pending();
            if pending == 0 || used_bytes(tx)? <= max_bytes {
                break;
            }
            let n = (pending / 50).max(64).min(pending);
            if evict_oldest(tx, n, Bound::Bytes, claimed, next, evictions)? == 0 {
                // Only rows being delivered are left: they leave by their answer.
                break;
            }
        }
    }
    Ok(())
}

impl Store {
    /// Evicts what the age and size bounds no longer allow, as of `now`, in one
    /// transaction; for a gateway that commits nothing for a while.
    pub(super) fn keep_bounds(&mut self, now: EpochMillis) -> Result<Evictions, OutboxError> {
        let mut evictions = Evictions::default();
        if self.retention == Retention::default() {
            return Ok(evictions);
        }
        let retention = self.retention;
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let (next, held) = (|| -> rusqlite::Result<(Counters, Option<i64>)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            evict_past(
                &tx,
                &retention,
                now,
                &self.claimed,
                &mut next,
                &mut evictions,
            )?;
            write_counters(&tx, &current, &next)?;
            Ok((next, first_held(&tx)?))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.counters = next;
        self.clock.first_held = held;
        if evictions.total() > 0 {
            // Rows the flusher's walk remembered, or holds, may be gone: it starts over,
            // and claims look its rows up.
            self.cursor.reset();
            self.seen.0 += 1;
        }
        Ok(evictions)
    }

    /// Rows evicted so far, by bound (kept across restarts); for the tests.
    #[cfg(test)]
    fn evictions(&self) -> Result<Evictions, OutboxError> {
        evictions_in(&self.conn)
    }

    /// Bytes of the database's pages in use now; for the tests.
    #[cfg(test)]
    fn database_bytes(&mut self) -> Result<u64, OutboxError> {
        let tx = self.conn.transaction()?;
        let used = used_bytes(&tx)?;
        tx.finish()?;
        Ok(used)
    }
}

/// The counters of each bound.
pub(super) fn evictions_in(conn: &rusqlite::Connection) -> Result<Evictions, OutboxError> {
    let counter = |name: &str| -> Result<u64, OutboxError> {
        use rusqlite::OptionalExtension;
        let v: Option<i64> = conn
            .query_row("SELECT value FROM counters WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(v.unwrap_or(0).max(0) as u64)
    };
    Ok(Evictions {
        max_pending: counter(Bound::Pending.counter())?,
        max_age: counter(Bound::Age.counter())?,
        max_bytes: counter(Bound::Bytes.counter())?,
    })
}

/// Keeps the age and size bounds while the daemon runs, every `every`, until `stop`;
/// evictions are logged at ERROR (data lost), naming the bound.
pub async fn keep_bounds(outbox: Outbox, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match outbox
            .call(|s| s.keep_bounds(s.options.clock.wall_ms()))
            .await
        {
            Ok(e) if e.total() > 0 => tracing::error!(
                evicted = e.total(),
                max_age = e.max_age,
                max_bytes = e.max_bytes,
                "outbox bounds: evicted the oldest pending captures ({})",
                e.describe()
            ),
            Ok(_) => {}
            Err(OutboxError::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "outbox bounds not kept this time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::tests as fixture;
    use crate::outbox::StoreOptions;
    use crate::record::{Capture, Mac};

    /// Capture `i` of one of 200 tapes.
    fn capture(i: u32, ts_ms: i64) -> Capture {
        let b = (i % 200).to_be_bytes();
        let mac = Mac::new([0xC0, 0xFF, b[0], b[1], b[2], b[3]]);
        fixture::capture(mac, ts_ms, "F70E4956E29F84211E44FFB51E")
    }

    const DAY: i64 = 86_400_000;

    #[test]
    fn old_captures_at_the_front_are_evicted_by_age_and_counted_so() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store.set_retention(Retention {
            max_age_ms: Some(DAY),
            max_bytes: None,
        });
        let now = crate::clock::system().wall_ms();
        // Admitted already too old: evicted in the commit that admits them.
        let old: Vec<Capture> = (0..700).map(|i| capture(i, now - 2 * DAY)).collect();
        let e = store.enqueue_counted(&old).unwrap();
        assert_eq!(
            e,
            Evictions {
                max_age: 700,
                ..Evictions::default()
            }
        );
        // Young ones age while nothing is committed: the periodic look evicts them.
        let young: Vec<Capture> = (700..710).map(|i| capture(i, now - 1000)).collect();
        store.enqueue(&young).unwrap();
        assert_eq!(store.keep_bounds(now).unwrap().total(), 0);
        let e = store.keep_bounds(now + 2 * DAY).unwrap();
        assert_eq!(
            e,
            Evictions {
                max_age: 10,
                ..Evictions::default()
            }
        );
        let s = store.stats().unwrap();
        assert_eq!((s.pending, s.evicted, s.admitted), (0, 710, 710));
        assert_eq!(store.evictions().unwrap().max_age, 710);
        assert_eq!(store.count_pending_rows().unwrap(), 0);
    }

    /// One fate per capture: a row the flusher has claimed (on its way to the service)
    /// is aged out or evicted for size by no bound; it leaves by its answer.
    #[test]
    fn claimed_rows_are_never_evicted_by_age_or_size() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let now = crate::clock::system().wall_ms();
        store
            .enqueue(&(0..10).map(|i| capture(i, now - 1000)).collect::<Vec<_>>())
            .unwrap();
        let keys: Vec<crate::outbox::RowKey> = store
            .pending_captures()
            .unwrap()
            .iter()
            .filter(|p| [1, 2, 5].contains(&p.id))
            .map(crate::outbox::PendingCapture::key)
            .collect();
        let seen = store
            .fetch_next_batch(1, 1, &HashSet::new(), &[])
            .unwrap()
            .seen;
        assert_eq!(store.claim(&keys, seen).unwrap(), [1, 2, 5]);
        store.set_retention(Retention {
            max_age_ms: Some(DAY),
            max_bytes: Some(1),
        });
        let e = store.keep_bounds(now + 2 * DAY).unwrap();
        assert_eq!(e.total(), 7, "{e:?}");
        let ids: Vec<i64> = store
            .pending_captures()
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids, [1, 2, 5]);
        let s = store.stats().unwrap();
        assert_eq!((s.pending, s.evicted, s.admitted), (3, 7, 10));
    }

    #[test]
    fn past_max_bytes_the_oldest_go_until_the_database_fits() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let max_bytes = 1024 * 1024;
        store.set_retention(Retention {
            max_age_ms: None,
            max_bytes: Some(max_bytes),
        });
        let mut evicted = 0;
        for group in 0..40u32 {
            let captures: Vec<Capture> = (0..1000)
                .map(|i| capture(group * 1000 + i, crate::clock::system().wall_ms()))
                .collect();
            evicted += store.enqueue(&captures).unwrap();
            assert!(store.database_bytes().unwrap() <= max_bytes);
        }
        let s = store.stats().unwrap();
        assert!(evicted > 0 && s.evicted == evicted, "{s:?}");
        assert_eq!(store.evictions().unwrap().max_bytes, evicted);
        assert_eq!(s.admitted, s.pending + s.evicted);
        // The newest are kept.
        assert!(s.pending > 1000, "{s:?}");
        let oldest_kept = store.pending_captures().unwrap()[0].id;
        assert_eq!(oldest_kept as u64, evicted + 1, "the oldest went first");
        let file = std::fs::metadata(crate::db::open::path_in(dir.path()))
            .unwrap()
            .len();
        assert!(file <= max_bytes + 256 * 1024, "file {file} bytes");
    }
}
