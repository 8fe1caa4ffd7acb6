//! One owner per state directory: `tapegate run` holds an exclusive `flock` on a lock
//! file in `gateway.state_dir` for its whole life. Two daemons on one outbox would
//! both deliver every capture; the second is refused at start instead, naming the
//! directory and the PID of the one that holds it. The operator's commands (`status`,
//! `tapes`, `dead-letters`, `check`) take no lock and keep working beside the daemon.
//!
//! `flock` is released by the kernel when the process dies however it dies, so a
//! crashed daemon never leaves a stale lock behind; the PID written in the file is only
//! for the message.
//!
//! It touches only the database layer's access rules (to say why a lock file cannot be
//! written); no database.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file inside `gateway.state_dir`.
pub const LOCK_FILE: &str = "tapegate.lock";

/// Why the state directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another tapegate{} already runs on the state directory {}: only one daemon may own it (stop that one first; `tapegate status` works beside it)", pid_text(.pid), .dir.display())]
    Held { dir: PathBuf, pid: Option<u32> },
    #[error("cannot lock the state directory {}: {source}", .dir.display())]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The state directory cannot be written by this user: `why` says what fixes it.
    #[error("{why}")]
    NotWritable { dir: PathBuf, why: String },
}

fn pid_text(pid: &Option<u32>) -> String {
    pid.map(|p| format!(" (PID {p})")).unwrap_or_default()
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the state directory (creating it if needed), or says who holds it.
    pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
        let io = |source: std::io::Error| {
            let denied = matches!(
                source.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            );
            match crate::db::why_unwritable(&state_dir.join(LOCK_FILE)).filter(|_| denied) {
                Some(why) => LockError::NotWritable {
                    dir: state_dir.to_path_buf(),
                    why,
                },
                None => LockError::Io {
                    dir: state_dir.to_path_buf(),
                    source,
                },
            }
        };
        crate::db::create_state_dir(state_dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(state_dir.join(LOCK_FILE))
            .map_err(io)?;
        // SAFETY: flock(2) on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(err));
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(LockError::Held {
                dir: state_dir.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(StateLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_with_the_directory_and_the_pid_of_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = StateLock::acquire(&state).unwrap();
        let err = StateLock::acquire(&state).unwrap_err();
        match &err {
            LockError::Held { dir, pid } => {
                assert_eq!(dir, &state);
                assert_eq!(*pid, Some(std::process::id()));
            }
            other => panic!("{other:?}"),
        }
        let shown = err.to_string();
        assert!(shown.contains(&state.display().to_string()), "{shown}");
        assert!(
            shown.contains(&format!("PID {}", std::process::id())),
            "{shown}"
        );
        drop(first);
        assert!(StateLock::acquire(&state).is_ok(), "released when dropped");
    }
}
