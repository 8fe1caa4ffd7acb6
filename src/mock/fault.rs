/*!
Fault injection: one-shot faults a test queues ([`Fault`]), a seeded storm of random
ones ([`Storm`]) and the poison MAC, applied to decode requests. A fault is taken out
of the state under its lock and applied after it, so no lock is held while an answer
waits.
*/

use std::time::Duration;

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::StatusCode;
use serde_json::json;

use super::service::{
    error_answer, json_answer, mac_key, status_of, unauthorized, Answer, CloseConnection, State,
};
use super::MockHandle;

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
