//! What went wrong with the state database, and what the caller should do
//! ([`OutboxError`]). A leaf of the database layer (`db`): the outbox and the side
//! tables return it; it touches nothing of the crate.

use std::path::PathBuf;

/// What went wrong with the outbox, and what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The write failed and was rolled back (disk full, I/O error, locked): keep the
    /// data and try again later.
    #[error("outbox write failed and was rolled back ({0}); will retry")]
    WriteFailed(#[source] rusqlite::Error),
    /// The database cannot be used at all (permissions, newer schema).
    #[error("outbox {path} cannot be opened: {reason}")]
    Unusable { path: PathBuf, reason: String },
    /// The database was written by a newer tapegate (a downgrade): it is left untouched
    /// and the daemon refuses to start (exit 65, not restarted).
    #[error("outbox {path} has schema version {found}, newer than this tapegate {} reads ({known}): it was written by a newer tapegate, and a downgrade is not supported. Install that newer version again; the database is left untouched", env!("CARGO_PKG_VERSION"))]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// This process cannot write the database (its owner, its mode, a read-only file
    /// system): `why` says what fixes it. Retrying as it is will not.
    #[error("outbox {path} cannot be written: {why}")]
    NotWritable { path: PathBuf, why: String },
    /// Any other database error.
    #[error("outbox: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The owner thread is gone (the daemon is shutting down or it panicked).
    #[error("outbox owner thread has stopped")]
    Closed,
}

impl OutboxError {
    /// Whether the same operation may succeed later (so the caller keeps its data).
    pub fn is_retryable(&self) -> bool {
        matches!(self, OutboxError::WriteFailed(_))
    }
}
