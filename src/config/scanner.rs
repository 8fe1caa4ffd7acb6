//! `[scanner]`: which source feeds the pipeline (`ble`, `replay`, `sim`) and how: the
//! radio's adapter, path and scan mode, its liveness bounds, the replay file, the
//! simulated fleet. Raw to typed; touches its raw section and the product table.

use std::path::PathBuf;
use std::time::Duration;

use super::problem::Check;
use super::raw::RawScanner;
use super::DEFAULTS;
use crate::products::Products;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Ble,
    Replay,
    Sim,
}

impl SourceKind {
    /// As `scanner.source` names it.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Ble => "ble",
            SourceKind::Replay => "replay",
            SourceKind::Sim => "sim",
        }
    }
}

/// `scanner.adverts`: where the `ble` source reads adverts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvertsPath {
    /// The kernel's management socket when it can be opened, else D-Bus.
    Auto,
    /// The kernel's management socket, or the source cannot work (exit 69).
    Mgmt,
    /// BlueZ's D-Bus signals.
    Dbus,
}

/// `scanner.scan`: how the radio scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Discovery over D-Bus: the radio sends scan requests, scan responses are heard.
    Active,
    /// An advertisement monitor of the kernel (management socket): the radio only
    /// listens; data only in scan responses is never heard.
    Passive,
}

#[derive(Debug, Clone)]
pub struct ScannerSettings {
    pub source: SourceKind,
    pub adapter: Option<String>,
    /// `ble`: no advertisement for this long (once any was heard) restarts the scan;
    /// `None` (0 in the file): never.
    pub silence: Option<Duration>,
    /// `ble`: a scanner that cannot be brought back for this long ends the daemon (exit 1).
    pub give_up: Duration,
    /// `ble`: devices remembered at most; the least recently heard past it is forgotten
    /// (and removed from BlueZ), so rotating MACs cannot grow memory.
    pub max_devices: usize,
    /// `ble`: where adverts are read.
    pub adverts: AdvertsPath,
    /// `ble`: how the radio scans.
    pub scan: ScanMode,
    /// `-` is stdin.
    pub replay_path: Option<PathBuf>,
    pub sim: SimSettings,
}

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

pub(super) fn validate(sc: RawScanner, products: &Products, c: &mut Check) -> ScannerSettings {
    let source = c.choice(
        "scanner.source",
        sc.source.as_deref(),
        DEFAULTS.scanner.source,
        &[
            ("ble", SourceKind::Ble),
            ("replay", SourceKind::Replay),
            ("sim", SourceKind::Sim),
        ],
    );
    if source == SourceKind::Replay && sc.replay_path.is_none() {
        c.missing(
            "scanner.replay_path",
            "a JSON Lines file (or \"-\" for stdin) when source = \"replay\"",
        );
    }
    let sim = sim(&sc, c);
    let silence = c.secs(
        "scanner.silence_secs",
        sc.silence_secs,
        DEFAULTS.scanner.silence_secs,
        0.0,
        86_400.0,
    );
    let (adverts, scan) = radio(&sc, products, c);
    ScannerSettings {
        source,
        adapter: sc.adapter,
        silence: (!silence.is_zero()).then_some(silence),
        give_up: c.secs(
            "scanner.give_up_secs",
            sc.give_up_secs,
            DEFAULTS.scanner.give_up_secs,
            1.0,
            86_400.0,
        ),
        max_devices: c.int(
            "scanner.max_devices",
            sc.max_devices,
            DEFAULTS.scanner.max_devices,
            16,
            1_000_000,
        ) as usize,
        adverts,
        scan,
        replay_path: sc.replay_path,
        sim,
    }
}

/// `scanner.adverts` and `scanner.scan`, and whether they go together and with the
/// products: a passive scan is the kernel's monitor, which matches by company.
fn radio(sc: &RawScanner, products: &Products, c: &mut Check) -> (AdvertsPath, ScanMode) {
    let adverts = c.choice(
        "scanner.adverts",
        sc.adverts.as_deref(),
        DEFAULTS.scanner.adverts,
        &[
            ("auto", AdvertsPath::Auto),
            ("mgmt", AdvertsPath::Mgmt),
            ("dbus", AdvertsPath::Dbus),
        ],
    );
    let scan = c.choice(
        "scanner.scan",
        sc.scan.as_deref(),
        DEFAULTS.scanner.scan,
        &[("active", ScanMode::Active), ("passive", ScanMode::Passive)],
    );
    if scan == ScanMode::Passive {
        if adverts == AdvertsPath::Dbus {
            c.bad(
                "scanner.scan",
                "\"passive\" with scanner.adverts = \"dbus\"",
                "\"active\" (passive scanning is the kernel's advertisement monitor, read over the management socket: set scanner.adverts = \"auto\" or \"mgmt\")",
            );
        }
        if let Some(i) = products.0.iter().position(|p| p.manufacturer_id.is_none()) {
            c.bad(
                "scanner.scan",
                "\"passive\"",
                &format!("\"active\" while products[{i}] names no manufacturer_id (the kernel's monitor matches adverts by company identifier)"),
            );
        }
    }
    (adverts, scan)
}

/// The `sim_*` keys.
fn sim(sc: &RawScanner, c: &mut Check) -> SimSettings {
    let tapes = c.int(
        "scanner.sim_tapes",
        sc.sim_tapes,
        DEFAULTS.scanner.sim_tapes,
        1,
        1_000_000,
    ) as usize;
    SimSettings {
        tapes,
        interval_ms: c.int(
            "scanner.sim_interval_ms",
            sc.sim_interval_ms,
            DEFAULTS.scanner.sim_interval_ms,
            1,
            3_600_000,
        ),
        change_every: c.int(
            "scanner.sim_change_every",
            sc.sim_change_every,
            DEFAULTS.scanner.sim_change_every,
            1,
            1_000_000,
        ) as u32,
        unregistered: c.int(
            "scanner.sim_unregistered",
            sc.sim_unregistered,
            DEFAULTS.scanner.sim_unregistered,
            0,
            tapes as u64,
        ) as usize,
        others_ratio: match sc.sim_others_ratio {
            None => DEFAULTS.scanner.sim_others_ratio,
            Some(r) if r.is_finite() && (0.0..=100.0).contains(&r) => r,
            Some(r) => {
                c.bad("scanner.sim_others_ratio", r, "a number from 0 to 100");
                DEFAULTS.scanner.sim_others_ratio
            }
        },
        seed: sc.sim_seed.unwrap_or(DEFAULTS.scanner.sim_seed),
        duration_ms: sc.sim_duration_secs.map(|_| {
            c.secs(
                "scanner.sim_duration_secs",
                sc.sim_duration_secs,
                0.0,
                0.001,
                1e9,
            )
            .as_millis() as u64
        }),
        realtime: sc.sim_realtime.unwrap_or(DEFAULTS.scanner.sim_realtime),
        start_ms: match sc.sim_start.unwrap_or(DEFAULTS.scanner.sim_start) {
            s if s.is_finite() && s >= 0.0 => (s * 1000.0).round() as i64,
            s => {
                c.bad("scanner.sim_start", s, "epoch seconds");
                0
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::problems;

    #[test]
    fn replay_needs_a_path() {
        let p = problems("[scanner]\nsource = \"replay\"\n", &[]);
        assert_eq!(p[0].key, "scanner.replay_path");
    }
}
