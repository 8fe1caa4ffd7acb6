/*!
The tapes heard now: the daemon's one memory of the tapes it hears, fed by the ingest
stage with every advert of a tape and told by the flusher what the service said of each
(decoded it, or refused it as unknown). Bounded by a count (least recently heard
forgotten first), so rotating MACs cannot grow it.

Two readers: the status page (in this process: each tape's last RSSI and when it was
heard), and `device add --nearest` (another process). For the second, the daemon writes
to the state database only what `--nearest` can choose from, the tapes the service
refused as unknown ([`HeardNow::changes`]), inside the transaction that records the
refusal, which is written anyway: a tape the service knows costs no write at all, and
nothing is written on the capture path.

It touches only the outbox's words (`outbox/words.rs`: the tapes heard as the database
keeps them, [`HeardChanges`], and the outcomes it is told), never the store itself.
*/

use std::sync::Mutex;

use hashlink::LruCache;

use crate::outbox::{Outcome, PendingCapture};
use crate::record::{EpochMillis, Mac};
pub use crate::side_tables::HeardChanges;
use crate::side_tables::HeardTape;

/// Tapes remembered at most (a dock hears a few dozen at a time).
pub const CAPACITY: usize = 1024;

/// A tape's best RSSI is kept for this long; a louder advert, or one arriving after
/// this, replaces it. So the best RSSI is that of the last half minute or so.
pub const HEARD_BEST_MS: EpochMillis = 30_000;

/// One tape as last heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub mac: Mac,
    pub rssi: Option<i16>,
    /// Wall-clock time it was heard (not the capture time, which a replay sets).
    pub at: EpochMillis,
    /// Its strongest RSSI in the last [`HEARD_BEST_MS`] or so, and when.
    pub best_rssi: Option<i16>,
    pub best_at: EpochMillis,
    /// `Some(true)`: the service decoded it; `Some(false)`: refused it as not found;
    /// `None`: no answer about it yet (in this run).
    pub known: Option<bool>,
}

impl Seen {
    fn heard(mac: Mac, rssi: Option<i16>, at: EpochMillis) -> Seen {
        Seen {
            mac,
            rssi,
            at,
            best_rssi: rssi,
            best_at: at,
            known: None,
        }
    }

    /// A louder advert, or any after the best one has aged past [`HEARD_BEST_MS`],
    /// becomes the best.
    fn replaces_best(&self, at: EpochMillis, rssi: Option<i16>) -> bool {
        at - self.best_at > HEARD_BEST_MS || self.best_rssi.is_none() || rssi >= self.best_rssi
    }

    fn as_heard_tape(&self) -> HeardTape {
        HeardTape {
            mac: self.mac,
            last_at: self.at,
            best_rssi: self.best_rssi,
            best_at: self.best_at,
            known: self.known,
        }
    }
}

/// The memory; shared (`Arc`) between the ingest stage, the flusher and the HTTP
/// server. The lock is held for one map operation (or one answer's worth), never
/// across an await.
#[derive(Debug)]
pub struct HeardNow {
    tapes: Mutex<LruCache<Mac, Seen>>,
}

impl Default for HeardNow {
    fn default() -> Self {
        HeardNow::new(CAPACITY)
    }
}

impl HeardNow {
    pub fn new(capacity: usize) -> HeardNow {
        HeardNow {
            tapes: Mutex::new(LruCache::new(capacity.max(1))),
        }
    }

    /// A tape was heard at `at`.
    pub fn heard(&self, mac: Mac, rssi: Option<i16>, at: EpochMillis) {
        let Ok(mut t) = self.tapes.lock() else { return };
        match t.get_mut(&mac) {
            Some(s) => {
                if s.replaces_best(at, rssi) {
                    (s.best_rssi, s.best_at) = (rssi, at);
                }
                (s.rssi, s.at) = (rssi, at);
            }
            None => {
                t.insert(mac, Seen::heard(mac, rssi, at));
            }
        }
    }

    /// The tapes heard since `since`, most recently heard first, at most `limit`.
    pub fn since(&self, since: EpochMillis, limit: usize) -> Vec<Seen> {
        let Ok(t) = self.tapes.lock() else {
            return Vec::new();
        };
        // The cache iterates least recently used first.
        t.iter()
            .rev()
            .map(|(_, s)| *s)
            .filter(|s| s.at >= since)
            .take(limit)
            .collect()
    }

    /// What recording `settled` changes in the database's tapes heard: a tape refused
    /// as unknown gets its row (as heard now); a tape it holds as unknown that the
    /// service decoded is known again. Nothing for the rest. Read only: [`HeardNow::
    /// answered`] applies the answers once they are recorded.
    pub fn changes(&self, settled: &[(PendingCapture, Outcome)]) -> HeardChanges {
        let mut changes = HeardChanges::default();
        let Ok(t) = self.tapes.lock() else {
            return changes;
        };
        for (row, outcome) in settled {
            let mac = row.capture.mac;
            let seen = t.peek(&mac);
            match outcome {
                Outcome::DeadLetter(error) if refused_as_unknown(error) => {
                    let mut tape = match seen {
                        Some(s) => s.as_heard_tape(),
                        // Forgotten since (or heard before this run): as captured.
                        None => {
                            Seen::heard(mac, row.capture.rssi, row.capture.ts_ms).as_heard_tape()
                        }
                    };
                    tape.known = Some(false);
                    changes.unknown.retain(|t| t.mac != mac);
                    changes.unknown.push(tape);
                }
                Outcome::Delivered(_) if seen.is_some_and(|s| s.known == Some(false)) => {
                    changes.known.push(mac);
                }
                _ => {}
            }
        }
        changes
    }

    /// The answers of `settled` are recorded: each tape's `known` follows them.
    pub fn answered(&self, settled: &[(PendingCapture, Outcome)]) {
        let Ok(mut t) = self.tapes.lock() else { return };
        for (row, outcome) in settled {
            let known = match outcome {
                Outcome::Delivered(_) => true,
                Outcome::DeadLetter(error) if refused_as_unknown(error) => false,
                Outcome::DeadLetter(_) => continue,
            };
            if let Some(s) = t.peek_mut(&row.capture.mac) {
                s.known = Some(known);
            }
        }
    }
}

/// Whether a refused capture's error says the service does not know the tape. Bulk
/// decode items carry only a text (spec 4.4, no code), so the text is all there is:
/// "device not found or not associated with the customer" (the 404 of 4.3).
pub fn refused_as_unknown(error: &str) -> bool {
    error.to_ascii_lowercase().contains("not found")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::Reading;
    use crate::record::Capture;

    fn mac(i: u8) -> Mac {
        Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
    }

    fn row(i: u8, rssi: i16) -> PendingCapture {
        PendingCapture {
            id: i64::from(i),
            capture: Capture {
                mac: mac(i),
                ts_ms: 5_000,
                product_id: "tape".into(),
                packet: "00".into(),
                rssi: Some(rssi),
                boot_ms: None,
            },
        }
    }

    fn delivered() -> Outcome {
        Outcome::Delivered(Reading {
            qr_code: None,
            temp: None,
            bat: None,
        })
    }

    #[test]
    fn the_most_recently_heard_come_first_with_their_last_rssi() {
        let h = HeardNow::new(8);
        h.heard(mac(1), Some(-70), 1_000);
        h.heard(mac(2), Some(-60), 2_000);
        h.heard(mac(1), Some(-50), 3_000);
        let seen: Vec<(Mac, Option<i16>, EpochMillis)> = h
            .since(0, 10)
            .iter()
            .map(|s| (s.mac, s.rssi, s.at))
            .collect();
        assert_eq!(
            seen,
            vec![(mac(1), Some(-50), 3_000), (mac(2), Some(-60), 2_000)]
        );
        assert_eq!(h.since(2_500, 10).len(), 1, "only those heard since");
        assert_eq!(h.since(0, 1).len(), 1, "at most the limit");
    }

    #[test]
    fn memory_is_bounded_forgetting_the_least_recently_heard() {
        let h = HeardNow::new(4);
        for i in 0..10 {
            h.heard(mac(i), None, i64::from(i));
        }
        let macs: Vec<Mac> = h.since(0, 100).iter().map(|s| s.mac).collect();
        assert_eq!(macs, vec![mac(9), mac(8), mac(7), mac(6)]);
    }

    #[test]
    fn the_best_rssi_is_the_loudest_of_the_last_half_minute() {
        let h = HeardNow::new(8);
        let t0 = 1_000_000;
        h.heard(mac(1), Some(-50), t0);
        h.heard(mac(1), Some(-70), t0 + 5_000);
        let s = h.since(0, 1)[0];
        assert_eq!((s.best_rssi, s.best_at, s.rssi), (Some(-50), t0, Some(-70)));
        // Past HEARD_BEST_MS the old loud reading no longer stands.
        h.heard(mac(1), Some(-80), t0 + 40_000);
        let s = h.since(0, 1)[0];
        assert_eq!((s.best_rssi, s.best_at), (Some(-80), t0 + 40_000));
        // A louder one replaces it at once.
        h.heard(mac(1), Some(-60), t0 + 41_000);
        assert_eq!(h.since(0, 1)[0].best_rssi, Some(-60));
    }

    #[test]
    fn only_a_refusal_as_unknown_and_the_end_of_one_are_written() {
        let h = HeardNow::new(8);
        h.heard(mac(1), Some(-50), 1_000);
        h.heard(mac(1), Some(-40), 2_000);
        h.heard(mac(2), Some(-60), 1_000);
        h.heard(mac(3), Some(-60), 1_000);
        let settled = vec![
            (row(1, -45), Outcome::DeadLetter("Device not found".into())),
            (row(2, -60), delivered()),
            (row(3, -60), Outcome::DeadLetter("invalid packet".into())),
            // Heard before this run (forgotten): written as captured.
            (row(4, -70), Outcome::DeadLetter("device not found".into())),
        ];
        let c = h.changes(&settled);
        assert_eq!(
            c.unknown
                .iter()
                .map(|t| (t.mac, t.best_rssi, t.last_at, t.known))
                .collect::<Vec<_>>(),
            [
                (mac(1), Some(-40), 2_000, Some(false)),
                (mac(4), Some(-70), 5_000, Some(false))
            ]
        );
        assert!(c.known.is_empty(), "a tape known all along costs no write");
        h.answered(&settled);
        // Activated since: decoded now, so the database's unknown row must go.
        let c = h.changes(&[(row(1, -45), delivered())]);
        assert_eq!((c.unknown.len(), c.known.clone()), (0, vec![mac(1)]));
        h.answered(&[(row(1, -45), delivered())]);
        assert!(h.changes(&[(row(1, -45), delivered())]).is_empty());
    }
}
