//! `tapegate locate ASSET_ID [--sensor]`: the latest location of an AWB, or the latest
//! sensor reading of an asset, with its six readings and their units (spec 4.1, 2.1).
//! A reading of 0 is marked: the service sends 0 for a value the device did not report.

use std::io::Write;

use serde::Serialize;

use super::operator_run::{interrupts, operator_on, Console};
use super::CmdError;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::operator::{LocationEvent, ReadingMark, SensorReading};
use crate::util::text::shown;

const CELL: usize = 60;

/// A reading as `--json` prints it: the service's, and what its value says.
#[derive(Serialize)]
struct Reading<'a> {
    #[serde(flatten)]
    reading: &'a SensorReading,
    /// `zero_or_unreported` (spec 2.1: 0 is sent for a value not reported) or
    /// `unavailable` (-255, an older description); absent for another value.
    #[serde(skip_serializing_if = "Option::is_none")]
    mark: Option<&'static str>,
}

fn mark_name(r: &SensorReading) -> Option<&'static str> {
    match r.mark() {
        ReadingMark::Value => None,
        ReadingMark::ZeroOrUnreported => Some("zero_or_unreported"),
        ReadingMark::Unavailable => Some("unavailable"),
    }
}

/// Prints the event; `Err(Failed)` (exit 1) when there is none.
pub async fn run(
    config: &Config,
    clock: &SharedClock,
    asset_id: &str,
    sensor: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let console = Console::stderr();
    let operator = operator_on(config, clock, &console)?.with_interrupt(interrupts(&console));
    let event = match operator.locate(asset_id, sensor).await {
        Ok(e) => e,
        Err(e) => {
            let e = CmdError::from(e);
            if json && !matches!(e, CmdError::Usage(_)) {
                writeln!(out, "{:#}", serde_json::json!({"error": e.to_string()}))?;
            }
            return Err(e);
        }
    };
    let Some(event) = event else {
        if json {
            writeln!(out, "null")?;
        }
        let id = shown(asset_id, CELL);
        return Err(CmdError::Failed(if sensor {
            format!("{id}: no current reading (asked twice: the service has no positioned event of that asset barcode)")
        } else {
            format!("{id}: AWB not found (asked twice: no tag on it has a positioned event)")
        }));
    };
    if json {
        print_json(&event, out)?;
    } else {
        print(&event, out)?;
    }
    Ok(())
}

fn print_json(event: &LocationEvent, out: &mut dyn Write) -> Result<(), CmdError> {
    let mut v =
        serde_json::to_value(event).map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
    for (a, asset) in event.assets.iter().enumerate() {
        for (i, r) in asset.sensors.iter().flatten().enumerate() {
            let marked = Reading {
                reading: r,
                mark: mark_name(r),
            };
            v["assets"][a]["sensors"][i] = serde_json::to_value(&marked)
                .map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
        }
    }
    let text =
        serde_json::to_string_pretty(&v).map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
    writeln!(out, "{text}")?;
    Ok(())
}

fn print(event: &LocationEvent, out: &mut dyn Write) -> Result<(), CmdError> {
    for a in &event.assets {
        writeln!(
            out,
            "{} (tag {}): {} at {} {} — {}, {} ({:.5}, {:.5})",
            shown(
                a.trk_asset_id.as_deref().unwrap_or("(no asset barcode)"),
                CELL
            ),
            shown(a.vendor_asset_id.as_deref().unwrap_or("-"), CELL),
            shown(&a.event_type, CELL),
            shown(&a.timestamp, CELL),
            shown(&a.time_zone, CELL),
            shown(&a.location_detailed, CELL),
            shown(&a.location, CELL),
            a.lat,
            a.lon
        )?;
        for s in a.sensors.iter().flatten() {
            let mark = match s.mark() {
                ReadingMark::Value => "",
                ReadingMark::ZeroOrUnreported => "  (0: not reported, or a reading of 0)",
                ReadingMark::Unavailable => "  (unavailable)",
            };
            writeln!(
                out,
                "  {:<13} {:>10} {}{mark}",
                shown(&s.kind, CELL),
                s.data,
                shown(&s.units, CELL)
            )?;
        }
    }
    Ok(())
}
