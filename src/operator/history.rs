//! Historical data (spec 4.2): events of one tape (`trk_asset_id`) or one customer
//! asset (`customer_asset_id`), from `historical_base_url`, which is not `base_url`.
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
//!   [`MAX_REQUESTS`] reached) is named in a warning, and the read is not complete.

use std::collections::HashSet;

use bytes::Bytes;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ToSpan};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::assumed;
use super::devices::{Operator, OperatorError};
use super::locate::SensorReading;
use super::send::{Call, Policy, Sent};
use crate::api::{join, Account, ApiError};

/// Events one request returns at most (spec 4.2).
pub const MAX_EVENTS_PER_REQUEST: usize = 1000;
/// How far back history reaches (spec 4.2: one year).
pub const MAX_AGE_DAYS: i64 = 365;
/// Requests of one history read at most (a year of dense history is a few dozen).
pub const MAX_REQUESTS: usize = 400;
/// A time frame no reading of "one month" refuses (February).
const SURE_MONTH_SECS: i64 = 28 * 86_400;

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

/// One request's time frame (both ends inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryWindow {
    pub from: Timestamp,
    pub to: Timestamp,
}

impl HistoryWindow {
    fn secs(&self) -> i64 {
        self.to.as_second() - self.from.as_second()
    }

    /// The two halves, meeting at the whole second nearest the middle (`None` when the
    /// window is too short to split).
    fn halves(&self) -> Option<(HistoryWindow, HistoryWindow)> {
        let mid = Timestamp::from_second(self.from.as_second() + self.secs() / 2).ok()?;
        (mid > self.from && mid < self.to).then_some((
            HistoryWindow {
                from: self.from,
                to: mid,
            },
            HistoryWindow {
                from: mid,
                to: self.to,
            },
        ))
    }
}

impl std::fmt::Display for HistoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.from, self.to)
    }
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

/// The windows still to ask after a full answer to `w` whose events span `lo..=hi`:
/// the parts of `w` outside that span, or (when it spans all of `w`) its halves.
/// `None`: `w` cannot be split further.
fn rest_of_full(w: HistoryWindow, lo: Timestamp, hi: Timestamp) -> Option<Vec<HistoryWindow>> {
    let mut rest = Vec::new();
    if lo > w.from {
        rest.push(HistoryWindow {
            from: w.from,
            to: lo,
        });
    }
    if hi < w.to {
        rest.push(HistoryWindow { from: hi, to: w.to });
    }
    if rest.is_empty() || rest.contains(&w) {
        // No part of the window is outside the answer (or the answer sits at one of
        // its ends, all at one instant): halve it instead, so each ask is smaller.
        let (a, b) = w.halves()?;
        rest = vec![a, b];
    }
    Some(rest)
}

fn utc_month_start_after(t: Timestamp) -> Option<Timestamp> {
    let date = t.to_zoned(TimeZone::UTC).date().first_of_month();
    let next = date.checked_add(1.month()).ok()?;
    next.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp())
}

/// The windows of one month at most that cover `from..=to` (each an inclusive range; the
/// next starts where one ends). `Ok(None)`: neither bound given, one request for the
/// latest event. Refuses a range reaching more than a year back or ending before it
/// starts. `from` alone ends now; `to` alone starts a month before it.
pub fn month_windows(
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    now: Timestamp,
) -> Result<Option<Vec<HistoryWindow>>, String> {
    let oldest = now
        .checked_sub(Span::new().hours(24 * MAX_AGE_DAYS))
        .map_err(|e| e.to_string())?;
    let (from, to) = match (from, to) {
        (None, None) => return Ok(None),
        (Some(f), None) => (f, now),
        (None, Some(t)) => {
            let f = t
                .to_zoned(TimeZone::UTC)
                .checked_sub(1.month())
                .map_err(|e| e.to_string())?
                .timestamp();
            (f, t)
        }
        (Some(f), Some(t)) => (f, t),
    };
    if from > to {
        return Err(format!("--from {from} is after --to {to}"));
    }
    if from < oldest {
        let days = (now.as_second() - from.as_second()) / 86_400;
        return Err(format!(
            "history reaches back at most one year ({MAX_AGE_DAYS} days); --from {from} is {days} days back"
        ));
    }
    let mut windows = Vec::new();
    let mut start = from;
    loop {
        let end = match utc_month_start_after(start) {
            Some(next) if next < to => next,
            _ => to,
        };
        windows.push(HistoryWindow {
            from: start,
            to: end,
        });
        if end >= to {
            return Ok(Some(windows));
        }
        start = end;
    }
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

impl Operator {
    /// The events of `q`, merged and in time order, the requests sent, and what could
    /// not be completed.
    pub async fn history(
        &self,
        q: &HistoryQuery,
        now: Timestamp,
    ) -> Result<HistoryRead, OperatorError> {
        let windows = month_windows(q.from, q.to, now).map_err(OperatorError::Usage)?;
        let mut parts = Vec::new();
        let mut incomplete = Vec::new();
        let Some(windows) = windows else {
            return match self.history_request(q, None).await? {
                Page::Events(events) => Ok(HistoryRead {
                    events: merge(vec![events]),
                    requests: 1,
                    incomplete,
                }),
                Page::Refused(m) => Err(OperatorError::Refused(format!(
                    "the service refused the history request: {m}"
                ))),
            };
        };
        let mut queue: std::collections::VecDeque<HistoryWindow> = windows.into();
        let mut requests = 0;
        // Cut to after a 400 for a month: every later window is at most this long.
        let mut cap: Option<i64> = None;
        while let Some(w) = queue.pop_front() {
            if cap.is_some_and(|c| w.secs() > c) {
                if let Some((a, b)) = w.halves() {
                    queue.push_front(b);
                    queue.push_front(a);
                    continue;
                }
            }
            if self.interrupt.is_stopped() {
                incomplete.push(format!("{w} and after: interrupted"));
                break;
            }
            if requests >= MAX_REQUESTS {
                incomplete.push(format!(
                    "{w} and after: not read (more than {MAX_REQUESTS} requests needed; ask for a shorter range)"
                ));
                break;
            }
            requests += 1;
            let events = match self.history_request(q, Some(w)).await {
                Ok(Page::Events(events)) => events,
                Ok(Page::Refused(m)) if w.secs() > SURE_MONTH_SECS => {
                    // "One month" may be shorter than this window for the service.
                    cap = Some(SURE_MONTH_SECS);
                    (self.on_retry)(&format!(
                        "history: the service refused {w} ({m}); asking for it in shorter windows"
                    ));
                    match w.halves() {
                        Some((a, b)) => {
                            queue.push_front(b);
                            queue.push_front(a);
                            continue;
                        }
                        None => unreachable!("a window over 28 days has halves"),
                    }
                }
                Ok(Page::Refused(m)) => {
                    return Err(OperatorError::Refused(format!(
                        "the service refused the history request for {w}: {m}"
                    )))
                }
                Err(OperatorError::Interrupted(_)) => {
                    incomplete.push(format!("{w} and after: interrupted"));
                    break;
                }
                Err(e) => return Err(e),
            };
            if events.len() >= MAX_EVENTS_PER_REQUEST {
                // Full: the service kept one end of the window, the oldest or the
                // newest, in some order. Ask for the rest on both sides.
                let lo = events.iter().map(|e| e.timestamp).min();
                let hi = events.iter().map(|e| e.timestamp).max();
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    match rest_of_full(w, lo, hi) {
                        Some(rest) => {
                            for r in rest.into_iter().rev() {
                                queue.push_front(r);
                            }
                        }
                        None => incomplete.push(format!(
                            "{w}: more than {MAX_EVENTS_PER_REQUEST} events at one instant; only {} of them read",
                            events.len()
                        )),
                    }
                }
            }
            parts.push(events);
        }
        Ok(HistoryRead {
            events: merge(parts),
            requests,
            incomplete,
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
                    .map(|m| crate::text::bounded(&m, crate::text::SHOWN_MAX_CHARS))
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

    const NOW: &str = "2026-11-23T12:00:00Z";

    #[test]
    fn no_time_frame_is_one_request_for_the_latest_event() {
        assert_eq!(month_windows(None, None, t(NOW)), Ok(None));
    }

    #[test]
    fn three_months_and_a_bit_are_four_windows_on_month_boundaries() {
        let w = month_windows(
            Some(t("2026-06-15T00:00:00Z")),
            Some(t("2026-09-20T00:00:00Z")),
            t(NOW),
        )
        .unwrap()
        .unwrap();
        let got: Vec<String> = w.iter().map(|w| format!("{}..{}", w.from, w.to)).collect();
        assert_eq!(
            got,
            [
                "2026-06-15T00:00:00Z..2026-07-01T00:00:00Z",
                "2026-07-01T00:00:00Z..2026-08-01T00:00:00Z",
                "2026-08-01T00:00:00Z..2026-09-01T00:00:00Z",
                "2026-09-01T00:00:00Z..2026-09-20T00:00:00Z",
            ]
        );
        // No window is over a month (31 days).
        assert!(w
            .iter()
            .all(|w| w.to.as_second() - w.from.as_second() <= 31 * 86_400));
    }

    #[test]
    fn a_range_reaching_fourteen_months_back_is_refused() {
        let err = month_windows(Some(t("2025-09-23T00:00:00Z")), None, t(NOW)).unwrap_err();
        assert!(err.contains("one year"), "{err}");
        assert!(err.contains("426 days"), "{err}");
    }

    #[test]
    fn from_after_to_is_refused_and_from_alone_ends_now() {
        assert!(month_windows(Some(t(NOW)), Some(t("2026-11-01T00:00:00Z")), t(NOW)).is_err());
        let w = month_windows(Some(t("2026-11-20T00:00:00Z")), None, t(NOW))
            .unwrap()
            .unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].to, t(NOW));
        let w = month_windows(None, Some(t("2026-11-20T00:00:00Z")), t(NOW))
            .unwrap()
            .unwrap();
        assert_eq!(w[0].from, t("2026-10-20T00:00:00Z"));
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

    fn w(from: &str, to: &str) -> HistoryWindow {
        HistoryWindow {
            from: t(from),
            to: t(to),
        }
    }

    #[test]
    fn the_rest_of_a_full_answer_is_asked_on_whichever_side_it_lies() {
        let win = w("2026-06-01T00:00:00Z", "2026-07-01T00:00:00Z");
        // The oldest 1,000 came: the rest is after them.
        assert_eq!(
            rest_of_full(win, t("2026-06-01T00:00:00Z"), t("2026-06-21T00:00:00Z")),
            Some(vec![w("2026-06-21T00:00:00Z", "2026-07-01T00:00:00Z")])
        );
        // The newest 1,000 came: the rest is before them.
        assert_eq!(
            rest_of_full(win, t("2026-06-10T00:00:00Z"), t("2026-07-01T00:00:00Z")),
            Some(vec![w("2026-06-01T00:00:00Z", "2026-06-10T00:00:00Z")])
        );
        // Spanning the whole window: its halves.
        assert_eq!(
            rest_of_full(win, win.from, win.to),
            Some(vec![
                w("2026-06-01T00:00:00Z", "2026-06-16T00:00:00Z"),
                w("2026-06-16T00:00:00Z", "2026-07-01T00:00:00Z")
            ])
        );
        // All at the window's last instant: halves, never the window again.
        assert_eq!(
            rest_of_full(win, win.to, win.to),
            Some(vec![
                w("2026-06-01T00:00:00Z", "2026-06-16T00:00:00Z"),
                w("2026-06-16T00:00:00Z", "2026-07-01T00:00:00Z")
            ])
        );
        let instant = w("2026-06-01T00:00:00Z", "2026-06-01T00:00:00Z");
        assert_eq!(rest_of_full(instant, instant.from, instant.to), None);
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
