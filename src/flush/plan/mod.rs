/*!
The flusher's decisions, pure: what to send next, and what each answer means for the
captures in it. Time (`now`) and randomness (`jitter`) are passed in, so every rule is
a unit test; the async loop in `mod.rs` only carries the plan out (fetching from the
outbox, sending, recording).

The rules, in the order a batch meets them:
- **Composition.** A batch is the oldest pending capture of each MAC that is not busy
  (in a batch in flight, queued here, or waiting to be recorded), at most `limit`
  captures. So a MAC is in at most one batch in flight, and its captures go in capture
  order, however many batches are in flight.
- **When.** A full batch goes at once; so does one that is as full as it can get (it
  holds every MAC with a capture pending and some MAC has more behind it: waiting
  cannot make it fuller, only a new tape could). A part-full batch waits for more, up
  to `max_delay` from when it was first seen.
- **Pauses hold everything.** While new sends pause (a backoff, or the service's
  `Retry-After`), nothing is launched: not a queued part, not what a fetch already under
  way finds ([`Planner::offer`] checks, as [`Planner::next`] does). (The service client holds the same pause for requests already launched, from
  the instant a task reads the answer: see `api::pause`.)
- **Concurrency window** (AIMD, after vector's adaptive request concurrency): at most
  `window` batches in flight, `1..=max_in_flight`. It starts at 1, grows by one on a
  clean answer no slower than twice the usual to a full batch sent while the window was
  in use (so it grows no wider than the tapes free to fill its batches; past 8 only
  while the usual answer takes 50 ms or more and that latency is the link's, not a
  queue of batches: a slow uplink, `window.rs`), and halves
  on a transient failure (timeout, 429, 5xx, ...), once per round of batches.
- **Backoff.** A transient failure of an ordinary batch pauses new sends: exponential
  with full jitter, capped at `backoff_max`, but never shorter than the server's
  `Retry-After` (honoured beyond the cap, up to [`RETRY_AFTER_MAX`]). A clean answer
  ends the streak.
- **Evidence.** The service is known to take our requests, as far as a capture is
  concerned, once a batch *sent after* that capture first failed has been answered
  (with items). Only that evidence turns a failure into the capture's fault; an answer
  never does by its words.
- **400**: the batch is split into halves, sent before anything new. A capture refused
  alone is a dead letter with the service's message when there is evidence; without it
  (every half refused the same way, down to single captures: a request the service
  refuses whatever it holds, say headers a proxy drops), nothing is refused: the capture
  is parked, new sends pause and the cause is reported, and the next refusal alone with
  evidence decides.
- **413**: the batch size limit halves for this run; that size is never sent again.
- **Isolation.** A batch that fails transiently is parked on its own schedule
  (exponential from `backoff_initial`), its MACs held, so that other captures go
  first. If it fails again it is split in halves (as a 400 is), down to the capture
  alone. With evidence, it holds a capture the service chokes on: the others are not
  paused, and the capture alone, after `max_attempts` such failures on its own, becomes
  a dead letter with the cause. Without it (an outage) every failure pauses new sends
  and nothing is counted against a capture. Parked rows are bounded; past the bound a
  failed batch is left to the outbox.
- **Left out.** A capture a 200 answer leaves out (or answers with neither a reading
  nor an error) while it answers others is retried in a later batch; after
  `max_attempts` such answers it is a dead letter, and its MAC's later captures go on.
  An answer that answers nothing at all is a transient failure, unless it is to a
  capture alone that an earlier answer (answering others) already left out: then it
  is left out again.
- **Claims: one fate per capture.** The outbox never evicts a row on the wire, and a
  row it no longer holds is never sent. Nothing here claims: a batch's request claims
  its rows as it goes on the wire, once its token is in hand and no pause holds
  (`api::wire`, `flush::send`), and lets go at once of an answer that settles nothing;
  outcomes waiting to be recorded keep theirs. A batch found and waiting to fill, parked,
  split, or launched and waiting for its token or out a `Retry-After`, holds none (so an
  outage of any length pins nothing against eviction): rows evicted meanwhile are
  dropped as the request goes ([`Planner::gone`]), never sent. Rows this planner lets go
  of are handed back to the outbox ([`Planner::take_unclaimed`], carried by the next
  outbox call) for a later fetch to find.
- **Recording.** What an answer settled is kept here until the outbox has recorded it;
  if that fails (disk full), new sends pause (backoff) and the same outcomes are
  recorded again, never re-sent.

This file holds the [`Planner`] and what the loop calls (next, offer, gone, recorded).
Under it, each in a room of its own: what an answer means for its captures (the only
room that counts attempts and weighs evidence), the parked, split and isolating parts,
the concurrency window and the pause as pure state, and the vocabulary the loop and the
planner share. None of them does I/O.
*/

mod pause;
mod queue;
mod step;
mod verdict;
mod window;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::FlushSettings;
use crate::flush::answer::Action;
use crate::outbox::{Fetched, Outcome, PendingCapture, Seen};
use crate::record::Mac;
use pause::Pause;
use step::{Attempts, InFlight, Origin, Queued};
pub use step::{Batch, BatchId, Note, Resolution, Step};
use window::Window;

/// Captures whose attempts are remembered at most; past it those not held here are
/// forgotten (they start counting again), so memory stays bounded in any outage.
const ATTEMPTS_MAX: usize = 100_000;

/// After a fetch that saw every pending row, the next one waits for a change (an
/// answer, a commit) or this long: it could find nothing new, and a scan of a backlog
/// of few tapes passes every row. (Rows re-queued from the CLI are no commit of ours.)
const EXHAUSTED_RECHECK: Duration = Duration::from_secs(5);

/// The flusher's state and decisions.
#[derive(Debug)]
pub struct Planner {
    settings: FlushSettings,
    /// Largest batch (halved by 413).
    limit: usize,
    /// Batches in flight at most now (AIMD below `max_in_flight`).
    window: Window,
    /// New sends pause (backoff, `Retry-After`).
    pause: Pause,
    queue: VecDeque<Queued>,
    in_flight: HashMap<BatchId, InFlight>,
    /// Outcomes the outbox has not recorded yet (its last try failed).
    unrecorded: Option<Vec<(PendingCapture, Outcome)>>,
    /// The MACs of every row held here (in flight, queued, unrecorded).
    busy: HashSet<Mac>,
    /// Rows let go of, to hand back to the outbox with its next call.
    unclaimed: Vec<i64>,
    attempts: HashMap<i64, Attempts>,
    /// The highest id of a batch answered with at least one item.
    answered_ok: BatchId,
    next_id: BatchId,
    /// When a part-full batch was first seen.
    waiting_since: Option<Instant>,
    /// The last fetch saw every pending row and took or skipped them all: no fetch
    /// before this, unless something changes.
    exhausted_until: Option<Instant>,
}

impl Planner {
    pub fn new(settings: FlushSettings) -> Planner {
        Planner {
            limit: settings.max_batch.max(1),
            window: Window::new(),
            pause: Pause::new(settings.backoff_initial, settings.backoff_max),
            queue: VecDeque::new(),
            in_flight: HashMap::new(),
            unrecorded: None,
            busy: HashSet::new(),
            unclaimed: Vec::new(),
            attempts: HashMap::new(),
            answered_ok: 0,
            next_id: 0,
            waiting_since: None,
            exhausted_until: None,
            settings,
        }
    }

    /// The MACs a fetch must skip.
    pub fn busy(&self) -> &HashSet<Mac> {
        &self.busy
    }

    /// The rows to hand back to the outbox (found and not sent, left out of an
    /// answer, abandoned): it lets go of any claim on them, and a later fetch finds
    /// them. The caller passes them with its next outbox call.
    pub fn take_unclaimed(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.unclaimed)
    }

    /// The rows waiting to be handed back (what [`Planner::take_unclaimed`] would
    /// take), for checks.
    pub fn to_unclaim(&self) -> &[i64] {
        &self.unclaimed
    }

    /// The rows of the batches in flight (their requests claim them on the wire), for
    /// checks.
    pub fn in_flight_rows(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .in_flight
            .values()
            .flat_map(|b| b.rows.iter().map(|r| r.id))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The rows answered and not yet recorded, whose claims the outbox keeps, for
    /// checks.
    pub fn unrecorded_rows(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .unrecorded
            .iter()
            .flatten()
            .map(|(r, _)| r.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Batches in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The concurrency window now.
    pub fn window(&self) -> usize {
        self.window.size()
    }

    /// The batch size limit now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Nothing in flight, queued or waiting to be recorded.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.queue.is_empty() && self.unrecorded.is_none()
    }

    /// Until when new sends pause, if they do.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.pause.until(now)
    }

    /// What to do next.
    pub fn next(&mut self, now: Instant) -> Step {
        if let Some(until) = self.paused_until(now) {
            return Step::Wait(Some(until));
        }
        if let Some(settle) = self.unrecorded.take() {
            return Step::Record(settle);
        }
        if self.in_flight.len() >= self.window.size() {
            return Step::Wait(None);
        }
        if let Some(i) = self.queue.iter().position(|q| q.not_before <= now) {
            if let Some(q) = self.queue.remove(i) {
                return Step::Send(self.launch(q.rows, q.origin, q.seen, now));
            }
        }
        if let Some(until) = self.exhausted_until.filter(|t| *t > now) {
            let until = self.next_queued().map_or(until, |q| q.min(until));
            return Step::Wait(Some(until));
        }
        Step::Fetch { max: self.limit }
    }

    /// New captures were committed: a fetch may find them.
    pub fn committed(&mut self) {
        self.exhausted_until = None;
    }

    /// What a fetch found: send it, or wait for it to fill (its rows are handed back).
    /// `ingest_done`: no more captures will come, so waiting cannot fill it. A pause
    /// that began while the fetch was under way holds it too.
    pub fn offer(&mut self, fetched: Fetched, ingest_done: bool, now: Instant) -> Step {
        let Fetched {
            rows,
            complete,
            backlog,
            seen,
        } = fetched;
        if let Some(until) = self.paused_until(now) {
            self.unclaimed.extend(rows.iter().map(|r| r.id));
            return Step::Wait(Some(until));
        }
        if complete {
            self.exhausted_until = Some(now + EXHAUSTED_RECHECK);
        }
        if rows.is_empty() {
            self.waiting_since = None;
            return Step::Wait(self.next_queued());
        }
        let full = rows.len() >= self.limit || (complete && backlog) || ingest_done;
        if !full {
            // Waiting to fill: the fetch at `due` must happen.
            self.exhausted_until = None;
            let since = *self.waiting_since.get_or_insert(now);
            let due = since + self.settings.max_delay;
            if now < due {
                self.unclaimed.extend(rows.iter().map(|r| r.id));
                let until = self.next_queued().map_or(due, |q| q.min(due));
                return Step::Wait(Some(until));
            }
        }
        self.waiting_since = None;
        Step::Send(self.launch(rows, Origin::Fresh, seen, now))
    }

    /// Rows `gone` of batch `id` were no longer in the outbox when its request went on
    /// the wire (evicted while the batch waited, or a database replaced): they were
    /// not sent, and leave the batch here; their MACs are free. A batch left with no
    /// row was not sent at all, and is forgotten.
    pub fn gone(&mut self, id: BatchId, gone: &[i64]) {
        if gone.is_empty() {
            return;
        }
        let Some(batch) = self.in_flight.get_mut(&id) else {
            return;
        };
        self.exhausted_until = None;
        let gone: HashSet<i64> = gone.iter().copied().collect();
        let rows = Arc::make_mut(&mut batch.rows);
        for r in rows.iter().filter(|r| gone.contains(&r.id)) {
            self.busy.remove(&r.capture.mac);
            self.attempts.remove(&r.id);
        }
        rows.retain(|r| !gone.contains(&r.id));
        if rows.is_empty() {
            self.in_flight.remove(&id);
        }
    }

    /// The answer to batch `id` (its rows those its request sent: see
    /// [`Planner::gone`]). Rows not in the returned `settle` are released (retried
    /// later) or queued here; the settled ones stay busy (and claimed) until
    /// [`Planner::recorded`] (or [`Planner::record_failed`]). An answer that settles
    /// nothing has let go of its claims already (`flush::send`). What each answer
    /// does is `verdict.rs`.
    pub fn answered(
        &mut self,
        id: BatchId,
        action: Action,
        now: Instant,
        jitter: f64,
    ) -> Resolution {
        let Some(batch) = self.in_flight.remove(&id) else {
            return Resolution::default();
        };
        // Its MACs may be free again (now or once recorded).
        self.exhausted_until = None;
        self.judge(id, batch, action, now, jitter)
    }

    fn launch(
        &mut self,
        rows: Vec<PendingCapture>,
        origin: Origin,
        seen: Seen,
        now: Instant,
    ) -> Batch {
        self.next_id += 1;
        let id = self.next_id;
        self.busy.extend(rows.iter().map(|r| r.capture.mac));
        let window_full =
            self.in_flight.len() + 1 >= self.window.size() && rows.len() >= self.limit;
        let rows = Arc::new(rows);
        self.in_flight.insert(
            id,
            InFlight {
                rows: Arc::clone(&rows),
                origin,
                seen,
                sent_at: now,
                window_full,
            },
        );
        Batch { id, rows, seen }
    }

    /// Forgets the batches in flight (shutdown abandoned them; their rows stay
    /// pending in the outbox).
    pub fn abandon_in_flight(&mut self) {
        self.exhausted_until = None;
        for (_, b) in self.in_flight.drain() {
            for r in b.rows.iter() {
                self.busy.remove(&r.capture.mac);
                self.unclaimed.push(r.id);
            }
        }
    }

    /// The outcomes of `settle` are recorded (the outbox let go of their claims in the
    /// same call): their MACs are free again.
    pub fn recorded(&mut self, settle: &[(PendingCapture, Outcome)]) {
        self.exhausted_until = None;
        for (row, _) in settle {
            self.busy.remove(&row.capture.mac);
            self.attempts.remove(&row.id);
        }
    }

    /// Recording `settle` failed: keep it (its MACs stay busy, its rows claimed), pause
    /// new sends, and record it again after the pause instead of sending anything again.
    pub fn record_failed(
        &mut self,
        settle: Vec<(PendingCapture, Outcome)>,
        cause: String,
        now: Instant,
        jitter: f64,
    ) -> Resolution {
        let mut res = Resolution::default();
        match &mut self.unrecorded {
            Some(held) => held.extend(settle),
            None => self.unrecorded = Some(settle),
        }
        res.notes
            .push(self.pause.start(cause, "outbox_write", None, now, jitter));
        res
    }

    /// Reading the outbox failed: pause new sends (backoff).
    pub fn read_failed(&mut self, cause: String, now: Instant, jitter: f64) -> Resolution {
        let mut res = Resolution::default();
        res.notes
            .push(self.pause.start(cause, "outbox_read", None, now, jitter));
        res
    }

    /// Rows go back to the outbox's care (their claims let go, if they have any): a
    /// later fetch takes them again.
    fn release(&mut self, rows: Vec<PendingCapture>) {
        for r in rows {
            self.busy.remove(&r.capture.mac);
            self.unclaimed.push(r.id);
        }
    }

    fn bound_attempts(&mut self) {
        if self.attempts.len() <= ATTEMPTS_MAX {
            return;
        }
        let held: HashSet<i64> = self
            .in_flight
            .values()
            .flat_map(|b| b.rows.iter())
            .chain(self.queue.iter().flat_map(|q| q.rows.iter()))
            .map(|r| r.id)
            .collect();
        self.attempts.retain(|id, _| held.contains(id));
    }
}

#[cfg(test)]
mod tests;
