//! `[outbox]`'s retention keys, `max_age_secs` and `max_bytes`, raw to typed (on their
//! own: validate.rs holds the rest of the section). 0 means no bound.

use std::time::Duration;

use super::validate::Check;
use super::DEFAULTS;

/// The least `max_bytes` that leaves room for a commit group and the other tables.
pub const MIN_MAX_BYTES: u64 = 1024 * 1024;

/// (`max_age`, `max_bytes`), `None` for a bound that is off.
pub(super) fn bounds(
    max_age_secs: Option<u64>,
    max_bytes: Option<u64>,
    c: &mut Check,
) -> (Option<Duration>, Option<u64>) {
    let age = c.int(
        "outbox.max_age_secs",
        max_age_secs,
        DEFAULTS.outbox.max_age_secs,
        0,
        10 * 365 * 86_400,
    );
    let bytes = match max_bytes.unwrap_or(DEFAULTS.outbox.max_bytes) {
        0 => None,
        b if (MIN_MAX_BYTES..=1 << 40).contains(&b) => Some(b),
        b => {
            c.bad(
                "outbox.max_bytes",
                b,
                "0 (no bound) or a size in bytes from 1048576 (1 MiB) to 1099511627776 (1 TiB)",
            );
            None
        }
    };
    ((age > 0).then(|| Duration::from_secs(age)), bytes)
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::{parse, problems};

    #[test]
    fn retention_keys_default_to_a_size_bound_and_no_age_bound() {
        let c = parse("", &[]).unwrap();
        assert_eq!(c.outbox.max_age, None);
        assert_eq!(c.outbox.max_bytes, Some(268_435_456));
        let c = parse("[outbox]\nmax_age_secs = 86400\nmax_bytes = 0\n", &[]).unwrap();
        assert_eq!(c.outbox.max_age.unwrap().as_secs(), 86_400);
        assert_eq!(c.outbox.max_bytes, None);
        let shown: Vec<String> = problems("[outbox]\nmax_bytes = 1000\n", &[])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            shown[0].starts_with("outbox.max_bytes = 1000: expected 0 (no bound) or a size"),
            "{shown:?}"
        );
    }
}
