/*!
The tapes heard now: a small bounded memory, fed by the ingest stage, of each tape's
last RSSI and when it was last heard, for the status page an installer opens at the
dock. Bounded by a count (least recently heard forgotten first), so rotating MACs
cannot grow it; what is known of a tape beyond that (QR code, last decoded values,
known or refused) stays in the state database and is joined in by the page.
*/

use std::sync::Mutex;

use hashlink::LruCache;

use crate::record::{EpochMillis, Mac};

/// Tapes remembered at most (a dock hears a few dozen at a time).
pub const CAPACITY: usize = 512;

/// One tape as last heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub mac: Mac,
    pub rssi: Option<i16>,
    /// Wall-clock time it was heard (not the capture time, which a replay sets).
    pub at: EpochMillis,
}

/// The memory; shared (`Arc`) between the ingest stage and the HTTP server. The lock is
/// held for one map operation, never across an await.
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
        if let Ok(mut t) = self.tapes.lock() {
            t.insert(mac, Seen { mac, rssi, at });
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u8) -> Mac {
        Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
    }

    #[test]
    fn the_most_recently_heard_come_first_with_their_last_rssi() {
        let h = HeardNow::new(8);
        h.heard(mac(1), Some(-70), 1_000);
        h.heard(mac(2), Some(-60), 2_000);
        h.heard(mac(1), Some(-50), 3_000);
        let seen = h.since(0, 10);
        assert_eq!(
            seen,
            vec![
                Seen {
                    mac: mac(1),
                    rssi: Some(-50),
                    at: 3_000
                },
                Seen {
                    mac: mac(2),
                    rssi: Some(-60),
                    at: 2_000
                },
            ]
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
}
