//! Who may create and write the state: the state directory belongs to the daemon's user
//! (the unit's `StateDirectory=`), and nothing in it may end up owned by someone else,
//! or the daemon could not write it. A technician's `sudo tapegate device show ...`
//! before the first start used to create `outbox.db` owned by root; the daemon then
//! opened it read-only and admitted nothing while looking healthy.
//!
//! So: a database is created only by the directory's owner, or by root, who hands the
//! new file to the directory's owner (SQLite gives the `-wal` and `-shm` files it
//! creates as root the owner and mode of the database file); anyone else is refused
//! with the user to run as. And when a database cannot be written, [`why_unwritable`]
//! says why (owner, mode, a read-only file system: `storage.rs`) and what fixes it, for
//! the daemon's ERROR at start and for `/healthz`.
//!
//! It touches only the file system (no database) and `storage.rs`; `open.rs` and the
//! outbox's state lock call it.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::storage::why_read_only;

/// Creates the state directory (and any missing parent) for its owner alone (0700),
/// whatever the umask: captures, readings and the rate window are nobody else's. An
/// existing directory keeps its mode (the unit's `StateDirectoryMode=` may open it to
/// a group on purpose).
pub(crate) fn create_state_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Creates an empty database file at `path` readable and writable by its owner alone
/// (0600), unless one is there; SQLite takes an empty file for a new database. The
/// file belongs to the state directory's owner: created by that user, or by root and
/// handed over. Anyone else is refused (the reason names the user to run as).
pub(crate) fn create_private_file(path: &Path) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let owner =
        std::fs::metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let me = euid();
    if me != 0 && me != owner.uid() {
        return Err(format!(
            "the state directory {} belongs to {}, and a database created by {} would be theirs, which the daemon could not write: run this as {} (sudo -u {} tapegate ...), or start the daemon first",
            dir.display(),
            user(owner.uid()),
            user(me),
            user_name(owner.uid()).unwrap_or_else(|| format!("uid {}", owner.uid())),
            user_name(owner.uid()).unwrap_or_else(|| format!("#{}", owner.uid())),
        ));
    }
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
    };
    if me != owner.uid() {
        hand_over(&file, owner.uid(), owner.gid()).map_err(|e| {
            format!(
                "cannot give {} to {}: {e}",
                path.display(),
                user(owner.uid())
            )
        })?;
    }
    Ok(())
}

fn hand_over(file: &File, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::fchown(file, Some(uid), Some(gid))
}

/// Why this process cannot write the database at `db` (or create it, or its `-wal` and
/// `-shm` beside it), with the fix, or `None` when nothing says it cannot.
pub(crate) fn why_unwritable(db: &Path) -> Option<String> {
    let dir = db.parent().unwrap_or(Path::new("."));
    let me = euid();
    if let Some(why) = why_read_only(dir) {
        return Some(why);
    }
    let mut paths = vec![db.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        paths.push(PathBuf::from(format!("{}{suffix}", db.display())));
    }
    for path in paths.iter().filter(|p| p.exists()) {
        if writable(path) {
            continue;
        }
        let Ok(m) = std::fs::metadata(path) else {
            continue;
        };
        let glob = format!("{}*", db.display());
        return Some(if m.uid() != me {
            format!(
                "{} is owned by {}, not by this daemon's user {} (mode {:04o}). Fix: sudo chown {}: {glob} (an operator command run as another user made it), then start again",
                path.display(),
                user(m.uid()),
                user(me),
                m.mode() & 0o7777,
                user_name(me).unwrap_or_else(|| me.to_string()),
            )
        } else {
            format!(
                "{} is not writable (mode {:04o}). Fix: chmod u+rw {glob}",
                path.display(),
                m.mode() & 0o7777
            )
        });
    }
    if !writable(dir) {
        let m = std::fs::metadata(dir).ok()?;
        return Some(format!(
            "the state directory {} is not writable by this daemon's user {} (owned by {}, mode {:04o}). Fix: sudo chown {}: {}",
            dir.display(),
            user(me),
            user(m.uid()),
            m.mode() & 0o7777,
            user_name(me).unwrap_or_else(|| me.to_string()),
            dir.display()
        ));
    }
    None
}

fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() }
}

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// access(2) with the effective ids, as the kernel will judge an open.
fn writable(path: &Path) -> bool {
    let Some(p) = c_path(path) else { return true };
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::faccessat(libc::AT_FDCWD, p.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

/// `tapegate (uid 999)`, or `uid 999` for a uid without a name.
pub(crate) fn user(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

fn user_name(uid: u32) -> Option<String> {
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r(3) writes into `pw` and `buf`, which outlive the call, and
    // sets `found` to `&pw` or null.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points into `buf`, NUL-terminated by getpwuid_r.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_is_0600_and_a_writable_one_has_nothing_to_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("outbox.db");
        create_private_file(&db).unwrap();
        let m = std::fs::metadata(&db).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.uid(), euid());
        assert_eq!(why_unwritable(&db), None);
        assert_eq!(user(0), "root (uid 0)");
    }
}
