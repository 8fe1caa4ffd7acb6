//! `tapegate status`: the gateway's state for a person or as one JSON document, read
//! from the state database beside the running daemon (WAL lets it read on its own short
//! connection). It touches the state database and the config.

use std::io::Write;

use serde::Serialize;

use super::CmdError;
use crate::clock::{age, rfc3339, Clock};
use crate::config::Config;
use crate::outbox::{ScannerCounts, StateReader, Stats};
use crate::record::EpochMillis;
use crate::util::text::{inert, SHOWN_MAX_CHARS};

/// `tapegate status --json`: the contract fields of DESIGN.md and a few more.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    pub gateway_id: String,
    pub database: String,
    pub database_exists: bool,
    pub pending: u64,
    pub delivered: u64,
    pub dead_letters: u64,
    pub dead_letters_stored: u64,
    pub evicted: u64,
    /// `evicted` by the bound that evicted: `max_pending`, `max_age`, `max_bytes`.
    pub evicted_by: crate::outbox::Evictions,
    /// Bytes of the state database's pages in use (bounded by `outbox.max_bytes`).
    pub database_bytes: u64,
    pub admitted: u64,
    /// Seconds since the capture time of the oldest pending capture.
    pub oldest_pending_age_secs: Option<u64>,
    /// RFC 3339 UTC.
    pub last_flush_ok_at: Option<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    pub tapes: u64,
    /// Batches in flight to the service, as the flusher last recorded it.
    pub in_flight: Option<u64>,
    /// The flusher's concurrency limit now (adaptive, at most `flush.max_in_flight`).
    pub concurrency_limit: Option<u64>,
    /// The BLE scanner's liveness ladder, accumulated across restarts of the daemon.
    pub scanner: ScannerCounts,
    /// Why the scanner's ladder last started.
    pub scanner_last_trouble: Option<String>,
    pub scanner_last_trouble_at: Option<String>,
    /// Where the BLE source reads adverts: `mgmt` (the kernel's management socket,
    /// beside bluetoothd) or `dbus` (BlueZ's signals), as it last said.
    pub scanner_adverts: Option<String>,
    /// Advertising reports per second heard by the BLE source, over the minute to
    /// `scanner_reports_at` (RFC 3339).
    pub scanner_reports_per_sec: Option<f64>,
    pub scanner_reports_at: Option<String>,
    /// The clock as the daemon judged it, e.g. "unsynchronised, no time service: trusted".
    pub clock: Option<String>,
    /// Pending captures held from delivery until the clock is trusted.
    pub held: u64,
    /// Captures re-timed from boot time when the clock synced.
    pub clock_repaired: u64,
    /// Captures sent with their best estimate (an earlier boot that never synced, or
    /// the maximum hold passed).
    pub clock_estimated: u64,
    /// What the daemon that last ran on this state directory is and runs (version,
    /// commit, config hash, boot, kernel, BlueZ, adapter), with its uptime while it runs.
    pub inventory: Option<InventoryStatus>,
}

/// The recorded inventory and whether its daemon still runs.
#[derive(Debug, Serialize)]
pub struct InventoryStatus {
    #[serde(flatten)]
    pub inventory: crate::inventory::Inventory,
    /// Whether that daemon still runs (same boot, process alive).
    pub running: bool,
    /// Seconds since it started, while it runs.
    pub uptime_secs: Option<u64>,
}

impl InventoryStatus {
    pub fn new(inventory: crate::inventory::Inventory, now: EpochMillis) -> InventoryStatus {
        let running = inventory.daemon_running();
        InventoryStatus {
            running,
            uptime_secs: running.then(|| ((now - inventory.started_at_ms).max(0) / 1000) as u64),
            inventory,
        }
    }
}

impl StatusJson {
    pub fn new(config: &Config, stats: Option<&Stats>, now: EpochMillis) -> StatusJson {
        let s = stats.cloned().unwrap_or_default();
        StatusJson {
            gateway_id: config.gateway.id.clone(),
            database: StateReader::path_in(&config.gateway.state_dir)
                .display()
                .to_string(),
            database_exists: stats.is_some(),
            pending: s.pending,
            delivered: s.delivered,
            dead_letters: s.dead_letters,
            dead_letters_stored: s.dead_letters_stored,
            evicted: s.evicted,
            evicted_by: s.evicted_by,
            database_bytes: s.database_bytes,
            admitted: s.admitted,
            oldest_pending_age_secs: s
                .oldest_pending_at
                .map(|t| ((now - t).max(0) / 1000) as u64),
            last_flush_ok_at: s.last_flush_ok_at.map(rfc3339),
            last_error: s.last_error,
            last_error_at: s.last_error_at.map(rfc3339),
            tapes: s.tapes,
            in_flight: s.flush_in_flight,
            concurrency_limit: s.flush_concurrency,
            scanner: s.scanner,
            scanner_last_trouble: s.scanner_last_trouble,
            scanner_last_trouble_at: s.scanner_last_trouble_at.map(rfc3339),
            scanner_adverts: s.scanner_adverts,
            scanner_reports_per_sec: s.scanner_reports_per_sec,
            scanner_reports_at: s.scanner_reports_at.map(rfc3339),
            clock: s.clock.state,
            held: s.clock.held,
            clock_repaired: s.clock.repaired,
            clock_estimated: s.clock.estimated,
            inventory: None,
        }
    }
}

fn bounded(s: &str) -> String {
    crate::util::text::bounded(s, SHOWN_MAX_CHARS)
}

pub(super) fn ago(at: EpochMillis, now: EpochMillis) -> String {
    format!(
        "{} ({} ago)",
        rfc3339(at),
        age(((now - at).max(0) / 1000) as u64)
    )
}

/// Prints `tapegate status`.
pub fn status(
    config: &Config,
    clock: &dyn Clock,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let store = StateReader::open_read_only(&config.gateway.state_dir)?;
    let stats = store.as_ref().map(StateReader::stats).transpose()?;
    let now = clock.wall_ms();
    let mut s = StatusJson::new(config, stats.as_ref(), now);
    let inventory = store
        .as_ref()
        .map(StateReader::inventory)
        .transpose()?
        .flatten();
    s.inventory = inventory.map(|i| InventoryStatus::new(i, now));
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&s).unwrap_or_default()
        )?;
        return Ok(());
    }
    let mut lines = store_lines(&s, stats.as_ref(), now);
    lines.extend(daemon_lines(&s, stats.unwrap_or_default(), now));
    // Every value may hold text from elsewhere (the service's errors, BlueZ's): shown
    // inert, so that no escape sequence or bidi override acts on the terminal.
    for (k, v) in lines {
        writeln!(out, "{k:<14} {}", inert(&v))?;
    }
    Ok(())
}

/// The lines of `status` on what the state database holds.
fn store_lines(
    s: &StatusJson,
    stats: Option<&Stats>,
    now: EpochMillis,
) -> Vec<(&'static str, String)> {
    let mut lines = vec![
        ("gateway", s.gateway_id.clone()),
        (
            "database",
            if s.database_exists {
                s.database.clone()
            } else {
                format!("{} (not created yet: the daemon has not run)", s.database)
            },
        ),
    ];
    let oldest = stats
        .and_then(|st| st.oldest_pending_at)
        .map(|t| format!(", oldest captured {}", ago(t, now)))
        .unwrap_or_default();
    lines.push(("pending", format!("{}{oldest}", s.pending)));
    lines.push(("delivered", s.delivered.to_string()));
    lines.push((
        "dead letters",
        format!(
            "{} ({} stored; see `tapegate dead-letters list`)",
            s.dead_letters, s.dead_letters_stored
        ),
    ));
    lines.push((
        "evicted",
        if s.evicted > 0 {
            format!("{} ({})", s.evicted, s.evicted_by.describe())
        } else {
            "0".into()
        },
    ));
    lines.push((
        "database",
        format!("{:.1} MiB in use", s.database_bytes as f64 / 1_048_576.0),
    ));
    lines.push((
        "clock",
        format!(
            "{}; {} held, {} repaired, {} estimated",
            s.clock.as_deref().unwrap_or("not judged yet"),
            s.held,
            s.clock_repaired,
            s.clock_estimated
        ),
    ));
    lines.push(("tapes seen", s.tapes.to_string()));
    if let (Some(n), Some(limit)) = (s.in_flight, s.concurrency_limit) {
        lines.push(("in flight", format!("{n} batches (limit now {limit})")));
    }
    lines
}

/// The lines of `status` on delivery, the scanner and the daemon.
fn daemon_lines(s: &StatusJson, st: Stats, now: EpochMillis) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    lines.push((
        "last flush ok",
        st.last_flush_ok_at
            .map(|t| ago(t, now))
            .unwrap_or_else(|| "never".into()),
    ));
    lines.push((
        "last error",
        match (st.last_error, st.last_error_at) {
            (Some(e), Some(t)) => format!("{} (at {})", bounded(&e), ago(t, now)),
            (Some(e), None) => bounded(&e),
            _ => "none".into(),
        },
    ));
    if let Some(path) = &st.scanner_adverts {
        let rate = match (st.scanner_reports_per_sec, st.scanner_reports_at) {
            (Some(r), Some(at)) => format!(", {r:.1} reports/s (the minute to {})", ago(at, now)),
            _ => String::new(),
        };
        let how = match path.as_str() {
            "mgmt" => "the kernel's management socket (side channel)",
            "dbus" => "BlueZ over D-Bus",
            other => other,
        };
        lines.push(("adverts", format!("read from {how}{rate}")));
    }
    let sc = st.scanner;
    if sc != ScannerCounts::default() || st.scanner_last_trouble.is_some() {
        let trouble = match (&st.scanner_last_trouble, st.scanner_last_trouble_at) {
            (Some(r), Some(t)) => format!("; last trouble: {} (at {})", bounded(r), ago(t, now)),
            _ => String::new(),
        };
        lines.push((
            "scanner",
            format!(
                "{} scan restarts, {} adapter re-acquisitions, {} adverts dropped, {} devices forgotten{trouble}",
                sc.restarts, sc.reacquires, sc.dropped, sc.forgotten
            ),
        ));
    }
    if let Some(i) = &s.inventory {
        let run = match i.uptime_secs {
            Some(up) => format!("running for {}", age(up)),
            None => format!("not running (last started {})", i.inventory.started_at),
        };
        lines.push((
            "daemon",
            format!(
                "{} ({}), config {}, {run}; kernel {}, BlueZ {}, adapter {}",
                i.inventory.version,
                i.inventory.commit,
                i.inventory.config_hash,
                i.inventory.kernel,
                i.inventory.bluez,
                i.inventory.adapter
            ),
        ));
    }
    lines
}
