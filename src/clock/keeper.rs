//! The clock keeper: the shell around [`decide`]. It reads the process's clock, keeps
//! the facts a verdict needs (this boot's sync, the database's newest time, when the
//! hold began), and tells the outbox when the verdict changes: new captures held or
//! not, and, when a hold ends, every held capture released in one transaction (its
//! wall time recomputed from boot time when the clock is synced).
//!
//! It runs inside the ingest stage (the stage that commits captures), so a release and
//! the commits it must not race are ordered by the outbox's one owner thread anyway,
//! and the flusher is woken through the same "committed" signal as for new captures.

use std::time::Duration;

use tokio::time::Instant;

use super::policy::{decide, ClockPolicy, Facts, Trust, Verdict};
use super::source::{clock, Clock, Reading};
use crate::outbox::{ClockChange, Outbox, OutboxError, Released};

/// Validated `[gateway] clock` and `clock_max_hold_secs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSettings {
    pub policy: ClockPolicy,
    pub max_hold: Duration,
}

/// While captures are held, the clock is looked at this often (a sync is noticed
/// within it).
const HOLD_CHECK: Duration = Duration::from_secs(1);
/// Otherwise this often, where a hold can still begin (a clock stepped back behind the
/// database, a time service started).
const IDLE_CHECK: Duration = Duration::from_secs(60);

/// See the module doc.
pub struct ClockKeeper {
    settings: ClockSettings,
    clock: &'static dyn Clock,
    facts: Facts,
    /// The verdict last applied to the outbox.
    verdict: Verdict,
    /// `None`: nothing can change the verdict any more (trust; synced this boot).
    next_check: Option<Instant>,
}

impl ClockKeeper {
    /// Records this boot in the outbox, learns what the database knows, and applies the
    /// first verdict: captures an earlier run held are released now unless the clock
    /// must still be held. Returns the keeper and how many captures it released.
    pub async fn start(
        settings: ClockSettings,
        outbox: &Outbox,
    ) -> Result<(ClockKeeper, u64), OutboxError> {
        let clock = clock();
        let boot_id = clock.boot_id().unwrap_or_else(|| {
            // Without a boot id, boot times are comparable only within this process.
            let id = format!("unknown-{}-{}", std::process::id(), clock.wall_ms());
            tracing::warn!(
                boot_id = %id,
                "cannot read /proc/sys/kernel/random/boot_id; captures are repaired only within this run"
            );
            id
        });
        let start = outbox.call(move |s| s.begin_boot(&boot_id)).await?;
        let facts = Facts {
            synced_this_boot: start.synced_this_boot,
            high_water_ms: start.high_water_ms,
            ..Facts::default()
        };
        let now = clock.read();
        let mut keeper = ClockKeeper {
            settings,
            clock,
            facts,
            verdict: Verdict::Synced,
            next_check: None,
        };
        let verdict = keeper.judge(&now);
        let released = keeper.apply(verdict, &now, outbox).await?;
        Ok((keeper, released))
    }

    /// The verdict in force.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Resolves when the clock is due to be looked at again; never, when nothing can
    /// change the verdict.
    pub async fn due(&self) {
        match self.next_check {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// Looks at the clock and applies a changed verdict. Returns how many held captures
    /// were released.
    pub async fn check(&mut self, outbox: &Outbox) -> Result<u64, OutboxError> {
        let now = self.clock.read();
        let verdict = self.judge(&now);
        if same_kind(verdict, self.verdict) {
            self.schedule(verdict);
            return Ok(0);
        }
        let applied = self.apply(verdict, &now, outbox).await;
        if applied.is_err() {
            // The verdict in force stays; try again soon, not at once.
            self.next_check = Some(Instant::now() + HOLD_CHECK);
        }
        applied
    }

    /// The verdict for `now`, keeping the facts current.
    fn judge(&mut self, now: &Reading) -> Verdict {
        let f = &mut self.facts;
        f.synced_this_boot |= now.kernel_synced;
        // Only an unsynchronised clock under "auto" asks whether a service could sync it.
        if self.settings.policy == ClockPolicy::Auto && !f.synced_this_boot {
            f.time_service = self.clock.time_service().is_some();
        }
        let max_hold_ms = self.settings.max_hold.as_millis() as i64;
        let mut verdict = decide(self.settings.policy, max_hold_ms, now, f);
        if verdict.holds() && f.hold_started_boot_ms.is_none() {
            f.hold_started_boot_ms = Some(now.boot_ms);
            verdict = decide(self.settings.policy, max_hold_ms, now, f);
        }
        match verdict {
            Verdict::Hold(_) | Verdict::Trusted(Trust::HoldExpired) => {}
            _ => {
                f.hold_started_boot_ms = None;
                // A clock we use counts as recorded: stepping back behind it is wrong.
                f.high_water_ms = f.high_water_ms.max(Some(now.wall_ms));
            }
        }
        verdict
    }

    async fn apply(
        &mut self,
        verdict: Verdict,
        now: &Reading,
        outbox: &Outbox,
    ) -> Result<u64, OutboxError> {
        let change = ClockChange {
            hold: verdict.holds(),
            synced: verdict == Verdict::Synced,
            state: verdict.to_string(),
            offset_ms: now.offset_ms(),
            wall_ms: now.wall_ms,
        };
        let released = outbox.call(move |s| s.apply_clock(&change)).await?;
        log_change(verdict, &released);
        self.verdict = verdict;
        self.schedule(verdict);
        Ok(released.repaired + released.estimated)
    }

    fn schedule(&mut self, verdict: Verdict) {
        let never = match verdict {
            Verdict::Trusted(Trust::Configured) => true,
            Verdict::Synced => self.settings.policy == ClockPolicy::Auto,
            _ => false,
        };
        let every = if verdict.holds() {
            HOLD_CHECK
        } else {
            IDLE_CHECK
        };
        self.next_check = (!never).then(|| Instant::now() + every);
    }
}

/// Verdicts that differ only in how far behind the clock is are the same state.
fn same_kind(a: Verdict, b: Verdict) -> bool {
    use super::policy::Hold;
    match (a, b) {
        (Verdict::Hold(Hold::Behind { .. }), Verdict::Hold(Hold::Behind { .. })) => true,
        _ => a == b,
    }
}

fn log_change(verdict: Verdict, released: &Released) {
    let (repaired, estimated) = (released.repaired, released.estimated);
    match verdict {
        Verdict::Hold(_) => {
            tracing::warn!(clock = %verdict, "clock not trusted: captures are accepted but held from delivery")
        }
        Verdict::Trusted(Trust::HoldExpired) => {
            tracing::warn!(clock = %verdict, estimated, "clock still unsynchronised after the maximum hold: releasing held captures with estimated times")
        }
        Verdict::Trusted(Trust::NoTimeService) => {
            tracing::info!(clock = %verdict, estimated, "the clock reports unsynchronised but no time service runs to sync it: trusting it")
        }
        Verdict::Synced | Verdict::Trusted(Trust::Configured) => {
            if repaired + estimated > 0 {
                tracing::info!(clock = %verdict, repaired, estimated, "clock usable: held captures released");
            } else {
                tracing::debug!(clock = %verdict, "clock usable");
            }
        }
    }
}
