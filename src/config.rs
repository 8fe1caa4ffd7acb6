/*!
Configuration in two phases: a raw serde layer (file, then `TAPEGATE_<SECTION>__<KEY>`
environment overrides), then one validation step that turns it into the typed
[`Config`] and reports every problem at once, each naming the key, the value and what
was expected. Loading has no side effects.
*/

use std::path::PathBuf;
use std::time::Duration;

use url::Url;

use crate::dedup::DedupSettings;
use crate::products::Products;
use crate::secret::Secret;
use crate::source::sim::SimSettings;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: GatewaySettings,
    pub service: ServiceSettings,
    pub products: Products,
    pub scanner: ScannerSettings,
    pub dedup: DedupSettings,
    pub outbox: OutboxSettings,
    pub flush: FlushSettings,
    pub readings: ReadingsSettings,
    pub log: LogSettings,
}

#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub id: String,
    pub state_dir: PathBuf,
    pub shutdown_grace: Duration,
}

/// `mac_id` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacFormat {
    /// `AABBCCDDEEFF` (default).
    Plain,
    /// `AA:BB:CC:DD:EE:FF`.
    Colon,
}

#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Name of the selected environment.
    pub environment: String,
    pub mac_format: MacFormat,
    pub request_timeout: Duration,
    /// The selected environment's settings.
    pub endpoint: EnvironmentSettings,
}

/// Everything onboarding hands out for one environment.
#[derive(Debug, Clone)]
pub struct EnvironmentSettings {
    pub base_url: Url,
    pub auth_url: Url,
    pub client_id: String,
    pub audience: String,
    pub username: String,
    pub password: Secret,
    pub customer_id: String,
    pub authorized_groups: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Ble,
    Replay,
    Sim,
}

#[derive(Debug, Clone)]
pub struct ScannerSettings {
    pub source: SourceKind,
    pub adapter: Option<String>,
    /// `-` is stdin.
    pub replay_path: Option<PathBuf>,
    pub sim: SimSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every committed group is on disk before it counts as accepted (fsync per commit).
    Full,
    /// A power cut can lose the last commits (WAL synced only at checkpoints); a crash of
    /// the process cannot.
    Normal,
}

#[derive(Debug, Clone)]
pub struct OutboxSettings {
    pub max_pending: u64,
    pub durability: Durability,
    pub commit_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct FlushSettings {
    /// 1..=250.
    pub max_batch: usize,
    pub max_delay: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

#[derive(Debug, Clone)]
pub struct ReadingsSettings {
    /// Decoded readings older than this are deleted (the latest of each tape is kept).
    pub retention: Duration,
}

#[derive(Debug, Clone)]
pub struct LogSettings {
    /// A tracing filter (`info`, `tapegate=debug`); `RUST_LOG` wins when set.
    pub level: String,
}
