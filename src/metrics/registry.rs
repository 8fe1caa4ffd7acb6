//! The definitions: every live metric's name, help, unit and buckets, registered once
//! (in the order the exposition shows them), and the bounded label values. A leaf: it
//! knows the Prometheus client and nothing of the crate.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

/// Why a request to the service failed, as a bounded set of label values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CauseLabel {
    pub cause: &'static str,
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
    pub(super) const ALL: [ClockState; 4] = [
        ClockState::Trusted,
        ClockState::Synchronised,
        ClockState::Holding,
        ClockState::Estimated,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            ClockState::Trusted => "trusted",
            ClockState::Synchronised => "synchronised",
            ClockState::Holding => "holding",
            ClockState::Estimated => "estimated",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabel {
    pub state: &'static str,
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
    pub(super) const ALL: [PushOutcome; 4] = [
        PushOutcome::Sent,
        PushOutcome::Refused,
        PushOutcome::Failed,
        PushOutcome::Dropped,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            PushOutcome::Sent => "sent",
            PushOutcome::Refused => "refused",
            PushOutcome::Failed => "failed",
            PushOutcome::Dropped => "dropped",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub outcome: &'static str,
}

/// The live metrics, as registered in a [`Registry`] (the handles share their values
/// with it).
#[derive(Debug)]
pub(super) struct Live {
    pub adverts: Counter,
    pub unmatched: Counter,
    pub delivery: Delivery,
    pub clock: Family<StateLabel, Gauge>,
    pub telemetry_pushes: Family<OutcomeLabel, Counter>,
    pub telemetry_buffered: Gauge,
}

/// The flusher's metrics: its requests and what became of them.
#[derive(Debug)]
pub(super) struct Delivery {
    pub request_duration: Histogram,
    pub delivery_latency: Histogram,
    pub batch_size: Histogram,
    pub in_flight: Gauge,
    pub token_grants: Counter,
    pub failures: Family<CauseLabel, Counter>,
    /// Until when new decode requests wait (epoch s), as the flusher last decided.
    pub paused_until: Gauge,
}

/// Registers `metric` as `name` (in `unit`, if any) and gives back its handle.
fn add<M: Metric + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: M,
) -> M {
    match unit {
        Some(unit) => r.register_with_unit(name, help, unit, metric.clone()),
        None => r.register(name, help, metric.clone()),
    }
    metric
}

impl Live {
    /// Registers every live metric in `r`.
    pub(super) fn register(r: &mut Registry) -> Live {
        // Which build a gateway runs, for a fleet rolled out over weeks.
        r.register(
            "build",
            "The tapegate version this daemon runs",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let adverts = add(
            r,
            "adverts",
            "Advertisements heard by the source since the daemon started",
            None,
            Counter::default(),
        );
        let unmatched = add(
            r,
            "adverts_unmatched",
            "Advertisements that matched no [[products]] entry (not tapes)",
            None,
            Counter::default(),
        );
        let delivery = Delivery::register(r);
        let clock = add(
            r,
            "clock_state",
            "The wall clock's state: 1 for the current one (trusted, synchronised, holding, estimated)",
            None,
            Family::default(),
        );
        let telemetry_pushes = add(
            r,
            "telemetry_pushes",
            "Telemetry pushes to the remote-write receiver, by outcome (sent, refused, failed: kept to retry, dropped: the buffer was full)",
            None,
            Family::default(),
        );
        let telemetry_buffered = add(
            r,
            "telemetry_buffered",
            "Telemetry pushes kept in memory, not yet accepted by the receiver",
            None,
            Gauge::default(),
        );
        Live {
            adverts,
            unmatched,
            delivery,
            clock,
            telemetry_pushes,
            telemetry_buffered,
        }
    }
}

impl Delivery {
    fn register(r: &mut Registry) -> Delivery {
        Delivery {
            // 10 ms .. ~80 s: a fast loopback answer up to a request timeout.
            request_duration: add(
                r,
                "request_duration",
                "Time from sending a batch to the bulk decode endpoint to its answer or failure",
                Some(Unit::Seconds),
                Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            ),
            // 1 s .. ~1.5 days: a live dock up to a gateway that was offline a weekend.
            delivery_latency: add(
                r,
                "delivery_latency",
                "Time from a capture to the answer that settled it (per capture of an answered batch)",
                Some(Unit::Seconds),
                Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            ),
            batch_size: add(
                r,
                "batch_size",
                "Captures per request to the bulk decode endpoint",
                None,
                Histogram::new([1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 150.0, 200.0, 250.0]),
            ),
            in_flight: add(
                r,
                "batches_in_flight",
                "Requests to the bulk decode endpoint awaiting their answer",
                None,
                Gauge::default(),
            ),
            token_grants: add(
                r,
                "token_grants",
                "Tokens granted by the token endpoint (password grant)",
                None,
                Counter::default(),
            ),
            failures: add(
                r,
                "request_failures",
                "Requests to the service that failed, by cause (http_400, http_401, http_413, http_429, http_5xx, http_other, timeout, unreachable, connection_closed, token_refused, bad_answer, empty_answer, invalid_request)",
                None,
                Family::default(),
            ),
            paused_until: add(
                r,
                "delivery_paused_until_timestamp",
                "Until when no request goes to the decode endpoint: a backoff, or the service's Retry-After (honoured up to 1 h); 0 before any pause",
                Some(Unit::Seconds),
                Gauge::default(),
            ),
        }
    }
}
