//! `[outbox]`: how many captures the state database holds and for how long and how
//! large (`max_pending`, `max_age_secs`, `max_bytes`: 0 means no bound), and how hard a
//! commit holds. Raw to typed; touches its raw section only.

use std::time::Duration;

use super::problem::Check;
use super::raw::RawOutbox;
use super::DEFAULTS;

/// How hard a commit holds (`outbox.durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every committed group is on disk before it counts as accepted (fsync per commit).
    Full,
    /// A power cut can lose the last commits (WAL synced only at checkpoints); a crash of
    /// the process cannot.
    Normal,
}

/// The age and size bounds as the store takes them (`max_pending` is in the outbox's
/// `StoreOptions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// `outbox.max_age_secs` in milliseconds; `None`: no age bound.
    pub max_age_ms: Option<i64>,
    /// `outbox.max_bytes`; `None`: no size bound.
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct OutboxSettings {
    pub max_pending: u64,
    pub durability: Durability,
    pub commit_interval: Duration,
    /// `max_age_secs`; `None` (0 in the file): no age bound.
    pub max_age: Option<Duration>,
    /// `max_bytes`; `None` (0 in the file): no size bound.
    pub max_bytes: Option<u64>,
}

impl OutboxSettings {
    /// The age and size bounds, as the store takes them.
    pub fn retention(&self) -> Retention {
        Retention {
            max_age_ms: self.max_age.map(|d| d.as_millis() as i64),
            max_bytes: self.max_bytes,
        }
    }
}

pub(super) fn validate(o: RawOutbox, c: &mut Check) -> OutboxSettings {
    let (max_age, max_bytes) = bounds(o.max_age_secs, o.max_bytes, c);
    OutboxSettings {
        max_age,
        max_bytes,
        max_pending: c.int(
            "outbox.max_pending",
            o.max_pending,
            DEFAULTS.outbox.max_pending,
            1,
            1_000_000_000,
        ),
        durability: c.choice(
            "outbox.durability",
            o.durability.as_deref(),
            DEFAULTS.outbox.durability,
            &[("full", Durability::Full), ("normal", Durability::Normal)],
        ),
        commit_interval: Duration::from_millis(c.int(
            "outbox.commit_interval_ms",
            o.commit_interval_ms,
            DEFAULTS.outbox.commit_interval_ms,
            1,
            10_000,
        )),
    }
}

/// The least `max_bytes` that leaves room for a commit group and the other tables.
pub const MIN_MAX_BYTES: u64 = 1024 * 1024;

/// (`max_age`, `max_bytes`), `None` for a bound that is off.
fn bounds(
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
