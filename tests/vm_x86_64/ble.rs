//! The gateway on the real stack: Debian's kernel with `hci_vhci`, systemd as PID 1,
//! bluetoothd, and the package installed by apt, in a QEMU virtual machine
//! (`tests/vm/`); Bumble's controller is the radio, and emulated tapes and a foreign
//! advertiser are the air (`tests/vm/guest/radio.py`). The daemon delivers to the mock
//! service on the VM's own loopback (the VM has no network); what the service received
//! is read from the share. One boot for every case, in order; each case waits on
//! conditions, with deadlines.
//!
//! Needs root, QEMU and what `scripts/vm/image.sh` needs (debootstrap, busybox-static,
//! cpio, zstd, pip) and `cargo deb`; without them it says so loudly and passes, except
//! under CI (`CI` set), where it fails. `.ci/run` installs them. Cold, it builds the
//! image (a debootstrap, a few minutes); warm, it takes the minutes of its cases.

#[path = "ble/cases.rs"]
mod cases;
#[path = "ble/faults.rs"]
mod faults;
#[path = "ble/modes.rs"]
mod modes;
#[path = "ble/radio.rs"]
mod radio;
#[path = "ble/stack.rs"]
mod stack;
#[path = "ble/trace.rs"]
mod trace;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tokio::time::Instant;

use crate::common;
use crate::vm::{self, Disk, Image, Machine, Vm, X86_64};

const TEST: &str = "the BLE VM test (tests/vm_x86_64/ble.rs)";

#[test]
fn a_gateway_in_a_vm_hears_tapes_through_a_real_kernel_and_bluez() {
    let started = Instant::now();
    if vm::skip(TEST, why_not()) {
        return;
    }
    let work = vm::target_dir().join("vm").join(X86_64.name);
    std::fs::create_dir_all(&work).unwrap();
    let image = Image::build(&X86_64, &work).unwrap_or_else(|e| panic!("the VM image: {e}"));
    let share = fresh_share(&work);
    vm::package::amd64(&share.join("tapegate.deb"));
    let disk = Disk::fresh(&image, &work.join("run/disk.img")).unwrap();
    let prepared = started.elapsed();
    let machine = Machine::new(X86_64);
    let vm = Vm::boot(
        &machine,
        &image,
        &disk,
        &share,
        &work.join("run/console.log"),
    )
    .unwrap_or_else(|e| panic!("the VM did not boot: {e}"));
    vm::say(&format!(
        "vm_ble: image and package ready after {:.0} s; booted in {:.0} s (kernel {})",
        prepared.as_secs_f64(),
        vm.booted_in.as_secs_f64(),
        image.kernel_abi
    ));
    let radio = radio::Radio::start(&vm, "extended");
    let g = stack::Gateway::install(&vm);
    cases::main_air(&radio);
    type Case<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let all: Vec<Case> = vec![
        (
            "both paths",
            Box::new(|| cases::both_paths_active(&g, &radio)),
        ),
        (
            "scan modes",
            Box::new(|| modes::scan_modes(&g, &radio, "extended", 4)),
        ),
        (
            "tapegate scan",
            Box::new(|| cases::scan_passive(&g, &radio)),
        ),
        (
            "stored socket",
            Box::new(|| cases::dbus_takes_the_stored_socket(&g, &radio)),
        ),
        ("faults", Box::new(|| faults::passive_faults(&g, &radio))),
        ("wedged", Box::new(|| faults::wedged_controller(&g, &radio))),
        ("legacy", Box::new(|| modes::legacy_controller(&g, &radio))),
        (
            "hundred tapes",
            Box::new(|| cases::a_hundred_tapes(&g, &radio)),
        ),
    ];
    // TAPEGATE_VM_ONLY=name,name runs those cases alone (to see one fail on another
    // commit's package, with TAPEGATE_VM_DEB).
    let only = std::env::var("TAPEGATE_VM_ONLY").ok();
    for (name, case) in &all {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|n| n.trim() == *name))
        {
            continue;
        }
        let t = Instant::now();
        case();
        vm::say(&format!(
            "vm_ble: {name}: {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    drop(all);
    drop(radio);
    vm.power_off(std::time::Duration::from_secs(60));
    vm::say(&format!(
        "vm_ble: {:.0} s in all",
        started.elapsed().as_secs_f64()
    ));
}

/// Why the test cannot run here, if it cannot.
fn why_not() -> Option<String> {
    if let Err(why) = vm::prerequisites(&X86_64) {
        return Some(why);
    }
    let deb = Command::new(cargo())
        .args(["deb", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!deb).then(|| "no cargo-deb (cargo install cargo-deb)".to_string())
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The share for this run: the guest's agent, radio and management tool, and this
/// build's binary (with the mock service) as `bin/tapegate`.
fn fresh_share(work: &Path) -> PathBuf {
    let share = work.join("run/share");
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(share.join("bin")).unwrap();
    std::fs::create_dir_all(share.join("out")).unwrap();
    let guest = vm::repo().join("tests/vm/guest");
    for name in ["agent.sh", "radio.py", "mgmt.py"] {
        std::fs::copy(guest.join(name), share.join(name)).unwrap();
    }
    std::fs::copy(common::BIN, share.join("bin/tapegate")).unwrap();
    share
}
