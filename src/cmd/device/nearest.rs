//! `device add --nearest` (activation at the dock): the unknown tape the daemon heard
//! loudest in the last [`NEAREST_WINDOW_MS`], when it is [`NEAREST_MARGIN_DB`] louder
//! than the next; otherwise the candidates, and exit 1. It may touch the state
//! database's tapes heard, read-only.

use std::io::Write;

use serde::Serialize;

use super::shared::{print_json, Added};
use crate::clock::Clock;
use crate::cmd::operator_run::state;
use crate::cmd::CmdError;
use crate::config::Config;
use crate::side_tables::HeardTape;

/// `--nearest` considers tapes heard in this window...
pub const NEAREST_WINDOW_MS: i64 = 30_000;
/// ...and takes the loudest only when it is this much louder than the next.
pub const NEAREST_MARGIN_DB: i16 = 10;

/// How `--nearest` chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nearest {
    Chosen(HeardTape),
    /// No single tape stands out: the candidates, loudest first.
    Unclear(Vec<HeardTape>),
}

/// The unknown tape heard loudest at or after `since`, when it is at least
/// [`NEAREST_MARGIN_DB`] louder than the next unknown one. `heard` is loudest first.
pub fn choose_nearest(heard: &[HeardTape], since: i64) -> Nearest {
    let candidates: Vec<HeardTape> = heard
        .iter()
        .filter(|h| h.known == Some(false) && h.last_at >= since && h.best_rssi.is_some())
        .cloned()
        .collect();
    match candidates.as_slice() {
        [only] => Nearest::Chosen(only.clone()),
        [first, second, ..]
            if first.best_rssi.unwrap_or(i16::MIN)
                >= second.best_rssi.unwrap_or(i16::MIN) + NEAREST_MARGIN_DB =>
        {
            Nearest::Chosen(first.clone())
        }
        _ => Nearest::Unclear(candidates),
    }
}

/// What `--nearest` found, for `--json`.
#[derive(Serialize)]
pub(super) struct NearestPrinted<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nearest: Option<&'a HeardTape>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub candidates: &'a [HeardTape],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub added: Option<&'a Added>,
}

/// The tape `--nearest` picks, or the error (after printing the candidates).
pub(super) fn nearest(
    config: &Config,
    clock: &dyn Clock,
    json: bool,
    out: &mut dyn Write,
) -> Result<HeardTape, CmdError> {
    let store = state(config)?;
    let since = clock.wall_ms() - NEAREST_WINDOW_MS;
    let candidates = match choose_nearest(&store.heard_since(since)?, since) {
        Nearest::Chosen(h) => {
            if !json {
                writeln!(
                    out,
                    "nearest unknown tape: {} ({} dBm)",
                    h.mac,
                    h.best_rssi.unwrap_or_default()
                )?;
            }
            return Ok(h);
        }
        Nearest::Unclear(c) => c,
    };
    let error = if candidates.is_empty() {
        format!(
            "--nearest: no tape unknown to the service was heard in the last {} s (is the daemon running and the tape beside the gateway?)",
            NEAREST_WINDOW_MS / 1000
        )
    } else {
        format!(
            "--nearest: {} candidate tapes, none {NEAREST_MARGIN_DB} dB louder than the others; move the one to activate closer, or give --tape-id",
            candidates.len()
        )
    };
    if json {
        print_json(
            out,
            &NearestPrinted {
                nearest: None,
                candidates: &candidates,
                error: Some(error.clone()),
                added: None,
            },
        )?;
    } else if !candidates.is_empty() {
        writeln!(
            out,
            "no tape is {NEAREST_MARGIN_DB} dB louder than the others; candidates heard in the last {} s:",
            NEAREST_WINDOW_MS / 1000
        )?;
        writeln!(out, "{:<17} {:>5}", "mac", "rssi")?;
        for h in &candidates {
            writeln!(out, "{:<17} {:>5}", h.mac, h.best_rssi.unwrap_or_default())?;
        }
    }
    Err(CmdError::Failed(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(mac: &str, rssi: i16, known: Option<bool>) -> HeardTape {
        HeardTape {
            mac: mac.parse().unwrap(),
            last_at: 1_000,
            best_rssi: Some(rssi),
            best_at: 1_000,
            known,
        }
    }

    #[test]
    fn nearest_takes_the_loudest_unknown_tape_only_ten_db_ahead() {
        let a = heard("C0:DE:AD:00:00:01", -50, Some(false));
        let b = heard("C0:DE:AD:00:00:02", -60, Some(false));
        let known = heard("C0:FF:EE:00:00:01", -40, Some(true));
        assert_eq!(
            choose_nearest(&[known.clone(), a.clone(), b.clone()], 0),
            Nearest::Chosen(a.clone())
        );
        let close = heard("C0:DE:AD:00:00:02", -54, Some(false));
        assert_eq!(
            choose_nearest(&[a.clone(), close.clone()], 0),
            Nearest::Unclear(vec![a.clone(), close])
        );
        // Heard before the window: not a candidate.
        assert_eq!(choose_nearest(&[a], 2_000), Nearest::Unclear(vec![]));
    }
}
