//! What the harness knows was committed: the witness's last snapshot before a cut
//! (`tests/vm/guest/witness.sh`, a reader of the outbox writing each committed state it
//! sees into the share), and the same read of the database after the next boot, before
//! the daemon starts again; the comparison of the two.

use std::collections::{BTreeMap, BTreeSet};

/// A capture as the outbox and the service both name it: MAC (12 hex digits), capture
/// time in whole seconds, packet (upper-case hex).
pub type Key = (String, i64, String);

/// One committed state of the outbox.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub counters: BTreeMap<String, i64>,
    pub pending: BTreeSet<Key>,
}

impl Snapshot {
    /// Parses the witness's format (`C name value`, `P MAC SECONDS PACKET`).
    pub fn parse(text: &str) -> Snapshot {
        let mut s = Snapshot::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["C", name, value] => {
                    s.counters
                        .insert(name.to_string(), value.parse().unwrap_or(-1));
                }
                ["P", mac, secs, packet] => {
                    s.pending.insert((
                        mac.to_string(),
                        secs.parse().unwrap_or(0),
                        packet.to_string(),
                    ));
                }
                _ => {}
            }
        }
        s
    }

    pub fn get(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Captures that have left the outbox with a fate: delivered, dead letter, evicted.
    pub fn settled(&self) -> i64 {
        self.get("delivered") + self.get("dead_lettered") + self.get("evicted")
    }

    /// `admitted = delivered + dead letters + evicted + pending`, as `status` says it.
    pub fn adds_up(&self) -> bool {
        self.get("admitted") == self.settled() + self.pending.len() as i64
    }

    pub fn summary(&self) -> String {
        format!(
            "admitted {} delivered {} dead {} evicted {} pending {}",
            self.get("admitted"),
            self.get("delivered"),
            self.get("dead_lettered"),
            self.get("evicted"),
            self.pending.len()
        )
    }
}

/// What a boot found of what the witness saw committed before the cut.
#[derive(Debug, Clone)]
pub struct Found {
    /// Admitted captures the witness saw that the database no longer counts.
    pub lost_admitted: i64,
    /// Pending captures the witness saw that are neither pending now nor accounted
    /// for by a fate counted since.
    pub lost_pending: usize,
    /// Counters that went backwards (name, before, after).
    pub went_back: Vec<(String, i64, i64)>,
}

impl Found {
    pub fn nothing_lost(&self) -> bool {
        self.lost_admitted == 0 && self.lost_pending == 0 && self.went_back.is_empty()
    }
}

/// Compares the witness's last snapshot before a cut with the database after it.
pub fn compare(before: &Snapshot, after: &Snapshot) -> Found {
    let went_back = ["admitted", "delivered", "dead_lettered", "evicted"]
        .iter()
        .filter(|n| after.get(n) < before.get(n))
        .map(|n| (n.to_string(), before.get(n), after.get(n)))
        .collect();
    let gone = before.pending.difference(&after.pending).count() as i64;
    let fates_since = (after.settled() - before.settled()).max(0);
    Found {
        lost_admitted: (before.get("admitted") - after.get("admitted")).max(0),
        lost_pending: (gone - fates_since).max(0) as usize,
        went_back,
    }
}
