/*!
Where advertisements come from. Every source implements [`Source`]: it sends
advertisements into a bounded channel until it ends or is told to stop. Replay and
simulation are first-class sources beside BLE, not test hacks.
*/

use std::future::Future;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::record::Advertisement;

pub mod replay;
pub mod sim;

/// A stream of advertisements.
pub trait Source: Send {
    /// Sends every advertisement to `out` until the source ends, `stop` is cancelled or
    /// `out` is closed. Returns what it did.
    fn run(
        self,
        out: mpsc::Sender<Advertisement>,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<SourceReport, SourceError>> + Send;
}

/// What a source did before it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceReport {
    /// Advertisements sent on.
    pub adverts: u64,
    /// Input that could not be read (malformed replay lines), each logged.
    pub malformed: u64,
}

/// Why a source could not run.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read replay input {path}: {source}")]
    Replay {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
