//! The outbox held against a simple in-memory model: random sequences of enqueue,
//! batch selection, settle, eviction, dead-letter retry/purge and restart must leave
//! the real SQLite store and the model agreeing on every row and counter.

use proptest::prelude::*;
use tapegate::outbox::Durability;
use tapegate::outbox::{Outcome, PendingCapture, Reading, Store, StoreOptions};

use tapegate::record::{Capture, Mac};

#[derive(Debug, Clone)]
enum Op {
    Enqueue(Vec<u8>),
    /// Take a batch of at most n and settle it: per item 0 = delivered, 1 = dead, 2 = retry.
    Flush(usize, Vec<u8>),
    Restart,
    RetryDead,
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0u8..6, 1..12).prop_map(Op::Enqueue),
        4 => (1usize..6, prop::collection::vec(0u8..3, 6)).prop_map(|(n, o)| Op::Flush(n, o)),
        1 => Just(Op::Restart),
        1 => Just(Op::RetryDead),
        1 => Just(Op::Purge),
    ]
}

#[derive(Default)]
struct Model {
    /// (mac index, sequence number) in admission order.
    pending: Vec<(u8, u64)>,
    dead: Vec<(u8, u64)>,
    admitted: u64,
    delivered: u64,
    dead_lettered: u64,
    evicted: u64,
    seq: u64,
}

fn mac(i: u8) -> Mac {
    Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
}

fn capture(i: u8, seq: u64) -> Capture {
    Capture {
        mac: mac(i),
        ts_ms: 1_000 + seq as i64,
        product_id: "tape".into(),
        packet: format!("{seq:08X}"),
        rssi: Some(-60),
        boot_ms: None,
    }
}

fn seq_of(p: &PendingCapture) -> u64 {
    u64::from_str_radix(&p.capture.packet, 16).unwrap()
}

const MAX_PENDING: u64 = 20;

fn open(dir: &std::path::Path) -> Store {
    let options = StoreOptions {
        durability: Durability::Normal,
        max_pending: MAX_PENDING,
        max_page_count: None,
    };
    Store::open(dir, options).unwrap().0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn outbox_agrees_with_a_simple_model(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Enqueue(macs) => {
                    let group: Vec<Capture> = macs.iter().map(|&i| { m.seq += 1; capture(i, m.seq) }).collect();
                    let evicted = store.enqueue(&group).unwrap();
                    for c in &group {
                        m.pending.push((c.mac.octets()[5], u64::from_str_radix(&c.packet, 16).unwrap()));
                    }
                    m.admitted += group.len() as u64;
                    let excess = (m.pending.len() as u64).saturating_sub(MAX_PENDING);
                    m.pending.drain(..excess as usize);
                    m.evicted += excess;
                    prop_assert_eq!(evicted, excess);
                }
                Op::Flush(n, outcomes) => {
                    let batch = store.next_batch(n, 10_000).unwrap();
                    // Model: the oldest pending capture of each MAC, oldest first, at most n.
                    let mut want = Vec::new();
                    let mut seen = std::collections::HashSet::new();
                    for &(i, s) in &m.pending {
                        if seen.insert(i) && want.len() < n { want.push((i, s)); }
                    }
                    let got: Vec<(u8, u64)> = batch.iter().map(|p| (p.capture.mac.octets()[5], seq_of(p))).collect();
                    prop_assert_eq!(&got, &want);
                    let mut settle = Vec::new();
                    for (p, o) in batch.into_iter().zip(outcomes) {
                        let key = (p.capture.mac.octets()[5], seq_of(&p));
                        match o {
                            0 => {
                                settle.push((p, Outcome::Delivered(Reading { qr_code: Some("QR".into()), temp: Some(4.5), bat: Some(90.0), raw: "{}".into() })));
                                m.pending.retain(|k| *k != key);
                                m.delivered += 1;
                            }
                            1 => {
                                settle.push((p, Outcome::DeadLetter("device not found".into())));
                                m.pending.retain(|k| *k != key);
                                m.dead.push(key);
                                m.dead_lettered += 1;
                            }
                            _ => {}
                        }
                    }
                    store.settle(&settle, 5_000).unwrap();
                }
                Op::Restart => {
                    drop(store);
                    store = open(dir.path());
                }
                Op::RetryDead => {
                    let moved = store.retry_dead_letters(None).unwrap();
                    prop_assert_eq!(moved, m.dead.len() as u64);
                    m.dead_lettered -= moved;
                    m.pending.append(&mut m.dead);
                    // Re-queued rows may push past the bound at the next enqueue only.
                }
                Op::Purge => {
                    let purged = store.purge_dead_letters(None).unwrap();
                    prop_assert_eq!(purged, m.dead.len() as u64);
                    m.dead.clear();
                }
            }
            let stats = store.stats().unwrap();
            let rows: Vec<(u8, u64)> = store.pending_captures().unwrap().iter().map(|p| (p.capture.mac.octets()[5], seq_of(p))).collect();
            prop_assert_eq!(&rows, &m.pending);
            prop_assert_eq!(store.count_pending_rows().unwrap(), m.pending.len() as u64);
            prop_assert_eq!(stats.pending, m.pending.len() as u64);
            prop_assert_eq!(stats.admitted, m.admitted);
            prop_assert_eq!(stats.delivered, m.delivered);
            prop_assert_eq!(stats.dead_letters, m.dead_lettered);
            prop_assert_eq!(stats.evicted, m.evicted);
            prop_assert_eq!(stats.dead_letters_stored, m.dead.len() as u64);
            prop_assert_eq!(stats.admitted, stats.delivered + stats.dead_letters + stats.evicted + stats.pending);
        }
    }
}
