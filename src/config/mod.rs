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
use crate::outbox::Durability;
use crate::products::Products;
use crate::record::Mac;
use crate::secret::Secret;
use crate::source::sim::SimSettings;

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

// ---------------------------------------------------------------------------------------
// Phase 1: raw layers.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use crate::products::{expand_uuid, PacketEncoding, PacketSource, Product};

/// The default config path (`--config` and `TAPEGATE_CONFIG` override it).
pub const DEFAULT_PATH: &str = "/etc/tapegate/config.toml";

/// Prefix of environment overrides: `TAPEGATE_<SECTION>__<KEY>`.
const ENV_PREFIX: &str = "TAPEGATE_";

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
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
    let mut problems = Vec::new();
    apply_env(&mut table, env, &mut problems);
    let raw = RawConfig::from_table(table, &mut problems);
    let config = validate(raw, path, &mut problems);
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

/// Applies `TAPEGATE_GATEWAY__ID=dock-7` style overrides. Segments are lower-cased;
/// a numeric segment indexes an array (`TAPEGATE_PRODUCTS__0__ID`). A value is read as
/// a TOML value when it is one (`100`, `true`, `0x0EF7`) unless the file has a string
/// there, and as a plain string otherwise.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
    problems: &mut Vec<Problem>,
) {
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
        .collect();
    vars.sort();
    for (name, raw) in vars {
        let segments: Vec<String> = name[ENV_PREFIX.len()..]
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        if segments.iter().any(|s| s.is_empty()) {
            problems.push(Problem {
                key: name.clone(),
                value: None,
                message: "expected TAPEGATE_<SECTION>__<KEY> with non-empty parts".into(),
            });
            continue;
        }
        if let Err(message) = set_path(table, &segments, &raw) {
            problems.push(Problem {
                key: segments.join("."),
                value: None,
                message: format!("cannot apply {name}: {message}"),
            });
        }
    }
}

fn set_path(table: &mut toml::Table, segments: &[String], raw: &str) -> Result<(), String> {
    let (first, rest) = segments.split_first().ok_or("empty key")?;
    if rest.is_empty() {
        let value = env_value(table.get(first), raw);
        table.insert(first.clone(), value);
        return Ok(());
    }
    let entry = table
        .entry(first.clone())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    set_in_value(entry, rest, raw)
}

fn set_in_value(node: &mut toml::Value, segments: &[String], raw: &str) -> Result<(), String> {
    match node {
        toml::Value::Table(t) => set_path(t, segments, raw),
        toml::Value::Array(a) => {
            let (first, rest) = segments.split_first().ok_or("empty key")?;
            let i: usize = first
                .parse()
                .map_err(|_| format!("{first:?} is not an index into the list"))?;
            let len = a.len();
            let slot = a
                .get_mut(i)
                .ok_or_else(|| format!("no entry {i} (the list has {len})"))?;
            if rest.is_empty() {
                *slot = env_value(Some(slot), raw);
                Ok(())
            } else {
                set_in_value(slot, rest, raw)
            }
        }
        _ => Err("its parent is not a table".to_string()),
    }
}

/// The TOML value of an override: a string where the file has a string, else the
/// value as TOML when it parses as a scalar, else the raw string.
fn env_value(existing: Option<&toml::Value>, raw: &str) -> toml::Value {
    if let Some(toml::Value::String(_)) = existing {
        return toml::Value::String(raw.to_string());
    }
    let parsed = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"));
    match parsed {
        Some(
            v @ (toml::Value::Integer(_)
            | toml::Value::Float(_)
            | toml::Value::Boolean(_)
            | toml::Value::String(_)),
        ) => v,
        _ => toml::Value::String(raw.to_string()),
    }
}

/// Strings that may arrive as numbers or booleans (from the environment, or written
/// unquoted in the file: `customer_id = 12345`).
mod lenient {
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        S(String),
        I(i64),
        F(f64),
        B(bool),
    }

    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(Option::<Scalar>::deserialize(d)
            .map_err(|_| serde::de::Error::custom("expected a string"))?
            .map(|s| match s {
                Scalar::S(s) => s,
                Scalar::I(i) => i.to_string(),
                Scalar::F(f) => f.to_string(),
                Scalar::B(b) => b.to_string(),
            }))
    }
}

/// An integer written as a number (`0x0EF7` in TOML, `3831`) or as a string (`"0x0EF7"`).
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Str(String),
}

impl IntOrString {
    fn value(&self) -> Option<i64> {
        match self {
            IntOrString::Int(i) => Some(*i),
            IntOrString::Str(s) => {
                let t = s.trim();
                match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => i64::from_str_radix(h, 16).ok(),
                    None => t.parse().ok(),
                }
            }
        }
    }

    fn shown(&self) -> String {
        match self {
            IntOrString::Int(i) => format!("{i} (0x{i:04X})"),
            IntOrString::Str(s) => format!("{s:?}"),
        }
    }
}

#[derive(Default)]
struct RawConfig {
    gateway: RawGateway,
    service: Option<RawService>,
    products: Option<Vec<RawProduct>>,
    scanner: RawScanner,
    dedup: RawDedup,
    outbox: RawOutbox,
    flush: RawFlush,
    readings: RawReadings,
    log: RawLog,
}

/// `[gateway]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    /// Name of this gateway in logs, correlation ids and status (default: host name).
    #[serde(default, deserialize_with = "lenient::string")]
    id: Option<String>,
    /// Directory of the outbox database (default `/var/lib/tapegate`).
    state_dir: Option<PathBuf>,
    /// How long a shutdown may take to finish the batch in flight (default 10).
    shutdown_grace_secs: Option<u64>,
}

/// `[service]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawService {
    /// Which `[service.environments.<name>]` is used.
    #[serde(default, deserialize_with = "lenient::string")]
    environment: Option<String>,
    /// `mac_id` on the wire: `plain` (default) or `colon`.
    #[serde(default, deserialize_with = "lenient::string")]
    mac_format: Option<String>,
    /// Timeout of one request to the service (default 30).
    request_timeout_secs: Option<u64>,
    /// What onboarding hands out, per environment.
    environments: Option<BTreeMap<String, RawEnvironment>>,
}

/// `[service.environments.<name>]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEnvironment {
    /// Base URL of the service; paths are appended to it as written.
    #[serde(default, deserialize_with = "lenient::string")]
    base_url: Option<String>,
    /// Token URL (password grant).
    #[serde(default, deserialize_with = "lenient::string")]
    auth_url: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    client_id: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    audience: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    username: Option<String>,
    /// The password itself (prefer `password_file`).
    #[serde(default, deserialize_with = "lenient::string")]
    password: Option<String>,
    /// A file holding the password; a relative path is looked up in
    /// `$CREDENTIALS_DIRECTORY` (systemd `LoadCredential=`).
    password_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "lenient::string")]
    customer_id: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    authorized_groups: Option<String>,
}

/// `[[products]]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProduct {
    /// Sent as `product_id`.
    #[serde(default, deserialize_with = "lenient::string")]
    id: Option<String>,
    /// Company identifier whose manufacturer data the advert must carry.
    manufacturer_id: Option<IntOrString>,
    /// Service UUID whose service data the advert must carry (16-bit or 128-bit form).
    #[serde(default, deserialize_with = "lenient::string")]
    service_uuid: Option<String>,
    /// The advertised name must start with this.
    #[serde(default, deserialize_with = "lenient::string")]
    name_prefix: Option<String>,
    /// The MAC must start with these octets (`C0:FF:EE`).
    #[serde(default, deserialize_with = "lenient::string")]
    mac_prefix: Option<String>,
    /// The RSSI must be at least this (dBm).
    min_rssi: Option<i64>,
    /// `manufacturer_data` (default) | `manufacturer_payload` | `service_data`.
    #[serde(default, deserialize_with = "lenient::string")]
    packet: Option<String>,
    /// `hex` (default) | `hex_lower` | `base64`.
    #[serde(default, deserialize_with = "lenient::string")]
    packet_encoding: Option<String>,
}

/// `[scanner]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawScanner {
    /// `ble` (default) | `replay` | `sim`.
    #[serde(default, deserialize_with = "lenient::string")]
    source: Option<String>,
    /// BLE adapter (`hci0`); default the first one.
    #[serde(default, deserialize_with = "lenient::string")]
    adapter: Option<String>,
    /// `ble`: restart the scan when no advertisement arrives for this long, once any was
    /// heard (default 60; 0 = never).
    silence_secs: Option<f64>,
    /// `ble`: exit non-zero when the scanner cannot be brought back for this long (default 300).
    give_up_secs: Option<f64>,
    /// `ble`: devices remembered at most (default 4096).
    max_devices: Option<u64>,
    /// JSON Lines file for `replay`; `-` is stdin.
    replay_path: Option<PathBuf>,
    /// Simulated tapes (default 200).
    sim_tapes: Option<u64>,
    /// Advert interval of each simulated tape (default 1000).
    sim_interval_ms: Option<u64>,
    /// A simulated tape's packet changes every this many adverts (default 5).
    sim_change_every: Option<u64>,
    /// How many simulated tapes the service does not know (default 0).
    sim_unregistered: Option<u64>,
    /// Adverts of other devices per tape advert (default 0.2).
    sim_others_ratio: Option<f64>,
    /// Seed of the simulated fleet (default 1).
    sim_seed: Option<u64>,
    /// The simulation ends after this long (default: runs until stopped).
    sim_duration_secs: Option<f64>,
    /// Real time (default true) or as fast as possible with synthetic capture times.
    sim_realtime: Option<bool>,
    /// Capture time of the first advert when not real time, epoch seconds.
    sim_start: Option<f64>,
}

/// `[dedup]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDedup {
    /// An unchanged packet of a MAC is dropped for this long after its admission (default 60).
    window_secs: Option<f64>,
    /// At most one capture of a MAC per this interval (default 5).
    min_interval_secs: Option<f64>,
    /// MACs tracked at most (default 100000).
    max_tracked: Option<u64>,
}

/// `[outbox]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOutbox {
    /// Pending captures at most; past it the oldest are evicted (default 1000000).
    max_pending: Option<u64>,
    /// `full` (default) | `normal`.
    #[serde(default, deserialize_with = "lenient::string")]
    durability: Option<String>,
    /// Captures are committed in groups at least this often (default 200).
    commit_interval_ms: Option<u64>,
}

/// `[flush]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFlush {
    /// Captures per request, 1 to 250 (default 250).
    max_batch: Option<u64>,
    /// A capture waits at most this long for a full batch (default 5).
    max_delay_secs: Option<f64>,
    /// First retry delay (default 500).
    backoff_initial_ms: Option<u64>,
    /// Longest retry delay (default 300).
    backoff_max_secs: Option<u64>,
}

/// `[readings]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReadings {
    /// Decoded readings are kept this long; the latest of each tape always (default 168).
    retention_hours: Option<u64>,
}

/// `[log]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLog {
    /// Tracing filter (default `info`); `RUST_LOG` wins when set.
    #[serde(default, deserialize_with = "lenient::string")]
    level: Option<String>,
}

const SECTIONS: &[&str] = &[
    "gateway", "service", "products", "scanner", "dedup", "outbox", "flush", "readings", "log",
];

impl RawConfig {
    /// Deserialises each section on its own so that one bad section does not hide the
    /// problems of the others.
    fn from_table(mut table: toml::Table, problems: &mut Vec<Problem>) -> RawConfig {
        for key in table.keys() {
            if !SECTIONS.contains(&key.as_str()) {
                problems.push(Problem {
                    key: key.clone(),
                    value: None,
                    message: format!(
                        "unknown section or key; expected one of {}",
                        SECTIONS.join(", ")
                    ),
                });
            }
        }
        let mut raw = RawConfig::default();
        let mut take = |name: &str| table.remove(name);
        raw.gateway = section(take("gateway"), "gateway", problems).unwrap_or_default();
        raw.service = section(take("service"), "service", problems);
        raw.products = take("products").and_then(|v| match v {
            toml::Value::Array(items) => Some(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        section(Some(v), &format!("products[{i}]"), problems).unwrap_or_default()
                    })
                    .collect(),
            ),
            _ => {
                problems.push(Problem {
                    key: "products".into(),
                    value: None,
                    message: "expected a list of [[products]] tables".into(),
                });
                None
            }
        });
        raw.scanner = section(take("scanner"), "scanner", problems).unwrap_or_default();
        raw.dedup = section(take("dedup"), "dedup", problems).unwrap_or_default();
        raw.outbox = section(take("outbox"), "outbox", problems).unwrap_or_default();
        raw.flush = section(take("flush"), "flush", problems).unwrap_or_default();
        raw.readings = section(take("readings"), "readings", problems).unwrap_or_default();
        raw.log = section(take("log"), "log", problems).unwrap_or_default();
        raw
    }
}

fn section<T: for<'de> Deserialize<'de>>(
    value: Option<toml::Value>,
    name: &str,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let value = value?;
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let path = e.path().to_string();
            let key = if path == "." || path.is_empty() {
                name.to_string()
            } else {
                format!("{name}.{path}")
            };
            problems.push(Problem {
                key,
                value: None,
                message: e.into_inner().to_string().trim_end().to_string(),
            });
            None
        }
    }
}

// ---------------------------------------------------------------------------------------
// Phase 2: validation. Every check runs; each failure adds a problem.

/// Collects problems while reading raw values with their defaults.
struct Check<'a> {
    problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    fn bad(&mut self, key: impl Into<String>, value: impl fmt::Display, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: Some(value.to_string()),
            message: format!("expected {expected}"),
        });
    }

    fn missing(&mut self, key: impl Into<String>, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: format!("missing: expected {expected}"),
        });
    }

    fn other(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: message.into(),
        });
    }

    /// An integer in `lo..=hi`, or `default` when absent.
    fn int(&mut self, key: &str, v: Option<u64>, default: u64, lo: u64, hi: u64) -> u64 {
        match v {
            None => default,
            Some(v) if (lo..=hi).contains(&v) => v,
            Some(v) => {
                self.bad(key, v, &format!("a whole number from {lo} to {hi}"));
                default
            }
        }
    }

    /// Seconds (fractions allowed) in `lo..=hi` as a duration.
    fn secs(&mut self, key: &str, v: Option<f64>, default: f64, lo: f64, hi: f64) -> Duration {
        match v {
            None => Duration::from_secs_f64(default),
            Some(v) if v.is_finite() && v >= lo && v <= hi => Duration::from_secs_f64(v),
            Some(v) => {
                self.bad(key, v, &format!("seconds from {lo} to {hi}"));
                Duration::from_secs_f64(default)
            }
        }
    }

    /// One of `choices` (by name), or the first choice when absent.
    fn choice<T: Copy>(&mut self, key: &str, v: Option<&str>, choices: &[(&str, T)]) -> T {
        let Some(v) = v else { return choices[0].1 };
        match choices.iter().find(|(name, _)| *name == v) {
            Some((_, t)) => *t,
            None => {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                self.bad(
                    key,
                    format!("{v:?}"),
                    &format!("one of {}", names.join(" | ")),
                );
                choices[0].1
            }
        }
    }

    /// A non-empty string without control characters.
    fn text(&mut self, key: &str, v: Option<String>, what: &str) -> Option<String> {
        match v {
            None => {
                self.missing(key, what);
                None
            }
            Some(s) if s.trim().is_empty() || s.chars().any(char::is_control) => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    &format!("{what}, non-empty, without control characters"),
                );
                None
            }
            Some(s) => Some(s),
        }
    }

    fn url(&mut self, key: &str, v: Option<String>) -> Option<Url> {
        let s = self.text(key, v, "an http(s) URL")?;
        match Url::parse(&s) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
            _ => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    "an http(s) URL such as https://api.example.com/",
                );
                None
            }
        }
    }
}

fn validate(raw: RawConfig, _path: &Path, problems: &mut Vec<Problem>) -> Option<Config> {
    let mut c = Check { problems };

    let gateway = GatewaySettings {
        id: match raw.gateway.id {
            None => default_gateway_id(),
            Some(id) => {
                let ok = !id.is_empty()
                    && id.len() <= 64
                    && id
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch));
                if !ok {
                    c.bad(
                        "gateway.id",
                        format!("{id:?}"),
                        "1 to 64 letters, digits, '-', '_' or '.'",
                    );
                }
                id
            }
        },
        state_dir: match raw.gateway.state_dir {
            None => PathBuf::from("/var/lib/tapegate"),
            Some(p) if p.as_os_str().is_empty() => {
                c.bad("gateway.state_dir", "\"\"", "a directory path");
                p
            }
            Some(p) => p,
        },
        shutdown_grace: Duration::from_secs(c.int(
            "gateway.shutdown_grace_secs",
            raw.gateway.shutdown_grace_secs,
            10,
            1,
            600,
        )),
    };

    let service = raw.service.map(|s| validate_service(s, &mut c));

    let products = match raw.products {
        None => Products(vec![Product::tape()]),
        Some(list) if list.is_empty() => {
            c.other("products", "expected at least one [[products]] entry");
            Products::default()
        }
        Some(list) => Products(
            list.into_iter()
                .enumerate()
                .filter_map(|(i, p)| validate_product(p, &format!("products[{i}]"), &mut c))
                .collect(),
        ),
    };

    let sc = raw.scanner;
    let source = c.choice(
        "scanner.source",
        sc.source.as_deref(),
        &[
            ("ble", SourceKind::Ble),
            ("replay", SourceKind::Replay),
            ("sim", SourceKind::Sim),
        ],
    );
    if source == SourceKind::Replay && sc.replay_path.is_none() {
        c.missing(
            "scanner.replay_path",
            "a JSON Lines file (or \"-\" for stdin) when source = \"replay\"",
        );
    }
    let tapes = c.int("scanner.sim_tapes", sc.sim_tapes, 200, 1, 1_000_000) as usize;
    let sim = SimSettings {
        tapes,
        interval_ms: c.int(
            "scanner.sim_interval_ms",
            sc.sim_interval_ms,
            1000,
            1,
            3_600_000,
        ),
        change_every: c.int(
            "scanner.sim_change_every",
            sc.sim_change_every,
            5,
            1,
            1_000_000,
        ) as u32,
        unregistered: c.int(
            "scanner.sim_unregistered",
            sc.sim_unregistered,
            0,
            0,
            tapes as u64,
        ) as usize,
        others_ratio: match sc.sim_others_ratio {
            None => 0.2,
            Some(r) if r.is_finite() && (0.0..=100.0).contains(&r) => r,
            Some(r) => {
                c.bad("scanner.sim_others_ratio", r, "a number from 0 to 100");
                0.2
            }
        },
        seed: sc.sim_seed.unwrap_or(1),
        duration_ms: sc.sim_duration_secs.map(|_| {
            c.secs(
                "scanner.sim_duration_secs",
                sc.sim_duration_secs,
                0.0,
                0.001,
                1e9,
            )
            .as_millis() as u64
        }),
        realtime: sc.sim_realtime.unwrap_or(true),
        start_ms: match sc.sim_start {
            None => 1_763_719_200_000,
            Some(s) if s.is_finite() && s >= 0.0 => (s * 1000.0).round() as i64,
            Some(s) => {
                c.bad("scanner.sim_start", s, "epoch seconds");
                0
            }
        },
    };
    let silence = c.secs("scanner.silence_secs", sc.silence_secs, 60.0, 0.0, 86_400.0);
    let scanner = ScannerSettings {
        source,
        adapter: sc.adapter,
        silence: (!silence.is_zero()).then_some(silence),
        give_up: c.secs(
            "scanner.give_up_secs",
            sc.give_up_secs,
            300.0,
            1.0,
            86_400.0,
        ),
        max_devices: c.int("scanner.max_devices", sc.max_devices, 4096, 16, 1_000_000) as usize,
        replay_path: sc.replay_path,
        sim,
    };

    let d = raw.dedup;
    let dedup = DedupSettings {
        window_ms: c
            .secs("dedup.window_secs", d.window_secs, 60.0, 0.0, 86_400.0)
            .as_millis() as i64,
        min_interval_ms: c
            .secs(
                "dedup.min_interval_secs",
                d.min_interval_secs,
                5.0,
                0.0,
                86_400.0,
            )
            .as_millis() as i64,
        max_tracked: c.int("dedup.max_tracked", d.max_tracked, 100_000, 1, 10_000_000) as usize,
    };

    let o = raw.outbox;
    let outbox = OutboxSettings {
        max_pending: c.int(
            "outbox.max_pending",
            o.max_pending,
            1_000_000,
            1,
            1_000_000_000,
        ),
        durability: c.choice(
            "outbox.durability",
            o.durability.as_deref(),
            &[("full", Durability::Full), ("normal", Durability::Normal)],
        ),
        commit_interval: Duration::from_millis(c.int(
            "outbox.commit_interval_ms",
            o.commit_interval_ms,
            200,
            1,
            10_000,
        )),
    };

    let f = raw.flush;
    let backoff_initial = Duration::from_millis(c.int(
        "flush.backoff_initial_ms",
        f.backoff_initial_ms,
        500,
        1,
        3_600_000,
    ));
    let backoff_max =
        Duration::from_secs(c.int("flush.backoff_max_secs", f.backoff_max_secs, 300, 1, 86_400));
    if backoff_max < backoff_initial {
        c.bad(
            "flush.backoff_max_secs",
            backoff_max.as_secs(),
            "at least flush.backoff_initial_ms",
        );
    }
    let flush = FlushSettings {
        max_batch: c.int("flush.max_batch", f.max_batch, 250, 1, 250) as usize,
        max_delay: c.secs("flush.max_delay_secs", f.max_delay_secs, 5.0, 0.0, 3600.0),
        backoff_initial,
        backoff_max,
    };

    let readings = ReadingsSettings {
        retention: Duration::from_secs(
            3600 * c.int(
                "readings.retention_hours",
                raw.readings.retention_hours,
                168,
                1,
                24 * 3650,
            ),
        ),
    };

    let level = raw.log.level.unwrap_or_else(|| "info".into());
    if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
        c.bad(
            "log.level",
            format!("{level:?}"),
            "a level (error, warn, info, debug, trace) or a tracing filter",
        );
    }

    let service = match service {
        Some(Some(s)) => Some(s),
        Some(None) => return None,
        None => None,
    };
    Some(Config {
        gateway,
        service,
        products,
        scanner,
        dedup,
        outbox,
        flush,
        readings,
        log: LogSettings { level },
    })
}

fn validate_service(s: RawService, c: &mut Check) -> Option<ServiceSettings> {
    let environment = s.environment.unwrap_or_else(|| "ppe".into());
    let mac_format = c.choice(
        "service.mac_format",
        s.mac_format.as_deref(),
        &[("plain", MacFormat::Plain), ("colon", MacFormat::Colon)],
    );
    let request_timeout = Duration::from_secs(c.int(
        "service.request_timeout_secs",
        s.request_timeout_secs,
        30,
        1,
        600,
    ));
    let mut envs = s.environments.unwrap_or_default();
    let Some(e) = envs.remove(&environment) else {
        let known: Vec<&String> = envs.keys().collect();
        c.bad(
            "service.environment",
            format!("{environment:?}"),
            &if known.is_empty() {
                "the name of a [service.environments.<name>] table (there is none)".to_string()
            } else {
                format!("the name of a [service.environments.<name>] table: {known:?}")
            },
        );
        return None;
    };
    let k = |f: &str| format!("service.environments.{environment}.{f}");
    let base_url = c.url(&k("base_url"), e.base_url);
    let auth_url = c.url(&k("auth_url"), e.auth_url);
    let client_id = c.text(
        &k("client_id"),
        e.client_id,
        "the client id from onboarding",
    );
    let audience = c.text(&k("audience"), e.audience, "the audience from onboarding");
    let username = c.text(&k("username"), e.username, "the API user name");
    let customer_id = c.text(
        &k("customer_id"),
        e.customer_id,
        "the customer id from onboarding",
    );
    let authorized_groups = c.text(
        &k("authorized_groups"),
        e.authorized_groups,
        "the authorized groups from onboarding",
    );
    // The password's value never appears in a problem.
    let password = match (e.password, e.password_file) {
        (Some(_), Some(_)) => {
            c.other(
                k("password"),
                "set either password or password_file, not both",
            );
            None
        }
        (None, None) => {
            c.missing(k("password_file"), "password_file (or password)");
            None
        }
        (Some(p), None) if p.is_empty() => {
            c.other(k("password"), "is empty");
            None
        }
        (Some(p), None) => Some(Secret::new(p)),
        (None, Some(file)) => read_password_file(&file, &k("password_file"), c),
    };
    Some(ServiceSettings {
        environment: environment.clone(),
        mac_format,
        request_timeout,
        endpoint: EnvironmentSettings {
            base_url: base_url?,
            auth_url: auth_url?,
            client_id: client_id?,
            audience: audience?,
            username: username?,
            password: password?,
            customer_id: customer_id?,
            authorized_groups: authorized_groups?,
        },
    })
}

/// Reads a password file; a relative path is looked up in `$CREDENTIALS_DIRECTORY`
/// (where systemd's `LoadCredential=` puts it). One trailing newline is dropped.
fn read_password_file(file: &Path, key: &str, c: &mut Check) -> Option<Secret> {
    let path = match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) if file.is_relative() => Path::new(&dir).join(file),
        _ => file.to_path_buf(),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let p = text.strip_suffix('\n').unwrap_or(&text);
            let p = p.strip_suffix('\r').unwrap_or(p);
            if p.is_empty() {
                c.bad(
                    key,
                    path.display(),
                    "a file holding the password (it is empty)",
                );
                None
            } else {
                Some(Secret::new(p))
            }
        }
        Err(e) => {
            c.bad(
                key,
                path.display(),
                &format!("a readable file holding the password ({e})"),
            );
            None
        }
    }
}

fn validate_product(p: RawProduct, key: &str, c: &mut Check) -> Option<Product> {
    let k = |f: &str| format!("{key}.{f}");
    let id = c.text(&k("id"), p.id, "the product id sent as product_id");
    let manufacturer_id = p.manufacturer_id.as_ref().and_then(|m| match m.value() {
        Some(v) if (0..=0xFFFF).contains(&v) => Some(v as u16),
        _ => {
            c.bad(
                k("manufacturer_id"),
                m.shown(),
                "a company identifier from 0 to 0xFFFF",
            );
            None
        }
    });
    let service_uuid = p.service_uuid.as_ref().and_then(|u| {
        let e = expand_uuid(u);
        if e.is_none() {
            c.bad(
                k("service_uuid"),
                format!("{u:?}"),
                "a 16-, 32- or 128-bit UUID (\"feaa\" or \"0000feaa-0000-1000-8000-00805f9b34fb\")",
            );
        }
        e
    });
    let mac_prefix = p.mac_prefix.as_ref().and_then(|m| {
        let digits: String = m.chars().filter(|ch| *ch != ':' && *ch != '-').collect();
        match crate::record::decode_hex(&digits) {
            Some(b) if !b.is_empty() && b.len() <= 6 => Some(b),
            _ => {
                c.bad(
                    k("mac_prefix"),
                    format!("{m:?}"),
                    "1 to 6 leading octets of a MAC, such as \"C0:FF:EE\"",
                );
                None
            }
        }
    });
    let min_rssi = p.min_rssi.and_then(|r| {
        if (-127..=20).contains(&r) {
            Some(r as i16)
        } else {
            c.bad(k("min_rssi"), r, "dBm from -127 to 20");
            None
        }
    });
    let packet = c.choice(
        &k("packet"),
        p.packet.as_deref(),
        &[
            ("manufacturer_data", PacketSource::ManufacturerData),
            ("manufacturer_payload", PacketSource::ManufacturerPayload),
            ("service_data", PacketSource::ServiceData),
        ],
    );
    let packet_encoding = c.choice(
        &k("packet_encoding"),
        p.packet_encoding.as_deref(),
        &[
            ("hex", PacketEncoding::Hex),
            ("hex_lower", PacketEncoding::HexLower),
            ("base64", PacketEncoding::Base64),
        ],
    );
    if p.manufacturer_id.is_none()
        && p.service_uuid.is_none()
        && p.name_prefix.is_none()
        && p.mac_prefix.is_none()
        && p.min_rssi.is_none()
    {
        c.other(
            key,
            "names no criterion (manufacturer_id, service_uuid, name_prefix, mac_prefix, min_rssi): it would match every advertisement",
        );
    }
    Some(Product {
        id: id?,
        manufacturer_id,
        service_uuid,
        name_prefix: p.name_prefix,
        mac_prefix,
        min_rssi,
        packet,
        packet_encoding,
    })
}

/// The host name, or `tapegate` when it cannot be read.
fn default_gateway_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tapegate".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str = r#"
[service]
environment = "ppe"
[service.environments.ppe]
base_url = "https://api.example.com/"
auth_url = "https://auth.example.com/oauth/token"
client_id = "cid"
audience = "aud"
username = "gw"
password = "s3cr3t-value"
customer_id = "cust"
authorized_groups = "grp"
"#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_toml(
            text,
            Path::new("test.toml"),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    fn problems(text: &str, env: &[(&str, &str)]) -> Vec<Problem> {
        match parse(text, env) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_file_gives_the_documented_defaults() {
        let c = parse("", &[]).unwrap();
        assert_eq!(c.gateway.state_dir, PathBuf::from("/var/lib/tapegate"));
        assert_eq!(c.gateway.shutdown_grace, Duration::from_secs(10));
        assert!(c.service.is_none());
        assert_eq!(c.products.0.len(), 1);
        assert_eq!(c.products.0[0].manufacturer_id, Some(0x0EF7));
        assert_eq!(c.scanner.source, SourceKind::Ble);
        assert_eq!(
            (c.dedup.window_ms, c.dedup.min_interval_ms),
            (60_000, 5_000)
        );
        assert_eq!(c.outbox.max_pending, 1_000_000);
        assert_eq!(c.outbox.durability, Durability::Full);
        assert_eq!(c.outbox.commit_interval, Duration::from_millis(200));
        assert_eq!(c.flush.max_batch, 250);
        assert_eq!(c.flush.max_delay, Duration::from_secs(5));
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = include_str!("../../config.example.toml").replace(
            "password_file = \"/run/credentials/tapegate.service/password\"",
            "password = \"x\"",
        );
        let c = parse(&text, &[]).unwrap();
        let s = c.service.unwrap();
        assert_eq!(s.environment, "ppe");
        assert_eq!(s.mac_format, MacFormat::Plain);
        assert_eq!(c.products.0[0].id, "tape");
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

    #[test]
    fn a_password_never_appears_in_a_config_error() {
        let text = SERVICE.replace("https://api.example.com/", "not a url");
        let err = parse(&format!("{text}\n[flush]\nmax_batch = 0\n"), &[]).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("base_url"), "{shown}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        // A valid config's Debug output hides it too.
        let c = parse(SERVICE, &[]).unwrap();
        assert!(!format!("{c:?}").contains("s3cr3t-value"));
    }

    #[test]
    fn environment_variables_override_file_keys() {
        let c = parse(
            SERVICE,
            &[
                ("TAPEGATE_FLUSH__MAX_BATCH", "100"),
                ("TAPEGATE_GATEWAY__ID", "dock-9"),
                ("TAPEGATE_SERVICE__ENVIRONMENTS__PPE__CUSTOMER_ID", "12345"),
                ("TAPEGATE_OUTBOX__DURABILITY", "normal"),
                ("TAPEGATE_CONFIG", "/ignored/not/a/key"),
                ("OTHER_FLUSH__MAX_BATCH", "1"),
            ],
        )
        .unwrap();
        assert_eq!(c.flush.max_batch, 100);
        assert_eq!(c.gateway.id, "dock-9");
        assert_eq!(c.service.unwrap().endpoint.customer_id, "12345");
        assert_eq!(c.outbox.durability, Durability::Normal);
    }

    #[test]
    fn a_bad_environment_override_is_named_like_a_file_key() {
        let p = problems(
            "",
            &[
                ("TAPEGATE_FLUSH__MAX_BATCH", "9000"),
                ("TAPEGATE_FLUSH__NOPE", "1"),
            ],
        );
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        assert!(shown.iter().any(|s| s.starts_with("flush")), "{shown:#?}");
    }

    #[test]
    fn the_selected_environment_must_exist() {
        let text = SERVICE.replace("environment = \"ppe\"", "environment = \"production\"");
        let p = problems(&text, &[]);
        assert_eq!(p[0].key, "service.environment");
        assert!(p[0].message.contains("ppe"), "{:?}", p[0]);
    }

    #[test]
    fn password_file_is_read_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            &format!("password_file = \"{}\"", file.display()),
        );
        let c = parse(&text, &[]).unwrap();
        assert_eq!(c.service.unwrap().endpoint.password.expose(), "from-file");
        let missing = text.replace(&file.display().to_string(), "/nonexistent/pw");
        let p = problems(&missing, &[]);
        assert!(
            p[0].to_string().contains("password_file = /nonexistent/pw"),
            "{:?}",
            p[0]
        );
    }

    #[test]
    fn products_need_a_criterion_and_valid_values() {
        let p = problems("[[products]]\nid = \"x\"\n", &[]);
        assert!(p[0].message.contains("names no criterion"), "{p:?}");
        let c = parse(
            "[[products]]\nid = \"x\"\nservice_uuid = \"FEAA\"\nmac_prefix = \"c0:ff\"\nmin_rssi = -80\npacket = \"service_data\"\npacket_encoding = \"base64\"\n",
            &[],
        )
        .unwrap();
        let p = &c.products.0[0];
        assert_eq!(
            p.service_uuid.as_deref(),
            Some("0000feaa-0000-1000-8000-00805f9b34fb")
        );
        assert_eq!(p.mac_prefix, Some(vec![0xC0, 0xFF]));
        assert_eq!(p.packet, PacketSource::ServiceData);
        assert_eq!(p.packet_encoding, PacketEncoding::Base64);
    }

    #[test]
    fn replay_needs_a_path() {
        let p = problems("[scanner]\nsource = \"replay\"\n", &[]);
        assert_eq!(p[0].key, "scanner.replay_path");
    }
}
