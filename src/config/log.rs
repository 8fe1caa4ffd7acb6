//! `[log]`: the level (a tracing filter) the daemon logs at. Raw to typed; touches its
//! raw section only.

use super::problem::Check;
use super::raw::RawLog;
use super::DEFAULTS;

#[derive(Debug, Clone)]
pub struct LogSettings {
    /// A tracing filter (`info`, `tapegate=debug`); `RUST_LOG` wins when set.
    pub level: String,
}

pub(super) fn validate(l: RawLog, c: &mut Check) -> LogSettings {
    let level = l.level.unwrap_or_else(|| DEFAULTS.log.level.into());
    if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
        c.bad(
            "log.level",
            format!("{level:?}"),
            "a level (error, warn, info, debug, trace) or a tracing filter",
        );
    }
    LogSettings { level }
}
