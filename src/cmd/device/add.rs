//! `tapegate device add` (spec 4.6): one tape (`--qr` with `--tape-id` or `--nearest`)
//! or a manifest's rows, each through [`Operator::add_device`], then each added tape's
//! dead letters back in the outbox. A refusal of one tape goes on to the next; an error
//! no retry fixes, no answer, or Ctrl-C stops the run, and every row is reported all
//! the same. It may touch the operator's client (`cmd::operator_run`), the input checks and
//! the state database (re-queued dead letters).

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use super::input::{check_text, parse_tape_id, read_input, TapeId, CSV_COLUMNS};
use super::manifest::{self, BadRow, Row};
use super::nearest::{nearest, NearestPrinted};
use super::shared::{note_cell, print_bad_rows, print_json, Added, CELL};
use crate::clock::{Clock, SharedClock};
use crate::cmd::operator_run::{interrupts, operator_on, state, Console};
use crate::cmd::CmdError;
use crate::config::Config;
use crate::operator::{check_id, AddDevice, AddOutcome, Operator, OperatorError};
use crate::record::Mac;
use crate::side_tables::HeardTape;
use crate::util::text::shown;

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
pub async fn add(
    config: &Config,
    clock: &SharedClock,
    mut args: AddArgs,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let chosen = tape_ids(config, &**clock, &mut args, out)?;
    let console = Console::stderr();
    let operator = operator_on(config, clock, &console)?.with_interrupt(interrupts(&console));
    let (added, stop) = add_each(config, &operator, &args, &console).await?;
    console.done();
    if !args.csv {
        return report_one(&added, chosen.as_ref(), stop, args.json, out);
    }
    report_rows(&added, &args.bad, stop, args.json, out)
}

/// The tape ids as the daemon sends them in `mac_id` (whatever separators were typed),
/// the first row's from `--nearest` when asked: the tape it chose.
fn tape_ids(
    config: &Config,
    clock: &dyn Clock,
    args: &mut AddArgs,
    out: &mut dyn Write,
) -> Result<Option<HeardTape>, CmdError> {
    let service = config
        .service
        .as_ref()
        .ok_or_else(|| CmdError::Usage(CmdError::NoService.to_string()))?;
    let mut chosen = None;
    if args.nearest {
        let h = nearest(config, clock, args.json, out)?;
        if let Some(row) = args.rows.first_mut() {
            row.add.tape_id = service.mac_format.format(h.mac);
            row.mac = Some(h.mac);
        }
        chosen = Some(h);
    }
    for row in &mut args.rows {
        if let Some(mac) = row.mac {
            row.add.tape_id = service.mac_format.format(mac);
        }
    }
    Ok(chosen)
}

/// Adds each row until the run stops: what became of every row, and the error that
/// stopped the run, if one did.
async fn add_each(
    config: &Config,
    operator: &Operator,
    args: &AddArgs,
    console: &Console,
) -> Result<(Vec<Added>, Option<OperatorError>), CmdError> {
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
                    (true, Some(mac)) => state(config)?.retry_dead_letters(mac)?,
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
    Ok((added, stop))
}

/// One tape from the command line: its outcome on its own.
fn report_one(
    added: &[Added],
    chosen: Option<&HeardTape>,
    stop: Option<OperatorError>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let Some(a) = added.first() else {
        return Err(CmdError::Usage("no tape to add".into()));
    };
    if json {
        print_json(
            out,
            &NearestPrinted {
                nearest: chosen,
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
            crate::util::text::inert(a.outcome.note.as_deref().unwrap_or(&a.outcome.message))
        )));
    }
    Ok(())
}

/// A manifest's rows: a table, or one JSON document, with the rows not sent.
fn report_rows(
    added: &[Added],
    bad: &[BadRow],
    stop: Option<OperatorError>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let interrupted = matches!(stop, Some(OperatorError::Interrupted(_)));
    if json {
        print_json(
            out,
            &AddReport {
                operation: "add",
                devices: added,
                bad_rows: bad,
                error: stop.as_ref().map(ToString::to_string),
                interrupted,
            },
        )?;
    } else {
        print_bad_rows(bad, out)?;
        print_adds(added, true, out)?;
        if let Some(e) = &stop {
            writeln!(
                out,
                "stopped early: {}",
                crate::util::text::inert(&e.to_string())
            )?;
        }
    }
    if let Some(e) = stop {
        return Err(e.into());
    }
    let failed = added.iter().filter(|a| !a.outcome.ok).count() + bad.len();
    if failed > 0 {
        return Err(CmdError::Failed(format!(
            "add: {failed} of {} tape(s) failed",
            added.len() + bad.len()
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

/// The tapes of `device add` from its command line: one from `--qr` and `--tape-id`
/// (or `--nearest`), or a manifest's rows.
pub(super) fn add_rows(
    a: &crate::cmd::cli::DeviceAdd,
) -> Result<(Vec<AddRow>, Vec<BadRow>), CmdError> {
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
            Some(t) => tape_id(t).map_err(CmdError::Usage)?,
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
    csv_rows(path, &template)
}

/// A tape id as sent, and its MAC when it is one.
fn tape_id(v: &str) -> Result<(String, Option<Mac>), String> {
    Ok(match parse_tape_id(v)? {
        TapeId::Mac(m) => (m.to_string(), Some(m)),
        TapeId::Uuid(u) => (u, None),
    })
}

/// The tapes of a manifest, and the rows that cannot be sent.
fn csv_rows(path: &Path, template: &AddDevice) -> Result<(Vec<AddRow>, Vec<BadRow>), CmdError> {
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
    let mut seen = HashSet::new();
    for r in &m.rows {
        match csv_row(r, template, &mut seen) {
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

/// One manifest row as a tape to add, the template's values where it has none; `seen`
/// holds the QR codes of the earlier rows.
fn csv_row(r: &Row, template: &AddDevice, seen: &mut HashSet<String>) -> Result<AddRow, String> {
    let (tape_id, mac) = tape_id(r.get("tape_id").unwrap_or_default())?;
    let pick = |c: &str, t: &Option<String>| r.get(c).map(str::to_string).or_else(|| t.clone());
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
