/*!
Fault injection: one-shot faults a test queues ([`Fault`]), a seeded storm of random
ones ([`Storm`]) and the poison MAC, applied to decode requests. A fault is taken out
of the state under its lock and applied after it, so no lock is held while an answer
waits.
*/

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::StatusCode;
use serde_json::json;

use super::service::{
    error_answer, json_answer, mac_key, status_of, unauthorized, Answer, CloseConnection, Shared,
    State,
};
use super::{MockHandle, ReceivedItem};

/// A one-shot misbehaviour applied to a decode request (bulk or single).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status at once (429 body `{"message":"Too many requests"}`, others
    /// `{message, code}`), with a `Retry-After` header when given.
    Status {
        status: u16,
        retry_after: Option<String>,
    },
    /// Process the request at once but hold the answer this long (past the client's
    /// timeout: the service did the work and the answer was lost).
    Delay(Duration),
    /// Close the connection without any answer.
    Close,
    /// Answer normally but leave out the last N items of a bulk answer.
    DropItems(usize),
    /// Answer this status with the spec's error body carrying this `message` (a 400
    /// "Missing required headers" from a proxy that drops them, say).
    Refuse { status: u16, message: String },
}

/// Random faults on a fraction of decode requests, reproducible from the seed (for the
/// same sequence of requests).
#[derive(Debug, Clone, PartialEq)]
pub struct Storm {
    /// Fraction of decode requests that get a fault, 0.0..=1.0.
    pub probability: f64,
    pub seed: u64,
    /// The faults to pick from, uniformly (repeat one to weight it).
    pub mix: Vec<Fault>,
}

impl Storm {
    /// A storm with the default mix: 503, 500 and 429 (with `Retry-After: 1`), a closed
    /// connection, and a 1.5 s delay.
    pub fn new(probability: f64, seed: u64) -> Self {
        let status = |status, retry: Option<&str>| Fault::Status {
            status,
            retry_after: retry.map(str::to_string),
        };
        Storm {
            probability,
            seed,
            mix: vec![
                status(503, Some("1")),
                status(500, None),
                status(429, Some("1")),
                Fault::Close,
                Fault::Delay(Duration::from_millis(1500)),
            ],
        }
    }
}

/// What the mock does, every time, to a decode request holding a given MAC (a tape the
/// service chokes on), until the test takes it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacFault {
    /// Answer this status (as [`Fault::Status`], without `Retry-After`).
    Status(u16),
    /// Hold the answer this long (past the client's timeout: a request that times out).
    Delay(Duration),
    /// Leave the MAC's item out of the bulk answer.
    LeaveOut,
    /// Answer the MAC's item with its `mac_id` alone: neither a reading nor an error.
    OnlyMacId,
    /// Refuse the MAC's item with this error text (as long or as strange as a broken
    /// server may send).
    ItemError(String),
}

/// Misbehaviour that holds until changed (per MAC, a delay on every answer), and the
/// record of MACs that arrived in a request while another request holding them was
/// still unanswered.
#[derive(Debug, Default)]
pub(super) struct Standing {
    macs: HashMap<String, MacFault>,
    delay: Option<Duration>,
    /// MACs (plain form) of the requests being answered or held now, with how many.
    in_progress: HashMap<String, u32>,
    /// Decode requests being answered or held now.
    requests: usize,
    overlaps: Vec<String>,
}

/// How standing faults shape the answer of a request processed normally.
#[derive(Debug, Default)]
pub(super) struct Shaping {
    /// Items (plain MAC) left out of the bulk answer.
    pub leave_out: HashSet<String>,
    /// Items (plain MAC) answered with their `mac_id` alone.
    pub only_mac_id: HashSet<String>,
    /// Items (plain MAC) refused with this error text.
    pub item_error: HashMap<String, String>,
    /// Added to the answer.
    pub delay: Option<Duration>,
}

/// Keeps a request's MACs "in progress" until dropped: when the answer is on its way, or
/// when the client gave up and the connection (with the handler) was dropped.
pub(super) struct InProgress<'a> {
    shared: &'a Shared,
    macs: Vec<String>,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.shared.with(|s| {
            s.standing.requests -= 1;
            for m in &self.macs {
                if let Some(n) = s.standing.in_progress.get_mut(m) {
                    *n -= 1;
                    if *n == 0 {
                        s.standing.in_progress.remove(m);
                    }
                }
            }
        });
    }
}

/// Notes a request holding `items` as in progress (recording any MAC already in
/// progress as an overlap), and applies the standing faults: a fault for the whole
/// request when none is queued (`queued`), and the shaping of its answer.
pub(super) fn standing<'a>(
    shared: &'a Shared,
    items: &[ReceivedItem],
    queued: Option<Fault>,
) -> (Option<Fault>, Shaping, InProgress<'a>) {
    let macs: Vec<String> = items.iter().map(|i| mac_key(&i.mac_id)).collect();
    let (fault, shaping) = shared.with(|s| {
        let st = &mut s.standing;
        st.requests += 1;
        let mut fault = queued;
        let mut shaping = Shaping {
            delay: st.delay,
            ..Shaping::default()
        };
        for m in &macs {
            let n = st.in_progress.entry(m.clone()).or_insert(0);
            if *n > 0 {
                st.overlaps.push(m.clone());
            }
            *n += 1;
            match st.macs.get(m) {
                Some(MacFault::Status(code)) if fault.is_none() => {
                    fault = Some(Fault::Status {
                        status: *code,
                        retry_after: None,
                    })
                }
                Some(MacFault::Delay(d)) if fault.is_none() => fault = Some(Fault::Delay(*d)),
                Some(MacFault::LeaveOut) => {
                    shaping.leave_out.insert(m.clone());
                }
                Some(MacFault::OnlyMacId) => {
                    shaping.only_mac_id.insert(m.clone());
                }
                Some(MacFault::ItemError(text)) => {
                    shaping.item_error.insert(m.clone(), text.clone());
                }
                _ => {}
            }
        }
        (fault, shaping)
    });
    (fault, shaping, InProgress { shared, macs })
}

impl State {
    /// The next fault: the queue first, else a roll of the storm.
    pub(super) fn next_fault(&mut self) -> Option<Fault> {
        if let Some(f) = self.faults.pop_front() {
            return Some(f);
        }
        let (storm, rng) = self.storm.as_mut()?;
        if storm.mix.is_empty() || rng.f64() >= storm.probability {
            return None;
        }
        Some(storm.mix[rng.usize(..storm.mix.len())].clone())
    }
}

/// What `fault` does before the request is processed: `Some` is the whole outcome (an
/// answer at once, or the connection closed); `None` lets the request be processed, a
/// `Delay` or `DropItems` then shaping its answer.
pub(super) fn outcome_now(fault: Option<&Fault>) -> Option<Result<Answer, CloseConnection>> {
    match fault? {
        Fault::Close => Some(Err(CloseConnection)),
        Fault::Status {
            status,
            retry_after,
        } => Some(Ok(fault_answer(*status, retry_after.as_deref()))),
        Fault::Refuse { status, message } => Some(Ok(error_answer(*status, message))),
        Fault::Delay(_) | Fault::DropItems(_) => None,
    }
}

/// The answer of a `Fault::Status`.
fn fault_answer(code: u16, retry_after: Option<&str>) -> Answer {
    let mut resp = match code {
        429 => json_answer(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({"message": "Too many requests"}),
        ),
        401 => unauthorized(),
        _ => {
            let status = status_of(code);
            error_answer(
                status.as_u16(),
                status.canonical_reason().unwrap_or("Server error"),
            )
        }
    };
    if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    resp
}

impl MockHandle {
    /// Queues a one-shot fault for the next decode request (FIFO).
    pub fn push_fault(&self, fault: Fault) {
        self.shared.with(|s| s.faults.push_back(fault));
    }

    /// Drops the queued faults.
    pub fn clear_faults(&self) {
        self.shared.with(|s| s.faults.clear());
    }

    /// Queued faults not yet applied.
    pub fn pending_faults(&self) -> usize {
        self.shared.with(|s| s.faults.len())
    }

    /// Random faults on a fraction of decode requests (queued faults go first).
    pub fn set_storm(&self, storm: Option<Storm>) {
        self.shared.with(|s| {
            s.storm = storm.map(|st| {
                let rng = fastrand::Rng::with_seed(st.seed);
                (st, rng)
            })
        });
    }

    /// Every decode request holding `mac` (any form) gets `fault`, until set to `None`.
    pub fn set_mac_fault(&self, mac: &str, fault: Option<MacFault>) {
        let key = mac_key(mac);
        self.shared.with(|s| match fault {
            Some(f) => {
                s.standing.macs.insert(key, f);
            }
            None => {
                s.standing.macs.remove(&key);
            }
        });
    }

    /// Every decode answer is held this long (an uplink with a long round trip).
    pub fn set_answer_delay(&self, delay: Option<Duration>) {
        self.shared.with(|s| s.standing.delay = delay);
    }

    /// MACs (plain form) that arrived in a decode request while another request holding
    /// them was still unanswered, in order of arrival: a client that keeps a MAC in at
    /// most one batch in flight leaves this empty.
    pub fn overlaps(&self) -> Vec<String> {
        self.shared.with(|s| s.standing.overlaps.clone())
    }

    /// Decode requests received and not yet answered (held by a delay, say).
    pub fn requests_in_progress(&self) -> usize {
        self.shared.with(|s| s.standing.requests)
    }

    /// A bulk (or single) request holding this MAC (any form) is refused whole with 400
    /// `Invalid ble_packet for <mac>`.
    pub fn set_poison(&self, mac: Option<&str>) {
        let key = mac.map(mac_key);
        self.shared.with(|s| s.poison = key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::MockConfig;

    #[test]
    fn the_storm_is_reproducible_from_its_seed() {
        let roll = || {
            let mut s = State::new(MockConfig::demo());
            s.storm = Some((Storm::new(0.5, 42), fastrand::Rng::with_seed(42)));
            (0..50).map(|_| s.next_fault()).collect::<Vec<_>>()
        };
        let a = roll();
        assert_eq!(a, roll());
        let hits = a.iter().filter(|f| f.is_some()).count();
        assert!((10..=40).contains(&hits), "{hits} faults in 50 at p=0.5");
    }

    #[test]
    fn queued_faults_come_before_the_storm_and_in_order() {
        let mut s = State::new(MockConfig::demo());
        s.storm = Some((
            Storm {
                probability: 1.0,
                seed: 1,
                mix: vec![Fault::Close],
            },
            fastrand::Rng::with_seed(1),
        ));
        s.faults.push_back(Fault::DropItems(1));
        s.faults.push_back(Fault::DropItems(2));
        assert_eq!(s.next_fault(), Some(Fault::DropItems(1)));
        assert_eq!(s.next_fault(), Some(Fault::DropItems(2)));
        assert_eq!(s.next_fault(), Some(Fault::Close));
    }
}
