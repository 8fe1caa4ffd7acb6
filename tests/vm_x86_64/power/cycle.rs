//! The cuts: phases of a few boots each, every boot checked against the witness's last
//! snapshot before the cut that ended the boot before it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use tapegate_mock::MockHandle;

use super::gateway::{self, Settings};
use super::witness::{self, Key, Snapshot};
use crate::vm::{self, Disk, Image, Machine, Vm};

/// What the README says a power cut may take under `durability = "normal"`: about 35 s
/// of captures (what the kernel had not yet written back), at the fleet's 80 a second.
const NORMAL_LOSS_BOUND: i64 = 35 * 80;

pub const FULL: Settings = Settings {
    durability: "full",
    max_pending: 1_000_000,
    sim_duration_secs: None,
};

/// A phase: its cuts, how the daemon runs, whether the service answers, and the span
/// (ms after READY, or after the start for a migration) in which each cut falls.
struct Phase {
    name: &'static str,
    cuts: usize,
    settings: Settings,
    service: bool,
    span_ms: (u64, u64),
}

const PHASES: [Phase; 5] = [
    Phase {
        name: "migration",
        cuts: 3,
        settings: FULL,
        service: false,
        span_ms: (500, 8000),
    },
    Phase {
        name: "ingest",
        cuts: 3,
        settings: FULL,
        service: false,
        span_ms: (300, 6000),
    },
    Phase {
        name: "delivery",
        cuts: 5,
        settings: FULL,
        service: true,
        span_ms: (300, 6000),
    },
    Phase {
        name: "eviction",
        cuts: 4,
        settings: Settings {
            max_pending: 300,
            ..FULL
        },
        service: false,
        span_ms: (300, 6000),
    },
    Phase {
        name: "normal",
        cuts: 5,
        settings: Settings {
            durability: "normal",
            ..FULL
        },
        service: false,
        span_ms: (1000, 12000),
    },
];

pub struct Run {
    /// This machine's name, and the phases it runs.
    pub(super) chain: &'static str,
    phases: &'static [&'static str],
    /// The service, on the host: the guest reaches it through its one forward when a
    /// phase brings the link up.
    pub(super) mock: MockHandle,
    pub(super) machine: Machine,
    pub(super) image: Image,
    pub(super) disk: Disk,
    pub(super) share: PathBuf,
    pub(super) console: PathBuf,
    pub(super) rng: u64,
    pub(super) boots: usize,
    /// The last committed state the harness knows of, and its phase.
    pub(super) known: Option<(Snapshot, &'static str)>,
    /// Every pending capture a snapshot showed under `durability = "full"`.
    pub(super) witnessed: BTreeSet<Key>,
    /// Captures lost per cut under "normal".
    pub(super) normal_losses: Vec<i64>,
    /// The schema each boot after a cut of the migration phase found (3: the cut came
    /// before the first step committed; 4 or 5: between steps; 6: after).
    pub(super) migration_found: Vec<i64>,
}

impl Run {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        chain: &'static str,
        phases: &'static [&'static str],
        mock: MockHandle,
        machine: Machine,
        image: Image,
        disk: Disk,
        share: PathBuf,
        console: PathBuf,
        seed: u64,
    ) -> Run {
        Run {
            chain,
            phases,
            mock,
            machine,
            image,
            disk,
            share,
            console,
            rng: seed | 1,
            boots: 0,
            known: None,
            witnessed: BTreeSet::new(),
            normal_losses: Vec::new(),
            migration_found: Vec::new(),
        }
    }

    /// A number in `lo..hi` (xorshift64*, from the seed).
    fn random(&mut self, (lo, hi): (u64, u64)) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        lo + self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % (hi - lo).max(1)
    }

    /// A line of progress, named by this machine.
    pub(super) fn say(&self, line: &str) {
        vm::say(&format!("vm_power {}: {line}", self.chain));
    }

    /// Boots the machine; with `service`, the guest's link to the service comes up.
    pub(super) fn boot(&mut self, service: bool) -> Vm {
        self.boots += 1;
        let vm = Vm::boot(
            &self.machine,
            &self.image,
            &self.disk,
            &self.share,
            &self.console,
        )
        .unwrap_or_else(|e| panic!("boot {} failed: {e}", self.boots));
        self.say(&format!(
            "boot {} in {:.0} s",
            self.boots,
            vm.booted_in.as_secs_f64()
        ));
        if service {
            vm.link_up();
        }
        vm
    }

    /// This machine's phases, or those of them `TAPEGATE_VM_PHASES=ingest,normal` names.
    pub fn all(&mut self) {
        let only = std::env::var("TAPEGATE_VM_PHASES").ok();
        let phases = self.phases;
        let wanted = |name: &str| {
            phases.contains(&name)
                && only
                    .as_ref()
                    .is_none_or(|o| o.split(',').any(|n| n.trim() == name))
        };
        // The setup (the install by apt, the older outbox) on QEMU's fast cache, ended by
        // a clean power-off; every boot that is cut runs on the cut's own.
        let cuts = self.machine;
        self.machine = Machine {
            service_port: cuts.service_port,
            ..Machine::new(cuts.arch)
        };
        let vm = self.boot(true);
        gateway::install(&vm, &self.mock);
        if wanted("migration") {
            super::ends::older_schema(&vm, &self.mock);
        }
        vm.power_off(Duration::from_secs(120));
        self.machine = cuts;
        let mut cut = 0;
        for phase in PHASES.iter().filter(|p| wanted(p.name)) {
            for _ in 0..phase.cuts {
                cut += 1;
                self.cut(cut, phase);
            }
        }
        super::ends::finish(self, cut);
    }

    /// One boot of `phase`: the checks of what the last cut left, the daemon started,
    /// the power cut at a random moment.
    fn cut(&mut self, n: usize, phase: &Phase) {
        let vm = self.boot(phase.service);
        self.after_boot(&vm);
        let mut script = vec![gateway::configure(&vm, phase.settings, &self.mock).to_string()];
        if phase.name == "migration" {
            // The older outbox restored, and read as it was before the daemon starts.
            script.push(
                "install -d -o tapegate -g tapegate /var/lib/tapegate; \
                 rm -f /var/lib/tapegate/outbox.db*; \
                 cp -a /var/lib/tapegate-v3/outbox.db* /var/lib/tapegate/; \
                 chown tapegate: /var/lib/tapegate/outbox.db*; sync"
                    .into(),
            );
            script.push("/bin/bash /share/boot-check.sh none".into());
        }
        script.push(gateway::witness(self.boots));
        if phase.name == "migration" {
            // The cut falls after the daemon's own process started (it migrates first).
            script.push(
                "systemctl start --no-block tapegate; \
                 while [ \"$(systemctl show -p MainPID --value tapegate)\" = 0 ]; do sleep 0.05; done"
                    .into(),
            );
        } else {
            // READY (the unit is `Type=notify`).
            script.push("systemctl start tapegate".into());
        }
        let out = vm.run(&script.join(" &&\n"), Duration::from_secs(180));
        assert!(
            out.success(),
            "the daemon's start (exit {}):\n{}\n{}",
            out.code,
            out.stdout,
            out.stderr
        );
        if phase.name == "migration" {
            let before = gateway::found(&out.stdout).expect("the older outbox restored");
            assert_eq!(before.version, 3, "the older schema is restored");
            self.known = Some((before.snapshot, phase.name));
        }
        let delay = self.random(phase.span_ms);
        // The moment of the cut is the test's input, not a wait for a condition.
        std::thread::sleep(Duration::from_millis(delay));
        // What the daemon was doing (a trip through the agent: not where the moment
        // of a cut in the migration must be kept).
        let log = match phase.name {
            "migration" => String::new(),
            _ => {
                vm.sh("journalctl --no-pager -o cat -u tapegate -b 0 | tail -3")
                    .stdout
            }
        };
        vm.power_cut();
        let text = std::fs::read_to_string(
            self.share
                .join(format!("out/witness-{:03}.txt", self.boots)),
        )
        .unwrap_or_default();
        let snap = Snapshot::parse(&text);
        self.say(&format!(
            "cut {n} ({}, {delay} ms after the daemon's start): last seen {} [{}]",
            phase.name,
            snap.summary(),
            log.lines().last().unwrap_or("")
        ));
        if !text.is_empty() {
            if phase.settings.durability == "full" {
                self.witnessed.extend(snap.pending.iter().cloned());
            }
            let tag = match phase.name {
                "migration" => "migration",
                _ => phase.settings.durability,
            };
            self.known = Some((snap, tag));
        }
    }

    /// What every boot checks before the daemon starts: the database not moved aside,
    /// quick_check, the status's sum, and what the last snapshot before the cut saw.
    pub(super) fn after_boot(&mut self, vm: &Vm) {
        let Some(now) = gateway::boot_check(vm) else {
            assert!(self.known.is_none(), "the outbox is gone after a cut");
            return;
        };
        let (version, now) = (now.version, now.snapshot);
        assert!(
            now.adds_up(),
            "the counters do not add up: {}",
            now.summary()
        );
        let Some((before, durability)) = self.known.take() else {
            return;
        };
        if durability == "migration" {
            self.migration_found.push(version);
        }
        let found = witness::compare(&before, &now);
        self.say(&format!(
            "boot {} found schema {version}, {} (quick_check ok); lost: {} admitted, {} pending",
            self.boots,
            now.summary(),
            found.lost_admitted,
            found.lost_pending
        ));
        if durability == "normal" {
            assert!(
                found.lost_admitted <= NORMAL_LOSS_BOUND,
                "durability = \"normal\" lost {} captures in a power cut, more than the \
                 README's 35 s of them ({NORMAL_LOSS_BOUND})",
                found.lost_admitted
            );
            self.normal_losses.push(found.lost_admitted);
        } else {
            assert!(
                found.nothing_lost(),
                "durability = \"full\" lost committed captures in a power cut: {found:?}\n\
                 before the cut: {}\nafter it: {}",
                before.summary(),
                now.summary()
            );
        }
    }
}

/// The outbox's schema version.
pub fn user_version(vm: &Vm) -> i64 {
    vm.ok(&format!(
        "runuser -u tapegate -- sqlite3 {} 'PRAGMA user_version;'",
        gateway::DB
    ))
    .trim()
    .parse()
    .unwrap()
}
