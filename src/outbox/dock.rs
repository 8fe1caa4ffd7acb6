//! What the operator commands keep in the state database besides the outbox: the times
//! of the last requests in the service's shared rate window (spec 8), so that separate
//! CLI runs share it, and the
//! tapes heard lately, which the daemon writes inside the commit groups it already makes
//! and `device add --nearest` reads.

use std::collections::HashMap;

use rusqlite::{params, Transaction};

use super::store::{int_to_mac, mac_to_int, write_tx};
use super::{OutboxError, Store};
use crate::record::{Capture, EpochMillis, Mac};

/// A tape's best RSSI is kept for this long; a louder capture, or one arriving after
/// this, replaces it. So the best RSSI read is that of the last half minute or so,
/// without a row per capture.
pub const HEARD_BEST_MS: EpochMillis = 30_000;
/// Tapes not heard for this long are forgotten.
pub const HEARD_KEEP_MS: EpochMillis = 10 * 60_000;

/// A tape heard lately, as the daemon recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeardTape {
    pub mac: Mac,
    /// Capture time of its latest admitted capture.
    pub last_at: EpochMillis,
    /// Its strongest RSSI in the last [`HEARD_BEST_MS`] or so of captures.
    pub best_rssi: Option<i16>,
    pub best_at: EpochMillis,
    /// `Some(true)`: the service decoded it; `Some(false)`: refused as not found;
    /// `None`: no answer about it yet.
    pub known: Option<bool>,
}

impl Store {
    /// Reads and replaces the times of an identity's last rate-limited requests in one
    /// write transaction, so two CLI runs cannot both take the last slot. `decide` gets
    /// the stored times and returns the times to store (or `None` to leave them) and its
    /// answer.
    pub fn rate_sends<R>(
        &mut self,
        identity: &str,
        decide: impl FnOnce(Vec<EpochMillis>) -> (Option<Vec<EpochMillis>>, R),
    ) -> Result<R, OutboxError> {
        let tx = write_tx(&mut self.conn)?;
        let stored: Vec<EpochMillis> = tx
            .prepare_cached("SELECT sent_at FROM rate_sends WHERE identity = ?1 ORDER BY sent_at")?
            .query_map([identity], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let (next, answer) = decide(stored.clone());
        if let Some(next) = next.filter(|n| *n != stored) {
            tx.execute("DELETE FROM rate_sends WHERE identity = ?1", [identity])?;
            let mut insert =
                tx.prepare_cached("INSERT INTO rate_sends(identity, sent_at) VALUES (?1, ?2)")?;
            for at in next {
                insert.execute(params![identity, at])?;
            }
        }
        tx.commit()?;
        Ok(answer)
    }

    /// Tapes heard at or after `since` (capture time), loudest first.
    pub fn heard_since(&self, since: EpochMillis) -> Result<Vec<HeardTape>, OutboxError> {
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

/// A tape's entry in `heard` as one group of captures leaves it.
#[derive(Clone, Copy)]
struct Heard {
    last_at: EpochMillis,
    best_rssi: Option<i16>,
    best_at: EpochMillis,
}

impl Heard {
    /// The rule of the table: a louder capture, or any after the best one has aged
    /// past [`HEARD_BEST_MS`], becomes the best.
    fn replaces_best(&self, ts_ms: EpochMillis, rssi: Option<i16>) -> bool {
        ts_ms - self.best_at > HEARD_BEST_MS || self.best_rssi.is_none() || rssi >= self.best_rssi
    }
}

/// Records the captures of a commit group in `heard`, inside the group's transaction
/// (no transaction of its own): the group is folded per tape first, so a tape heard
/// often costs one upsert a group. Forgets tapes not heard for [`HEARD_KEEP_MS`].
pub(super) fn note_heard(tx: &Transaction<'_>, group: &[Capture]) -> rusqlite::Result<()> {
    let mut folded: HashMap<Mac, Heard> = HashMap::new();
    for c in group {
        let h = folded.entry(c.mac).or_insert(Heard {
            last_at: c.ts_ms,
            best_rssi: c.rssi,
            best_at: c.ts_ms,
        });
        h.last_at = h.last_at.max(c.ts_ms);
        if h.replaces_best(c.ts_ms, c.rssi) {
            (h.best_rssi, h.best_at) = (c.rssi, c.ts_ms);
        }
    }
    // The same rule in SQL, against what earlier groups left.
    let mut upsert = tx.prepare_cached(
        "INSERT INTO heard(mac, last_at, best_rssi, best_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(mac) DO UPDATE SET
           last_at = max(heard.last_at, excluded.last_at),
           best_rssi = CASE WHEN excluded.best_at - heard.best_at > ?5
                              OR heard.best_rssi IS NULL OR excluded.best_rssi >= heard.best_rssi
                            THEN excluded.best_rssi ELSE heard.best_rssi END,
           best_at = CASE WHEN excluded.best_at - heard.best_at > ?5
                            OR heard.best_rssi IS NULL OR excluded.best_rssi >= heard.best_rssi
                          THEN excluded.best_at ELSE heard.best_at END",
    )?;
    let mut newest = EpochMillis::MIN;
    for (mac, h) in &folded {
        upsert.execute(params![
            mac_to_int(*mac),
            h.last_at,
            h.best_rssi,
            h.best_at,
            HEARD_BEST_MS
        ])?;
        newest = newest.max(h.last_at);
    }
    tx.prepare_cached("DELETE FROM heard WHERE last_at < ?1")?
        .execute([newest.saturating_sub(HEARD_KEEP_MS)])?;
    Ok(())
}

/// Records, inside the settling transaction, whether the service knows a tape heard.
pub(super) fn note_known(tx: &Transaction<'_>, mac: Mac, known: bool) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE heard SET known = ?2 WHERE mac = ?1")?
        .execute(params![mac_to_int(mac), known])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::StoreOptions;

    fn capture(mac: &str, ts_ms: EpochMillis, rssi: i16) -> Capture {
        Capture {
            mac: mac.parse().unwrap(),
            ts_ms,
            product_id: "tape".into(),
            packet: "00".into(),
            rssi: Some(rssi),
            boot_ms: None,
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
        (dir, store)
    }

    /// Commits one group of one capture.
    fn hear(store: &mut Store, mac: &str, ts_ms: EpochMillis, rssi: i16) {
        store.enqueue(&[capture(mac, ts_ms, rssi)]).unwrap();
    }

    #[test]
    fn heard_keeps_the_loudest_recent_rssi_and_forgets_an_old_one() {
        let (_dir, mut store) = store();
        let t0 = 1_000_000_000;
        hear(&mut store, "C0:00:00:00:00:01", t0, -50);
        hear(&mut store, "C0:00:00:00:00:01", t0 + 5_000, -70);
        let h = store.heard_since(t0).unwrap();
        assert_eq!((h[0].best_rssi, h[0].last_at), (Some(-50), t0 + 5_000));
        // Past HEARD_BEST_MS the old loud reading no longer stands.
        hear(&mut store, "C0:00:00:00:00:01", t0 + 40_000, -80);
        let h = store.heard_since(t0).unwrap();
        assert_eq!((h[0].best_rssi, h[0].best_at), (Some(-80), t0 + 40_000));
        // Within one group the same rule holds: the loud one, then a quiet one 5 s on.
        store
            .enqueue(&[
                capture("C0:00:00:00:00:02", t0, -40),
                capture("C0:00:00:00:00:02", t0 + 5_000, -75),
            ])
            .unwrap();
        let h = store.heard_since(t0).unwrap();
        assert_eq!(
            (h[0].mac.to_string(), h[0].best_rssi, h[0].last_at),
            ("C0:00:00:00:00:02".to_string(), Some(-40), t0 + 5_000)
        );
        let h: Vec<_> = h
            .into_iter()
            .filter(|h| h.mac.to_string().ends_with("01"))
            .collect();
        assert_eq!((h[0].best_rssi, h[0].best_at), (Some(-80), t0 + 40_000));
        assert_eq!(h[0].known, None);
    }

    #[test]
    fn a_tape_is_known_once_decoded_and_unknown_once_refused_as_not_found() {
        use crate::outbox::{Outcome, Reading};
        let (_dir, mut store) = store();
        hear(&mut store, "C0:00:00:00:00:01", 1_000, -50);
        hear(&mut store, "C0:DE:AD:00:00:01", 1_000, -50);
        hear(&mut store, "C0:00:00:00:00:02", 1_000, -50);
        let batch = store.next_batch(10, 100).unwrap();
        let outcome = |mac: &str| match mac {
            "C0:00:00:00:00:01" => Outcome::Delivered(Reading {
                qr_code: None,
                temp: None,
                bat: None,
                raw: "{}".into(),
            }),
            "C0:DE:AD:00:00:01" => {
                Outcome::DeadLetter("device not found or not associated with the customer".into())
            }
            _ => Outcome::DeadLetter("invalid packet".into()),
        };
        let settled: Vec<_> = batch
            .into_iter()
            .map(|p| {
                let o = outcome(&p.capture.mac.to_string());
                (p, o)
            })
            .collect();
        store.settle(&settled, 2_000).unwrap();
        let known: Vec<(String, Option<bool>)> = store
            .heard_since(0)
            .unwrap()
            .iter()
            .map(|h| (h.mac.to_string(), h.known))
            .collect();
        assert_eq!(
            known,
            [
                ("C0:00:00:00:00:01".to_string(), Some(true)),
                ("C0:00:00:00:00:02".to_string(), None),
                ("C0:DE:AD:00:00:01".to_string(), Some(false)),
            ]
        );
    }

    #[test]
    fn heard_forgets_tapes_not_heard_for_ten_minutes() {
        let (_dir, mut store) = store();
        let t0 = 1_000_000_000;
        hear(&mut store, "C0:00:00:00:00:01", t0, -50);
        hear(&mut store, "C0:00:00:00:00:02", t0 + HEARD_KEEP_MS + 1, -60);
        let macs: Vec<String> = store
            .heard_since(0)
            .unwrap()
            .iter()
            .map(|h| h.mac.to_string())
            .collect();
        assert_eq!(macs, ["C0:00:00:00:00:02"]);
    }

    #[test]
    fn the_rate_sends_are_read_and_written_in_one_transaction() {
        let (_dir, mut store) = store();
        let seen = store.rate_sends("id", |s| (Some(vec![7, 5]), s)).unwrap();
        assert!(seen.is_empty());
        let seen = store.rate_sends("id", |s| (None, s)).unwrap();
        assert_eq!(seen, [5, 7]);
        assert!(store.rate_sends("other", |s| (None, s)).unwrap().is_empty());
        store.rate_sends("id", |_| (Some(vec![9]), ())).unwrap();
        assert_eq!(store.rate_sends("id", |s| (None, s)).unwrap(), [9]);
    }
}
