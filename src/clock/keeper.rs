//! The clock keeper: the shell around [`decide`]. It reads the clock it is given, keeps
//! the facts a verdict needs (this boot's sync, the database's newest time, when the
//! hold began), and tells the outbox when the verdict changes: new captures held or
//! not, and, when a hold ends, every held capture released in one transaction (its
//! wall time recomputed from boot time when the clock is synced).
//!
//! It runs inside the ingest stage (the stage that commits captures), so a release and
//! the commits it must not race are ordered by the outbox's one owner thread anyway,
//! and the flusher is woken through the same "committed" signal as for new captures.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::policy::{decide, ClockPolicy, ClockSettings, Facts, Trust, Verdict};
use super::source::{Reading, SharedClock};
use crate::metrics::{ClockState, Metrics};
use crate::outbox::{ClockChange, ClockOutbox, OutboxError, Released};

/// While captures are held, the clock is looked at this often (a sync is noticed
/// within it).
const HOLD_CHECK: Duration = Duration::from_secs(1);
/// Otherwise this often, where a hold can still begin (a clock stepped back behind the
/// database, a time service started).
const IDLE_CHECK: Duration = Duration::from_secs(60);

/// See the module doc.
pub struct ClockKeeper {
    settings: ClockSettings,
    clock: SharedClock,
    facts: Facts,
    /// The verdict last applied to the outbox.
    verdict: Verdict,
    /// `None`: nothing can change the verdict any more (trust; synced this boot).
    next_check: Option<Instant>,
    /// Where the verdict in force is shown (`tapegate_clock_state`).
    metrics: Option<Arc<Metrics>>,
    /// Its handle on the outbox: record the boot, apply a verdict.
    outbox: ClockOutbox,
}

impl ClockKeeper {
    /// Records this boot in the outbox, learns what the database knows, and applies the
    /// first verdict: captures an earlier run held are released now unless the clock
    /// must still be held. Returns the keeper and how many captures it released.
    pub async fn start(
        clock: SharedClock,
        settings: ClockSettings,
        outbox: ClockOutbox,
    ) -> Result<(ClockKeeper, u64), OutboxError> {
        let boot_id = clock.boot_id().unwrap_or_else(|| {
            // Without a boot id, boot times are comparable only within this process.
            let id = format!("unknown-{}-{}", std::process::id(), clock.wall_ms());
            tracing::warn!(
                boot_id = %id,
                "cannot read /proc/sys/kernel/random/boot_id; captures are repaired only within this run"
            );
            id
        });
        let start = outbox.begin_boot(boot_id).await?;
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
            metrics: None,
            outbox,
        };
        let verdict = keeper.judge(&now);
        let released = keeper.apply(verdict, &now).await?;
        Ok((keeper, released))
    }

    /// The verdict in force.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Shows the verdict in force in `metrics` (`tapegate_clock_state`), now and at
    /// every change, so that an alert on it fires while captures are held.
    pub fn report_to(&mut self, metrics: Arc<Metrics>) {
        metrics.set_clock_state(metric_state(self.verdict));
        self.metrics = Some(metrics);
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
    pub async fn check(&mut self) -> Result<u64, OutboxError> {
        let now = self.clock.read();
        let verdict = self.judge(&now);
        if same_kind(verdict, self.verdict) {
            self.schedule(verdict);
            return Ok(0);
        }
        let applied = self.apply(verdict, &now).await;
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

    async fn apply(&mut self, verdict: Verdict, now: &Reading) -> Result<u64, OutboxError> {
        let change = ClockChange {
            hold: verdict.holds(),
            synced: verdict == Verdict::Synced,
            state: verdict.to_string(),
            offset_ms: now.offset_ms(),
            boot_ms: now.boot_ms,
            wall_ms: now.wall_ms,
        };
        let released = self.outbox.apply_clock(change).await?;
        log_change(verdict, &released);
        self.verdict = verdict;
        if let Some(m) = &self.metrics {
            m.set_clock_state(metric_state(verdict));
        }
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

/// The state `tapegate_clock_state` shows for a verdict.
fn metric_state(verdict: Verdict) -> ClockState {
    match verdict {
        Verdict::Synced => ClockState::Synchronised,
        Verdict::Hold(_) => ClockState::Holding,
        Verdict::Trusted(Trust::HoldExpired) => ClockState::Estimated,
        Verdict::Trusted(Trust::Configured | Trust::NoTimeService) => ClockState::Trusted,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::fake::HandClock;
    use crate::clock::policy::Hold;
    use std::collections::HashSet;

    use crate::outbox::{Handles, Outbox, Retention, Stats, StoreOptions};
    use crate::record::{Capture, Mac};

    const WRONG: i64 = 1_700_000_000_000;
    const WEEKS_3: i64 = 21 * 86_400_000;

    fn settings(policy: ClockPolicy) -> ClockSettings {
        ClockSettings {
            policy,
            max_hold: Duration::from_secs(3600),
        }
    }

    /// A capture at `boot_ms` stamped by a clock reading `wrong` at boot.
    fn live_by(wrong: i64, boot_ms: i64) -> Capture {
        Capture {
            mac: Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]),
            ts_ms: wrong + boot_ms,
            product_id: "tape".into(),
            packet: "00".into(),
            rssi: None,
            boot_ms: Some(boot_ms),
        }
    }

    fn live(boot_ms: i64) -> Capture {
        live_by(WRONG, boot_ms)
    }

    /// An outbox in a temp dir, and a hand clock (to be set) for a keeper.
    fn setup() -> (tempfile::TempDir, Outbox, Arc<HandClock>) {
        let dir = tempfile::tempdir().unwrap();
        let (outbox, _thread) =
            Outbox::open(dir.path(), StoreOptions::default(), Retention::default())
                .unwrap()
                .start()
                .unwrap();
        (dir, outbox, Arc::new(HandClock::new("boot-a")))
    }

    /// What the flusher would take next (its fetch claims nothing).
    async fn deliverable(outbox: &Outbox) -> Vec<i64> {
        let flusher = Handles::new(outbox).flusher();
        let b = flusher.fetch(250, 1000, HashSet::new(), Vec::new());
        let b = b.await.unwrap().rows;
        b.iter().map(|p| p.capture.ts_ms).collect()
    }

    /// Commits `group` as the ingest stage does.
    async fn enqueue(outbox: &Outbox, group: Vec<Capture>) {
        Handles::new(outbox).ingest().commit(group).await.0.unwrap();
    }

    async fn stats(outbox: &Outbox) -> Stats {
        Handles::new(outbox).reader().stats().await.unwrap()
    }

    #[tokio::test]
    async fn the_keeper_holds_until_sync_then_releases_each_capture_at_its_true_time() {
        for day in crate::clock::fake::FIXED_DAYS {
            // Booted three weeks behind; synced at boot time 40 s to the fixed day.
            let wrong = day.wall_ms - WEEKS_3 - 40_000;
            let (_dir, outbox, clock) = setup();
            clock.set(wrong + 10_000, 10_000, false, true);
            let (mut keeper, released) = ClockKeeper::start(
                clock.clone(),
                settings(ClockPolicy::Auto),
                crate::outbox::Handles::new(&outbox).clock(),
            )
            .await
            .unwrap();
            assert_eq!(released, 0);
            assert_eq!(keeper.verdict(), Verdict::Hold(Hold::AwaitingSync));
            assert!(keeper.next_check.is_some());

            enqueue(&outbox, vec![live_by(wrong, 20_000)]).await;
            clock.set(wrong + 30_000, 30_000, false, true);
            assert_eq!(keeper.check().await.unwrap(), 0);
            assert!(deliverable(&outbox).await.is_empty());

            // Synced: three weeks forward.
            clock.set(day.wall_ms, 40_000, true, true);
            assert_eq!(keeper.check().await.unwrap(), 1);
            assert_eq!(keeper.verdict(), Verdict::Synced);
            assert_eq!(
                deliverable(&outbox).await,
                vec![day.wall_ms - 20_000],
                "{}",
                day.rfc3339
            );
            // Synced this boot under "auto": nothing can change the verdict any more.
            assert!(keeper.next_check.is_none());
        }
    }

    #[tokio::test]
    async fn past_the_maximum_hold_the_keeper_releases_with_estimates_and_holds_no_more() {
        let (_dir, outbox, clock) = setup();
        clock.set(WRONG + 10_000, 10_000, false, true);
        let one_second = ClockSettings {
            policy: ClockPolicy::Auto,
            max_hold: Duration::from_secs(1),
        };
        let (mut keeper, _) = ClockKeeper::start(
            clock.clone(),
            one_second,
            crate::outbox::Handles::new(&outbox).clock(),
        )
        .await
        .unwrap();
        enqueue(&outbox, vec![live(10_500)]).await;
        clock.set(WRONG + 10_999, 10_999, false, true);
        assert_eq!(keeper.check().await.unwrap(), 0);
        assert!(keeper.verdict().holds());

        clock.set(WRONG + 11_000, 11_000, false, true);
        assert_eq!(keeper.check().await.unwrap(), 1);
        assert_eq!(keeper.verdict(), Verdict::Trusted(Trust::HoldExpired));
        assert_eq!(deliverable(&outbox).await, vec![WRONG + 10_500]);
        // What comes after is no longer held.
        enqueue(&outbox, vec![live(12_000)]).await;
        let stats = stats(&outbox).await;
        assert_eq!(
            (stats.pending, stats.clock.held, stats.clock.estimated),
            (2, 0, 1)
        );
    }

    #[tokio::test]
    async fn without_a_time_service_the_keeper_trusts_and_holds_nothing() {
        let (_dir, outbox, clock) = setup();
        clock.set(WRONG, 1, false, false);
        let (keeper, _) = ClockKeeper::start(
            clock.clone(),
            settings(ClockPolicy::Auto),
            crate::outbox::Handles::new(&outbox).clock(),
        )
        .await
        .unwrap();
        assert_eq!(keeper.verdict(), Verdict::Trusted(Trust::NoTimeService));
        enqueue(&outbox, vec![live(2)]).await;
        assert_eq!(deliverable(&outbox).await, vec![WRONG + 2]);
        let stats = stats(&outbox).await;
        assert_eq!(
            stats.clock.state.as_deref(),
            Some("unsynchronised, no time service: trusted")
        );
    }

    #[test]
    fn the_clock_keys_have_defaults_and_bad_values_name_key_value_and_expectation() {
        let path = std::path::Path::new("test.toml");
        let c = crate::config::from_toml("", path, []).unwrap();
        assert_eq!(c.gateway.clock, settings(ClockPolicy::Auto));
        let c = crate::config::from_toml(
            "[gateway]\nclock = \"wait\"\nclock_max_hold_secs = 60\n",
            path,
            [],
        )
        .unwrap();
        assert_eq!(c.gateway.clock.policy, ClockPolicy::Wait);
        assert_eq!(c.gateway.clock.max_hold, Duration::from_secs(60));
        let e = crate::config::from_toml(
            "[gateway]\nclock = \"ntp\"\nclock_max_hold_secs = 0\n",
            path,
            [],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("gateway.clock = \"ntp\": expected one of auto | wait | trust"),
            "{e}"
        );
        assert!(
            e.contains("gateway.clock_max_hold_secs = 0: expected a whole number from 1 to 604800"),
            "{e}"
        );
    }
}
