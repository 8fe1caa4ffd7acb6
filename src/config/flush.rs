//! `[flush]`: how captures are batched and sent to the bulk decode endpoint and how
//! failures back off. Raw to typed; touches its raw section only.

use std::time::Duration;

use super::problem::Check;
use super::raw::RawFlush;
use super::DEFAULTS;

#[derive(Debug, Clone)]
pub struct FlushSettings {
    /// 1..=250.
    pub max_batch: usize,
    pub max_delay: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Batches in flight at most (1..=64); the adaptive limit stays below it.
    pub max_in_flight: usize,
    /// A capture that fails on its own this many times (or that this many answers leave
    /// out) becomes a dead letter with the cause.
    pub max_attempts: u32,
}

pub(super) fn validate(f: RawFlush, c: &mut Check) -> FlushSettings {
    let backoff_initial = Duration::from_millis(c.int(
        "flush.backoff_initial_ms",
        f.backoff_initial_ms,
        DEFAULTS.flush.backoff_initial_ms,
        1,
        3_600_000,
    ));
    let backoff_max = Duration::from_secs(c.int(
        "flush.backoff_max_secs",
        f.backoff_max_secs,
        DEFAULTS.flush.backoff_max_secs,
        1,
        86_400,
    ));
    if backoff_max < backoff_initial {
        c.bad(
            "flush.backoff_max_secs",
            backoff_max.as_secs(),
            "at least flush.backoff_initial_ms",
        );
    }
    FlushSettings {
        max_batch: c.int(
            "flush.max_batch",
            f.max_batch,
            DEFAULTS.flush.max_batch,
            1,
            250,
        ) as usize,
        max_delay: c.secs(
            "flush.max_delay_secs",
            f.max_delay_secs,
            DEFAULTS.flush.max_delay_secs,
            0.0,
            3600.0,
        ),
        backoff_initial,
        backoff_max,
        max_in_flight: c.int(
            "flush.max_in_flight",
            f.max_in_flight,
            DEFAULTS.flush.max_in_flight,
            1,
            64,
        ) as usize,
        max_attempts: c.int(
            "flush.max_attempts",
            f.max_attempts,
            DEFAULTS.flush.max_attempts,
            1,
            100,
        ) as u32,
    }
}
