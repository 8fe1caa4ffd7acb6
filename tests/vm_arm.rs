//! The Arm packages booted for real: Debian's arm64 kernel in `qemu-system-aarch64` and
//! its armmp-lpae kernel in `qemu-system-arm` (QEMU's `virt` board, TCG), each with a
//! root debootstrapped for its architecture (the second stage under qemu-user) and
//! systemd as PID 1; the package CI builds for it (`scripts/build-deb.sh`, glibc 2.31)
//! installed by apt (without its Recommends: the VM reaches nothing but the service), the
//! unit started (READY: `systemctl start` of a `Type=notify` unit returns once the daemon
//! said so), the simulated fleet delivering to the project's mock service on the host
//! (the package's binary has no mock service: the guest reaches the host's loopback
//! through QEMU's user network, restricted to that one forward, [`vm::GUEST_SERVICE`]),
//! `tapegate status`, and a clean stop (exit 0, the daemon's "stopped" line in the
//! journal).
//!
//! The two machines boot side by side, each on one of the build machines' two cores,
//! in threads of one test. Their packages are built one at a time (one machine's package
//! builds while the other's root is debootstrapped). Skips, loudly, without root, QEMU
//! for Arm, qemu-user-static or the image's tools, except under CI.

mod common;
#[path = "vm/mod.rs"]
mod vm;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tapegate_mock::{MockConfig, MockHandle};
use tokio::time::Instant;

use vm::{Arch, Disk, Image, Machine, Vm, AARCH64, ARMHF};

/// The packages are built one after the other (`scripts/build-deb.sh` makes its tools'
/// virtual environment on first use).
static ONE_PACKAGE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Both machines at once, in one test.
#[test]
fn the_arm64_and_armhf_packages_run_under_systemd_on_debians_kernels() {
    std::thread::scope(|s| {
        let machines = [AARCH64, ARMHF].map(|arch| s.spawn(move || boot_and_deliver(&arch)));
        let failed: Vec<_> = machines
            .into_iter()
            .filter_map(|m| m.join().err())
            .collect();
        if let Some(panic) = failed.into_iter().next() {
            std::panic::resume_unwind(panic);
        }
    });
}

/// Why `arch` cannot be booted here, if it cannot.
fn why_not(arch: &Arch) -> Option<String> {
    if let Err(why) = vm::prerequisites(arch) {
        return Some(why);
    }
    let user = match arch.deb_arch {
        "arm64" => "qemu-aarch64-static",
        _ => "qemu-arm-static",
    };
    if !vm::has(user) {
        return Some(format!("no {user} (apt-get install qemu-user-static)"));
    }
    (!vm::has("cargo-deb")).then(|| "no cargo-deb (cargo install cargo-deb)".to_string())
}

fn boot_and_deliver(arch: &Arch) {
    let test = format!("the {} VM test (tests/vm_arm.rs)", arch.name);
    if vm::skip(&test, why_not(arch)) {
        return;
    }
    let started = Instant::now();
    let work = vm::target_dir().join("vm").join(arch.name);
    std::fs::create_dir_all(&work).unwrap();
    let share = work.join("run/share");
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(&share).unwrap();
    std::fs::copy(
        vm::repo().join("tests/vm/guest/agent.sh"),
        share.join("agent.sh"),
    )
    .unwrap();
    let image = Image::build(arch, &work).unwrap_or_else(|e| panic!("the VM image: {e}"));
    let imaged = started.elapsed();
    {
        let _one = ONE_PACKAGE_AT_A_TIME
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        vm::package::built_by_ci(arch, &share.join("tapegate.deb"));
    }
    let disk = Disk::fresh(&image, &work.join("run/disk.img")).unwrap();
    let prepared = started.elapsed();
    let (_rt, mock) = common::mock_with(MockConfig::demo());
    let machine = Machine {
        service_port: Some(mock.addr().port()),
        ..Machine::new(*arch)
    };
    let vm = Vm::boot(
        &machine,
        &image,
        &disk,
        &share,
        &work.join("run/console.log"),
    )
    .unwrap_or_else(|e| panic!("the {} VM did not boot: {e}", arch.name));
    vm::say(&format!(
        "vm_arm {}: image {:.0} s, package and disk {:.0} s, booted in {:.0} s (kernel {})",
        arch.name,
        imaged.as_secs_f64(),
        (prepared - imaged).as_secs_f64(),
        vm.booted_in.as_secs_f64(),
        image.kernel_abi
    ));
    let seen = vm.ok("uname -m; dpkg --print-architecture; systemctl --version | head -1");
    vm::say(&format!(
        "vm_arm {}: {}",
        arch.name,
        seen.replace('\n', "; ")
    ));
    assert!(seen.contains(arch.deb_arch), "the guest is {seen}");
    deliver(&vm, &share, &mock, arch.name);
    vm.power_off(Duration::from_secs(120));
    vm::say(&format!(
        "vm_arm {}: {:.0} s in all",
        arch.name,
        started.elapsed().as_secs_f64()
    ));
}

/// Installs the package, gives the guest its address, starts the unit, waits for
/// deliveries, reads the status, stops the unit cleanly.
fn deliver(vm: &Vm, share: &Path, mock: &MockHandle, name: &str) {
    let t = Instant::now();
    vm.apt_install("/share/tapegate.deb", false);
    let ppe = mock.environment("ppe").expect("the mock serves ppe");
    std::fs::write(share.join("password"), format!("{}\n", ppe.password)).unwrap();
    vm.ok("install -m 600 /share/password /etc/tapegate/password && rm /share/password");
    std::fs::write(share.join("config.toml"), config(mock)).unwrap();
    vm.ok("install -m 640 -g tapegate /share/config.toml /etc/tapegate/config.toml");
    vm.link_up();
    vm::say(&format!(
        "vm_arm {name}: installed in {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    vm.run("systemctl start tapegate", Duration::from_secs(300));
    assert_eq!(vm.ok("systemctl is-active tapegate").trim(), "active");
    let ready = vm.ok("systemctl show -p StatusText --value tapegate");
    vm::say(&format!(
        "vm_arm {name}: READY after {:.0} s; STATUS={}",
        t.elapsed().as_secs_f64(),
        ready.trim()
    ));
    let status =
        common::eventually_every(Duration::from_secs(300), Duration::from_millis(500), || {
            let s: Value = serde_json::from_str(&vm.ok("tapegate status --json")).unwrap();
            (s["delivered"].as_u64().unwrap_or(0) >= 20 && mock.decoded_items() >= 20).then_some(s)
        })
        .unwrap_or_else(|| {
            let s = vm.ok("tapegate status --json");
            panic!("{name}: no deliveries within 300 s: {s}")
        });
    vm::say(&format!(
        "vm_arm {name}: delivering after {:.0} s; status {status}; the service decoded {}",
        t.elapsed().as_secs_f64(),
        mock.decoded_items()
    ));
    vm.run("systemctl stop tapegate", Duration::from_secs(120));
    let code = vm.ok("systemctl show -p ExecMainStatus --value tapegate");
    assert_eq!(code.trim(), "0", "the daemon's exit status");
    let stopped = vm.ok("journalctl --no-pager -o cat -u tapegate | grep -c '^stopped' || true");
    assert!(stopped.trim() != "0", "no \"stopped\" line in the journal");
}

/// The unit's config: five simulated tapes, one advert a second each, delivering to the
/// mock service's "ppe" environment on the host, as the guest reaches it.
fn config(mock: &MockHandle) -> String {
    format!(
        "[gateway]\nid = \"vm-arm\"\nstate_dir = \"/var/lib/tapegate\"\nclock = \"trust\"\n{}\
         [flush]\nmax_delay_secs = 1\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\
         [scanner]\nsource = \"sim\"\nsim_tapes = 5\nsim_interval_ms = 1000\n",
        vm::service_toml(mock, 30)
    )
}
