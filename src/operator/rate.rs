//! The service's shared rate window (spec 8): label, relabel, show, deactivate and
//! configure share 10 requests per fixed 60 s window per API identity, and refused
//! requests count. Where a fixed window starts the spec does not say: at the first
//! request after the last one ended, or on clock minutes. Windows of our own anchored
//! anywhere would let 10 requests at the end of one of the service's windows and 10 at
//! the start of the next through (19 in one window of the other reading).
//!
//! So the rule is a sliding one, safe under every alignment: **never more than 10
//! requests in any span of one window's length**. If no such span holds 11, no fixed
//! window (whatever its start) can. The times of the last 10 requests of each identity
//! are kept in the state database (`rate_sends`), so that separate CLI runs (a script
//! looping over a CSV) share them; a request that would be the 11th waits, and says so,
//! instead of earning a 429.
//!
//! Time is measured so that the service's clock and the travel time do not matter: a
//! request's slot is stamped when it is taken and stamped again when its answer (or
//! failure) came back ([`RateGate::finish`]). The service counted it somewhere between
//! the two, and the next request that needs that slot free starts a window length
//! (plus [`MARGIN`]) after the later stamp. Every request takes a slot: the repeats
//! after a 429, a 5xx or a lost answer, and the resend after a 401.
//!
//! A 429 anyway (another client of the same identity, a clock step) fills the window
//! from now: the service's window ends within a window length of any request it refused.
//!
//! The rule is pure ([`take`], [`finish`], [`after_refusal`]: the stamps and `now` in, the
//! stamps and the decision out); [`RateGate`] is its shell around the database, the
//! one thing here that touches the state database (its `rate_sends` table, through the
//! side tables' [`RateWindow`] on a thread of its own).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::outbox::OutboxError;
use crate::record::EpochMillis;
use crate::side_tables::RateWindow;

/// Requests per window (spec 8).
pub const REQUESTS_PER_WINDOW: usize = 10;
/// Added to the window's length: the resolution of the service's clock and ours.
pub const MARGIN: Duration = Duration::from_secs(1);

/// Whether a request may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Go: the slot is taken, stamped with this time.
    Go(EpochMillis),
    /// Ten requests are in the last span: try again after this long.
    Wait(Duration),
}

/// The span no 11 requests may share: the service's window and the margin.
pub fn span(window: Duration) -> Duration {
    window + MARGIN
}

fn span_ms(window: Duration) -> EpochMillis {
    span(window).as_millis() as EpochMillis
}

/// The stamps that still count at `now`, oldest first: those within the last span. A
/// stamp in the future (a clock stepped back) counts as now, so a step back never holds
/// requests until a start far ahead.
fn live(stamps: &[EpochMillis], now: EpochMillis, window: Duration) -> Vec<EpochMillis> {
    let mut v: Vec<EpochMillis> = stamps
        .iter()
        .map(|s| (*s).min(now))
        .filter(|s| *s > now - span_ms(window))
        .collect();
    v.sort_unstable();
    let extra = v.len().saturating_sub(REQUESTS_PER_WINDOW);
    v.drain(..extra);
    v
}

/// Takes a slot at `now` for a service window of length `window`. Returns the stamps to
/// store and whether to go.
pub fn take(
    stamps: &[EpochMillis],
    now: EpochMillis,
    window: Duration,
) -> (Vec<EpochMillis>, Slot) {
    let mut v = live(stamps, now, window);
    if v.len() < REQUESTS_PER_WINDOW {
        v.push(now);
        return (v, Slot::Go(now));
    }
    let free_at = v[0] + span_ms(window);
    (
        v,
        Slot::Wait(Duration::from_millis((free_at - now).max(1) as u64)),
    )
}

/// The stamps after the request stamped `started` came back at `now`: its stamp moves
/// to `now` (the service counted it at the latest then).
pub fn finish(stamps: &[EpochMillis], started: EpochMillis, now: EpochMillis) -> Vec<EpochMillis> {
    let mut v = stamps.to_vec();
    if let Some(s) = v.iter_mut().find(|s| **s == started) {
        *s = now.max(started);
    }
    v
}

/// The stamps after the service refused a request with 429 at `now`: full, from now.
pub fn after_refusal(now: EpochMillis) -> Vec<EpochMillis> {
    vec![now; REQUESTS_PER_WINDOW]
}

/// How long `requests` more requests take when `free` slots are free now: each further
/// ten wait a span.
pub fn estimate(requests: u64, free: usize, window: Duration) -> Duration {
    let free = free as u64;
    if requests <= free {
        return Duration::ZERO;
    }
    let rounds = (requests - free).div_ceil(REQUESTS_PER_WINDOW as u64);
    span(window).saturating_mul(rounds.min(u32::MAX as u64) as u32)
}

/// A slot taken: give it back to [`RateGate::finish`] when the answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Ticket(EpochMillis);

/// A read and write of the stamps, run on the window's thread.
type Job = Box<dyn FnOnce(&mut Opened) + Send>;

/// The rate window of one API identity, in the state database. One thread of the gate's
/// own owns the connection (opened at the first request that needs it, so that `locate`
/// or `history` never touch it), so SQLite is never called from the async threads.
pub struct RateGate {
    jobs: mpsc::Sender<Job>,
    /// The window's thread: joined when the gate is dropped, so its connection is closed
    /// when the command ends.
    thread: Option<std::thread::JoinHandle<()>>,
    identity: String,
    window: Duration,
    /// The stamps' clock (the command's, handed in).
    clock: SharedClock,
    /// Told each wait before it starts ("waiting 41 s for the service's rate window").
    on_wait: Box<dyn Fn(Duration) + Send + Sync>,
}

/// The window's thread's state: the database, once opened.
struct Opened {
    state_dir: PathBuf,
    window: Option<RateWindow>,
}

impl Opened {
    fn window(&mut self) -> Result<&mut RateWindow, OutboxError> {
        match self.window.take() {
            Some(w) => Ok(self.window.insert(w)),
            None => Ok(self.window.insert(RateWindow::open(&self.state_dir)?)),
        }
    }
}

impl RateGate {
    /// `identity` names the API identity (environment and user): windows of different
    /// identities are separate. Fails only when the window's thread cannot be started.
    pub fn new(
        state_dir: PathBuf,
        identity: String,
        window: Duration,
        clock: SharedClock,
        on_wait: Box<dyn Fn(Duration) + Send + Sync>,
    ) -> std::io::Result<RateGate> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("tapegate-rate".into())
            .spawn(move || {
                let mut opened = Opened {
                    state_dir,
                    window: None,
                };
                while let Ok(job) = rx.recv() {
                    job(&mut opened);
                }
            })?;
        Ok(RateGate {
            jobs,
            thread: Some(thread),
            identity,
            window,
            clock,
            on_wait,
        })
    }

    /// The clock the window's stamps are read by.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The service's window length this gate keeps to.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Runs `decide` on the stamps in one write transaction, on the window's thread;
    /// it gets the clock too, read there.
    async fn with_stamps<R: Send + 'static>(
        &self,
        decide: impl FnOnce(Vec<EpochMillis>, &SharedClock) -> (Option<Vec<EpochMillis>>, R)
            + Send
            + 'static,
    ) -> Result<R, OutboxError> {
        let (tx, rx) = oneshot::channel();
        let identity = self.identity.clone();
        let clock = self.clock.clone();
        let job: Job = Box::new(move |opened| {
            let answer = opened
                .window()
                .and_then(|w| w.sends(&identity, |s| decide(s, &clock)));
            // The caller may have gone away (given up); the answer is then unwanted.
            let _ = tx.send(answer);
        });
        self.jobs.send(job).map_err(|_| OutboxError::Closed)?;
        rx.await.map_err(|_| OutboxError::Closed)?
    }

    /// Slots free now.
    pub async fn free_now(&self) -> Result<usize, OutboxError> {
        let window = self.window;
        self.with_stamps(move |s, clock| {
            let live = live(&s, clock.wall_ms(), window).len();
            (None, REQUESTS_PER_WINDOW - live)
        })
        .await
    }

    /// Waits until a request may go, and takes its slot. `None`: `stop` was cancelled
    /// while waiting (nothing taken).
    pub async fn acquire(&self, stop: &CancellationToken) -> Result<Option<Ticket>, OutboxError> {
        loop {
            if stop.is_cancelled() {
                return Ok(None);
            }
            let window = self.window;
            let slot = self
                .with_stamps(move |s, clock| {
                    let (next, slot) = take(&s, clock.wall_ms(), window);
                    (Some(next), slot)
                })
                .await?;
            match slot {
                Slot::Go(at) => return Ok(Some(Ticket(at))),
                Slot::Wait(d) => {
                    (self.on_wait)(d);
                    tokio::select! {
                        () = tokio::time::sleep(d) => {}
                        () = stop.cancelled() => return Ok(None),
                    }
                }
            }
        }
    }

    /// The request of `ticket` came back (answered or failed).
    pub async fn finish(&self, ticket: Ticket) -> Result<(), OutboxError> {
        self.with_stamps(move |s, clock| (Some(finish(&s, ticket.0, clock.wall_ms())), ()))
            .await
    }

    /// The service answered 429: the window is full from now.
    pub async fn refused(&self) -> Result<(), OutboxError> {
        self.with_stamps(|_, clock| (Some(after_refusal(clock.wall_ms())), ()))
            .await
    }
}

impl Drop for RateGate {
    fn drop(&mut self) {
        // Closing the channel ends the thread, which closes the database.
        drop(std::mem::replace(&mut self.jobs, mpsc::channel().0));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// Takes `n` slots at `now`, returning the stamps and the last decision.
    fn take_n(mut s: Vec<EpochMillis>, now: EpochMillis, n: u32) -> (Vec<EpochMillis>, Slot) {
        let mut slot = Slot::Go(now);
        for _ in 0..n {
            (s, slot) = take(&s, now, MINUTE);
        }
        (s, slot)
    }

    #[test]
    fn ten_requests_go_and_the_eleventh_waits_a_span_after_the_first() {
        let t0 = 1_000_000;
        let (s, slot) = take_n(vec![], t0, 10);
        assert_eq!(slot, Slot::Go(t0));
        let (_, slot) = take(&s, t0 + 19_000, MINUTE);
        // 60 s from the first request, plus the margin, less the 19 s gone.
        assert_eq!(slot, Slot::Wait(Duration::from_secs(42)));
    }

    #[test]
    fn no_span_of_a_window_ever_holds_eleven_requests() {
        // Requests as fast as the rule lets them go, from a start that is spread out
        // (one every 5 s) and then a burst: simulate and check every span.
        let mut s = Vec::new();
        let mut sent = Vec::new();
        let mut now = 1_000_000;
        for i in 0..60 {
            loop {
                let (next, slot) = take(&s, now, MINUTE);
                s = next;
                match slot {
                    Slot::Go(at) => {
                        sent.push(at);
                        break;
                    }
                    Slot::Wait(d) => now += d.as_millis() as EpochMillis,
                }
            }
            now += if i < 10 { 5_000 } else { 100 };
        }
        for (i, t) in sent.iter().enumerate() {
            let within = sent[i..].iter().filter(|u| **u < t + 60_000).count();
            assert!(within <= 10, "{within} requests in the 60 s from {t}");
        }
        // A window anchored at the first request would have let ten go at once at 61 s,
        // sharing a clock minute with the last of the ten spread over 45 s; here each
        // waits for the slot of its own predecessor ten back.
        assert!(sent[11] >= sent[1] + 61_000, "{} vs {}", sent[11], sent[1]);
    }

    #[test]
    fn a_slot_counts_from_when_its_answer_came_back() {
        let t0 = 1_000_000;
        let (mut s, _) = take_n(vec![], t0, 10);
        // Each answer took 5 s: the service may have counted each request then.
        for _ in 0..10 {
            s = finish(&s, t0, t0 + 5_000);
        }
        assert_eq!(s, vec![t0 + 5_000; 10]);
        let (_, slot) = take(&s, t0 + 61_500, MINUTE);
        assert_eq!(slot, Slot::Wait(Duration::from_millis(4_500)));
    }

    #[test]
    fn a_refusal_fills_the_window_from_now() {
        let t0 = 1_000_000;
        let (_, slot) = take(&after_refusal(t0 + 5_000), t0 + 5_000, MINUTE);
        assert_eq!(slot, Slot::Wait(Duration::from_secs(61)));
    }

    #[test]
    fn a_clock_stepped_back_does_not_hold_requests_until_the_old_start() {
        let t0 = 1_000_000_000;
        let (s, _) = take_n(vec![], t0, 10);
        // The clock stepped back an hour: the full window counts from now.
        let (_, slot) = take(&s, t0 - 3_600_000, MINUTE);
        assert_eq!(slot, Slot::Wait(Duration::from_secs(61)));
    }

    #[test]
    fn the_estimate_is_a_span_per_ten_requests_beyond_the_free_slots() {
        assert_eq!(estimate(5, 10, MINUTE), Duration::ZERO);
        assert_eq!(estimate(11, 10, MINUTE), Duration::from_secs(61));
        // 100,000 devices, 20 a request: 5,000 requests, 499 waits of 61 s (8 h 27 min).
        assert_eq!(estimate(5_000, 10, MINUTE), Duration::from_secs(499 * 61));
    }

    #[tokio::test]
    async fn two_gates_on_one_database_share_the_window() {
        for day in crate::clock::fake::FIXED_DAYS {
            let dir = tempfile::tempdir().unwrap();
            let clock: SharedClock =
                std::sync::Arc::new(crate::clock::fake::HandClock::at(day.wall_ms));
            let open = || {
                RateGate::new(
                    dir.path().into(),
                    "ppe/gw".into(),
                    MINUTE,
                    clock.clone(),
                    Box::new(|_| {}),
                )
                .unwrap()
            };
            let (a, b) = (open(), open());
            let go = CancellationToken::new();
            for _ in 0..5 {
                let t = a.acquire(&go).await.unwrap().unwrap();
                a.finish(t).await.unwrap();
                let _ = b.acquire(&go).await.unwrap().unwrap();
            }
            assert_eq!(a.free_now().await.unwrap(), 0, "{}", day.rfc3339);
            // A wait is cut short by `stop`.
            let stop = CancellationToken::new();
            stop.cancel();
            assert_eq!(b.acquire(&stop).await.unwrap(), None, "{}", day.rfc3339);
        }
    }
}
