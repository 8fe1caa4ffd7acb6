/*!
Fault injection: one-shot faults a test queues ([`Fault`]), a seeded storm of random
ones ([`Storm`]), misbehaviour that holds per MAC ([`MacFault`]) and what it makes of an
answer. Pure: the state lives with the router (`service/`), which takes a fault out
under its lock and applies it after, so no lock is held while an answer waits. It
touches only the answer helpers.
*/

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::StatusCode;
use serde_json::json;

use super::answer::{error_answer, json_answer, status_of, unauthorized, Answer, CloseConnection};

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
pub(crate) struct Standing {
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
pub(crate) struct Shaping {
    /// Items (plain MAC) left out of the bulk answer.
    pub leave_out: HashSet<String>,
    /// Items (plain MAC) answered with their `mac_id` alone.
    pub only_mac_id: HashSet<String>,
    /// Items (plain MAC) refused with this error text.
    pub item_error: HashMap<String, String>,
    /// Added to the answer.
    pub delay: Option<Duration>,
}

impl Standing {
    /// Notes a request holding `macs` (plain form) as in progress (recording any MAC
    /// already in progress as an overlap), and applies the standing faults: a fault for
    /// the whole request when none is queued (`queued`), and the shaping of its answer.
    pub fn enter(&mut self, macs: &[String], queued: Option<Fault>) -> (Option<Fault>, Shaping) {
        self.requests += 1;
        let mut fault = queued;
        let mut shaping = Shaping {
            delay: self.delay,
            ..Shaping::default()
        };
        for m in macs {
            let n = self.in_progress.entry(m.clone()).or_insert(0);
            if *n > 0 {
                self.overlaps.push(m.clone());
            }
            *n += 1;
            match self.macs.get(m) {
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
    }

    /// The request holding `macs` is answered, or its client gave up.
    pub fn leave(&mut self, macs: &[String]) {
        self.requests -= 1;
        for m in macs {
            if let Some(n) = self.in_progress.get_mut(m) {
                *n -= 1;
                if *n == 0 {
                    self.in_progress.remove(m);
                }
            }
        }
    }

    /// Every decode request holding `mac` (plain form) gets `fault`, until `None`.
    pub fn set_mac_fault(&mut self, mac: String, fault: Option<MacFault>) {
        match fault {
            Some(f) => {
                self.macs.insert(mac, f);
            }
            None => {
                self.macs.remove(&mac);
            }
        }
    }

    /// Every decode answer is held this long.
    pub fn set_delay(&mut self, delay: Option<Duration>) {
        self.delay = delay;
    }

    /// MACs that arrived while another request holding them was unanswered.
    pub fn overlaps(&self) -> &[String] {
        &self.overlaps
    }

    /// Decode requests received and not yet answered.
    pub fn requests(&self) -> usize {
        self.requests
    }
}

/// A storm and the generator of its rolls.
pub(crate) type Rolling = (Storm, fastrand::Rng);

/// The next fault: the queue first, else a roll of the storm.
pub(crate) fn next_fault(
    queue: &mut VecDeque<Fault>,
    storm: &mut Option<Rolling>,
) -> Option<Fault> {
    if let Some(f) = queue.pop_front() {
        return Some(f);
    }
    let (storm, rng) = storm.as_mut()?;
    if storm.mix.is_empty() || rng.f64() >= storm.probability {
        return None;
    }
    Some(storm.mix[rng.usize(..storm.mix.len())].clone())
}

/// What `fault` does before the request is processed: `Some` is the whole outcome (an
/// answer at once, or the connection closed); `None` lets the request be processed, a
/// `Delay` or `DropItems` then shaping its answer.
pub(crate) fn outcome_now(fault: Option<&Fault>) -> Option<Result<Answer, CloseConnection>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storm_is_reproducible_from_its_seed() {
        let roll = || {
            let mut queue = VecDeque::new();
            let mut storm = Some((Storm::new(0.5, 42), fastrand::Rng::with_seed(42)));
            (0..50)
                .map(|_| next_fault(&mut queue, &mut storm))
                .collect::<Vec<_>>()
        };
        let a = roll();
        assert_eq!(a, roll());
        let hits = a.iter().filter(|f| f.is_some()).count();
        assert!((10..=40).contains(&hits), "{hits} faults in 50 at p=0.5");
    }

    #[test]
    fn queued_faults_come_before_the_storm_and_in_order() {
        let mut storm = Some((
            Storm {
                probability: 1.0,
                seed: 1,
                mix: vec![Fault::Close],
            },
            fastrand::Rng::with_seed(1),
        ));
        let mut queue = VecDeque::new();
        queue.push_back(Fault::DropItems(1));
        queue.push_back(Fault::DropItems(2));
        assert_eq!(
            next_fault(&mut queue, &mut storm),
            Some(Fault::DropItems(1))
        );
        assert_eq!(
            next_fault(&mut queue, &mut storm),
            Some(Fault::DropItems(2))
        );
        assert_eq!(next_fault(&mut queue, &mut storm), Some(Fault::Close));
    }
}
