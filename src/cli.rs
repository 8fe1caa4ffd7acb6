//! The command line (clap derive).

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
    /// Run the mock tracking service on its own (to try a gateway without an account).
    #[cfg(feature = "mock")]
    Mock {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadLetters {
    /// List stored dead letters, newest first.
    List {
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

#[derive(Debug, Args)]
pub struct Which {
    /// Only the dead letters of this MAC (default: all).
    #[arg(long)]
    pub mac: Option<Mac>,
}
