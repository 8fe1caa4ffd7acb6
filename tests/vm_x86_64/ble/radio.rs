//! The air in the VM (`tests/vm/guest/radio.py`, Bumble's controller on `/dev/vhci`
//! and the advertisers it hears), driven from the host: a command goes into the radio's
//! FIFO through the agent, its answer comes back through the share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::vm::Vm;

/// Per advertiser, what the radio did (its `stats` command).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Air {
    /// Adverts sent on air.
    pub sent: u64,
    /// Reports the controller gave the host (an advert and, in an active scan, its
    /// scan response).
    pub reported: u64,
    pub scan_requests: u64,
    /// The counter in the last advert (a payload set by `data` has none).
    pub last_counter: Option<u64>,
    /// The counter in the last advert the controller reported to the host (the host's
    /// scan may be off at a moment an advert is on air: the kernel restarts it).
    #[serde(default)]
    pub last_reported_counter: Option<u64>,
    /// Reports in a row that carried `last_reported_counter`.
    #[serde(default)]
    pub reported_repeats: u64,
}

pub struct Radio<'a> {
    vm: &'a Vm,
    acks: PathBuf,
    next: AtomicU64,
}

impl<'a> Radio<'a> {
    /// Starts the radio as a transient unit with the controller's `features` (`legacy`
    /// or `extended`) and waits for hci0.
    pub fn start(vm: &'a Vm, features: &str) -> Radio<'a> {
        let acks = vm.share().join("radio/acks");
        std::fs::create_dir_all(acks.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&acks);
        vm.ok(&format!(
            "modprobe hci_vhci && systemd-run --unit=radio --collect \
             /opt/bumble/bin/python /share/radio.py /share/radio/acks {features}"
        ));
        let radio = Radio {
            vm,
            acks,
            next: AtomicU64::new(1),
        };
        radio.wait_ack(0, Duration::from_secs(60));
        radio
    }

    /// Sends one command; its answer's JSON, if it has one (panics on an error).
    pub fn cmd(&self, command: &str) -> Option<serde_json::Value> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.vm
            .ok(&format!("echo '{seq} {command}' > /run/radio.fifo"));
        let answer = self.wait_ack(seq, Duration::from_secs(30));
        let rest = answer
            .strip_prefix("ok")
            .unwrap_or_else(|| panic!("radio `{command}`: {answer}"));
        let json = rest.trim();
        (!json.is_empty()).then(|| serde_json::from_str(json).expect("the radio's JSON"))
    }

    /// What the radio did, per advertiser.
    pub fn air(&self) -> BTreeMap<String, Air> {
        serde_json::from_value(self.cmd("stats").expect("stats answer")).expect("stats")
    }

    /// The answer to command `seq` (after `SEQ `).
    fn wait_ack(&self, seq: u64, limit: Duration) -> String {
        let prefix = format!("{seq} ");
        crate::common::eventually_every(limit, Duration::from_millis(50), || {
            let text = std::fs::read_to_string(&self.acks).unwrap_or_default();
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(str::to_string)
        })
        .unwrap_or_else(|| {
            panic!(
                "the radio did not answer command {seq} within {limit:?}: {}",
                self.vm
                    .sh("journalctl -u radio -n 20 --no-pager -o cat")
                    .stdout
            )
        })
    }
}
