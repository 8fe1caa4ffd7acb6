//! Historical data (spec 4.2): events of one tape (`trk_asset_id`) or one customer
//! asset (`customer_asset_id`), from `historical_base_url`, which is not `base_url`.
//! It may touch the send, `assumed.rs` (the shape of its 400) and its time frames
//! (`history/windows.rs`, pure).
//!
//! One request returns at most "1 month or 1000 events", and history reaches back one
//! year. What the spec leaves open, and how the read is complete under every reading:
//! - **Which 1,000 events a full answer holds** (the oldest of the range, or the newest:
//!   with no time frame "the latest event is returned"), **and in which order**: a full
//!   answer spanning `[lo, hi]` (its earliest and latest events, whatever their order)
//!   stands for that part of the range, and `[from, lo]` and `[hi, to]` are asked too,
//!   so whichever end the service kept, the rest is asked for; a full answer that spans
//!   the whole window is bisected. Boundaries are inclusive and the events merged
//!   without duplicates, in time order ([`merge`]).
//! - **How long "one month" is**: the range is split into calendar months in UTC
//!   ([`month_windows`], pure, `now` passed in: 28 to 31 days); a window refused with
//!   400 that is longer than 28 days (a month under any reading) is split in halves and
//!   the later windows are cut to 28 days; a 400 for a shorter one is a real refusal.
//! - A window that still cannot be completed (over 1,000 events at one instant, or
//!   `windows::MAX_REQUESTS` reached) is named in a warning, and the read is not complete.

mod windows;

use std::collections::HashSet;

use bytes::Bytes;
use jiff::Timestamp;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::assumed;
use super::base::{Base, OperatorError};
use super::locate::SensorReading;
use super::send::{Call, Policy, Sent};
use crate::api::{join, Account, ApiError};

use windows::Plan;
pub use windows::{month_windows, HistoryWindow};

/// The historical event of spec 2.2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoricalEvent {
    #[serde(default)]
    pub battery: Option<Battery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer_asset_id: Option<String>,
    pub event_type: String,
    pub lat: f64,
    pub lon: f64,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub location_detailed: String,
    /// Only the sensors active on the tape.
    #[serde(default)]
    pub sensors: Vec<SensorReading>,
    /// UTC.
    pub timestamp: Timestamp,
    /// The tape's QR code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trk_asset_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Battery {
    /// `HIGH`, `MED` or `LOW`.
    pub charge: String,
}

/// Whose history: exactly one of the two (spec 4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryFilter {
    /// A tape's QR code (`trk_asset_id`).
    Tape(String),
    /// A customer asset identifier (`customer_asset_id`).
    Asset(String),
}

/// A history read.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryQuery {
    pub filter: HistoryFilter,
    /// `location` or `environment`.
    pub event_type: Option<String>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
}

/// A history read: the events merged in time order, the requests it took, and what
/// could not be completed (empty when the read is complete).
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRead {
    pub events: Vec<HistoricalEvent>,
    pub requests: usize,
    pub incomplete: Vec<String>,
}

/// What one request answered.
enum Page {
    Events(Vec<HistoricalEvent>),
    /// 400: refused, with the service's message.
    Refused(String),
}

/// Merges event lists: duplicates dropped, time order.
pub fn merge(parts: Vec<Vec<HistoricalEvent>>) -> Vec<HistoricalEvent> {
    let mut seen = HashSet::new();
    let mut out: Vec<HistoricalEvent> = parts
        .into_iter()
        .flatten()
        .filter(|e| seen.insert(serde_json::to_string(e).unwrap_or_else(|_| format!("{e:?}"))))
        .collect();
    out.sort_by_key(|e| e.timestamp);
    out
}

impl Base {
    /// The events of `q`, merged and in time order, the requests sent, and what could
    /// not be completed.
    pub(super) async fn history(
        &self,
        q: &HistoryQuery,
        now: Timestamp,
    ) -> Result<HistoryRead, OperatorError> {
        let windows = month_windows(q.from, q.to, now).map_err(OperatorError::Usage)?;
        let Some(windows) = windows else {
            return match self.history_request(q, None).await? {
                Page::Events(events) => Ok(HistoryRead {
                    events: merge(vec![events]),
                    requests: 1,
                    incomplete: Vec::new(),
                }),
                Page::Refused(m) => Err(OperatorError::Refused(format!(
                    "the service refused the history request: {m}"
                ))),
            };
        };
        // The whole range asked: a service may read a bound to the whole second (or
        // coarser) and answer events just outside it, which the range does not hold.
        let asked = windows.first().map(|w| w.from)..=windows.last().map(|w| w.to);
        let mut plan = Plan::new(windows);
        let mut parts = Vec::new();
        while let Some(w) = plan.next(self.interrupt.is_stopped()) {
            let events = match self.history_request(q, Some(w)).await {
                Ok(Page::Events(events)) => events,
                Ok(Page::Refused(m)) => {
                    // "One month" may be shorter than this window for the service.
                    if plan.refused(w) {
                        (self.on_retry)(&format!(
                            "history: the service refused {w} ({m}); asking for it in shorter windows"
                        ));
                        continue;
                    }
                    return Err(OperatorError::Refused(format!(
                        "the service refused the history request for {w}: {m}"
                    )));
                }
                Err(OperatorError::Interrupted(_)) => {
                    plan.interrupted(w);
                    break;
                }
                Err(e) => return Err(e),
            };
            let times: Vec<Timestamp> = events.iter().map(|e| e.timestamp).collect();
            plan.answered(w, &times);
            parts.push(events);
        }
        let mut events = merge(parts);
        events.retain(|e| {
            asked.start().is_none_or(|from| e.timestamp >= from)
                && asked.end().is_none_or(|to| e.timestamp <= to)
        });
        Ok(HistoryRead {
            events,
            requests: plan.requests(),
            incomplete: plan.incomplete,
        })
    }

    async fn history_request(
        &self,
        q: &HistoryQuery,
        window: Option<HistoryWindow>,
    ) -> Result<Page, OperatorError> {
        let s = self.settings();
        let key = |k: &str| format!("[service.environments.<name>] {k}");
        let base = s.historical_base_url.as_ref().ok_or_else(|| {
            OperatorError::Usage(format!(
                "history is served from its own address: set {}",
                key("historical_base_url")
            ))
        })?;
        let op_id = s.history_operation_id.as_deref().ok_or_else(|| {
            OperatorError::Usage(format!(
                "history needs the operation's fixed UUID: set {}",
                key("history_operation_id")
            ))
        })?;
        let url = join(base, &["agent-service", "v1", "agent", "exec", op_id])?;
        let (customer_id, authorized_groups) = self.client.account_ids();
        let mut filters = Map::new();
        match &q.filter {
            HistoryFilter::Tape(t) => filters.insert("trk_asset_id".into(), json!(t)),
            HistoryFilter::Asset(a) => filters.insert("customer_asset_id".into(), json!(a)),
        };
        if let Some(t) = &q.event_type {
            filters.insert("event_type".into(), json!(t));
        }
        if let Some(w) = window {
            filters.insert("from".into(), json!(w.from.to_string()));
            filters.insert("to".into(), json!(w.to.to_string()));
        }
        let body = json!({"context": {
            "customer_id": customer_id,
            "authorized_groups": authorized_groups,
            "filters": filters,
        }});
        let call = Call {
            what: "history".into(),
            method: Method::POST,
            url,
            account: Account::Headers,
            headers: Vec::new(),
            body: Some(Bytes::from(body.to_string())),
            correlation_id: self.correlation_id("history"),
        };
        let a = match self.send(Policy::READ, &call).await? {
            Sent::Answered { answer, .. } => answer,
            Sent::NoAnswer { cause, .. } | Sent::Lost { cause } => {
                return Err(OperatorError::Refused(format!(
                    "history: the service did not answer: {cause}"
                )))
            }
            Sent::Interrupted { .. } => return Err(OperatorError::Interrupted("history".into())),
        };
        match a.status {
            StatusCode::OK => Ok(Page::Events(parse_events(&a.body)?)),
            StatusCode::BAD_REQUEST => Ok(Page::Refused(
                assumed::history_error_message(&a.body)
                    .map(|m| crate::util::text::bounded(&m, crate::util::text::SHOWN_MAX_CHARS))
                    .unwrap_or(a.message),
            )),
            s => Err(OperatorError::Refused(format!(
                "history: HTTP {}: {}",
                s.as_u16(),
                a.message
            ))),
        }
    }
}

fn parse_events(body: &[u8]) -> Result<Vec<HistoricalEvent>, OperatorError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadAnswer(format!("the history answer is not JSON: {e}")))?;
    let events = v
        .get("data")
        .and_then(|d| d.get("events"))
        .cloned()
        .ok_or_else(|| ApiError::BadAnswer("the history answer has no data.events".into()))?;
    Ok(serde_json::from_value(events).map_err(|e| {
        ApiError::BadAnswer(format!("a history event is not the event of spec 2.2: {e}"))
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn event(ts: &str) -> HistoricalEvent {
        HistoricalEvent {
            battery: None,
            customer_asset_id: None,
            event_type: "location".into(),
            lat: 1.0,
            lon: 2.0,
            location: "x".into(),
            location_detailed: "y".into(),
            sensors: vec![],
            timestamp: t(ts),
            trk_asset_id: Some("TT1".into()),
        }
    }

    #[test]
    fn merged_events_are_in_time_order_without_the_boundary_duplicates() {
        let a = vec![event("2026-07-01T00:00:00Z"), event("2026-06-20T00:00:00Z")];
        let b = vec![event("2026-07-01T00:00:00Z"), event("2026-07-02T00:00:00Z")];
        let got: Vec<String> = merge(vec![b, a])
            .iter()
            .map(|e| e.timestamp.to_string())
            .collect();
        assert_eq!(
            got,
            [
                "2026-06-20T00:00:00Z",
                "2026-07-01T00:00:00Z",
                "2026-07-02T00:00:00Z"
            ]
        );
    }
}
