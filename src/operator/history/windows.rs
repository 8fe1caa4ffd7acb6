/*!
The time frames of one history read (spec 4.2), pure, `now` passed in: the range split
into calendar months in UTC ([`month_windows`]), and the [`Plan`] that asks them in
order, halving a window the service refused as longer than its month, asking the rest
of a full answer on whichever side it lies, and naming what it could not complete. It
may touch nothing but time.
*/

use std::collections::VecDeque;

use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ToSpan};

/// Events one request returns at most (spec 4.2).
pub const MAX_EVENTS_PER_REQUEST: usize = 1000;
/// How far back history reaches (spec 4.2: one year).
pub const MAX_AGE_DAYS: i64 = 365;
/// Requests of one history read at most (a year of dense history is a few dozen).
pub const MAX_REQUESTS: usize = 400;
/// A time frame no reading of "one month" refuses (February).
const SURE_MONTH_SECS: i64 = 28 * 86_400;

/// One request's time frame (both ends inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryWindow {
    pub from: Timestamp,
    pub to: Timestamp,
}

impl HistoryWindow {
    fn secs(&self) -> i64 {
        self.to.as_second() - self.from.as_second()
    }

    /// The two halves, meeting at the whole second nearest the middle (`None` when the
    /// window is too short to split).
    fn halves(&self) -> Option<(HistoryWindow, HistoryWindow)> {
        let mid = Timestamp::from_second(self.from.as_second() + self.secs() / 2).ok()?;
        (mid > self.from && mid < self.to).then_some((
            HistoryWindow {
                from: self.from,
                to: mid,
            },
            HistoryWindow {
                from: mid,
                to: self.to,
            },
        ))
    }
}

impl std::fmt::Display for HistoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.from, self.to)
    }
}

/// The windows still to ask of one read, in order, and what could not be completed.
pub(super) struct Plan {
    queue: VecDeque<HistoryWindow>,
    /// Set after a 400 for a month: every later window is at most this long.
    cap: Option<i64>,
    requests: usize,
    /// What could not be completed, for a person.
    pub incomplete: Vec<String>,
}

impl Plan {
    pub fn new(windows: Vec<HistoryWindow>) -> Plan {
        Plan {
            queue: windows.into(),
            cap: None,
            requests: 0,
            incomplete: Vec::new(),
        }
    }

    /// Requests asked so far.
    pub fn requests(&self) -> usize {
        self.requests
    }

    /// The next window to ask, counted as a request; `None` when none is left, or when
    /// the read stops here (`stopped`: interrupted; or [`MAX_REQUESTS`] reached), which
    /// is noted.
    pub fn next(&mut self, stopped: bool) -> Option<HistoryWindow> {
        while let Some(w) = self.queue.pop_front() {
            if self.cap.is_some_and(|c| w.secs() > c) {
                if let Some((a, b)) = w.halves() {
                    self.queue.push_front(b);
                    self.queue.push_front(a);
                    continue;
                }
            }
            if stopped {
                self.interrupted(w);
                return None;
            }
            if self.requests >= MAX_REQUESTS {
                self.incomplete.push(format!(
                    "{w} and after: not read (more than {MAX_REQUESTS} requests needed; ask for a shorter range)"
                ));
                return None;
            }
            self.requests += 1;
            return Some(w);
        }
        None
    }

    /// The read was interrupted at `w`.
    pub fn interrupted(&mut self, w: HistoryWindow) {
        self.incomplete.push(format!("{w} and after: interrupted"));
    }

    /// The service refused `w` (400): `true` when `w` is longer than a month under any
    /// reading, so it is asked again in halves and every later window is cut to that;
    /// `false` when the refusal is a real one.
    pub fn refused(&mut self, w: HistoryWindow) -> bool {
        if w.secs() <= SURE_MONTH_SECS {
            return false;
        }
        let Some((a, b)) = w.halves() else {
            return false;
        };
        self.cap = Some(SURE_MONTH_SECS);
        self.queue.push_front(b);
        self.queue.push_front(a);
        true
    }

    /// `w` was answered with events at `times`. A full answer means the service kept
    /// one end of the window, the oldest or the newest, in some order: the rest is
    /// asked on both sides.
    pub fn answered(&mut self, w: HistoryWindow, times: &[Timestamp]) {
        if times.len() < MAX_EVENTS_PER_REQUEST {
            return;
        }
        let (Some(lo), Some(hi)) = (times.iter().min(), times.iter().max()) else {
            return;
        };
        match rest_of_full(w, *lo, *hi) {
            Some(rest) => {
                for r in rest.into_iter().rev() {
                    self.queue.push_front(r);
                }
            }
            None => self.incomplete.push(format!(
                "{w}: more than {MAX_EVENTS_PER_REQUEST} events at one instant; only {} of them read",
                times.len()
            )),
        }
    }
}

/// The windows still to ask after a full answer to `w` whose events span `lo..=hi`:
/// the parts of `w` outside that span, or (when it spans all of `w`) its halves.
/// `None`: `w` cannot be split further.
fn rest_of_full(w: HistoryWindow, lo: Timestamp, hi: Timestamp) -> Option<Vec<HistoryWindow>> {
    let mut rest = Vec::new();
    if lo > w.from {
        rest.push(HistoryWindow {
            from: w.from,
            to: lo,
        });
    }
    if hi < w.to {
        rest.push(HistoryWindow { from: hi, to: w.to });
    }
    if rest.is_empty() || rest.contains(&w) {
        // No part of the window is outside the answer (or the answer sits at one of
        // its ends, all at one instant): halve it instead, so each ask is smaller.
        let (a, b) = w.halves()?;
        rest = vec![a, b];
    }
    Some(rest)
}

fn utc_month_start_after(t: Timestamp) -> Option<Timestamp> {
    let date = t.to_zoned(TimeZone::UTC).date().first_of_month();
    let next = date.checked_add(1.month()).ok()?;
    next.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp())
}

/// The windows of one month at most that cover `from..=to` (each an inclusive range; the
/// next starts where one ends). `Ok(None)`: neither bound given, one request for the
/// latest event. Refuses a range reaching more than a year back or ending before it
/// starts. `from` alone ends now; `to` alone starts a month before it.
pub fn month_windows(
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    now: Timestamp,
) -> Result<Option<Vec<HistoryWindow>>, String> {
    let oldest = now
        .checked_sub(Span::new().hours(24 * MAX_AGE_DAYS))
        .map_err(|e| e.to_string())?;
    let (from, to) = match (from, to) {
        (None, None) => return Ok(None),
        (Some(f), None) => (f, now),
        (None, Some(t)) => {
            let f = t
                .to_zoned(TimeZone::UTC)
                .checked_sub(1.month())
                .map_err(|e| e.to_string())?
                .timestamp();
            (f, t)
        }
        (Some(f), Some(t)) => (f, t),
    };
    if from > to {
        return Err(format!("--from {from} is after --to {to}"));
    }
    if from < oldest {
        let days = (now.as_second() - from.as_second()) / 86_400;
        return Err(format!(
            "history reaches back at most one year ({MAX_AGE_DAYS} days); --from {from} is {days} days back"
        ));
    }
    let mut windows = Vec::new();
    let mut start = from;
    loop {
        let end = match utc_month_start_after(start) {
            Some(next) if next < to => next,
            _ => to,
        };
        windows.push(HistoryWindow {
            from: start,
            to: end,
        });
        if end >= to {
            return Ok(Some(windows));
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-11-23T12:00:00Z";

    #[test]
    fn no_time_frame_is_one_request_for_the_latest_event() {
        assert_eq!(month_windows(None, None, t(NOW)), Ok(None));
    }

    #[test]
    fn three_months_and_a_bit_are_four_windows_on_month_boundaries() {
        let w = month_windows(
            Some(t("2026-06-15T00:00:00Z")),
            Some(t("2026-09-20T00:00:00Z")),
            t(NOW),
        )
        .unwrap()
        .unwrap();
        let got: Vec<String> = w.iter().map(|w| format!("{}..{}", w.from, w.to)).collect();
        assert_eq!(
            got,
            [
                "2026-06-15T00:00:00Z..2026-07-01T00:00:00Z",
                "2026-07-01T00:00:00Z..2026-08-01T00:00:00Z",
                "2026-08-01T00:00:00Z..2026-09-01T00:00:00Z",
                "2026-09-01T00:00:00Z..2026-09-20T00:00:00Z",
            ]
        );
        // No window is over a month (31 days).
        assert!(w
            .iter()
            .all(|w| w.to.as_second() - w.from.as_second() <= 31 * 86_400));
    }

    #[test]
    fn on_every_fixed_day_a_years_windows_meet_end_to_end_each_within_one_month() {
        for day in crate::clock::fake::FIXED_DAYS {
            let now = Timestamp::from_millisecond(day.wall_ms).unwrap();
            let from = now - jiff::SignedDuration::from_hours(24 * MAX_AGE_DAYS);
            let w = month_windows(Some(from), None, now).unwrap().unwrap();
            assert_eq!(
                (w[0].from, w.last().unwrap().to),
                (from, now),
                "{}",
                day.rfc3339
            );
            assert!((12..=13).contains(&w.len()), "{}: {w:?}", day.rfc3339);
            for pair in w.windows(2) {
                assert_eq!(pair[0].to, pair[1].from, "{}", day.rfc3339);
            }
            for x in &w {
                // Within one calendar month: it starts in the month it ends in, or ends
                // at the first instant of the next.
                let (a, b) = (x.from.to_zoned(TimeZone::UTC), x.to.to_zoned(TimeZone::UTC));
                let next = a.date().first_of_month().checked_add(1.month()).unwrap();
                assert!(
                    b.date() < next
                        || b.datetime() == next.to_datetime(jiff::civil::time(0, 0, 0, 0)),
                    "{}: {x}",
                    day.rfc3339
                );
                assert!(x.secs() <= 31 * 86_400, "{}: {x}", day.rfc3339);
            }
        }
    }

    #[test]
    fn a_range_reaching_fourteen_months_back_is_refused() {
        let err = month_windows(Some(t("2025-09-23T00:00:00Z")), None, t(NOW)).unwrap_err();
        assert!(err.contains("one year"), "{err}");
        assert!(err.contains("426 days"), "{err}");
    }

    #[test]
    fn from_after_to_is_refused_and_from_alone_ends_now() {
        assert!(month_windows(Some(t(NOW)), Some(t("2026-11-01T00:00:00Z")), t(NOW)).is_err());
        let w = month_windows(Some(t("2026-11-20T00:00:00Z")), None, t(NOW))
            .unwrap()
            .unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].to, t(NOW));
        let w = month_windows(None, Some(t("2026-11-20T00:00:00Z")), t(NOW))
            .unwrap()
            .unwrap();
        assert_eq!(w[0].from, t("2026-10-20T00:00:00Z"));
    }

    fn w(from: &str, to: &str) -> HistoryWindow {
        HistoryWindow {
            from: t(from),
            to: t(to),
        }
    }

    #[test]
    fn the_rest_of_a_full_answer_is_asked_on_whichever_side_it_lies() {
        let win = w("2026-06-01T00:00:00Z", "2026-07-01T00:00:00Z");
        // The oldest 1,000 came: the rest is after them.
        assert_eq!(
            rest_of_full(win, t("2026-06-01T00:00:00Z"), t("2026-06-21T00:00:00Z")),
            Some(vec![w("2026-06-21T00:00:00Z", "2026-07-01T00:00:00Z")])
        );
        // The newest 1,000 came: the rest is before them.
        assert_eq!(
            rest_of_full(win, t("2026-06-10T00:00:00Z"), t("2026-07-01T00:00:00Z")),
            Some(vec![w("2026-06-01T00:00:00Z", "2026-06-10T00:00:00Z")])
        );
        // Spanning the whole window: its halves.
        assert_eq!(
            rest_of_full(win, win.from, win.to),
            Some(vec![
                w("2026-06-01T00:00:00Z", "2026-06-16T00:00:00Z"),
                w("2026-06-16T00:00:00Z", "2026-07-01T00:00:00Z")
            ])
        );
        // All at the window's last instant: halves, never the window again.
        assert_eq!(
            rest_of_full(win, win.to, win.to),
            Some(vec![
                w("2026-06-01T00:00:00Z", "2026-06-16T00:00:00Z"),
                w("2026-06-16T00:00:00Z", "2026-07-01T00:00:00Z")
            ])
        );
        let instant = w("2026-06-01T00:00:00Z", "2026-06-01T00:00:00Z");
        assert_eq!(rest_of_full(instant, instant.from, instant.to), None);
    }
}
