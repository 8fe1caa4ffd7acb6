/*!
The operator endpoints of the mock (spec 4.1, 4.2, 4.5, 4.6, 4.7): their routes, the
steps every one of them takes, and the record of what they received.

Every operator request goes through the same steps, in this order:
1. a fault queued for its endpoint ([`MockHandle::push_operator_fault`]): `Close` and
   `Status` answer before anything is applied (a 5xx on a location read is answered
   the way spec 4.1 says the service reports it: 404 `AWB not found`, or `assets: []`
   in sensor mode); `Delay` applies the request and then holds the answer (the service
   did the work, the client's answer is lost);
2. the bearer token (401, not counted in the rate window: the identity is unknown);
3. for label, relabel, show, deactivate and configure, the shared rate window (429 with
   only `message`; every request with a valid token counts, refused ones included, and
   so does a request answered with an injected 401: a token the service has just
   stopped taking);
4. a permission the identity lacks ([`MockHandle::set_permission`]): 401;
5. the endpoint itself (`devices`, `locations`, `history`, `messages`), under the
   state's lock, then the record.

History is served only under the environment's historical prefix
(`/{env}/historical/`), and nothing else is: a client that mixes up `base_url` and
`historical_base_url` gets 404.
*/

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::devices::{self, Device, Devices};
use super::fault::{outcome_now, Fault};
use super::history::{self, HistorySeed};
use super::locations::{self, LocationSeed};
use super::rate::RateWindow;
use super::readings::Readings;
use super::service::{
    error_answer, header, json_answer, status_of, Answer, CloseConnection, Shared, State,
};
use super::{messages, seed, token, MockConfig, MockEnvironment, MockHandle};

/// Bodies over this get 401 (spec section 7).
const MAX_BODY_BYTES: usize = 50 * 1024 * 1024;
/// The path segment under an environment that serves history.
pub const HISTORICAL_PREFIX: &str = "historical";
/// Operator requests kept in the record.
const RECORD_LIMIT: usize = 10_000;

/// An operator endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /devices/v1/parcel`
    AddDevice,
    /// `POST /external/v1/devices/label`
    Label,
    /// `PUT /external/v1/devices/label`
    Relabel,
    /// `GET /external/v1/devices/label`
    ShowLabels,
    /// `POST /external/v1/devices/status`
    Deactivate,
    /// `POST /external/v1/devices/config`
    Configure,
    /// `GET /external/locations/{asset_id}`
    Locate,
    /// `POST {historical}/agent-service/v1/agent/exec/{uuid}`
    History,
    /// `POST /external/messages`
    Message,
}

impl Endpoint {
    /// The five calls that share the rate window (spec section 8).
    pub fn rate_limited(self) -> bool {
        matches!(
            self,
            Endpoint::Label
                | Endpoint::Relabel
                | Endpoint::ShowLabels
                | Endpoint::Deactivate
                | Endpoint::Configure
        )
    }
}

/// An operator request the mock received, and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorReceived {
    pub at: SystemTime,
    pub endpoint: Endpoint,
    pub environment: String,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Every header but `authorization`, names lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// `None` when the connection was closed without an answer.
    pub status: Option<u16>,
    pub fault: Option<Fault>,
}

impl OperatorReceived {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The operator side of the mock's state.
#[derive(Debug)]
pub(super) struct OpsState {
    pub(super) devices: Devices,
    pub(super) locations: LocationSeed,
    pub(super) history: HistorySeed,
    windows: HashMap<String, RateWindow>,
    pub(super) rate_limit: u32,
    pub(super) rate_window: Duration,
    /// The reading played on each point the spec leaves open.
    pub(super) readings: Readings,
    faults: HashMap<Endpoint, VecDeque<Fault>>,
    /// Faults for the n-th request (from 1) to an endpoint.
    scheduled: HashMap<(Endpoint, u64), Fault>,
    /// Requests that arrived at each endpoint (counted on arrival).
    arrivals: HashMap<Endpoint, u64>,
    /// One-shot faults of the token endpoint.
    pub(super) token_faults: VecDeque<Fault>,
    /// Endpoints the API identity has no permission for.
    denied: HashSet<Endpoint>,
    received: VecDeque<OperatorReceived>,
    counts: HashMap<Endpoint, u64>,
}

impl OpsState {
    /// The seeded account, anchored at the current wall time.
    pub(super) fn new(config: &MockConfig) -> Self {
        let seeded = seed::Seed::new(SystemTime::now());
        let mut devices = Devices::default();
        for d in seeded.devices {
            devices.insert(d);
        }
        OpsState {
            devices,
            locations: seeded.locations,
            history: seeded.history,
            windows: HashMap::new(),
            rate_limit: config.rate_limit,
            rate_window: config.rate_window,
            readings: config.readings,
            faults: HashMap::new(),
            scheduled: HashMap::new(),
            arrivals: HashMap::new(),
            token_faults: VecDeque::new(),
            denied: HashSet::new(),
            received: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// Counts a request of environment `env` in its rate window; whether it is within
    /// the limit.
    fn admit(&mut self, env: &str) -> bool {
        let (limit, length, reading) = (self.rate_limit, self.rate_window, self.readings.rate);
        self.windows
            .entry(env.to_string())
            .or_insert_with(RateWindow::new)
            .admit(Instant::now(), limit, length, reading)
    }

    fn record(&mut self, r: OperatorReceived) {
        *self.counts.entry(r.endpoint).or_default() += 1;
        self.received.push_back(r);
        while self.received.len() > RECORD_LIMIT {
            self.received.pop_front();
        }
    }
}

/// An endpoint's answer before it is rendered: small enough to travel in a `Result`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Self {
        Reply {
            status,
            body: body.clone(),
        }
    }

    /// The spec's error body `{message, code}`.
    pub fn error(code: u16, message: &str) -> Self {
        Reply {
            status: code,
            body: json!({"message": message, "code": code}),
        }
    }

    pub fn unauthorized() -> Self {
        Reply::error(401, "Unauthorized access")
    }

    fn render(&self) -> Answer {
        json_answer(status_of(self.status), &self.body)
    }
}

/// A request as the endpoints see it.
pub(super) struct OpRequest<'a> {
    pub env: &'a MockEnvironment,
    pub parts: &'a Parts,
    pub body: &'a [u8],
    /// The path argument: the asset id of a location read, the uuid of history.
    pub arg: &'a str,
    pub now: SystemTime,
}

impl OpRequest<'_> {
    /// The body as JSON; a body that is not JSON is 401 (spec section 7).
    pub fn json_body(&self) -> Result<Value, Reply> {
        serde_json::from_slice(self.body).map_err(|_| Reply::unauthorized())
    }

    pub fn query_pairs(&self) -> Vec<(String, String)> {
        self.parts
            .uri
            .query()
            .map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .into_owned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header(self.parts, name).filter(|v| !v.is_empty())
    }

    /// Whether `customer_id` and `authorized_groups` (plural) are both present.
    pub fn has_account_headers(&self) -> bool {
        self.header("customer_id").is_some() && self.header("authorized_groups").is_some()
    }

    /// 400 unless `customer_id` and `authorized_groups` are present (spec 4.1).
    pub fn account_headers(&self) -> Result<(), Reply> {
        if self.has_account_headers() {
            Ok(())
        } else {
            Err(Reply::error(400, MISSING_HEADERS))
        }
    }

    /// Whether the account headers name this environment's account: another account
    /// holds nothing of this one's.
    pub fn is_account(&self) -> bool {
        self.header("customer_id").as_deref() == Some(self.env.customer_id.as_str())
            && self.header("authorized_groups").as_deref()
                == Some(self.env.authorized_groups.as_str())
    }
}

/// The message of a 400 for missing account headers (spec 4.1).
pub(super) const MISSING_HEADERS: &str =
    "Missing required headers: customer_id or authorized_groups";

/// 400 `Validation failed` with its `errors` (spec section 7): nothing was changed.
pub(super) fn validation_failed(errors: Vec<Value>) -> Reply {
    Reply::json(
        400,
        &json!({"message": "Validation failed", "code": 400, "errors": errors}),
    )
}

/// The route of an operator request: environment, endpoint, path argument. `Err` is the
/// answer for a known path with the wrong method.
pub(super) fn route(
    method: &Method,
    path: &str,
) -> Option<Result<(String, Endpoint, String), Answer>> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (env, endpoint, arg, allowed): (&str, Endpoint, &str, &[Method]) = match segs.as_slice() {
        [env, "devices", "v1", "parcel"] => (env, Endpoint::AddDevice, "", &[Method::POST]),
        [env, "external", "v1", "devices", "label"] => {
            let endpoint = match *method {
                Method::PUT => Endpoint::Relabel,
                Method::GET => Endpoint::ShowLabels,
                _ => Endpoint::Label,
            };
            (env, endpoint, "", &[Method::POST, Method::PUT, Method::GET])
        }
        [env, "external", "v1", "devices", "status"] => {
            (env, Endpoint::Deactivate, "", &[Method::POST])
        }
        [env, "external", "v1", "devices", "config"] => {
            (env, Endpoint::Configure, "", &[Method::POST])
        }
        [env, "external", "locations", asset] if !asset.is_empty() => {
            (env, Endpoint::Locate, asset, &[Method::GET])
        }
        [env, "external", "messages"] => (env, Endpoint::Message, "", &[Method::POST]),
        [env, HISTORICAL_PREFIX, "agent-service", "v1", "agent", "exec", uuid] => {
            (env, Endpoint::History, uuid, &[Method::POST])
        }
        _ => return None,
    };
    if !allowed.contains(method) {
        return Some(Err(error_answer(405, "Method not allowed")));
    }
    let arg = percent_encoding::percent_decode_str(arg)
        .decode_utf8_lossy()
        .into_owned();
    Some(Ok((env.to_string(), endpoint, arg)))
}

/// Serves one operator request (the steps in the module doc).
pub(super) async fn handle(
    shared: Arc<Shared>,
    env: MockEnvironment,
    endpoint: Endpoint,
    arg: String,
    parts: Parts,
    body: Incoming,
) -> Result<Answer, CloseConnection> {
    let body: Option<Bytes> = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Some(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => None,
        Err(err) => {
            tracing::debug!(error = %err, "mock could not read a request body");
            return Err(CloseConnection);
        }
    };
    let fault = shared.with(|s| {
        let n = s.ops.arrivals.entry(endpoint).or_default();
        *n += 1;
        let nth = *n;
        s.ops.scheduled.remove(&(endpoint, nth)).or_else(|| {
            s.ops
                .faults
                .get_mut(&endpoint)
                .and_then(VecDeque::pop_front)
        })
    });
    let mut record = OperatorReceived {
        at: SystemTime::now(),
        endpoint,
        environment: env.name.clone(),
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts
            .headers
            .iter()
            .filter(|(k, _)| *k != hyper::header::AUTHORIZATION)
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default(),
        status: None,
        fault: fault.clone(),
    };
    if let (Some(Fault::Status { status, .. }), Endpoint::Locate) = (&fault, endpoint) {
        if *status >= 500 {
            // Spec 4.1: the service itself reports a temporary fault of the location
            // read as "nothing found" (404 in AWB mode, `assets: []` in sensor mode).
            let reply = locations::temporary_fault(&parts);
            record.status = Some(reply.status);
            shared.with(|s| s.ops.record(record));
            return Ok(reply.render());
        }
    }
    if let Some(outcome) = outcome_now(fault.as_ref()) {
        record.status = outcome.as_ref().ok().map(|a| a.status().as_u16());
        shared.with(|s| {
            if record.status == Some(401) && endpoint.rate_limited() {
                // A token the service has just stopped taking (expired, revoked):
                // whether such a request counts in the window is not shown; counting
                // it is the strict reading.
                s.ops.admit(&env.name);
            }
            s.ops.record(record)
        });
        return outcome;
    }
    let reply = if !token::bearer_ok(&shared, &env, &parts) {
        Reply::unauthorized()
    } else {
        match body {
            // Spec section 7: a body over 50 MB is 401.
            None => Reply::unauthorized(),
            Some(body) => shared.with(|s| {
                let req = OpRequest {
                    env: &env,
                    parts: &parts,
                    body: &body,
                    arg: &arg,
                    now: SystemTime::now(),
                };
                serve(s, endpoint, &req)
            }),
        }
    };
    record.status = Some(reply.status);
    shared.with(|s| s.ops.record(record));
    let mut answer = reply.render();
    if endpoint == Endpoint::AddDevice {
        // Spec 4.6: `X-Correlation-Id` is generated when absent; the answer carries it.
        let id = header(&parts, "x-correlation-id")
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("mock-{:016x}", fastrand::u64(..)));
        if let Ok(v) = hyper::header::HeaderValue::from_str(&id) {
            answer.headers_mut().insert("x-correlation-id", v);
        }
    }
    if let Some(Fault::Delay(d)) = fault {
        tokio::time::sleep(d).await;
    }
    Ok(answer)
}

/// Steps 3 to 5: the rate window, the permission, then the endpoint.
fn serve(s: &mut State, endpoint: Endpoint, req: &OpRequest<'_>) -> Reply {
    if endpoint.rate_limited() {
        if !s.ops.admit(&req.env.name) {
            return Reply::json(429, &json!({"message": "Too many requests"}));
        }
        if let Err(answer) = token_account(req) {
            return answer;
        }
    }
    if s.ops.denied.contains(&endpoint) {
        // A permission the identity lacks: 401 even with a fresh token (spec 5.7),
        // and it has counted in the window above (spec 8).
        return Reply::unauthorized();
    }
    match endpoint {
        Endpoint::AddDevice => devices::add(s, req),
        Endpoint::Label => devices::label(s, req),
        Endpoint::Relabel => devices::relabel(s, req),
        Endpoint::ShowLabels => devices::show(s, req),
        Endpoint::Deactivate => devices::deactivate(s, req),
        Endpoint::Configure => devices::configure(s, req),
        Endpoint::Locate => locations::locate(s, req),
        Endpoint::History => history::history(s, req),
        Endpoint::Message => messages::message(req),
    }
}

/// The optional account choice of the token-account calls (spec 4.7): `customer_id`
/// and `authorized_group` (singular), both or neither, naming an account of the
/// identity (here: the environment's one).
fn token_account(req: &OpRequest<'_>) -> Result<(), Reply> {
    match (req.header("customer_id"), req.header("authorized_group")) {
        (None, None) => Ok(()),
        (Some(c), Some(g)) if c == req.env.customer_id && g == req.env.authorized_groups => Ok(()),
        (Some(_), Some(_)) => Err(Reply::unauthorized()),
        _ => Err(Reply::error(
            400,
            "Missing required headers: customer_id and authorized_group",
        )),
    }
}

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
    pub fn historical_base_url(&self, env: &str) -> url::Url {
        self.url(&[env, HISTORICAL_PREFIX, ""])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(method: Method, path: &str) -> (String, Endpoint, String) {
        match route(&method, path) {
            Some(Ok(r)) => r,
            _ => panic!("{method} {path} not routed"),
        }
    }

    #[test]
    fn the_label_path_is_three_endpoints_by_method() {
        assert_eq!(
            ok(Method::POST, "/ppe/external/v1/devices/label").1,
            Endpoint::Label
        );
        assert_eq!(
            ok(Method::PUT, "/ppe/external/v1/devices/label").1,
            Endpoint::Relabel
        );
        assert_eq!(
            ok(Method::GET, "/ppe/external/v1/devices/label").1,
            Endpoint::ShowLabels
        );
        assert!(matches!(
            route(&Method::DELETE, "/ppe/external/v1/devices/label"),
            Some(Err(_))
        ));
    }

    #[test]
    fn history_is_routed_only_under_the_historical_prefix() {
        let (env, e, uuid) = ok(
            Method::POST,
            "/ppe/historical/agent-service/v1/agent/exec/abc",
        );
        assert_eq!(
            (env.as_str(), e, uuid.as_str()),
            ("ppe", Endpoint::History, "abc")
        );
        assert!(route(&Method::POST, "/ppe/agent-service/v1/agent/exec/abc").is_none());
        assert!(route(&Method::POST, "/ppe/historical/external/messages").is_none());
    }

    #[test]
    fn the_asset_id_of_a_location_read_is_percent_decoded() {
        let (_, e, asset) = ok(Method::GET, "/ppe/external/locations/020%2012345675");
        assert_eq!((e, asset.as_str()), (Endpoint::Locate, "020 12345675"));
    }
}
