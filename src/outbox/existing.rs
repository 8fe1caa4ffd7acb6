//! Opening an existing database for the CLI (`status`, `tapes`, `dead-letters`,
//! `check`): creating and migrating nothing, and read-only for a user who may read the
//! state directory but not write it. It touches `db` and the [`Store`] it returns.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::db::{read_counters, version_and_objects, OutboxError, SCHEMA_VERSION};
use super::store::{Store, StoreOptions};

/// How long `open_existing` waits for a database being created or migrated beside it
/// (steps of this, this many times): migrating takes milliseconds.
const MIGRATION_WAIT_STEP: Duration = Duration::from_millis(20);
const MIGRATION_WAIT_STEPS: u32 = 100;

impl Store {
    /// Opens an existing database for the CLI without creating or migrating anything.
    /// `Ok(None)` when there is no database yet.
    pub(super) fn open_existing(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = Self::path_in(state_dir);
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Self::existing(conn, path)
    }

    /// The daemon's database of `state_dir`, or a new one when the daemon has not run
    /// yet (the device commands, the rate window).
    pub(super) fn open_or_create(state_dir: &Path) -> Result<Store, OutboxError> {
        match Self::open_existing(state_dir)? {
            Some(store) => Ok(store),
            None => Ok(Store::open(state_dir, StoreOptions::default())?.0),
        }
    }

    /// Opens an existing database to read it only (`status`, `tapes`, `dead-letters
    /// list`, `check`), creating nothing, so that it works for a user who may read the
    /// state directory but not write it. Such a user cannot make the shared-memory file
    /// (`-shm`) a WAL database is read through: while the daemon runs it is there (and
    /// read as it is); when it is not, no one is writing, and the file is read as it
    /// lies on disk (SQLite's `immutable`), unless a write-ahead log left by a daemon
    /// that did not close it holds what the file lacks (then the error says whom to run
    /// as). `Ok(None)` when there is no database yet.
    pub(super) fn open_existing_read_only(state_dir: &Path) -> Result<Option<Store>, OutboxError> {
        let path = Self::path_in(state_dir);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(None);
        };
        let side = |suffix: &str| PathBuf::from(format!("{}{suffix}", path.display()));
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // The owner and root create the `-shm` as the owner's (SQLite hands it over).
        let euid = unsafe { libc::geteuid() };
        let may_create = {
            use std::os::unix::fs::MetadataExt;
            euid == 0 || euid == meta.uid()
        };
        let conn = if may_create || side("-shm").exists() {
            Connection::open_with_flags(&path, flags)?
        } else if side("-wal").metadata().is_ok_and(|m| m.len() > 0) {
            return Err(OutboxError::Unusable {
                path,
                reason: "the daemon is not running and left a write-ahead log (-wal) that only its user can apply: run this as that user or root, or start the daemon".into(),
            });
        } else {
            Connection::open_with_flags(
                format!("file:{}?immutable=1", uri_path(&path)),
                flags | OpenFlags::SQLITE_OPEN_URI,
            )?
        };
        Self::existing(conn, path)
    }

    fn existing(conn: Connection, path: PathBuf) -> Result<Option<Store>, OutboxError> {
        conn.busy_timeout(Duration::from_secs(5))?;
        // One snapshot of both: a daemon beside us may be committing its first step.
        let read_version = || version_and_objects(&conn).map(|(version, _)| version);
        let (mut version, tables) = version_and_objects(&conn)?;
        if version == 0 && tables == 0 {
            // The daemon has created the file but not yet committed its schema (it is
            // starting right now), or the file is empty: either way nothing is stored yet.
            return Ok(None);
        }
        // A daemon starting beside us may be migrating it, one step a transaction:
        // give it the moment that takes before calling the version wrong.
        for _ in 0..MIGRATION_WAIT_STEPS {
            if version == 0 || version >= SCHEMA_VERSION {
                break;
            }
            std::thread::sleep(MIGRATION_WAIT_STEP);
            version = read_version()?;
        }
        if version != SCHEMA_VERSION {
            return Err(OutboxError::Unusable {
                path,
                reason: format!("schema version {version}, this tapegate reads {SCHEMA_VERSION}"),
            });
        }
        let counters = read_counters(&conn)?;
        Ok(Some(Store::from_parts(
            conn,
            StoreOptions::default(),
            counters,
            path,
            None,
        )))
    }
}

/// `path` for a `file:` URI: every byte but the plainest percent-encoded (SQLite
/// decodes them back into the bytes of the name).
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    const PATH: &percent_encoding::AsciiSet = &crate::text::UNRESERVED.remove(b'/');
    percent_encoding::percent_encode(path.as_os_str().as_bytes(), PATH).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_uri_path_keeps_slashes_and_encodes_what_a_uri_would_read_otherwise() {
        assert_eq!(
            uri_path(Path::new("/var/lib/tapegate/outbox.db")),
            "/var/lib/tapegate/outbox.db"
        );
        assert_eq!(
            uri_path(Path::new("/tmp/a b?c#d%e/é~")),
            "/tmp/a%20b%3Fc%23d%25e/%C3%A9~"
        );
    }
}

#[cfg(test)]
mod beside_a_daemon {
    use super::*;

    /// The CLI reading the state directory while a daemon creates and migrates the
    /// database beside it sees either no database yet or the finished one, never a
    /// version in between (CI once saw "schema version 0" here: the version and the
    /// schema had been read in two transactions, with the daemon's first step between).
    #[test]
    fn a_database_being_created_beside_the_cli_reads_as_absent_or_finished() {
        for _ in 0..100 {
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().to_path_buf();
            let daemon = std::thread::spawn({
                let state = state.clone();
                move || drop(Store::open(&state, StoreOptions::default()).unwrap())
            });
            loop {
                let done = daemon.is_finished();
                match Store::open_existing_read_only(&state) {
                    Ok(Some(_)) => break,
                    Ok(None) if !done => {}
                    Ok(None) => panic!("the daemon finished but the database reads as absent"),
                    Err(e) => panic!("read beside its creation: {e}"),
                }
            }
            daemon.join().unwrap();
        }
    }

    /// The daemon's first start and an operator's `tapegate activate` (which creates
    /// the database when the daemon has not run yet) at the same moment: both end with
    /// the one finished database; neither fails, and neither takes the other's
    /// half-built schema for a foreign file and moves it aside.
    #[test]
    fn the_daemon_and_an_operator_creating_the_database_at_once_both_open_it() {
        for _ in 0..100 {
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().to_path_buf();
            let daemon = std::thread::spawn({
                let state = state.clone();
                move || Store::open(&state, StoreOptions::default()).map(|(_, report)| report)
            });
            let operator = Store::open_or_create(&state);
            let report = daemon.join().unwrap();
            let report = report.unwrap_or_else(|e| panic!("the daemon, beside: {e}"));
            operator.unwrap_or_else(|e| panic!("the operator, beside: {e}"));
            assert_eq!(report.quarantined, None, "a fresh database moved aside");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.contains("corrupt"))
                .collect();
            assert!(names.is_empty(), "{names:?}");
        }
    }
}
