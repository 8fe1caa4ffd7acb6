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
  way finds ([`Planner::offer`] and [`Planner::claimed`] check, as [`Planner::next`]
  does). (The service client holds the same pause for requests already launched, from
  the instant a task reads the answer: see `api::pause`.)
- **Concurrency window** (AIMD, after vector's adaptive request concurrency): at most
  `window` batches in flight, `1..=max_in_flight`. It starts at 1, grows by one on a
  clean answer no slower than twice the usual to a full batch sent while the window was
  in use (so it grows no wider than the tapes free to fill its batches; past 8 only
  while the usual answer takes 50 ms or more: a slow uplink), and halves
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
- **Claims: one fate per capture.** The outbox never evicts a row the flusher has
  claimed, and a row it no longer holds is never sent. A fetch claims what it finds; a
  batch in flight, and outcomes waiting to be recorded, keep their claims; everything
  else is handed back ([`Planner::take_unclaimed`], carried by the next outbox call).
  A parked or split part holds its rows without a claim (so that a long outage cannot
  pin them against eviction) and claims them again just before it is sent
  ([`Step::Claim`]): rows evicted meanwhile are dropped, never sent.
- **Recording.** What an answer settled is kept here until the outbox has recorded it;
  if that fails (disk full), new sends pause (backoff) and the same outcomes are
  recorded again, never re-sent.
*/

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::answer::Action;
use crate::backoff::{Backoff, RETRY_AFTER_MAX};
use crate::config::FlushSettings;
use crate::outbox::{Fetched, Outcome, PendingCapture};
use crate::record::Mac;

/// Captures whose attempts are remembered at most; past it those not held here are
/// forgotten (they start counting again), so memory stays bounded in any outage.
const ATTEMPTS_MAX: usize = 100_000;

/// After a fetch that saw every pending row, the next one waits for a change (an
/// answer, a commit) or this long: it could find nothing new, and a scan of a backlog
/// of few tapes passes every row. (Rows re-queued from the CLI are no commit of ours.)
const EXHAUSTED_RECHECK: Duration = Duration::from_secs(5);

/// The window grows past this many batches only while answers are slow (the usual
/// answer takes [`SLOW_ANSWER`] or more): below it, this many batches of 250 already
/// carry 40,000 captures/s, more than a gateway encodes, and a wider window only costs
/// (fetches past busy tapes, smaller batches, connections).
const FAST_WINDOW: usize = 8;
const SLOW_ANSWER: Duration = Duration::from_millis(50);

/// Identifies a batch launched (in flight). Increasing: a batch with a higher id was
/// launched later.
pub type BatchId = u64;

/// A batch to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub id: BatchId,
    pub rows: Vec<PendingCapture>,
}

/// A parked or split part due to be sent: its rows are claimed again first (rows the
/// outbox no longer holds are dropped), then [`Planner::claimed`] launches the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    rows: Vec<PendingCapture>,
    origin: Origin,
}

impl Part {
    /// The row ids to claim.
    pub fn ids(&self) -> Vec<i64> {
        self.rows.iter().map(|r| r.id).collect()
    }
}

/// What the loop should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Send this batch now (its rows are claimed).
    Send(Batch),
    /// Claim the rows of this part in the outbox (those still pending), then call
    /// [`Planner::claimed`].
    Claim(Part),
    /// Record these outcomes again (the last try failed); then call
    /// [`Planner::recorded`] or [`Planner::record_failed`].
    Record(Vec<(PendingCapture, Outcome)>),
    /// Fetch (and claim) up to `max` captures of MACs not in [`Planner::busy`], then
    /// call [`Planner::offer`].
    Fetch { max: usize },
    /// Nothing to send before `until` (`None`: before an answer, a commit, or a
    /// while). An answer or a commit may change that sooner.
    Wait(Option<Instant>),
}

/// What the planner asks the loop to log and count, beyond the outcomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A 400 for the batch: split in halves.
    Split { items: usize, reason: String },
    /// A batch failing again: split to isolate the capture.
    Isolating { items: usize, cause: String },
    /// A 413: batches are at most `limit` from now on.
    Shrunk { sent: usize, limit: usize },
    /// New sends pause for `delay`; `cause` for `status`, `label` the same as a metric
    /// label (`http_5xx`, `http_400`, `outbox_write`...). `server` when the delay is the
    /// service's `Retry-After`.
    BackOff {
        cause: String,
        label: &'static str,
        delay: Duration,
        server: bool,
    },
    /// The concurrency window changed.
    Window { from: usize, to: usize },
    /// An answer after a failure streak.
    Recovered,
}

/// What an answer means: the outcomes to record (in one transaction) and the notes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    pub settle: Vec<(PendingCapture, Outcome)>,
    pub notes: Vec<Note>,
    /// The service answered for captures (decoded or refused them): delivery makes
    /// progress.
    pub progress: bool,
}

impl Resolution {
    /// The label of the backoff this resolution starts, if it starts one.
    pub fn backoff(&self) -> Option<&'static str> {
        self.notes.iter().find_map(|n| match n {
            Note::BackOff { label, .. } => Some(*label),
            _ => None,
        })
    }
}

/// A transient failure of a batch.
struct Failure {
    cause: String,
    label: &'static str,
    retry_after: Option<Duration>,
    /// It may be caused by what the batch holds (a 5xx, a timeout...), so the batch may
    /// be split to isolate a capture.
    blame: bool,
}

/// Where the rows of a queued or in-flight batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Fetched from the outbox.
    Fresh,
    /// A part of a batch refused (400).
    Split,
    /// A part of a batch that keeps failing.
    Isolate,
}

#[derive(Debug)]
struct InFlight {
    rows: Vec<PendingCapture>,
    origin: Origin,
    sent_at: Instant,
    /// The window was in use when this batch was sent, and the batch was full (growth
    /// only counts then: a window wider than the tapes free to fill it only sends
    /// smaller batches, each costing a request and a transaction).
    window_full: bool,
}

#[derive(Debug)]
struct Queued {
    rows: Vec<PendingCapture>,
    origin: Origin,
    not_before: Instant,
}

/// What one capture has been through in this run (by row id).
#[derive(Debug, Clone, Default)]
struct Attempts {
    /// Transient failures and refusals of batches holding it.
    failures: u32,
    /// The last batch id launched when it first failed: an answered batch with a
    /// higher id (sent after) is evidence that the service takes our requests.
    failed_after: BatchId,
    /// Transient failures on its own.
    alone: u32,
    /// 200 answers that left it out.
    left_out: u32,
}

/// The flusher's state and decisions.
#[derive(Debug)]
pub struct Planner {
    settings: FlushSettings,
    /// Largest batch (halved by 413).
    limit: usize,
    /// Batches in flight at most now (AIMD below `max_in_flight`).
    window: usize,
    /// When the window last halved: batches sent before it do not halve it again.
    last_decrease: Option<Instant>,
    /// Smoothed latency of clean answers.
    rtt: Option<Duration>,
    backoff: Backoff,
    paused_until: Option<Instant>,
    /// A failure was noted and no batch answered since.
    failing: bool,
    queue: VecDeque<Queued>,
    in_flight: HashMap<BatchId, InFlight>,
    /// Outcomes the outbox has not recorded yet (its last try failed).
    unrecorded: Option<Vec<(PendingCapture, Outcome)>>,
    /// The MACs of every row held here (in flight, queued, unrecorded).
    busy: HashSet<Mac>,
    /// Claims to hand back to the outbox with its next call.
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
            window: 1,
            last_decrease: None,
            rtt: None,
            backoff: Backoff::new(settings.backoff_initial, settings.backoff_max),
            paused_until: None,
            failing: false,
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

    /// The claims to hand back to the outbox (rows parked, left to the outbox, or found
    /// and not sent); the caller passes them with its next outbox call.
    pub fn take_unclaimed(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.unclaimed)
    }

    /// The claims waiting to be handed back (what [`Planner::take_unclaimed`] would
    /// take), for checks.
    pub fn to_unclaim(&self) -> &[i64] {
        &self.unclaimed
    }

    /// The rows whose claims the outbox must keep: in flight, or settled and not yet
    /// recorded. (For checks: the outbox's claims are exactly these, once the handed
    /// back ones are passed on.)
    pub fn claimed_rows(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .in_flight
            .values()
            .flat_map(|b| b.rows.iter().map(|r| r.id))
            .chain(self.unrecorded.iter().flatten().map(|(r, _)| r.id))
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
        self.window
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
        self.paused_until.filter(|t| *t > now)
    }

    /// What to do next.
    pub fn next(&mut self, now: Instant) -> Step {
        if let Some(until) = self.paused_until(now) {
            return Step::Wait(Some(until));
        }
        if let Some(settle) = self.unrecorded.take() {
            return Step::Record(settle);
        }
        if self.in_flight.len() >= self.window {
            return Step::Wait(None);
        }
        if let Some(i) = self.queue.iter().position(|q| q.not_before <= now) {
            if let Some(q) = self.queue.remove(i) {
                return Step::Claim(Part {
                    rows: q.rows,
                    origin: q.origin,
                });
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

    /// Earliest time a queued batch is due, if any waits.
    fn next_queued(&self) -> Option<Instant> {
        self.queue.iter().map(|q| q.not_before).min()
    }

    /// What a fetch found (and claimed): send it, or wait for it to fill (its claims are
    /// handed back). `ingest_done`: no more captures will come, so waiting cannot fill
    /// it. A pause that began while the fetch was under way holds it too.
    pub fn offer(&mut self, fetched: Fetched, ingest_done: bool, now: Instant) -> Step {
        let Fetched {
            rows,
            complete,
            backlog,
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
        Step::Send(self.launch(rows, Origin::Fresh, now))
    }

    /// The outbox claimed the rows of `part` it still holds (`present`, by id): the rest
    /// were evicted (or deleted) while the part waited here, and are never sent. Returns
    /// the batch to send, if anything is left. A pause that began meanwhile holds the
    /// part again (its claims are handed back).
    pub fn claimed(&mut self, part: Part, present: &[i64], now: Instant) -> Option<Batch> {
        let present: HashSet<i64> = present.iter().copied().collect();
        let (rows, gone): (Vec<PendingCapture>, Vec<PendingCapture>) =
            part.rows.into_iter().partition(|r| present.contains(&r.id));
        for r in &gone {
            self.busy.remove(&r.capture.mac);
            self.attempts.remove(&r.id);
        }
        if !gone.is_empty() {
            self.exhausted_until = None;
        }
        if rows.is_empty() {
            return None;
        }
        if let Some(until) = self.paused_until(now) {
            self.unclaimed.extend(rows.iter().map(|r| r.id));
            self.queue.push_front(Queued {
                rows,
                origin: part.origin,
                not_before: until,
            });
            return None;
        }
        Some(self.launch(rows, part.origin, now))
    }

    /// Claiming the rows of `part` failed (the outbox could not be read): it waits
    /// here again, and new sends pause.
    pub fn claim_failed(
        &mut self,
        part: Part,
        cause: String,
        now: Instant,
        jitter: f64,
    ) -> Resolution {
        self.queue.push_front(Queued {
            rows: part.rows,
            origin: part.origin,
            not_before: now,
        });
        self.read_failed(cause, now, jitter)
    }

    fn launch(&mut self, rows: Vec<PendingCapture>, origin: Origin, now: Instant) -> Batch {
        self.next_id += 1;
        let id = self.next_id;
        self.busy.extend(rows.iter().map(|r| r.capture.mac));
        let window_full = self.in_flight.len() + 1 >= self.window && rows.len() >= self.limit;
        self.in_flight.insert(
            id,
            InFlight {
                rows: rows.clone(),
                origin,
                sent_at: now,
                window_full,
            },
        );
        Batch { id, rows }
    }

    /// Forgets the batches in flight (shutdown abandoned them; their rows stay
    /// pending in the outbox).
    pub fn abandon_in_flight(&mut self) {
        self.exhausted_until = None;
        for (_, b) in self.in_flight.drain() {
            for r in &b.rows {
                self.busy.remove(&r.capture.mac);
                self.unclaimed.push(r.id);
            }
        }
    }

    /// The answer to batch `id`. Rows not in the returned `settle` are released
    /// (retried later) or queued here; the settled ones stay busy (and claimed) until
    /// [`Planner::recorded`] (or [`Planner::record_failed`]).
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
        let mut res = Resolution::default();
        match action {
            Action::Settle(outcomes) => self.settle(id, batch, outcomes, now, &mut res),
            Action::Refused(reason) => self.refused(batch, reason, now, jitter, &mut res),
            Action::Shrink => self.shrink(batch, now, jitter, &mut res),
            Action::Retry {
                cause,
                label,
                retry_after,
                isolate,
            } => {
                let failure = Failure {
                    cause,
                    label,
                    retry_after,
                    // An answer that says when to come back (429, 503 with Retry-After)
                    // is about the service, never about a capture.
                    blame: isolate && retry_after.is_none(),
                };
                self.failed(batch, failure, now, jitter, &mut res)
            }
        }
        res
    }

    /// Whether a batch sent after `row` first failed has been answered.
    fn evidence(&self, row: &PendingCapture) -> bool {
        self.attempts
            .get(&row.id)
            .is_some_and(|a| a.failures > 0 && self.answered_ok > a.failed_after)
    }

    /// Counts a failure (or refusal) of each of `rows`; returns the most any has had.
    fn count_failures(&mut self, rows: &[PendingCapture]) -> u32 {
        let launched = self.next_id;
        let mut most = 0;
        for r in rows {
            let a = self.attempts.entry(r.id).or_default();
            if a.failures == 0 {
                a.failed_after = launched;
            }
            a.failures += 1;
            most = most.max(a.failures);
        }
        self.bound_attempts();
        most
    }

    fn settle(
        &mut self,
        id: BatchId,
        batch: InFlight,
        outcomes: Vec<(usize, Outcome)>,
        now: Instant,
        res: &mut Resolution,
    ) {
        // A capture already left out of an answer that answered others, sent alone and
        // answered with an empty list, is left out again: the service works, it just
        // leaves that one out.
        let left_out_again = batch.rows.len() == 1
            && batch
                .rows
                .iter()
                .all(|r| self.attempts.get(&r.id).is_some_and(|a| a.left_out > 0));
        if outcomes.is_empty() && !left_out_again {
            // Nothing answered at all: a failure, so that we do not spin.
            let cause = "the service answered none of the items".to_string();
            let failure = Failure {
                cause,
                label: "empty_answer",
                retry_after: None,
                blame: true,
            };
            return self.failed(batch, failure, now, 1.0, res);
        }
        let latency = now.saturating_duration_since(batch.sent_at);
        let outcomes_answered = outcomes.len();
        let clean = outcomes_answered == batch.rows.len();
        let mut rows: Vec<Option<PendingCapture>> = batch.rows.into_iter().map(Some).collect();
        for (i, outcome) in outcomes {
            if let Some(row) = rows.get_mut(i).and_then(Option::take) {
                res.settle.push((row, outcome));
            }
        }
        let max_attempts = self.settings.max_attempts;
        for row in rows.into_iter().flatten() {
            let a = self.attempts.entry(row.id).or_default();
            a.left_out += 1;
            if a.left_out >= max_attempts {
                let reason = format!(
                    "the service left this capture out of {} answers in a row",
                    a.left_out
                );
                res.settle.push((row, Outcome::DeadLetter(reason)));
            } else {
                self.release(vec![row]);
            }
        }
        res.progress = !res.settle.is_empty();
        if outcomes_answered == 0 {
            // Not evidence that the service works; not a failure either.
            return;
        }
        self.answered_ok = self.answered_ok.max(id);
        // A pause already set stays: the server's Retry-After holds even when a batch
        // sent before it is answered after it.
        self.backoff.reset();
        if std::mem::take(&mut self.failing) {
            res.notes.push(Note::Recovered);
        }
        let usual = self.rtt.unwrap_or(latency);
        self.rtt = Some((usual * 7 + latency) / 8);
        let wider = self.window < FAST_WINDOW || usual >= SLOW_ANSWER;
        if clean && batch.window_full && latency <= usual * 2 && wider {
            let to = (self.window + 1).min(self.settings.max_in_flight.max(1));
            if to != self.window {
                res.notes.push(Note::Window {
                    from: self.window,
                    to,
                });
                self.window = to;
            }
        }
    }

    /// A 400 for the whole batch: split it; a capture refused alone is a dead letter
    /// with evidence, or parked (and new sends pause) without.
    fn refused(
        &mut self,
        batch: InFlight,
        reason: String,
        now: Instant,
        jitter: f64,
        res: &mut Resolution,
    ) {
        let rows = batch.rows;
        self.count_failures(&rows);
        if rows.len() > 1 {
            res.notes.push(Note::Split {
                items: rows.len(),
                reason,
            });
            self.unclaimed.extend(rows.iter().map(|r| r.id));
            return self.bisect(rows, Origin::Split, now);
        }
        let Some(row) = rows.first() else { return };
        if self.evidence(row) {
            res.progress = true;
            res.settle.extend(
                rows.into_iter()
                    .map(|r| (r, Outcome::DeadLetter(reason.clone()))),
            );
            return;
        }
        // Refused alone, and the service has taken no request of ours since: the
        // request may be what it refuses (the same answer whatever the batch holds).
        // Keep the capture, pause, and let the next answer bring the evidence.
        let cause = format!("the service refuses the request (400: {reason}) and has taken none since; no capture is known to be at fault: check customer_id, authorized_groups and any proxy between");
        self.pause(cause, "http_400", None, now, jitter, res);
        // Its own schedule, so that other captures go first and can bring the evidence.
        let failures = self.attempts.get(&row.id).map_or(1, |a| a.failures);
        let due = (now + self.park_delay(failures, jitter)).max(self.paused_until.unwrap_or(now));
        self.park(rows, Origin::Split, due);
    }

    fn shrink(&mut self, batch: InFlight, now: Instant, jitter: f64, res: &mut Resolution) {
        let sent = batch.rows.len();
        if sent <= 1 {
            self.release(batch.rows);
            let cause = "the service refuses even one item as too large (413)".to_string();
            return self.pause(cause, "http_413", None, now, jitter, res);
        }
        self.limit = self.limit.min(sent / 2).max(1);
        res.notes.push(Note::Shrunk {
            sent,
            limit: self.limit,
        });
        self.unclaimed.extend(batch.rows.iter().map(|r| r.id));
        // Re-cut this batch and what was queued to the new limit, keeping the order.
        let mut parts = vec![Queued {
            rows: batch.rows,
            origin: batch.origin,
            not_before: now,
        }];
        parts.extend(self.queue.drain(..));
        for q in parts {
            for chunk in q.rows.chunks(self.limit) {
                self.queue.push_back(Queued {
                    rows: chunk.to_vec(),
                    origin: q.origin,
                    not_before: q.not_before,
                });
            }
        }
    }

    fn failed(
        &mut self,
        batch: InFlight,
        failure: Failure,
        now: Instant,
        jitter: f64,
        res: &mut Resolution,
    ) {
        let Failure {
            cause,
            label,
            retry_after,
            blame,
        } = failure;
        // Evidence that this batch, not the service, is the trouble: its captures
        // failed before, and a batch sent since was answered. Only then does a capture
        // alone count an attempt towards its dead letter (an outage is nobody's fault),
        // and a larger batch get split at once.
        let suspect = blame && batch.rows.iter().any(|r| self.evidence(r));
        let counts_alone = suspect && batch.rows.len() == 1;
        // A batch that fails again is split even without that evidence (after the pause):
        // if nothing else is pending, only its own halves can bring the evidence.
        let failed_before = blame
            && batch
                .rows
                .iter()
                .any(|r| self.attempts.get(&r.id).is_some_and(|a| a.failures > 0));
        let failures = self.count_failures(&batch.rows);
        if !suspect {
            self.decrease_window(batch.sent_at, now, res);
            self.pause(cause.clone(), label, retry_after, now, jitter, res);
        }
        let rows = batch.rows;
        if failed_before && rows.len() > 1 {
            res.notes.push(Note::Isolating {
                items: rows.len(),
                cause,
            });
            self.unclaimed.extend(rows.iter().map(|r| r.id));
            return self.bisect(rows, Origin::Isolate, now);
        }
        if counts_alone {
            let Some(row) = rows.first() else { return };
            let a = self.attempts.entry(row.id).or_default();
            a.alone += 1;
            if a.alone >= self.settings.max_attempts {
                let reason = format!("gave up after {} attempts on its own: {cause}", a.alone);
                res.progress = true;
                res.settle.extend(
                    rows.into_iter()
                        .map(|r| (r, Outcome::DeadLetter(reason.clone()))),
                );
                return;
            }
        }
        let delay_floor = retry_after.unwrap_or_default().min(RETRY_AFTER_MAX);
        let delay = self.park_delay(failures, jitter).max(delay_floor);
        self.park(rows, batch.origin, now + delay);
    }

    /// The delay of a parked batch after `failures` failures: half fixed, half jitter,
    /// never a tight loop, never in step with the others.
    fn park_delay(&self, failures: u32, jitter: f64) -> Duration {
        let exp = self
            .settings
            .backoff_initial
            .saturating_mul(1u32 << failures.min(20))
            .min(self.settings.backoff_max);
        exp / 2 + exp.mul_f64(jitter.clamp(0.0, 1.0)) / 2
    }

    /// Parks `rows` until `not_before`, their MACs held and their claims handed back,
    /// so that other captures go first: either they are answered (and the parked ones
    /// then know where they stand) or the service is down for everyone. Past the bound,
    /// left to the outbox instead.
    fn park(&mut self, rows: Vec<PendingCapture>, origin: Origin, not_before: Instant) {
        if self.held_rows() + rows.len() > self.park_max() {
            return self.release(rows);
        }
        self.unclaimed.extend(rows.iter().map(|r| r.id));
        self.queue.push_back(Queued {
            rows,
            origin,
            not_before,
        });
    }

    /// Rows held in the queue.
    fn held_rows(&self) -> usize {
        self.queue.iter().map(|q| q.rows.len()).sum()
    }

    /// Rows the queue may hold when parking failed batches: memory stays bounded in an
    /// outage of any length.
    fn park_max(&self) -> usize {
        2 * self.settings.max_in_flight.max(1) * self.settings.max_batch.max(1)
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
        self.pause(cause, "outbox_write", None, now, jitter, &mut res);
        res
    }

    /// Reading the outbox failed: pause new sends (backoff).
    pub fn read_failed(&mut self, cause: String, now: Instant, jitter: f64) -> Resolution {
        let mut res = Resolution::default();
        self.pause(cause, "outbox_read", None, now, jitter, &mut res);
        res
    }

    fn pause(
        &mut self,
        cause: String,
        label: &'static str,
        retry_after: Option<Duration>,
        now: Instant,
        jitter: f64,
        res: &mut Resolution,
    ) {
        let delay = self.backoff.next_delay(jitter, retry_after);
        let server = retry_after.is_some_and(|r| r.min(RETRY_AFTER_MAX) >= delay);
        let until = now + delay;
        self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
        self.failing = true;
        res.notes.push(Note::BackOff {
            cause,
            label,
            delay,
            server,
        });
    }

    /// Halves the window, once per round: a batch sent before the last decrease is
    /// news of the same trouble.
    fn decrease_window(&mut self, sent_at: Instant, now: Instant, res: &mut Resolution) {
        if self.last_decrease.is_some_and(|d| sent_at < d) {
            return;
        }
        self.last_decrease = Some(now);
        let to = (self.window / 2).max(1);
        if to != self.window {
            res.notes.push(Note::Window {
                from: self.window,
                to,
            });
            self.window = to;
        }
    }

    /// Splits `rows` in halves, both sent before anything new, the first half first.
    fn bisect(&mut self, mut rows: Vec<PendingCapture>, origin: Origin, now: Instant) {
        let second = rows.split_off(rows.len() / 2);
        self.queue_front(second, origin, now);
        self.queue_front(rows, origin, now);
    }

    fn queue_front(&mut self, rows: Vec<PendingCapture>, origin: Origin, now: Instant) {
        self.queue.push_front(Queued {
            rows,
            origin,
            not_before: now,
        });
    }

    /// Rows go back to the outbox's care: a later fetch takes them again.
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
