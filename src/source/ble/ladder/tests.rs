//! Tests of the liveness ladder, pure: time, health and the scan passed in.

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
