/*!
The outbox: a durable, bounded SQLite store between capture and delivery.

# Why it exists
A dock gateway must not lose what it heard when the uplink drops, the service fails, the
token expires or the power is cut. Every admitted capture is written here first; the
flusher delivers from here, and a row leaves only in the transaction that records its
outcome (delivered, counted, or a dead letter). Delivery is therefore at-least-once.

# Tables
The outbox's rows are `pending`, `dead_letters`, `tapes` (each tape's latest reading),
`counters`, `meta` and `boots` in the state database; the schema, each table's columns
and the migrations are the database layer's (`crate::db`).

A live capture's `pending` row also has `boot` (its `boots.id`), `boot_ms` (`CLOCK_BOOTTIME`
at capture) and `held` (1: the clock was not trusted when it was committed; not handed
to the flusher until the clock keeper releases it, re-timed from `boot_ms` when the
clock has synced; see `clock.rs`). Replayed captures carry recorded times: `boot` NULL,
never held. `counters` also has `clock_repaired` and `clock_estimated`.

A row's life: admitted → `pending` (held while the clock is not trusted) → delivered (row deleted, reading stored) | dead
letter (row moved to `dead_letters`) | evicted (deleted when a bound is exceeded:
`max_pending`, `max_age_secs`, `max_bytes`; oldest first, never while the flusher has it
claimed, on the wire; see `retention.rs`). `tapegate dead-letters retry` moves dead
letters back to `pending`.

**Claims** (in memory, on the owner thread; no write): the rows of a request on the
wire, or answered and not yet recorded. A fetch claims nothing
(`Store::fetch_next_batch`, `fetch.rs`): a batch found may wait (to fill, out a backoff
or the service's `Retry-After`, for a token), and a batch that waits holds no claim. Its
request claims its rows as it goes on the wire (`Store::claim`, which returns only the
rows still pending, and looks nothing up when nothing but the flusher's answers has left
`pending` since they were read: [`Seen`]); `Store::settle` lets go of what it records,
and the request lets go at once of an answer that settles nothing (`Store::unclaim`).
So a row the outbox evicted is never sent, a row on the wire is never counted evicted, and whatever waits is evicted in age order like any other row: one
fate per capture, by construction, at one call a batch and no write.

# Guarantees
- **Accepted means committed.** Captures are committed in groups, every
  `outbox.commit_interval_ms` or every [`GROUP_MAX`] captures, whichever comes first. A
  capture is *accepted* once its group commits. The loss window of a crash (kill -9,
  panic, power cut with `durability = "full"`) is exactly the group not yet committed:
  at most `commit_interval_ms` of captures and never more than [`GROUP_MAX`].
  With `durability = "normal"` a power cut (not a process crash) can also lose the
  groups committed since the last WAL checkpoint; the database stays consistent.
- **Counters are exact.** Counters change in the same transaction as the rows they
  count, so at every commit `admitted = delivered + dead_lettered + evicted + pending`
  holds, where `pending` is the number of rows in `pending`. Purging stored dead letters
  does not change `dead_lettered` (they were still refused).
- **Bounded.** At most `outbox.max_pending` rows pending, none older than
  `outbox.max_age_secs` at the front of the queue (held rows excepted), the database's
  used pages at most `outbox.max_bytes`; past any of them the oldest rows not claimed
  are evicted (the newest state of a tape matters most) and counted with their bound,
  whatever the flusher holds back (a batch waiting out a backoff loses what is evicted
  from it); for `max_pending`, when every older row is claimed, the newest go (the bound
  holds whatever is on the wire); the age and size bounds wait for claimed rows' answers.
  Re-queued dead letters can push past the bound until the next commit evicts. Stored
  dead letters are capped at [`MAX_DEAD_LETTERS`] (oldest dropped and counted); the
  tapes' latest readings waiting in memory at [`LATEST_MAX`] tapes.
- **One fate per capture.** Every admitted capture is pending, delivered, a dead letter
  or evicted; a claimed row is never evicted, and only a row still pending can be
  claimed. A settle for a row already gone (its database replaced under the daemon)
  changes no counter.
- **One owner.** One thread owns the connection ([`Outbox`] is its handle); each
  command (`status`, `dead-letters`, `device`, the rate window) opens its own
  short-lived connection, which WAL allows while the daemon runs.
- **A write that fails** (disk full, I/O error) rolls its transaction back; nothing
  already committed is lost and the caller keeps the group and retries later.
- **One daemon per state directory.** `tapegate run` holds an exclusive `flock` on
  `tapegate.lock` beside the database (`lock.rs`); a second one is refused at start.
- **A database deleted or replaced under the daemon** (its path no longer names the
  file we write to) is noticed before the next job, logged at ERROR, and a fresh one is
  started there: what was not yet committed goes into it. What the old file held is
  gone with it; new rows take ids above the old file's, so a batch in flight from it
  settles nothing of theirs.
- **A corrupt database** (fails to open or fails `quick_check`) is moved aside with an
  ERROR log naming both paths, and a fresh one is started, so the daemon never
  crash-loops on it.

# Not guaranteed
- Exactly-once delivery: a batch whose answer is lost (timeout, crash after sending) is
  sent again, so the service may see a capture twice.
- Order across MACs: batches take the oldest pending capture of each MAC not in a
  batch in flight (`next_batch_excluding`, `fetch.rs`); captures of one MAC are delivered
  in admission order, which is capture order, however many batches are in flight.

# Code
`Store` is one type in several rooms, by seam, and never leaves this module: every user
holds a handle named for its role, and each file's doc says what it holds. The rooms
stand on the database layer (`crate::db`: opening the file, the connection, the schema,
the counters, how a MAC and a packet are kept, [`OutboxError`]) and the side tables
(`crate::side_tables`, whose `heard` rows settle writes), and in floors over them, every
arrow running down: the outbox's words (a pending capture and its [`Outcome`], a tape's
latest reading); what the store holds in memory (the clock's hold, the latest readings
written behind, where the flusher's fetches resume); the store (again when the file is
replaced under the daemon); over it the daemon's path (admitting groups, the next batch
and its claims, recording answers, the bounds, the clock's boots and verdicts) and what
the commands and the fleet's tools read and change (the status and the dead letters, the
device commands' state); at the top the owner thread and the small handles over it
([`Handles`], one per stage, and one per command over its own connection) and the state
directory's one owner (its lock). The [`Seeder`] seeds a state directory for the tests
and the benchmarks when no daemon runs.
*/

mod clock;
mod commands;
mod cursor;
mod enqueue;
mod fetch;
mod fleet;
mod handle;
mod hold;
mod latest;
mod lock;
mod reopen;
mod retention;
mod scan;
mod seeder;
mod settle;
mod status;
mod store;
#[cfg(test)]
mod tests;
mod users;
mod words;

pub use crate::db::{OutboxError, DB_FILE};
pub use clock::{BootStart, ClockChange, ClockStatus, Released};
pub use commands::StateReader;
pub(crate) use commands::{DeadLetterDesk, DeviceState};
pub use enqueue::GROUP_MAX;
pub use fetch::Fetched;
pub use fleet::{BootRecord, DeadLetterSummary};
pub use handle::Outbox;
pub use latest::{LATEST_EVERY, LATEST_EVERY_ENV, LATEST_MAX};
pub use lock::{LockError, StateLock, LOCK_FILE};
pub use retention::{keep_bounds, Evictions};
pub use seeder::Seeder;
pub use settle::{AnswerNotes, MAX_DEAD_LETTERS};
pub use status::{DeadLetter, FlusherState, ScannerCounts, Stats, TapeKnown};
/// For the outbox's own tests; outside the outbox the store is reached through handles.
#[cfg(test)]
use store::Store;
pub use store::{OpenReport, StoreOptions};
pub use words::{Outcome, PendingCapture, Reading, RowKey, Seen, TapeRow};
// The settings' types are config's words (`[outbox]`), shown here for the store's users.
pub use crate::config::{Durability, Retention};
pub use users::{
    overlay_flusher, ClockOutbox, FlusherOutbox, Handles, IngestWriter, Reader, ScannerNotes,
    StageOutbox,
};
