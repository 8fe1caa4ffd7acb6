/*!
Every metric of `/metrics`, defined here and nowhere else (Prometheus conventions:
`tapegate_` prefix, counters end in `_total`, base units: seconds, items).

Two kinds:
- **Live**, kept in memory by the running daemon and fed by one-line calls from the
  stages: adverts heard, request latency, batch sizes, batches in flight, token grants,
  failed requests by cause, the clock's state. They start at zero with each start of
  the daemon, as Prometheus expects of a process's counters.
- **Stored**, read from the state database at each scrape ([`Metrics::encode`] takes a
  [`Stats`]): the counters and state of `tapegate status` (pending, delivered, dead
  letters, evicted, the scanner's ladder), accumulated across restarts, so that
  `/metrics` and `status --json` always agree.

The flusher's hooks are a guard taken when a request is sent ([`Metrics::request`]) and
one call when it ends ([`Request::answered`]), with the failure as a label the caller
derived from its kind (this module knows no error type); and, after the flusher has
decided what an answer means, whether delivery made progress or failed
([`Metrics::delivery_progressed`], [`Metrics::delivery_failed`]): the failure streak that
`/healthz` reports (see [`crate::health`]) is the flusher's judgement by kind, never the
wording of an answer.
*/

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use tokio::time::Instant;

use crate::outbox::{PendingCapture, Stats};
use crate::record::EpochMillis;

/// The media type of what [`Metrics::encode`] writes (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Failures of delivery in a row (answers the flusher backed off from, with no answer that
/// settled a capture between them) after which delivery counts as not making progress.
pub const FAILING_AFTER: u64 = 3;

/// Why a request to the service failed, as a bounded set of label values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

/// The clock's state, as the clock repair will report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockState {
    /// Not known to be wrong: trusted as it reads (the state before anything is known).
    Trusted,
    /// Synchronised by a time service.
    Synchronised,
    /// Unsynchronised and expected to sync: captures are held.
    Holding,
    /// Sent with an estimated time after the hold ran out.
    Estimated,
}

impl ClockState {
    const ALL: [ClockState; 4] = [
        ClockState::Trusted,
        ClockState::Synchronised,
        ClockState::Holding,
        ClockState::Estimated,
    ];

    fn label(self) -> &'static str {
        match self {
            ClockState::Trusted => "trusted",
            ClockState::Synchronised => "synchronised",
            ClockState::Holding => "holding",
            ClockState::Estimated => "estimated",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// What became of a telemetry push (see [`crate::telemetry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushOutcome {
    /// The receiver took it.
    Sent,
    /// The receiver refused it for good (4xx): dropped.
    Refused,
    /// An attempt failed (unreachable, timeout, 429, 5xx); the push is kept.
    Failed,
    /// Dropped unsent to keep at most `telemetry.max_buffered`.
    Dropped,
}

impl PushOutcome {
    fn label(self) -> &'static str {
        match self {
            PushOutcome::Sent => "sent",
            PushOutcome::Refused => "refused",
            PushOutcome::Failed => "failed",
            PushOutcome::Dropped => "dropped",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The labels of `tapegate_inventory_info` and the daemon's start time.
type InventoryLabels = (Vec<(String, String)>, EpochMillis);

/// The daemon's live metrics; shared (`Arc`) by the stages that feed them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    adverts: Counter,
    unmatched: Counter,
    request_duration: Histogram,
    delivery_latency: Histogram,
    batch_size: Histogram,
    in_flight: Gauge,
    token_grants: Counter,
    failures: Family<CauseLabel, Counter>,
    clock: Family<StateLabel, Gauge>,
    telemetry_pushes: Family<OutcomeLabel, Counter>,
    telemetry_buffered: Gauge,
    /// The labels of `tapegate_inventory_info` and the start time, once known.
    inventory: Mutex<Option<InventoryLabels>>,
    /// Until when new decode requests wait (epoch ms), as the flusher last decided.
    paused_until: Gauge,
    /// Delivery failures in a row (reset by an answer that settled captures), and the
    /// last cause.
    failing: AtomicU64,
    last_cause: Mutex<&'static str>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tapegate");
        // Which build a gateway runs, for a fleet rolled out over weeks.
        registry.register(
            "build",
            "The tapegate version this daemon runs",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let adverts = Counter::default();
        registry.register(
            "adverts",
            "Advertisements heard by the source since the daemon started",
            adverts.clone(),
        );
        let unmatched = Counter::default();
        registry.register(
            "adverts_unmatched",
            "Advertisements that matched no [[products]] entry (not tapes)",
            unmatched.clone(),
        );
        // 10 ms .. ~80 s: a fast loopback answer up to a request timeout.
        let request_duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register_with_unit(
            "request_duration",
            "Time from sending a batch to the bulk decode endpoint to its answer or failure",
            Unit::Seconds,
            request_duration.clone(),
        );
        // 1 s .. ~1.5 days: a live dock up to a gateway that was offline a weekend.
        let delivery_latency = Histogram::new(exponential_buckets(1.0, 4.0, 10));
        registry.register_with_unit(
            "delivery_latency",
            "Time from a capture to the answer that settled it (per capture of an answered batch)",
            Unit::Seconds,
            delivery_latency.clone(),
        );
        let batch_size = Histogram::new([1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 150.0, 200.0, 250.0]);
        registry.register(
            "batch_size",
            "Captures per request to the bulk decode endpoint",
            batch_size.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "batches_in_flight",
            "Requests to the bulk decode endpoint awaiting their answer",
            in_flight.clone(),
        );
        let token_grants = Counter::default();
        registry.register(
            "token_grants",
            "Tokens granted by the token endpoint (password grant)",
            token_grants.clone(),
        );
        let failures = Family::<CauseLabel, Counter>::default();
        registry.register(
            "request_failures",
            "Requests to the service that failed, by cause (http_400, http_401, http_413, http_429, http_5xx, http_other, timeout, unreachable, connection_closed, token_refused, bad_answer, empty_answer, invalid_request)",
            failures.clone(),
        );
        let paused_until = Gauge::default();
        registry.register_with_unit(
            "delivery_paused_until_timestamp",
            "Until when no request goes to the decode endpoint: a backoff, or the service's Retry-After (honoured up to 1 h); 0 before any pause",
            Unit::Seconds,
            paused_until.clone(),
        );
        let clock = Family::<StateLabel, Gauge>::default();
        registry.register(
            "clock_state",
            "The wall clock's state: 1 for the current one (trusted, synchronised, holding, estimated)",
            clock.clone(),
        );
        let telemetry_pushes = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "telemetry_pushes",
            "Telemetry pushes to the remote-write receiver, by outcome (sent, refused, failed: kept to retry, dropped: the buffer was full)",
            telemetry_pushes.clone(),
        );
        let telemetry_buffered = Gauge::default();
        registry.register(
            "telemetry_buffered",
            "Telemetry pushes kept in memory, not yet accepted by the receiver",
            telemetry_buffered.clone(),
        );
        let metrics = Metrics {
            registry,
            inventory: Mutex::new(None),
            telemetry_pushes,
            telemetry_buffered,
            adverts,
            unmatched,
            request_duration,
            delivery_latency,
            batch_size,
            in_flight,
            token_grants,
            failures,
            clock,
            paused_until,
            failing: AtomicU64::new(0),
            last_cause: Mutex::new(""),
        };
        metrics.set_clock_state(ClockState::Trusted);
        // Every outcome is a series from the start, so that a rate over it is defined.
        for outcome in [
            PushOutcome::Sent,
            PushOutcome::Refused,
            PushOutcome::Failed,
            PushOutcome::Dropped,
        ] {
            let _ = metrics.telemetry_pushes.get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            });
        }
        metrics
    }

    /// An advertisement reached the ingest stage; `matched`: it is a tape.
    pub fn advert(&self, matched: bool) {
        self.adverts.inc();
        if !matched {
            self.unmatched.inc();
        }
    }

    /// A granted token.
    pub fn token_granted(&self) {
        self.token_grants.inc();
    }

    /// A request to the bulk decode endpoint is sent: it counts as in flight until
    /// [`Request::answered`] or until dropped (abandoned).
    pub fn request(&self) -> Request<'_> {
        self.in_flight.inc();
        Request {
            metrics: self,
            started: Instant::now(),
        }
    }

    /// The request for `batch` ended `elapsed` after it was sent, at `now`: answered
    /// (`failure` is `None`), or failed for the cause `failure` (one of the labels of
    /// `request_failures_total`).
    fn observe_batch(
        &self,
        batch: &[PendingCapture],
        elapsed: Duration,
        failure: Option<&'static str>,
        now: EpochMillis,
    ) {
        self.request_duration.observe(elapsed.as_secs_f64());
        self.batch_size.observe(batch.len() as f64);
        match failure {
            None => {
                for p in batch {
                    let age = (now - p.capture.ts_ms).max(0) as f64 / 1000.0;
                    self.delivery_latency.observe(age);
                }
            }
            Some(cause) => {
                self.failures.get_or_create(&CauseLabel { cause }).inc();
            }
        }
    }

    /// The flusher settled captures from an answer: delivery makes progress.
    pub fn delivery_progressed(&self) {
        self.failing.store(0, Ordering::Relaxed);
    }

    /// The flusher backs off after an answer (or its absence) for `cause`.
    pub fn delivery_failed(&self, cause: &'static str) {
        self.failing.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut c) = self.last_cause.lock() {
            *c = cause;
        }
    }

    /// New decode requests wait until `at` (epoch ms).
    pub fn set_paused_until(&self, at: EpochMillis) {
        self.paused_until.set(at / 1000);
    }

    /// Delivery failures in a row since the last answer that settled captures, and the
    /// cause of the last.
    pub fn failing(&self) -> (u64, &'static str) {
        let n = self.failing.load(Ordering::Relaxed);
        let cause = self.last_cause.lock().map(|c| *c).unwrap_or("");
        (n, cause)
    }

    /// Sets the clock's state (the others read 0).
    pub fn set_clock_state(&self, state: ClockState) {
        for s in ClockState::ALL {
            self.clock
                .get_or_create(&StateLabel { state: s.label() })
                .set(i64::from(s == state));
        }
    }

    /// A telemetry push came to `outcome`.
    pub fn telemetry_push(&self, outcome: PushOutcome) {
        self.telemetry_pushes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Telemetry pushes kept, not yet sent.
    pub fn telemetry_buffered(&self, n: usize) {
        self.telemetry_buffered.set(n as i64);
    }

    /// What this gateway is and runs (`tapegate_inventory_info`, and
    /// `tapegate_start_time_seconds` from its start time); replaced after a reload.
    pub fn set_inventory(&self, inventory: &crate::inventory::Inventory) {
        if let Ok(mut i) = self.inventory.lock() {
            *i = Some((inventory.labels(), inventory.started_at_ms));
        }
    }

    /// Adverts heard since the daemon started.
    pub fn adverts(&self) -> u64 {
        self.adverts.get()
    }

    /// Writes the whole exposition: these live metrics, then `stats` (the stored ones)
    /// as of `now`.
    pub fn encode(&self, stats: &Stats, now: EpochMillis) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)?;
        encode_registry(&mut out, &stored(stats, now))?;
        let inventory = self.inventory.lock().ok().and_then(|i| i.clone());
        if let Some((labels, started_at)) = inventory {
            encode_registry(&mut out, &inventory_registry(labels, started_at))?;
        }
        encode_eof(&mut out)?;
        Ok(out)
    }
}

/// A request in flight (see [`Metrics::request`]).
pub struct Request<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl Request<'_> {
    /// The request for `batch` ended: answered (`failure` is `None`) or failed for the
    /// cause `failure` (a label of `request_failures_total`).
    /// `now` is the daemon's wall clock (the ages of the batch's captures are by it).
    pub fn answered(
        self,
        batch: &[PendingCapture],
        failure: Option<&'static str>,
        now: EpochMillis,
    ) {
        self.metrics
            .observe_batch(batch, self.started.elapsed(), failure, now);
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// `tapegate_inventory_info` and `tapegate_start_time_seconds`.
fn inventory_registry(labels: Vec<(String, String)>, started_at: EpochMillis) -> Registry {
    let mut r = Registry::with_prefix("tapegate");
    // What a gateway is and runs, so that drift across a fleet shows in one query.
    r.register(
        "inventory",
        "What this gateway runs: version, commit, config_hash, gateway_id, boot_id, kernel, os, arch, bluez, adapter, source (always 1)",
        Info::new(labels),
    );
    r.register_with_unit(
        "start_time",
        "When the daemon started, epoch seconds (uptime: time() - this)",
        Unit::Seconds,
        ConstGauge::new(started_at as f64 / 1000.0),
    );
    r
}

/// The stored metrics, from the state database's counters.
fn stored(s: &Stats, now: EpochMillis) -> Registry {
    let mut r = Registry::with_prefix("tapegate");
    let counters: [(&str, &str, u64); 9] = [
        ("admitted", "Captures accepted into the outbox", s.admitted),
        ("delivered", "Captures decoded by the service", s.delivered),
        (
            "dead_letters",
            "Captures the service refused (dead letters)",
            s.dead_letters,
        ),
        (
            "evicted",
            "Pending captures evicted to stay within the outbox's bounds (see evictions_total)",
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
            "scanner_dropped",
            "Advertisements dropped because the pipeline did not keep up",
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
        "Pending captures evicted, by the bound that evicted them (max_pending, max_age, max_bytes); they add up to evicted_total",
        by_bound,
    );
    r.register_with_unit(
        "database",
        "Bytes of the state database's pages in use (bounded by outbox.max_bytes)",
        Unit::Bytes,
        ConstGauge::new(s.database_bytes as i64),
    );
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
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_streak_is_the_flushers_judgement_and_only_progress_ends_it() {
        let m = Metrics::new();
        for _ in 0..3 {
            m.observe_batch(&[], Duration::from_secs(1), Some("timeout"), 0);
        }
        assert_eq!(m.failing().0, 0, "a failed request alone is no verdict");
        m.delivery_failed("http_400");
        m.delivery_failed("http_400");
        // A refused batch the flusher splits is neither: the streak stands.
        m.observe_batch(&[], Duration::ZERO, Some("http_400"), 0);
        m.delivery_failed("http_400");
        assert_eq!(m.failing(), (3, "http_400"));
        m.delivery_progressed();
        assert_eq!(m.failing().0, 0);
        let text = m.encode(&Stats::default(), 0).unwrap();
        assert!(
            text.lines()
                .any(|l| l == "tapegate_request_failures_total{cause=\"timeout\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn the_exposition_names_every_metric_with_the_prefix_and_ends_with_eof() {
        let m = Metrics::new();
        m.advert(true);
        m.advert(false);
        let stats = Stats {
            delivered: 7,
            pending: 2,
            oldest_pending_at: Some(1_000),
            ..Stats::default()
        };
        let text = m.encode(&stats, 31_000).unwrap();
        for line in [
            "tapegate_adverts_total 2",
            "tapegate_adverts_unmatched_total 1",
            "tapegate_delivered_total 7",
            "tapegate_pending 2",
            "tapegate_oldest_pending_age_seconds 30.0",
            "tapegate_clock_state{state=\"trusted\"} 1",
            "tapegate_clock_state{state=\"holding\"} 0",
            "tapegate_batches_in_flight 0",
            &format!(
                "tapegate_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
