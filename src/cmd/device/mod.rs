//! `tapegate device add|label|relabel|show|deactivate|configure`: the device calls of
//! spec 4.6 and 4.7 through the operator room, with devices from `--qr` or a CSV
//! manifest (`--csv FILE`, `-` for stdin), a table for a person or one JSON document
//! with `--json`, and the exit code of DESIGN.md (0 every device succeeded, 1 any
//! failed, 2 usage or config). It may touch the operator's client (`cmd::operator_run`) and,
//! for `add`, the state database.
//!
//! What a person typed is checked before anything is sent. This file dispatches the
//! command line to the files under it. Every text that came from elsewhere (the service,
//! the CSV file) goes through [`crate::util::text`] before it is printed.

mod add;
mod input;
pub mod manifest;
mod many;
mod nearest;
mod shared;

use std::io::Write;

use super::CmdError;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::operator::{DeviceEntry, DeviceOp};
use add::{add, add_rows, AddArgs};
use input::{json_arg, Devices};
use many::run_devices;

pub use add::AddRow;
pub use input::{parse_tape_id, TapeId, CSV_COLUMNS};
pub use nearest::{choose_nearest, Nearest, NEAREST_MARGIN_DB, NEAREST_WINDOW_MS};
pub use shared::Added;

/// `tapegate device ...` from its command line.
pub async fn run(
    config: &Config,
    clock: &SharedClock,
    device: &crate::cmd::cli::Device,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    use crate::cmd::cli::Device as D;
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
            return add(config, clock, args, out).await;
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
    run_devices(config, clock, op, from, devices.json, out).await
}
