//! `tapegate history (--qr Q | --asset A) [--type location|environment] [--from T]
//! [--to T]`: a tape's or an asset's events (spec 4.2), split, merged and in time
//! order by the client. A read that could not be completed prints what it has, names
//! the windows missing on stderr, and exits 1.

use std::io::Write;

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::operator_run::{interrupts, operator_on, Console};
use super::CmdError;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::operator::{
    check_id, HistoricalEvent, HistoryFilter, HistoryQuery, HistoryRead, ReadingMark,
};
use crate::util::text::shown;

const CELL: usize = 40;

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

pub async fn run(
    config: &Config,
    clock: &SharedClock,
    a: HistoryArgs<'_>,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let filter = match (a.qr, a.asset) {
        (Some(q), None) => {
            check_id("--qr", q).map_err(CmdError::Usage)?;
            HistoryFilter::Tape(q.to_string())
        }
        (None, Some(x)) => {
            check_id("--asset", x).map_err(CmdError::Usage)?;
            HistoryFilter::Asset(x.to_string())
        }
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
    let console = Console::stderr();
    let operator = operator_on(config, clock, &console)?.with_interrupt(interrupts(&console));
    let now = crate::clock::timestamp(clock.wall_ms());
    let read = match operator.history(&query, now).await {
        Ok(r) => r,
        Err(e) => {
            let e = CmdError::from(e);
            if a.json && !matches!(e, CmdError::Usage(_)) {
                writeln!(out, "{:#}", serde_json::json!({"error": e.to_string()}))?;
            }
            return Err(e);
        }
    };
    print(&read, a.json, out)?;
    for w in &read.incomplete {
        console.say(&format!("history incomplete: {w}"));
    }
    if !read.incomplete.is_empty() {
        return Err(CmdError::Failed(format!(
            "history: {} window(s) could not be completed; the {} event(s) printed are not all",
            read.incomplete.len(),
            read.events.len()
        )));
    }
    Ok(())
}

fn sensors_cell(e: &HistoricalEvent) -> String {
    let sensors: Vec<String> = e
        .sensors
        .iter()
        .map(|s| {
            let mark = match s.mark() {
                ReadingMark::Unavailable => "(unavailable)",
                _ => "",
            };
            format!(
                "{}={}{}{mark}",
                shown(&s.kind, CELL),
                s.data,
                shown(&s.units, CELL)
            )
        })
        .collect();
    sensors.join(" ")
}

fn print(read: &HistoryRead, json: bool, out: &mut dyn Write) -> Result<(), CmdError> {
    if json {
        let text = serde_json::to_string_pretty(&read.events)
            .map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
        writeln!(out, "{text}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<21} {:<12} {:<8} {:<24} {:<20} sensors",
        "time (UTC)", "event", "battery", "where", "location"
    )?;
    for e in &read.events {
        writeln!(
            out,
            "{:<21} {:<12} {:<8} {:<24} {:<20} {}",
            e.timestamp.to_string(),
            shown(&e.event_type, CELL),
            shown(e.battery.as_ref().map_or("-", |b| b.charge.as_str()), CELL),
            shown(&e.location_detailed, CELL),
            shown(&e.location, CELL),
            sensors_cell(e)
        )?;
    }
    writeln!(
        out,
        "{} event(s) in {} request(s)",
        read.events.len(),
        read.requests
    )?;
    Ok(())
}
