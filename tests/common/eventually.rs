//! Waiting for something the test cannot be told about: poll a probe until it is ready or
//! a limit passes. One helper for threads ([`eventually`]) and one for tasks
//! ([`eventually_async`], which sleeps on tokio's timer so it never blocks a runtime).
//!
//! A probe is ready when it gives `true` or `Some`; the wait gives `None` once `limit`
//! has passed, so the caller says what did not happen (with the log it has at hand).

use std::time::Duration;

use tokio::time::Instant;

/// How often a probe is asked.
const POLL: Duration = Duration::from_millis(10);

/// What a probe gives: `true` or `Some(value)` once what it waits for has happened.
pub trait Ready {
    type Value;
    fn ready(self) -> Option<Self::Value>;
}

impl Ready for bool {
    type Value = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Ready for Option<T> {
    type Value = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// Polls `probe` every 10 ms until it is ready; `None` after `limit`.
pub fn eventually<R: Ready>(limit: Duration, mut probe: impl FnMut() -> R) -> Option<R::Value> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().ready() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// [`eventually`] for a task: the probe may await, and the wait sleeps on tokio's timer.
pub async fn eventually_async<R: Ready>(
    limit: Duration,
    mut probe: impl AsyncFnMut() -> R,
) -> Option<R::Value> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await.ready() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}
