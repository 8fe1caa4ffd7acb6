//! `tapegate device label|relabel|show|deactivate|configure`: the multi-device calls of
//! spec 4.7 through [`Operator::devices`], with the estimate of a long run, its progress
//! on a terminal, and a table for a person (the lookup's records for `show`) or one JSON
//! document with `--json`. It may touch the operator's client (`cmd::operator_run`) and the
//! input checks of `input.rs`.

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use super::input::{gather, Devices};
use super::manifest::BadRow;
use super::shared::{note_cell, print_bad_rows, print_json, CELL};
use crate::clock::SharedClock;
use crate::cmd::operator_run::{human, interrupts, operator_on, Console};
use crate::cmd::CmdError;
use crate::config::Config;
use crate::operator::rate;
use crate::operator::{
    DeviceEntry, DeviceOp, DeviceOutcome, DeviceReport, DeviceRun, Operator, Progress,
};
use crate::util::text::shown;

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
    clock: &SharedClock,
    op: DeviceOp,
    from: Devices<'_>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let devices = gather(&op, from)?;
    let console = Console::stderr();
    let operator = operator_on(config, clock, &console)?;
    let window = operator.gate().window();
    let operator = operator
        .with_interrupt(interrupts(&console))
        .with_progress(progress_line(&op, window, &console));
    let run = if devices.entries.is_empty() {
        DeviceRun {
            report: DeviceReport {
                operation: op.name(),
                ..DeviceReport::default()
            },
            error: None,
        }
    } else {
        send_all(&operator, op.clone(), devices.entries, &console, window).await?
    };
    console.done();
    finish(run, &devices.bad, &op, json, out)
}

/// The progress line of a run of `op` on `console`, with what is left when it is long.
fn progress_line(
    op: &DeviceOp,
    window: Duration,
    console: &Console,
) -> Box<dyn Fn(&Progress) + Send + Sync> {
    let progress = console.clone();
    let per = op.max_devices();
    let op_name = op.name();
    Box::new(move |p: &Progress| {
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
    })
}

/// Sends `entries` under `op`, after saying how long the rate window makes it take.
async fn send_all(
    operator: &Operator,
    op: DeviceOp,
    entries: Vec<DeviceEntry>,
    console: &Console,
    window: Duration,
) -> Result<DeviceRun, CmdError> {
    let total = {
        let mut seen = std::collections::HashSet::new();
        entries.iter().filter(|e| seen.insert(&e.qrcode)).count()
    };
    let requests = requests_needed(&op, &entries);
    let free = operator.gate().free_now().await?;
    let eta = rate::estimate(requests, free, window);
    if !eta.is_zero() {
        console.say(&format!(
            "{}: {total} device(s) in {requests} request(s), at most {} per {}: about {}",
            op.name(),
            rate::REQUESTS_PER_WINDOW,
            human(window),
            human(eta)
        ));
    }
    Ok(operator.devices(op, entries).await)
}

/// Prints the report of `run` (and the rows not sent); `Err` when the run stopped or
/// any device failed.
fn finish(
    mut run: DeviceRun,
    bad: &[BadRow],
    op: &DeviceOp,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    if json {
        let printed = Printed {
            report: &run.report,
            bad_rows: bad,
        };
        print_json(out, &printed)?;
    } else {
        print_bad_rows(bad, out)?;
        if *op == DeviceOp::Show {
            print_records(&run.report, out)?;
        } else {
            print_outcomes(&run.report, out)?;
        }
    }
    if let Some(e) = run.error.take() {
        return Err(e.into());
    }
    let failed = run.report.devices.iter().filter(|d| !d.ok).count() + bad.len();
    if failed > 0 {
        return Err(CmdError::Failed(format!(
            "{}: {failed} of {} device(s) failed",
            op.name(),
            run.report.devices.len() + bad.len()
        )));
    }
    Ok(())
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
        writeln!(out, "stopped early: {}", crate::util::text::inert(e))?;
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
        writeln!(out, "stopped early: {}", crate::util::text::inert(e))?;
    }
    Ok(())
}
