/*!
The liveness ladder of the BLE source, pure: the source passes in the time, the adverts
it hears, the state of its scan and what the BlueZ [`Watcher`] knows; the ladder
answers with the step to take, and when it must be asked again if nothing happens
([`Ladder::next_check`]), so that the source arms one deadline instead of ticking. The
source makes the D-Bus calls and writes the log; the rules (what is trouble, what judges
a step, when the next step is due, when to give up) are all here, tested with the time
passed in.

Field gateways stop hearing adverts while looking alive (btleplug #332), adapters get
powered off or vanish, bluetoothd restarts. Trouble is one of: the system bus or
`org.bluez` gone, `org.bluez` with a new owner (bluetoothd restarted), the adapter gone,
powered off or no longer discovering (when the scan is a discovery), the event stream
ended, the passive scan's advertisement monitor gone, or no advert for
`scanner.silence_secs` once any was heard. Then:
1. restart the scan (stop and start discovery on the same adapter);
2. if that has not helped after [`STEP_WAIT`]: re-acquire the adapter on a new BlueZ
   session (a new D-Bus connection), retried every [`STEP_WAIT`];
3. if the scanner is still not back after `scanner.give_up_secs`: give up (the daemon
   exits 1 and systemd restarts it).

The scanner is back when what the watcher learned after the last step (a signal, or the
read the source makes after each step) shows BlueZ, the adapter and discovery all there
again (for silence: when an advert arrives). A bluetoothd seen under a new owner while
climbing renames the trouble "bluetoothd restarted", whatever was seen first (its
leaving).

bluez-async offers no way to close a session's D-Bus connection (the task that owns it
runs on), so step 2 makes one session per episode and its retries reuse it while it
answers; after [`MAX_MANAGERS`] connections the ladder gives up, so that a fresh process
starts.

[`Watcher`]: super::bluez::Watcher
*/

use std::time::Duration;

use tokio::time::Instant;

use super::bluez::Health;

/// How long a ladder step is given before the next one.
pub const STEP_WAIT: Duration = Duration::from_secs(2);
/// BlueZ connections (bluez-async sessions) made at most before the process gives up, so
/// that systemd starts it afresh: bluez-async never closes a session's connection.
pub(super) const MAX_MANAGERS: u32 = 32;

/// Why a new owner of `org.bluez` is trouble.
const RESTARTED: &str = "bluetoothd restarted (org.bluez has a new owner)";

/// What the source knows of its own scan, beside what the watcher knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// No adapter session (re-acquiring it has failed so far).
    Missing,
    /// BlueZ's event stream ended.
    Ended,
    /// The passive scan's advertisement monitor is not registered with the kernel.
    MonitorGone,
    /// Scanning since this instant (started, or re-acquired).
    Since(Instant),
}

/// What the source does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// All is well, or the last step is still given time.
    Nothing,
    /// Step 1: trouble began; restart the scan.
    RestartScan { reason: String },
    /// Step 2: re-acquire the adapter; `first` once per trouble (it is logged and
    /// counted, and always makes a new BlueZ connection).
    Reacquire { reason: String, first: bool },
    /// The trouble is over, `after` it began.
    Back { reason: String, after: Duration },
    /// Step 3: the scanner could not be brought back for `scanner.give_up_secs`.
    GiveUp(GaveUp),
}

/// Why the ladder gave up, and after how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GaveUp {
    pub reason: String,
    pub secs: u64,
}

/// The trouble being climbed out of.
#[derive(Debug)]
struct Trouble {
    reason: String,
    /// Silence ends with an advert; other trouble when the watcher sees the scan.
    silence: bool,
    since: Instant,
    /// Whether step 2 has been taken.
    reacquiring: bool,
    /// When the last step was taken: only what is learned later judges it.
    acted: Instant,
    /// When the next step is due.
    next: Instant,
    failures_logged: bool,
}

/// The ladder's state: what was heard, who owns BlueZ, the trouble in progress.
#[derive(Debug)]
pub(super) struct Ladder {
    /// `None`: silence is never trouble.
    silence: Option<Duration>,
    give_up: Duration,
    /// `org.bluez`'s owner when the scan (re)started.
    owner: Option<String>,
    heard_any: bool,
    last_heard: Instant,
    trouble: Option<Trouble>,
    /// BlueZ connections made so far.
    connections: u32,
    /// Whether the scan is a discovery (BlueZ's `Discovering` must hold), not a
    /// passive scan.
    discovery: bool,
}

impl Ladder {
    /// The ladder of a scan started at `now` on the first BlueZ connection, while
    /// `owner` owns `org.bluez`; a `discovery` or a passive scan.
    pub fn new(
        silence: Option<Duration>,
        give_up: Duration,
        owner: String,
        now: Instant,
        discovery: bool,
    ) -> Ladder {
        Ladder {
            silence,
            give_up,
            owner: Some(owner),
            heard_any: false,
            last_heard: now,
            trouble: None,
            connections: 1,
            discovery,
        }
    }

    /// The scan is a discovery from now on (or a passive scan).
    pub fn set_discovery(&mut self, discovery: bool) {
        self.discovery = discovery;
    }

    /// An advert was heard at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.heard_any = true;
        self.last_heard = now;
    }

    /// When the ladder must be asked again if nothing else happens (no advert, nothing
    /// learned of BlueZ, the scan unchanged): the end of the silence allowed, the next
    /// step, giving up. `None`: only an event can change its answer, and the source arms
    /// no timer.
    pub fn next_check(&self) -> Option<Instant> {
        match &self.trouble {
            Some(t) => Some(t.next.min(t.since + self.give_up)),
            None => {
                let silence = self.silence?;
                self.heard_any.then(|| self.last_heard + silence)
            }
        }
    }

    /// Whether trouble is being climbed out of (an advert may end it).
    pub fn troubled(&self) -> bool {
        self.trouble.is_some()
    }

    /// The step to take at `now`, given what the watcher knows, the scan, and the
    /// adapter scanned (named in the reasons).
    pub fn poll(&mut self, now: Instant, health: &Health, scan: Scan, adapter: &str) -> Step {
        let Some(t) = &mut self.trouble else {
            let found = self
                .scan_trouble(health, scan, adapter)
                .map(|r| (r, false))
                .or_else(|| self.silence_trouble(now).map(|r| (r, true)));
            return match found {
                Some((reason, silence)) => self.begin(now, reason, silence),
                None => Step::Nothing,
            };
        };
        if self
            .owner
            .as_ref()
            .is_some_and(|o| health.owner.as_ref().is_some_and(|now| now != o))
        {
            RESTARTED.clone_into(&mut t.reason);
        }
        let back = if t.silence {
            self.last_heard > t.since
        } else {
            health.at > t.acted && health.scanning(self.discovery) && matches!(scan, Scan::Since(_))
        };
        if back {
            let step = Step::Back {
                reason: std::mem::take(&mut t.reason),
                after: now.duration_since(t.since),
            };
            self.owner.clone_from(&health.owner);
            self.last_heard = now;
            self.trouble = None;
            return step;
        }
        if now.duration_since(t.since) >= self.give_up {
            return Step::GiveUp(GaveUp {
                reason: t.reason.clone(),
                secs: self.give_up.as_secs(),
            });
        }
        if now < t.next {
            return Step::Nothing;
        }
        let first = !t.reacquiring;
        t.reacquiring = true;
        t.acted = now;
        t.next = now + STEP_WAIT;
        Step::Reacquire {
            reason: t.reason.clone(),
            first,
        }
    }

    /// Step 1's restart finished at `at`: what was learned while it ran does not judge it.
    pub fn restarted(&mut self, at: Instant) {
        if let Some(t) = &mut self.trouble {
            t.acted = at;
        }
    }

    /// Step 2 is about to make a new BlueZ connection at `now`; past [`MAX_MANAGERS`] it
    /// gives up instead.
    pub fn connecting(&mut self, now: Instant) -> Result<(), GaveUp> {
        if self.connections >= MAX_MANAGERS {
            let (reason, since) = self
                .trouble
                .as_ref()
                .map_or(("", now), |t| (t.reason.as_str(), t.since));
            return Err(GaveUp {
                reason: format!(
                    "{reason} (and {MAX_MANAGERS} BlueZ connections made, which bluez-async never closes)"
                ),
                secs: now.duration_since(since).as_secs(),
            });
        }
        self.connections += 1;
        Ok(())
    }

    /// Re-acquiring the adapter failed; `true` the first time in this trouble (worth a
    /// warning; the retries are not).
    pub fn reacquire_failed(&mut self) -> bool {
        match &mut self.trouble {
            Some(t) => !std::mem::replace(&mut t.failures_logged, true),
            None => false,
        }
    }

    /// Step 1.
    fn begin(&mut self, now: Instant, reason: String, silence: bool) -> Step {
        self.trouble = Some(Trouble {
            reason: reason.clone(),
            silence,
            since: now,
            reacquiring: false,
            acted: now,
            next: now + STEP_WAIT,
            failures_logged: false,
        });
        Step::RestartScan { reason }
    }

    fn silence_trouble(&self, now: Instant) -> Option<String> {
        let silence = self.silence?;
        let quiet = now.duration_since(self.last_heard);
        (self.heard_any && quiet >= silence).then(|| format!("no advert for {} s", quiet.as_secs()))
    }

    /// What is wrong with the scan, judged by what was learned after it (re)started.
    fn scan_trouble(&mut self, h: &Health, scan: Scan, adapter: &str) -> Option<String> {
        let started = match scan {
            Scan::Missing => return Some("there is no scan".into()),
            Scan::Ended => return Some("BlueZ's event stream ended".into()),
            Scan::MonitorGone => {
                return Some("the kernel's advertisement monitor (passive scan) is gone".into())
            }
            Scan::Since(started) => started,
        };
        if h.at <= started {
            return None;
        }
        if self.owner.is_none() {
            self.owner.clone_from(&h.owner);
        }
        judge(h, adapter, self.owner.as_deref(), self.discovery)
    }
}

/// What is wrong with a scan on `adapter` according to `h`, with `owner` the unique
/// name that owned `org.bluez` when the scan started; `discovery`: BlueZ must be
/// discovering.
fn judge(h: &Health, adapter: &str, owner: Option<&str>, discovery: bool) -> Option<String> {
    if !h.bus {
        return Some("the D-Bus system bus does not answer".into());
    }
    let Some(now_owner) = &h.owner else {
        return Some("BlueZ (org.bluez) left the system bus".into());
    };
    if owner.is_some_and(|o| o != now_owner) {
        return Some(RESTARTED.into());
    }
    match (h.powered, h.discovering) {
        (None, _) => Some(format!("adapter {adapter} disappeared")),
        (Some(false), _) => Some(format!("adapter {adapter} was powered off")),
        (_, Some(false)) if discovery => Some(format!("discovery stopped on adapter {adapter}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Duration = Duration::from_secs(60);
    const GIVE_UP: Duration = Duration::from_secs(300);
    const POLL: Duration = Duration::from_millis(500);

    fn healthy(at: Instant) -> Health {
        Health {
            at,
            bus: true,
            owner: Some(":1.7".into()),
            powered: Some(true),
            discovering: Some(true),
        }
    }

    fn powered_off(at: Instant) -> Health {
        Health {
            powered: Some(false),
            discovering: Some(false),
            ..healthy(at)
        }
    }

    /// The step for a poll at `at` that sees the scan healthy, started at `started`.
    fn poll_healthy(l: &mut Ladder, at: Instant, started: Instant) -> Step {
        l.poll(at, &healthy(at), Scan::Since(started), "hci0")
    }

    /// The step for a poll at `at` that sees hci0 powered off.
    fn poll_off(l: &mut Ladder, at: Instant, scan: Scan) -> Step {
        l.poll(at, &powered_off(at), scan, "hci0")
    }

    /// A ladder whose scan started at `t0`, and `t0`.
    fn ladder() -> (Ladder, Instant) {
        let t0 = Instant::now();
        (
            Ladder::new(Some(SILENCE), GIVE_UP, ":1.7".into(), t0, true),
            t0,
        )
    }

    fn restart(reason: &str) -> Step {
        Step::RestartScan {
            reason: reason.into(),
        }
    }

    fn reacquire(first: bool) -> Step {
        Step::Reacquire {
            reason: "adapter hci0 was powered off".into(),
            first,
        }
    }

    /// A ladder in trouble (hci0 powered off) since the instant returned, its restart
    /// done at that instant.
    fn in_trouble() -> (Ladder, Instant) {
        let (mut l, t0) = ladder();
        let step = poll_off(&mut l, t0 + POLL, Scan::Since(t0));
        assert_eq!(step, restart("adapter hci0 was powered off"));
        l.restarted(t0 + POLL);
        (l, t0 + POLL)
    }

    #[test]
    fn a_healthy_scan_is_left_alone() {
        let (mut l, t0) = ladder();
        assert!(healthy(t0).scanning(true));
        assert_eq!(judge(&healthy(t0), "hci0", Some(":1.7"), true), None);
        for i in 1..100 {
            let now = t0 + POLL * i;
            assert_eq!(poll_healthy(&mut l, now, t0), Step::Nothing);
        }
    }

    #[test]
    fn each_trouble_is_named_with_its_reason() {
        type Change = fn(&mut Health);
        let cases: [(Change, &str); 6] = [
            (|h| h.bus = false, "the D-Bus system bus does not answer"),
            (|h| h.owner = None, "BlueZ (org.bluez) left the system bus"),
            (
                |h| h.owner = Some(":1.9".into()),
                "bluetoothd restarted (org.bluez has a new owner)",
            ),
            (|h| h.powered = None, "adapter hci0 disappeared"),
            (|h| h.powered = Some(false), "adapter hci0 was powered off"),
            (
                |h| h.discovering = Some(false),
                "discovery stopped on adapter hci0",
            ),
        ];
        for (change, reason) in cases {
            let (mut l, t0) = ladder();
            let mut h = healthy(t0 + POLL);
            change(&mut h);
            assert!(
                !h.scanning(true) || reason.contains("restarted"),
                "{reason}"
            );
            assert_eq!(
                judge(&h, "hci0", Some(":1.7"), true).as_deref(),
                Some(reason)
            );
            assert_eq!(
                l.poll(t0 + POLL, &h, Scan::Since(t0), "hci0"),
                restart(reason)
            );
        }
    }

    #[test]
    fn powered_off_is_named_before_the_discovery_it_stops() {
        let t0 = Instant::now();
        assert_eq!(
            judge(&powered_off(t0), "hci1", Some(":1.7"), true).as_deref(),
            Some("adapter hci1 was powered off")
        );
    }

    #[test]
    fn a_missing_scan_or_an_ended_event_stream_is_trouble_whatever_the_poll() {
        let (mut l, t0) = ladder();
        assert_eq!(
            l.poll(t0, &healthy(t0), Scan::Missing, "hci0"),
            restart("there is no scan")
        );
        let (mut l, t0) = ladder();
        assert_eq!(
            l.poll(t0, &healthy(t0), Scan::Ended, "hci0"),
            restart("BlueZ's event stream ended")
        );
    }

    #[test]
    fn a_poll_taken_before_the_scan_started_judges_nothing() {
        let (mut l, t0) = ladder();
        let started = t0 + POLL;
        assert_eq!(
            l.poll(started, &powered_off(t0), Scan::Since(started), "hci0"),
            Step::Nothing
        );
        assert_eq!(
            poll_off(&mut l, started, Scan::Since(started)),
            Step::Nothing,
            "a poll at the very instant of the start is before it"
        );
    }

    #[test]
    fn silence_is_trouble_only_once_an_advert_was_heard() {
        let (mut l, t0) = ladder();
        let late = t0 + SILENCE * 2;
        assert_eq!(poll_healthy(&mut l, late, t0), Step::Nothing);
        l.heard(late);
        let almost = late + SILENCE - POLL;
        assert_eq!(poll_healthy(&mut l, almost, t0), Step::Nothing);
        let quiet = late + SILENCE + POLL;
        assert_eq!(
            poll_healthy(&mut l, quiet, t0),
            restart("no advert for 60 s")
        );
    }

    #[test]
    fn without_a_silence_setting_silence_is_never_trouble() {
        let t0 = Instant::now();
        let mut l = Ladder::new(None, GIVE_UP, ":1.7".into(), t0, true);
        l.heard(t0);
        let late = t0 + Duration::from_secs(3600);
        assert_eq!(poll_healthy(&mut l, late, t0), Step::Nothing);
    }

    #[test]
    fn an_advert_ends_silence_and_restarts_its_clock() {
        let (mut l, t0) = ladder();
        l.heard(t0);
        let quiet = t0 + SILENCE;
        assert_eq!(
            poll_healthy(&mut l, quiet, t0),
            restart("no advert for 60 s")
        );
        l.restarted(quiet);
        // A healthy poll does not end silence: only an advert does.
        let later = quiet + POLL;
        assert_eq!(poll_healthy(&mut l, later, t0), Step::Nothing);
        l.heard(later);
        let back = later + POLL;
        assert_eq!(
            poll_healthy(&mut l, back, t0),
            Step::Back {
                reason: "no advert for 60 s".into(),
                after: POLL * 2
            }
        );
        // The silence is counted from when the scanner was back.
        let next = back + SILENCE - POLL;
        assert_eq!(poll_healthy(&mut l, next, t0), Step::Nothing);
    }

    #[test]
    fn a_restart_is_judged_only_by_polls_taken_after_it_finished() {
        let (mut l, t0) = in_trouble();
        let restarted = t0 + Duration::from_millis(100);
        l.restarted(restarted);
        let now = restarted + Duration::from_millis(250);
        assert_eq!(
            l.poll(now, &healthy(restarted), Scan::Since(t0), "hci0"),
            Step::Nothing,
            "a poll from the instant the restart finished"
        );
        assert_eq!(
            poll_off(&mut l, now, Scan::Since(t0)),
            Step::Nothing,
            "a later poll that still sees trouble"
        );
        let step = poll_healthy(&mut l, now, t0);
        assert_eq!(
            step,
            Step::Back {
                reason: "adapter hci0 was powered off".into(),
                after: Duration::from_millis(350)
            }
        );
        // Back: healthy polls are left alone again.
        let later = now + POLL;
        assert_eq!(poll_healthy(&mut l, later, t0), Step::Nothing);
    }

    #[test]
    fn a_restart_that_did_not_help_is_followed_by_reacquiring_every_step_wait() {
        let (mut l, t0) = in_trouble();
        let mut steps = Vec::new();
        let mut now = t0;
        while now < t0 + STEP_WAIT * 3 {
            now += Duration::from_millis(250);
            match poll_off(&mut l, now, Scan::Since(t0)) {
                Step::Nothing => {}
                step => steps.push((now.duration_since(t0), step)),
            }
        }
        assert_eq!(
            steps,
            vec![
                (STEP_WAIT, reacquire(true)),
                (STEP_WAIT * 2, reacquire(false)),
                (STEP_WAIT * 3, reacquire(false)),
            ]
        );
    }

    #[test]
    fn a_reacquisition_is_judged_by_polls_taken_after_it_began() {
        let (mut l, t0) = in_trouble();
        let step_2 = t0 + STEP_WAIT;
        assert_eq!(poll_off(&mut l, step_2, Scan::Missing), reacquire(true));
        let now = step_2 + POLL;
        assert_eq!(
            l.poll(now, &healthy(step_2), Scan::Since(now), "hci0"),
            Step::Nothing
        );
        assert!(matches!(poll_healthy(&mut l, now, now), Step::Back { .. }));
    }

    #[test]
    fn trouble_seen_again_while_climbing_does_not_start_the_ladder_again() {
        let (mut l, t0) = in_trouble();
        assert_eq!(
            poll_off(&mut l, t0 + POLL, Scan::Since(t0)),
            Step::Nothing,
            "the same trouble, seen again before the next step is due"
        );
    }

    #[test]
    fn a_scanner_not_back_after_give_up_gives_up() {
        let (mut l, t0) = in_trouble();
        let almost = t0 + GIVE_UP - POLL;
        assert_ne!(
            poll_off(&mut l, almost, Scan::Missing),
            Step::GiveUp(GaveUp {
                reason: "adapter hci0 was powered off".into(),
                secs: 300
            })
        );
        let late = t0 + GIVE_UP;
        assert_eq!(
            poll_off(&mut l, late, Scan::Missing),
            Step::GiveUp(GaveUp {
                reason: "adapter hci0 was powered off".into(),
                secs: 300
            })
        );
    }

    #[test]
    fn the_last_bluez_connection_allowed_is_the_32nd() {
        let (mut l, t0) = in_trouble();
        // The first connection was made when the scan started.
        for _ in 1..MAX_MANAGERS {
            assert_eq!(l.connecting(t0), Ok(()));
        }
        assert_eq!(
            l.connecting(t0 + Duration::from_secs(70)),
            Err(GaveUp {
                reason: "adapter hci0 was powered off (and 32 BlueZ connections made, which bluez-async never closes)".into(),
                secs: 70
            })
        );
    }

    #[test]
    fn a_failed_reacquisition_is_worth_one_warning_per_trouble() {
        let (mut l, t0) = in_trouble();
        assert!(l.reacquire_failed());
        assert!(!l.reacquire_failed());
        let now = t0 + POLL;
        assert!(matches!(
            l.poll(now, &healthy(now), Scan::Since(now - POLL / 2), "hci0"),
            Step::Back { .. }
        ));
        let again = now + POLL;
        assert_eq!(
            poll_off(&mut l, again, Scan::Since(now)),
            restart("adapter hci0 was powered off")
        );
        assert!(l.reacquire_failed());
    }

    #[test]
    fn a_new_bluez_owner_is_trouble_until_the_scanner_is_back_under_it() {
        let (mut l, t0) = ladder();
        let new_owner = |at| Health {
            owner: Some(":1.9".into()),
            ..healthy(at)
        };
        let now = t0 + POLL;
        assert_eq!(
            l.poll(now, &new_owner(now), Scan::Since(t0), "hci0"),
            restart("bluetoothd restarted (org.bluez has a new owner)")
        );
        l.restarted(now);
        let later = now + POLL;
        assert!(matches!(
            l.poll(later, &new_owner(later), Scan::Since(t0), "hci0"),
            Step::Back { .. }
        ));
        let after = later + POLL;
        assert_eq!(
            l.poll(after, &new_owner(after), Scan::Since(t0), "hci0"),
            Step::Nothing,
            "the new owner is the owner now"
        );
    }

    #[test]
    fn all_well_and_nothing_heard_asks_for_no_deadline() {
        let (mut l, t0) = ladder();
        assert_eq!(l.next_check(), None);
        assert_eq!(poll_healthy(&mut l, t0 + POLL, t0), Step::Nothing);
        assert_eq!(l.next_check(), None, "a healthy look at BlueZ arms nothing");
        let t0 = Instant::now();
        let mut quiet = Ladder::new(None, GIVE_UP, ":1.7".into(), t0, true);
        quiet.heard(t0);
        assert_eq!(quiet.next_check(), None, "no silence setting, no deadline");
    }

    #[test]
    fn the_deadline_is_the_end_of_the_silence_then_each_step_then_giving_up() {
        let (mut l, t0) = ladder();
        l.heard(t0);
        assert_eq!(l.next_check(), Some(t0 + SILENCE));
        // Adverts move the end of the silence on.
        let later = t0 + Duration::from_secs(10);
        l.heard(later);
        assert_eq!(l.next_check(), Some(later + SILENCE));
        // Asked at that deadline, the ladder takes step 1 and names the next one.
        let quiet = later + SILENCE;
        assert_eq!(
            poll_healthy(&mut l, quiet, t0),
            restart("no advert for 60 s")
        );
        assert!(l.troubled());
        assert_eq!(l.next_check(), Some(quiet + STEP_WAIT));
        assert!(matches!(
            poll_healthy(&mut l, quiet + STEP_WAIT, t0),
            Step::Reacquire { first: true, .. }
        ));
        assert_eq!(l.next_check(), Some(quiet + STEP_WAIT * 2));
    }

    #[test]
    fn the_last_deadline_of_a_trouble_is_giving_up() {
        let t0 = Instant::now();
        let give_up = STEP_WAIT + Duration::from_millis(500);
        let mut l = Ladder::new(Some(SILENCE), give_up, ":1.7".into(), t0, true);
        let now = t0 + POLL;
        assert_eq!(
            poll_off(&mut l, now, Scan::Since(t0)),
            restart("adapter hci0 was powered off")
        );
        assert_eq!(l.next_check(), Some(now + STEP_WAIT));
        assert!(matches!(
            poll_off(&mut l, now + STEP_WAIT, Scan::Missing),
            Step::Reacquire { .. }
        ));
        assert_eq!(l.next_check(), Some(now + give_up), "before the next step");
        assert!(matches!(
            poll_off(&mut l, now + give_up, Scan::Missing),
            Step::GiveUp(_)
        ));
    }

    #[test]
    fn bluez_seen_leaving_then_under_a_new_owner_is_a_bluetoothd_restart() {
        let (mut l, t0) = ladder();
        let gone = |at| Health {
            owner: None,
            powered: None,
            discovering: None,
            ..healthy(at)
        };
        let now = t0 + POLL;
        assert_eq!(
            l.poll(now, &gone(now), Scan::Since(t0), "hci0"),
            restart("BlueZ (org.bluez) left the system bus")
        );
        let new_owner = Health {
            owner: Some(":1.9".into()),
            discovering: Some(false),
            ..healthy(now + POLL)
        };
        assert_eq!(
            l.poll(now + POLL, &new_owner, Scan::Since(t0), "hci0"),
            Step::Nothing
        );
        assert_eq!(
            l.poll(now + STEP_WAIT, &new_owner, Scan::Since(t0), "hci0"),
            Step::Reacquire {
                reason: RESTARTED.into(),
                first: true
            }
        );
        let back = now + STEP_WAIT + POLL;
        let scanning = Health {
            owner: Some(":1.9".into()),
            ..healthy(back)
        };
        assert_eq!(
            l.poll(back, &scanning, Scan::Since(back - POLL / 2), "hci0"),
            Step::Back {
                reason: RESTARTED.into(),
                after: STEP_WAIT + POLL
            }
        );
    }

    #[test]
    fn a_passive_scan_is_judged_without_discovering_and_a_missing_monitor_is_trouble() {
        let t0 = Instant::now();
        let mut l = Ladder::new(Some(SILENCE), GIVE_UP, ":1.7".into(), t0, false);
        // Powered, not discovering: a passive scan is well.
        let passive = |at| Health {
            discovering: Some(false),
            ..healthy(at)
        };
        let now = t0 + POLL;
        assert_eq!(
            l.poll(now, &passive(now), Scan::Since(t0), "hci0"),
            Step::Nothing
        );
        // The monitor gone: trouble, and not back while it is missing.
        let later = now + POLL;
        assert_eq!(
            l.poll(later, &passive(later), Scan::MonitorGone, "hci0"),
            restart("the kernel's advertisement monitor (passive scan) is gone")
        );
        l.restarted(later);
        let after = later + POLL;
        assert_eq!(
            l.poll(after, &passive(after), Scan::MonitorGone, "hci0"),
            Step::Nothing
        );
        // Added again: back.
        assert!(matches!(
            l.poll(after, &passive(after), Scan::Since(after), "hci0"),
            Step::Back { .. }
        ));
        // Powered off is trouble in a passive scan too.
        let off = after + POLL;
        assert_eq!(
            l.poll(off, &powered_off(off), Scan::Since(after), "hci0"),
            restart("adapter hci0 was powered off")
        );
    }
}
