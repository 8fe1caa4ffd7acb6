//! `[dedup]`: how long a MAC's repeats are held back and how many MACs are tracked.
//! Raw to typed [`DedupSettings`]; touches its raw section only.

use super::problem::Check;
use super::raw::RawDedup;
use super::DEFAULTS;
use crate::dedup::DedupSettings;

pub(super) fn validate(d: RawDedup, c: &mut Check) -> DedupSettings {
    DedupSettings {
        window_ms: c
            .secs(
                "dedup.window_secs",
                d.window_secs,
                DEFAULTS.dedup.window_secs,
                0.0,
                86_400.0,
            )
            .as_millis() as i64,
        min_interval_ms: c
            .secs(
                "dedup.min_interval_secs",
                d.min_interval_secs,
                DEFAULTS.dedup.min_interval_secs,
                0.0,
                86_400.0,
            )
            .as_millis() as i64,
        max_tracked: c.int(
            "dedup.max_tracked",
            d.max_tracked,
            DEFAULTS.dedup.max_tracked,
            1,
            10_000_000,
        ) as usize,
    }
}
