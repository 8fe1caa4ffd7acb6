/*!
The shared rate window of spec section 8: label, relabel, show, deactivate and
configure share a number of requests per fixed window per API identity, and refused
requests count too. Where a "fixed 60-second window" starts the spec does not say, so
the mock plays both readings ([`RateWindows`]): a window that starts at the first
request after the previous one ended, or windows on a fixed grid (clock minutes). Time
is passed in, so the rule is tested without waiting. It touches only the readings.
*/

use std::time::Duration;

use tokio::time::Instant;

use super::readings::RateWindows;

/// Requests per window (spec section 8).
pub const DEFAULT_RATE_LIMIT: u32 = 10;
/// Window length (spec section 8).
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(60);

/// One API identity's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateWindow {
    /// Grid: where the grid starts (the first request); first request: where the
    /// current window started.
    origin: Option<Instant>,
    /// Grid: the index of the window `count` counts in.
    index: u64,
    count: u32,
}

impl RateWindow {
    pub(crate) fn new() -> Self {
        RateWindow {
            origin: None,
            index: 0,
            count: 0,
        }
    }

    /// Counts a request made at `now`; whether it is within the limit.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        limit: u32,
        length: Duration,
        reading: RateWindows,
    ) -> bool {
        let origin = *self.origin.get_or_insert(now);
        match reading {
            RateWindows::FromFirstRequest => {
                if now >= origin + length {
                    self.origin = Some(now);
                    self.count = 0;
                }
            }
            RateWindows::Grid => {
                let index = (now.saturating_duration_since(origin).as_nanos()
                    / length.as_nanos().max(1)) as u64;
                if index != self.index {
                    self.index = index;
                    self.count = 0;
                }
            }
        }
        self.count = self.count.saturating_add(1);
        self.count <= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);
    const FIRST: RateWindows = RateWindows::FromFirstRequest;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_eleventh_request_of_a_window_is_refused_and_the_next_window_admits_again() {
        for reading in [FIRST, RateWindows::Grid] {
            let t0 = Instant::now();
            let mut w = RateWindow::new();
            for i in 0..10 {
                assert!(w.admit(t0 + secs(i), 10, MIN, reading), "request {i}");
            }
            assert!(!w.admit(t0 + secs(59), 10, MIN, reading));
            assert!(w.admit(t0 + MIN, 10, MIN, reading));
        }
    }

    #[test]
    fn refused_requests_count_so_the_window_does_not_stretch() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        for _ in 0..15 {
            w.admit(t0, 10, MIN, FIRST);
        }
        // Still the same window: it started at t0, not at the last refusal.
        assert!(!w.admit(t0 + secs(30), 10, MIN, FIRST));
        assert!(w.admit(t0 + MIN, 10, MIN, FIRST));
    }

    /// From the first request (that reading of the window), a window starts with the
    /// first request after the last one ended.
    #[test]
    fn a_window_starts_with_the_first_request_after_the_last_ended() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        assert!(w.admit(t0, 1, MIN, FIRST));
        assert!(w.admit(t0 + secs(110), 1, MIN, FIRST));
        // 130 s after t0 is a new grid window but the same window (it began at +110 s).
        assert!(!w.admit(t0 + secs(130), 1, MIN, FIRST));
        assert!(w.admit(t0 + secs(170), 1, MIN, FIRST));
    }

    #[test]
    fn on_the_grid_windows_follow_each_other_whether_requests_come_or_not() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        assert!(w.admit(t0, 1, MIN, RateWindows::Grid));
        assert!(w.admit(t0 + secs(110), 1, MIN, RateWindows::Grid));
        // 130 s is the window [120, 180): a new one on the grid.
        assert!(w.admit(t0 + secs(130), 1, MIN, RateWindows::Grid));
        assert!(!w.admit(t0 + secs(170), 1, MIN, RateWindows::Grid));
        // Ten at the end of one grid window and ten at the start of the next: 20 in 2 s.
        let mut w = RateWindow::new();
        w.admit(t0, 1, MIN, RateWindows::Grid);
        for i in 0..10 {
            assert!(w.admit(t0 + secs(119), 10, MIN, RateWindows::Grid), "{i}");
        }
        for i in 0..10 {
            assert!(w.admit(t0 + secs(120), 10, MIN, RateWindows::Grid), "{i}");
        }
    }
}
