//! A booted VM: QEMU running the image's kernel on a [`Disk`], no network (`-nic none`,
//! or one forward to the host: [`Machine::service_port`]),
//! and a directory of the host shared as `/share` (9p). The guest's agent runs each
//! script the host drops into `share/agent/` and writes its output back there; results
//! the guest writes to the share survive the VM being killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{Accel, Disk, Image, Machine};

/// How long a boot may take to reach the agent (TCG on a loaded machine).
const BOOT_LIMIT: Duration = Duration::from_secs(300);
/// How often the host looks at the share for an answer.
const POLL: Duration = Duration::from_millis(50);

/// Shell that names the guest's network card (`$card`) and busybox (`$bb`).
const CARD: &str = "card=$(ls /sys/class/net | grep -vx lo | head -1); \
                    bb=$(command -v busybox || echo /share/busybox)";

/// What a script run in the guest printed, and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

/// A booted machine. Killed when dropped; the disk stays.
pub struct Vm {
    qemu: Child,
    share: PathBuf,
    console: PathBuf,
    next: AtomicU64,
    pub booted_in: Duration,
}

/// A script running in the guest.
pub struct Job<'a> {
    vm: &'a Vm,
    base: PathBuf,
    script: String,
}

/// The machine's network card: none, or QEMU's user network restricted to one forward,
/// [`super::GUEST_SERVICE`] to the host's loopback port, a `busybox nc` per connection
/// (a forward to a chardev would carry one connection for the VM's life).
fn nic(machine: &Machine) -> String {
    match machine.service_port {
        None => "none".to_string(),
        Some(port) => format!(
            "user,model=virtio-net-pci,restrict=on,guestfwd=tcp:{}-cmd:/bin/busybox nc 127.0.0.1 {port}",
            super::GUEST_SERVICE
        ),
    }
}

impl Vm {
    /// Boots `machine` from `image` on `disk`, sharing `share` (which must hold the
    /// agent, `agent.sh`), and waits for the agent. The serial console goes to
    /// `console`.
    pub fn boot(
        machine: &Machine,
        image: &Image,
        disk: &Disk,
        share: &Path,
        console: &Path,
    ) -> Result<Vm, String> {
        let agent = share.join("agent");
        let _ = std::fs::remove_dir_all(&agent);
        std::fs::create_dir_all(&agent).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(console).map_err(|e| e.to_string())?;
        let arch = &machine.arch;
        let mut cmd = Command::new(arch.qemu);
        match machine.accel {
            Accel::Tcg => cmd.args(["-accel", "tcg"]).args(arch.machine),
            Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        };
        cmd.arg("-m")
            .arg(machine.memory_mb.to_string())
            .arg("-smp")
            .arg(machine.cpus.to_string())
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "console={} root=/dev/vda rw quiet loglevel=4 panic=-1",
                arch.console
            ))
            .arg("-drive")
            .arg(format!(
                "file={},if=virtio,format=raw,cache={}",
                disk.path.display(),
                machine.disk_cache
            ))
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=share,security_model=none,id=share",
                share.display()
            ))
            .arg("-nic")
            .arg(nic(machine))
            .args(["-nographic", "-no-reboot"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let started = Instant::now();
        let qemu = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", arch.qemu))?;
        let mut vm = Vm {
            qemu,
            share: share.to_path_buf(),
            console: console.to_path_buf(),
            next: AtomicU64::new(1),
            booted_in: Duration::ZERO,
        };
        while !agent.join("ready").exists() {
            if let Ok(Some(status)) = vm.qemu.try_wait() {
                return Err(format!(
                    "QEMU ended ({status}) before the agent ran:\n{}",
                    vm.console_tail()
                ));
            }
            if started.elapsed() > BOOT_LIMIT {
                return Err(format!(
                    "the agent did not start within {BOOT_LIMIT:?}:\n{}",
                    vm.console_tail()
                ));
            }
            std::thread::sleep(POLL * 4);
        }
        vm.booted_in = started.elapsed();
        Ok(vm)
    }

    /// The host's side of the share.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// The last lines of the serial console.
    pub fn console_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.console).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Starts `script` (bash, as root) in the guest.
    pub fn spawn(&self, script: &str) -> Job<'_> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let base = self.share.join("agent").join(format!("{n:06}"));
        let tmp = base.with_extension("sh.tmp");
        std::fs::write(&tmp, script).expect("the share is writable");
        std::fs::rename(&tmp, base.with_extension("sh")).expect("the share is writable");
        Job {
            vm: self,
            base,
            script: script.to_string(),
        }
    }

    /// Runs `script` in the guest and waits for it (at most `limit`).
    pub fn run(&self, script: &str, limit: Duration) -> Output {
        self.spawn(script).wait(limit)
    }

    /// Runs `script` (at most two minutes); its output.
    pub fn sh(&self, script: &str) -> Output {
        self.run(script, Duration::from_secs(120))
    }

    /// [`Vm::sh`] that must succeed; its stdout.
    pub fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.success(),
            "`{script}` failed in the VM (exit {}):\n{}\n{}",
            out.code,
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    /// Cuts the power: QEMU is killed (SIGKILL), whatever the guest was doing. The disk
    /// keeps every write QEMU had completed (the host's page cache outlives QEMU) and
    /// loses what was still in the guest's page cache or on its way, as a gateway's
    /// power cut does. With [`super::Machine::power_cuts`] the guest is told its disk has
    /// no write cache, so a write it saw completed is one a real disk would hold too.
    pub fn power_cut(mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }

    /// Powers the guest off cleanly and waits for QEMU (killed after `limit`).
    pub fn power_off(mut self, limit: Duration) {
        let _ = self.spawn("systemctl poweroff");
        let off = crate::common::eventually_every(limit, POLL * 4, || {
            matches!(self.qemu.try_wait(), Ok(Some(_)))
        });
        if off.is_some() {
            return;
        }
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }

    /// Installs the package at `deb` (a path in the guest) with apt; without its
    /// Recommends (bluez, ca-certificates) unless `recommends`: the VM reaches no mirror
    /// to fetch them from, and the sim source and a plain-HTTP service need neither.
    pub fn apt_install(&self, deb: &str, recommends: bool) {
        let flag = if recommends {
            ""
        } else {
            " --no-install-recommends"
        };
        let out = self.run(
            &format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -q{flag} {deb}"),
            Duration::from_secs(900),
        );
        assert!(
            out.success(),
            "apt-get install: {}\n{}",
            out.stdout,
            out.stderr
        );
        self.ok("dpkg -s tapegate | grep -q '^Status: install ok installed'");
    }

    /// Gives the guest's card ([`super::Machine::service_port`]) its address, so that
    /// [`super::GUEST_SERVICE`] reaches the host's service: the card's module (udev may
    /// not have loaded it yet), its name, busybox's `ip` (the root's, or `busybox` in
    /// the share).
    pub fn link_up(&self) {
        self.ok(&format!(
            "modprobe virtio_net; udevadm settle; {CARD}; \
             $bb ip link set \"$card\" up && $bb ip addr add {} dev \"$card\"",
            super::GUEST_ADDRESS
        ));
    }

    /// Takes the guest's card down: the service is unreachable (as with no uplink).
    pub fn link_down(&self) {
        self.ok(&format!("{CARD}; $bb ip link set \"$card\" down"));
    }

    fn alive(&mut self) -> bool {
        matches!(self.qemu.try_wait(), Ok(None))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.qemu.kill();
            let _ = self.qemu.wait();
        }
    }
}

impl Job<'_> {
    /// Whether the script has ended.
    pub fn done(&self) -> bool {
        self.base.with_extension("rc").exists()
    }

    /// Waits for the script to end (panics after `limit`, with the console's tail).
    pub fn wait(self, limit: Duration) -> Output {
        let rc = self.base.with_extension("rc");
        if crate::common::eventually_every(limit, POLL, || rc.exists()).is_none() {
            panic!(
                "`{}` did not end in the VM within {limit:?}; console:\n{}",
                self.script,
                self.vm.console_tail()
            );
        }
        let read =
            |ext: &str| std::fs::read_to_string(self.base.with_extension(ext)).unwrap_or_default();
        Output {
            code: read("rc").trim().parse().unwrap_or(-1),
            stdout: read("out"),
            stderr: read("err"),
        }
    }
}
