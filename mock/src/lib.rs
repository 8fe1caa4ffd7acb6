/*!
A spec-faithful mock of the tracking service: the token endpoint (spec section 5), bulk
and single decode (4.4, 4.3) with the error answers of section 7, and the operator
endpoints (4.1, 4.2, 4.5-4.7) with the device state machine of section 3 and the limits
of section 8, on a loopback port.

Why it exists: the daemon's promises (nothing lost, batches split on 400, one token
refresh on 401, backoff on 429/5xx) can only be tested against a service that answers
like the real one and can be made to misbehave on purpose. Tests start one per test
with [`start`]; `tapegate demo` and `tapegate mock` run it with [`MockConfig::demo`].

It is a crate of its own and depends on nothing of the gateway: the gateway's tests,
benchmarks and demo depend on it, never the other way, and it reads what the gateway
sends (MACs, packets) with code of its own, so that a client bug cannot hide behind a
shared codec. What it exposes is plain data: URLs, credentials, records.

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
[`MockHandle::historical_base_url`] give the URLs, and [`MockHandle::environment`] the
credentials and account of an environment.

In the code, from the top down (no file imports one above it): the [`MockHandle`] a
test holds (this file starts the server); the service, the router and the state every
part shares, with the steps each kind of request takes around its part's rules (for
decode: the fault, the token, the record; for the operator endpoints also the rate
window and the permission); one file per part of the spec, each given its own piece of
the state (the token of 5, decode of 4.3 and 4.4, add-device of 4.6, the labels,
deactivation and configuration of 4.7 over the account's devices with the state
machine of 3 and the rules of a multi-device body of 2.5, locations of 4.1, history of
4.2, messages of 4.5, the shared window of 8), with what the account holds at start and
the faults; and the leaves: [`MockConfig`], [`MockClock`], what was received, a request
as the parts see it and their answers, the readings, the simulated tape's packet, the
MAC.

A new endpoint is a new file and a route. The request shapes the spec does not show
are the project's choice, listed in the module docs of those files; where the spec is
silent on what a service does, the mock plays each reading, chosen per test
(`readings.rs`, [`Readings`]).

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
payload alone. The layout is the one the gateway's simulated fleet writes
(`tapegate::source::sim::tape`), read by the mock's own code (`packet.rs`); the mock answers:

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

mod answer;
mod batch;
mod clock;
mod config;
mod configure;
mod deactivate;
mod decode;
mod devices;
mod fault;
mod handle;
mod history;
mod labels;
mod locations;
mod mac;
mod messages;
pub mod packet;
mod parcel;
mod rate;
mod readings;
mod record;
mod request;
pub mod seed;
mod service;
mod token;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use url::Url;

pub use clock::MockClock;
pub use config::{
    MockConfig, MockEnvironment, Registry, WireRules, APP_IDS, DEFAULT_MAX_ITEMS,
    DEFAULT_RECORD_LIMIT, FW_VER, UNREGISTERED_PREFIX,
};
pub use devices::{
    fleet_qrcode, Device, DeviceStatus, Label, ALREADY_IN_TARGET_STATE, ALREADY_LABELLED,
    DEVICE_NOT_FOUND, INVALID_TRANSITION, MAX_LABEL_DEVICES, MAX_STATUS_DEVICES, QRMAC_NOT_FOUND,
};
pub use fault::{Fault, MacFault, Storm};
pub use handle::MockHandle;
pub use history::{
    HISTORICAL_PREFIX, HISTORY_OPERATION_ID, HISTORY_VERSION, LAG_SECS, MAX_AGE_DAYS, MAX_EVENTS,
    MAX_SPAN_DAYS,
};
pub use locations::{LOCATION_UUID, LOCATION_VERSION, SENSORS, VENDOR_ID};
pub use mac::MacFormat;
pub use messages::MESSAGE_TYPES;
pub use rate::{DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW};
pub use readings::{HistoryKeeps, HistoryOrder, LookupShape, QrEcho, RateWindows, Readings};
pub use record::{DecodeKind, Endpoint, MockStats, OperatorReceived, Received, ReceivedItem};

use service::Shared;

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

/// Runs the mock on `addr` until Ctrl-C, printing each environment's base, auth and
/// historical URL on stdout (one line each) and then what the account holds, for
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
        connections.spawn(async move { serve_connection(stream, shared, &cancel).await });
    }
    drop(listener);
    connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), connections.wait()).await;
}

/// Serves one connection until it ends, or until `stop`: then the request in progress
/// gets a second to finish (as the gateway's own HTTP server does).
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, stop: &CancellationToken) {
    let svc = service_fn(move |req| service::handle(shared.clone(), req));
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "http connection ended");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        }
    }
}
