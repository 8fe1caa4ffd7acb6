//! Power cuts on a real kernel: the amd64 package installed by apt in a QEMU VM
//! (`tests/vm/`), its unit run by systemd with the simulated fleet delivering to the
//! mock service on the host (the VM's one forward, [`vm::GUEST_SERVICE`]), and the VM's power cut (QEMU killed) at seeded
//! random moments, at least 20 times: while captures are committed, while they are
//! delivered, while the outbox evicts, while the daemon migrates an older schema on its
//! first start, and with `durability = "normal"`. The disk is QEMU's `writethrough`
//! ([`vm::Machine::power_cuts`]): what the guest had not written is gone with its RAM.
//!
//! What was committed is known from a reader of the outbox (`tests/vm/guest/witness.sh`),
//! whose snapshots reach the host through the share as they are taken. After each boot,
//! before the daemon starts again: no database moved aside, `PRAGMA quick_check` ok,
//! `admitted = delivered + dead_letters + evicted + pending` in `tapegate status`, and
//! (under `durability = "full"`) every counter and pending capture of the last snapshot
//! still there or gone with a fate; under "normal" the loss is measured and held to the
//! README's bound (about 35 s of captures). At the end the
//! service must have received every pending capture the witness ever saw (its record is
//! on the host, so a cut takes none of it).
//!
//! `TAPEGATE_VM_SEED=N` replays a run (the seed is printed). Skips, loudly, as
//! `tests/vm_x86_64/ble.rs` does, without root, QEMU or the image's tools, except under CI.

#[path = "power/cycle.rs"]
mod cycle;
#[path = "power/ends.rs"]
mod ends;
#[path = "power/gateway.rs"]
mod gateway;
#[path = "power/witness.rs"]
mod witness;

use std::path::{Path, PathBuf};
use tokio::time::Instant;

use tapegate_mock::MockConfig;

use crate::common;
use crate::vm::{self, Disk, Image, Machine, X86_64};

const TEST: &str = "the power-cut VM test (tests/vm_x86_64/power.rs)";

#[test]
fn committed_captures_survive_power_cuts_on_a_real_kernel() {
    let started = Instant::now();
    if vm::skip(TEST, vm::prerequisites(&X86_64).err()) {
        return;
    }
    let seed = std::env::var("TAPEGATE_VM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    vm::say(&format!(
        "vm_power: seed {seed} (TAPEGATE_VM_SEED={seed} replays these cuts)"
    ));
    let Some(previous) = vm::package::previous() else {
        let why = "no package of the earlier commit (outbox schema 3) under \
                   target/systemd-container/: run tests/systemd_container.rs first";
        vm::skip(TEST, Some(why.into()));
        return;
    };
    let work = vm::target_dir().join("vm").join(X86_64.name);
    std::fs::create_dir_all(&work).unwrap();
    let image = Image::build(&X86_64, &work).unwrap_or_else(|e| panic!("the VM image: {e}"));
    std::thread::scope(|s| {
        let chains = CHAINS.map(|(name, phases, mix)| {
            let (image, work, previous) = (&image, &work, &previous);
            s.spawn(move || chain(name, phases, image, work, previous, seed ^ mix))
        });
        let failed: Vec<_> = chains.into_iter().filter_map(|c| c.join().err()).collect();
        if let Some(panic) = failed.into_iter().next() {
            std::panic::resume_unwind(panic);
        }
    });
    vm::say(&format!(
        "vm_power: {:.0} s in all",
        started.elapsed().as_secs_f64()
    ));
}

/// The cuts, on two machines side by side (each QEMU on one of the build machines' two
/// cores; a chain of 20 boots on one took 37 minutes): the older outbox and the phases
/// without the service on one, delivery and `durability = "normal"` on the other. Each
/// machine's seed is the run's, mixed with its own constant.
const CHAINS: [(&str, &[&str], u64); 2] = [
    ("a", &["migration", "ingest", "eviction"], 0),
    ("b", &["delivery", "normal"], 0x9E37_79B9_7F4A_7C15),
];

/// One machine: its share, disk and service, the package installed, its phases' cuts,
/// the last boot.
fn chain(
    name: &'static str,
    phases: &'static [&'static str],
    image: &Image,
    work: &Path,
    previous: &Path,
    seed: u64,
) {
    let started = Instant::now();
    let dir = work.join(format!("power-{name}"));
    let share = fresh_share(&dir, previous);
    vm::package::amd64(&share.join("tapegate.deb"));
    let (_rt, mock) = common::mock_with(MockConfig::demo());
    mock.set_record_limit(usize::MAX);
    let disk = Disk::fresh(image, &dir.join("disk.img")).unwrap();
    vm::say(&format!(
        "vm_power {name}: package and disk ready after {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let machine = Machine {
        service_port: Some(mock.addr().port()),
        ..Machine::power_cuts(X86_64)
    };
    let mut run = cycle::Run::new(
        name,
        phases,
        mock,
        machine,
        image.clone(),
        disk,
        share,
        dir.join("console.log"),
        seed,
    );
    run.all();
    vm::say(&format!(
        "vm_power {name}: {:.0} s in all",
        started.elapsed().as_secs_f64()
    ));
}

/// The share: the agent, the boot's check, the witness, busybox (the guest's `ip`), and
/// the earlier commit's binary as `old/usr/bin/tapegate`.
fn fresh_share(dir: &Path, previous: &Path) -> PathBuf {
    let share = dir.join("share");
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(share.join("out")).unwrap();
    // The witness runs as the service user (9p passes the guest's own permissions).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(share.join("out"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let guest = vm::repo().join("tests/vm/guest");
    for name in ["agent.sh", "boot-check.sh", "witness.sh"] {
        std::fs::copy(guest.join(name), share.join(name)).unwrap();
    }
    std::fs::copy("/bin/busybox", share.join("busybox")).unwrap();
    let status = std::process::Command::new("dpkg-deb")
        .arg("-x")
        .arg(previous)
        .arg(share.join("old"))
        .status()
        .unwrap();
    assert!(status.success(), "dpkg-deb -x {}", previous.display());
    share
}
