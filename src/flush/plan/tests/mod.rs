//! One test per rule of the planner's module doc, time passed in, one file per subject;
//! and a property test of per-MAC order under any interleaving of answers, against a
//! simple model. This file holds what they share: rows, answers, a fetch.

mod batching;
mod isolation;
mod model;
mod pause;
mod refusals;
mod window;

use super::*;
use crate::flush::answer::Action;
use crate::outbox::{Reading, Seen};
use crate::record::Capture;

fn settings() -> FlushSettings {
    FlushSettings {
        max_batch: 4,
        max_delay: Duration::from_secs(5),
        backoff_initial: Duration::from_millis(500),
        backoff_max: Duration::from_secs(5),
        max_in_flight: 8,
        max_attempts: 3,
    }
}

fn mac(i: u8) -> Mac {
    Mac::new([0xC0, 0xFF, 0xEE, 0, 0, i])
}

fn row(id: i64, m: u8) -> PendingCapture {
    PendingCapture {
        id,
        capture: Capture {
            mac: mac(m),
            ts_ms: id,
            product_id: "tape".into(),
            packet: format!("{id:02X}"),
            rssi: None,
            boot_ms: None,
        },
    }
}

/// Rows `ids` of MACs `id % macs`.
fn rows(ids: std::ops::Range<i64>, macs: i64) -> Vec<PendingCapture> {
    ids.map(|i| row(i, (i % macs) as u8)).collect()
}

fn fetched(rows: Vec<PendingCapture>, complete: bool, backlog: bool) -> Fetched {
    Fetched {
        rows,
        complete,
        backlog,
        seen: Seen::default(),
    }
}

fn delivered() -> Outcome {
    Outcome::Delivered(Reading {
        qr_code: Some("QR".into()),
        temp: None,
        bat: None,
    })
}

/// Every row of `b` decoded.
fn all_ok(b: &Batch) -> Action {
    Action::Settle((0..b.rows.len()).map(|i| (i, delivered())).collect())
}

fn retry(cause: &str, retry_after: Option<Duration>) -> Action {
    Action::Retry {
        cause: cause.into(),
        label: "http_5xx",
        retry_after,
        isolate: true,
    }
}

fn sent(step: Step) -> Batch {
    match step {
        Step::Send(b) => b,
        other => panic!("expected a batch to send, got {other:?}"),
    }
}

/// Fetches (as the outbox would) from `pending` and offers what it finds; a queued
/// part due is launched, and its rows no longer in `pending` are gone as its request
/// goes on the wire (a part left with none was not sent).
fn fetch_and_offer(p: &mut Planner, pending: &[PendingCapture], now: Instant) -> Step {
    loop {
        match p.next(now) {
            Step::Fetch { max } => {
                let f = fetch(pending, p.busy(), max);
                return p.offer(f, false, now);
            }
            Step::Send(b) => {
                if let Some(b) = on_the_wire(p, b, pending) {
                    return Step::Send(b);
                }
            }
            other => return other,
        }
    }
}

/// `b`'s request goes on the wire: rows no longer in `pending` are gone (as the
/// outbox's claim finds); the batch as sent, if anything is left.
fn on_the_wire(p: &mut Planner, b: Batch, pending: &[PendingCapture]) -> Option<Batch> {
    let (held, gone): (Vec<PendingCapture>, Vec<PendingCapture>) = b
        .rows
        .iter()
        .cloned()
        .partition(|r| pending.iter().any(|x| x.id == r.id));
    let gone: Vec<i64> = gone.iter().map(|r| r.id).collect();
    p.gone(b.id, &gone);
    (!held.is_empty()).then(|| Batch {
        rows: Arc::new(held),
        ..b
    })
}

/// The next step, which must be a queued part sent whole.
fn next_sent(p: &mut Planner, now: Instant) -> Batch {
    match p.next(now) {
        Step::Send(b) => b,
        other => panic!("expected a queued part to send, got {other:?}"),
    }
}

/// The outbox's `next_batch_excluding` over a list.
fn fetch(pending: &[PendingCapture], busy: &HashSet<Mac>, max: usize) -> Fetched {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut backlog = false;
    for r in pending {
        if busy.contains(&r.capture.mac) {
            continue;
        }
        if seen.insert(r.capture.mac) {
            if out.len() == max {
                return fetched(out, false, backlog);
            }
            out.push(r.clone());
        } else {
            backlog = true;
        }
    }
    fetched(out, true, backlog)
}

fn ids(b: &Batch) -> Vec<i64> {
    b.rows.iter().map(|r| r.id).collect()
}
