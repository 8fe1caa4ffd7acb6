/*!
A spec-faithful mock of the tracking service: the token endpoint (spec section 5), bulk
and single decode (4.4, 4.3) with the error answers of section 7, and the operator
endpoints (4.1, 4.2, 4.5-4.7) with the device state machine of section 3 and the limits
of section 8, on a loopback port.

Why it exists: the daemon's promises (nothing lost, batches split on 400, one token
refresh on 401, backoff on 429/5xx) can only be tested against a service that answers
like the real one and can be made to misbehave on purpose. Tests start one per test
with [`start`]; `tapegate demo` and `tapegate mock` run it with [`MockConfig::demo`].

# Layout
Each environment lives under its own path prefix, so one port serves several:
- `POST /{env}/oauth/token`: form-encoded password grant, every field checked.
- `POST /{env}/external/v1/devices/decode`: bulk decode.
- `POST /{env}/external/v1/devices/{mac_id}/decode`: single decode.

- The operator endpoints under the same prefix: `POST devices/v1/parcel`,
  `POST|PUT|GET external/v1/devices/label`, `POST external/v1/devices/status`,
  `POST external/v1/devices/config`, `GET external/locations/{asset_id}`,
  `POST external/messages`; and history under its own address,
  `POST /{env}/historical/agent-service/v1/agent/exec/{HISTORY_OPERATION_ID}`.

[`MockHandle::base_url`], [`MockHandle::auth_url`] and
[`MockHandle::historical_base_url`] give the URLs, and
[`MockHandle::environment_settings`] a ready [`EnvironmentSettings`].

In the code, `service.rs` routes requests and holds the state the endpoints share;
each endpoint is a file (`token.rs`, `decode.rs`), and `fault.rs` injects faults, so
a new endpoint is a new file and a route. The operator endpoints go through `ops.rs`
(their common steps: fault, token, rate window, permission, record) to `devices.rs`
(add, label, status, config and the state machine), `locations.rs`, `history.rs` and
`messages.rs`; `rate.rs` is the shared window and `seed.rs` what the account holds at
start. The request shapes the spec does not show are the project's choice, listed in
the module docs of those files; where the spec is silent on what a service does, the
mock plays each reading, chosen per test (`readings.rs`, [`Readings`]).

# Where the mock had to choose
- A body that is not valid JSON gets 401 `Unauthorized access` (spec section 7 lists
  it under 401); valid JSON that is not an array gets 400.
- Checks run in this order: fault injection, bearer token (401; also with a fresh token
  when the permission is withdrawn, [`MockHandle::set_decode_permission`]), `customer_id` and
  `authorized_groups` present (400), `Content-Type: application/json` (400, bulk), body
  JSON (401), array (400), item count (413), every item has the four string fields and
  no `mac_id` twice (400 `Validation failed` with `errors`, one per problem, naming the
  item index: spec section 7's body), poison MAC (400); then each item is answered on
  its own.
- A `customer_id` or `authorized_groups` that differs from the environment's is not a
  request error: the devices are simply not associated with that customer, so every
  item gets the "device not found" error (404 on single decode).
- The bulk answer carries exactly the fields the spec lists for it (`mac_id, qr_code,
  cts, ts, bat, temp`, or `mac_id, error`); the single decode answer carries all the
  fields of spec 2.3.
- What an item may look like is [`WireRules`]: by default `mac_id` only as
  `AABBCCDDEEFF`, `ble_packet` only as upper-case hex, `product_id` only `tape`
  (tapegate's defaults; the spec fixes none of them). Another form is an item error
  (`invalid mac_id format`, `invalid ble_packet encoding`, `unknown product_id`), so a
  wire mistake cannot pass unseen. `mac_id` is echoed back exactly as received.
- `scan_time` must be a number in a string (`ts` echoes it); anything else is an
  item error `invalid scan_time`.

# The simulated tape packet
`ble_packet` is upper-case hex (or, with [`WireRules::any_packet_encoding`], hex of any
case or base64) of either the 13-byte manufacturer data
(`F7 0E`, company identifier 0x0EF7 little-endian, then the payload) or the 11-byte
payload alone. The layout is the one the simulated fleet writes ([`crate::tape`] has
the table and the code for both); the mock answers:

| payload field | answer field |
|---|---|
| marker `49 56` | (without it: `invalid ble_packet`) |
| packet counter | `cts` |
| temperature, 0.01 °C | `temp` (°C) |
| battery percent | `bat` |
| shock count | `shock_count` |
| low 24 bits of the tape serial | (not answered) |

Also `qr_code` = `"TT"` + the 12 hex digits of the MAC, `ts` = `scan_time` as a number,
`fw_ver` = `"1.4.2"`, and the other fields of 2.3 are 0.

# Memory
The record of received requests keeps the newest [`DEFAULT_RECORD_LIMIT`] requests
(older ones are dropped and counted); [`MockHandle::set_recording`] turns it off for
long demos. Expired tokens are forgotten at every grant.
*/

mod decode;
mod devices;
mod fault;
mod history;
mod locations;
mod messages;
mod ops;
mod packet;
mod rate;
mod readings;
pub mod seed;
mod service;
mod token;

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use url::Url;

pub use crate::config::MacFormat;
use crate::config::{EnvironmentSettings, ServiceSettings};
use crate::record::hex_upper;
use crate::secret::Secret;
use crate::tape::UNREGISTERED_PREFIX;

pub use devices::{
    fleet_qrcode, Device, DeviceStatus, Label, ALREADY_IN_TARGET_STATE, ALREADY_LABELLED,
    DEVICE_NOT_FOUND, INVALID_TRANSITION, MAX_LABEL_DEVICES, MAX_STATUS_DEVICES, QRMAC_NOT_FOUND,
};
pub use fault::{Fault, MacFault, Storm};
pub use history::{
    HISTORY_OPERATION_ID, HISTORY_VERSION, LAG_SECS, MAX_AGE_DAYS, MAX_EVENTS, MAX_SPAN_DAYS,
};
pub use locations::{LOCATION_UUID, LOCATION_VERSION, SENSORS, VENDOR_ID};
pub use messages::MESSAGE_TYPES;
pub use ops::{Endpoint, OperatorReceived};
pub use rate::{DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW};
pub use readings::{HistoryKeeps, HistoryOrder, LookupShape, QrEcho, RateWindows, Readings};

use service::Shared;

/// Items per bulk request (spec section 8).
pub const DEFAULT_MAX_ITEMS: usize = 250;
/// Received requests kept by default.
pub const DEFAULT_RECORD_LIMIT: usize = 10_000;
/// `fw_ver` of every decoded packet.
pub const FW_VER: &str = "1.4.2";
/// The application ids the operator issued to the mock's account (`appId` of
/// add-device, `application_id` of labels); the first is the demo's default.
pub const APP_IDS: [&str; 2] = ["demo-app", "cold-chain"];

/// One environment: what onboarding would hand out for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockEnvironment {
    /// Path prefix (`/ppe/...`).
    pub name: String,
    pub client_id: String,
    pub audience: String,
    pub username: String,
    /// The mock's own credential; not a secret worth protecting, but kept as a
    /// [`Secret`] so it formats like the real one.
    pub password: Secret,
    pub customer_id: String,
    pub authorized_groups: String,
    /// Lifetime of granted tokens, seconds.
    pub expires_in: u64,
}

impl MockEnvironment {
    /// The demo environment "ppe".
    pub fn demo() -> Self {
        Self::named("ppe")
    }

    /// An environment with the demo credentials under another name.
    pub fn named(name: &str) -> Self {
        MockEnvironment {
            name: name.to_string(),
            client_id: "tapegate-demo".to_string(),
            audience: "https://api.example/decode".to_string(),
            username: "demo".to_string(),
            password: Secret::new("demo-password"),
            customer_id: "demo-customer".to_string(),
            authorized_groups: "demo-group".to_string(),
            expires_in: 3600,
        }
    }
}

/// Which MACs are known tapes associated with the customer. MACs are compared in their
/// plain form: 12 upper-case hex digits, no separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registry {
    All,
    AllExcept(HashSet<String>),
    Only(HashSet<String>),
    /// Every MAC except those whose plain form starts with the prefix.
    AllExceptPrefix(String),
    /// The first, and these MACs too (tapes added with add-device).
    Plus(Box<Registry>, HashSet<String>),
}

impl Registry {
    /// Every MAC except the simulated fleet's unregistered ones ([`UNREGISTERED_PREFIX`]).
    pub fn simulated_fleet() -> Self {
        Registry::AllExceptPrefix(hex_upper(&UNREGISTERED_PREFIX))
    }

    /// Whether the MAC (plain form) is registered.
    pub fn is_registered(&self, plain_mac: &str) -> bool {
        match self {
            Registry::All => true,
            Registry::AllExcept(set) => !set.contains(plain_mac),
            Registry::Only(set) => set.contains(plain_mac),
            Registry::AllExceptPrefix(prefix) => !plain_mac.starts_with(prefix.as_str()),
            Registry::Plus(base, extra) => {
                extra.contains(plain_mac) || base.is_registered(plain_mac)
            }
        }
    }

    /// Makes the MAC (plain form) known from now on.
    pub fn register(&mut self, plain_mac: &str) {
        if self.is_registered(plain_mac) {
            return;
        }
        match self {
            Registry::AllExcept(set) => {
                set.remove(plain_mac);
            }
            Registry::Only(set) | Registry::Plus(_, set) => {
                set.insert(plain_mac.to_string());
            }
            Registry::All | Registry::AllExceptPrefix(_) => {
                let base = std::mem::replace(self, Registry::All);
                *self = Registry::Plus(Box::new(base), [plain_mac.to_string()].into());
            }
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::simulated_fleet()
    }
}

/// What the mock accepts in a decode item beyond the spec's shape. The spec leaves the
/// form of `mac_id` and the encoding of `ble_packet` open, and a real account knows its
/// own `product_id`s; a real service takes one of each, not all. So by default the mock
/// takes exactly tapegate's defaults (`mac_id` as 12 upper-case hex digits, `ble_packet`
/// as upper-case hex, the product `tape`), and a wire mistake becomes an item error a
/// test sees instead of passing. A test that means to send another form says so here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRules {
    /// The `mac_id` forms accepted.
    pub mac_formats: Vec<MacFormat>,
    /// Also accept `ble_packet` as lower-case hex or base64 (the encodings a product can
    /// be configured with), not only upper-case hex.
    pub any_packet_encoding: bool,
    /// The `product_id`s accepted; empty: any.
    pub product_ids: Vec<String>,
}

impl Default for WireRules {
    fn default() -> Self {
        WireRules {
            mac_formats: vec![MacFormat::Plain],
            any_packet_encoding: false,
            product_ids: vec!["tape".to_string()],
        }
    }
}

impl WireRules {
    /// Every form the mock can read: both `mac_id` forms, every encoding, any product.
    pub fn lenient() -> Self {
        WireRules {
            mac_formats: vec![MacFormat::Plain, MacFormat::Colon],
            any_packet_encoding: true,
            product_ids: Vec::new(),
        }
    }
}

/// What the mock serves.
#[derive(Debug, Clone, PartialEq)]
pub struct MockConfig {
    pub environments: Vec<MockEnvironment>,
    pub registry: Registry,
    /// Items per bulk request; more gets 413.
    pub max_items: usize,
    /// What a decode item may look like.
    pub wire: WireRules,
    /// Requests per rate window of the label, status and config calls (spec 8).
    pub rate_limit: u32,
    /// Length of that window (tests shorten it rather than wait a minute).
    pub rate_window: Duration,
    /// The reading played on each point the spec leaves open.
    pub readings: Readings,
}

impl MockConfig {
    /// One environment "ppe" with the demo credentials, the simulated fleet's
    /// registry, 250 items per request.
    pub fn demo() -> Self {
        MockConfig {
            environments: vec![MockEnvironment::demo()],
            registry: Registry::default(),
            max_items: DEFAULT_MAX_ITEMS,
            wire: WireRules::default(),
            rate_limit: DEFAULT_RATE_LIMIT,
            rate_window: DEFAULT_RATE_WINDOW,
            readings: Readings::default(),
        }
    }
}

impl Default for MockConfig {
    fn default() -> Self {
        Self::demo()
    }
}

/// Which decode endpoint a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKind {
    Bulk,
    Single,
}

/// One item of a received decode request, as sent (non-string values as JSON text,
/// missing fields empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedItem {
    pub mac_id: String,
    pub ble_packet: String,
    pub product_id: String,
    pub scan_time: String,
}

/// A decode request the mock received, and what it did with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub at: SystemTime,
    pub kind: DecodeKind,
    pub environment: String,
    pub path: String,
    pub correlation_id: Option<String>,
    pub customer_id: Option<String>,
    pub authorized_groups: Option<String>,
    /// Empty when the body was not a JSON array.
    pub items: Vec<ReceivedItem>,
    /// `None` when the connection was closed without an answer.
    pub status: Option<u16>,
    /// The injected fault, if one was applied.
    pub fault: Option<Fault>,
    /// Items answered with a decoded value (after any `DropItems`).
    pub decoded: usize,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Requests to the token endpoints, granted or not.
    pub token_requests: u64,
    pub token_grants: u64,
    pub decode_requests: u64,
    /// Items answered with a decoded value in a 200 answer: what was delivered.
    pub decoded_items: u64,
    /// Items answered with an item error in a 200 answer.
    pub item_errors: u64,
    pub faults_applied: u64,
    /// Received records dropped because of the record limit.
    pub dropped_records: u64,
}

/// A running mock. Dropping it stops the server (as does [`MockHandle::shutdown`]).
pub struct MockHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    root: Url,
    cancel: CancellationToken,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Starts the mock on a free loopback port.
pub async fn start(config: MockConfig) -> io::Result<MockHandle> {
    start_on(SocketAddr::from(([127, 0, 0, 1], 0)), config).await
}

/// Starts the mock on `addr`.
pub async fn start_on(addr: SocketAddr, config: MockConfig) -> io::Result<MockHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let root = Url::parse(&format!("http://{addr}/")).map_err(io::Error::other)?;
    let shared = Arc::new(Shared::new(config));
    let cancel = CancellationToken::new();
    let server = tokio::spawn(accept_loop(listener, shared.clone(), cancel.clone()));
    tracing::debug!(%addr, "mock tracking service listening");
    Ok(MockHandle {
        shared,
        addr,
        root,
        cancel,
        server: Some(server),
    })
}

/// Runs the demo mock on `addr` until Ctrl-C, printing each environment's base, auth
/// and historical URL on stdout (one line each) and then what the account holds, for
/// `tapegate mock`.
pub async fn serve_forever(addr: SocketAddr, config: MockConfig) -> io::Result<()> {
    let handle = start_on(addr, config).await?;
    for env in handle.environments() {
        println!("{env} base_url {}", handle.base_url(&env));
        println!("{env} auth_url {}", handle.auth_url(&env));
        println!(
            "{env} historical_base_url {}",
            handle.historical_base_url(&env)
        );
    }
    println!(
        "history_operation_id {HISTORY_OPERATION_ID}\napplication ids {}\n\
         seeded devices (one per status) {}\n\
         AWB {} (tags {}), AWB {} (404)\n\
         sensor asset {} (tape {}, a year of history), sensor asset {} (no reading)",
        APP_IDS.join(" "),
        seed::STATUS_DEVICES
            .map(|(qr, s)| format!("{qr}={}", s.as_str()))
            .join(" "),
        seed::AWB,
        seed::AWB_TAGS.join(" "),
        seed::AWB_UNPLACED,
        seed::SENSOR_ASSET,
        seed::SENSOR_TAPE,
        seed::UNPLACED_ASSET,
    );
    tokio::signal::ctrl_c().await?;
    handle.shutdown().await;
    Ok(())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, cancel: CancellationToken) {
    let connections = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::debug!(error = %err, "mock accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let cancel = cancel.clone();
        connections.spawn(async move {
            let svc = service_fn(move |req| service::handle(shared.clone(), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            crate::http::serve_connection(conn, &cancel).await;
        });
    }
    drop(listener);
    connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), connections.wait()).await;
}

impl MockHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Names of the configured environments.
    pub fn environments(&self) -> Vec<String> {
        self.shared.environment_names()
    }

    /// `http://127.0.0.1:PORT/{env}/` (any name; an unknown one answers 404).
    pub fn base_url(&self, env: &str) -> Url {
        self.url(&[env, ""])
    }

    /// `http://127.0.0.1:PORT/{env}/oauth/token`.
    pub fn auth_url(&self, env: &str) -> Url {
        self.url(&[env, "oauth", "token"])
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.root.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.clear().extend(segments);
        }
        url
    }

    /// The settings a client needs for environment `env`, or `None` if it is not
    /// configured.
    pub fn environment_settings(&self, env: &str) -> Option<EnvironmentSettings> {
        let e = self.shared.environment(env)?;
        Some(EnvironmentSettings {
            base_url: self.base_url(env),
            auth_url: self.auth_url(env),
            client_id: e.client_id,
            audience: e.audience,
            username: e.username,
            password: e.password,
            customer_id: e.customer_id,
            authorized_groups: e.authorized_groups,
        })
    }

    /// The `[service]` section (with its `[service.environments.<env>]` table) of a
    /// gateway config that delivers to environment `env` of this mock, with the keys the
    /// operator commands need (historical base URL, history operation, application).
    pub fn service_toml(&self, env: &str, request_timeout_secs: u64) -> Option<String> {
        let e = self.environment_settings(env)?;
        Some(format!(
            r#"
[service]
environment = "{env}"
request_timeout_secs = {request_timeout_secs}

[service.environments.{env}]
base_url = "{base}"
auth_url = "{auth}"
client_id = "{client}"
audience = "{audience}"
username = "{user}"
password = "{password}"
customer_id = "{customer}"
authorized_groups = "{groups}"
historical_base_url = "{historical}"
history_operation_id = "{HISTORY_OPERATION_ID}"
default_app_id = "{app}"
"#,
            historical = self.historical_base_url(env),
            app = seed::SEED_APP,
            base = e.base_url,
            auth = e.auth_url,
            client = e.client_id,
            audience = e.audience,
            user = e.username,
            password = e.password.expose(),
            customer = e.customer_id,
            groups = e.authorized_groups,
        ))
    }

    /// Service settings for environment `env` (plain MACs on the wire).
    pub fn service_settings(
        &self,
        env: &str,
        request_timeout: Duration,
    ) -> Option<ServiceSettings> {
        Some(ServiceSettings {
            environment: env.to_string(),
            mac_format: MacFormat::Plain,
            request_timeout,
            ca_file: None,
            endpoint: self.environment_settings(env)?,
        })
    }

    pub fn set_max_items(&self, max_items: usize) {
        self.shared.with(|s| s.max_items = max_items);
    }

    pub fn set_registry(&self, registry: Registry) {
        self.shared.with(|s| s.registry = registry);
    }

    pub fn set_wire_rules(&self, wire: WireRules) {
        self.shared.with(|s| s.wire = wire);
    }

    /// Whether item errors quote the request's `Authorization` header, as a careless
    /// server might: what the gateway stores and shows must not.
    pub fn set_echo_token_in_errors(&self, on: bool) {
        self.shared.with(|s| s.echo_token_in_errors = on);
    }

    /// Whether the API identity has the decode permission (spec 5.7). Without it every
    /// decode is 401 `Unauthorized access`, however fresh the token.
    pub fn set_decode_permission(&self, granted: bool) {
        self.shared.with(|s| s.permission_denied = !granted);
    }

    /// Whether received requests are recorded (counters always run).
    pub fn set_recording(&self, on: bool) {
        self.shared.with(|s| s.recording = on);
    }

    /// How many received requests are kept (the oldest are dropped and counted).
    pub fn set_record_limit(&self, limit: usize) {
        self.shared.with(|s| {
            s.record_limit = limit;
            s.trim_records();
        });
    }

    /// The recorded decode requests, oldest first. A request held by `Fault::Delay`
    /// is processed and recorded at once; only its answer waits.
    pub fn received(&self) -> Vec<Received> {
        self.shared.with(|s| s.received.iter().cloned().collect())
    }

    pub fn clear_received(&self) {
        self.shared.with(|s| s.received.clear());
    }

    pub fn stats(&self) -> MockStats {
        self.shared.with(|s| s.stats)
    }

    /// Tokens granted so far.
    pub fn token_grants(&self) -> u64 {
        self.stats().token_grants
    }

    /// Requests to the token endpoints so far, granted or not.
    pub fn token_requests(&self) -> u64 {
        self.stats().token_requests
    }

    /// Items answered with a decoded value so far (delivered).
    pub fn decoded_items(&self) -> u64 {
        self.stats().decoded_items
    }

    /// Decode requests (bulk and single) so far.
    pub fn decode_requests(&self) -> u64 {
        self.stats().decode_requests
    }

    /// Stops accepting, lets answers in flight finish (up to a second), and waits for
    /// the server task.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_registry_knows_every_mac_but_the_unregistered_prefix() {
        let r = Registry::default();
        assert!(r.is_registered("C0FFEE000001"));
        assert!(!r.is_registered("C0DEAD000001"));
        let only = Registry::Only(["AABBCCDDEEFF".to_string()].into());
        assert!(only.is_registered("AABBCCDDEEFF"));
        assert!(!only.is_registered("C0FFEE000001"));
    }

    #[test]
    fn a_registered_mac_is_known_from_then_on_whatever_the_registry_was() {
        let registries = [
            Registry::All,
            Registry::AllExcept(["C0DEAD000001".to_string()].into()),
            Registry::Only(HashSet::new()),
            Registry::simulated_fleet(),
        ];
        for mut r in registries {
            let before = r.clone();
            r.register("C0DEAD000001");
            assert!(r.is_registered("C0DEAD000001"), "{before:?}");
            assert_eq!(
                r.is_registered("C0DEAD000002"),
                before.is_registered("C0DEAD000002"),
                "{before:?}: no other MAC changes"
            );
        }
    }
}
