//! `tapegate locate ASSET_ID [--sensor]`: the latest location of an AWB, or the latest
//! sensor reading of an asset, with its six readings and their units (spec 4.1, 2.1).

use std::io::Write;

use super::device::operator;
use super::CmdError;
use crate::api::LocationEvent;
use crate::config::Config;

/// Prints the event; `Err(Failed)` (exit 1) when there is none.
pub async fn run(
    config: &Config,
    asset_id: &str,
    sensor: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let event = operator(config)?.locate(asset_id, sensor).await?;
    let Some(event) = event else {
        if json {
            writeln!(out, "null")?;
        }
        return Err(CmdError::Failed(if sensor {
            format!("{asset_id}: no current reading (the service has no positioned event of that asset barcode)")
        } else {
            format!("{asset_id}: AWB not found (asked twice: no tag on it has a positioned event)")
        }));
    };
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&event).unwrap_or_default()
        )?;
        return Ok(());
    }
    print(&event, out)?;
    Ok(())
}

fn print(event: &LocationEvent, out: &mut dyn Write) -> Result<(), CmdError> {
    // What the service says is shown inert: no escape sequence or bidi override acts.
    let t = |s: &str| crate::text::shown(s, crate::text::SHOWN_MAX_CHARS);
    for a in &event.assets {
        writeln!(
            out,
            "{} (tag {}): {} at {} {} — {}, {} ({:.5}, {:.5})",
            t(a.trk_asset_id.as_deref().unwrap_or("(no asset barcode)")),
            t(a.vendor_asset_id.as_deref().unwrap_or("-")),
            t(&a.event_type),
            t(&a.timestamp),
            t(&a.time_zone),
            t(&a.location_detailed),
            t(&a.location),
            a.lat,
            a.lon
        )?;
        for s in a.sensors.iter().flatten() {
            writeln!(out, "  {:<13} {:>10} {}", t(&s.kind), s.data, t(&s.units))?;
        }
    }
    Ok(())
}
