//! `tapegate history (--qr Q | --asset A) [--type location|environment] [--from T]
//! [--to T]`: a tape's or an asset's events (spec 4.2), split, merged and in time
//! order by the client.

use std::io::Write;

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::device::operator;
use super::CmdError;
use crate::api::{HistoryFilter, HistoryQuery};
use crate::config::Config;

/// `2026-05-01T00:00:00Z` (RFC 3339) or `2026-05-01` (midnight UTC).
pub fn parse_time(flag: &str, v: &str) -> Result<Timestamp, CmdError> {
    if let Ok(t) = v.parse::<Timestamp>() {
        return Ok(t);
    }
    v.parse::<jiff::civil::Date>()
        .ok()
        .and_then(|d| d.to_zoned(TimeZone::UTC).ok())
        .map(|z| z.timestamp())
        .ok_or_else(|| {
            CmdError::Usage(format!(
                "{flag} {v:?}: expected RFC 3339 (2026-05-01T00:00:00Z) or a date (2026-05-01)"
            ))
        })
}

/// The options of `tapegate history`.
pub struct HistoryArgs<'a> {
    pub qr: Option<&'a str>,
    pub asset: Option<&'a str>,
    pub event_type: Option<&'a str>,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub json: bool,
}

pub async fn run(config: &Config, a: HistoryArgs<'_>, out: &mut dyn Write) -> Result<(), CmdError> {
    let filter = match (a.qr, a.asset) {
        (Some(q), None) => HistoryFilter::Tape(q.to_string()),
        (None, Some(x)) => HistoryFilter::Asset(x.to_string()),
        _ => {
            return Err(CmdError::Usage(
                "give exactly one of --qr and --asset".into(),
            ))
        }
    };
    let query = HistoryQuery {
        filter,
        event_type: a.event_type.map(str::to_string),
        from: a.from.map(|v| parse_time("--from", v)).transpose()?,
        to: a.to.map(|v| parse_time("--to", v)).transpose()?,
    };
    let (events, requests) = operator(config)?.history(&query, Timestamp::now()).await?;
    if a.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&events).unwrap_or_default()
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<21} {:<12} {:<8} {:<24} {:<20} sensors",
        "time (UTC)", "event", "battery", "where", "location"
    )?;
    // What the service says is shown inert: no escape sequence or bidi override acts.
    let t = |s: &str| crate::text::shown(s, crate::text::SHOWN_MAX_CHARS);
    for e in &events {
        let sensors: Vec<String> = e
            .sensors
            .iter()
            .map(|s| format!("{}={}{}", s.kind, s.data, s.units))
            .collect();
        writeln!(
            out,
            "{:<21} {:<12} {:<8} {:<24} {:<20} {}",
            e.timestamp.to_string(),
            t(&e.event_type),
            t(e.battery.as_ref().map_or("-", |b| b.charge.as_str())),
            t(&e.location_detailed),
            t(&e.location),
            t(&sensors.join(" "))
        )?;
    }
    writeln!(out, "{} event(s) in {requests} request(s)", events.len())?;
    Ok(())
}
