//! `[readings]`: deprecated (the gateway keeps no history of readings since catch-up);
//! its one key is still read and checked, and warned of. Raw to typed; touches its raw
//! section only.

use std::time::Duration;

use super::problem::Check;
use super::raw::RawReadings;
use super::DEFAULTS;

#[derive(Debug, Clone)]
pub struct ReadingsSettings {
    /// Deprecated: no reading history is kept, so nothing is pruned by it.
    /// Still read and checked, so that a config that sets it keeps working.
    pub retention: Duration,
    /// `readings.retention_hours` was set (in the file or the environment): warned of.
    pub retention_set: bool,
}

pub(super) fn validate(r: RawReadings, c: &mut Check) -> ReadingsSettings {
    let retention_set = r.retention_hours.is_some();
    ReadingsSettings {
        retention_set,
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

#[cfg(test)]
mod tests {
    use crate::config::test_support::parse;

    #[test]
    fn a_retention_of_readings_is_accepted_and_warned_of_as_without_effect() {
        assert!(parse("", &[]).unwrap().deprecations().is_empty());
        for (text, env) in [
            ("[readings]\nretention_hours = 24\n", vec![]),
            ("", vec![("TAPEGATE_READINGS__RETENTION_HOURS", "24")]),
        ] {
            let warned = parse(text, &env).unwrap().deprecations();
            assert_eq!(warned.len(), 1, "{warned:?}");
            assert!(warned[0].contains("readings.retention_hours has no effect"));
        }
        // Still checked: a value that never made sense is refused as before.
        assert!(parse("[readings]\nretention_hours = 0\n", &[]).is_err());
    }
}
