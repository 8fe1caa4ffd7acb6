//! What the operator sees and changes beside the daemon: the counters and state of
//! `tapegate status` (and the notes the daemon leaves for it: last flush, last error,
//! the BLE scanner's counts), stored dead letters (list, retry, purge), and the tapes'
//! latest readings (with those the daemon has not written yet, `latest.rs`).
//!
//! It touches `db`, `clock.rs` and `retention.rs` (for `status`), the outbox's words
//! and the [`Store`] it reads and writes.

use rusqlite::{params, Connection, OptionalExtension};

use super::clock::{clock_status, ClockStatus};
use super::retention::{evictions_in, used_bytes, Evictions};
use super::store::Store;
use super::words::TapeRow;
use crate::db::{
    int_to_mac, mac_to_int, packet_text, read_counters, set_meta, write_counters, write_tx,
    OutboxError,
};
use crate::record::{EpochMillis, Mac};

/// A stored dead letter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    pub id: i64,
    pub mac: Mac,
    pub captured_at: EpochMillis,
    pub product_id: String,
    pub packet: String,
    pub rssi: Option<i16>,
    pub error: String,
    pub dead_at: EpochMillis,
}

/// What the state database knows of a tape heard now (the status page).
#[derive(Debug, Clone, PartialEq)]
pub struct TapeKnown {
    /// Its latest decoded reading: the service knows it.
    pub reading: Option<TapeRow>,
    /// The service's error on its latest refused capture, if one is stored.
    pub refused: Option<String>,
}

/// Counters and state for `tapegate status`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    pub admitted: u64,
    pub delivered: u64,
    pub dead_letters: u64,
    pub evicted: u64,
    pub pending: u64,
    pub dead_letters_stored: u64,
    pub dead_letters_dropped: u64,
    /// Capture time of the oldest pending capture.
    pub oldest_pending_at: Option<EpochMillis>,
    pub last_flush_ok_at: Option<EpochMillis>,
    pub last_error: Option<String>,
    pub last_error_at: Option<EpochMillis>,
    pub tapes: u64,
    /// The flusher's batches in flight and its concurrency limit, as it last recorded
    /// them (0 in flight once it has stopped).
    pub flush_in_flight: Option<u64>,
    pub flush_concurrency: Option<u64>,
    /// The BLE scanner's liveness ladder, accumulated across restarts.
    pub scanner: ScannerCounts,
    pub scanner_last_trouble: Option<String>,
    pub scanner_last_trouble_at: Option<EpochMillis>,
    /// Where the BLE source reads adverts (`mgmt` or `dbus`), as it last said.
    pub scanner_adverts: Option<String>,
    /// Advertising reports per second over the minute to `scanner_reports_at`.
    pub scanner_reports_per_sec: Option<f64>,
    pub scanner_reports_at: Option<EpochMillis>,
    /// The clock's state, held captures and repairs.
    pub clock: ClockStatus,
    /// Evicted captures by the bound that evicted them (`retention.rs`).
    pub evicted_by: Evictions,
    /// Bytes of the database's pages in use (what `outbox.max_bytes` bounds).
    pub database_bytes: u64,
}

/// What the BLE scanner has been through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScannerCounts {
    /// Scans restarted (liveness ladder step 1).
    pub restarts: u64,
    /// Adapters re-acquired with a new BlueZ connection (step 2).
    pub reacquires: u64,
    /// Adverts dropped because the pipeline did not keep up.
    pub dropped: u64,
    /// Devices forgotten to bound memory.
    pub forgotten: u64,
}

/// The flusher's state as `status` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlusherState {
    /// When a batch was last delivered, if just now.
    pub ok_at: Option<EpochMillis>,
    /// Batches in flight.
    pub in_flight: usize,
    /// The concurrency limit.
    pub concurrency: usize,
}

impl FlusherState {
    pub(super) fn write(&self, conn: &Connection) -> rusqlite::Result<()> {
        if let Some(at) = self.ok_at {
            set_meta(conn, "last_flush_ok_at", &at.to_string())?;
        }
        set_meta(conn, "flush_in_flight", &self.in_flight.to_string())?;
        set_meta(conn, "flush_concurrency", &self.concurrency.to_string())
    }
}

/// Text from elsewhere (the service's reasons, BlueZ's troubles) is kept and read back
/// bounded ([`crate::util::text::bounded`]); a database written before the bound may hold
/// longer rows, of which only this many characters are read.
const READ_CHARS: i64 = 4 * crate::util::text::SHOWN_MAX_CHARS as i64;

fn bounded(s: &str) -> String {
    crate::util::text::bounded(s, crate::util::text::SHOWN_MAX_CHARS)
}

impl Store {
    /// Records a successful flush.
    pub(super) fn note_flush_ok(&mut self, at: EpochMillis) -> Result<(), OutboxError> {
        set_meta(&self.conn, "last_flush_ok_at", &at.to_string())?;
        Ok(())
    }

    /// Records the flusher's state for `status`.
    pub(super) fn note_flusher(&mut self, state: &FlusherState) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        state.write(&tx)?;
        tx.commit()?;
        Ok(())
    }

    /// Records the operator-readable cause of the latest failure.
    pub(super) fn note_error(&mut self, cause: &str, at: EpochMillis) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        set_meta(&tx, "last_error", &bounded(cause))?;
        set_meta(&tx, "last_error_at", &at.to_string())?;
        tx.commit()?;
        Ok(())
    }

    /// Adds to the scanner's counts kept for `status` (they accumulate across restarts
    /// of the daemon), and records its last trouble.
    pub(super) fn add_scanner_counts(
        &mut self,
        counts: &ScannerCounts,
        last_trouble: Option<(&str, EpochMillis)>,
    ) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        for (key, n) in [
            ("scanner_restarts", counts.restarts),
            ("scanner_reacquires", counts.reacquires),
            ("scanner_dropped", counts.dropped),
            ("scanner_forgotten", counts.forgotten),
        ] {
            if n > 0 {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES (?1, ?2)
                     ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + CAST(excluded.value AS INTEGER)",
                    params![key, n.to_string()],
                )?;
            }
        }
        if let Some((reason, at)) = last_trouble {
            set_meta(&tx, "scanner_last_trouble", &bounded(reason))?;
            set_meta(&tx, "scanner_last_trouble_at", &at.to_string())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records where the BLE source reads adverts and the reports per second measured
    /// up to `at` (the health keeper writes it at most once a minute: SD wear).
    pub(super) fn note_scanner_rate(
        &mut self,
        path: Option<&str>,
        reports_per_sec: Option<f64>,
        at: EpochMillis,
    ) -> Result<(), OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        if let Some(p) = path {
            set_meta(&tx, "scanner_adverts", p)?;
        }
        if let Some(r) = reports_per_sec {
            set_meta(&tx, "scanner_reports_per_sec", &format!("{r:.1}"))?;
        }
        set_meta(&tx, "scanner_reports_at", &at.to_string())?;
        tx.commit()?;
        Ok(())
    }

    /// Counters and state, read in one transaction.
    pub(super) fn stats(&self) -> Result<Stats, OutboxError> {
        let tx = self.conn.unchecked_transaction()?;
        let c = read_counters(&tx)?;
        let meta = |k: &str| -> rusqlite::Result<Option<String>> {
            tx.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
                .optional()
        };
        let int_meta = |k: &str| -> rusqlite::Result<Option<i64>> {
            Ok(meta(k)?.and_then(|v| v.parse().ok()))
        };
        let stats = Stats {
            admitted: c.admitted,
            delivered: c.delivered,
            dead_letters: c.dead_lettered,
            evicted: c.evicted,
            pending: c.pending(),
            dead_letters_stored: tx
                .query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))?,
            dead_letters_dropped: c.dead_letters_dropped,
            oldest_pending_at: tx
                .query_row(
                    "SELECT captured_at FROM pending ORDER BY id LIMIT 1",
                    [],
                    |r| r.get(0),
                )
                .optional()?,
            last_flush_ok_at: int_meta("last_flush_ok_at")?,
            last_error: meta("last_error")?,
            last_error_at: int_meta("last_error_at")?,
            tapes: tx.query_row("SELECT COUNT(*) FROM tapes", [], |r| r.get(0))?,
            flush_in_flight: int_meta("flush_in_flight")?.map(|v| v.max(0) as u64),
            flush_concurrency: int_meta("flush_concurrency")?.map(|v| v.max(0) as u64),
            scanner: ScannerCounts {
                restarts: int_meta("scanner_restarts")?.unwrap_or(0) as u64,
                reacquires: int_meta("scanner_reacquires")?.unwrap_or(0) as u64,
                dropped: int_meta("scanner_dropped")?.unwrap_or(0) as u64,
                forgotten: int_meta("scanner_forgotten")?.unwrap_or(0) as u64,
            },
            scanner_last_trouble: meta("scanner_last_trouble")?,
            scanner_last_trouble_at: int_meta("scanner_last_trouble_at")?,
            scanner_adverts: meta("scanner_adverts")?,
            scanner_reports_per_sec: meta("scanner_reports_per_sec")?.and_then(|v| v.parse().ok()),
            scanner_reports_at: int_meta("scanner_reports_at")?,
            clock: clock_status(&tx)?,
            evicted_by: evictions_in(&tx)?,
            database_bytes: used_bytes(&tx)?,
        };
        tx.finish()?;
        Ok(stats)
    }

    /// Stored dead letters, newest first.
    pub(super) fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, mac, captured_at, product_id, packet, rssi, substr(error, 1, ?2), dead_at FROM dead_letters ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt
            .query_map([limit as i64, READ_CHARS], |r| {
                Ok(DeadLetter {
                    id: r.get(0)?,
                    mac: int_to_mac(r.get(1)?),
                    captured_at: r.get(2)?,
                    product_id: r.get(3)?,
                    packet: packet_text(r.get_ref(4)?)?,
                    rssi: r.get(5)?,
                    error: bounded(&r.get::<_, String>(6)?),
                    dead_at: r.get(7)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Moves dead letters (all, or those of `mac`) back to `pending`, in one
    /// transaction. Returns how many.
    pub(super) fn retry_dead_letters(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        let filter = mac.map(mac_to_int);
        let tx = write_tx(&mut self.conn)?;
        let moved = tx.execute(
            "INSERT INTO pending(mac, captured_at, product_id, packet, rssi)
             SELECT mac, captured_at, product_id, packet, rssi FROM dead_letters
             WHERE ?1 IS NULL OR mac = ?1 ORDER BY id",
            [filter],
        )? as u64;
        tx.execute(
            "DELETE FROM dead_letters WHERE ?1 IS NULL OR mac = ?1",
            [filter],
        )?;
        let current = read_counters(&tx)?;
        let mut next = current;
        // Re-queued captures count as pending again, so the invariant holds; only
        // those still counted as dead letters can move back.
        let back = moved.min(current.dead_lettered);
        next.dead_lettered -= back;
        next.admitted += moved - back;
        write_counters(&tx, &current, &next)?;
        tx.commit()?;
        self.counters = next;
        // Rows inserted where the flusher's walk may have passed.
        self.cursor.reset();
        Ok(moved)
    }

    /// Deletes stored dead letters (all, or those of `mac`). Counters keep counting
    /// them as refused. Returns how many.
    pub(super) fn purge_dead_letters(&mut self, mac: Option<Mac>) -> Result<u64, OutboxError> {
        let filter = mac.map(mac_to_int);
        Ok(self.conn.execute(
            "DELETE FROM dead_letters WHERE ?1 IS NULL OR mac = ?1",
            [filter],
        )? as u64)
    }

    /// Tapes by most recent capture: the table, and in the daemon the readings it has
    /// not written yet.
    pub(super) fn tapes(&self, limit: usize) -> Result<Vec<TapeRow>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT mac, qr_code, captured_at, decoded_at, rssi, temp, bat FROM tapes ORDER BY captured_at DESC LIMIT ?1",
        )?;
        // Each unwritten reading may stand for a row of the table: read that many more.
        let read = limit
            .saturating_add(self.latest.rows().count())
            .min(i64::MAX as usize);
        let mut by_mac: std::collections::HashMap<Mac, TapeRow> = stmt
            .query_map([read as i64], tape_row)?
            .map(|r| r.map(|r| (r.mac, r)))
            .collect::<Result<_, _>>()?;
        for r in self.latest.rows() {
            if by_mac
                .get(&r.mac)
                .is_none_or(|t| t.captured_at <= r.captured_at)
            {
                by_mac.insert(r.mac, r.clone());
            }
        }
        let mut rows: Vec<TapeRow> = by_mac.into_values().collect();
        rows.sort_by(|a, b| b.captured_at.cmp(&a.captured_at).then(a.mac.cmp(&b.mac)));
        rows.truncate(limit);
        Ok(rows)
    }
}

impl Store {
    /// What is known of each of `macs` (in the same order): one query per table, so a
    /// page that shows a dock full of tapes costs two statements.
    pub(super) fn tapes_known(&self, macs: &[Mac]) -> Result<Vec<TapeKnown>, OutboxError> {
        if macs.is_empty() {
            return Ok(Vec::new());
        }
        let ints: Vec<i64> = macs.iter().map(|m| mac_to_int(*m)).collect();
        let marks = vec!["?"; ints.len()].join(",");
        let mut readings = std::collections::HashMap::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT mac, qr_code, captured_at, decoded_at, rssi, temp, bat FROM tapes WHERE mac IN ({marks})"
        ))?;
        let rows = stmt.query_map(rusqlite::params_from_iter(&ints), tape_row)?;
        for row in rows {
            let row = row?;
            readings.insert(row.mac, row);
        }
        // The daemon's readings not yet written are newer.
        for m in macs {
            if let Some(r) = self.latest.get(m) {
                if readings
                    .get(m)
                    .is_none_or(|t: &TapeRow| t.captured_at <= r.captured_at)
                {
                    readings.insert(*m, r.clone());
                }
            }
        }
        // Newest refusal of each MAC: later rows overwrite earlier ones.
        let mut refused = std::collections::HashMap::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT mac, substr(error, 1, {READ_CHARS}) FROM dead_letters WHERE mac IN ({marks}) ORDER BY id"
        ))?;
        let rows = stmt.query_map(rusqlite::params_from_iter(&ints), |r| {
            Ok((int_to_mac(r.get(0)?), bounded(&r.get::<_, String>(1)?)))
        })?;
        for row in rows {
            let (mac, error) = row?;
            refused.insert(mac, error);
        }
        Ok(macs
            .iter()
            .map(|m| TapeKnown {
                reading: readings.remove(m),
                refused: refused.remove(m),
            })
            .collect())
    }
}

/// A `tapes` row selected as `mac, qr_code, captured_at, decoded_at, rssi, temp, bat`.
fn tape_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TapeRow> {
    Ok(TapeRow {
        mac: int_to_mac(r.get(0)?),
        qr_code: r.get(1)?,
        captured_at: r.get(2)?,
        decoded_at: r.get(3)?,
        rssi: r.get(4)?,
        temp: r.get(5)?,
        bat: r.get(6)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::tests as fixture;
    use crate::outbox::{Outcome, Reading, StoreOptions};
    use crate::record::Capture;

    fn capture(mac: Mac, ts_ms: EpochMillis) -> Capture {
        fixture::capture(mac, ts_ms, "F70E")
    }

    #[test]
    fn tapes_known_joins_each_macs_reading_and_newest_refusal_in_the_order_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let [known, refused, unheard] = [1, 2, 3].map(|i| Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i]));
        store
            .enqueue(&[
                capture(known, 1_000),
                capture(refused, 1_000),
                capture(refused, 2_000),
            ])
            .unwrap();
        let pending = store.next_batch(10, 100).unwrap();
        let outcomes: Vec<_> = pending
            .into_iter()
            .map(|p| {
                let o = if p.capture.mac == known {
                    Outcome::Delivered(Reading {
                        qr_code: Some("QR1".into()),
                        temp: Some(4.5),
                        bat: Some(80.0),
                    })
                } else {
                    Outcome::DeadLetter("first refusal".into())
                };
                (p, o)
            })
            .collect();
        store.settle(&outcomes, 5_000).unwrap();
        let second = store.next_batch(10, 100).unwrap();
        let refusal = vec![(
            second[0].clone(),
            Outcome::DeadLetter("device not found".into()),
        )];
        store.settle(&refusal, 6_000).unwrap();

        let got = store.tapes_known(&[unheard, refused, known]).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            TapeKnown {
                reading: None,
                refused: None
            }
        );
        assert_eq!(got[1].reading, None);
        assert_eq!(got[1].refused.as_deref(), Some("device not found"));
        let reading = got[2].reading.as_ref().unwrap();
        assert_eq!(
            (reading.qr_code.as_deref(), reading.temp),
            (Some("QR1"), Some(4.5))
        );
        assert_eq!(got[2].refused, None);
        assert!(store.tapes_known(&[]).unwrap().is_empty());
    }
}
