//! What a person gives a device command, checked before anything is sent: `--qr` with
//! the flags as a template, or a CSV manifest (`--csv FILE`, `-` for stdin; read by
//! `manifest.rs`), each row made a device of the command and checked by its rules; the
//! tape id of `device add`; JSON objects and free text. It touches nothing but files
//! and stdin.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use super::manifest::{self, BadRow, Row};
use super::shared::CELL;
use crate::cmd::CmdError;
use crate::operator::{check_id, DeviceEntry, DeviceOp};
use crate::record::Mac;
use crate::util::text::shown;

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
/// The text of `path`, or of stdin for `-`.
pub(super) fn read_input(path: &Path) -> Result<String, CmdError> {
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
pub(super) fn check_text(kind: &str, value: &str) -> Result<(), String> {
    if value.chars().count() > MAX_TEXT_CHARS {
        return Err(format!(
            "{kind} is {} characters long; at most {MAX_TEXT_CHARS} are taken",
            value.chars().count()
        ));
    }
    if matches!(crate::util::text::inert(value), std::borrow::Cow::Owned(_)) {
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
pub(super) struct Gathered {
    pub entries: Vec<DeviceEntry>,
    pub bad: Vec<BadRow>,
}

pub(super) fn gather(op: &DeviceOp, from: Devices<'_>) -> Result<Gathered, CmdError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
