//! `tapegate device add|label|relabel|show|deactivate|configure`: the device calls of
//! spec 4.6 and 4.7 through [`Operator`], with devices from `--qr` or a CSV manifest
//! (`--csv FILE`, `-` for stdin; see [`super::manifest`]), a table for a
//! person or one JSON document with `--json`, and the exit code of DESIGN.md (0 every
//! device succeeded, 1 any failed, 2 usage or config).
//!
//! Also what every operator command shares: the client ([`operator`]) with its waits
//! and retries told on stderr, Ctrl-C ([`interrupts`]: the first stops before the next
//! request and the results so far are printed; the second gives up the request in
//! flight), the estimate of a long run and its progress on a terminal ([`Console`]),
//! the checks of what a person typed before anything is sent, and `--nearest` (the
//! loudest unknown tape the daemon heard).
//!
//! Every text that came from elsewhere (the service, the CSV file) goes through
//! [`crate::text`] before it is printed; the printing is in `print_outcomes`,
//! `print_records` and `print_adds`.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::manifest::{self, BadRow, Row};
use super::CmdError;
use crate::api::ServiceClient;
use crate::clock::now_ms;
use crate::config::Config;
use crate::operator::rate::{self, open_state, RateGate};
use crate::operator::{
    check_id, AddDevice, AddOutcome, DeviceEntry, DeviceOp, DeviceOutcome, DeviceReport, Interrupt,
    Operator, OperatorError, Progress,
};
use crate::outbox::{HeardTape, OutboxError, Store};
use crate::record::Mac;
use crate::text::shown;

/// `--nearest` considers tapes heard in this window...
pub const NEAREST_WINDOW_MS: i64 = 30_000;
/// ...and takes the loudest only when it is this much louder than the next.
pub const NEAREST_MARGIN_DB: i16 = 10;

/// The columns a manifest may name: the spec's field names (DESIGN.md), and for `add`
/// the names of its parameters (spec 4.6; `application_id` is its `appId`).
pub const CSV_COLUMNS: &[&str] = &[
    "qrcode",
    "asset_barcode",
    "application_id",
    "shipment",
    "firmware",
    "metadata",
    "tape_displayname",
    "tape_id",
    "tt",
    "abc",
    "abcd",
    "facility_id",
];

/// Longest free text sent (a description).
const MAX_TEXT_CHARS: usize = 1000;
/// Widest cell of a table.
const CELL: usize = 60;

/// The state database for the operator commands: the daemon's, or a new one.
pub fn state(config: &Config) -> Result<Store, OutboxError> {
    open_state(&config.gateway.state_dir)
}

/// What the commands tell a person on stderr while they run: waits, retries, the
/// estimate, and (on a terminal only) one progress line kept up to date.
#[derive(Clone)]
pub struct Console {
    tty: bool,
    /// A progress line is on the screen (it is cleared before any other line).
    shown: Arc<AtomicBool>,
}

impl Console {
    pub fn stderr() -> Console {
        Console {
            tty: std::io::stderr().is_terminal(),
            shown: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A line for a person (a progress line is cleared first).
    pub fn say(&self, message: &str) {
        let clear = if self.shown.swap(false, Ordering::Relaxed) {
            "\r\x1b[K"
        } else {
            ""
        };
        // A closed stderr (`... 2>&1 | head -1`) is no reason to fail, or panic.
        let _ = writeln!(std::io::stderr(), "{clear}{}", crate::text::inert(message));
    }

    /// The progress line, on a terminal only.
    fn progress(&self, line: &str) {
        if self.tty {
            self.shown.store(true, Ordering::Relaxed);
            let _ = write!(std::io::stderr(), "\r\x1b[K{line}");
        }
    }

    /// Ends the progress line.
    fn done(&self) {
        if self.shown.swap(false, Ordering::Relaxed) {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// `d` for a person: "41 s", "3 min 20 s", "8 h 27 min".
pub fn human(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    match s {
        0 => "less than a second".to_string(),
        1..=59 => format!("{s} s"),
        60..=3599 if s % 60 == 0 => format!("{} min", s / 60),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The operator's client for `config`: waits and retries are told on `console`. A
/// missing `[service]` or settings that cannot make a client are config errors (exit 2).
pub fn operator_on(config: &Config, console: &Console) -> Result<Operator, CmdError> {
    let no_service = || CmdError::Usage(CmdError::NoService.to_string());
    let service = config.service.as_ref().ok_or_else(no_service)?;
    let settings = config.operator.clone().ok_or_else(no_service)?;
    let client = ServiceClient::new(service).map_err(|e| CmdError::Usage(e.to_string()))?;
    let identity = format!(
        "{}/{}/{}",
        service.environment, service.endpoint.client_id, service.endpoint.username
    );
    let waits = console.clone();
    let gate = RateGate::new(
        config.gateway.state_dir.clone(),
        identity,
        settings.rate_window,
        Box::new(move |d: Duration| {
            waits.say(&format!(
                "waiting {} s for the service's rate window",
                d.as_secs_f64().ceil() as u64
            ));
        }),
    );
    let retries = console.clone();
    Ok(Operator::new(
        client,
        gate,
        settings,
        config.gateway.id.clone(),
        Box::new(move |m: &str| retries.say(m)),
    ))
}

/// The operator's client for `config`, telling waits and retries on stderr.
pub fn operator(config: &Config) -> Result<Operator, CmdError> {
    operator_on(config, &Console::stderr())
}

/// Ctrl-C (SIGINT) and SIGTERM for a run: the first stops it before the next request
/// (and ends any wait), the second gives up the request in flight. Must be called on
/// the runtime.
pub fn interrupts(console: &Console) -> Interrupt {
    let interrupt = Interrupt::default();
    let i = interrupt.clone();
    let console = console.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        async fn next(
            int: &mut tokio::signal::unix::Signal,
            term: &mut tokio::signal::unix::Signal,
        ) {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        next(&mut int, &mut term).await;
        console.say("interrupted: nothing more is sent; the request on its way is finished (interrupt again to give it up)");
        i.stop.cancel();
        next(&mut int, &mut term).await;
        console.say("interrupted again: giving up the request on its way");
        i.abandon.cancel();
    });
    interrupt
}

/// The text of `path`, or of stdin for `-`.
fn read_input(path: &Path) -> Result<String, CmdError> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| CmdError::Usage(format!("cannot read {}: {e}", path.display())))?;
    Ok(text)
}

/// A JSON object given on the command line (`--shipment`, `--metadata`).
pub fn json_arg(flag: &str, v: Option<&str>) -> Result<Option<Value>, CmdError> {
    v.map(|v| match serde_json::from_str::<Value>(v) {
        Ok(j @ Value::Object(_)) => Ok(j),
        _ => Err(CmdError::Usage(format!(
            "{flag} must be a JSON object such as '{{\"awb\": \"123-45678901\"}}', got {}",
            shown(v, CELL)
        ))),
    })
    .transpose()
}

/// A JSON object in a CSV cell.
fn json_cell(name: &str, v: Option<&str>) -> Result<Option<Value>, String> {
    v.map(|v| match serde_json::from_str::<Value>(v) {
        Ok(j @ Value::Object(_)) => Ok(j),
        Ok(_) => Err(format!(
            "{name} must be a JSON object, got {}",
            shown(v, CELL)
        )),
        Err(err) => Err(format!("{name} is not JSON ({err}): {}", shown(v, CELL))),
    })
    .transpose()
}

/// Free text sent as it is (a description): no control or invisible character, not
/// absurdly long.
fn check_text(kind: &str, value: &str) -> Result<(), String> {
    if value.chars().count() > MAX_TEXT_CHARS {
        return Err(format!(
            "{kind} is {} characters long; at most {MAX_TEXT_CHARS} are taken",
            value.chars().count()
        ));
    }
    if matches!(crate::text::inert(value), std::borrow::Cow::Owned(_)) {
        return Err(format!(
            "{kind} {} holds a control or invisible character",
            shown(value, CELL)
        ));
    }
    Ok(())
}

/// The tape id of `device add`: a MAC in any common spelling (`C0:DE:AD:00:00:01`,
/// `c0-de-ad-00-00-01`, `C0DEAD000001`, `c0de.ad00.0001`), sent as `mac_format` writes
/// it, or a UUID, sent as given.
pub fn parse_tape_id(v: &str) -> Result<TapeId, String> {
    if let Ok(mac) = v.parse::<Mac>() {
        return Ok(TapeId::Mac(mac));
    }
    let dotted = v.split('.').collect::<Vec<_>>();
    if dotted.len() == 3 && dotted.iter().all(|p| p.len() == 4) {
        if let Ok(mac) = dotted.concat().parse::<Mac>() {
            return Ok(TapeId::Mac(mac));
        }
    }
    if uuid::Uuid::try_parse(v).is_ok() {
        return Ok(TapeId::Uuid(v.to_string()));
    }
    Err(format!(
        "tape id {} is neither a MAC address (C0:DE:AD:00:00:01, C0-DE-AD-00-00-01, C0DEAD000001, c0de.ad00.0001) nor a UUID",
        shown(v, CELL)
    ))
}

/// A tape id as `device add` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapeId {
    Mac(Mac),
    Uuid(String),
}

/// Where the devices of a multi-device command come from.
pub struct Devices<'a> {
    pub qr: &'a [String],
    pub csv: Option<&'a Path>,
    /// Applied to each `--qr` device (and to CSV rows for what they leave empty).
    pub template: DeviceEntry,
}

/// Checks what is sent of a device, before anything is: the rules of the operation and
/// every identifier.
fn check_entry(op: &DeviceOp, e: &DeviceEntry) -> Result<(), String> {
    check_id("QR code", &e.qrcode)?;
    for (kind, v) in [
        ("asset_barcode", &e.asset_barcode),
        ("application_id", &e.application_id),
        ("firmware", &e.firmware),
    ] {
        if let Some(v) = v {
            check_id(kind, v)?;
        }
    }
    if let Some(v) = &e.tape_displayname {
        check_text("tape_displayname", v)?;
    }
    match op {
        DeviceOp::Label { .. } if e.asset_barcode.is_none() => {
            Err("asset_barcode is required to label".into())
        }
        DeviceOp::Label { .. } if e.application_id.is_none() => {
            Err("application_id is required to label (or set default_app_id in the config)".into())
        }
        DeviceOp::Relabel
            if e.asset_barcode.is_none() && e.application_id.is_none() && e.shipment.is_none() =>
        {
            Err("nothing to change: give asset_barcode, application_id or shipment".into())
        }
        DeviceOp::Configure
            if e.firmware.is_none()
                && e.metadata.is_none()
                && e.asset_barcode.is_none()
                && e.tape_displayname.is_none() =>
        {
            Err(
                "nothing to change: give firmware, metadata, asset_barcode or tape_displayname"
                    .into(),
            )
        }
        _ => Ok(()),
    }
}

/// The columns of a manifest that `op` sends (the others are read and ignored).
fn columns_of(op: &DeviceOp) -> &'static [&'static str] {
    match op {
        DeviceOp::Label { .. } | DeviceOp::Relabel => {
            &["qrcode", "asset_barcode", "application_id", "shipment"]
        }
        DeviceOp::Show | DeviceOp::Deactivate => &["qrcode"],
        DeviceOp::Configure => &[
            "qrcode",
            "asset_barcode",
            "firmware",
            "metadata",
            "tape_displayname",
        ],
    }
}

/// A manifest row as a device of `op`, with the template's values where it has none.
fn row_entry(op: &DeviceOp, row: &Row, t: &DeviceEntry) -> Result<DeviceEntry, String> {
    let uses = |c: &str| columns_of(op).contains(&c);
    let text = |c: &str| row.get(c).filter(|_| uses(c)).map(str::to_string);
    Ok(DeviceEntry {
        qrcode: row.get("qrcode").unwrap_or_default().to_string(),
        asset_barcode: text("asset_barcode").or_else(|| t.asset_barcode.clone()),
        application_id: text("application_id").or_else(|| t.application_id.clone()),
        shipment: json_cell("shipment", text("shipment").as_deref())?
            .or_else(|| t.shipment.clone()),
        firmware: text("firmware").or_else(|| t.firmware.clone()),
        metadata: json_cell("metadata", text("metadata").as_deref())?
            .or_else(|| t.metadata.clone()),
        tape_displayname: text("tape_displayname").or_else(|| t.tape_displayname.clone()),
    })
}

/// The devices a command sends, and the rows that cannot be sent.
#[derive(Debug, Default)]
struct Gathered {
    entries: Vec<DeviceEntry>,
    bad: Vec<BadRow>,
}

fn gather(op: &DeviceOp, from: Devices<'_>) -> Result<Gathered, CmdError> {
    let Some(path) = from.csv else {
        if from.qr.is_empty() {
            return Err(CmdError::Usage("no devices: give --qr or --csv".into()));
        }
        // A --qr device breaking a rule is a usage error: nothing is sent.
        let mut entries = Vec::new();
        for q in from.qr {
            let e = DeviceEntry {
                qrcode: q.clone(),
                ..from.template.clone()
            };
            check_entry(op, &e).map_err(CmdError::Usage)?;
            entries.push(e);
        }
        return Ok(Gathered {
            entries,
            bad: Vec::new(),
        });
    };
    let m = manifest::parse(&read_input(path)?, CSV_COLUMNS)
        .map_err(|e| CmdError::Usage(format!("{}: {e}", path.display())))?;
    let mut got = Gathered {
        bad: m.bad,
        ..Gathered::default()
    };
    for row in &m.rows {
        match row_entry(op, row, &from.template).and_then(|e| check_entry(op, &e).map(|()| e)) {
            Ok(e) => got.entries.push(e),
            Err(message) => got.bad.push(BadRow {
                line: row.line,
                message,
            }),
        }
    }
    got.bad.sort_by_key(|b| b.line);
    if got.entries.is_empty() && got.bad.is_empty() {
        return Err(CmdError::Usage(format!(
            "{}: no devices (only a header row)",
            path.display()
        )));
    }
    Ok(got)
}

#[derive(Serialize)]
struct Printed<'a> {
    #[serde(flatten)]
    report: &'a DeviceReport,
    bad_rows: &'a [BadRow],
}

/// Requests `entries` take under `op` (configure: one per shared change and 100).
fn requests_needed(op: &DeviceOp, entries: &[DeviceEntry]) -> u64 {
    let mut groups: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for e in entries {
        let key = match op {
            DeviceOp::Configure => format!("{:?}|{:?}", e.firmware, e.metadata),
            _ => String::new(),
        };
        *groups.entry(key).or_default() += 1;
    }
    let per = op.max_devices() as u64;
    groups.values().map(|n| n.div_ceil(per)).sum()
}

/// Runs a multi-device command and prints its report, every device included even when
/// the run stopped early (an error, no answer, Ctrl-C); `Err` when any device failed
/// (exit 1) or the run stopped.
pub async fn run_devices(
    config: &Config,
    op: DeviceOp,
    from: Devices<'_>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let op_name = op.name();
    let show = op == DeviceOp::Show;
    let devices = gather(&op, from)?;
    let console = Console::stderr();
    let total = {
        let mut seen = std::collections::HashSet::new();
        devices
            .entries
            .iter()
            .filter(|e| seen.insert(&e.qrcode))
            .count()
    };
    let operator = operator_on(config, &console)?;
    let window = operator.gate().window();
    let progress = console.clone();
    let per = op.max_devices();
    let operator = operator
        .with_interrupt(interrupts(&console))
        .with_progress(Box::new(move |p: &Progress| {
            let left = ((p.total - p.done).div_ceil(per)) as u64;
            let eta = if left > rate::REQUESTS_PER_WINDOW as u64 {
                format!("; about {} left", human(rate::estimate(left, 0, window)))
            } else {
                String::new()
            };
            progress.progress(&format!(
                "{op_name}: {} of {} device(s), {} ok, {} request(s){eta}",
                p.done, p.total, p.ok, p.requests,
            ));
        }));
    let mut run = if devices.entries.is_empty() {
        crate::operator::DeviceRun {
            report: DeviceReport {
                operation: op_name,
                ..DeviceReport::default()
            },
            error: None,
        }
    } else {
        let requests = requests_needed(&op, &devices.entries);
        let free = operator.gate().free_now()?;
        let eta = rate::estimate(requests, free, window);
        if !eta.is_zero() {
            console.say(&format!(
                "{op_name}: {total} device(s) in {requests} request(s), at most {} per {}: about {}",
                rate::REQUESTS_PER_WINDOW,
                human(window),
                human(eta)
            ));
        }
        operator.devices(op, devices.entries).await
    };
    console.done();
    if json {
        let printed = Printed {
            report: &run.report,
            bad_rows: &devices.bad,
        };
        print_json(out, &printed)?;
    } else {
        print_bad_rows(&devices.bad, out)?;
        if show {
            print_records(&run.report, out)?;
        } else {
            print_outcomes(&run.report, out)?;
        }
    }
    if let Some(e) = run.error.take() {
        return Err(e.into());
    }
    let failed = run.report.devices.iter().filter(|d| !d.ok).count() + devices.bad.len();
    if failed > 0 {
        return Err(CmdError::Failed(format!(
            "{op_name}: {failed} of {} device(s) failed",
            run.report.devices.len() + devices.bad.len()
        )));
    }
    Ok(())
}

/// One JSON document on `out`.
fn print_json(out: &mut dyn Write, v: &impl Serialize) -> Result<(), CmdError> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
    writeln!(out, "{text}")?;
    Ok(())
}

fn print_bad_rows(bad: &[BadRow], out: &mut dyn Write) -> Result<(), CmdError> {
    for b in bad {
        writeln!(
            out,
            "line {}: {} (not sent)",
            b.line,
            crate::text::inert(&b.message)
        )?;
    }
    Ok(())
}

/// The note and the hint of an outcome, in one cell.
fn note_cell(note: Option<&str>, hint: Option<&str>) -> String {
    let text = match (note, hint) {
        (Some(n), Some(h)) => format!("{n}; {h}"),
        (Some(t), None) | (None, Some(t)) => t.to_string(),
        (None, None) => String::new(),
    };
    crate::text::inert(&text).into_owned()
}

fn print_outcomes(report: &DeviceReport, out: &mut dyn Write) -> Result<(), CmdError> {
    writeln!(
        out,
        "{:<20} {:<8} {:<24} note",
        "qrcode", "result", "error_code"
    )?;
    for d in &report.devices {
        print_outcome(d, out)?;
    }
    let ok = report.devices.iter().filter(|d| d.ok).count();
    writeln!(
        out,
        "{}: {ok} of {} device(s) succeeded in {} request(s)",
        report.operation,
        report.devices.len(),
        report.requests
    )?;
    if let Some(e) = &report.error {
        writeln!(out, "stopped early: {}", crate::text::inert(e))?;
    }
    Ok(())
}

fn print_outcome(d: &DeviceOutcome, out: &mut dyn Write) -> Result<(), CmdError> {
    writeln!(
        out,
        "{:<20} {:<8} {:<24} {}",
        shown(&d.qrcode, CELL),
        if d.ok { "ok" } else { "FAILED" },
        shown(d.error_code.as_deref().unwrap_or("-"), CELL),
        note_cell(d.note.as_deref(), d.hint.as_deref())
    )?;
    Ok(())
}

fn print_records(report: &DeviceReport, out: &mut dyn Write) -> Result<(), CmdError> {
    writeln!(
        out,
        "{:<20} {:<22} {:<13} {:<16} {:<12} {:<9} name",
        "qrcode", "status", "mac", "asset_barcode", "application", "firmware"
    )?;
    for d in &report.devices {
        let Some(r) = d.record.as_ref().filter(|_| d.ok) else {
            writeln!(
                out,
                "{:<20} {} {}",
                shown(&d.qrcode, CELL),
                shown(d.error_code.as_deref().unwrap_or("FAILED"), CELL),
                note_cell(d.note.as_deref(), d.hint.as_deref())
            )?;
            continue;
        };
        let label = r.label.as_ref();
        let cell = |v: Option<&str>| shown(v.unwrap_or("-"), CELL);
        writeln!(
            out,
            "{:<20} {:<22} {:<13} {:<16} {:<12} {:<9} {}",
            shown(&d.qrcode, CELL),
            cell(r.status.as_deref()),
            cell(r.mac.as_deref()),
            cell(label.and_then(|l| l.asset_barcode.as_deref())),
            cell(label.and_then(|l| l.application_id.as_deref())),
            cell(r.firmware.as_deref()),
            cell(r.tape_displayname.as_deref()),
        )?;
    }
    if let Some(e) = &report.error {
        writeln!(out, "stopped early: {}", crate::text::inert(e))?;
    }
    Ok(())
}

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

/// One tape to add: the request, and the tape's MAC when it is one (its dead letters
/// are re-queued after the add).
#[derive(Debug, Clone)]
pub struct AddRow {
    /// The CSV line (0 for the command line).
    pub line: u64,
    pub add: AddDevice,
    pub mac: Option<Mac>,
}

/// `device add`'s options.
pub struct AddArgs {
    /// The tapes (one from the command line, or a manifest's rows).
    pub rows: Vec<AddRow>,
    pub bad: Vec<BadRow>,
    /// From a manifest: print a per-row report.
    pub csv: bool,
    pub nearest: bool,
    pub json: bool,
}

/// What became of one tape of `device add`.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(flatten)]
    pub outcome: AddOutcome,
    pub requeued_dead_letters: u64,
}

#[derive(Serialize)]
struct AddReport<'a> {
    operation: &'static str,
    devices: &'a [Added],
    bad_rows: &'a [BadRow],
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    interrupted: bool,
}

/// What `--nearest` found, for `--json`.
#[derive(Serialize)]
struct NearestPrinted<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    nearest: Option<&'a HeardTape>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    candidates: &'a [HeardTape],
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    added: Option<&'a Added>,
}

/// The tape `--nearest` picks, or the error (after printing the candidates).
fn nearest(config: &Config, json: bool, out: &mut dyn Write) -> Result<HeardTape, CmdError> {
    let store = state(config)?;
    let since = now_ms() - NEAREST_WINDOW_MS;
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

/// An add that did not happen, as a row of the report.
fn add_failed(row: &AddRow, code: &str, note: String) -> Added {
    Added {
        line: (row.line > 0).then_some(row.line),
        outcome: AddOutcome {
            qrcode: row.add.qrcode.clone(),
            tape_id: row.add.tape_id.clone(),
            ok: false,
            status: None,
            message: String::new(),
            error_code: Some(code.into()),
            note: Some(note),
            correlation_id: String::new(),
        },
        requeued_dead_letters: 0,
    }
}

/// `device add`: each tape (one, `--nearest`, or a manifest's rows), then each added
/// tape's dead letters back in the outbox. A refusal of one tape goes on to the next;
/// an error no retry fixes, no answer, or Ctrl-C stops the run, and every row is
/// reported all the same.
pub async fn add(config: &Config, mut args: AddArgs, out: &mut dyn Write) -> Result<(), CmdError> {
    let service = config
        .service
        .as_ref()
        .ok_or_else(|| CmdError::Usage(CmdError::NoService.to_string()))?;
    let mut chosen = None;
    if args.nearest {
        let h = nearest(config, args.json, out)?;
        if let Some(row) = args.rows.first_mut() {
            row.add.tape_id = service.mac_format.format(h.mac);
            row.mac = Some(h.mac);
        }
        chosen = Some(h);
    }
    for row in &mut args.rows {
        if let Some(mac) = row.mac {
            // As the daemon sends it in mac_id, whatever separators were typed.
            row.add.tape_id = service.mac_format.format(mac);
        }
    }
    let console = Console::stderr();
    let operator = operator_on(config, &console)?.with_interrupt(interrupts(&console));
    let mut added: Vec<Added> = Vec::new();
    let mut stop: Option<OperatorError> = None;
    let total = args.rows.len();
    for row in &args.rows {
        if let Some(e) = &stop {
            let note = match e {
                OperatorError::Interrupted(_) => "interrupted before it was sent".to_string(),
                e => format!("not sent: the run stopped ({e})"),
            };
            added.push(add_failed(row, "NOT_SENT", note));
            continue;
        }
        match operator.add_device(&row.add).await {
            Ok(outcome) => {
                let requeued = match (outcome.ok, row.mac) {
                    (true, Some(mac)) => state(config)?.retry_dead_letters(Some(mac))?,
                    _ => 0,
                };
                added.push(Added {
                    line: (row.line > 0).then_some(row.line),
                    outcome,
                    requeued_dead_letters: requeued,
                });
            }
            Err(e @ OperatorError::Usage(_)) => return Err(e.into()),
            Err(e) => {
                let code = if matches!(e, OperatorError::Interrupted(_)) {
                    "INTERRUPTED"
                } else {
                    "NO_ANSWER"
                };
                added.push(add_failed(row, code, e.to_string()));
                stop = Some(e);
            }
        }
        if args.csv {
            let ok = added.iter().filter(|a| a.outcome.ok).count();
            console.progress(&format!("add: {} of {total} tape(s), {ok} ok", added.len()));
        }
    }
    console.done();
    let interrupted = matches!(stop, Some(OperatorError::Interrupted(_)));
    if !args.csv {
        // One tape: its outcome on its own.
        let Some(a) = added.first() else {
            return Err(CmdError::Usage("no tape to add".into()));
        };
        if args.json {
            print_json(
                out,
                &NearestPrinted {
                    nearest: chosen.as_ref(),
                    candidates: &[],
                    error: stop.as_ref().map(ToString::to_string),
                    added: Some(a),
                },
            )?;
        } else {
            print_adds(std::slice::from_ref(a), false, out)?;
        }
        if let Some(e) = stop {
            return Err(e.into());
        }
        if !a.outcome.ok {
            return Err(CmdError::Failed(format!(
                "{}: {}",
                shown(&a.outcome.qrcode, CELL),
                crate::text::inert(a.outcome.note.as_deref().unwrap_or(&a.outcome.message))
            )));
        }
        return Ok(());
    }
    if args.json {
        print_json(
            out,
            &AddReport {
                operation: "add",
                devices: &added,
                bad_rows: &args.bad,
                error: stop.as_ref().map(ToString::to_string),
                interrupted,
            },
        )?;
    } else {
        print_bad_rows(&args.bad, out)?;
        print_adds(&added, true, out)?;
        if let Some(e) = &stop {
            writeln!(out, "stopped early: {}", crate::text::inert(&e.to_string()))?;
        }
    }
    if let Some(e) = stop {
        return Err(e.into());
    }
    let failed = added.iter().filter(|a| !a.outcome.ok).count() + args.bad.len();
    if failed > 0 {
        return Err(CmdError::Failed(format!(
            "add: {failed} of {} tape(s) failed",
            added.len() + args.bad.len()
        )));
    }
    Ok(())
}

fn print_adds(added: &[Added], table: bool, out: &mut dyn Write) -> Result<(), CmdError> {
    if table {
        writeln!(
            out,
            "{:<20} {:<17} {:<8} {:<18} note",
            "qrcode", "tape_id", "result", "error_code"
        )?;
    }
    for a in added {
        let o = &a.outcome;
        let note = note_cell(o.note.as_deref(), None);
        if table {
            let note = match (o.ok, a.requeued_dead_letters) {
                (true, n) if n > 0 => format!("{note} ({n} dead letter(s) re-queued)"),
                _ => note,
            };
            writeln!(
                out,
                "{:<20} {:<17} {:<8} {:<18} {}",
                shown(&o.qrcode, CELL),
                shown(&o.tape_id, CELL),
                if o.ok { "ok" } else { "FAILED" },
                shown(o.error_code.as_deref().unwrap_or("-"), CELL),
                note
            )?;
            continue;
        }
        let status = o
            .status
            .map_or("no answer".to_string(), |s| format!("HTTP {s}"));
        writeln!(
            out,
            "{} {} (tape {}): {status} {}{} [correlation id {}]",
            if o.ok { "added" } else { "not added:" },
            shown(&o.qrcode, CELL),
            shown(&o.tape_id, CELL),
            shown(&o.message, CELL),
            if note.is_empty() {
                String::new()
            } else {
                format!(" — {note}")
            },
            o.correlation_id
        )?;
        if o.ok {
            if let Ok(mac) = o.tape_id.parse::<Mac>() {
                writeln!(
                    out,
                    "re-queued {} dead letter(s) of {mac}",
                    a.requeued_dead_letters
                )?;
            }
        }
    }
    Ok(())
}

impl From<OperatorError> for CmdError {
    fn from(e: OperatorError) -> Self {
        match e {
            OperatorError::Usage(m) => CmdError::Usage(m),
            OperatorError::Api(crate::api::ApiError::Setup(m)) => CmdError::Usage(m),
            OperatorError::Api(a) => CmdError::Api(a),
            OperatorError::State(s) => CmdError::Outbox(s),
            other => CmdError::Failed(other.to_string()),
        }
    }
}

/// The tapes of `device add` from its command line: one from `--qr` and `--tape-id`
/// (or `--nearest`), or a manifest's rows.
fn add_rows(a: &crate::cli::DeviceAdd) -> Result<(Vec<AddRow>, Vec<BadRow>), CmdError> {
    let template = AddDevice {
        app_id: a.app_id.clone(),
        tape_type: a.tape_type.clone(),
        asset: a.asset.clone(),
        description: a.description.clone(),
        facility: a.facility.clone(),
        override_existing: a.override_existing,
        ..AddDevice::default()
    };
    let Some(path) = &a.csv else {
        let qr = a.qr.clone().unwrap_or_default();
        let (tape_id, mac) = match &a.tape_id {
            Some(t) => match parse_tape_id(t).map_err(CmdError::Usage)? {
                TapeId::Mac(m) => (m.to_string(), Some(m)),
                TapeId::Uuid(u) => (u, None),
            },
            None => (String::new(), None),
        };
        let row = AddRow {
            line: 0,
            add: AddDevice {
                qrcode: qr,
                tape_id,
                ..template
            },
            mac,
        };
        check_add(&row.add, a.tape_id.is_none()).map_err(CmdError::Usage)?;
        return Ok((vec![row], Vec::new()));
    };
    let m = manifest::parse(&read_input(path)?, CSV_COLUMNS)
        .map_err(|e| CmdError::Usage(format!("{}: {e}", path.display())))?;
    if !m.header.iter().any(|h| h == "tape_id") {
        return Err(CmdError::Usage(format!(
            "{}: the header row has no tape_id column (`device add` needs it)",
            path.display()
        )));
    }
    let mut bad = m.bad;
    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &m.rows {
        let built = (|| {
            let (tape_id, mac) = match parse_tape_id(r.get("tape_id").unwrap_or_default())? {
                TapeId::Mac(m) => (m.to_string(), Some(m)),
                TapeId::Uuid(u) => (u, None),
            };
            let pick =
                |c: &str, t: &Option<String>| r.get(c).map(str::to_string).or_else(|| t.clone());
            let add = AddDevice {
                qrcode: r.get("qrcode").unwrap_or_default().to_string(),
                tape_id,
                app_id: pick("application_id", &template.app_id),
                tape_type: pick("tt", &template.tape_type),
                asset: pick("abc", &template.asset),
                description: pick("abcd", &template.description),
                facility: pick("facility_id", &template.facility),
                override_existing: template.override_existing,
            };
            check_add(&add, false)?;
            if !seen.insert(add.qrcode.clone()) {
                return Err(format!("{} is on an earlier row", shown(&add.qrcode, CELL)));
            }
            Ok(AddRow {
                line: r.line,
                add,
                mac,
            })
        })();
        match built {
            Ok(row) => rows.push(row),
            Err(message) => bad.push(BadRow {
                line: r.line,
                message,
            }),
        }
    }
    bad.sort_by_key(|b| b.line);
    if rows.is_empty() && bad.is_empty() {
        return Err(CmdError::Usage(format!(
            "{}: no tapes (only a header row)",
            path.display()
        )));
    }
    Ok((rows, bad))
}

/// Checks what `device add` sends (the tape id is checked where it is parsed).
fn check_add(a: &AddDevice, nearest: bool) -> Result<(), String> {
    check_id("QR code", &a.qrcode)?;
    if !nearest && a.tape_id.is_empty() {
        return Err("tape id is empty".into());
    }
    for (kind, v) in [
        ("appId", &a.app_id),
        ("tape type", &a.tape_type),
        ("asset (abc)", &a.asset),
        ("facility", &a.facility),
    ] {
        if let Some(v) = v {
            check_id(kind, v)?;
        }
    }
    if let Some(d) = &a.description {
        check_text("description (abcd)", d)?;
    }
    Ok(())
}

/// `tapegate device ...` from its command line.
pub async fn run(
    config: &Config,
    device: &crate::cli::Device,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    use crate::cli::Device as D;
    let default_app = config
        .operator
        .as_ref()
        .and_then(|o| o.default_app_id.clone());
    let (op, devices, template) = match device {
        D::Add(a) => {
            let (rows, bad) = add_rows(a)?;
            let args = AddArgs {
                rows,
                bad,
                csv: a.csv.is_some(),
                nearest: a.nearest,
                json: a.json,
            };
            return add(config, args, out).await;
        }
        D::Label(l) => (
            DeviceOp::Label {
                override_label: l.override_label,
            },
            &l.devices,
            DeviceEntry {
                asset_barcode: l.asset.clone(),
                application_id: l.app.clone().or(default_app),
                shipment: json_arg("--shipment", l.shipment.as_deref())?,
                ..DeviceEntry::default()
            },
        ),
        D::Relabel(l) => (
            DeviceOp::Relabel,
            &l.devices,
            DeviceEntry {
                asset_barcode: l.asset.clone(),
                shipment: json_arg("--shipment", l.shipment.as_deref())?,
                ..DeviceEntry::default()
            },
        ),
        D::Show(l) => (DeviceOp::Show, &l.devices, DeviceEntry::default()),
        D::Deactivate(l) => (DeviceOp::Deactivate, &l.devices, DeviceEntry::default()),
        D::Configure(c) => (
            DeviceOp::Configure,
            &c.devices,
            DeviceEntry {
                firmware: c.firmware.clone(),
                metadata: json_arg("--metadata", c.metadata.as_deref())?,
                ..DeviceEntry::default()
            },
        ),
    };
    let from = Devices {
        qr: &devices.qr,
        csv: devices.csv.as_deref(),
        template,
    };
    run_devices(config, op, from, devices.json, out).await
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

    #[test]
    fn a_tape_id_is_a_mac_in_any_common_spelling_or_a_uuid() {
        let mac: Mac = "C0:DE:AD:00:00:01".parse().unwrap();
        for v in [
            "C0:DE:AD:00:00:01",
            "c0-de-ad-00-00-01",
            "C0DEAD000001",
            "c0de.ad00.0001",
        ] {
            assert_eq!(parse_tape_id(v), Ok(TapeId::Mac(mac)), "{v}");
        }
        let u = "6f1c2a9e-0000-4000-8000-000000000001";
        assert_eq!(parse_tape_id(u), Ok(TapeId::Uuid(u.into())));
        for bad in ["not-a-mac", "", "C0:DE:AD:00:00", "C0DEAD0000011"] {
            let err = parse_tape_id(bad).unwrap_err();
            assert!(err.contains("neither a MAC"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_manifest_row_gives_a_device_the_columns_its_command_uses() {
        let m = manifest::parse(
            "qrcode,tape_id,asset_barcode,firmware,shipment\nTT1,C0DEAD000001,AWB-1,1.5,\"{\"\"awb\"\": \"\"1\"\"}\"\n",
            CSV_COLUMNS,
        )
        .unwrap();
        let label = DeviceOp::Label {
            override_label: false,
        };
        let e = row_entry(&label, &m.rows[0], &DeviceEntry::default()).unwrap();
        assert_eq!(e.asset_barcode.as_deref(), Some("AWB-1"));
        assert_eq!(e.shipment, Some(serde_json::json!({"awb": "1"})));
        assert_eq!(e.firmware, None, "label does not send firmware");
        let e = row_entry(&DeviceOp::Deactivate, &m.rows[0], &DeviceEntry::default()).unwrap();
        assert_eq!((e.qrcode.as_str(), e.asset_barcode), ("TT1", None));
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(human(Duration::from_secs(3)), "3 s");
        assert_eq!(human(Duration::from_secs(200)), "3 min 20 s");
        assert_eq!(human(Duration::from_secs(120)), "2 min");
        assert_eq!(human(Duration::from_secs(499 * 61)), "8 h 27 min");
    }
}
