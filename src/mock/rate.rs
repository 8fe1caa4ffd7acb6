/*!
The shared rate window of spec section 8: label, relabel, show, deactivate and
configure share a number of requests per fixed window per API identity, and refused
requests count too. A window starts at the first request after the previous one ended
(the spec says "fixed", not aligned to clock minutes; starting at the first request is
the stricter reading, so a client that keeps the window itself is tested against the
harder case). Time is passed in, so the rule is tested without waiting.
*/

use std::time::Duration;

use tokio::time::Instant;

/// Requests per window (spec section 8).
pub const DEFAULT_RATE_LIMIT: u32 = 10;
/// Window length (spec section 8).
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(60);

/// One API identity's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RateWindow {
    started: Option<Instant>,
    count: u32,
}

impl RateWindow {
    pub(super) fn new() -> Self {
        RateWindow {
            started: None,
            count: 0,
        }
    }

    /// Counts a request made at `now`; whether it is within the limit.
    pub(super) fn admit(&mut self, now: Instant, limit: u32, length: Duration) -> bool {
        let expired = self.started.is_none_or(|s| now >= s + length);
        if expired {
            self.started = Some(now);
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        self.count <= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn the_eleventh_request_of_a_window_is_refused_and_the_next_window_admits_again() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        for i in 0..10 {
            assert!(w.admit(t0 + Duration::from_secs(i), 10, MIN), "request {i}");
        }
        assert!(!w.admit(t0 + Duration::from_secs(59), 10, MIN));
        assert!(w.admit(t0 + MIN, 10, MIN));
    }

    #[test]
    fn refused_requests_count_so_the_window_does_not_stretch() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        for _ in 0..15 {
            w.admit(t0, 10, MIN);
        }
        // Still the same window: it started at t0, not at the last refusal.
        assert!(!w.admit(t0 + Duration::from_secs(30), 10, MIN));
        assert!(w.admit(t0 + MIN, 10, MIN));
    }

    #[test]
    fn a_window_starts_at_the_first_request_not_at_a_clock_minute() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        assert!(w.admit(t0 + Duration::from_secs(50), 1, MIN));
        // 70 s after t0 is a new clock minute but the same window (it began at +50 s).
        assert!(!w.admit(t0 + Duration::from_secs(70), 1, MIN));
        assert!(w.admit(t0 + Duration::from_secs(110), 1, MIN));
    }
}
