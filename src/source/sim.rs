//! The `sim` source: a simulated fleet of tapes.

/// Validated `[scanner] sim_*` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    /// How many tapes.
    pub tapes: usize,
    /// Advert interval of each tape.
    pub interval_ms: u64,
    /// A tape's packet changes every this many adverts (its counter and readings move).
    pub change_every: u32,
    /// How many of the tapes the simulated service does not know (their MACs start C0:DE:AD).
    pub unregistered: usize,
    /// Adverts of other devices (not tapes) per tape advert, on average.
    pub others_ratio: f64,
    /// Seed of the fleet: same seed, same MACs and packets.
    pub seed: u64,
    /// The source ends after this long (None: runs until stopped).
    pub duration_ms: Option<u64>,
    /// Real time (sleep between adverts) or as fast as possible with synthetic capture times.
    pub realtime: bool,
    /// Capture time of the first advert when not real time.
    pub start_ms: i64,
}
