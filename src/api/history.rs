//! Historical data (spec 4.2): events of one tape (`trk_asset_id`) or one customer
//! asset (`customer_asset_id`), from `historical_base_url`, which is not `base_url`.
//!
//! One request returns at most one month or 1,000 events, and history reaches back one
//! year, so a range is split ([`month_windows`], pure, `now` passed in): calendar months
//! in UTC, the first starting at `from`, the last ending at `to`. A window that returns
//! 1,000 events is asked again from its last event on (the service returns the oldest
//! events of a range), until it returns fewer. The events are merged, duplicates (the
//! boundaries overlap) dropped, and put in time order.

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
use super::{join, ApiError};

/// Events one request returns at most (spec 4.2).
pub const MAX_EVENTS_PER_REQUEST: usize = 1000;
/// How far back history reaches (spec 4.2: one year).
pub const MAX_AGE_DAYS: i64 = 365;
/// Requests of one history read at most (a year of dense history is a few dozen).
const MAX_REQUESTS: usize = 200;

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

/// One request's time frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryWindow {
    pub from: Timestamp,
    pub to: Timestamp,
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
    /// The events of `q`, merged and in time order, and the number of requests sent.
    pub async fn history(
        &self,
        q: &HistoryQuery,
        now: Timestamp,
    ) -> Result<(Vec<HistoricalEvent>, usize), OperatorError> {
        let windows = month_windows(q.from, q.to, now).map_err(OperatorError::Usage)?;
        let mut parts = Vec::new();
        let mut requests = 0;
        let Some(windows) = windows else {
            parts.push(self.history_request(q, None).await?);
            return Ok((merge(parts), 1));
        };
        for w in windows {
            let mut window = w;
            loop {
                requests += 1;
                if requests > MAX_REQUESTS {
                    return Err(OperatorError::Refused(format!(
                        "history needs more than {MAX_REQUESTS} requests; ask for a shorter range"
                    )));
                }
                let events = self.history_request(q, Some(window)).await?;
                let full = events.len() >= MAX_EVENTS_PER_REQUEST;
                let last = events.iter().map(|e| e.timestamp).max();
                parts.push(events);
                match last {
                    // The oldest 1,000 came: the rest of the window from the last on.
                    Some(last) if full && last > window.from && last < window.to => {
                        window.from = last;
                    }
                    _ => break,
                }
            }
        }
        Ok((merge(parts), requests))
    }

    async fn history_request(
        &self,
        q: &HistoryQuery,
        window: Option<HistoryWindow>,
    ) -> Result<Vec<HistoricalEvent>, OperatorError> {
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
        let body = Bytes::from(body.to_string());
        let a = self
            .send_safe("history", Method::POST, &url, Some(body))
            .await?;
        match a.status {
            StatusCode::OK => parse_events(&a.body),
            StatusCode::BAD_REQUEST => {
                let m = assumed::history_error_message(&a.body).unwrap_or(a.message);
                Err(OperatorError::Refused(format!(
                    "the service refused the history request: {m}"
                )))
            }
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
