/*!
What the running daemon keeps of its health for operators: the one-line `STATUS=` that
`systemctl status` shows (pending, last flush, last error), and the BLE scanner's ladder
counts, moved into the state database so that `tapegate status` shows them accumulated
across restarts.

`STATUS=` is built from the readers' handle: the flusher's part (the last good flush)
from memory, the counters read again only when this daemon wrote something it shows (a
commit, a settle, an error, a clock release: the outbox's change count), at most once a
`STATUS_EVERY`, and otherwise every `STATUS_STALE` (for what the CLI changes from another
process). It is sent only when its text changes: it names the time of the last good
flush rather than its age, so an idle gateway reads and sends nothing.

[`verdict`] is what `/healthz` answers: the watchdog's truth (every running stage has
turned within its allowance, [`Liveness`]) and, beyond it, admission's and delivery's:
an ingest stage that turns but cannot commit (a full disk, a database this user cannot
write, a state directory whose file system turned read-only: [`Admission`]) accepts
nothing, and a flusher that turns but whose requests keep
failing (a hanging or failing service) delivers nothing. The watchdog leaves those out
on purpose: restarting the daemon frees no disk and brings no service back, so systemd
is not asked to.
*/

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{rfc3339, SharedClock};
use crate::metrics::{Metrics, FAILING_AFTER};
use crate::outbox::{Reader, ScannerCounts, ScannerNotes, Stats};
use crate::record::EpochMillis;
use crate::source::SourceHealth;
use crate::util::systemd::{Liveness, Notifier};

mod admission;
pub use admission::Admission;

/// How often, at most, the state is read for `STATUS=` (sent only when it changed).
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// How often the state is read for `STATUS=` when this daemon changed nothing in it.
const STATUS_STALE: Duration = Duration::from_secs(60);

/// How often the scanner's counts are moved into the state database outside systemd.
const KEEP_EVERY: Duration = Duration::from_secs(10);

/// The BLE reports per second are written to the state database over this long (the
/// status page shows them live): one small write a minute, not one a second.
const RATE_EVERY: Duration = Duration::from_secs(60);

/// Why the daemon is not healthy: the stage, and a sentence for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    pub stage: &'static str,
    pub reason: String,
}

/// `Ok` while every stage makes progress (see the module doc).
pub fn verdict(
    liveness: &Liveness,
    admission: &Admission,
    metrics: &Metrics,
) -> Result<(), Unhealthy> {
    if let Some(stall) = liveness.stalled(tokio::time::Instant::now()) {
        return Err(Unhealthy {
            stage: stall.stage,
            reason: format!(
                "no progress for {} s (allowed {} s)",
                stall.silent.as_secs(),
                stall.allowance.as_secs()
            ),
        });
    }
    if let Some((reason, since)) = admission.failing() {
        return Err(Unhealthy {
            stage: "outbox",
            reason: format!(
                "captures cannot be committed (for {} s; they are held, not lost): {reason}",
                since.as_secs()
            ),
        });
    }
    let (failed, cause) = metrics.failing();
    if failed >= FAILING_AFTER {
        return Err(Unhealthy {
            stage: "flush",
            reason: format!("{failed} requests to the service failed in a row (last: {cause})"),
        });
    }
    Ok(())
}

/// Moves what the source has been through into the state database, as increments, so
/// that `status` shows the counts accumulated across restarts of the daemon.
pub struct HealthKeeper {
    health: Arc<SourceHealth>,
    kept: ScannerCounts,
    trouble_at: Option<EpochMillis>,
    /// The reports counted at the last keep, and when (the live rate).
    reports_seen: Option<(tokio::time::Instant, u64)>,
    /// The same when the rate was last written, and the path written.
    reports_kept: Option<(tokio::time::Instant, u64)>,
    path_kept: Option<&'static str>,
    /// When a rate was measured, by the daemon's clock.
    clock: SharedClock,
}

impl HealthKeeper {
    pub fn new(health: Arc<SourceHealth>, clock: SharedClock) -> HealthKeeper {
        HealthKeeper {
            health,
            clock,
            kept: ScannerCounts::default(),
            trouble_at: None,
            reports_seen: None,
            reports_kept: None,
            path_kept: None,
        }
    }

    /// Measures the reports per second since the last keep (for the status page) and,
    /// every [`RATE_EVERY`] or when the path changed, writes them with the path for
    /// `tapegate status`.
    async fn keep_rate(&mut self, outbox: &ScannerNotes) {
        let Some(path) = self.health.adverts_path() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let reports = self.health.reports.load(Ordering::Relaxed);
        let rate = |(t, n): (tokio::time::Instant, u64)| {
            let secs = now.duration_since(t).as_secs_f64();
            (secs > 0.0).then(|| reports.saturating_sub(n) as f64 / secs)
        };
        if let Some(r) = self.reports_seen.and_then(rate) {
            if let Ok(mut live) = self.health.reports_per_sec.lock() {
                *live = Some(r);
            }
        }
        self.reports_seen = Some((now, reports));
        let due = self
            .reports_kept
            .is_none_or(|(t, _)| now.duration_since(t) >= RATE_EVERY);
        if !due && self.path_kept == Some(path) {
            return;
        }
        let per_sec = self.reports_kept.and_then(rate);
        let at = self.clock.wall_ms();
        let written = outbox.note_rate(path, per_sec, at).await;
        if written.is_ok() {
            self.reports_kept = Some((now, reports));
            self.path_kept = Some(path);
        }
    }

    async fn keep(&mut self, outbox: &ScannerNotes) {
        self.keep_rate(outbox).await;
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let now = ScannerCounts {
            restarts: read(&self.health.restarts),
            reacquires: read(&self.health.reacquires),
            dropped: read(&self.health.dropped),
            forgotten: read(&self.health.forgotten),
        };
        let trouble = self
            .health
            .last_trouble
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .filter(|(_, at)| Some(*at) != self.trouble_at);
        if now == self.kept && trouble.is_none() {
            return;
        }
        let delta = ScannerCounts {
            restarts: now.restarts - self.kept.restarts,
            reacquires: now.reacquires - self.kept.reacquires,
            dropped: now.dropped - self.kept.dropped,
            forgotten: now.forgotten - self.kept.forgotten,
        };
        let result = outbox.add_counts(delta, trouble.clone()).await;
        match result {
            Ok(()) => {
                self.kept = now;
                if let Some((_, at)) = trouble {
                    self.trouble_at = Some(at);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not keep the scanner's counts; will try again")
            }
        }
    }
}

/// Keeps `systemctl status` current (pending, last flush, last error) and the scanner's
/// counts in the state database; keeps them once more when stopped.
pub async fn report_status(
    notifier: Notifier,
    reader: Reader,
    scanner: ScannerNotes,
    mut health: HealthKeeper,
    stop: CancellationToken,
) {
    // Outside systemd only the scanner's counts are kept, which need no haste: an idle
    // daemon wakes for them every `KEEP_EVERY`, not every second.
    let every = if notifier.is_enabled() {
        STATUS_EVERY
    } else {
        KEEP_EVERY
    };
    let mut tick = tokio::time::interval(every);
    let mut status = StatusLine::new(reader);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => {
                health.keep(&scanner).await;
                return;
            }
        }
        health.keep(&scanner).await;
        // Outside systemd nobody reads `STATUS=`: no query for it.
        if notifier.is_enabled() && !status.send_if_changed(&notifier).await {
            return;
        }
    }
}

/// The `STATUS=` line last sent, and when the state it was built from was read.
struct StatusLine {
    reader: Reader,
    changes: tokio::sync::watch::Receiver<u64>,
    flusher: Option<crate::outbox::FlusherState>,
    read_at: Option<tokio::time::Instant>,
    stats: Stats,
    sent: String,
}

impl StatusLine {
    fn new(reader: Reader) -> StatusLine {
        StatusLine {
            changes: reader.changes(),
            flusher: None,
            reader,
            read_at: None,
            stats: Stats::default(),
            sent: String::new(),
        }
    }

    /// Reads the counters again if this daemon changed them (or [`STATUS_STALE`] has
    /// passed), takes the flusher's state from memory, and sends the line if it changed.
    /// `false` once the outbox has closed.
    async fn send_if_changed(&mut self, notifier: &Notifier) -> bool {
        let now = tokio::time::Instant::now();
        let stale = self
            .read_at
            .is_none_or(|at| now.duration_since(at) >= STATUS_STALE);
        let changed = self.changes.has_changed().unwrap_or(false);
        if stale || changed {
            self.changes.mark_unchanged();
            let Ok(s) = self.reader.stats().await else {
                return false;
            };
            self.stats = s;
            self.read_at = Some(now);
        }
        let flusher = self.reader.flusher();
        if flusher != self.flusher {
            if let Some(f) = &flusher {
                crate::outbox::overlay_flusher(&mut self.stats, f);
            }
            self.flusher = flusher;
        }
        let text = status_line(&self.stats);
        if text != self.sent {
            notifier.status(&text);
            self.sent = text;
        }
        true
    }
}

/// The `STATUS=` line: a function of the state alone, so that it changes only when the
/// state does.
fn status_line(s: &Stats) -> String {
    let last_ok = s.last_flush_ok_at.map_or_else(|| "never".into(), rfc3339);
    let mut text = format!(
        "pending {}, delivered {}, dead letters {}, last flush ok {last_ok}",
        s.pending, s.delivered, s.dead_letters
    );
    if s.clock.held > 0 {
        text.push_str(&format!(
            ", {} held until the clock is trusted",
            s.clock.held
        ));
    }
    if let (Some(e), Some(at)) = (&s.last_error, s.last_error_at) {
        if s.last_flush_ok_at.is_none_or(|ok| at > ok) {
            text.push_str(&format!(", last error: {e}"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_status_line_changes_only_with_the_state() {
        let mut s = Stats {
            pending: 3,
            delivered: 10,
            last_flush_ok_at: Some(1_763_719_200_000),
            ..Stats::default()
        };
        let line = status_line(&s);
        assert_eq!(
            line,
            "pending 3, delivered 10, dead letters 0, last flush ok 2025-11-21T10:00:00Z"
        );
        assert_eq!(
            status_line(&s),
            line,
            "same state, same line: nothing is sent"
        );
        s.last_error = Some("service unreachable".into());
        s.last_error_at = Some(1_763_719_201_000);
        assert!(status_line(&s).ends_with(", last error: service unreachable"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_stage_is_unhealthy_naming_the_stage_and_how_long() {
        let mut liveness = Liveness::default();
        let ingest = liveness.stage("ingest", Duration::from_secs(30));
        let metrics = Metrics::new();
        assert_eq!(verdict(&liveness, &Admission::default(), &metrics), Ok(()));
        tokio::time::advance(Duration::from_secs(31)).await;
        let u = verdict(&liveness, &Admission::default(), &metrics).unwrap_err();
        assert_eq!(u.stage, "ingest");
        assert_eq!(u.reason, "no progress for 31 s (allowed 30 s)");
        ingest.touch();
        assert_eq!(verdict(&liveness, &Admission::default(), &metrics), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_commits_make_the_outbox_unhealthy_at_once_until_one_succeeds() {
        let liveness = Liveness::default();
        let metrics = Metrics::new();
        let admission = Admission::default();
        assert_eq!(verdict(&liveness, &admission, &metrics), Ok(()));
        admission.failed("database or disk is full".into());
        tokio::time::advance(Duration::from_secs(50)).await;
        admission.failed("database or disk is full".into());
        let u = verdict(&liveness, &admission, &metrics).unwrap_err();
        assert_eq!(u.stage, "outbox");
        assert_eq!(
            u.reason,
            "captures cannot be committed (for 50 s; they are held, not lost): database or disk is full"
        );
        admission.committed();
        assert_eq!(verdict(&liveness, &admission, &metrics), Ok(()));
    }

    #[test]
    fn requests_failing_in_a_row_make_the_flusher_unhealthy_until_one_is_answered() {
        let liveness = Liveness::default();
        let metrics = Metrics::new();
        let fail = || metrics.delivery_failed("http_5xx");
        for _ in 1..FAILING_AFTER {
            fail();
        }
        assert_eq!(
            verdict(&liveness, &Admission::default(), &metrics),
            Ok(()),
            "a blip is not a stall"
        );
        fail();
        let u = verdict(&liveness, &Admission::default(), &metrics).unwrap_err();
        assert_eq!(u.stage, "flush");
        assert!(
            u.reason.ends_with("failed in a row (last: http_5xx)"),
            "{}",
            u.reason
        );
        metrics.delivery_progressed();
        assert_eq!(verdict(&liveness, &Admission::default(), &metrics), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_reports_rate_is_live_on_the_page_and_written_for_status_once_a_minute() {
        use crate::outbox::{Outbox, Retention, StoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let (outbox, _thread) =
            Outbox::open(dir.path(), StoreOptions::default(), Retention::default())
                .unwrap()
                .start()
                .unwrap();
        let health = Arc::new(SourceHealth::default());
        let day = crate::clock::fake::FIXED_DAYS[3];
        let clock = Arc::new(crate::clock::fake::HandClock::at(day.wall_ms));
        let mut keeper = HealthKeeper::new(health.clone(), clock);
        let notes = crate::outbox::Handles::new(&outbox).scanner();
        let reader = crate::outbox::Handles::new(&outbox).reader();
        let stats = || async { reader.stats().await.unwrap() };
        // Before the source says where it reads, nothing is written.
        keeper.keep(&notes).await;
        assert_eq!(stats().await.scanner_adverts, None);
        health.set_adverts_path("mgmt");
        keeper.keep(&notes).await;
        let s = stats().await;
        assert_eq!(s.scanner_adverts.as_deref(), Some("mgmt"));
        assert_eq!(s.scanner_reports_per_sec, None, "no minute measured yet");
        let first_at = s.scanner_reports_at;
        // 10 s of 100 reports a second: live at once, not yet written.
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(1)).await;
            health.reports.fetch_add(100, Ordering::Relaxed);
            keeper.keep(&notes).await;
        }
        assert_eq!(health.reports_per_sec(), Some(100.0));
        assert_eq!(stats().await.scanner_reports_at, first_at);
        // At the minute, the minute's rate is written (500 reports a second after the
        // first 10 s).
        for _ in 0..50 {
            tokio::time::advance(Duration::from_secs(1)).await;
            health.reports.fetch_add(500, Ordering::Relaxed);
            keeper.keep(&notes).await;
        }
        let s = stats().await;
        // (10 s x 100 + 50 s x 500) / 60 s, to a tenth.
        assert_eq!(s.scanner_reports_per_sec, Some(433.3));
        assert_eq!(health.reports_per_sec(), Some(500.0));
        // A changed path is written at once.
        health.set_adverts_path("dbus");
        keeper.keep(&notes).await;
        assert_eq!(stats().await.scanner_adverts.as_deref(), Some("dbus"));
    }
}
