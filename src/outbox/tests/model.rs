//! The outbox held against a simple in-memory model: random sequences of enqueue,
//! batch selection, settle, eviction, dead-letter retry/purge and restart must leave
//! the real SQLite store and the model agreeing on every row and counter.
//!
//! And delivery as a whole (`planner_and_outbox_keep_every_delivery_promise`): the real
//! planner driving the real SQLite outbox the way the flusher does, against a service
//! that answers any batch in flight in any order (decoded, refused, 503, 429 with
//! `Retry-After`, a lost answer, 413) or is down for a while (connection refused, 503,
//! 429 with `Retry-After` to every request: an outage, with its backoff and pauses),
//! with several batches in flight, each going on the wire only when the client lets it
//! (no `Retry-After` holds; a request may wait there, or for its token, for any number
//! of steps), 429s answered while a fetch is under way, an outbox bound that evicts
//! during an outage, a full disk, kill and restart, and the operator's dead-letter retry
//! and purge. The invariants it checks, at every step:
//! - **One fate per capture.** Every admitted capture is pending, delivered, a dead
//!   letter or evicted, and only pending → delivered | dead letter | evicted (and dead
//!   letter → pending by `retry`) ever happens; `status`'s counters equal the model's.
//!   A capture on the wire (or answered and not yet recorded) is never evicted, and an
//!   evicted capture is never sent (nor settled) afterwards.
//! - **The oldest are evicted.** Every capture an eviction takes is older than every
//!   capture it keeps that is not on the wire or being recorded: whatever the flusher
//!   holds back (a batch waiting to fill, parked out a backoff, split, launched and
//!   waiting out a `Retry-After` or for its token) is evicted in age order.
//! - **Retry-After.** Once a 429's answer with `Retry-After` has been read (handed to
//!   the planner), nothing is launched before the time it names, and nothing goes on the
//!   wire before it from the moment the answer is read (within one process: a restart
//!   forgets it).
//! - **No MAC in two batches in flight.**
//! - **Order per MAC.** A capture sent is its MAC's oldest pending capture.
//! - **Claims.** The outbox's claims are exactly the rows on the wire and those
//!   answered and not yet recorded: a batch that waits holds none.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use crate::config::FlushSettings;
use crate::flush::{Action, Batch, Planner, Resolution, Step};
use crate::outbox::Durability;
use crate::outbox::{Outcome, PendingCapture, Reading, RowKey, Store, StoreOptions};

use super::mac;
use crate::record::Capture;

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

fn capture(i: u8, seq: u64) -> Capture {
    super::capture(mac(i), 1_000 + seq as i64, format!("{seq:08X}"))
}

fn seq_of(p: &PendingCapture) -> u64 {
    u64::from_str_radix(&p.capture.packet, 16).unwrap()
}

const MAX_PENDING: u64 = 20;

fn open(dir: &std::path::Path) -> Store {
    let options = StoreOptions {
        latest_every: crate::outbox::LATEST_EVERY,
        durability: Durability::Normal,
        max_pending: MAX_PENDING,
        max_page_count: None,
        clock: crate::clock::system(),
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
                                settle.push((p, Outcome::Delivered(Reading { qr_code: Some("QR".into()), temp: Some(4.5), bat: Some(90.0) })));
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

// ---------------------------------------------------------------------------------------
// The planner and the outbox together, against a reference model.

/// How the service answers a batch in flight.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Every capture decoded.
    Ok,
    /// Decoded, but the first capture left out of the answer.
    LeaveOutFirst,
    /// Every capture refused as an item (dead letters).
    Dead,
    /// 400 for the whole batch.
    Refused,
    /// 503, no `Retry-After`.
    Fail,
    /// 429 with `Retry-After` of this many seconds.
    RateLimited(u8),
    /// The service decoded the batch, and the answer was lost (a timeout).
    Lost,
    /// 413.
    TooLarge,
    /// The connection was refused (nothing reached the service).
    Refused2Connect,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        4 => Just(Answer::Ok),
        1 => Just(Answer::LeaveOutFirst),
        1 => Just(Answer::Dead),
        2 => Just(Answer::Refused),
        3 => Just(Answer::Fail),
        2 => (1u8..4).prop_map(Answer::RateLimited),
        1 => Just(Answer::Lost),
        1 => Just(Answer::TooLarge),
        1 => Just(Answer::Refused2Connect),
    ]
}

/// How the service fails every request while it is down.
fn outage() -> impl Strategy<Value = Answer> {
    prop_oneof![
        Just(Answer::Refused2Connect),
        Just(Answer::Fail),
        (1u8..4).prop_map(Answer::RateLimited),
    ]
}

#[derive(Debug, Clone)]
enum Step2 {
    /// Tapes (by index) heard, one capture each, committed as one group.
    Ingest(Vec<u8>),
    /// The flusher's loop until it waits. With `Some`, a fetch is under way when that
    /// batch on the wire is answered 429 with that many seconds of `Retry-After`, and
    /// what the fetch found is offered after.
    Drive(Option<(prop::sample::Index, u8)>),
    /// A batch launched goes on the wire, if the client lets it (no `Retry-After`
    /// holds): its request claims its rows then.
    Wire(prop::sample::Index),
    /// A batch on the wire is answered (as the outage says, while there is one).
    Answer(prop::sample::Index, Answer),
    /// The service goes down (every answer this failure) or comes back.
    Outage(Option<Answer>),
    /// Time passes (milliseconds).
    Advance(u16),
    /// kill -9 and a new start: what was in flight is lost, the outbox stays.
    Restart,
    /// Every write that removes a pending row fails (a full disk), or works again.
    DiskFull(bool),
    /// `tapegate dead-letters retry`.
    RetryDead,
    /// `tapegate dead-letters purge`.
    Purge,
}

fn step2() -> impl Strategy<Value = Step2> {
    prop_oneof![
        5 => prop::collection::vec(0u8..8, 1..7).prop_map(Step2::Ingest),
        6 => proptest::option::weighted(0.4, (any::<prop::sample::Index>(), 1u8..4)).prop_map(Step2::Drive),
        6 => any::<prop::sample::Index>().prop_map(Step2::Wire),
        6 => (any::<prop::sample::Index>(), answer()).prop_map(|(i, a)| Step2::Answer(i, a)),
        1 => proptest::option::weighted(0.5, outage()).prop_map(Step2::Outage),
        3 => (50u16..3000).prop_map(Step2::Advance),
        1 => Just(Step2::Restart),
        1 => any::<bool>().prop_map(Step2::DiskFull),
        1 => Just(Step2::RetryDead),
        1 => Just(Step2::Purge),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pending,
    Delivered,
    Dead,
    /// A dead letter whose stored row was purged: still counted refused, never retried.
    Purged,
    Evicted,
}

/// A batch whose request went on the wire: what it sent, and the rows the outbox no
/// longer held when it went (told to the planner with the answer, as the flusher does).
struct OnTheWire {
    sent: Batch,
    gone: Vec<i64>,
}

/// The reference: what became of each capture (by its sequence number), and what the
/// gateway and the service have been through.
struct World {
    store: Store,
    planner: Planner,
    dir: std::path::PathBuf,
    now: Instant,
    fates: HashMap<u64, Fate>,
    seq: u64,
    /// Launched by the planner, not yet on the wire (waiting for the client's gate or
    /// a token): holding no claim.
    launched: Vec<Batch>,
    wire: Vec<OnTheWire>,
    /// Pauses read in this process: (read at, until).
    pauses: Vec<(Instant, Instant)>,
    /// Captures the service decoded (its answer may have been lost).
    decoded: HashSet<u64>,
    disk_full: Option<rusqlite::Connection>,
    /// The service is down: every answer is this.
    outage: Option<Answer>,
}

const WORLD_MAX_PENDING: u64 = 12;

fn world_settings() -> FlushSettings {
    FlushSettings {
        max_batch: 4,
        max_delay: Duration::ZERO,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        max_in_flight: 4,
        max_attempts: 3,
    }
}

fn world_open(dir: &std::path::Path) -> Store {
    let options = StoreOptions {
        latest_every: crate::outbox::LATEST_EVERY,
        durability: Durability::Normal,
        max_pending: WORLD_MAX_PENDING,
        max_page_count: None,
        clock: crate::clock::system(),
    };
    Store::open(dir, options).unwrap().0
}

fn reading() -> Outcome {
    Outcome::Delivered(Reading {
        qr_code: Some("QR".into()),
        temp: None,
        bat: None,
    })
}

type Checked = Result<(), TestCaseError>;

impl World {
    fn new(dir: &std::path::Path) -> World {
        World {
            store: world_open(dir),
            planner: Planner::new(world_settings()),
            dir: dir.to_path_buf(),
            now: Instant::now(),
            fates: HashMap::new(),
            seq: 0,
            launched: Vec::new(),
            wire: Vec::new(),
            pauses: Vec::new(),
            decoded: HashSet::new(),
            disk_full: None,
            outage: None,
        }
    }

    fn ingest(&mut self, macs: &[u8]) -> Checked {
        let group: Vec<Capture> = macs
            .iter()
            .map(|&i| {
                self.seq += 1;
                capture(i, self.seq)
            })
            .collect();
        // What may be passed over: rows on the wire, or answered and not yet recorded.
        let claimed: HashSet<i64> = self.on_the_wire_or_unrecorded().into_iter().collect();
        let before: Vec<i64> = self
            .store
            .pending_captures()
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        if self.store.enqueue(&group).is_ok() {
            for c in &group {
                self.fates
                    .insert(u64::from_str_radix(&c.packet, 16).unwrap(), Fate::Pending);
            }
            // Whatever is no longer in the outbox was evicted.
            let rows = self.store.pending_captures().unwrap();
            let kept: HashSet<u64> = rows.iter().map(seq_of).collect();
            let mut evicted = Vec::new();
            for (s, fate) in self.fates.iter_mut() {
                if *fate == Fate::Pending && !kept.contains(s) {
                    *fate = Fate::Evicted;
                    evicted.push(*s);
                }
            }
            let on_the_wire: HashSet<u64> = self
                .wire
                .iter()
                .flat_map(|w| w.sent.rows.iter().map(seq_of))
                .collect();
            for s in &evicted {
                prop_assert!(
                    !on_the_wire.contains(s),
                    "capture {} evicted on the wire",
                    s
                );
            }
            self.evicted_oldest_first(&before, &group, &claimed)?;
        }
        Ok(())
    }

    /// The commit that just admitted `group` evicted the oldest rows not `claimed`
    /// (rows are in admission order by id; `before` the ids pending before it), and the
    /// bound holds.
    fn evicted_oldest_first(
        &self,
        before: &[i64],
        group: &[Capture],
        claimed: &HashSet<i64>,
    ) -> Checked {
        let rows = self.store.pending_captures().unwrap();
        let after: HashSet<i64> = rows.iter().map(|r| r.id).collect();
        let unclaimed_kept = rows.iter().filter(|r| !claimed.contains(&r.id));
        if let (Some(youngest_gone), Some(oldest_kept)) = (
            before.iter().filter(|id| !after.contains(id)).max(),
            unclaimed_kept.map(|r| r.id).min(),
        ) {
            prop_assert!(
                youngest_gone < &oldest_kept,
                "row {} evicted while the older row {} was kept, not on the wire",
                youngest_gone,
                oldest_kept
            );
        }
        let kept: HashSet<u64> = rows.iter().map(seq_of).collect();
        let new_evicted = group
            .iter()
            .any(|c| !kept.contains(&u64::from_str_radix(&c.packet, 16).unwrap()));
        prop_assert!(
            !new_evicted
                || before
                    .iter()
                    .filter(|id| after.contains(id))
                    .all(|id| claimed.contains(id)),
            "a new capture evicted while an older one was kept, not on the wire"
        );
        // The bound holds, unless every row left is claimed (re-queued dead letters
        // can push past it; eviction then takes every row it may).
        prop_assert!(
            rows.len() as u64 <= WORLD_MAX_PENDING || rows.iter().all(|r| claimed.contains(&r.id)),
            "{} pending",
            rows.len()
        );
        Ok(())
    }

    /// Whether a `Retry-After` read in this process holds now.
    fn paused(&self) -> Option<(Instant, Instant)> {
        self.pauses
            .iter()
            .find(|(read, until)| *read <= self.now && self.now < *until)
            .copied()
    }

    /// The planner launches a batch: it goes to the client, which sends it when it may.
    fn launched(&mut self, b: Batch) -> Checked {
        if let Some((read, until)) = self.paused() {
            prop_assert!(
                false,
                "batch {} launched {:?} into a Retry-After pause read {:?} before",
                b.id,
                until - self.now,
                self.now - read
            );
        }
        for r in b.rows.iter() {
            let flying = self
                .launched
                .iter()
                .chain(self.wire.iter().map(|w| &w.sent));
            for other in flying {
                prop_assert!(
                    other.rows.iter().all(|x| x.capture.mac != r.capture.mac),
                    "MAC of capture {} in two batches in flight",
                    seq_of(r)
                );
            }
        }
        self.launched.push(b);
        Ok(())
    }

    /// A launched batch goes on the wire if the client's gate is open, claiming its rows
    /// as the request task does: only those still pending go; the rest are gone.
    fn wire(&mut self, pick: prop::sample::Index) -> Checked {
        if self.launched.is_empty() || self.paused().is_some() {
            // It waits (out the pause, or for its token), holding nothing.
            return Ok(());
        }
        let b = self.launched.remove(pick.index(self.launched.len()));
        let keys: Vec<RowKey> = b.rows.iter().map(PendingCapture::key).collect();
        let present: HashSet<i64> = self
            .store
            .claim(&keys, b.seen)
            .unwrap()
            .into_iter()
            .collect();
        let (held, gone): (Vec<PendingCapture>, Vec<PendingCapture>) = b
            .rows
            .iter()
            .cloned()
            .partition(|r| present.contains(&r.id));
        for r in &gone {
            let s = seq_of(r);
            prop_assert_eq!(
                self.fates.get(&s).copied(),
                Some(Fate::Evicted),
                "capture {} gone",
                s
            );
        }
        let gone: Vec<i64> = gone.iter().map(|r| r.id).collect();
        if held.is_empty() {
            self.planner.gone(b.id, &gone);
            return Ok(());
        }
        let sent = Batch {
            rows: std::sync::Arc::new(held),
            ..b
        };
        self.sent(&sent)?;
        self.wire.push(OnTheWire { sent, gone });
        Ok(())
    }

    /// A batch goes on the wire: every promise about what may be sent.
    fn sent(&mut self, b: &Batch) -> Checked {
        let rows = self.store.pending_captures().unwrap();
        for r in b.rows.iter() {
            let s = seq_of(r);
            prop_assert_eq!(
                self.fates.get(&s).copied(),
                Some(Fate::Pending),
                "capture {} sent",
                s
            );
            let oldest = rows
                .iter()
                .find(|x| x.capture.mac == r.capture.mac)
                .map(|x| x.id);
            prop_assert_eq!(
                oldest,
                Some(r.id),
                "capture {} is not its MAC's oldest pending",
                s
            );
        }
        Ok(())
    }

    /// Records what a resolution settled, handing back rows, as the flusher does.
    fn carry_out(&mut self, res: Resolution) -> Checked {
        if res.backoff().is_some() || !res.settle.is_empty() {
            let unclaim = self.planner.take_unclaimed();
            self.store.unclaim(&unclaim);
        }
        if !res.settle.is_empty() {
            self.record(res.settle)?;
        }
        Ok(())
    }

    fn record(&mut self, settle: Vec<(PendingCapture, Outcome)>) -> Checked {
        match self.store.settle(&settle, 1) {
            Ok(_) => {
                for (r, o) in &settle {
                    let s = seq_of(r);
                    let fate = self.fates.get_mut(&s).unwrap();
                    prop_assert_eq!(*fate, Fate::Pending, "capture {} settled", s);
                    *fate = match o {
                        Outcome::Delivered(_) => {
                            prop_assert!(
                                self.decoded.contains(&s),
                                "capture {} delivered undecoded",
                                s
                            );
                            Fate::Delivered
                        }
                        Outcome::DeadLetter(_) => Fate::Dead,
                    };
                }
                self.planner.recorded(&settle);
            }
            Err(_) => {
                let now = self.now;
                let res = self
                    .planner
                    .record_failed(settle, "disk full".into(), now, 0.5);
                self.carry_out(res)?;
            }
        }
        Ok(())
    }

    /// What the service's answer `a` to batch `b` means, and what it decoded.
    fn action(&mut self, b: &Batch, a: Answer) -> Action {
        let all = |o: fn() -> Outcome| (0..b.rows.len()).map(|i| (i, o())).collect::<Vec<_>>();
        let decoded = |w: &mut World, from: usize| {
            for r in &b.rows[from..] {
                w.decoded.insert(seq_of(r));
            }
        };
        let retry = |cause: &str, label: &'static str, retry_after, isolate| Action::Retry {
            cause: cause.into(),
            label,
            retry_after,
            isolate,
        };
        match a {
            Answer::Ok => {
                decoded(self, 0);
                Action::Settle(all(reading))
            }
            Answer::LeaveOutFirst => {
                decoded(self, 1);
                Action::Settle((1..b.rows.len()).map(|i| (i, reading())).collect())
            }
            Answer::Dead => Action::Settle(all(|| Outcome::DeadLetter("device not found".into()))),
            Answer::Refused => Action::Refused("Bad Request".into()),
            Answer::Fail => retry("server error 503", "http_5xx", None, true),
            Answer::RateLimited(secs) => {
                let pause = Duration::from_secs(u64::from(secs));
                self.pauses.push((self.now, self.now + pause));
                retry("rate limited", "http_429", Some(pause), false)
            }
            Answer::Lost => {
                decoded(self, 0);
                retry("timeout", "timeout", None, true)
            }
            Answer::TooLarge => Action::Shrink,
            Answer::Refused2Connect => retry("connection refused", "connect", None, false),
        }
    }

    fn answer(&mut self, pick: prop::sample::Index, a: Answer) -> Checked {
        if self.wire.is_empty() {
            return Ok(());
        }
        let OnTheWire { sent: b, gone } = self.wire.remove(pick.index(self.wire.len()));
        let action = self.action(&b, self.outage.unwrap_or(a));
        if !matches!(&action, Action::Settle(o) if !o.is_empty()) {
            // The request task lets go at once of an answer that settles nothing.
            let ids: Vec<i64> = b.rows.iter().map(|r| r.id).collect();
            self.store.unclaim(&ids);
        }
        let (id, now) = (b.id, self.now);
        drop(b);
        self.planner.gone(id, &gone);
        let res = self.planner.answered(id, action, now, 0.5);
        self.carry_out(res)
    }

    /// The flusher's loop until it waits.
    fn drive(&mut self, interleave: Option<(prop::sample::Index, u8)>) -> Checked {
        let mut interleave = interleave.map(|(pick, secs)| (pick, Answer::RateLimited(secs)));
        for _ in 0..64 {
            let now = self.now;
            match self.planner.next(now) {
                Step::Fetch { max } => {
                    let unclaim = self.planner.take_unclaimed();
                    let busy = self.planner.busy().clone();
                    let found = self
                        .store
                        .fetch_next_batch(max, 10_000, &busy, &unclaim)
                        .unwrap();
                    if let Some((pick, a)) = interleave.take() {
                        // An answer is read while the fetch is under way.
                        self.answer(pick, a)?;
                    }
                    match self.planner.offer(found, false, now) {
                        Step::Send(b) => self.launched(b)?,
                        _ => return Ok(()),
                    }
                }
                Step::Send(b) => self.launched(b)?,
                Step::Record(settle) => {
                    let unclaim = self.planner.take_unclaimed();
                    self.store.unclaim(&unclaim);
                    self.record(settle)?;
                }
                Step::Wait(_) => return Ok(()),
            }
        }
        Ok(())
    }

    fn restart(&mut self) {
        self.disk_full(false);
        self.store = world_open(&self.dir);
        self.planner = Planner::new(world_settings());
        self.launched.clear();
        self.wire.clear();
        self.pauses.clear();
    }

    fn disk_full(&mut self, on: bool) {
        if on && self.disk_full.is_none() {
            let db = rusqlite::Connection::open(crate::db::open::path_in(&self.dir)).unwrap();
            db.execute_batch("CREATE TRIGGER full BEFORE DELETE ON pending BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;").unwrap();
            self.disk_full = Some(db);
        } else if !on {
            if let Some(db) = self.disk_full.take() {
                db.execute_batch("DROP TRIGGER full;").unwrap();
            }
        }
    }

    fn retry_dead(&mut self) {
        if self.disk_full.is_some() {
            return;
        }
        self.store.retry_dead_letters(None).unwrap();
        for fate in self.fates.values_mut() {
            if *fate == Fate::Dead {
                *fate = Fate::Pending;
            }
        }
    }

    /// Counters, rows and claims agree with the model.
    fn agrees(&self) -> Checked {
        let count = |f: Fate| self.fates.values().filter(|x| **x == f).count() as u64;
        let stats = self.store.stats().unwrap();
        prop_assert_eq!(stats.admitted, self.fates.len() as u64);
        prop_assert_eq!(stats.delivered, count(Fate::Delivered));
        prop_assert_eq!(stats.dead_letters, count(Fate::Dead) + count(Fate::Purged));
        prop_assert_eq!(stats.dead_letters_stored, count(Fate::Dead));
        prop_assert_eq!(stats.evicted, count(Fate::Evicted));
        prop_assert_eq!(stats.pending, count(Fate::Pending));
        let mut rows: Vec<u64> = self
            .store
            .pending_captures()
            .unwrap()
            .iter()
            .map(seq_of)
            .collect();
        rows.sort_unstable();
        let mut want: Vec<u64> = self
            .fates
            .iter()
            .filter(|(_, f)| **f == Fate::Pending)
            .map(|(s, _)| *s)
            .collect();
        want.sort_unstable();
        prop_assert_eq!(rows, want);
        // Claimed: exactly what is on the wire and what waits to be recorded.
        prop_assert_eq!(self.store.claimed(), self.on_the_wire_or_unrecorded());
        Ok(())
    }

    /// The rows of the requests on the wire and those answered and not yet recorded,
    /// in id order: all the outbox may pass over when it evicts.
    fn on_the_wire_or_unrecorded(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .wire
            .iter()
            .flat_map(|w| w.sent.rows.iter().map(|r| r.id))
            .chain(self.planner.unrecorded_rows())
            .collect();
        ids.sort_unstable();
        ids
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn planner_and_outbox_keep_every_delivery_promise(steps in prop::collection::vec(step2(), 1..80)) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = World::new(dir.path());
        for step in steps {
            match step {
                Step2::Ingest(macs) => w.ingest(&macs)?,
                Step2::Drive(interleave) => w.drive(interleave)?,
                Step2::Wire(pick) => w.wire(pick)?,
                Step2::Answer(pick, a) => w.answer(pick, a)?,
                Step2::Outage(down) => w.outage = down,
                Step2::Advance(ms) => w.now += Duration::from_millis(u64::from(ms)),
                Step2::Restart => w.restart(),
                Step2::DiskFull(on) => w.disk_full(on),
                Step2::RetryDead => w.retry_dead(),
                Step2::Purge => {
                    w.store.purge_dead_letters(None).unwrap();
                    for fate in w.fates.values_mut() {
                        if *fate == Fate::Dead {
                            *fate = Fate::Purged;
                        }
                    }
                }
            }
            w.agrees()?;
        }
    }
}
