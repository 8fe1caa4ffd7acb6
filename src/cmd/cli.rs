//! The command line (clap derive): what a person may type, and nothing else. It touches
//! the config's default path and the types its arguments parse into.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::record::Mac;

/// tapegate: BLE advertisements of asset-tracking tapes → durable outbox → tracking service.
#[derive(Debug, Parser)]
#[command(
    name = "tapegate",
    version = env!("TAPEGATE_VERSION_LINE"),
    about,
    propagate_version = true
)]
pub struct Cli {
    /// The config file (the .toml files of config.d/ beside it are read over it).
    #[arg(long, global = true, env = "TAPEGATE_CONFIG", default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: hear the tapes, keep what is heard, deliver it to the service.
    Run {
        /// Exit 0 once the source has ended and nothing deliverable is pending.
        #[arg(long)]
        until_drained: bool,
    },
    /// How the gateway is doing: captures waiting, delivered, refused, the last delivery
    /// and the last error (works while the daemon runs).
    Status {
        /// One JSON document on stdout (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Check the config, the account and the way to the service; exit 0 only if all is
    /// well.
    Check {
        /// Only check the config (no network, no password read).
        #[arg(long)]
        config_only: bool,
    },
    /// The tapes decoded recently: QR code, MAC, temperature, battery, RSSI, last seen.
    Tapes {
        /// One JSON document on stdout (for scripts).
        #[arg(long)]
        json: bool,
        /// Show at most this many tapes, the most recently decoded first.
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
    /// Ask the service to decode one packet of one tape (to check a tape by hand).
    Decode {
        /// The tape's MAC (any case, with or without separators).
        #[arg(long)]
        mac: Mac,
        /// The packet, written as the product's packet_encoding says (hex by default).
        #[arg(long)]
        packet: String,
        /// The product it is (default: the first product of the config).
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
    /// management socket and hands it to systemd for the daemon (docs/ble.md, "The side
    /// channel"). Always exits 0: without Bluetooth the daemon reads adverts over D-Bus.
    #[command(hide = true)]
    SideChannel,
    /// Run the mock tracking service on its own (to try a gateway without an account).
    #[cfg(feature = "mock")]
    Mock {
        /// The address to serve on.
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
        /// Show at most this many, the newest first.
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
    /// Activate a tape: register it with the service by its QR code and its MAC (or as
    /// the tape held to the gateway).
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
    /// The application the tape is activated for (default: default_app_id of the
    /// environment).
    #[arg(long)]
    pub app_id: Option<String>,
    /// The tape's type, e.g. Green or Black (default: default_tape_type of the
    /// environment).
    #[arg(long)]
    pub tape_type: Option<String>,
    /// What the tape goes on: the asset's identifier (AWB, shipment number, asset id).
    #[arg(long)]
    pub asset: Option<String>,
    /// A description of the asset.
    #[arg(long)]
    pub description: Option<String>,
    /// The facility where the tape is activated (its id).
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
    /// The new asset barcode of the --qr devices.
    #[arg(long, conflicts_with = "csv")]
    pub asset: Option<String>,
    /// A new shipment, as a JSON object.
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
    /// The firmware version to put on the devices.
    #[arg(long)]
    pub firmware: Option<String>,
    /// Metadata to set on the devices, as a JSON object.
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
    /// Activate, label, look up, deactivate and configure tapes.
    #[command(subcommand)]
    Device(Device),
    /// The latest location of an AWB, or (--sensor) an asset's latest sensor reading.
    Locate {
        /// The AWB number, or with --sensor the device's asset barcode.
        asset_id: String,
        /// Read a device's latest sensor readings (ASSET_ID is then its asset barcode).
        #[arg(long)]
        sensor: bool,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// A tape's or an asset's history: where it was and what it measured, up to a year
    /// back.
    History {
        /// The tape's QR code.
        #[arg(long, conflicts_with = "asset", required_unless_present = "asset")]
        qr: Option<String>,
        /// The customer asset identifier.
        #[arg(long)]
        asset: Option<String>,
        /// Only location events, or only environment (sensor) events (default: both).
        #[arg(long = "type", value_parser = [
            clap::builder::PossibleValue::new("location").help("where it was"),
            clap::builder::PossibleValue::new("environment").help("what it measured"),
        ])]
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
    /// Send a message to the service: a device's reading, a shipment manifest or an air
    /// cargo booking, checked before it is sent.
    Message {
        /// What the message is.
        #[arg(value_enum)]
        message_type: crate::operator::MessageType,
        /// The file holding the message's data, a JSON object (`-`: stdin).
        file: PathBuf,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every command and every option says what it is for, in the words of a dock: no
    /// option without help, no reference to the spec's sections an installer does not
    /// have.
    #[test]
    fn every_command_and_option_has_help_in_a_docks_words() {
        fn visit(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name()).trim().to_string();
            let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
            if about.is_empty() && !cmd.is_hide_set() {
                missing.push(format!("`{path}` has no help"));
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.is_empty() {
                    missing.push(format!("`{path}`: {id} has no help"));
                }
                if arg.get_action().takes_values() {
                    for value in arg.get_possible_values() {
                        if value.get_help().is_none() {
                            missing.push(format!(
                                "`{path}`: {id}'s value {} has no help",
                                value.get_name()
                            ));
                        }
                    }
                }
                if help.contains("spec ") {
                    missing.push(format!("`{path}`: {id} cites the spec: {help}"));
                }
            }
            if about.contains("spec ") {
                missing.push(format!("`{path}` cites the spec: {about}"));
            }
            for sub in cmd.get_subcommands() {
                visit(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        visit(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// `tapegate --version` names the commit too, as the inventory does, so that a
    /// support question can start from it.
    #[test]
    fn the_version_names_the_commit() {
        let version = Cli::command().render_version();
        assert_eq!(
            version.trim(),
            format!(
                "tapegate {} (commit {})",
                env!("CARGO_PKG_VERSION"),
                crate::inventory::COMMIT
            )
        );
    }
}
