//! Why the daemon stopped with an error, and which of those a restart will not mend (the
//! binary maps them to exit codes). A leaf of the pipeline: it names the stages' errors
//! and touches nothing.

use crate::api::ApiError;
use crate::http::BindError;
use crate::outbox::{LockError, OutboxError};
use crate::source::SourceError;

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Another daemon owns the state directory.
    #[error(transparent)]
    Locked(#[from] LockError),
    #[error("cannot start the outbox thread: {0}")]
    OutboxThread(#[source] std::io::Error),
    #[error("cannot set up the service client: {0}")]
    Client(#[source] ApiError),
    #[error(transparent)]
    Http(#[from] BindError),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::SetupError),
    #[error("cannot listen for {signal}: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A stage's task panicked or was cancelled; the cause is kept.
    #[error("the {stage} stage failed: {source}")]
    Stage {
        stage: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl RunError {
    /// The configured source cannot work on this machine (see
    /// [`SourceError::cannot_work_here`]): a restart will not help.
    pub fn source_cannot_work_here(&self) -> bool {
        matches!(self, RunError::Source(e) if e.cannot_work_here())
    }

    /// The state database was written by a newer tapegate: a restart will not help.
    pub fn database_too_new(&self) -> bool {
        matches!(self, RunError::Outbox(OutboxError::SchemaTooNew { .. }))
    }

    /// This user cannot write the state directory or its database (owner, mode, a
    /// read-only file system): a restart will not help until someone fixes it as the
    /// error says.
    pub fn state_not_writable(&self) -> bool {
        matches!(
            self,
            RunError::Outbox(OutboxError::NotWritable { .. })
                | RunError::Locked(LockError::NotWritable { .. })
        )
    }

    pub(super) fn stage(stage: &'static str) -> impl FnOnce(tokio::task::JoinError) -> RunError {
        move |source| RunError::Stage { stage, source }
    }
}
