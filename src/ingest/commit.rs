//! The ingest stage's commits: a group into the outbox through the stage's handle,
//! retried with backoff while the failure may pass (a full disk), with `/healthz` told;
//! and the clock keeper's look at the clock, which wakes the flusher on a release.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::time::Duration;

use crate::clock::ClockKeeper;
use crate::health::Admission;
use crate::outbox::{Evictions, IngestWriter, OutboxError};
use crate::record::Capture;
use crate::util::backoff::Backoff;
use crate::util::systemd::Beat;

/// A failed commit is retried after this, doubling (no jitter: one writer)...
const COMMIT_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// ...up to this, so that space coming back is noticed within seconds.
const COMMIT_RETRY_MAX: Duration = Duration::from_secs(5);

/// What the ingest stage did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub adverts: u64,
    /// Matched no product.
    pub unmatched: u64,
    /// Dropped or merged by dedup.
    pub deduplicated: u64,
    /// Committed to the outbox.
    pub accepted: u64,
    /// Evicted from the outbox to stay within `max_pending`.
    pub evicted: u64,
    /// Captures that could not be committed before shutdown gave up (logged at ERROR).
    pub lost: u64,
}

/// Commits groups, retrying a failed one with backoff until it commits or shutdown
/// gives up on it.
pub(super) struct Committer {
    pub(super) outbox: IngestWriter,
    pub(super) committed: watch::Sender<u64>,
    pub(super) abandon: CancellationToken,
    pub(super) beat: Beat,
    pub(super) admission: Arc<Admission>,
}

impl Committer {
    /// Lets the clock keeper look at the clock; wakes the flusher when held captures
    /// were released. A failed write is retried at the keeper's next look.
    pub(super) async fn check_clock(&mut self, keeper: &mut ClockKeeper) {
        match keeper.check().await {
            Ok(0) => {}
            Ok(released) => self.committed.send_modify(|c| *c += released),
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the clock's state to the outbox; will retry")
            }
        }
    }

    /// Commits `group`, retrying with backoff while the failure may pass and shutdown
    /// has not given up on it.
    pub(super) async fn commit(&mut self, group: &mut Vec<Capture>, report: &mut IngestReport) {
        if group.is_empty() {
            return;
        }
        let mut backoff = Backoff::new(COMMIT_RETRY_INITIAL, COMMIT_RETRY_MAX);
        loop {
            let n = group.len() as u64;
            let (result, mut batch) = self.outbox.commit(std::mem::take(group)).await;
            match result {
                Ok(evictions) => {
                    // The next group grows into this one's room.
                    batch.clear();
                    *group = batch;
                    self.admission.committed();
                    report.accepted += n;
                    report_evictions(&evictions, report);
                    if backoff.failures() > 0 {
                        tracing::info!(
                            captures = n,
                            failures = backoff.failures(),
                            "outbox write recovered"
                        );
                    }
                    self.committed.send_modify(|c| *c += n);
                    return;
                }
                Err(e) if e.is_retryable() && !self.abandon.is_cancelled() => {
                    *group = batch;
                    self.held_back(&e, n, &mut backoff).await;
                }
                Err(e) => {
                    report.lost += n;
                    tracing::error!(captures = n, error = %e, "captures lost: the outbox could not take them before shutdown");
                    return;
                }
            }
        }
    }

    /// A commit of `n` captures failed and may work later: says why (once per run of
    /// failures, with the cure if waiting is not one) and waits the backoff.
    async fn held_back(&mut self, e: &OutboxError, n: u64, backoff: &mut Backoff) {
        let delay = backoff.next_delay(1.0, None);
        // Holding a group on a full disk is not a stall.
        self.beat.touch();
        if backoff.failures() == 1 {
            // Waiting cures a full disk, not a file of another user.
            match self.outbox.why_unwritable().await {
                Some(why) => {
                    tracing::error!(captures = n, error = %e, "the outbox cannot be written: {why}; holding the group and retrying");
                    self.admission.failed(why);
                }
                None => {
                    tracing::warn!(captures = n, error = %e, "outbox write failed; holding the group and retrying");
                    self.admission.failed(e.to_string());
                }
            }
        } else {
            tracing::debug!(
                captures = n,
                failures = backoff.failures(),
                retry_in_ms = delay.as_millis() as u64,
                "outbox write failed again; still holding the group"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep_until(Instant::now() + delay) => {}
            _ = self.abandon.cancelled() => {}
        }
    }
}

/// Counts and logs what a commit evicted to keep the outbox's bounds.
fn report_evictions(evictions: &Evictions, report: &mut IngestReport) {
    let evicted = evictions.total();
    if evicted > 0 {
        report.evicted += evicted;
        tracing::error!(
            evicted,
            max_pending = evictions.max_pending,
            max_age = evictions.max_age,
            max_bytes = evictions.max_bytes,
            "outbox bounds: evicted the oldest pending captures ({})",
            evictions.describe()
        );
    }
}
