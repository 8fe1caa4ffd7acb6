//! Opening the state database, for every user of the file: the daemon's open
//! (creating the state directory and the file, checking and migrating it, moving a
//! corrupt one aside, refusing one it cannot write with the fix), the CLI's opens of
//! an existing file (creating and migrating nothing; read-only for a user who may read
//! the state directory but not write it), and the open of a command that may be the
//! first to need the file. Each returns the connection: what is kept over it belongs to
//! its owner (the outbox's store, the side tables' handles).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::access::{create_private_file, create_state_dir, why_unwritable};
use super::schema::{version_and_objects, Broken, SCHEMA_VERSION};
use super::{connect, OutboxError, DB_FILE};
use crate::config::Durability;

/// How long [`existing`] waits for a database being created or migrated beside it
/// (steps of this, this many times): migrating takes milliseconds.
const MIGRATION_WAIT_STEP: Duration = Duration::from_millis(20);
const MIGRATION_WAIT_STEPS: u32 = 100;

/// The database file of `state_dir`.
pub(crate) fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(DB_FILE)
}

/// A database opened for writing, and where a corrupt one found there was moved.
pub(crate) struct Writable {
    pub(crate) conn: Connection,
    /// Where a corrupt database was moved, and why it was.
    pub(crate) quarantined: Option<(PathBuf, String)>,
}

/// Opens the database of `state_dir` for writing (creating the directory and the file
/// if needed), checked and migrated, with the pragmas of `durability` and
/// `max_page_count`. A corrupt database is moved aside (named with `stamp`, epoch ms)
/// and a fresh one started; a database this user cannot write is refused with why.
pub(crate) fn writable(
    state_dir: &Path,
    durability: Durability,
    max_page_count: Option<u32>,
    stamp: i64,
) -> Result<Writable, OutboxError> {
    let path = path_in(state_dir);
    create_state_dir(state_dir).map_err(|e| OutboxError::Unusable {
        path: path.clone(),
        reason: format!("cannot create {}: {e}", state_dir.display()),
    })?;
    let mut quarantined = None;
    let conn = match file(&path, durability, max_page_count) {
        Ok(conn) => conn,
        Err(Broken::Corrupt(reason)) => {
            let aside = quarantine(&path, stamp).map_err(|e| OutboxError::Unusable {
                path: path.clone(),
                reason: format!("it is corrupt ({reason}) and cannot be moved aside: {e}"),
            })?;
            quarantined = Some((aside, reason));
            file(&path, durability, max_page_count).map_err(|b| b.into_error(&path))?
        }
        Err(b) => {
            // Most often a file this user cannot write: say whose it is and the fix.
            return Err(match why_unwritable(&path) {
                Some(why) => OutboxError::NotWritable { path, why },
                None => b.into_error(&path),
            });
        }
    };
    // SQLite opens a file it may read but not write read-only, silently: every commit
    // would then fail. Said now, with the fix.
    let read_only = conn
        .is_readonly(rusqlite::DatabaseName::Main)
        .unwrap_or(false);
    if let Some(why) = why_unwritable(&path)
        .or_else(|| read_only.then(|| "SQLite could open it only read-only".to_string()))
    {
        return Err(OutboxError::NotWritable { path, why });
    }
    Ok(Writable { conn, quarantined })
}

/// Opens the database at `path` for writing (created `0600` if it is not there),
/// checked and migrated ([`connect`]).
pub(crate) fn file(
    path: &Path,
    durability: Durability,
    max_page_count: Option<u32>,
) -> Result<Connection, Broken> {
    create_private_file(path).map_err(Broken::Other)?;
    connect(path, durability, max_page_count)
}

/// The daemon's database of `state_dir`, or a new one when the daemon has not run yet
/// (the device commands, the rate window).
pub(crate) fn existing_or_new(state_dir: &Path) -> Result<Connection, OutboxError> {
    match existing(state_dir)? {
        Some(conn) => Ok(conn),
        None => {
            let stamp = crate::clock::system().wall_ms();
            Ok(writable(state_dir, Durability::Full, None, stamp)?.conn)
        }
    }
}

/// Opens an existing database for the CLI without creating or migrating anything.
/// `Ok(None)` when there is no database yet.
pub(crate) fn existing(state_dir: &Path) -> Result<Option<Connection>, OutboxError> {
    let path = path_in(state_dir);
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    checked(conn, path)
}

/// Opens an existing database to read it only (`status`, `tapes`, `dead-letters
/// list`, `check`), creating nothing, so that it works for a user who may read the
/// state directory but not write it. Such a user cannot make the shared-memory file
/// (`-shm`) a WAL database is read through: while the daemon runs it is there (and
/// read as it is); when it is not, no one is writing, and the file is read as it
/// lies on disk (SQLite's `immutable`), unless a write-ahead log left by a daemon
/// that did not close it holds what the file lacks (then the error says whom to run
/// as). `Ok(None)` when there is no database yet.
pub(crate) fn existing_read_only(state_dir: &Path) -> Result<Option<Connection>, OutboxError> {
    let path = path_in(state_dir);
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
    checked(conn, path)
}

/// The connection to an existing file, once its schema is this tapegate's (waiting
/// out a migration beside it); `Ok(None)` for a file with no schema yet.
fn checked(conn: Connection, path: PathBuf) -> Result<Option<Connection>, OutboxError> {
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
    Ok(Some(conn))
}

/// Moves a corrupt database (and its WAL and shared-memory files) aside; returns the
/// new path of the main file.
fn quarantine(path: &Path, stamp: i64) -> std::io::Result<PathBuf> {
    let aside = PathBuf::from(format!("{}.corrupt-{stamp}", path.display()));
    std::fs::rename(path, &aside)?;
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", path.display()));
        if side.exists() {
            let to = PathBuf::from(format!("{}{suffix}", aside.display()));
            std::fs::rename(&side, &to)?;
        }
    }
    Ok(aside)
}

/// `path` for a `file:` URI: every byte but the plainest percent-encoded (SQLite
/// decodes them back into the bytes of the name).
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    const PATH: &percent_encoding::AsciiSet = &crate::util::text::UNRESERVED.remove(b'/');
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
                move || drop(writable(&state, Durability::Full, None, 0).unwrap())
            });
            loop {
                let done = daemon.is_finished();
                match existing_read_only(&state) {
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
                move || writable(&state, Durability::Full, None, 0).map(|w| w.quarantined)
            });
            let operator = existing_or_new(&state);
            let report = daemon.join().unwrap();
            let quarantined = report.unwrap_or_else(|e| panic!("the daemon, beside: {e}"));
            operator.unwrap_or_else(|e| panic!("the operator, beside: {e}"));
            assert!(quarantined.is_none(), "a fresh database moved aside");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.contains("corrupt"))
                .collect();
            assert!(names.is_empty(), "{names:?}");
        }
    }
}
