//! The command line (clap derive): what a person may type, and nothing else. It touches
//! the config's default path and the types its arguments parse into.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::record::Mac;

/// tapegate: BLE advertisements of asset-tracking tapes → durable outbox → tracking service.
#[derive(Debug, Parser)]
#[command(name = "tapegate", version, about, propagate_version = true)]
pub struct Cli {
    /// Config file.
    #[arg(long, global = true, env = "TAPEGATE_CONFIG", default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Run {
        /// Exit 0 once the source has ended and nothing deliverable is pending.
        #[arg(long)]
        until_drained: bool,
    },
    /// Show the outbox: pending, delivered, dead letters, last flush, last error.
    Status {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Validate the config, fetch a token, reach the decode endpoint; exit 0 only if all work.
    Check {
        /// Only validate the config (no network).
        #[arg(long)]
        config_only: bool,
    },
    /// The tapes decoded recently: QR code, MAC, temperature, battery, RSSI, last seen.
    Tapes {
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Live view for installers: the adverts heard (MAC, RSSI, product, packet), and a
    /// recorder of JSON Lines records that the replay source reads.
    Scan {
        /// Also write the shown adverts to this file (JSON Lines, as `replay` reads).
        #[arg(long)]
        record: Option<PathBuf>,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        duration: Option<f64>,
        /// Show every advert, not only those matching a product.
        #[arg(long)]
        all: bool,
    },
    /// Decode one packet with the single decode endpoint (for checking a tape).
    Decode {
        /// The tape's MAC (any case, with or without separators).
        #[arg(long)]
        mac: Mac,
        /// The ble_packet, encoded as the product's packet_encoding says (hex by default).
        #[arg(long)]
        packet: String,
        /// product_id (default: the first product's).
        #[arg(long)]
        product: Option<String>,
    },
    /// Inspect and re-queue what the service refused.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// One .tar.gz to mail to support: status, the effective config (secrets redacted),
    /// the last 24 h of WARN+ journal records, scanner counts, versions, dead letters,
    /// clock repairs. No secret is in it.
    SupportBundle {
        /// Where to write it (default: tapegate-support-<gateway>-<time>.tar.gz here).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// The operator's commands, which talk to the rest of the service.
    #[command(flatten)]
    Operator(Operator),
    /// Everything on loopback: simulated tapes, the mock service, the daemon. No config needed.
    #[cfg(feature = "mock")]
    Demo {
        /// Stop after this many seconds (default: run until Ctrl-C).
        #[arg(long)]
        duration: Option<f64>,
        /// Simulated tapes.
        #[arg(long, default_value_t = 300)]
        tapes: usize,
        /// Keep the state database in this directory (default: a temporary one, removed at the end).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Serve /metrics, /healthz and the status page on this address (`[http] listen`),
        /// e.g. 127.0.0.1:9464.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
    },
    /// The unit's privileged start step (`ExecStartPre=+`): opens the kernel's Bluetooth
    /// management socket and hands it to systemd for the daemon (README, "The side
    /// channel"). Always exits 0: without Bluetooth the daemon reads adverts over D-Bus.
    #[command(hide = true)]
    SideChannel,
    /// Run the mock tracking service on its own (to try a gateway without an account).
    #[cfg(feature = "mock")]
    Mock {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Append each decode item received to this file, one JSON line each (for tests
        /// that read what a gateway delivered from outside the process).
        #[arg(long)]
        record: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadLetters {
    /// List stored dead letters, newest first.
    List {
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Move dead letters back to the outbox to be sent again.
    Retry(Which),
    /// Delete stored dead letters.
    Purge(Which),
}

#[derive(Debug, Subcommand)]
pub enum Device {
    /// Activate a tape (POST /devices/v1/parcel).
    Add(DeviceAdd),
    /// Label devices to assets (activates them).
    Label(DeviceLabel),
    /// Change labels (never creates one).
    Relabel(DeviceRelabel),
    /// Look up labels and statuses.
    Show(DeviceList),
    /// Deactivate devices (a deactivated one counts as success).
    Deactivate(DeviceList),
    /// Apply a firmware and/or metadata change.
    Configure(DeviceConfigure),
}

#[derive(Debug, Args)]
pub struct DeviceAdd {
    /// The tape's QR code.
    #[arg(long, required_unless_present = "csv")]
    pub qr: Option<String>,
    /// The tape's MAC address (any common spelling) or UUID.
    #[arg(long, required_unless_present_any = ["nearest", "csv"], conflicts_with = "nearest")]
    pub tape_id: Option<String>,
    /// The unknown tape the daemon heard loudest in the last 30 s.
    #[arg(long)]
    pub nearest: bool,
    /// Many tapes from a CSV file (`-`: stdin): columns qrcode and tape_id, and
    /// optionally application_id, tt, abc, abcd, facility_id (other known columns are
    /// ignored).
    #[arg(long, conflicts_with_all = ["qr", "tape_id", "nearest"])]
    pub csv: Option<PathBuf>,
    /// appId (default: default_app_id of the environment).
    #[arg(long)]
    pub app_id: Option<String>,
    /// tt, e.g. Green or Black (default: default_tape_type of the environment).
    #[arg(long)]
    pub tape_type: Option<String>,
    /// abc: the customer asset identifier (AWB, shipment number, asset id).
    #[arg(long)]
    pub asset: Option<String>,
    /// abcd: the asset's description.
    #[arg(long)]
    pub description: Option<String>,
    /// facility_id: where the tape is activated.
    #[arg(long)]
    pub facility: Option<String>,
    /// Delete and recreate an existing record (its label goes with it).
    #[arg(long = "override")]
    pub override_existing: bool,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Devices from `--qr` (repeatable) or a CSV file.
#[derive(Debug, Args)]
pub struct DeviceSource {
    /// A QR code (repeat for more).
    #[arg(long, required_unless_present = "csv")]
    pub qr: Vec<String>,
    /// A CSV file (`-`: stdin): a header row naming the columns (qrcode, asset_barcode, application_id, shipment, firmware, metadata, tape_displayname; the add columns are taken and ignored), one device a row.
    #[arg(long, conflicts_with = "qr")]
    pub csv: Option<PathBuf>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DeviceLabel {
    #[command(flatten)]
    pub devices: DeviceSource,
    /// The asset barcode of the --qr devices.
    #[arg(long, conflicts_with = "csv")]
    pub asset: Option<String>,
    /// The application id (default: default_app_id of the environment).
    #[arg(long)]
    pub app: Option<String>,
    /// A shipment, as a JSON object.
    #[arg(long)]
    pub shipment: Option<String>,
    /// Replace existing labels (a deactivated device stays deactivated).
    #[arg(long = "override")]
    pub override_label: bool,
}

#[derive(Debug, Args)]
pub struct DeviceRelabel {
    #[command(flatten)]
    pub devices: DeviceSource,
    #[arg(long, conflicts_with = "csv")]
    pub asset: Option<String>,
    #[arg(long)]
    pub shipment: Option<String>,
}

#[derive(Debug, Args)]
pub struct DeviceList {
    #[command(flatten)]
    pub devices: DeviceSource,
}

#[derive(Debug, Args)]
pub struct DeviceConfigure {
    #[command(flatten)]
    pub devices: DeviceSource,
    #[arg(long)]
    pub firmware: Option<String>,
    /// A JSON object.
    #[arg(long)]
    pub metadata: Option<String>,
}

#[derive(Debug, Args)]
pub struct Which {
    /// Only the dead letters of this MAC (default: all).
    #[arg(long)]
    pub mac: Option<Mac>,
}

/// The operator's commands (shown among the others): each talks to the service with the
/// config's password.
#[derive(Debug, Subcommand)]
pub enum Operator {
    /// Activate, label, look up, deactivate and configure tapes (spec 4.6, 4.7).
    #[command(subcommand)]
    Device(Device),
    /// The latest location of an AWB, or (--sensor) an asset's latest sensor reading.
    Locate {
        /// The AWB number, or with --sensor the device's asset barcode.
        asset_id: String,
        #[arg(long)]
        sensor: bool,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// A tape's or an asset's history, up to a year back (spec 4.2).
    History {
        /// The tape's QR code.
        #[arg(long, conflicts_with = "asset", required_unless_present = "asset")]
        qr: Option<String>,
        /// The customer asset identifier.
        #[arg(long)]
        asset: Option<String>,
        #[arg(long = "type", value_parser = ["location", "environment"])]
        event_type: Option<String>,
        /// RFC 3339 (2026-05-01T00:00:00Z) or a date (2026-05-01, midnight UTC).
        #[arg(long)]
        from: Option<String>,
        /// RFC 3339 or a date; default now.
        #[arg(long)]
        to: Option<String>,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Send an integration message (spec 4.5); FILE holds the `data` object (`-`: stdin).
    Message {
        #[arg(value_enum)]
        message_type: crate::operator::MessageType,
        file: PathBuf,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
}
