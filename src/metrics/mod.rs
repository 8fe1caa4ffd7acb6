/*!
Every metric of `/metrics`, defined here and nowhere else (Prometheus conventions:
`tapegate_` prefix, counters end in `_total`, base units: seconds, items).

Two kinds:
- **Live**, kept in memory by the running daemon and fed by one-line calls from the
  stages: adverts heard, request latency, batch sizes, batches in flight, token grants,
  failed requests by cause, the clock's state. They start at zero with each start of
  the daemon, as Prometheus expects of a process's counters.
- **Stored**, read from the state database at each scrape ([`Metrics::encode`] takes a
  [`Stats`](crate::outbox::Stats)): the counters and state of `tapegate status` (pending, delivered, dead
  letters, evicted, the scanner's ladder), accumulated across restarts, so that
  `/metrics` and `status --json` always agree.

The flusher's hooks are a guard taken when a request is sent ([`Metrics::request`]) and
one call when it ends ([`Request::answered`]), with the failure as a label the caller
derived from its kind (this module knows no error type); and, after the flusher has
decided what an answer means, whether delivery made progress or failed
([`Metrics::delivery_progressed`], [`Metrics::delivery_failed`]): the failure streak that
`/healthz` reports (see [`crate::health`]) is the flusher's judgement by kind, never the
wording of an answer.

And the process's own series (`process_*`, as Prometheus' client libraries name them),
read from `/proc` at each scrape.

The room in four parts: the registry of every live metric and its labels, what the
state database holds turned into metrics, the process's series, and the exposition
written. It reads the outbox's [`Stats`](crate::outbox::Stats) it is handed and touches no stage.
*/

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::registry::Registry;

use tokio::time::Instant;

use crate::record::EpochMillis;
use registry::{CauseLabel, Live, OutcomeLabel, StateLabel};

mod process;
mod registry;
mod render;
mod stored;

pub use registry::{ClockState, PushOutcome};
pub use render::CONTENT_TYPE;

/// Failures of delivery in a row (answers the flusher backed off from, with no answer that
/// settled a capture between them) after which delivery counts as not making progress.
pub const FAILING_AFTER: u64 = 3;

/// The labels of `tapegate_inventory_info` and the daemon's start time.
type InventoryLabels = (Vec<(String, String)>, EpochMillis);

/// The daemon's live metrics; shared (`Arc`) by the stages that feed them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    live: Live,
    /// The labels of `tapegate_inventory_info` and the start time, once known.
    inventory: Mutex<Option<InventoryLabels>>,
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
        let live = Live::register(&mut registry);
        let metrics = Metrics {
            registry,
            live,
            inventory: Mutex::new(None),
            failing: AtomicU64::new(0),
            last_cause: Mutex::new(""),
        };
        metrics.set_clock_state(ClockState::Trusted);
        // Every outcome is a series from the start, so that a rate over it is defined.
        for outcome in PushOutcome::ALL {
            let _ = metrics.live.telemetry_pushes.get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            });
        }
        metrics
    }

    /// An advertisement reached the ingest stage; `matched`: it is a tape.
    pub fn advert(&self, matched: bool) {
        self.live.adverts.inc();
        if !matched {
            self.live.unmatched.inc();
        }
    }

    /// A granted token.
    pub fn token_granted(&self) {
        self.live.delivery.token_grants.inc();
    }

    /// A request to the bulk decode endpoint is sent: it counts as in flight until
    /// [`Request::answered`] or until dropped (abandoned).
    pub fn request(&self) -> Request<'_> {
        self.live.delivery.in_flight.inc();
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
        captured_at: &[EpochMillis],
        elapsed: Duration,
        failure: Option<&'static str>,
        now: EpochMillis,
    ) {
        self.live
            .delivery
            .request_duration
            .observe(elapsed.as_secs_f64());
        self.live
            .delivery
            .batch_size
            .observe(captured_at.len() as f64);
        match failure {
            None => {
                for at in captured_at {
                    let age = (now - at).max(0) as f64 / 1000.0;
                    self.live.delivery.delivery_latency.observe(age);
                }
            }
            Some(cause) => {
                self.live
                    .delivery
                    .failures
                    .get_or_create(&CauseLabel { cause })
                    .inc();
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
        self.live.delivery.paused_until.set(at / 1000);
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
            self.live
                .clock
                .get_or_create(&StateLabel { state: s.label() })
                .set(i64::from(s == state));
        }
    }

    /// A telemetry push came to `outcome`.
    pub fn telemetry_push(&self, outcome: PushOutcome) {
        self.live
            .telemetry_pushes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Telemetry pushes kept, not yet sent.
    pub fn telemetry_buffered(&self, n: usize) {
        self.live.telemetry_buffered.set(n as i64);
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
        self.live.adverts.get()
    }

    /// Writes the whole exposition ([`CONTENT_TYPE`]): these live metrics, then `stats`
    /// (the stored ones) as of `now`, the process's series and the inventory.
    pub fn encode(
        &self,
        stats: &crate::outbox::Stats,
        now: EpochMillis,
    ) -> Result<String, std::fmt::Error> {
        self.exposition(stats, now)
    }
}

/// A request in flight (see [`Metrics::request`]).
pub struct Request<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl Request<'_> {
    /// The request for a batch of captures taken at `captured_at` ended: answered
    /// (`failure` is `None`) or failed for the cause `failure` (a label of
    /// `request_failures_total`). `now` is the daemon's wall clock (the ages of the
    /// batch's captures are by it).
    pub fn answered(
        self,
        captured_at: &[EpochMillis],
        failure: Option<&'static str>,
        now: EpochMillis,
    ) {
        self.metrics
            .observe_batch(captured_at, self.started.elapsed(), failure, now);
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        self.metrics.live.delivery.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::Stats;

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
