//! The file system under the state directory, when it takes no writes: mounted
//! read-only, or turned read-only by the kernel after an error (ext4's
//! `errors=remount-ro`, the usual answer of an SD card's file system to a failing card).
//! [`why_read_only`] says which, naming the state directory and the device, and what the
//! technician must do; it reads (`statvfs`, `/proc/self/mountinfo`, ext4's error count in
//! `/sys/fs/ext4/`) and writes nothing, so `/healthz` may ask it at every request.
//!
//! Why not `statvfs` alone: since Linux 6.13 ext4 no longer marks a file system it
//! turns read-only after an error as read-only for `statvfs` (the mount shows
//! `emergency_ro`); every write fails with `EROFS` all the same.
//!
//! A leaf: it touches only the file system; `access.rs` and `crate::health` call it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The mount a directory is on, as `/proc/self/mountinfo` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    point: PathBuf,
    /// Read-only: the mount's or the file system's `ro`, or ext4's `emergency_ro`.
    read_only: bool,
}

/// Why the file system holding the state directory `dir` takes no writes, with what to
/// do about it; `None` while nothing says it is read-only.
pub(crate) fn why_read_only(dir: &Path) -> Option<String> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = mount_of(&mountinfo, major, minor, &canonical);
    let read_only = statvfs_read_only(dir) || mount.as_ref().is_some_and(|m| m.read_only);
    if !read_only {
        return None;
    }
    let name = block_device(major, minor);
    let errors = name.as_deref().and_then(ext4_errors).unwrap_or(0);
    let device = name.map_or_else(
        || format!("device {major}:{minor}"),
        |n| format!("/dev/{n}"),
    );
    let point = mount.map_or_else(|| dir.to_path_buf(), |m| m.point);
    Some(if errors > 0 {
        format!(
            "the file system holding the state directory {} ({device}) turned read-only after {errors} file system error{} (`journalctl -k | grep EXT4-fs` says which): the storage may be failing. What to do: stop tapegate, check the file system with fsck (`fsck -fy {device}` while it is unmounted; the root file system is checked at boot: reboot), then start tapegate again; what it had committed is kept. If it happens again, replace the SD card",
            dir.display(),
            if errors == 1 { "" } else { "s" },
        )
    } else {
        format!(
            "the file system holding the state directory {} ({device}) is mounted read-only. Fix: remount it read-write (`mount -o remount,rw {}`), or set gateway.state_dir to a writable directory",
            dir.display(),
            point.display()
        )
    })
}

fn statvfs_read_only(dir: &Path) -> bool {
    let Ok(p) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs(3) on a valid NUL-terminated path into a zeroed struct it fills.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statvfs(p.as_ptr(), &mut s) == 0 && s.f_flag & libc::ST_RDONLY != 0 }
}

/// The mount of device `major:minor` whose mount point holds `dir` (the longest, when
/// the device is mounted in several places).
fn mount_of(mountinfo: &str, major: u32, minor: u32, dir: &Path) -> Option<Mount> {
    let device = format!("{major}:{minor}");
    mountinfo
        .lines()
        .filter_map(|line| {
            // id parent major:minor root point options [optional...] - type source super
            let (mine, fs) = line.split_once(" - ")?;
            let fields: Vec<&str> = mine.split(' ').collect();
            if fields.get(2) != Some(&device.as_str()) {
                return None;
            }
            let point = PathBuf::from(unescape(fields.get(4)?));
            if !dir.starts_with(&point) {
                return None;
            }
            let options = fields.get(5)?.split(',');
            let super_options = fs.split(' ').nth(2).unwrap_or("").split(',');
            let read_only = options
                .chain(super_options)
                .any(|o| o == "ro" || o == "emergency_ro");
            Some(Mount { point, read_only })
        })
        .max_by_key(|m| m.point.as_os_str().len())
}

/// A mount point as mountinfo writes it (a space is `\040`, and so on).
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let text = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The kernel's name of block device `major:minor` (`mmcblk0p2`, `loop0`), even when the
/// mount calls it `/dev/root`.
fn block_device(major: u32, minor: u32) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// The errors ext4 has counted on device `name` since it was last checked.
fn ext4_errors(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count")).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 179:2 / / rw,noatime - ext4 /dev/root rw
95 27 7:0 / /mnt/sd\\040card rw,relatime - ext4 /dev/loop0 rw,emergency_ro,errors=remount-ro
96 27 7:1 / /mnt/ro ro,relatime - ext4 /dev/loop1 rw
97 96 7:1 /sub /mnt/ro/bind rw,relatime - ext4 /dev/loop1 rw
";

    #[test]
    fn a_mount_is_read_only_by_its_options_its_file_systems_or_ext4s_emergency() {
        let sd = mount_of(MOUNTINFO, 7, 0, Path::new("/mnt/sd card/state"));
        assert_eq!(
            sd,
            Some(Mount {
                point: "/mnt/sd card".into(),
                read_only: true
            }),
            "turned read-only after an error (emergency_ro)"
        );
        let root = mount_of(MOUNTINFO, 179, 2, Path::new("/var/lib/tapegate"));
        assert_eq!(root.map(|m| m.read_only), Some(false));
        let ro = mount_of(MOUNTINFO, 7, 1, Path::new("/mnt/ro/state"));
        assert_eq!(ro.map(|m| m.read_only), Some(true), "mounted ro");
        let bind = mount_of(MOUNTINFO, 7, 1, Path::new("/mnt/ro/bind/state"));
        assert_eq!(
            bind.map(|m| (m.point, m.read_only)),
            Some(("/mnt/ro/bind".into(), false)),
            "the longest mount point holding it"
        );
        assert_eq!(mount_of(MOUNTINFO, 8, 1, Path::new("/")), None);
    }

    #[test]
    fn a_writable_directory_is_not_read_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(why_read_only(dir.path()), None);
    }
}
