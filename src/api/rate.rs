//! The service's shared rate window (spec 8): label, relabel, show, deactivate and
//! configure share 10 requests per fixed 60 s window per API identity, and refused
//! requests count. The window is kept in the state database (`rate_window`), so that
//! separate CLI runs (a script looping over a CSV) share it; a run that would be the
//! 11th waits for the next window, and says so, instead of earning a 429.
//!
//! The rule is pure ([`take`], [`after_refusal`]: state and `now` in, state and decision
//! out); [`RateGate`] is its shell around the database.
//!
//! Our window cannot be aligned with the service's: it starts when we send the first
//! request of a window, the service's when that request arrives. So ours lasts
//! [`MARGIN`] longer, and a 429 anyway (another client of the same identity, a clock
//! step) marks the window full from now: the service's window ends within a window
//! length of any request it refused.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::now_ms;
use crate::outbox::{OutboxError, Store, StoreOptions, WindowState};
use crate::record::EpochMillis;

/// Requests per window (spec 8).
pub const REQUESTS_PER_WINDOW: u32 = 10;
/// How much longer our window lasts than the service's: the travel time of the first
/// request and the difference of the clocks.
pub const MARGIN: Duration = Duration::from_secs(1);

/// Whether a request may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Go: the slot is taken.
    Go,
    /// The window is full: try again after this long.
    Wait(Duration),
}

fn span_ms(window: Duration) -> EpochMillis {
    (window + MARGIN).as_millis() as EpochMillis
}

/// Takes a slot of the window `stored` at `now`, for a service window of length
/// `window`. Returns the state to store and whether to go.
pub fn take(
    stored: Option<WindowState>,
    now: EpochMillis,
    window: Duration,
) -> (Option<WindowState>, Slot) {
    let fresh = WindowState {
        started_at: now,
        used: 1,
    };
    let Some(mut w) = stored else {
        return (Some(fresh), Slot::Go);
    };
    // A clock stepped back: the window cannot have started in the future; count it
    // from now rather than wait for a start that may be far ahead.
    w.started_at = w.started_at.min(now);
    let ends = w.started_at + span_ms(window);
    if now >= ends {
        (Some(fresh), Slot::Go)
    } else if w.used < REQUESTS_PER_WINDOW {
        w.used += 1;
        (Some(w), Slot::Go)
    } else {
        (
            Some(w),
            Slot::Wait(Duration::from_millis((ends - now) as u64)),
        )
    }
}

/// The window after the service refused a request with 429 at `now`: full, from now.
pub fn after_refusal(now: EpochMillis) -> WindowState {
    WindowState {
        started_at: now,
        used: REQUESTS_PER_WINDOW,
    }
}

/// The state database of `state_dir`: the daemon's, or a new one when the daemon has
/// not run yet (the window must be shared all the same).
pub fn open_state(state_dir: &Path) -> Result<Store, OutboxError> {
    match Store::open_existing(state_dir)? {
        Some(s) => Ok(s),
        None => Ok(Store::open(state_dir, StoreOptions::default())?.0),
    }
}

/// The rate window of one API identity, in the state database (opened at the first
/// request that needs it, so that `locate` or `history` never touch it).
pub struct RateGate {
    state_dir: PathBuf,
    store: Mutex<Option<Store>>,
    identity: String,
    window: Duration,
    /// Told each wait before it starts ("waiting 41 s for the service's rate window").
    on_wait: Box<dyn Fn(Duration) + Send + Sync>,
}

impl RateGate {
    /// `identity` names the API identity (environment and user): windows of different
    /// identities are separate.
    pub fn new(
        state_dir: PathBuf,
        identity: String,
        window: Duration,
        on_wait: Box<dyn Fn(Duration) + Send + Sync>,
    ) -> RateGate {
        RateGate {
            state_dir,
            store: Mutex::new(None),
            identity,
            window,
            on_wait,
        }
    }

    fn with_window<R>(
        &self,
        decide: impl FnOnce(Option<WindowState>) -> (Option<WindowState>, R),
    ) -> Result<R, OutboxError> {
        // No lock is held across an await, so a poisoned store is still consistent.
        let mut slot = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let store = match slot.take() {
            Some(s) => slot.insert(s),
            None => slot.insert(open_state(&self.state_dir)?),
        };
        store.rate_window(&self.identity, decide)
    }

    /// Waits until a request may go, and takes its slot.
    pub async fn acquire(&self) -> Result<(), OutboxError> {
        loop {
            match self.with_window(|s| take(s, now_ms(), self.window))? {
                Slot::Go => return Ok(()),
                Slot::Wait(d) => {
                    (self.on_wait)(d);
                    tokio::time::sleep(d).await;
                }
            }
        }
    }

    /// The service answered 429: the window is full from now.
    pub fn refused(&self) -> Result<(), OutboxError> {
        self.with_window(|_| (Some(after_refusal(now_ms())), ()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// Takes `n` slots at `now`, returning the last decision and state.
    fn take_n(mut s: Option<WindowState>, now: EpochMillis, n: u32) -> (Option<WindowState>, Slot) {
        let mut slot = Slot::Go;
        for _ in 0..n {
            (s, slot) = take(s, now, MINUTE);
        }
        (s, slot)
    }

    #[test]
    fn ten_requests_go_in_a_window_and_the_eleventh_waits_for_its_end() {
        let t0 = 1_000_000;
        let (s, slot) = take_n(None, t0, 10);
        assert_eq!(slot, Slot::Go);
        let (_, slot) = take(s, t0 + 19_000, MINUTE);
        // 60 s from the first request, plus the margin, less the 19 s gone.
        assert_eq!(slot, Slot::Wait(Duration::from_secs(42)));
    }

    #[test]
    fn the_window_is_fixed_from_its_first_request_not_sliding() {
        let t0 = 1_000_000;
        let (s, _) = take(None, t0, MINUTE);
        let (s, _) = take_n(s, t0 + 59_000, 9);
        // Full at t0+59 s; at t0+61 s (past 60 s + margin) a new window begins.
        let (s, slot) = take(s, t0 + 61_000, MINUTE);
        assert_eq!(slot, Slot::Go);
        assert_eq!(
            s,
            Some(WindowState {
                started_at: t0 + 61_000,
                used: 1
            })
        );
    }

    #[test]
    fn a_refusal_fills_the_window_from_now() {
        let t0 = 1_000_000;
        let (s, _) = take(None, t0, MINUTE);
        assert_eq!(s.unwrap().used, 1);
        let (_, slot) = take(Some(after_refusal(t0 + 5_000)), t0 + 5_000, MINUTE);
        assert_eq!(slot, Slot::Wait(Duration::from_secs(61)));
    }

    #[test]
    fn a_clock_stepped_back_does_not_hold_requests_until_the_old_start() {
        let t0 = 1_000_000_000;
        let (s, _) = take_n(None, t0, 10);
        // The clock stepped back an hour: the full window counts from now.
        let (_, slot) = take(s, t0 - 3_600_000, MINUTE);
        assert_eq!(slot, Slot::Wait(Duration::from_secs(61)));
    }

    #[tokio::test]
    async fn two_gates_on_one_database_share_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let open = || RateGate::new(dir.path().into(), "ppe/gw".into(), MINUTE, Box::new(|_| {}));
        let (a, b) = (open(), open());
        for _ in 0..5 {
            a.acquire().await.unwrap();
            b.acquire().await.unwrap();
        }
        let slot = b.with_window(|s| take(s, now_ms(), MINUTE)).unwrap();
        assert!(matches!(slot, Slot::Wait(_)), "{slot:?}");
    }
}
