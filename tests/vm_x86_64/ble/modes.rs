//! Both scan modes under the unit on the side channel, traced with btmon, on the
//! controller as it is plugged (Bumble's with the Extended Advertising feature, or a
//! legacy-only one): what the host asked the controller for, what the controller
//! reported of a tape with a scan response, what the kernel sent tapegate, what was
//! delivered.

use std::time::Duration;

use super::cases::{wait_delivered, MGMT_ACTIVE, MGMT_PASSIVE, T1};
use super::radio::Radio;
use super::stack::{traced, Gateway};
use super::trace::Trace;

/// LE Set Scan Parameters and LE Set Extended Scan Parameters.
const LEGACY_PARAMS: &str = "0x08|0x000b";
const EXTENDED_PARAMS: &str = "0x08|0x0041";

/// Runs each scan mode in turn on a controller with `features` (`extended` or
/// `legacy`); T1 advertises with its name in the scan response, and moves to a new
/// counter from `counter` on in each mode.
pub fn scan_modes(g: &Gateway, radio: &Radio, features: &str, counter: u16) {
    for (n, (mode, scanner)) in [("active", MGMT_ACTIVE), ("passive", MGMT_PASSIVE)]
        .into_iter()
        .enumerate()
    {
        g.vm.ok("systemctl stop tapegate");
        let counter = counter + n as u16;
        let before = radio.air();
        let (id, text) = traced(g.vm, &format!("{features}-{mode}"), || {
            let id = g.start_unit(scanner);
            radio.cmd(&format!("tape {T1} counter={counter}"));
            wait_delivered(g, "mock", T1, counter, Duration::from_secs(30));
            // Twenty adverts more to count what each costs.
            let from = radio.air()[T1].sent;
            g.wait("twenty adverts of T1", Duration::from_secs(30), || {
                (radio.air()[T1].sent >= from + 20).then_some(())
            });
            id
        });
        let after = radio.air();
        let trace = Trace::parse(&text);
        let requests = after[T1].scan_requests - before[T1].scan_requests;
        let (adverts, responses) = trace.hci_reports(T1);
        let to_tapegate = trace.reports_to("tapegate", T1);
        let types = trace.scan_types();
        let (ours, theirs) = match features {
            "legacy" => (LEGACY_PARAMS, EXTENDED_PARAMS),
            _ => (EXTENDED_PARAMS, LEGACY_PARAMS),
        };
        assert!(
            trace.command(ours) && !trace.command(theirs),
            "{features} {mode}: the scan commands"
        );
        let expected_type = if mode == "active" {
            "Active"
        } else {
            "Passive"
        };
        assert!(
            !types.is_empty() && types.iter().all(|t| *t == expected_type),
            "{features} {mode}: scan types {types:?}"
        );
        assert!(adverts > 0 && to_tapegate > 0, "{features} {mode}: reports");
        if mode == "active" {
            assert!(
                requests > 0 && responses > 0,
                "{features} active: scan requests"
            );
        } else {
            assert_eq!(
                (requests, responses),
                (0, 0),
                "{features} passive: no scan request"
            );
            assert!(
                trace.has("Add Advertisement Patterns Monitor"),
                "the monitor"
            );
            assert!(
                trace.has("Filter duplicates: Disabled"),
                "the duplicate filter off"
            );
            assert_eq!(g.monitors().len(), 1, "one monitor");
        }
        let journal = g.journal(&id);
        assert!(
            journal.contains(&format!("SCAN={mode}")),
            "{}",
            g.unit_log()
        );
        // Debian's 6.1.192 turns the duplicate filter off (its release reads 6.1.0).
        let warned: Vec<&str> = journal
            .lines()
            .filter(|l| l.contains("duplicate filter"))
            .collect();
        assert!(warned.is_empty(), "{features} {mode}: {warned:?}");
        eprintln!(
            "vm_ble: {features} controller, {mode}: scan type {expected_type}; per advert of T1 \
             heard: {:.2} scan responses reported, {:.2} reports to tapegate ({adverts} adverts, \
             {responses} scan responses, {to_tapegate} to tapegate, {requests} scan requests on air)",
            responses as f64 / adverts as f64,
            to_tapegate as f64 / adverts as f64,
        );
    }
    g.vm.ok("systemctl stop tapegate");
}

/// The main case on a controller without the Extended Advertising feature (the
/// controller removed and plugged back as such), then back to the extended one.
pub fn legacy_controller(g: &Gateway, radio: &Radio) {
    g.vm.ok("systemctl stop tapegate");
    radio.cmd("unplug");
    radio.cmd("plug legacy");
    scan_modes(g, radio, "legacy", 20);
    radio.cmd("unplug");
    radio.cmd("plug extended");
}
