//! `tapegate tapes`: the latest reading of each tape, read from the state database
//! beside the running daemon, for a person or as JSON; and the reading of rows that
//! `dead-letters list` shares.

use std::io::Write;

use serde::Serialize;

use super::status::ago;
use super::CmdError;
use crate::clock::Clock;
use crate::config::Config;
use crate::outbox::{OutboxError, StateReader};
use crate::util::text::{shown, SHOWN_MAX_CHARS};

/// Reads rows from the state database. Prints them as JSON, or `empty` when there are
/// none, and returns `None` then; otherwise returns them for a table.
pub(super) fn rows<T: Serialize>(
    config: &Config,
    json: bool,
    empty: &str,
    out: &mut dyn Write,
    read: impl FnOnce(&StateReader) -> Result<Vec<T>, OutboxError>,
) -> Result<Option<Vec<T>>, CmdError> {
    let rows = match StateReader::open_read_only(&config.gateway.state_dir)? {
        Some(store) => read(&store)?,
        None => Vec::new(),
    };
    if json {
        let text = serde_json::to_string_pretty(&rows).unwrap_or_default();
        writeln!(out, "{text}")?;
        return Ok(None);
    }
    if rows.is_empty() {
        writeln!(out, "{empty}")?;
        return Ok(None);
    }
    Ok(Some(rows))
}

/// Prints `tapegate tapes`: the latest reading of each tape, most recently captured first.
pub fn tapes(
    config: &Config,
    clock: &dyn Clock,
    json: bool,
    limit: usize,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let Some(rows) = rows(config, json, "no decoded tapes yet", out, |s| {
        s.tapes(limit)
    })?
    else {
        return Ok(());
    };
    let now = clock.wall_ms();
    writeln!(
        out,
        "{:<16} {:<17} {:>8} {:>8} {:>5}  last seen",
        "qr code", "mac", "temp °C", "battery", "rssi"
    )?;
    for t in rows {
        let num = |v: Option<f64>, digits: usize| {
            v.map(|x| format!("{x:.digits$}"))
                .unwrap_or_else(|| "-".into())
        };
        writeln!(
            out,
            "{:<16} {:<17} {:>8} {:>8} {:>5}  {}",
            shown(t.qr_code.as_deref().unwrap_or("-"), SHOWN_MAX_CHARS),
            t.mac,
            num(t.temp, 2),
            num(t.bat, 0),
            t.rssi.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            ago(t.captured_at, now)
        )?;
    }
    Ok(())
}
