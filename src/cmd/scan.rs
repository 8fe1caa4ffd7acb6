/*!
`tapegate scan`: the live view for installers, and the recorder.
It touches the source, the products and the config; no outbox.

It runs the configured source (normally `ble`; `sim` and `replay` work too) without the
outbox and prints one line per advertisement: time (UTC), MAC, RSSI, product and
`ble_packet` as the service would get it, then the name. Only adverts that match a
product are shown unless `--all`; for the others the product is `-` and the packet is
their manufacturer data as on air (company identifier little-endian, then the data) or
their service data.

`--record FILE` writes the shown adverts as JSON Lines advertisement records, exactly
what the `replay` source reads: a recording replays to the same captures.
*/

use std::collections::HashSet;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::products::Products;
use crate::record::{hex_upper, Advertisement, EpochMillis, Mac};
use crate::source::{self, Heard, Source, SourceError, SourceReport};
use crate::util::debug_hooks::DebugHooks;

/// What `tapegate scan` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Write the shown adverts to this file as JSON Lines records.
    pub record: Option<PathBuf>,
    /// Stop after this long (default: until stopped).
    pub duration: Option<Duration>,
    /// Show (and record) every advert, not only those matching a product.
    pub all: bool,
    /// What a test asks of a debug build (the management socket's stand-in).
    pub hooks: DebugHooks,
}

impl ScanOptions {
    /// From the command line: `duration_secs` (a negative one is none) as a duration.
    pub fn new(
        record: Option<PathBuf>,
        duration_secs: Option<f64>,
        all: bool,
    ) -> Result<ScanOptions, ScanError> {
        let duration = duration_secs
            .map(|d| Duration::try_from_secs_f64(d.max(0.0)))
            .transpose()?;
        Ok(ScanOptions {
            record,
            duration,
            all,
            hooks: DebugHooks::default(),
        })
    }
}

/// `tapegate scan` on a runtime of its own, the view on stdout, until stopped (SIGTERM,
/// SIGINT), the duration is over or the source ends.
pub fn watch(
    config: &Config,
    clock: &SharedClock,
    options: ScanOptions,
) -> Result<ScanReport, ScanError> {
    let mut out = std::io::stdout();
    super::until_stopped(|stop| run(config, clock, options, stop, &mut out))
        .map_err(ScanError::Runtime)?
}

/// What a scan saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub adverts: u64,
    /// Adverts matching a product.
    pub matching: u64,
    /// Distinct MACs heard.
    pub devices: usize,
    pub recorded: u64,
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("cannot write the recording {path}: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the live view: {0}")]
    Output(std::io::Error),
    #[error("the source task failed: {0}")]
    Task(String),
    /// `--duration` cannot be a duration (too large).
    #[error(transparent)]
    Duration(#[from] std::time::TryFromFloatSecsError),
    /// The command's runtime or its stop signals cannot be had.
    #[error(transparent)]
    Runtime(std::io::Error),
}

/// Adverts in flight between the source and the view.
const CHANNEL: usize = 4096;

/// Scans until `shutdown` resolves, the duration is over or the source ends.
pub async fn run(
    config: &Config,
    clock: &SharedClock,
    options: ScanOptions,
    shutdown: impl Future<Output = ()> + Send,
    out: &mut (dyn Write + Send),
) -> Result<ScanReport, ScanError> {
    let mut recorder = match &options.record {
        Some(path) => Some((
            path.clone(),
            std::io::BufWriter::new(std::fs::File::create(path).map_err(|source| {
                ScanError::Record {
                    path: path.clone(),
                    source,
                }
            })?),
        )),
        None => None,
    };
    let (tx, mut rx) = mpsc::channel(CHANNEL);
    let stop = CancellationToken::new();
    let source = spawn_source(config, clock.clone(), &options, tx, stop.clone());
    let deadline = async {
        match options.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let mut deadline = std::pin::pin!(deadline);
    let mut report = ScanReport::default();
    let mut seen: HashSet<Mac> = HashSet::new();
    writeln!(
        out,
        "{:<12}  {:<17}  {:>4}  {:<10}  packet  name",
        "time", "mac", "rssi", "product"
    )
    .map_err(ScanError::Output)?;
    // After Ctrl-C or the duration, what the source still sends before it ends is
    // shown too.
    let mut stopping = false;
    loop {
        let heard = if stopping {
            rx.recv().await
        } else {
            tokio::select! {
                heard = rx.recv() => heard,
                _ = &mut shutdown => { stopping = true; stop.cancel(); continue; }
                _ = &mut deadline => { stopping = true; stop.cancel(); continue; }
            }
        };
        let Some(heard) = heard else { break };
        show(
            heard,
            &config.products,
            &options,
            &mut report,
            &mut seen,
            &mut recorder,
            out,
        )?;
    }
    stop.cancel();
    let source = source.await.map_err(|e| ScanError::Task(e.to_string()))?;
    if let Some((path, mut w)) = recorder {
        w.flush()
            .map_err(|source| ScanError::Record { path, source })?;
    }
    source?;
    report.devices = seen.len();
    writeln!(
        out,
        "{} advert(s) from {} device(s), {} matching a product, {} recorded",
        report.adverts, report.devices, report.matching, report.recorded
    )
    .map_err(ScanError::Output)?;
    Ok(report)
}

/// The configured source, given the products as the daemon gives them (a passive scan's
/// monitor is made of them); with `--all` it sends on what matches none too, for the
/// view to show and count.
fn spawn_source(
    config: &Config,
    clock: SharedClock,
    options: &ScanOptions,
    tx: mpsc::Sender<Heard>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Result<SourceReport, SourceError>> {
    let source = source::from_settings(&config.scanner, clock)
        .with_filter(config.products.clone(), None)
        .with_debug_hooks(&options.hooks);
    let source = if options.all {
        source.keeping_unmatched()
    } else {
        source
    };
    tokio::spawn(source.run(tx, stop))
}

#[allow(clippy::too_many_arguments)]
fn show(
    heard: Heard,
    products: &Products,
    options: &ScanOptions,
    report: &mut ScanReport,
    seen: &mut HashSet<Mac>,
    recorder: &mut Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    out: &mut (dyn Write + Send),
) -> Result<(), ScanError> {
    let adv = &heard.advert;
    report.adverts += 1;
    seen.insert(adv.mac);
    let capture = heard.capture.map(|c| *c).or_else(|| products.capture(adv));
    if capture.is_some() {
        report.matching += 1;
    } else if !options.all {
        return Ok(());
    }
    let (product, packet) = match &capture {
        Some(c) => (&*c.product_id, c.packet.clone()),
        None => ("-", on_air(adv)),
    };
    let rssi = adv.rssi.map_or_else(|| "-".to_string(), |r| r.to_string());
    writeln!(
        out,
        "{:<12}  {}  {:>4}  {:<10}  {}  {}",
        time_of_day(adv.ts_ms),
        adv.mac,
        rssi,
        product,
        packet,
        adv.name.as_deref().unwrap_or("")
    )
    .map_err(ScanError::Output)?;
    out.flush().map_err(ScanError::Output)?;
    if let Some((path, w)) = recorder {
        writeln!(w, "{}", adv.to_record())
            .and_then(|()| w.flush())
            .map_err(|source| ScanError::Record {
                path: path.clone(),
                source,
            })?;
        report.recorded += 1;
    }
    Ok(())
}

/// The advert's data as on air: manufacturer data with its company identifier
/// little-endian, else service data as `uuid:hex`.
fn on_air(adv: &Advertisement) -> String {
    let mut parts: Vec<String> = adv
        .manufacturer_data
        .iter()
        .map(|(id, d)| {
            let mut bytes = id.to_le_bytes().to_vec();
            bytes.extend_from_slice(d);
            hex_upper(&bytes)
        })
        .collect();
    parts.extend(
        adv.service_data
            .iter()
            .map(|(u, d)| format!("{u}:{}", hex_upper(d))),
    );
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// `HH:MM:SS.mmm` UTC.
fn time_of_day(ms: EpochMillis) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(manufacturer_data: Vec<(u16, Vec<u8>)>) -> Advertisement {
        Advertisement {
            ts_ms: 1_763_719_200_125,
            mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]),
            rssi: Some(-61),
            name: None,
            manufacturer_data,
            service_data: vec![],
        }
    }

    #[test]
    fn other_devices_show_their_data_as_on_air() {
        assert_eq!(on_air(&advert(vec![(0x004C, vec![2, 0x15])])), "4C000215");
        let mut a = advert(vec![]);
        assert_eq!(on_air(&a), "-");
        a.service_data = vec![("0000feaa-0000-1000-8000-00805f9b34fb".into(), vec![0x10])];
        assert_eq!(on_air(&a), "0000feaa-0000-1000-8000-00805f9b34fb:10");
    }

    #[test]
    fn times_are_shown_as_utc_time_of_day() {
        assert_eq!(time_of_day(1_763_719_200_125), "10:00:00.125");
    }

    #[tokio::test]
    async fn a_scan_of_a_simulation_shows_and_records_only_the_tapes() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("rec.jsonl");
        let config = crate::config::from_toml(
            "[scanner]\nsource = \"sim\"\nsim_tapes = 3\nsim_realtime = false\nsim_duration_secs = 5\nsim_others_ratio = 1\n",
            std::path::Path::new("test.toml"),
            [],
        )
        .unwrap();
        let mut out = Vec::new();
        let report = run(
            &config,
            &crate::clock::system(),
            ScanOptions {
                record: Some(record.clone()),
                ..ScanOptions::default()
            },
            std::future::pending(),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(report.matching, 15);
        assert_eq!(report.recorded, 15);
        assert!(report.adverts > 15);
        let lines = std::fs::read_to_string(&record).unwrap();
        for line in lines.lines() {
            let adv = Advertisement::from_record(line).unwrap();
            assert!(config.products.matches(&adv).is_some());
        }
        let shown = String::from_utf8(out).unwrap();
        assert_eq!(shown.lines().filter(|l| l.contains(" tape ")).count(), 15);
    }
}
