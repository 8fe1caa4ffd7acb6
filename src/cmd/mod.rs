//! The commands, one file each, thin over the library: `run` (the daemon), reading and
//! changing the state database (`status`, `tapes`, `dead-letters`), `decode`, `check`,
//! `scan`, `side-channel`, `support-bundle` and `demo`; and the operator's calls to the
//! service (`device`, `locate`, `history`, `message`). Each prints for a person or,
//! where asked, as JSON; `main` only picks one. Commands may touch the whole library.

mod archive;
pub mod check;
pub mod cli;
pub mod dead_letters;
pub mod decode;
#[cfg(feature = "mock")]
pub mod demo;
pub mod device;
pub mod history;
pub mod locate;
pub mod message;
pub mod operator_run;
pub mod run;
pub mod scan;
pub mod side_channel;
pub mod status;
pub mod support_bundle;
pub mod tapes;

use std::future::Future;
use std::pin::Pin;

use crate::api::ApiError;
use crate::config::ConfigError;
use crate::outbox::OutboxError;
use crate::pipeline::RunError;
use crate::util::systemd::stop_signals;

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
    /// The command's runtime or its stop signals cannot be had.
    #[error(transparent)]
    Runtime(std::io::Error),

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

/// Runs a command's future on a runtime of its own (one thread: a command does one thing
/// at a time).
pub fn block_on<F: Future>(future: F) -> Result<F::Output, CmdError> {
    Ok(runtime().map_err(CmdError::Runtime)?.block_on(future))
}

/// What ends a command that runs until stopped: SIGTERM or SIGINT.
pub type Stop = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `command` on a runtime of its own until it ends, given the stop signals; work
/// left blocked (a read of stdin, which cannot be interrupted) is not waited for.
pub fn until_stopped<F: Future>(command: impl FnOnce(Stop) -> F) -> std::io::Result<F::Output> {
    let rt = runtime()?;
    let output = rt.block_on(async {
        let stop = stop_signals()?;
        Ok(command(Box::pin(stop)).await)
    });
    rt.shutdown_background();
    output
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}
