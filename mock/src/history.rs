/*!
Historical data (spec 4.2), served under the environment's historical address.

The seeded tapes report at a fixed interval for a year back from the mock's anchor (an
hour boundary before it started); their events are computed from the event's index
rather than stored, so a year of history every 30 minutes costs no memory.

The spec's limits and where the mock had to choose them:
- "up to 1 year": `from` more than [`MAX_AGE_DAYS`] days before now is refused (366, so
  a client asking exactly a year back is never refused for the milliseconds between
  its clock and ours);
- "at most 1 month": `to - from` over the reading's month ([`MAX_SPAN_DAYS`], 31 days,
  or 30: [`Readings::month_days`]) is refused;
- "or 1000 events": a range holding more answers 1000 of them, the oldest or the newest
  as the reading says ([`Readings::history_keeps`]), in ascending or descending time
  ([`Readings::history_order`]), so a client sees a full page and must ask again;
- "no time frame: the latest event"; `from` alone runs to now, `to` alone starts a
  month before it;
- "lags by about 15 minutes": events newer than [`LAG_SECS`] are not yet visible.
- `context.customer_id` and `context.authorized_groups` are typed uuid by the spec; the
  mock does not check their form (its demo account's ids are not uuids) but requires
  them equal to the headers.

Refusals are 400 in the shape of 4.2, `{data: {message, status}}`. It touches the
request and the readings.
*/

use serde_json::{json, Map, Value};

use super::readings::{HistoryKeeps, HistoryOrder, Readings};
use super::request::{OpRequest, Reply, MISSING_HEADERS};

/// The path segment under an environment that serves history.
pub const HISTORICAL_PREFIX: &str = "historical";
/// The fixed UUID that ends the history path (spec 4.2; the mock's own value).
pub const HISTORY_OPERATION_ID: &str = "3f2a9c4e-8b1d-4e6f-a7c2-5d9e0b1f6a38";
/// `data.version` of every answer.
pub const HISTORY_VERSION: &str = "1.2.0";
/// Events per answer at most.
pub const MAX_EVENTS: usize = 1000;
/// Longest time frame of one request, days, under the default reading (another reading
/// counts a month as 30: [`Readings::month_days`]).
pub const MAX_SPAN_DAYS: i64 = 31;
/// How far back `from` may reach, days.
pub const MAX_AGE_DAYS: i64 = 366;
/// Events younger than this are not yet visible.
pub const LAG_SECS: i64 = 15 * 60;
/// How far back the seeded history goes, days.
pub const SEEDED_DAYS: i64 = 365;

const DAY: i64 = 86_400;

/// A facility the seeded tapes pass: (lat, lon, location, location_detailed).
const PLACES: [(f64, f64, &str, &str); 4] = [
    (50.0379, 8.5622, "FRA Cargo Hub", "Cold room 2"),
    (25.2532, 55.3657, "Dubai, AE", "Dubai"),
    (1.3644, 103.9915, "SIN Changi Cargo", "Pharma zone B"),
    (35.7720, 140.3929, "Chiba, JP", "Narita"),
];

/// One seeded tape's history.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub qrcode: String,
    pub customer_asset_id: String,
    pub interval_secs: i64,
    /// The sensors active on the tape, among those of spec 2.1.
    pub sensors: Vec<&'static str>,
}

impl Series {
    /// Event `k` counted back from the anchor (`k = 0` is the newest).
    fn event(&self, anchor: i64, k: i64) -> Value {
        let at = anchor - k * self.interval_secs;
        let (lat, lon, location, detailed) = PLACES[((k / 48) % 4) as usize];
        let environment = k % 2 == 0 && !self.sensors.is_empty();
        let sensors: Vec<Value> = if environment {
            self.sensors
                .iter()
                .map(|t| {
                    let (data, units) = reading(t, k);
                    json!({"type": t, "data": data, "units": units})
                })
                .collect()
        } else {
            Vec::new()
        };
        let age_days = (anchor - at) / DAY;
        let battery = match (k % 7, age_days) {
            (3, _) => Value::Null,
            (_, d) if d > 200 => json!({"charge": "HIGH"}),
            (_, d) if d > 30 => json!({"charge": "MED"}),
            _ => json!({"charge": "LOW"}),
        };
        json!({
            "battery": battery,
            "customer_asset_id": self.customer_asset_id,
            "event_type": if environment { "environment" } else { "location" },
            "lat": lat,
            "lon": lon,
            "location": location,
            "location_detailed": detailed,
            "sensors": sensors,
            "timestamp": utc(at),
            "trk_asset_id": self.qrcode,
        })
    }

    fn is_environment(&self, k: i64) -> bool {
        k % 2 == 0 && !self.sensors.is_empty()
    }
}

/// A reading of sensor `t` in event `k`, and its units.
fn reading(t: &str, k: i64) -> (f64, &'static str) {
    let wave = (k % 10) as f64;
    match t {
        "ambient_temp" => (4.0 + wave * 0.1, "°C"),
        "probe_temp" => (3.5 + wave * 0.1, "°C"),
        "shock" => (if k % 97 == 0 { 2.5 } else { 0.0 }, "g"),
        "humidity" => (55.0 + (k % 7) as f64, "%"),
        "pressure" => (101_325.0 - (k % 5) as f64 * 10.0, "Pa"),
        _ => ((k % 3) as f64 * 100.0, "lx"),
    }
}

fn utc(at: i64) -> String {
    jiff::Timestamp::from_second(at)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The seeded history: every series counts back from `anchor` (epoch seconds).
#[derive(Debug, Default)]
pub(crate) struct HistorySeed {
    pub(crate) anchor: i64,
    pub(crate) series: Vec<Series>,
}

/// The 400 of spec 4.2.
fn refuse(message: &str) -> Reply {
    Reply::json(
        400,
        &json!({"data": {"message": message, "status": "BAD_REQUEST"}}),
    )
}

fn parse_time(filters: &Map<String, Value>, key: &str) -> Result<Option<i64>, Reply> {
    match filters.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => s
            .parse::<jiff::Timestamp>()
            .map(|t| Some(t.as_second()))
            .map_err(|_| {
                refuse(&format!(
                    "filters.{key} must be an RFC 3339 date-time in UTC, not {s}"
                ))
            }),
        Some(other) => Err(refuse(&format!(
            "filters.{key} must be a string, not {other}"
        ))),
    }
}

fn context_str<'a>(context: &'a Map<String, Value>, key: &str) -> Result<&'a str, Reply> {
    context
        .get(key)
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| refuse(&format!("Missing mandatory parameter: context.{key}")))
}

/// What a history request asks, checked.
struct Query<'a> {
    /// The series asked for (by tape or by asset).
    pick: Box<dyn Fn(&Series) -> bool + 'a>,
    /// Only environment events (`Some(true)`), only location events, or both.
    environment: Option<bool>,
    /// The time frame, epoch seconds, both ends inclusive; `None`: the latest event.
    range: Option<(i64, i64)>,
    /// Events newer than this are not yet visible.
    visible_until: i64,
    /// The account headers name this environment's account.
    mine: bool,
}

/// `POST {historical_base_url}agent-service/v1/agent/exec/{uuid}`.
pub(crate) fn history(h: &HistorySeed, readings: Readings, req: &OpRequest<'_>) -> Reply {
    if req.arg != HISTORY_OPERATION_ID {
        return Reply::error(404, "Not found");
    }
    if !req.has_account_headers() {
        return refuse(MISSING_HEADERS);
    }
    let filters = match filters(req) {
        Ok(f) => f,
        Err(answer) => return answer,
    };
    let q = match query(req, &filters, readings) {
        Ok(q) => q,
        Err(answer) => return answer,
    };
    let events = events(h, &q, readings);
    Reply::json(
        200,
        &json!({"data": {"events": events, "version": HISTORY_VERSION}}),
    )
}

/// `context.filters` of the body, the context's account checked against the headers.
fn filters(req: &OpRequest<'_>) -> Result<Map<String, Value>, Reply> {
    let body = req.json_body()?;
    let Some(context) = body.get("context").and_then(Value::as_object) else {
        return Err(refuse("Missing mandatory parameter: context"));
    };
    let customer = context_str(context, "customer_id");
    let groups = context_str(context, "authorized_groups");
    let (customer, groups) = (customer?, groups?);
    if req.header("customer_id").as_deref() != Some(customer)
        || req.header("authorized_groups").as_deref() != Some(groups)
    {
        return Err(refuse(
            "context.customer_id and context.authorized_groups must match the headers",
        ));
    }
    let Some(filters) = context.get("filters").and_then(Value::as_object) else {
        return Err(refuse("Missing mandatory parameter: context.filters"));
    };
    Ok(filters.clone())
}

/// The filters read, with the limits of spec 4.2 under the reading's month.
fn query<'a>(
    req: &OpRequest<'_>,
    filters: &'a Map<String, Value>,
    readings: Readings,
) -> Result<Query<'a>, Reply> {
    const KNOWN: [&str; 5] = [
        "trk_asset_id",
        "customer_asset_id",
        "event_type",
        "from",
        "to",
    ];
    if let Some(k) = filters.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(refuse(&format!("Unknown filter: {k}")));
    }
    let by_qr = filters.get("trk_asset_id").and_then(Value::as_str);
    let by_asset = filters.get("customer_asset_id").and_then(Value::as_str);
    let pick: Box<dyn Fn(&Series) -> bool + 'a> = match (by_qr, by_asset) {
        (Some(q), None) => Box::new(move |s: &Series| s.qrcode == q),
        (None, Some(a)) => Box::new(move |s: &Series| s.customer_asset_id == a),
        _ => {
            return Err(refuse(
                "Exactly one of filters.trk_asset_id and filters.customer_asset_id (strings) is required",
            ))
        }
    };
    let environment = match filters.get("event_type").map(|v| v.as_str()) {
        None => None,
        Some(Some("location")) => Some(false),
        Some(Some("environment")) => Some(true),
        Some(_) => return Err(refuse("filters.event_type must be location or environment")),
    };
    let from = parse_time(filters, "from");
    let to = parse_time(filters, "to");
    let (from, to) = (from?, to?);
    let now = jiff::Timestamp::try_from(req.now)
        .map(|t| t.as_second())
        .unwrap_or_default();
    let month = readings.month_days;
    let range = match (from, to) {
        (None, None) => None,
        (Some(f), t) => Some((f, t.unwrap_or(now))),
        (None, Some(t)) => Some((t - month * DAY, t)),
    };
    if let Some((f, t)) = range {
        if f > t {
            return Err(refuse("filters.from is after filters.to"));
        }
        if t - f > month * DAY {
            return Err(refuse(&format!(
                "The time frame is over one month ({month} days); split the request"
            )));
        }
        if f < now - MAX_AGE_DAYS * DAY {
            return Err(refuse("History is available for up to one year"));
        }
    }
    Ok(Query {
        pick,
        environment,
        range,
        visible_until: now - LAG_SECS,
        mine: req.is_account(),
    })
}

/// The events `q` asks for: at most [`MAX_EVENTS`], the end the reading keeps, in the
/// reading's order.
fn events(h: &HistorySeed, q: &Query<'_>, readings: Readings) -> Vec<Value> {
    let mut events = Vec::new();
    for series in h.series.iter().filter(|s| q.mine && (q.pick)(s)) {
        let newest_k = ceil_div(h.anchor - q.visible_until, series.interval_secs).max(0);
        let oldest_k = SEEDED_DAYS * DAY / series.interval_secs;
        let wanted = |k: &i64| {
            q.environment
                .is_none_or(|env| series.is_environment(*k) == env)
        };
        match q.range {
            None => {
                if let Some(k) = (newest_k..=oldest_k).find(|k| wanted(k)) {
                    events.push((
                        h.anchor - k * series.interval_secs,
                        series.event(h.anchor, k),
                    ));
                }
            }
            Some((f, t)) => {
                // Event k is at anchor - k * interval: k in [anchor - t, anchor - f] / interval.
                let lo = ceil_div(h.anchor - t, series.interval_secs).max(newest_k);
                let hi = ((h.anchor - f).div_euclid(series.interval_secs)).min(oldest_k);
                let ks: Box<dyn Iterator<Item = i64>> = match readings.history_keeps {
                    // A larger k is older: oldest first.
                    HistoryKeeps::Oldest => Box::new((lo..=hi).rev()),
                    HistoryKeeps::Newest => Box::new(lo..=hi),
                };
                for k in ks.filter(|k| wanted(k)).take(MAX_EVENTS) {
                    events.push((
                        h.anchor - k * series.interval_secs,
                        series.event(h.anchor, k),
                    ));
                }
            }
        }
    }
    // The kept end of the range first, then cut, then in the reading's order.
    events.sort_by_key(|(at, _)| *at);
    if readings.history_keeps == HistoryKeeps::Newest {
        events.reverse();
    }
    events.truncate(MAX_EVENTS);
    events.sort_by_key(|(at, _)| *at);
    if readings.history_order == HistoryOrder::Descending {
        events.reverse();
    }
    events.into_iter().map(|(_, e)| e).collect()
}

fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_div_rounds_up_for_both_signs() {
        assert_eq!(ceil_div(7, 2), 4);
        assert_eq!(ceil_div(-7, 2), -3);
        assert_eq!(ceil_div(6, 2), 3);
    }

    #[test]
    fn timestamps_are_utc_with_z() {
        assert_eq!(utc(1_763_719_200), "2025-11-21T10:00:00Z");
    }
}
