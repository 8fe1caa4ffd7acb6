//! `tapegate dead-letters list | retry | purge`: what the service refused for good, read
//! beside the running daemon, re-queued or dropped.

use std::io::Write;

use super::tapes::rows;
use super::CmdError;
use crate::clock::rfc3339;
use crate::config::Config;
use crate::outbox::{DeadLetterDesk, OutboxError};
use crate::record::Mac;
use crate::util::text::{shown, SHOWN_MAX_CHARS};

/// Prints `tapegate dead-letters list`.
pub fn list(
    config: &Config,
    json: bool,
    limit: usize,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let Some(rows) = rows(config, json, "no dead letters", out, |s| {
        s.dead_letters(limit)
    })?
    else {
        return Ok(());
    };
    writeln!(
        out,
        "{:<8} {:<17} {:<20} {:<20} error",
        "id", "mac", "captured", "refused"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<8} {:<17} {:<20} {:<20} {}",
            r.id,
            r.mac,
            rfc3339(r.captured_at),
            rfc3339(r.dead_at),
            shown(&r.error, SHOWN_MAX_CHARS)
        )?;
    }
    Ok(())
}

/// `tapegate dead-letters retry | purge`: returns how many rows were affected.
pub fn change(config: &Config, retry: bool, mac: Option<Mac>) -> Result<u64, OutboxError> {
    match DeadLetterDesk::open(&config.gateway.state_dir)? {
        Some(mut desk) if retry => desk.retry(mac),
        Some(mut desk) => desk.purge(mac),
        None => Ok(0),
    }
}
