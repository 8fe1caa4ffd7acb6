/*!
Living under systemd: `sd_notify` (READY, STATUS, STOPPING, WATCHDOG) and the watchdog
rule that pings only while every stage is making progress.
A leaf: it touches systemd's sockets only.

Each long-running stage owns a [`Beat`] and touches it whenever it completes a turn of
its loop (ingest on every input and commit, the flusher on every batch or idle wait). A
stage that waits for input with nothing in hand says so ([`Beat::idle`]) instead of
waking up to beat: an idle stage is not a stalled one, and a quiet dock costs no timer.
The watchdog task pings systemd only if every stage that is still running and not idle
has beaten within its allowance; a stuck flusher or a wedged outbox thread stops the pings, and systemd
restarts the service (`WatchdogSec=`, `Restart=on-failure`). Outside systemd
(`NOTIFY_SOCKET` unset) every call here is a no-op.
*/

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// A stage's heartbeat: milliseconds since the watchdog's epoch at its last turn,
/// `IDLE` while it waits for input with nothing in hand, or `DONE` once the stage has
/// ended normally.
#[derive(Clone)]
pub struct Beat {
    name: &'static str,
    last: Arc<AtomicU64>,
    epoch: Instant,
    allowance: Duration,
}

const DONE: u64 = u64::MAX;
const IDLE: u64 = u64::MAX - 1;

impl Beat {
    /// Records a turn of the stage's loop.
    pub fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    /// The stage waits for input and holds nothing: it is not expected to beat until
    /// its next [`touch`](Beat::touch), which it makes as soon as work arrives.
    pub fn idle(&self) {
        self.last.store(IDLE, Ordering::Relaxed);
    }

    /// The stage ended normally (a replay source reached its end): it is no longer
    /// expected to beat.
    pub fn done(&self) {
        self.last.store(DONE, Ordering::Relaxed);
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The set of stage heartbeats the watchdog looks at.
#[derive(Clone)]
pub struct Liveness {
    epoch: Instant,
    beats: Vec<Beat>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            epoch: Instant::now(),
            beats: Vec::new(),
        }
    }
}

impl Liveness {
    /// A new stage that must beat at least once per `allowance`.
    pub fn stage(&mut self, name: &'static str, allowance: Duration) -> Beat {
        let beat = Beat {
            name,
            last: Arc::new(AtomicU64::new(self.epoch.elapsed().as_millis() as u64)),
            epoch: self.epoch,
            allowance,
        };
        self.beats.push(beat.clone());
        beat
    }

    /// `Ok` when every running stage beat within its allowance at `now`; otherwise the
    /// name of a stage that did not.
    pub fn check(&self, now: Instant) -> Result<(), &'static str> {
        match self.stalled(now) {
            Some(stall) => Err(stall.stage),
            None => Ok(()),
        }
    }

    /// The first running stage that has not beaten within its allowance at `now`.
    pub fn stalled(&self, now: Instant) -> Option<Stall> {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.beats.iter().find_map(|b| {
            let last = b.last.load(Ordering::Relaxed);
            let silent = Duration::from_millis(now_ms.saturating_sub(last));
            (last != DONE && last != IDLE && silent > b.allowance).then_some(Stall {
                stage: b.name,
                silent,
                allowance: b.allowance,
            })
        })
    }
}

/// A stage that has stopped making progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub stage: &'static str,
    /// Since its last turn.
    pub silent: Duration,
    pub allowance: Duration,
}

/// Talks to systemd when started by it.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    enabled: bool,
}

impl Notifier {
    /// Enabled when `NOTIFY_SOCKET` is set (`Type=notify`).
    pub fn from_env() -> Notifier {
        Notifier {
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
        }
    }

    /// Whether systemd listens (`NOTIFY_SOCKET` was set).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn send(&self, state: &[sd_notify::NotifyState<'_>]) {
        if self.enabled {
            if let Err(e) = sd_notify::notify(false, state) {
                tracing::warn!(error = %e, "could not notify systemd");
            }
        }
    }

    /// The outbox is open and checked and the source has started.
    pub fn ready(&self) {
        self.send(&[sd_notify::NotifyState::Ready]);
    }

    /// The one-line state `systemctl status` shows.
    pub fn status(&self, text: &str) {
        self.send(&[sd_notify::NotifyState::Status(text)]);
    }

    pub fn stopping(&self) {
        self.send(&[sd_notify::NotifyState::Stopping]);
    }

    pub fn watchdog(&self) {
        self.send(&[sd_notify::NotifyState::Watchdog]);
    }

    /// Half the `WatchdogSec=` systemd asked for, if it asked (and the request is for
    /// this process): the rate systemd needs, and no faster.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        if !self.enabled {
            return None;
        }
        ping_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
    }
}

/// Half of `WATCHDOG_USEC` when it is given and `WATCHDOG_PID`, if given, is `me`.
fn ping_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.parse().ok()?;
    if pid
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p != me)
    {
        return None;
    }
    Some(Duration::from_micros(usec) / 2)
}

/// Pings the watchdog every `interval` while `liveness` holds; stops pinging (once,
/// with an ERROR naming the stalled stage) when it does not. Runs until dropped.
pub async fn watchdog(notifier: Notifier, liveness: Liveness, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    let mut stalled: Option<&'static str> = None;
    loop {
        tick.tick().await;
        match liveness.check(Instant::now()) {
            Ok(()) => {
                if let Some(stage) = stalled.take() {
                    tracing::info!(stage, "stage making progress again; watchdog pings resumed");
                }
                notifier.watchdog();
            }
            Err(stage) => {
                if stalled.is_none() {
                    tracing::error!(stage, "a stage has stopped making progress; withholding watchdog pings so systemd restarts the service");
                }
                stalled = Some(stage);
            }
        }
    }
}

/// Resolves on the first SIGTERM (systemd's stop) or SIGINT (Ctrl-C). The handlers are
/// installed here, at once: a process that cannot hear them must not run on as if it could.
pub fn stop_signals() -> std::io::Result<impl std::future::Future<Output = ()> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_stage_beating_keeps_the_watchdog_fed() {
        let mut l = Liveness::default();
        let ingest = l.stage("ingest", Duration::from_secs(10));
        let flush = l.stage("flush", Duration::from_secs(30));
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(5)).await;
            ingest.touch();
            flush.touch();
            assert_eq!(l.check(Instant::now()), Ok(()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_stage_stops_the_pings_and_is_named() {
        let mut l = Liveness::default();
        let ingest = l.stage("ingest", Duration::from_secs(10));
        let _flush = l.stage("flush", Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(8)).await;
        ingest.touch();
        assert_eq!(l.check(Instant::now()), Ok(()));
        // The flusher has not beaten for 31 s: stuck.
        tokio::time::advance(Duration::from_secs(23)).await;
        ingest.touch();
        assert_eq!(l.check(Instant::now()), Err("flush"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_ended_normally_is_not_expected_to_beat() {
        let mut l = Liveness::default();
        let source = l.stage("source", Duration::from_secs(5));
        source.done();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(l.check(Instant::now()), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stage_is_not_stalled_until_it_has_work_again() {
        let mut l = Liveness::default();
        let ingest = l.stage("ingest", Duration::from_secs(10));
        ingest.idle();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(l.check(Instant::now()), Ok(()));
        // Work arrived, and then the stage stopped turning (a wedged outbox).
        ingest.touch();
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(l.check(Instant::now()), Err("ingest"));
    }

    #[test]
    fn the_watchdog_is_pinged_at_half_watchdog_usec_and_only_for_this_process() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(ping_interval(Some("30000000"), None, 7), half);
        assert_eq!(ping_interval(Some("30000000"), Some("7"), 7), half);
        assert_eq!(ping_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(ping_interval(None, None, 7), None);
        assert_eq!(ping_interval(Some("soon"), None, 7), None);
    }

    #[test]
    fn outside_systemd_nothing_is_sent_and_there_is_no_watchdog() {
        let n = Notifier { enabled: false };
        n.ready();
        n.status("x");
        assert!(!n.is_enabled());
        assert_eq!(n.watchdog_interval(), None);
    }
}
