/*!
The raw layer: what the file says, before any check. One serde struct per section with
`deny_unknown_fields` (an unknown key is a problem, not silently ignored) and a doc
comment per field saying what the key means; every field is optional here, and the
default it takes when absent is in [`DEFAULTS`](super::DEFAULTS). Each section is read
on its own, so that one bad section does not hide the problems of the others.
It touches serde and the problems list only.
*/

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Problem, DEFAULTS};

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
pub enum IntOrString {
    Int(i64),
    Str(String),
}

impl IntOrString {
    pub fn value(&self) -> Option<i64> {
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

    pub fn shown(&self) -> String {
        match self {
            IntOrString::Int(i) => format!("{i} (0x{i:04X})"),
            IntOrString::Str(s) => format!("{s:?}"),
        }
    }
}

/// The whole file, section by section; an absent section is all defaults.
#[derive(Default)]
pub struct RawConfig {
    pub gateway: RawGateway,
    pub service: Option<RawService>,
    pub products: Option<Vec<RawProduct>>,
    pub scanner: RawScanner,
    pub dedup: RawDedup,
    pub outbox: RawOutbox,
    pub flush: RawFlush,
    pub readings: RawReadings,
    pub log: RawLog,
    pub http: RawHttp,
    pub telemetry: RawTelemetry,
}

/// `[gateway]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// Name of this gateway in logs, correlation ids and status (default: the host name).
    #[serde(default, deserialize_with = "lenient::string")]
    pub id: Option<String>,
    /// Directory of the outbox database.
    pub state_dir: Option<PathBuf>,
    /// How long a shutdown may take to finish the batch in flight.
    pub shutdown_grace_secs: Option<u64>,
    /// When captures are held for an untrusted clock: `auto` | `wait` | `trust`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub clock: Option<String>,
    /// Under `clock = "auto"`, the longest captures are held waiting for a sync.
    pub clock_max_hold_secs: Option<u64>,
}

/// `[service]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawService {
    /// Which `[service.environments.<name>]` is used.
    #[serde(default, deserialize_with = "lenient::string")]
    pub environment: Option<String>,
    /// `mac_id` on the wire: `plain` | `colon`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub mac_format: Option<String>,
    /// Timeout of one request to the service.
    pub request_timeout_secs: Option<u64>,
    /// A PEM file of CA certificates trusted besides the system's (a private CA, or a
    /// TLS-inspecting proxy's).
    pub ca_file: Option<PathBuf>,
    /// Length of the service's shared rate window of the label, status and config
    /// calls (spec 8: 60 s); change it only if the operator says so.
    pub rate_window_secs: Option<u64>,
    /// What onboarding hands out, per environment.
    pub environments: Option<BTreeMap<String, RawEnvironment>>,
}

/// `[service.environments.<name>]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawEnvironment {
    /// Base URL of the service; paths are appended to it as written.
    #[serde(default, deserialize_with = "lenient::string")]
    pub base_url: Option<String>,
    /// Token URL (password grant).
    #[serde(default, deserialize_with = "lenient::string")]
    pub auth_url: Option<String>,
    /// The client id from onboarding.
    #[serde(default, deserialize_with = "lenient::string")]
    pub client_id: Option<String>,
    /// The audience from onboarding.
    #[serde(default, deserialize_with = "lenient::string")]
    pub audience: Option<String>,
    /// The API user name.
    #[serde(default, deserialize_with = "lenient::string")]
    pub username: Option<String>,
    /// The password itself (prefer `password_file`).
    #[serde(default, deserialize_with = "lenient::string")]
    pub password: Option<String>,
    /// A file holding the password; a relative path is looked up in
    /// `$CREDENTIALS_DIRECTORY` (systemd `LoadCredential=`).
    pub password_file: Option<PathBuf>,
    /// The customer id from onboarding.
    #[serde(default, deserialize_with = "lenient::string")]
    pub customer_id: Option<String>,
    /// The authorized groups from onboarding.
    #[serde(default, deserialize_with = "lenient::string")]
    pub authorized_groups: Option<String>,
    /// The address history (spec 4.2) is served from.
    #[serde(default, deserialize_with = "lenient::string")]
    pub historical_base_url: Option<String>,
    /// The fixed UUID that ends the history path (spec 4.2).
    #[serde(default, deserialize_with = "lenient::string")]
    pub history_operation_id: Option<String>,
    /// `appId` of `device add` and `application_id` of labels when none is given.
    #[serde(default, deserialize_with = "lenient::string")]
    pub default_app_id: Option<String>,
    /// `tt` of `device add` when `--tape-type` is not given.
    #[serde(default, deserialize_with = "lenient::string")]
    pub default_tape_type: Option<String>,
}

/// `[[products]]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawProduct {
    /// Sent as `product_id`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub id: Option<String>,
    /// Company identifier whose manufacturer data the advert must carry.
    pub manufacturer_id: Option<IntOrString>,
    /// Service UUID whose service data the advert must carry (16-bit or 128-bit form).
    #[serde(default, deserialize_with = "lenient::string")]
    pub service_uuid: Option<String>,
    /// The advertised name must start with this.
    #[serde(default, deserialize_with = "lenient::string")]
    pub name_prefix: Option<String>,
    /// The MAC must start with these octets (`C0:FF:EE`).
    #[serde(default, deserialize_with = "lenient::string")]
    pub mac_prefix: Option<String>,
    /// The RSSI must be at least this (dBm).
    pub min_rssi: Option<i64>,
    /// What becomes `ble_packet`: `manufacturer_data` | `manufacturer_payload` | `service_data`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub packet: Option<String>,
    /// How `ble_packet` is written: `hex` | `hex_lower` | `base64`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub packet_encoding: Option<String>,
}

/// `[scanner]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawScanner {
    /// `ble` | `replay` | `sim`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub source: Option<String>,
    /// BLE adapter (`hci0`); default the first one.
    #[serde(default, deserialize_with = "lenient::string")]
    pub adapter: Option<String>,
    /// `ble`: restart the scan when no advertisement arrives for this long, once any was
    /// heard (0 = never).
    pub silence_secs: Option<f64>,
    /// `ble`: exit non-zero when the scanner cannot be brought back for this long.
    pub give_up_secs: Option<f64>,
    /// `ble`: devices remembered at most.
    pub max_devices: Option<u64>,
    /// `ble`: where adverts are read: `auto` | `mgmt` (the kernel's management socket
    /// beside bluetoothd) | `dbus` (BlueZ's D-Bus signals).
    #[serde(default, deserialize_with = "lenient::string")]
    pub adverts: Option<String>,
    /// `ble`: `active` (discovery: scan requests, scan responses heard) | `passive` (an
    /// advertisement monitor of the kernel: no scan requests; needs the management
    /// socket).
    #[serde(default, deserialize_with = "lenient::string")]
    pub scan: Option<String>,
    /// JSON Lines file for `replay`; `-` is stdin.
    pub replay_path: Option<PathBuf>,
    /// Simulated tapes.
    pub sim_tapes: Option<u64>,
    /// Advert interval of each simulated tape.
    pub sim_interval_ms: Option<u64>,
    /// A simulated tape's packet changes every this many adverts.
    pub sim_change_every: Option<u64>,
    /// How many simulated tapes the service does not know.
    pub sim_unregistered: Option<u64>,
    /// Adverts of other devices per tape advert.
    pub sim_others_ratio: Option<f64>,
    /// Seed of the simulated fleet.
    pub sim_seed: Option<u64>,
    /// The simulation ends after this long (default: runs until stopped).
    pub sim_duration_secs: Option<f64>,
    /// Real time, or as fast as possible with synthetic capture times.
    pub sim_realtime: Option<bool>,
    /// Capture time of the first advert when not real time, epoch seconds.
    pub sim_start: Option<f64>,
}

/// `[dedup]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawDedup {
    /// An unchanged packet of a MAC is dropped for this long after its admission.
    pub window_secs: Option<f64>,
    /// At most one capture of a MAC per this interval.
    pub min_interval_secs: Option<f64>,
    /// MACs tracked at most.
    pub max_tracked: Option<u64>,
}

/// `[outbox]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawOutbox {
    /// Pending captures at most; past it the oldest are evicted.
    pub max_pending: Option<u64>,
    /// `full` | `normal`.
    #[serde(default, deserialize_with = "lenient::string")]
    pub durability: Option<String>,
    /// Captures are committed in groups at least this often.
    pub commit_interval_ms: Option<u64>,
    /// Pending captures older than this (capture time) are evicted, oldest first
    /// (0: no age bound).
    pub max_age_secs: Option<u64>,
    /// The state database's used size at most, bytes; past it the oldest pending
    /// captures are evicted (0: no size bound).
    pub max_bytes: Option<u64>,
}

/// `[flush]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawFlush {
    /// Captures per request, 1 to 250.
    pub max_batch: Option<u64>,
    /// A capture waits at most this long for a full batch.
    pub max_delay_secs: Option<f64>,
    /// First retry delay.
    pub backoff_initial_ms: Option<u64>,
    /// Longest retry delay.
    pub backoff_max_secs: Option<u64>,
    /// Batches in flight at most; adaptive below it.
    pub max_in_flight: Option<u64>,
    /// Attempts of a capture on its own (or answers leaving it out) before it is a dead
    /// letter.
    pub max_attempts: Option<u64>,
}

/// `[readings]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawReadings {
    /// Deprecated: no history of readings is kept (accepted, warned of, no effect).
    pub retention_hours: Option<u64>,
}

/// `[log]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// Tracing filter (`info`, `tapegate=debug`); `RUST_LOG` wins when set.
    #[serde(default, deserialize_with = "lenient::string")]
    pub level: Option<String>,
}

/// `[http]`
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// Address and port of the read-only HTTP server (/metrics, /healthz, the status
    /// page); absent: no listener.
    #[serde(default, deserialize_with = "lenient::string")]
    pub listen: Option<String>,
}

/// `[telemetry]`: the metrics pushed to a Prometheus remote-write receiver.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// The receiver's remote-write URL (`https://mimir.example.com/api/v1/push`);
    /// absent: nothing is pushed.
    #[serde(default, deserialize_with = "lenient::string")]
    pub url: Option<String>,
    /// A push every this many seconds.
    pub interval_secs: Option<u64>,
    /// Timeout of one push.
    pub timeout_secs: Option<u64>,
    /// Pushes kept while the receiver cannot be reached (the newest; the oldest are
    /// dropped and counted).
    pub max_buffered: Option<u64>,
    /// A PEM file of CA certificates trusted besides the system's, for the receiver.
    pub ca_file: Option<PathBuf>,
    /// Basic auth: the user name (Grafana Cloud: the instance id).
    #[serde(default, deserialize_with = "lenient::string")]
    pub username: Option<String>,
    /// Basic auth: the password itself (prefer `password_file`).
    #[serde(default, deserialize_with = "lenient::string")]
    pub password: Option<String>,
    /// Basic auth: a file holding the password; a relative path is a credential of the
    /// unit (`$CREDENTIALS_DIRECTORY`), or a file beside the config outside it.
    pub password_file: Option<PathBuf>,
    /// A bearer token itself (prefer `bearer_token_file`).
    #[serde(default, deserialize_with = "lenient::string")]
    pub bearer_token: Option<String>,
    /// A file holding the bearer token; relative as `password_file`.
    pub bearer_token_file: Option<PathBuf>,
}

const SECTIONS: &[&str] = &[
    "gateway",
    "service",
    "products",
    "scanner",
    "dedup",
    "outbox",
    "flush",
    "readings",
    "log",
    "http",
    "telemetry",
];

impl RawConfig {
    /// Deserialises each section on its own so that one bad section does not hide the
    /// problems of the others.
    pub fn from_table(mut table: toml::Table, problems: &mut Vec<Problem>) -> RawConfig {
        for key in table.keys() {
            if !SECTIONS.contains(&key.as_str()) {
                problems.push(Problem::new(
                    key.clone(),
                    None,
                    format!(
                        "unknown section or key; expected one of {}",
                        SECTIONS.join(", ")
                    ),
                ));
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
                problems.push(Problem::new(
                    "products",
                    None,
                    "expected a list of [[products]] tables",
                ));
                None
            }
        });
        raw.scanner = section(take("scanner"), "scanner", problems).unwrap_or_default();
        raw.dedup = section(take("dedup"), "dedup", problems).unwrap_or_default();
        raw.outbox = section(take("outbox"), "outbox", problems).unwrap_or_default();
        raw.flush = section(take("flush"), "flush", problems).unwrap_or_default();
        raw.readings = section(take("readings"), "readings", problems).unwrap_or_default();
        raw.log = section(take("log"), "log", problems).unwrap_or_default();
        raw.http = section(take("http"), "http", problems).unwrap_or_default();
        raw.telemetry = section(take("telemetry"), "telemetry", problems).unwrap_or_default();
        raw
    }

    /// The password file validation will want: the selected environment's
    /// `password_file`, when no `password` is set beside it (that is a problem, and then
    /// no file is read).
    pub fn password_file(&self) -> Option<&Path> {
        let service = self.service.as_ref()?;
        let environment = service.environments.as_ref()?.get(service.environment())?;
        match (&environment.password, &environment.password_file) {
            (None, Some(file)) => Some(file),
            _ => None,
        }
    }
}

impl RawTelemetry {
    /// The credential file validation will want: `password_file` or
    /// `bearer_token_file`, when exactly one credential is set (otherwise that is a
    /// problem, and no file is read).
    pub fn secret_file(&self) -> Option<&Path> {
        match (
            &self.password,
            &self.password_file,
            &self.bearer_token,
            &self.bearer_token_file,
        ) {
            (None, Some(file), None, None) | (None, None, None, Some(file)) => Some(file),
            _ => None,
        }
    }
}

impl RawConfig {
    /// `[service] ca_file`, if set.
    pub fn ca_file(&self) -> Option<&Path> {
        self.service.as_ref()?.ca_file.as_deref()
    }
}

impl RawService {
    /// The name of the selected environment.
    pub fn environment(&self) -> &str {
        self.environment
            .as_deref()
            .unwrap_or(DEFAULTS.service.environment)
    }
}

/// Reads one section, or records why it cannot be read under the section's key.
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
            problems.push(Problem::new(
                key,
                None,
                e.into_inner().to_string().trim_end().to_string(),
            ));
            None
        }
    }
}
