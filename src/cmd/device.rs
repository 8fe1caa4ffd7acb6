//! `tapegate device add|label|relabel|show|deactivate|configure`: the device calls of
//! spec 4.6 and 4.7 through [`Operator`], with devices from `--qr` or a CSV file, a
//! table for a person or `--json`, and the exit code of DESIGN.md (0 every device
//! succeeded, 1 any failed, 2 usage). Also the shared set-up of the operator commands
//! ([`operator`]) and `--nearest` (the loudest unknown tape the daemon heard).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::CmdError;
use crate::api::rate::{open_state, RateGate};
use crate::api::{
    AddDevice, DeviceEntry, DeviceOp, DeviceReport, Operator, OperatorError, ServiceClient,
};
use crate::clock::now_ms;
use crate::config::Config;
use crate::outbox::{HeardTape, OutboxError, Store};
use crate::record::Mac;

/// `--nearest` considers tapes heard in this window...
pub const NEAREST_WINDOW_MS: i64 = 30_000;
/// ...and takes the loudest only when it is this much louder than the next.
pub const NEAREST_MARGIN_DB: i16 = 10;

/// The columns a CSV may name (the spec's field names, DESIGN.md).
pub const CSV_COLUMNS: &[&str] = &[
    "qrcode",
    "asset_barcode",
    "application_id",
    "shipment",
    "firmware",
    "metadata",
    "tape_displayname",
];

/// The state database for the operator commands: the daemon's, or a new one.
pub fn state(config: &Config) -> Result<Store, OutboxError> {
    open_state(&config.gateway.state_dir)
}

/// The operator's client for `config`: waits and retries are told on stderr.
pub fn operator(config: &Config) -> Result<Operator, CmdError> {
    let service = config.service.as_ref().ok_or(CmdError::NoService)?;
    let settings = config.operator.clone().ok_or(CmdError::NoService)?;
    let client = ServiceClient::new(service)?;
    let identity = format!(
        "{}/{}/{}",
        service.environment, service.endpoint.client_id, service.endpoint.username
    );
    let gate = RateGate::new(
        config.gateway.state_dir.clone(),
        identity,
        settings.rate_window,
        Box::new(|d: Duration| {
            super::say(&format!(
                "waiting {} s for the service's rate window",
                d.as_secs_f64().ceil() as u64
            ));
        }),
    );
    Ok(Operator::new(
        client,
        gate,
        settings,
        config.gateway.id.clone(),
        Box::new(|m: &str| super::say(m)),
    ))
}

/// A CSV row that cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRow {
    pub line: u64,
    pub message: String,
}

/// The devices of a CSV file, and its rows that cannot be sent.
#[derive(Debug, Default, PartialEq)]
pub struct CsvDevices {
    pub entries: Vec<DeviceEntry>,
    /// The line of each entry (0 for a `--qr` device).
    pub lines: Vec<u64>,
    pub bad: Vec<BadRow>,
}

/// Reads a devices CSV: a header row naming columns of [`CSV_COLUMNS`] that `op` uses
/// (`columns`; `qrcode` required), then one device a row. A column that is unknown or
/// that `op` does not use is an error naming it (nothing is sent); a bad row is
/// reported with its line number and not sent.
pub fn parse_csv(text: &str, op: &str, columns: &[&str]) -> Result<CsvDevices, String> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .flexible(true)
        .from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| format!("cannot read the header row: {e}"))?
        .iter()
        .map(str::to_string)
        .collect();
    for h in &header {
        if !CSV_COLUMNS.contains(&h.as_str()) {
            return Err(format!(
                "unknown column {h:?} in the header row; columns are {}",
                CSV_COLUMNS.join(", ")
            ));
        }
        if !columns.contains(&h.as_str()) {
            return Err(format!(
                "column {h:?} is not used by `device {op}`, which takes {}",
                columns.join(", ")
            ));
        }
    }
    if !header.iter().any(|h| h == "qrcode") {
        return Err("the header row has no qrcode column (it is required)".into());
    }
    let mut out = CsvDevices::default();
    for record in reader.records() {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                out.bad.push(BadRow {
                    line,
                    message: format!("cannot read the row: {e}"),
                });
                continue;
            }
        };
        let line = record.position().map_or(0, |p| p.line());
        if record.iter().all(str::is_empty) {
            continue;
        }
        match row(&header, &record) {
            Ok(e) => {
                out.entries.push(e);
                out.lines.push(line);
            }
            Err(message) => out.bad.push(BadRow { line, message }),
        }
    }
    Ok(out)
}

fn row(header: &[String], record: &csv::StringRecord) -> Result<DeviceEntry, String> {
    if record.len() != header.len() {
        return Err(format!(
            "{} fields, the header names {}",
            record.len(),
            header.len()
        ));
    }
    let mut e = DeviceEntry::default();
    for (name, value) in header.iter().zip(record.iter()) {
        let text = (!value.is_empty()).then(|| value.to_string());
        let json = |v: &str| -> Result<Option<Value>, String> {
            if v.is_empty() {
                return Ok(None);
            }
            match serde_json::from_str::<Value>(v) {
                Ok(j @ Value::Object(_)) => Ok(Some(j)),
                Ok(_) => Err(format!("{name} must be a JSON object, got {v}")),
                Err(err) => Err(format!("{name} is not JSON ({err}): {v}")),
            }
        };
        match name.as_str() {
            "qrcode" => e.qrcode = value.to_string(),
            "asset_barcode" => e.asset_barcode = text,
            "application_id" => e.application_id = text,
            "shipment" => e.shipment = json(value)?,
            "firmware" => e.firmware = text,
            "metadata" => e.metadata = json(value)?,
            "tape_displayname" => e.tape_displayname = text,
            _ => {}
        }
    }
    if e.qrcode.is_empty() {
        return Err("qrcode is empty".into());
    }
    Ok(e)
}

/// A JSON object given on the command line (`--shipment`, `--metadata`).
pub fn json_arg(flag: &str, v: Option<&str>) -> Result<Option<Value>, CmdError> {
    v.map(|v| match serde_json::from_str::<Value>(v) {
        Ok(j @ Value::Object(_)) => Ok(j),
        _ => Err(CmdError::Usage(format!(
            "{flag} must be a JSON object such as '{{\"awb\": \"123-45678901\"}}', got {v}"
        ))),
    })
    .transpose()
}

/// Where the devices of a multi-device command come from.
pub struct Devices<'a> {
    pub qr: &'a [String],
    pub csv: Option<&'a Path>,
    /// Applied to each `--qr` device (and to CSV rows for what they leave empty).
    pub template: DeviceEntry,
}

/// Rules per operation that a device must meet before it is sent.
fn check_entry(op: &DeviceOp, e: &DeviceEntry) -> Result<(), String> {
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
        _ => Ok(()),
    }
}

fn gather(op: &DeviceOp, columns: &[&str], from: Devices<'_>) -> Result<CsvDevices, CmdError> {
    let mut got = match from.csv {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CmdError::Usage(format!("cannot read {}: {e}", path.display())))?;
            parse_csv(&text, op.name(), columns)
                .map_err(|e| CmdError::Usage(format!("{}: {e}", path.display())))?
        }
        None => CsvDevices {
            entries: from
                .qr
                .iter()
                .map(|q| DeviceEntry {
                    qrcode: q.clone(),
                    ..from.template.clone()
                })
                .collect(),
            lines: vec![0; from.qr.len()],
            bad: Vec::new(),
        },
    };
    if got.entries.is_empty() && got.bad.is_empty() {
        return Err(CmdError::Usage("no devices: give --qr or --csv".into()));
    }
    let t = &from.template;
    let mut checked = Vec::with_capacity(got.entries.len());
    for (i, mut e) in std::mem::take(&mut got.entries).into_iter().enumerate() {
        e.asset_barcode = e.asset_barcode.or_else(|| t.asset_barcode.clone());
        e.application_id = e.application_id.or_else(|| t.application_id.clone());
        e.shipment = e.shipment.or_else(|| t.shipment.clone());
        e.firmware = e.firmware.or_else(|| t.firmware.clone());
        e.metadata = e.metadata.or_else(|| t.metadata.clone());
        match check_entry(op, &e) {
            Ok(()) => checked.push(e),
            // A --qr device breaking a rule is a usage error; a CSV row is a bad row.
            Err(m) if from.csv.is_none() => {
                return Err(CmdError::Usage(format!("{}: {m}", e.qrcode)))
            }
            Err(m) => got.bad.push(BadRow {
                line: got.lines.get(i).copied().unwrap_or(0),
                message: format!("{}: {m}", e.qrcode),
            }),
        }
    }
    got.entries = checked;
    Ok(got)
}

#[derive(Serialize)]
struct Printed<'a> {
    #[serde(flatten)]
    report: &'a DeviceReport,
    bad_rows: &'a [BadRow],
}

/// Runs a multi-device command and prints its report; `Err(Failed)` when any device
/// failed (exit 1).
pub async fn run_devices(
    config: &Config,
    op: DeviceOp,
    columns: &[&str],
    from: Devices<'_>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let op_name = op.name();
    let show = op == DeviceOp::Show;
    let devices = gather(&op, columns, from)?;
    let operator = operator(config)?;
    let report = if devices.entries.is_empty() {
        DeviceReport {
            operation: op_name,
            ..DeviceReport::default()
        }
    } else {
        operator
            .devices(op, devices.entries)
            .await
            .map_err(CmdError::from)?
    };
    if json {
        let printed = Printed {
            report: &report,
            bad_rows: &devices.bad,
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&printed).unwrap_or_default()
        )?;
    } else {
        for b in &devices.bad {
            writeln!(
                out,
                "line {}: {} (not sent)",
                b.line,
                crate::text::inert(&b.message)
            )?;
        }
        if show {
            print_records(&report, out)?;
        } else {
            print_outcomes(&report, out)?;
        }
    }
    let failed = report.devices.iter().filter(|d| !d.ok).count() + devices.bad.len();
    if failed > 0 {
        return Err(CmdError::Failed(format!(
            "{op_name}: {failed} of {} device(s) failed",
            report.devices.len() + devices.bad.len()
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
        writeln!(
            out,
            "{:<20} {:<8} {:<24} {}",
            crate::text::inert(&d.qrcode),
            if d.ok { "ok" } else { "FAILED" },
            crate::text::inert(d.error_code.as_deref().unwrap_or("-")),
            crate::text::shown(
                d.note.as_deref().unwrap_or(""),
                crate::text::SHOWN_MAX_CHARS
            )
        )?;
    }
    let ok = report.devices.iter().filter(|d| d.ok).count();
    writeln!(
        out,
        "{}: {ok} of {} device(s) succeeded in {} request(s)",
        report.operation,
        report.devices.len(),
        report.requests
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
                "{:<20} {}",
                crate::text::inert(&d.qrcode),
                crate::text::inert(d.error_code.as_deref().unwrap_or("FAILED"))
            )?;
            continue;
        };
        let label = r.label.as_ref();
        let dash = |v: Option<&str>| crate::text::inert(v.unwrap_or("-")).into_owned();
        writeln!(
            out,
            "{:<20} {:<22} {:<13} {:<16} {:<12} {:<9} {}",
            crate::text::inert(&d.qrcode),
            dash(r.status.as_deref()),
            dash(r.mac.as_deref()),
            dash(label.and_then(|l| l.asset_barcode.as_deref())),
            dash(label.and_then(|l| l.application_id.as_deref())),
            dash(r.firmware.as_deref()),
            dash(r.tape_displayname.as_deref()),
        )?;
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

/// `device add`'s options.
pub struct AddArgs {
    pub add: AddDevice,
    /// The tape's MAC when it is one (given or chosen): its dead letters are re-queued.
    pub mac: Option<Mac>,
    pub nearest: bool,
    pub json: bool,
}

#[derive(Serialize)]
struct Added<'a> {
    #[serde(flatten)]
    outcome: &'a crate::api::AddOutcome,
    requeued_dead_letters: u64,
}

/// `device add`: one tape (`--tape-id`, or `--nearest`), then its dead letters back in
/// the outbox.
pub async fn add(config: &Config, mut args: AddArgs, out: &mut dyn Write) -> Result<(), CmdError> {
    let service = config.service.as_ref().ok_or(CmdError::NoService)?;
    if args.nearest {
        let store = state(config)?;
        let since = now_ms() - NEAREST_WINDOW_MS;
        match choose_nearest(&store.heard_since(since)?, since) {
            Nearest::Chosen(h) => {
                writeln!(
                    out,
                    "nearest unknown tape: {} ({} dBm)",
                    h.mac,
                    h.best_rssi.unwrap_or_default()
                )?;
                args.add.tape_id = service.mac_format.format(h.mac);
                args.mac = Some(h.mac);
            }
            Nearest::Unclear(c) if c.is_empty() => {
                return Err(CmdError::Failed(format!(
                    "--nearest: no tape unknown to the service was heard in the last {} s (is the daemon running and the tape beside the gateway?)",
                    NEAREST_WINDOW_MS / 1000
                )));
            }
            Nearest::Unclear(c) => {
                writeln!(
                    out,
                    "no tape is {NEAREST_MARGIN_DB} dB louder than the others; candidates heard in the last {} s:",
                    NEAREST_WINDOW_MS / 1000
                )?;
                writeln!(out, "{:<17} {:>5}", "mac", "rssi")?;
                for h in &c {
                    writeln!(out, "{:<17} {:>5}", h.mac, h.best_rssi.unwrap_or_default())?;
                }
                return Err(CmdError::Failed(format!(
                    "--nearest: {} candidate tapes; move the one to activate closer, or give --tape-id",
                    c.len()
                )));
            }
        }
    }
    if let Some(mac) = args.mac {
        // As the daemon sends it in mac_id, whatever separators were typed.
        args.add.tape_id = service.mac_format.format(mac);
    }
    let operator = operator(config)?;
    let outcome = operator.add_device(&args.add).await?;
    let requeued = match args.mac {
        Some(mac) => state(config)?.retry_dead_letters(Some(mac))?,
        None => 0,
    };
    if args.json {
        let printed = Added {
            outcome: &outcome,
            requeued_dead_letters: requeued,
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&printed).unwrap_or_default()
        )?;
    } else {
        writeln!(
            out,
            "added {} (tape {}): HTTP {} {} [correlation id {}]",
            crate::text::inert(&outcome.qrcode),
            crate::text::inert(&outcome.tape_id),
            outcome.status,
            crate::text::shown(&outcome.message, crate::text::SHOWN_MAX_CHARS),
            outcome.correlation_id
        )?;
        if let Some(mac) = args.mac {
            writeln!(out, "re-queued {requeued} dead letter(s) of {mac}")?;
        }
    }
    Ok(())
}

impl From<OperatorError> for CmdError {
    fn from(e: OperatorError) -> Self {
        match e {
            OperatorError::Usage(m) => CmdError::Usage(m),
            OperatorError::Api(a) => CmdError::Api(a),
            OperatorError::State(s) => CmdError::Outbox(s),
            other => CmdError::Failed(other.to_string()),
        }
    }
}

const LABEL_COLUMNS: &[&str] = &["qrcode", "asset_barcode", "application_id", "shipment"];
const LIST_COLUMNS: &[&str] = &["qrcode"];
const CONFIG_COLUMNS: &[&str] = &[
    "qrcode",
    "asset_barcode",
    "firmware",
    "metadata",
    "tape_displayname",
];

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
    let (op, columns, devices, template) = match device {
        D::Add(a) => {
            let mac = a.tape_id.as_deref().and_then(|t| t.parse::<Mac>().ok());
            let args = AddArgs {
                add: AddDevice {
                    qrcode: a.qr.clone(),
                    tape_id: a.tape_id.clone().unwrap_or_default(),
                    app_id: a.app_id.clone(),
                    tape_type: a.tape_type.clone(),
                    asset: a.asset.clone(),
                    description: a.description.clone(),
                    facility: a.facility.clone(),
                    override_existing: a.override_existing,
                },
                mac,
                nearest: a.nearest,
                json: a.json,
            };
            return add(config, args, out).await;
        }
        D::Label(l) => (
            DeviceOp::Label {
                override_label: l.override_label,
            },
            LABEL_COLUMNS,
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
            LABEL_COLUMNS,
            &l.devices,
            DeviceEntry {
                asset_barcode: l.asset.clone(),
                shipment: json_arg("--shipment", l.shipment.as_deref())?,
                ..DeviceEntry::default()
            },
        ),
        D::Show(l) => (
            DeviceOp::Show,
            LIST_COLUMNS,
            &l.devices,
            DeviceEntry::default(),
        ),
        D::Deactivate(l) => (
            DeviceOp::Deactivate,
            LIST_COLUMNS,
            &l.devices,
            DeviceEntry::default(),
        ),
        D::Configure(c) => (
            DeviceOp::Configure,
            CONFIG_COLUMNS,
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
    run_devices(config, op, columns, from, devices.json, out).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &[&str] = &["qrcode", "asset_barcode", "application_id", "shipment"];

    #[test]
    fn a_csv_row_is_a_device_and_json_columns_are_objects() {
        let text =
            "qrcode,asset_barcode,shipment\nTT1,AWB-1,\"{\"\"awb\"\": \"\"123\"\"}\"\nTT2,AWB-2,\n";
        let got = parse_csv(text, "label", LABEL).unwrap();
        assert!(got.bad.is_empty(), "{:?}", got.bad);
        assert_eq!(got.entries.len(), 2);
        assert_eq!(
            got.entries[0].shipment,
            Some(serde_json::json!({"awb": "123"}))
        );
        assert_eq!(got.entries[1].asset_barcode.as_deref(), Some("AWB-2"));
    }

    #[test]
    fn an_unknown_column_is_an_error_naming_it() {
        let err = parse_csv("qrcode,colour\nTT1,red\n", "label", LABEL).unwrap_err();
        assert!(err.contains("\"colour\""), "{err}");
        let err = parse_csv("qrcode,firmware\nTT1,1.0\n", "label", LABEL).unwrap_err();
        assert!(err.contains("not used by `device label`"), "{err}");
        let err = parse_csv("asset_barcode\nA\n", "label", LABEL).unwrap_err();
        assert!(err.contains("no qrcode column"), "{err}");
    }

    #[test]
    fn a_malformed_row_names_its_line_and_the_others_are_kept() {
        let text = "qrcode,asset_barcode,shipment\nTT1,AWB-1,\nTT2,AWB-2,{not json\n,AWB-3,\nTT4,AWB-4\nTT5,AWB-5,\n";
        let got = parse_csv(text, "label", LABEL).unwrap();
        let lines: Vec<u64> = got.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [3, 4, 5], "{:?}", got.bad);
        assert!(got.bad[0].message.contains("shipment is not JSON"));
        let kept: Vec<&str> = got.entries.iter().map(|e| e.qrcode.as_str()).collect();
        assert_eq!(kept, ["TT1", "TT5"]);
    }

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
