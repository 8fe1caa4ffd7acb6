/*!
Per-MAC deduplication on capture time. Pure and synchronous: time is passed in.
*/

/// Validated `[dedup]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupSettings {
    /// A packet equal to the last admitted one of the MAC within this window is dropped.
    pub window_ms: i64,
    /// At most one admitted capture of a MAC per this interval.
    pub min_interval_ms: i64,
    /// How many MACs are tracked at most (memory bound).
    pub max_tracked: usize,
}
