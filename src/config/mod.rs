/*!
Configuration in two phases: a raw serde layer (file, then `TAPEGATE_<SECTION>__<KEY>`
environment overrides), then one validation step that turns it into the typed
[`Config`] and reports every problem at once, each naming the key, the value and what
was expected. Loading has no side effects.

The parts, by seam:
- `raw`: the serde structs, one per section, unknown keys refused; each section is read
  on its own so one bad section does not hide the problems of the others.
- `env`: the `TAPEGATE_<SECTION>__<KEY>` overrides, layered onto the file's table.
- [`defaults`]: the one table of defaults, [`DEFAULTS`]; `config.example.toml` is held to
  it by a test.
- `validate`: raw to typed. Pure: what it needs from the machine comes in as a `Host`.
- `host`: the machine's side (host name, credentials directory) and the one read besides
  the file itself, the password file.
- this file: the typed [`Config`], the errors, and [`load`] / [`from_toml`], the shell
  that does the reading and calls the rest.
*/

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use url::Url;

use crate::dedup::DedupSettings;
use crate::outbox::Durability;
use crate::products::Products;
use crate::record::Mac;
use crate::secret::Secret;
use crate::source::sim::SimSettings;

pub mod defaults;
mod env;
mod host;
mod raw;
#[cfg(test)]
mod test_support;
mod validate;

pub use defaults::DEFAULTS;
use host::{Host, PasswordFile};
use raw::RawConfig;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: GatewaySettings,
    /// `None`: no `[service]` section; captures accumulate in the outbox.
    pub service: Option<ServiceSettings>,
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

impl MacFormat {
    /// `mac` as `mac_id` on the wire.
    pub fn format(self, mac: Mac) -> String {
        match self {
            MacFormat::Plain => mac.plain(),
            MacFormat::Colon => mac.colon(),
        }
    }
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
    /// `ble`: no advertisement for this long (once any was heard) restarts the scan;
    /// `None` (0 in the file): never.
    pub silence: Option<Duration>,
    /// `ble`: a scanner that cannot be brought back for this long ends the daemon (exit 1).
    pub give_up: Duration,
    /// `ble`: devices remembered at most; the least recently heard past it is forgotten
    /// (and removed from BlueZ), so rotating MACs cannot grow memory.
    pub max_devices: usize,
    /// `-` is stdin.
    pub replay_path: Option<PathBuf>,
    pub sim: SimSettings,
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
    /// Batches in flight at most (1..=64); the adaptive limit stays below it.
    pub max_in_flight: usize,
    /// A capture that fails on its own this many times (or that this many answers leave
    /// out) becomes a dead letter with the cause.
    pub max_attempts: u32,
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

/// The default config path (`--config` and `TAPEGATE_CONFIG` override it).
pub const DEFAULT_PATH: &str = "/etc/tapegate/config.toml";

/// Why a configuration was refused. Its `Display` lists every problem, one per line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source} (pass --config PATH or set TAPEGATE_CONFIG)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config {path} has {} problem(s):\n{}", .problems.len(), Problems(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// One problem: the key (dotted path), the value found (never for a secret), and what
/// was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub value: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{} = {}: {}", self.key, v, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {p}")?;
        }
        Ok(())
    }
}

/// Reads `path`, applies `TAPEGATE_<SECTION>__<KEY>` overrides from `env`, and validates.
pub fn load(
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    from_toml(&text, path, env)
}

/// Like [`load`], from the text of a config file (`path` names it in errors).
pub fn from_toml(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    from_toml_on(text, path, env, &Host::from_system())
}

/// [`from_toml`] on a given host: everything but reading the host itself. The password
/// file is read here, before validation, so that validation stays pure and still reports
/// its problem in the same place as any other.
fn from_toml_on(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    host: &Host,
) -> Result<Config, ConfigError> {
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
    let mut problems = Vec::new();
    env::apply(&mut table, env, &mut problems);
    let raw = RawConfig::from_table(table, &mut problems);
    let password_file = raw
        .password_file()
        .map(|file| PasswordFile::read(host.credential_path(file)));
    let config = validate::validate(raw, host, password_file.as_ref(), &mut problems);
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{problems, SERVICE};

    #[test]
    fn every_problem_is_reported_at_once_naming_key_value_and_expectation() {
        let text = format!(
            "{SERVICE}\n[flush]\nmax_batch = 300\n[outbox]\ndurability = \"maybe\"\n[scanner]\nsource = \"radio\"\n[dedup]\nwindow = 5\n[[products]]\nid = \"tape\"\nmanufacturer_id = 70000\n"
        );
        let p = problems(&text, &[]);
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
        assert!(
            has("flush.max_batch = 300: expected a whole number from 1 to 250"),
            "{shown:#?}"
        );
        assert!(
            has("outbox.durability = \"maybe\": expected one of full | normal"),
            "{shown:#?}"
        );
        assert!(
            has("scanner.source = \"radio\": expected one of ble | replay | sim"),
            "{shown:#?}"
        );
        assert!(has("dedup") && has("unknown field `window`"), "{shown:#?}");
        assert!(has("products[0].manufacturer_id = 70000"), "{shown:#?}");
        assert_eq!(p.len(), 5, "{shown:#?}");
    }
}
