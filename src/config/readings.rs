//! `[readings]`: how long decoded readings are kept in the state database. Raw to
//! typed; touches its raw section only.

use std::time::Duration;

use super::problem::Check;
use super::raw::RawReadings;
use super::DEFAULTS;

#[derive(Debug, Clone)]
pub struct ReadingsSettings {
    /// Decoded readings older than this are deleted (the latest of each tape is kept).
    pub retention: Duration,
}

pub(super) fn validate(r: RawReadings, c: &mut Check) -> ReadingsSettings {
    ReadingsSettings {
        retention: Duration::from_secs(
            3600 * c.int(
                "readings.retention_hours",
                r.retention_hours,
                DEFAULTS.readings.retention_hours,
                1,
                24 * 3650,
            ),
        ),
    }
}
