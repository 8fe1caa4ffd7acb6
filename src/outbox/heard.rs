//! The tapes heard lately that the service refused as unknown, kept in the state
//! database for `device add --nearest` to choose from. The daemon keeps the tapes it
//! hears in memory ([`crate::heard_now`]) and writes here only those refusals (and their
//! end), inside the transaction that records them.
//!
//! It touches `db`, the outbox's words and the [`Store`] it reads and writes;
//! `settle.rs` calls [`record_heard`].

use rusqlite::{params, Transaction};

use super::db::{int_to_mac, mac_to_int, OutboxError};
use super::store::Store;
use super::words::{HeardChanges, HeardTape};
use crate::record::EpochMillis;

/// Tapes not heard for this long are forgotten.
pub(crate) const HEARD_KEEP_MS: EpochMillis = 10 * 60_000;

impl Store {
    /// Tapes heard at or after `since` (capture time), loudest first.
    pub(super) fn heard_since(&self, since: EpochMillis) -> Result<Vec<HeardTape>, OutboxError> {
        let mut stmt = self.conn.prepare(
            "SELECT mac, last_at, best_rssi, best_at, known FROM heard WHERE last_at >= ?1
             ORDER BY best_rssi IS NULL, best_rssi DESC, mac",
        )?;
        let rows = stmt
            .query_map([since], |r| {
                Ok(HeardTape {
                    mac: int_to_mac(r.get(0)?),
                    last_at: r.get(1)?,
                    best_rssi: r.get(2)?,
                    best_at: r.get(3)?,
                    known: r.get::<_, Option<i64>>(4)?.map(|k| k != 0),
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

/// Records, inside the transaction that records the answers, the tapes heard that the
/// service refused as unknown (their rows) and those it now knows again; forgets rows
/// not heard for [`HEARD_KEEP_MS`]. Nothing to record: nothing written.
pub(super) fn record_heard(
    tx: &Transaction<'_>,
    changes: &HeardChanges,
    now: EpochMillis,
) -> rusqlite::Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO heard(mac, last_at, best_rssi, best_at, known) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(mac) DO UPDATE SET last_at = excluded.last_at, best_rssi = excluded.best_rssi,
           best_at = excluded.best_at, known = excluded.known",
    )?;
    for t in &changes.unknown {
        upsert.execute(params![
            mac_to_int(t.mac),
            t.last_at,
            t.best_rssi,
            t.best_at,
            t.known
        ])?;
    }
    let mut known = tx.prepare_cached("UPDATE heard SET known = 1 WHERE mac = ?1")?;
    for mac in &changes.known {
        known.execute([mac_to_int(*mac)])?;
    }
    tx.prepare_cached("DELETE FROM heard WHERE last_at < ?1")?
        .execute([now.saturating_sub(HEARD_KEEP_MS)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heard_now::HeardNow;
    use crate::outbox::tests as fixture;
    use crate::outbox::{AnswerNotes, Outcome, Reading, StoreOptions};
    use crate::record::Capture;

    fn capture(mac: &str, ts_ms: EpochMillis, rssi: i16) -> Capture {
        Capture {
            rssi: Some(rssi),
            ..fixture::capture(mac.parse().unwrap(), ts_ms, "00")
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        (dir, store)
    }

    fn known(store: &Store) -> Vec<(String, Option<bool>)> {
        store
            .heard_since(0)
            .unwrap()
            .iter()
            .map(|h| (h.mac.to_string(), h.known))
            .collect()
    }

    /// Settles the next batch with `outcome` per MAC, telling `heard` as the flusher does.
    fn settle(store: &mut Store, heard: &HeardNow, outcome: impl Fn(&str) -> Outcome) {
        let batch = store.next_batch(10, 100).unwrap();
        let settled: Vec<_> = batch
            .into_iter()
            .map(|p| {
                let o = outcome(&p.capture.mac.to_string());
                (p, o)
            })
            .collect();
        let notes = AnswerNotes {
            flusher: None,
            heard: heard.changes(&settled),
        };
        store.settle_noting(&settled, 2_000, &notes).unwrap();
        heard.answered(&settled);
    }

    fn decoded() -> Outcome {
        Outcome::Delivered(Reading {
            qr_code: None,
            temp: None,
            bat: None,
        })
    }

    #[test]
    fn only_tapes_refused_as_unknown_are_written_and_known_once_decoded() {
        let (_dir, mut store) = store();
        let heard = HeardNow::default();
        for (mac, rssi) in [
            ("C0:00:00:00:00:01", -50),
            ("C0:DE:AD:00:00:01", -40),
            ("C0:00:00:00:00:02", -50),
        ] {
            heard.heard(mac.parse().unwrap(), Some(rssi), 1_500);
            store.enqueue(&[capture(mac, 1_000, rssi)]).unwrap();
        }
        let enqueued = store.heard_since(0).unwrap();
        assert!(
            enqueued.is_empty(),
            "nothing on the capture path: {enqueued:?}"
        );
        settle(&mut store, &heard, |mac| match mac {
            "C0:00:00:00:00:01" => decoded(),
            "C0:DE:AD:00:00:01" => {
                Outcome::DeadLetter("device not found or not associated with the customer".into())
            }
            _ => Outcome::DeadLetter("invalid packet".into()),
        });
        assert_eq!(
            known(&store),
            [("C0:DE:AD:00:00:01".to_string(), Some(false))]
        );
        let h = &store.heard_since(0).unwrap()[0];
        assert_eq!((h.best_rssi, h.last_at), (Some(-40), 1_500), "as heard");

        // Activated and re-queued: decoded now, so no longer a candidate.
        store
            .enqueue(&[capture("C0:DE:AD:00:00:01", 3_000, -40)])
            .unwrap();
        settle(&mut store, &heard, |_| decoded());
        assert_eq!(
            known(&store),
            [("C0:DE:AD:00:00:01".to_string(), Some(true))]
        );
    }

    #[test]
    fn heard_forgets_tapes_not_heard_for_ten_minutes() {
        let (_dir, mut store) = store();
        let t0 = 1_000_000_000;
        let tape = |mac: &str, at: EpochMillis| HeardTape {
            mac: mac.parse().unwrap(),
            last_at: at,
            best_rssi: Some(-50),
            best_at: at,
            known: Some(false),
        };
        let write = |store: &mut Store, t: HeardTape| {
            let notes = AnswerNotes {
                flusher: None,
                heard: HeardChanges {
                    unknown: vec![t.clone()],
                    known: vec![],
                },
            };
            store.settle_noting(&[], t.last_at, &notes).unwrap();
        };
        write(&mut store, tape("C0:00:00:00:00:01", t0));
        write(
            &mut store,
            tape("C0:00:00:00:00:02", t0 + HEARD_KEEP_MS + 1),
        );
        let macs: Vec<String> = store
            .heard_since(0)
            .unwrap()
            .iter()
            .map(|h| h.mac.to_string())
            .collect();
        assert_eq!(macs, ["C0:00:00:00:00:02"]);
    }
}
