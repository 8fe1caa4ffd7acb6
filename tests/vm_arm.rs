//! The Arm packages booted for real: Debian's arm64 kernel in `qemu-system-aarch64` and
//! its armmp-lpae kernel in `qemu-system-arm` (QEMU's `virt` board, TCG), each with a
//! root debootstrapped for its architecture (the second stage under qemu-user) and
//! systemd as PID 1; the package CI builds for it (`scripts/build-deb.sh`, glibc 2.31)
//! installed by apt (without its Recommends: no network), the unit started (READY: `systemctl start` of a `Type=notify` unit
//! returns once the daemon said so), the simulated fleet delivering to a stand-in for the
//! service on the VM's loopback (`tests/vm/guest/mock.py`: the package's binary has no
//! mock service, and the VM no network), `tapegate status`, and a clean stop (exit 0,
//! the daemon's "stopped" line in the journal).
//!
//! One machine at a time (the build machines have two cores). Skips, loudly, without
//! root, QEMU for Arm, qemu-user-static or the image's tools, except under CI.

#[path = "vm/mod.rs"]
mod vm;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use vm::{Arch, Disk, Image, Machine, Vm, AARCH64, ARMHF};

/// The Arm machines boot one after the other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn the_arm64_package_runs_under_systemd_on_debians_arm64_kernel() {
    boot_and_deliver(&AARCH64);
}

#[test]
fn the_armhf_package_runs_under_systemd_on_debians_armmp_kernel() {
    boot_and_deliver(&ARMHF);
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
    let has = |cmd: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(user) {
        return Some(format!("no {user} (apt-get install qemu-user-static)"));
    }
    (!has("cargo-deb")).then(|| "no cargo-deb (cargo install cargo-deb)".to_string())
}

fn boot_and_deliver(arch: &Arch) {
    let test = format!("the {} VM test (tests/vm_arm.rs)", arch.name);
    if !vm::opted_in("TAPEGATE_VM_ARM", &test) {
        return;
    }
    if vm::skip(&test, why_not(arch)) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let work = vm::target_dir().join("vm").join(arch.name);
    std::fs::create_dir_all(&work).unwrap();
    let image = Image::build(arch, &work).unwrap_or_else(|e| panic!("the VM image: {e}"));
    let imaged = started.elapsed();
    let share = work.join("run/share");
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(share.join("out")).unwrap();
    for name in ["agent.sh", "mock.py"] {
        std::fs::copy(
            vm::repo().join("tests/vm/guest").join(name),
            share.join(name),
        )
        .unwrap();
    }
    vm::package::built_by_ci(arch, &share.join("tapegate.deb"));
    let disk = Disk::fresh(&image, &work.join("run/disk.img")).unwrap();
    let prepared = started.elapsed();
    let vm = Vm::boot(
        &Machine::new(*arch),
        &image,
        &disk,
        &share,
        &work.join("run/console.log"),
    )
    .unwrap_or_else(|e| panic!("the {} VM did not boot: {e}", arch.name));
    eprintln!(
        "vm_arm {}: image {:.0} s, package {:.0} s, booted in {:.0} s (kernel {})",
        arch.name,
        imaged.as_secs_f64(),
        (prepared - imaged).as_secs_f64(),
        vm.booted_in.as_secs_f64(),
        image.kernel_abi
    );
    let seen = vm.ok("uname -m; dpkg --print-architecture; systemctl --version | head -1");
    eprintln!("vm_arm {}: {}", arch.name, seen.replace('\n', "; "));
    assert!(seen.contains(arch.deb_arch), "the guest is {seen}");
    deliver(&vm, &share);
    vm.power_off(Duration::from_secs(120));
    eprintln!(
        "vm_arm {}: {:.0} s in all",
        arch.name,
        started.elapsed().as_secs_f64()
    );
}

/// Installs the package, starts the unit and the service's stand-in, waits for
/// deliveries, reads the status, stops the unit cleanly.
fn deliver(vm: &Vm, share: &Path) {
    let t = Instant::now();
    // Without its Recommends (bluez, ca-certificates): the VM has no network to fetch
    // them from, and the sim source and a plain-HTTP service on loopback need neither.
    let out = vm.run(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         /share/tapegate.deb",
        Duration::from_secs(900),
    );
    assert!(
        out.success(),
        "apt-get install: {}\n{}",
        out.stdout,
        out.stderr
    );
    vm.ok("dpkg -s tapegate | grep -q '^Status: install ok installed'");
    vm.ok("umask 077; printf '%s\\n' demo-password > /etc/tapegate/password");
    vm.ok("systemd-run --unit=mock --collect python3 /share/mock.py 8080 /share/out/mock.jsonl");
    std::fs::write(share.join("config.toml"), config()).unwrap();
    vm.ok("install -m 640 -g tapegate /share/config.toml /etc/tapegate/config.toml");
    eprintln!("vm_arm: installed in {:.0} s", t.elapsed().as_secs_f64());
    vm.run("systemctl start tapegate", Duration::from_secs(300));
    assert_eq!(vm.ok("systemctl is-active tapegate").trim(), "active");
    let ready = vm.ok("systemctl show -p StatusText --value tapegate");
    eprintln!(
        "vm_arm: READY after {:.0} s; STATUS={}",
        t.elapsed().as_secs_f64(),
        ready.trim()
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        let s: Value = serde_json::from_str(&vm.ok("tapegate status --json")).unwrap();
        let received = std::fs::read_to_string(share.join("out/mock.jsonl"))
            .unwrap_or_default()
            .lines()
            .count();
        if s["delivered"].as_u64().unwrap_or(0) >= 20 && received >= 20 {
            break s;
        }
        assert!(Instant::now() < deadline, "no deliveries within 300 s: {s}");
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "vm_arm: delivering after {:.0} s; status {status}",
        t.elapsed().as_secs_f64()
    );
    vm.run("systemctl stop tapegate", Duration::from_secs(120));
    let code = vm.ok("systemctl show -p ExecMainStatus --value tapegate");
    assert_eq!(code.trim(), "0", "the daemon's exit status");
    let stopped = vm.ok("journalctl --no-pager -o cat -u tapegate | grep -c '^stopped' || true");
    assert!(stopped.trim() != "0", "no \"stopped\" line in the journal");
}

/// The unit's config: five simulated tapes, one advert a second each, delivering to the
/// stand-in on loopback.
fn config() -> String {
    "[gateway]\nid = \"vm-arm\"\nstate_dir = \"/var/lib/tapegate\"\nclock = \"trust\"\n\
     [service]\nenvironment = \"ppe\"\nrequest_timeout_secs = 30\n\
     [service.environments.ppe]\nbase_url = \"http://127.0.0.1:8080/ppe/\"\n\
     auth_url = \"http://127.0.0.1:8080/ppe/oauth/token\"\nclient_id = \"vm\"\n\
     audience = \"vm\"\nusername = \"vm\"\npassword_file = \"password\"\n\
     customer_id = \"vm\"\nauthorized_groups = \"vm\"\n\
     [flush]\nmax_delay_secs = 1\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\
     [scanner]\nsource = \"sim\"\nsim_tapes = 5\nsim_interval_ms = 1000\n"
        .to_string()
}
