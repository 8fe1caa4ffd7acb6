/*!
The handle of a running mock ([`MockHandle`]): its URLs and environments, what a test
sets (faults, registry, wire rules, readings, rate window, permissions, tokens) and
what it reads back (the record, the counters, a device as the service holds it). It
touches the shared state (`service/`) and the types of the parts it sets.
*/

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::config::{MockEnvironment, Registry, WireRules};
use super::devices::Device;
use super::fault::{Fault, MacFault, Storm};
use super::history::HISTORICAL_PREFIX;
use super::mac;
use super::readings::Readings;
use super::record::{Endpoint, MockStats, OperatorReceived, Received};
use super::service::Shared;

/// A running mock. Dropping it stops the server (as does [`MockHandle::shutdown`]).
pub struct MockHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) addr: SocketAddr,
    pub(crate) root: Url,
    pub(crate) cancel: CancellationToken,
    pub(crate) server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Where the mock is, and what it serves.
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

    /// Environment `env` as configured (its credentials, its account), or `None` if it
    /// is not configured: with [`MockHandle::base_url`], [`MockHandle::auth_url`] and
    /// [`MockHandle::historical_base_url`], what onboarding hands out for it.
    pub fn environment(&self, env: &str) -> Option<MockEnvironment> {
        self.shared.environment(env)
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

/// Faults of the decode endpoints.
impl MockHandle {
    /// Queues a one-shot fault for the next decode request (FIFO).
    pub fn push_fault(&self, fault: Fault) {
        self.shared.with(|s| s.faults.push_back(fault));
    }

    /// Drops the queued faults.
    pub fn clear_faults(&self) {
        self.shared.with(|s| s.faults.clear());
    }

    /// Queued faults not yet applied.
    pub fn pending_faults(&self) -> usize {
        self.shared.with(|s| s.faults.len())
    }

    /// Random faults on a fraction of decode requests (queued faults go first).
    pub fn set_storm(&self, storm: Option<Storm>) {
        self.shared.with(|s| {
            s.storm = storm.map(|st| {
                let rng = fastrand::Rng::with_seed(st.seed);
                (st, rng)
            })
        });
    }

    /// Every decode request holding `mac` (any form) gets `fault`, until set to `None`.
    pub fn set_mac_fault(&self, mac: &str, fault: Option<MacFault>) {
        let key = mac::key(mac);
        self.shared.with(|s| s.standing.set_mac_fault(key, fault));
    }

    /// Every decode answer is held this long (an uplink with a long round trip).
    pub fn set_answer_delay(&self, delay: Option<Duration>) {
        self.shared.with(|s| s.standing.set_delay(delay));
    }

    /// MACs (plain form) that arrived in a decode request while another request holding
    /// them was still unanswered, in order of arrival: a client that keeps a MAC in at
    /// most one batch in flight leaves this empty.
    pub fn overlaps(&self) -> Vec<String> {
        self.shared.with(|s| s.standing.overlaps().to_vec())
    }

    /// Decode requests received and not yet answered (held by a delay, say).
    pub fn requests_in_progress(&self) -> usize {
        self.shared.with(|s| s.standing.requests())
    }

    /// A bulk (or single) request holding this MAC (any form) is refused whole with 400
    /// `Invalid ble_packet for <mac>`.
    pub fn set_poison(&self, mac: Option<&str>) {
        let key = mac.map(mac::key);
        self.shared.with(|s| s.poison = key);
    }
}

/// The token endpoint.
impl MockHandle {
    /// Lifetime of tokens granted from now on in `env`; `false` if there is no such
    /// environment.
    pub fn set_expires_in(&self, env: &str, secs: u64) -> bool {
        self.shared
            .with(|s| match s.envs.iter_mut().find(|e| e.name == env) {
                Some(e) => {
                    e.expires_in = secs;
                    true
                }
                None => false,
            })
    }

    /// What token answers say in `expires_in` from now on: any JSON (1e20, -5, "soon").
    /// Granted tokens stay valid for the environment's own lifetime; `None` restores it.
    pub fn set_answered_expires_in(&self, value: Option<serde_json::Value>) {
        self.shared.with(|s| s.tokens.answered_expires_in = value);
    }

    /// The `access_token` text of every grant from now on (such as one holding a line
    /// break, which no header can carry); `None` restores generated tokens.
    pub fn set_token_text(&self, token: Option<String>) {
        self.shared.with(|s| s.tokens.text = token);
    }

    /// Whether the token endpoint refuses every grant quoting the request it refuses
    /// (the form as sent, password included, and as JSON).
    pub fn set_echo_grant_refusals(&self, on: bool) {
        self.shared.with(|s| s.tokens.echo_grant_refusals = on);
    }

    /// Every granted token becomes invalid (the next decode gets 401).
    pub fn revoke_all_tokens(&self) {
        self.shared.with(|s| s.tokens.revoke_all());
    }

    /// Tokens granted for `env` that the service would still take now: a test waits
    /// for this to reach 0 instead of sleeping through a token's lifetime.
    pub fn live_tokens(&self, env: &str) -> usize {
        self.shared.with(|s| s.tokens.live(env))
    }
}

/// The operator endpoints and the account.
impl MockHandle {
    /// Queues a one-shot fault for the next request to `endpoint` (FIFO per endpoint).
    /// `DropItems` does nothing here.
    pub fn push_operator_fault(&self, endpoint: Endpoint, fault: Fault) {
        self.shared
            .with(|s| s.ops.faults.entry(endpoint).or_default().push_back(fault));
    }

    /// Queues a fault for the `nth` request (from 1, counting every request that
    /// arrived) to `endpoint`; it goes before the queue of [`push_operator_fault`].
    ///
    /// [`push_operator_fault`]: MockHandle::push_operator_fault
    pub fn push_operator_fault_at(&self, endpoint: Endpoint, nth: u64, fault: Fault) {
        self.shared
            .with(|s| s.ops.scheduled.insert((endpoint, nth), fault));
    }

    /// Queues a one-shot fault for the next request to the token endpoint (`Status`
    /// and `Refuse` answer at once, `Close` closes the connection; the others do
    /// nothing there).
    pub fn push_token_fault(&self, fault: Fault) {
        self.shared.with(|s| s.ops.token_faults.push_back(fault));
    }

    /// Whether the API identity has the permission for `endpoint` (spec 5.7); without
    /// it, requests with a valid token get 401.
    pub fn set_permission(&self, endpoint: Endpoint, granted: bool) {
        self.shared.with(|s| {
            if granted {
                s.ops.denied.remove(&endpoint);
            } else {
                s.ops.denied.insert(endpoint);
            }
        });
    }

    /// Requests to `endpoint` so far, whatever their answer.
    pub fn operator_requests(&self, endpoint: Endpoint) -> u64 {
        self.shared
            .with(|s| s.ops.counts.get(&endpoint).copied().unwrap_or(0))
    }

    /// The recorded operator requests, oldest first (the newest 10,000).
    pub fn operator_received(&self) -> Vec<OperatorReceived> {
        self.shared
            .with(|s| s.ops.received.iter().cloned().collect())
    }

    /// The device of QR code `qr` as the service holds it now.
    pub fn device(&self, qr: &str) -> Option<Device> {
        self.shared.with(|s| s.ops.devices.get(qr, &s.registry))
    }

    /// Puts a device in place (the operator's own moves, e.g. a reactivation).
    pub fn put_device(&self, device: Device) {
        self.shared.with(|s| s.ops.devices.insert(device));
    }

    /// Requests per rate window and its length, from now on (the current windows are
    /// forgotten).
    pub fn set_rate_window(&self, limit: u32, length: Duration) {
        self.shared.with(|s| {
            s.ops.rate_limit = limit;
            s.ops.rate_window = length;
            s.ops.windows.clear();
        });
    }

    /// `http://127.0.0.1:PORT/{env}/historical/`: the environment's
    /// `historical_base_url`.
    pub fn historical_base_url(&self, env: &str) -> Url {
        self.url(&[env, HISTORICAL_PREFIX, ""])
    }

    /// The readings played from now on.
    pub fn set_readings(&self, readings: Readings) {
        self.shared.with(|s| s.ops.readings = readings);
    }

    pub fn readings(&self) -> Readings {
        self.shared.with(|s| s.ops.readings)
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
