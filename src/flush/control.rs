//! How the flusher is told to end and what it reports: plain data, a leaf under the
//! loop's files.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the flusher did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub batches: u64,
    pub delivered: u64,
    pub dead_letters: u64,
    pub failures: u64,
}

/// How the flusher is told to end.
pub struct FlushControl {
    /// Bumped by ingest after each commit; closed when ingest has ended.
    pub committed: watch::Receiver<u64>,
    /// Send nothing new; end once the batches in flight are answered (shutdown).
    pub stop: CancellationToken,
    /// Drop the batches in flight (shutdown grace ran out); their rows stay pending.
    pub abandon: CancellationToken,
    /// End once ingest has ended and nothing is pending (`--until-drained`).
    pub until_drained: bool,
}
