/*!
The liveness ladder of the BLE source, pure: the source passes in the time, the adverts
it hears, the state of its scan and what the BlueZ [`Watcher`] knows; the ladder
answers with the step to take, and when it must be asked again if nothing happens
([`Ladder::next_check`]), so that the source arms one deadline instead of ticking. The
source makes the D-Bus calls and writes the log; the rules (what is trouble, what judges
a step, when the next step is due, when to give up) are all here, tested with the time
passed in. It touches nothing but what it is given.

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
mod tests;
