//! The flusher loop's state beside the planner: the requests in flight, the report, the
//! dead-letter log, what was last written of its state. Plain data, no outbox.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::JoinSet;

use super::answer::Action;
use super::control::FlushReport;
use super::deadlog::DeadLetterLog;
use super::plan::{BatchId, Planner};
use super::state::StateNotes;
use crate::config::FlushSettings;
use crate::outbox::FlusherState;

/// A batch's request, answered (or failed), and what its answer means.
pub(super) struct Answered {
    pub(super) batch: BatchId,
    /// Captures sent (or that would have been).
    pub(super) items: usize,
    /// The service answered 2xx.
    pub(super) ok: bool,
    /// What the answer means; `None`: nothing was sent (every row was gone).
    pub(super) action: Option<Action>,
    /// Rows the outbox no longer held as the request went: not sent.
    pub(super) gone: Vec<i64>,
    pub(super) correlation_id: String,
    pub(super) elapsed: Duration,
}

/// The loop's state beside the planner.
pub(super) struct Shell {
    pub(super) plan: Planner,
    pub(super) report: FlushReport,
    pub(super) requests: JoinSet<Answered>,
    /// Which batch each request task carries (a task that panics still names it).
    pub(super) tasks: HashMap<tokio::task::Id, BatchId>,
    pub(super) dead_log: DeadLetterLog,
    /// A failure was logged at WARN and no batch has been answered since.
    pub(super) warned: bool,
    /// Writes of the delivery error (for `status`) that failed in a row.
    pub(super) unnoted: FailedInARow,
    pub(super) seq: u64,
    /// Ingest has ended (its commit channel closed).
    pub(super) ingest_done: bool,
    /// The flusher's state: the last delivery, what was written for `status`.
    pub(super) state: StateNotes,
}

impl Shell {
    pub(super) fn new(settings: &FlushSettings) -> Shell {
        Shell {
            plan: Planner::new(settings.clone()),
            report: FlushReport::default(),
            requests: JoinSet::new(),
            tasks: HashMap::new(),
            dead_log: DeadLetterLog::default(),
            warned: false,
            unnoted: FailedInARow::default(),
            seq: 0,
            ingest_done: false,
            state: StateNotes::default(),
        }
    }

    /// The flusher's state now.
    pub(super) fn state(&self) -> FlusherState {
        self.state.now(self.plan.in_flight(), self.plan.window())
    }
}

/// A failure that repeats while a condition lasts (a full disk), logged once when it
/// begins and once when it ends, with how many times it happened.
#[derive(Debug, Default)]
pub(super) struct FailedInARow(u64);

impl FailedInARow {
    /// One more failure: `true` for the first of a run.
    pub(super) fn failed(&mut self) -> bool {
        self.0 += 1;
        self.0 == 1
    }

    /// It worked: how many failures the run that ended had, if one did.
    pub(super) fn worked(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.0)).filter(|n| *n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_failure_is_told_when_it_begins_and_when_it_ends_with_its_count() {
        let mut f = FailedInARow::default();
        assert_eq!(f.worked(), None, "nothing to tell");
        assert!(f.failed(), "the first failure is logged");
        assert!(!f.failed());
        assert!(!f.failed());
        assert_eq!(f.worked(), Some(3));
        assert_eq!(f.worked(), None);
        assert!(f.failed(), "a new run is logged again");
    }
}
