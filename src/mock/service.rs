/*!
Request handling of the mock: routing, the state shared by the endpoints, the record of
received requests and the answer helpers. Each endpoint is a file beside this one
(`token`, `decode`), and `fault` injects faults. The state sits behind one std mutex
that is never held across an await (faults are taken out, then applied).
*/

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::fault::{Fault, Standing, Storm};
use super::token::IssuedToken;
use super::{
    decode, token, DecodeKind, MockConfig, MockEnvironment, MockStats, Received, Registry,
    WireRules, DEFAULT_RECORD_LIMIT,
};
use crate::record::Mac;

/// Bodies over this get 401 (spec section 7: "body over 50 MB").
const MAX_BODY_BYTES: usize = 50 * 1024 * 1024;

pub(super) type Answer = Response<Full<Bytes>>;

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
pub(super) struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed on purpose (fault injection)")
    }
}

impl std::error::Error for CloseConnection {}

/// Everything the endpoints share: configuration, granted tokens, faults, the record.
pub(super) struct State {
    pub envs: Vec<MockEnvironment>,
    pub registry: Registry,
    pub max_items: usize,
    pub wire: WireRules,
    /// The API identity lacks the decode permission: 401 with any token.
    pub permission_denied: bool,
    /// Item errors quote the request's bearer token (a careless server).
    pub echo_token_in_errors: bool,
    /// The token endpoint refuses every grant, quoting the request it refuses (the
    /// form, as sent and as JSON): a careless server or proxy.
    pub echo_grant_refusals: bool,
    pub tokens: HashMap<String, IssuedToken>,
    pub faults: VecDeque<Fault>,
    pub storm: Option<(Storm, fastrand::Rng)>,
    /// Plain form of the poison MAC.
    pub poison: Option<String>,
    pub standing: Standing,
    pub received: VecDeque<Received>,
    /// What the token answer says in `expires_in` instead of the environment's lifetime
    /// (any JSON, such as 1e20); the tokens stay valid for the environment's lifetime.
    pub answered_expires_in: Option<Value>,
    /// The `access_token` text granted instead of a generated one.
    pub token_text: Option<String>,
    pub recording: bool,
    pub record_limit: usize,
    pub stats: MockStats,
    /// The operator endpoints' state: devices, seeds, rate windows, their record.
    pub ops: super::ops::OpsState,
}

impl State {
    pub(super) fn new(config: MockConfig) -> Self {
        State {
            ops: super::ops::OpsState::new(&config),
            envs: config.environments,
            registry: config.registry,
            max_items: config.max_items,
            wire: config.wire,
            permission_denied: false,
            echo_token_in_errors: false,
            echo_grant_refusals: false,
            tokens: HashMap::new(),
            faults: VecDeque::new(),
            storm: None,
            poison: None,
            standing: Standing::default(),
            received: VecDeque::new(),
            answered_expires_in: None,
            token_text: None,
            recording: true,
            record_limit: DEFAULT_RECORD_LIMIT,
            stats: MockStats::default(),
        }
    }

    pub fn trim_records(&mut self) {
        while self.received.len() > self.record_limit {
            self.received.pop_front();
            self.stats.dropped_records += 1;
        }
    }

    pub(super) fn record(&mut self, r: Received) {
        if r.status == Some(200) {
            self.stats.decoded_items += r.decoded as u64;
        }
        if r.fault.is_some() {
            self.stats.faults_applied += 1;
        }
        if self.recording {
            self.received.push_back(r);
            self.trim_records();
        }
    }
}

pub(super) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub fn new(config: MockConfig) -> Self {
        Shared {
            state: Mutex::new(State::new(config)),
        }
    }

    /// Runs `f` on the state. Never held across an await, so a poisoned lock still
    /// guards consistent data.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    pub fn environment(&self, name: &str) -> Option<MockEnvironment> {
        self.with(|s| s.envs.iter().find(|e| e.name == name).cloned())
    }

    pub fn environment_names(&self) -> Vec<String> {
        self.with(|s| s.envs.iter().map(|e| e.name.clone()).collect())
    }
}

/// Plain form of a MAC given in any form (upper case, no separators); the input
/// upper-cased when it is no MAC.
pub(super) fn mac_key(mac: &str) -> String {
    match mac.parse::<Mac>() {
        Ok(m) => m.plain(),
        Err(_) => mac.to_ascii_uppercase(),
    }
}
pub(super) fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(super) fn status_of(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The spec's error body `{message, code}`.
pub(super) fn error_answer(code: u16, message: &str) -> Answer {
    json_answer(status_of(code), &json!({"message": message, "code": code}))
}

/// The spec's validation failure (section 7): `Validation failed`, code 400, and one
/// entry in `errors` per problem.
pub(super) fn validation_failed(errors: &[String]) -> Answer {
    json_answer(
        StatusCode::BAD_REQUEST,
        &json!({"message": "Validation failed", "code": 400, "errors": errors}),
    )
}

pub(super) fn unauthorized() -> Answer {
    error_answer(401, "Unauthorized access")
}

pub(super) fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Decodes `%XX` escapes of a path segment (other bytes as they are).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

enum Route {
    Token(String),
    Bulk(String),
    Single(String, String),
}

fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        [env, "oauth", "token"] => Some(Route::Token(env.to_string())),
        [env, "external", "v1", "devices", "decode"] => Some(Route::Bulk(env.to_string())),
        [env, "external", "v1", "devices", mac, "decode"] => {
            Some(Route::Single(env.to_string(), percent_decode(mac)))
        }
        _ => None,
    }
}
/// The hyper service: one request in, one answer out (or the connection closed).
pub(super) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Answer, CloseConnection> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if let Some(op) = super::ops::route(&parts.method, &path) {
        let (env_name, endpoint, arg) = match op {
            Ok(r) => r,
            Err(answer) => return Ok(answer),
        };
        let Some(env) = shared.environment(&env_name) else {
            return Ok(error_answer(404, "Not found"));
        };
        return super::ops::handle(shared, env, endpoint, arg, parts, body).await;
    }
    let Some(route) = route(&path) else {
        return Ok(error_answer(404, "Not found"));
    };
    let env_name = match &route {
        Route::Token(e) | Route::Bulk(e) | Route::Single(e, _) => e.clone(),
    };
    let Some(env) = shared.environment(&env_name) else {
        return Ok(error_answer(404, "Not found"));
    };
    if parts.method != Method::POST {
        return Ok(error_answer(405, "Method not allowed"));
    }
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Some(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => None,
        Err(err) => {
            tracing::debug!(error = %err, "mock could not read a request body");
            return Err(CloseConnection);
        }
    };
    match route {
        Route::Token(_) => {
            let fault = shared.with(|s| s.ops.token_faults.pop_front());
            if let Some(outcome) = super::fault::outcome_now(fault.as_ref()) {
                shared.with(|s| s.stats.token_requests += 1);
                return outcome;
            }
            token_answer(&shared, &env, &parts, body)
        }
        Route::Bulk(_) => {
            decode::decode(&shared, &env, DecodeKind::Bulk, None, parts, path, body).await
        }
        Route::Single(_, mac) => {
            decode::decode(
                &shared,
                &env,
                DecodeKind::Single,
                Some(mac),
                parts,
                path,
                body,
            )
            .await
        }
    }
}

fn token_answer(
    shared: &Shared,
    env: &MockEnvironment,
    parts: &Parts,
    body: Option<Bytes>,
) -> Result<Answer, CloseConnection> {
    Ok(match body {
        Some(body) => token::token(shared, env, parts, &body),
        None => token::oauth_error(413, "invalid_request", "Request body too large"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_the_environment_and_the_endpoint() {
        assert!(matches!(route("/ppe/oauth/token"), Some(Route::Token(e)) if e == "ppe"));
        assert!(
            matches!(route("/ppe/external/v1/devices/decode"), Some(Route::Bulk(e)) if e == "ppe")
        );
        assert!(matches!(
            route("/prod/external/v1/devices/AA%3ABB%3ACC%3ADD%3AEE%3AFF/decode"),
            Some(Route::Single(e, m)) if e == "prod" && m == "AA:BB:CC:DD:EE:FF"
        ));
        assert!(route("/ppe/external/v1/devices").is_none());
        assert!(route("/").is_none());
    }

    #[test]
    fn percent_decoding_leaves_broken_escapes_alone() {
        assert_eq!(percent_decode("a%3Ab"), "a:b");
        assert_eq!(percent_decode("a%3"), "a%3");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
