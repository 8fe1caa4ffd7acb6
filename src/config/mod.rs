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

use crate::clock::ClockSettings;
use crate::dedup::DedupSettings;
use crate::outbox::Durability;
use crate::products::Products;
use crate::record::Mac;
use crate::secret::Secret;
use crate::source::sim::SimSettings;

pub mod defaults;
pub mod effective;
mod env;
mod host;
mod raw;
mod retention;
mod telemetry;
#[cfg(test)]
pub(crate) mod test_support;
mod validate;

pub use defaults::DEFAULTS;
pub use host::world_readable_password;
use host::{CaFileRead, Host, PasswordFile};
use raw::RawConfig;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: GatewaySettings,
    /// `None`: no `[service]` section (captures accumulate in the outbox), or loaded
    /// with [`Password::Skip`].
    pub service: Option<ServiceSettings>,
    pub products: Products,
    pub scanner: ScannerSettings,
    pub dedup: DedupSettings,
    pub outbox: OutboxSettings,
    pub flush: FlushSettings,
    pub readings: ReadingsSettings,
    pub log: LogSettings,
    pub http: HttpSettings,
    /// `[telemetry]`: where the metrics are pushed; `None`: nowhere (the default).
    pub telemetry: Option<TelemetrySettings>,
    /// The operator commands' settings (`device`, `locate`, `history`); `None` without
    /// a `[service]` section.
    pub operator: Option<OperatorSettings>,
}

#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub id: String,
    pub state_dir: PathBuf,
    pub shutdown_grace: Duration,
    /// When captures are held for an untrusted clock.
    pub clock: ClockSettings,
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
    /// `[service] ca_file`: CA certificates trusted besides the system's.
    pub ca_file: Option<CaFile>,
    /// The selected environment's settings.
    pub endpoint: EnvironmentSettings,
}

/// A PEM file of CA certificates, as read and checked when the config was loaded.
#[derive(Clone)]
pub struct CaFile {
    pub path: PathBuf,
    /// The PEM text (one or more certificates).
    pub pem: Vec<u8>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
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

/// What the operator commands need beyond the decode client: the history address and
/// the defaults of `device add` and `device label`, from the selected environment, and
/// the length of the service's rate window.
#[derive(Debug, Clone)]
pub struct OperatorSettings {
    /// `None`: not configured; `tapegate history` says which key to set.
    pub historical_base_url: Option<Url>,
    pub history_operation_id: Option<String>,
    pub default_app_id: Option<String>,
    pub default_tape_type: String,
    pub rate_window: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Ble,
    Replay,
    Sim,
}

impl SourceKind {
    /// As `scanner.source` names it.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Ble => "ble",
            SourceKind::Replay => "replay",
            SourceKind::Sim => "sim",
        }
    }
}

/// `scanner.adverts`: where the `ble` source reads adverts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvertsPath {
    /// The kernel's management socket when it can be opened, else D-Bus.
    Auto,
    /// The kernel's management socket, or the source cannot work (exit 3).
    Mgmt,
    /// BlueZ's D-Bus signals.
    Dbus,
}

/// `scanner.scan`: how the radio scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Discovery over D-Bus: the radio sends scan requests, scan responses are heard.
    Active,
    /// An advertisement monitor of the kernel (management socket): the radio only
    /// listens; data only in scan responses is never heard.
    Passive,
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
    /// `ble`: where adverts are read.
    pub adverts: AdvertsPath,
    /// `ble`: how the radio scans.
    pub scan: ScanMode,
    /// `-` is stdin.
    pub replay_path: Option<PathBuf>,
    pub sim: SimSettings,
}

#[derive(Debug, Clone)]
pub struct OutboxSettings {
    pub max_pending: u64,
    pub durability: Durability,
    pub commit_interval: Duration,
    /// `max_age_secs`; `None` (0 in the file): no age bound.
    pub max_age: Option<Duration>,
    /// `max_bytes`; `None` (0 in the file): no size bound.
    pub max_bytes: Option<u64>,
}

impl OutboxSettings {
    /// The age and size bounds, as the store takes them.
    pub fn retention(&self) -> crate::outbox::Retention {
        crate::outbox::Retention {
            max_age_ms: self.max_age.map(|d| d.as_millis() as i64),
            max_bytes: self.max_bytes,
        }
    }
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

#[derive(Debug, Clone, Default)]
pub struct HttpSettings {
    /// Where /metrics, /healthz and the status page are served; `None`: nowhere.
    pub listen: Option<std::net::SocketAddr>,
}

/// `[telemetry]`: the metrics of `/metrics`, pushed to a Prometheus remote-write
/// receiver (see [`crate::telemetry`]).
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    pub url: Url,
    pub interval: Duration,
    pub timeout: Duration,
    /// Pushes kept while the receiver cannot be reached; the oldest go first.
    pub max_buffered: usize,
    /// CA certificates trusted besides the system's, for the receiver.
    pub ca_file: Option<CaFile>,
    pub auth: TelemetryAuth,
}

/// How the receiver is told who pushes. A credential is `None` when the config was
/// loaded without reading secrets ([`Password::Skip`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TelemetryAuth {
    None,
    Basic {
        username: String,
        password: Option<Secret>,
    },
    Bearer(Option<Secret>),
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

/// Whether loading reads the service password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Password {
    /// Read it: the caller talks to the service (`run`, `check`, the operator commands).
    #[default]
    Read,
    /// Leave it unread, and the `[service]` settings out of the result (`service` is
    /// `None`), every other key validated as usual: for what does not talk to the
    /// service (`status`, `tapes`, `dead-letters`, `scan`, `check --config-only`, a
    /// reload), so that it works where the password cannot be read (outside the unit,
    /// as another user, in `ExecReload=`).
    Skip,
}

/// Reads `path`, applies `TAPEGATE_<SECTION>__<KEY>` overrides from `env`, and validates,
/// reading the password.
pub fn load(
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    load_with(path, env, Password::Read)
}

/// [`load`] with the password read or not.
pub fn load_with(
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    password: Password,
) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    from_toml_on(&text, path, env, &Host::from_system(), password)
}

/// Like [`load`], from the text of a config file (`path` names it in errors, and a
/// relative `password_file` is looked up beside it).
pub fn from_toml(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    from_toml_on(text, path, env, &Host::from_system(), Password::Read)
}

/// [`from_toml`] on a given host: everything but reading the host itself. The password
/// file is read here, before validation, so that validation stays pure and still reports
/// its problem in the same place as any other.
fn from_toml_on(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    host: &Host,
    password: Password,
) -> Result<Config, ConfigError> {
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: syntax_message(text, &e),
            })?;
    let mut problems = Vec::new();
    env::apply(&mut table, env, &mut problems);
    let raw = RawConfig::from_table(table, &mut problems);
    let password_file = raw
        .password_file()
        .filter(|_| password == Password::Read)
        .map(|file| PasswordFile::read(host.password_path(file, path)));
    let ca_file = raw.ca_file().map(CaFileRead::read);
    let telemetry_secret = raw
        .telemetry
        .secret_file()
        .filter(|_| password == Password::Read)
        .map(|file| PasswordFile::read(host.password_path(file, path)));
    let telemetry_ca = raw.telemetry.ca_file.as_deref().map(CaFileRead::read);
    let files = validate::Files {
        password_file: password_file.as_ref(),
        ca_file: ca_file.as_ref(),
        telemetry: telemetry::TelemetryFiles {
            secret: telemetry_secret.as_ref(),
            ca_file: telemetry_ca.as_ref(),
        },
        password,
    };
    let config = validate::validate(raw, host, files, &mut problems);
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

/// Where a TOML syntax error is and what is wrong, without the text of the line: the
/// parser's own message quotes the line, and that line may hold the password. The key
/// of the line is named when there is one; the parser's words are left out too when
/// that key holds a secret (they can quote a character of the value).
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return "a syntax error (position unknown)".into();
    };
    let before = text.get(..at).unwrap_or("");
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').trim())
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        });
    let what = e.message().lines().next().unwrap_or("").trim();
    match key {
        Some(k) if crate::secret::is_secret_key(k) => {
            format!("line {line_no}, column {column}, in the value of `{k}` (not shown: it is a secret)")
        }
        Some(k) => format!("line {line_no}, column {column}, key `{k}`: {what}"),
        None => format!("line {line_no}, column {column}: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{problems, test_host, SERVICE};
    use super::*;

    /// `status`, `tapes`, `dead-letters`, `scan`, `check --config-only` and a reload work
    /// where the password cannot be read (the unit stopped, `ExecReload=`), and still
    /// refuse a config that is wrong elsewhere, in `[service]` too.
    #[test]
    fn what_does_not_talk_to_the_service_never_reads_the_password() {
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            "password_file = \"/nonexistent/pw\"",
        );
        let path = Path::new("test.toml");
        let local = |text: &str| from_toml_on(text, path, [], &test_host(), Password::Skip);
        let c = local(&text).unwrap();
        assert!(c.service.is_none());
        let read = from_toml_on(&text, path, [], &test_host(), Password::Read).unwrap_err();
        assert!(
            read.to_string().contains("password_file = /nonexistent/pw"),
            "{read}"
        );

        let bad_url = text.replace("https://api.example.com/", "not a url");
        let e = local(&bad_url).unwrap_err();
        assert!(e.to_string().contains("base_url = \"not a url\""), "{e}");
        let both = text.replace(
            "[service.environments.ppe]",
            "[service.environments.ppe]\npassword = \"x\"",
        );
        let e = local(&both).unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
    }

    #[test]
    fn a_syntax_error_on_the_password_line_names_the_place_but_never_the_value() {
        let text = SERVICE.replace("password = \"s3cr3t-value\"", "password = \"s3cr3t-value");
        let err = super::test_support::parse(&text, &[]).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(
            shown.contains("line 10") && shown.contains("`password`"),
            "{shown}"
        );
        // Elsewhere the parser's words help and are kept.
        let err = super::test_support::parse("[flush]\nmax_batch = = 3\n", &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("line 2, column 13, key `max_batch`: "),
            "{err}"
        );
    }

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
