//! The planner's vocabulary: what it asks the loop to do ([`Step`]), what an answer
//! means ([`Resolution`], [`Note`]), and the records it keeps of a batch and a capture.
//! Data only: it touches nothing but the outbox's row and outcome types.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::outbox::{Outcome, PendingCapture, Seen};

/// Identifies a batch launched (in flight). Increasing: a batch with a higher id was
/// launched later.
pub type BatchId = u64;

/// A batch to send. Its rows are shared with the planner's record of the batch in
/// flight, not copied: the request encodes them and lets go, and the planner has them
/// to itself again when the answer comes. Its request claims them as it goes on the
/// wire (`seen`: when they were read, see [`Seen`]); rows the outbox no longer holds by
/// then are dropped, never sent ([`Planner::gone`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub id: BatchId,
    pub rows: Arc<Vec<PendingCapture>>,
    pub seen: Seen,
}

/// What the loop should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Send this batch now (its request claims its rows as it goes on the wire).
    Send(Batch),
    /// Record these outcomes again (the last try failed); then call
    /// [`Planner::recorded`] or [`Planner::record_failed`].
    Record(Vec<(PendingCapture, Outcome)>),
    /// Fetch (and claim) up to `max` captures of MACs not in [`Planner::busy`], then
    /// call [`Planner::offer`].
    Fetch { max: usize },
    /// Nothing to send before `until` (`None`: before an answer, a commit, or a
    /// while). An answer or a commit may change that sooner.
    Wait(Option<Instant>),
}

/// What the planner asks the loop to log and count, beyond the outcomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A 400 for the batch: split in halves.
    Split { items: usize, reason: String },
    /// A batch failing again: split to isolate the capture.
    Isolating { items: usize, cause: String },
    /// A 413: batches are at most `limit` from now on.
    Shrunk { sent: usize, limit: usize },
    /// New sends pause for `delay`; `cause` for `status`, `label` the same as a metric
    /// label (`http_5xx`, `http_400`, `outbox_write`...). `server` when the delay is the
    /// service's `Retry-After`.
    BackOff {
        cause: String,
        label: &'static str,
        delay: Duration,
        server: bool,
    },
    /// The concurrency window changed.
    Window { from: usize, to: usize },
    /// An answer after a failure streak.
    Recovered,
}

/// What an answer means: the outcomes to record (in one transaction) and the notes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    pub settle: Vec<(PendingCapture, Outcome)>,
    pub notes: Vec<Note>,
    /// The service answered for captures (decoded or refused them): delivery makes
    /// progress.
    pub progress: bool,
}

impl Resolution {
    /// The label of the backoff this resolution starts, if it starts one.
    pub fn backoff(&self) -> Option<&'static str> {
        self.notes.iter().find_map(|n| match n {
            Note::BackOff { label, .. } => Some(*label),
            _ => None,
        })
    }
}

/// Where the rows of a queued or in-flight batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Fetched from the outbox.
    Fresh,
    /// A part of a batch refused (400).
    Split,
    /// A part of a batch that keeps failing.
    Isolate,
}

#[derive(Debug)]
pub(super) struct InFlight {
    /// Shared with the [`Batch`] until its request has encoded them: by the time the
    /// answer is read the planner holds them alone, and `Arc::unwrap_or_clone` moves
    /// them out without a copy.
    pub(super) rows: Arc<Vec<PendingCapture>>,
    pub(super) origin: Origin,
    pub(super) seen: Seen,
    pub(super) sent_at: Instant,
    /// The window was in use when this batch was sent, and the batch was full (growth
    /// only counts then: a window wider than the tapes free to fill it only sends
    /// smaller batches, each costing a request and a transaction).
    pub(super) window_full: bool,
}

/// What one capture has been through in this run (by row id).
#[derive(Debug, Clone, Default)]
pub(super) struct Attempts {
    /// Transient failures and refusals of batches holding it.
    pub(super) failures: u32,
    /// The last batch id launched when it first failed: an answered batch with a
    /// higher id (sent after) is evidence that the service takes our requests.
    pub(super) failed_after: BatchId,
    /// Transient failures on its own.
    pub(super) alone: u32,
    /// 200 answers that left it out.
    pub(super) left_out: u32,
}

/// A part waiting in the planner's queue (parked, split or isolating) until `not_before`.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) rows: Vec<PendingCapture>,
    pub(super) origin: Origin,
    /// When its rows were read (they hold no claim while they wait).
    pub(super) seen: Seen,
    pub(super) not_before: Instant,
}
