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
    /// Inspect and re-queue what the service refused.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
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
