//! Virtual machines for tests on the real stack: Debian's kernel and a Debian root with
//! systemd as PID 1, booted in QEMU, driven through a 9p share.
//!
//! - [`Arch`]: what differs between the machines a gateway runs on (the Debian
//!   architecture and kernel package, the QEMU system and its console). x86_64 (the BLE and
//!   power-cut tests, `tests/vm_x86_64.rs`) and the Arm ones are booted (`tests/vm_arm.rs`),
//!   all under TCG.
//! - [`Image`]: the kernel, the initramfs and the root's disk image, built by
//!   `scripts/vm/image.sh` from this machine's apt mirror and PyPI and cached under
//!   `target/vm/<arch>/` (a cold build is a debootstrap: a few minutes).
//! - [`Disk`]: a writable copy of the image; it outlives the VM, so a test can cut the
//!   power (kill QEMU) and boot again on the same disk.
//! - [`Vm`] (`machine.rs`): a booted machine, with commands run by the guest's agent
//!   (`guest/agent.sh`) and results read from the share, which the host sees at once.
//!
//! TCG (software emulation) by default: `/dev/kvm` on the project's build machines runs
//! no stock kernel. `TAPEGATE_VM_ACCEL=kvm` asks for KVM where it works.
#![allow(dead_code)]

mod machine;
pub mod package;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use machine::Vm;

/// A machine architecture as the VM tests boot it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Our name for it, and the directory under `target/vm/`.
    pub name: &'static str,
    /// Debian's architecture.
    pub deb_arch: &'static str,
    /// The metapackage whose dependency is the current kernel.
    pub kernel_package: &'static str,
    /// The platform tag of the Python wheels the guest installs (manylinux_2_N_<this>).
    pub wheel_platform: &'static str,
    pub qemu: &'static str,
    /// QEMU's machine and CPU arguments under TCG.
    pub machine: &'static [&'static str],
    /// The kernel's serial console.
    pub console: &'static str,
    /// What `scripts/vm/image.sh` is given besides the architecture: an Arm root has
    /// no BlueZ or Bumble (the Arm boots test the package, not the radio), and brings
    /// the static busybox its initramfs needs.
    pub image_env: &'static [(&'static str, &'static str)],
}

/// The Arm roots' packages: systemd as PID 1 with udev and kmod (the network card's
/// module), adduser (the package's postinst), and busybox-static (the initramfs, and
/// `ip` for the guest's address). Nothing more: a foreign root's second stage runs
/// under qemu-user, where each package configured costs (python3 alone took most of
/// 20 minutes); the agent is bash and the service is the host's mock.
const ARM_IMAGE: &[(&str, &str)] = &[
    ("BUMBLE", "none"),
    (
        "PACKAGES",
        "systemd,systemd-sysv,udev,kmod,adduser,busybox-static",
    ),
];

pub const X86_64: Arch = Arch {
    name: "x86_64",
    deb_arch: "amd64",
    kernel_package: "linux-image-amd64",
    wheel_platform: "x86_64",
    qemu: "qemu-system-x86_64",
    machine: &["-cpu", "max"],
    console: "ttyS0",
    image_env: &[],
};

/// A Raspberry Pi 3/4-class 64-bit gateway: Debian's arm64 kernel on QEMU's `virt`
/// board (`tests/vm_arm.rs`). The root is debootstrapped for arm64 under qemu-user.
pub const AARCH64: Arch = Arch {
    name: "aarch64",
    deb_arch: "arm64",
    kernel_package: "linux-image-arm64",
    wheel_platform: "aarch64",
    qemu: "qemu-system-aarch64",
    machine: &["-M", "virt", "-cpu", "cortex-a72"],
    console: "ttyAMA0",
    image_env: ARM_IMAGE,
};

/// A 32-bit Pi OS-class gateway: Debian's armmp-lpae kernel on `virt` (`tests/vm_arm.rs`).
pub const ARMHF: Arch = Arch {
    name: "armhf",
    deb_arch: "armhf",
    kernel_package: "linux-image-armmp-lpae",
    wheel_platform: "armv7l",
    qemu: "qemu-system-arm",
    machine: &["-M", "virt", "-cpu", "cortex-a15"],
    console: "ttyAMA0",
    image_env: ARM_IMAGE,
};

/// How QEMU runs the guest's instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Tcg,
    Kvm,
}

impl Accel {
    /// TCG unless `TAPEGATE_VM_ACCEL=kvm`.
    pub fn from_env() -> Accel {
        match std::env::var("TAPEGATE_VM_ACCEL").as_deref() {
            Ok("kvm") => Accel::Kvm,
            _ => Accel::Tcg,
        }
    }
}

/// What a VM is booted with.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    pub arch: Arch,
    pub accel: Accel,
    pub memory_mb: u32,
    pub cpus: u32,
    /// QEMU's cache mode for the disk. `unsafe` (fast; flushes ignored) unless a test
    /// cuts the power and needs the disk to hold only what a real one would
    /// ([`Machine::power_cuts`]).
    pub disk_cache: &'static str,
    /// The host's loopback port the guest reaches as [`GUEST_SERVICE`] (QEMU's user
    /// network, restricted: that forward and nothing else); `None`: no network card.
    pub service_port: Option<u16>,
}

/// Where a guest whose machine has a [`Machine::service_port`] reaches it, once its
/// card has [`GUEST_ADDRESS`] (QEMU's user network: the guest is 10.0.2.15/24).
pub const GUEST_SERVICE: &str = "10.0.2.100:8080";
pub const GUEST_ADDRESS: &str = "10.0.2.15/24";

impl Machine {
    /// One CPU (the build machines' two cores are shared) and 1 GiB.
    pub fn new(arch: Arch) -> Machine {
        Machine {
            arch,
            accel: Accel::from_env(),
            memory_mb: 1024,
            cpus: 1,
            disk_cache: "unsafe",
            service_port: None,
        }
    }

    /// A machine whose power is cut: the disk in `writethrough` mode, so that QEMU tells
    /// the guest it has no volatile write cache and completes a write only once the
    /// host holds it. Killing QEMU then loses what a power cut of such a disk loses:
    /// the guest's page cache and the writes not yet completed, and nothing else.
    pub fn power_cuts(arch: Arch) -> Machine {
        Machine {
            disk_cache: "writethrough",
            ..Machine::new(arch)
        }
    }
}

/// The cached parts a VM boots from.
#[derive(Debug, Clone)]
pub struct Image {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The root's ext4 image, zstd-compressed.
    pub disk: PathBuf,
    /// The kernel's ABI name (`6.1.0-56-amd64`).
    pub kernel_abi: String,
}

impl Image {
    /// Builds (or finds cached) the image of `arch` under `work`. One at a time: tests
    /// that boot the same image wait for the first to build it, and `scripts/vm/image.sh`
    /// registers binfmt_misc handlers for a foreign root.
    pub fn build(arch: &Arch, work: &Path) -> Result<Image, String> {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let script = repo().join("scripts/vm/image.sh");
        let out = Command::new(&script)
            .arg(work)
            .env("DEB_ARCH", arch.deb_arch)
            .env("KERNEL_PACKAGE", arch.kernel_package)
            .env("WHEEL_PLATFORM", arch.wheel_platform)
            .envs(arch.image_env.iter().copied())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(str::to_string)
                .ok_or_else(|| format!("image.sh said no {key}: {text}"))
        };
        Ok(Image {
            kernel: get("KERNEL")?.into(),
            initrd: get("INITRD")?.into(),
            disk: get("IMAGE")?.into(),
            kernel_abi: get("KERNEL_ABI")?,
        })
    }
}

/// A writable disk made from an image: booted again after a power cut, it holds what
/// the last boot wrote.
#[derive(Debug)]
pub struct Disk {
    pub path: PathBuf,
}

impl Disk {
    /// A fresh copy of `image`'s disk at `path` (sparse; a few seconds).
    pub fn fresh(image: &Image, path: &Path) -> Result<Disk, String> {
        let _ = std::fs::remove_file(path);
        let status = Command::new("zstd")
            .args(["-q", "-d", "-f"])
            .arg(&image.disk)
            .arg("-o")
            .arg(path)
            .status()
            .map_err(|e| format!("cannot run zstd: {e}"))?;
        if !status.success() {
            return Err(format!("zstd -d {} failed", image.disk.display()));
        }
        Ok(Disk {
            path: path.to_path_buf(),
        })
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

/// Whether `cmd` is on this machine's PATH.
pub fn has(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A line of a long VM test's progress, written to the test's stderr past libtest's
/// capture, so that a CI log shows the figures of a passing run too.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The `[service]` section of a guest's config: the mock service's "ppe" environment
/// on the host, as the guest reaches it ([`GUEST_SERVICE`]), its password in
/// `password_file = "password"` (next to the config, as a Pi's is).
pub fn service_toml(mock: &tapegate_mock::MockHandle, request_timeout_secs: u32) -> String {
    let e = mock.environment("ppe").expect("the mock serves ppe");
    let host = format!("http://{GUEST_SERVICE}");
    let on_host = format!("http://{}", mock.addr());
    let url = |u: url::Url| u.as_str().replacen(&on_host, &host, 1);
    format!(
        "[service]\nenvironment = \"ppe\"\nrequest_timeout_secs = {request_timeout_secs}\n\
         [service.environments.ppe]\nbase_url = \"{}\"\nauth_url = \"{}\"\n\
         client_id = \"{}\"\naudience = \"{}\"\nusername = \"{}\"\n\
         password_file = \"password\"\ncustomer_id = \"{}\"\nauthorized_groups = \"{}\"\n",
        url(mock.base_url("ppe")),
        url(mock.auth_url("ppe")),
        e.client_id,
        e.audience,
        e.username,
        e.customer_id,
        e.authorized_groups
    )
}

/// Why a VM of `arch` cannot be booted here, if it cannot: root, QEMU, and what
/// `scripts/vm/image.sh` needs (debootstrap only until the base is cached).
pub fn prerequisites(arch: &Arch) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (debootstrap, mkfs.ext4 -d and chroot need root)".into());
    }
    let needs = [
        (arch.qemu, "qemu-system-x86 (or -arm)"),
        ("debootstrap", "debootstrap"),
        ("cpio", "cpio"),
        ("zstd", "zstd"),
        ("mkfs.ext4", "e2fsprogs"),
        ("dpkg-deb", "dpkg"),
        ("apt-get", "apt"),
    ];
    for (cmd, package) in needs {
        if !has(cmd) {
            return Err(format!("no {cmd} (apt-get install {package})"));
        }
    }
    let static_busybox = Command::new("ldd")
        .arg("/bin/busybox")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| !s.success());
    if !Path::new("/bin/busybox").exists() || !static_busybox {
        return Err("no static /bin/busybox (apt-get install busybox-static)".into());
    }
    let pip = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pip {
        return Err("no pip for python3 (apt-get install python3-pip)".into());
    }
    Ok(())
}

/// Skips the test (returns `true`) when `why` is `Some`, loudly; under CI (`CI` set)
/// panics instead.
pub fn skip(test: &str, why: Option<String>) -> bool {
    let Some(why) = why else {
        return false;
    };
    if std::env::var_os("CI").is_some() {
        panic!("{test} cannot run here: {why}");
    }
    eprintln!(
        "\n*** SKIPPED {test}: {why} ***\n*** (it runs under CI, `CI` set, where this is a failure) ***\n"
    );
    true
}
