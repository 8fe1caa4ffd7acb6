//! `tapegate run`: the daemon in the foreground, as systemd starts it, until SIGTERM or
//! SIGINT (or, with `--until-drained`, until nothing deliverable is pending). Touches the
//! pipeline, and the config file only to warn of a password every user can read.

use std::path::Path;

use crate::config::{self, Config};
use crate::pipeline::{self, RunError, RunOptions, RunReport};

/// Runs the daemon on a runtime of its own. The outer `Err`: the runtime or the stop
/// signals could not be had.
pub fn run(
    config: Config,
    path: &Path,
    options: RunOptions,
) -> std::io::Result<Result<RunReport, RunError>> {
    if let Some(warning) = config::world_readable_password(path) {
        tracing::warn!("{warning}");
    }
    for warning in config.deprecations() {
        tracing::warn!("{warning}");
    }
    super::until_stopped(|stop| pipeline::run(config, stop, options))
}
