//! What is read from the state database at each scrape: the counters and state of
//! `tapegate status` ([`Stats`]), accumulated across restarts, as a registry of constant
//! metrics. Pure: it reads the stats it is handed and the time it is told.

use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::outbox::Stats;
use crate::record::EpochMillis;

/// The stored metrics, from the state database's counters, as of `now`.
pub(super) fn stored(s: &Stats, now: EpochMillis) -> Registry {
    let mut r = Registry::with_prefix("tapegate");
    counters(&mut r, s);
    gauges(&mut r, s);
    evictions(&mut r, s);
    times(&mut r, s, now);
    r
}

fn counters(r: &mut Registry, s: &Stats) {
    let counters: [(&str, &str, u64); 10] = [
        ("admitted", "Captures accepted into the outbox", s.admitted),
        ("delivered", "Captures decoded by the service", s.delivered),
        (
            "dead_letters",
            "Captures the service refused (dead letters)",
            s.dead_letters,
        ),
        (
            "evicted",
            "Deprecated, gone in the next release: the sum of evictions_total over its bound label",
            s.evicted,
        ),
        (
            "dead_letters_dropped",
            "Stored dead letters dropped to bound their number",
            s.dead_letters_dropped,
        ),
        (
            "scanner_restarts",
            "BLE scans restarted (liveness ladder step 1)",
            s.scanner.restarts,
        ),
        (
            "scanner_reacquires",
            "BLE adapters re-acquired with a new BlueZ connection (step 2)",
            s.scanner.reacquires,
        ),
        (
            "scanner_adverts_dropped",
            "Advertisements the scanner heard and dropped because the pipeline behind it was full (capture did not keep up with the radio)",
            s.scanner.dropped,
        ),
        (
            "scanner_dropped",
            "Deprecated, gone in the next release: scanner_adverts_dropped_total",
            s.scanner.dropped,
        ),
        (
            "scanner_devices_forgotten",
            "BLE devices forgotten to bound memory",
            s.scanner.forgotten,
        ),
    ];
    for (name, help, v) in counters {
        r.register(name, help, ConstCounter::new(v));
    }
}

fn gauges(r: &mut Registry, s: &Stats) {
    let gauges: [(&str, &str, i64); 3] = [
        (
            "pending",
            "Captures in the outbox awaiting delivery",
            s.pending as i64,
        ),
        (
            "dead_letters_stored",
            "Dead letters stored for `tapegate dead-letters`",
            s.dead_letters_stored as i64,
        ),
        ("tapes", "Tapes with a decoded reading", s.tapes as i64),
    ];
    for (name, help, v) in gauges {
        r.register(name, help, ConstGauge::new(v));
    }
}

fn evictions(r: &mut Registry, s: &Stats) {
    let by_bound = Family::<Vec<(String, String)>, Counter>::default();
    for (bound, n) in [
        ("max_pending", s.evicted_by.max_pending),
        ("max_age", s.evicted_by.max_age),
        ("max_bytes", s.evicted_by.max_bytes),
    ] {
        by_bound
            .get_or_create(&vec![("bound".to_string(), bound.to_string())])
            .inc_by(n);
    }
    r.register(
        "evictions",
        "Pending captures evicted (dropped before delivery to stay within the outbox's bounds), by the bound that evicted them: max_pending, max_age, max_bytes",
        by_bound,
    );
    r.register_with_unit(
        "database",
        "Bytes of the state database's pages in use (bounded by outbox.max_bytes)",
        Unit::Bytes,
        ConstGauge::new(s.database_bytes as i64),
    );
}

fn times(r: &mut Registry, s: &Stats, now: EpochMillis) {
    let secs = |at: EpochMillis| at as f64 / 1000.0;
    r.register_with_unit(
        "oldest_pending_age",
        "Age of the oldest pending capture (0 when none is pending)",
        Unit::Seconds,
        ConstGauge::new(s.oldest_pending_at.map_or(0.0, |t| secs((now - t).max(0)))),
    );
    let times = [
        (
            "last_flush_ok_timestamp",
            "When a batch was last answered (0: never)",
            s.last_flush_ok_at,
        ),
        (
            "last_error_timestamp",
            "When delivery last failed (0: never)",
            s.last_error_at,
        ),
    ];
    for (name, help, at) in times {
        r.register_with_unit(
            name,
            help,
            Unit::Seconds,
            ConstGauge::new(at.map_or(0.0, secs)),
        );
    }
}
