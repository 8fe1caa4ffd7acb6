/*!
The `replay` source: JSON Lines advertisement records from a file or stdin (`-`).
It touches the records and the clock.

Replay exists to re-run what a gateway heard (`tapegate scan --record`) through the
whole pipeline, so it keeps the capture times from the file and does not pace them:
advertisements go out as fast as the channel takes them, and dedup, working on capture
time, decides exactly as it did live.

A malformed line (not UTF-8, not JSON, a bad field) is logged at WARN with its line
number, counted in [`SourceReport::malformed`] and skipped: one bad line in a long
recording must not cost the rest. Blank lines are ignored. A record no radio could
have produced is malformed too: a capture time more than a day ahead of this clock
(milliseconds written as seconds) or before 2015 (a clock left at 1970), or
advertising data longer than one AD structure carries.

Reading goes through tokio's file (or stdin) behind a 1 MiB buffer, reusing one line
buffer: the blocking pool is entered once per megabyte, and parsing the record is the
whole per-line cost.
*/

use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SharedClock};
use crate::record::{Advertisement, EpochMillis};

use super::{Heard, Source, SourceError, SourceReport};

/// Read buffer. Large enough that a recording is read in few blocking calls (a read of a
/// file is one on tokio's blocking pool, through a buffer of the same size inside
/// `tokio::fs::File`, so the daemon holds this twice): a larger one costs memory and
/// saves no CPU (measured in `benches/footprint.rs`; the figures are in
/// `docs/benchmarks.md`).
const BUFFER: usize = 128 << 10;

/// A capture time before this (2015-01-01 UTC) is refused: no tape of this kind
/// advertised then, and such a time is a unit or clock mistake (seconds divided once too
/// often, a gateway's clock at its 1970 default), which the service would store as is.
const MIN_TS_MS: i64 = 1_420_070_400_000;

/// A capture time further ahead of this clock is refused: a clock a little off is
/// possible, a capture from tomorrow is not (milliseconds written as seconds land in
/// the year 57,000; `1e20` would be sent as a `scan_time` of 9223372036854775).
const MAX_AHEAD_MS: i64 = 24 * 3600 * 1000;

/// The most data one AD structure can carry after its type: its length octet counts at
/// most 255 bytes, one of them the AD type. This holds for legacy advertising (31 bytes
/// in all) and extended advertising (up to 1,650 bytes, but still in AD structures of at
/// most 255), so it is the bound that refuses no real advert. Manufacturer data gives 2
/// of these bytes to the company identifier, service data at least 2 to its UUID.
const MAX_AD_DATA: usize = 252;

/// Replays a JSON Lines recording.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The recording; `-` is stdin.
    pub path: PathBuf,
    /// What "now" is for a record's bounds (how far ahead of it a record may be).
    clock: SharedClock,
}

impl Replay {
    pub fn new(path: impl Into<PathBuf>, clock: SharedClock) -> Self {
        Replay {
            path: path.into(),
            clock,
        }
    }

    fn is_stdin(&self) -> bool {
        self.path.as_os_str() == "-"
    }
}

impl Source for Replay {
    async fn run(
        self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        let error = |source| SourceError::Replay {
            path: self.path.clone(),
            source,
        };
        let report = if self.is_stdin() {
            let input = BufReader::with_capacity(BUFFER, tokio::io::stdin());
            replay(input, &out, &stop, &*self.clock)
                .await
                .map_err(error)?
        } else {
            let file = tokio::fs::File::open(&self.path).await.map_err(error)?;
            let input = BufReader::with_capacity(BUFFER, file);
            replay(input, &out, &stop, &*self.clock)
                .await
                .map_err(error)?
        };
        tracing::info!(
            path = %self.path.display(),
            adverts = report.adverts,
            malformed = report.malformed,
            "replay ended"
        );
        Ok(report)
    }
}

/// Sends every record of `input` to `out` until the input ends, `stop` is cancelled or
/// `out` is closed. Fails only when reading fails.
async fn replay<R: AsyncRead + Unpin>(
    mut input: BufReader<R>,
    out: &mpsc::Sender<Heard>,
    stop: &CancellationToken,
    clock: &dyn Clock,
) -> std::io::Result<SourceReport> {
    let mut report = SourceReport::default();
    let mut buf = Vec::with_capacity(1024);
    let mut line_no: u64 = 0;
    // The read and the send are polled first: while they are ready (a buffered line, a
    // channel with room) the stop token costs one atomic load per line.
    while !stop.is_cancelled() {
        buf.clear();
        let n = tokio::select! {
            biased;
            n = input.read_until(b'\n', &mut buf) => n?,
            () = stop.cancelled() => break,
        };
        if n == 0 {
            break;
        }
        line_no += 1;
        let Some(adv) = parse_counted(&buf, line_no, &mut report, clock) else {
            continue;
        };
        // Without a wait while the channel has room (most lines).
        match out.try_send(Heard::from(adv)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return Ok(report),
            Err(mpsc::error::TrySendError::Full(heard)) => tokio::select! {
                biased;
                sent = out.send(heard) => if sent.is_err() { return Ok(report) },
                // Stopped while the pipeline does not take more: stop here.
                () = stop.cancelled() => return Ok(report),
            },
        }
        report.adverts += 1;
    }
    // Stopped: what was already read from the input is passed on while the pipeline
    // has room for it, not dropped; only the reading stops. A last line without its
    // line ending is incomplete and stays.
    let held = input.buffer();
    let complete = held.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for line in held[..complete].split_inclusive(|b| *b == b'\n') {
        line_no += 1;
        if let Some(adv) = parse_counted(line, line_no, &mut report, clock) {
            if out.try_send(Heard::from(adv)).is_err() {
                break;
            }
            report.adverts += 1;
        }
    }
    Ok(report)
}

/// One line, parsed: `None` when blank or malformed (logged and counted).
fn parse_counted(
    line: &[u8],
    line_no: u64,
    report: &mut SourceReport,
    clock: &dyn Clock,
) -> Option<Advertisement> {
    match parse_line(line, clock.wall_ms()) {
        Ok(adv) => adv,
        Err(reason) => {
            report.malformed += 1;
            tracing::warn!(line = line_no, %reason, "replay line {line_no} skipped: {reason}");
            None
        }
    }
}

/// One line (with or without its line ending): `None` if blank.
fn parse_line(bytes: &[u8], now_ms: EpochMillis) -> Result<Option<Advertisement>, String> {
    // A good record is read from its bytes at once; anything else (a blank line, bad
    // UTF-8, whitespace beyond ASCII) as text, for its reason.
    if let Some(adv) = Advertisement::from_record_bytes(bytes) {
        check_bounds(&adv, now_ms)?;
        return Ok(Some(adv));
    }
    let line = std::str::from_utf8(bytes).map_err(|e| format!("not valid UTF-8: {e}"))?;
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let adv = Advertisement::from_record(line).map_err(|e| e.to_string())?;
    check_bounds(&adv, now_ms)?;
    Ok(Some(adv))
}

/// Refuses what no radio heard: a capture time before 2015 or more than a day ahead of
/// `now_ms`, and advertising data longer than an AD structure holds.
fn check_bounds(adv: &Advertisement, now_ms: i64) -> Result<(), String> {
    let ts_secs = adv.ts_ms as f64 / 1000.0;
    if adv.ts_ms < MIN_TS_MS {
        return Err(format!(
            "ts: {ts_secs} is before 2015 (epoch seconds are expected; a clock left at 1970?)"
        ));
    }
    if adv.ts_ms > now_ms.saturating_add(MAX_AHEAD_MS) {
        return Err(format!(
            "ts: {ts_secs} is more than a day ahead of this clock (epoch seconds are expected; milliseconds?)"
        ));
    }
    let longest = |lens: &mut dyn Iterator<Item = usize>| lens.max().unwrap_or(0);
    let manufacturer = longest(&mut adv.manufacturer_data.iter().map(|(_, d)| d.len()));
    let service = longest(&mut adv.service_data.iter().map(|(_, d)| d.len()));
    for (field, len) in [
        ("manufacturer_data", manufacturer),
        ("service_data", service),
    ] {
        if len > MAX_AD_DATA {
            return Err(format!(
                "{field}: a value of {len} bytes is longer than BLE advertising carries ({MAX_AD_DATA})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
