//! Waiting for something the test cannot be told about: poll a probe until it is ready or
//! a limit passes. One helper for threads ([`eventually`], or [`eventually_every`] for a
//! probe that costs a trip into a container or a VM, and [`wait_for`] when giving up is
//! the test's failure) and one for tasks ([`eventually_async`], which sleeps on tokio's
//! timer so it never blocks a runtime).
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
pub fn eventually<R: Ready>(limit: Duration, probe: impl FnMut() -> R) -> Option<R::Value> {
    eventually_every(limit, POLL, probe)
}

/// [`eventually`], asking `probe` every `every`: for a probe that runs a command in a
/// container or a VM (each trip takes a while, and a VM under TCG has one core to share).
pub fn eventually_every<R: Ready>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> R,
) -> Option<R::Value> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().ready() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// [`eventually_every`] whose giving up fails the test, naming `what` it waited for.
pub fn wait_for<R: Ready>(
    what: &str,
    limit: Duration,
    every: Duration,
    probe: impl FnMut() -> R,
) -> R::Value {
    eventually_every(limit, every, probe)
        .unwrap_or_else(|| panic!("gave up after {limit:?} waiting for {what}"))
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
