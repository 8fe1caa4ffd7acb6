//! The commands a person runs beside the daemon, apart from the pipeline stages:
//! reading and changing the state database (`status`, `tapes`, `dead-letters`),
//! `decode`, `check`, `scan` and `demo`; and the operator's calls to the service
//! (`device`, `locate`, `history`, `message`). Each prints for a person or, where asked,
//! as JSON.

mod archive;
pub mod check;
pub mod client;
pub mod decode;
#[cfg(feature = "mock")]
pub mod demo;
pub mod device;
pub mod history;
pub mod locate;
pub mod message;
pub mod scan;
pub mod state;
pub mod support_bundle;

use crate::api::ApiError;
use crate::config::ConfigError;
use crate::outbox::OutboxError;
use crate::pipeline::RunError;

/// Why a command failed. `main` maps [`CmdError::Config`] to exit 2 and the rest to 1;
/// a closed stdout ([`CmdError::is_broken_pipe`]) ends the command quietly.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("no [service] section in the config: add [service] and [service.environments.<name>] (see config.example.toml)")]
    NoService,
    #[cfg(feature = "mock")]
    #[error("cannot start the mock service: {0}")]
    Mock(#[source] std::io::Error),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// The command line or its input cannot be used as given (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The command ran and said what failed (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl CmdError {
    /// The reader of our output went away (`tapegate tapes | head`).
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CmdError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}
