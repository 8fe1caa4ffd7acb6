/*!
Request handling of the mock: routing, the token endpoint, the decode endpoints, fault
injection and the record. The state sits behind one std mutex that is never held across
an await (faults are taken out, then applied).
*/

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::record::Mac;

use super::packet::decode_packet;
use super::{
    DecodeKind, Fault, MockConfig, MockEnvironment, MockStats, Received, ReceivedItem, Registry,
    Storm, DEFAULT_RECORD_LIMIT, FW_VER,
};
use crate::tape::TapeReading;

/// Bodies over this get 401 (spec section 7: "body over 50 MB").
const MAX_BODY_BYTES: usize = 50 * 1024 * 1024;
const NOT_FOUND_ITEM: &str = "device not found or not associated with the customer";
const INVALID_PACKET_ITEM: &str = "invalid ble_packet";
const REQUIRED_FIELDS: [&str; 4] = ["mac_id", "ble_packet", "product_id", "scan_time"];

type Answer = Response<Full<Bytes>>;

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
pub(super) struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed on purpose (fault injection)")
    }
}

impl std::error::Error for CloseConnection {}

pub(super) struct IssuedToken {
    env: String,
    expires_at: Instant,
}

pub(super) struct State {
    pub envs: Vec<MockEnvironment>,
    pub registry: Registry,
    pub max_items: usize,
    pub tokens: HashMap<String, IssuedToken>,
    pub faults: VecDeque<Fault>,
    pub storm: Option<(Storm, fastrand::Rng)>,
    /// Plain form of the poison MAC.
    pub poison: Option<String>,
    pub received: VecDeque<Received>,
    pub recording: bool,
    pub record_limit: usize,
    pub stats: MockStats,
}

impl State {
    pub fn trim_records(&mut self) {
        while self.received.len() > self.record_limit {
            self.received.pop_front();
            self.stats.dropped_records += 1;
        }
    }

    fn record(&mut self, r: Received) {
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

    /// The next fault: the queue first, else a roll of the storm.
    fn next_fault(&mut self) -> Option<Fault> {
        if let Some(f) = self.faults.pop_front() {
            return Some(f);
        }
        let (storm, rng) = self.storm.as_mut()?;
        if storm.mix.is_empty() || rng.f64() >= storm.probability {
            return None;
        }
        Some(storm.mix[rng.usize(..storm.mix.len())].clone())
    }
}

pub(super) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub fn new(config: MockConfig) -> Self {
        Shared {
            state: Mutex::new(State {
                envs: config.environments,
                registry: config.registry,
                max_items: config.max_items,
                tokens: HashMap::new(),
                faults: VecDeque::new(),
                storm: None,
                poison: None,
                received: VecDeque::new(),
                recording: true,
                record_limit: DEFAULT_RECORD_LIMIT,
                stats: MockStats::default(),
            }),
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

/// The MAC of a `mac_id`, accepted as `AABBCCDDEEFF` or `AA:BB:CC:DD:EE:FF`.
fn parse_mac_id(mac_id: &str) -> Option<Mac> {
    let colons = mac_id.matches(':').count();
    if mac_id.contains('-') || (colons != 0 && colons != 5) {
        return None;
    }
    mac_id.parse().ok()
}

fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn status_of(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The spec's error body `{message, code}`.
fn error_answer(code: u16, message: &str) -> Answer {
    json_answer(status_of(code), &json!({"message": message, "code": code}))
}

fn unauthorized() -> Answer {
    error_answer(401, "Unauthorized access")
}

fn oauth_error(code: u16, error: &str, description: &str) -> Answer {
    json_answer(
        status_of(code),
        &json!({"error": error, "error_description": description}),
    )
}

/// The answer of a `Fault::Status`.
fn fault_answer(code: u16, retry_after: Option<&str>) -> Answer {
    let mut resp = match code {
        429 => json_answer(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({"message": "Too many requests"}),
        ),
        401 => unauthorized(),
        _ => {
            let status = status_of(code);
            error_answer(
                status.as_u16(),
                status.canonical_reason().unwrap_or("Server error"),
            )
        }
    };
    if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    resp
}

fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Decodes `%XX` escapes of a path segment (other bytes as they are).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
        Route::Token(_) => Ok(match body {
            Some(body) => token(&shared, &env, &parts, &body),
            None => oauth_error(413, "invalid_request", "Request body too large"),
        }),
        Route::Bulk(_) => decode(&shared, &env, DecodeKind::Bulk, None, parts, path, body).await,
        Route::Single(_, mac) => {
            decode(
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

/// The password grant of one environment (spec section 5), Auth0-like errors.
fn token(shared: &Shared, env: &MockEnvironment, parts: &Parts, body: &[u8]) -> Answer {
    shared.with(|s| s.stats.token_requests += 1);
    let form_encoded = header(parts, "content-type").is_some_and(|c| {
        c.to_ascii_lowercase()
            .starts_with("application/x-www-form-urlencoded")
    });
    if !form_encoded {
        return oauth_error(
            400,
            "invalid_request",
            "Content-Type must be application/x-www-form-urlencoded",
        );
    }
    let form: HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    let field = |k: &str| form.get(k).map(String::as_str).filter(|v| !v.is_empty());
    for k in [
        "grant_type",
        "username",
        "password",
        "client_id",
        "audience",
    ] {
        if field(k).is_none() {
            return oauth_error(
                400,
                "invalid_request",
                &format!("Missing required parameter: {k}"),
            );
        }
    }
    if field("grant_type") != Some("password") {
        return oauth_error(
            400,
            "unsupported_grant_type",
            "Unsupported grant type; use password",
        );
    }
    if field("client_id") != Some(env.client_id.as_str()) {
        return oauth_error(403, "access_denied", "Unknown or unauthorized client");
    }
    if let Some(aud) = field("audience").filter(|a| *a != env.audience) {
        return oauth_error(403, "access_denied", &format!("Service not found: {aud}"));
    }
    if field("username") != Some(env.username.as_str())
        || field("password") != Some(env.password.expose())
    {
        return oauth_error(401, "invalid_grant", "Wrong email or password.");
    }
    let token = format!(
        "mock-{}-{}",
        env.name,
        (0..40)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>()
    );
    let now = Instant::now();
    shared.with(|s| {
        s.tokens.retain(|_, t| t.expires_at > now);
        s.tokens.insert(
            token.clone(),
            IssuedToken {
                env: env.name.clone(),
                expires_at: now + Duration::from_secs(env.expires_in),
            },
        );
        s.stats.token_grants += 1;
    });
    let mut resp = json_answer(
        StatusCode::OK,
        &json!({"access_token": token, "token_type": "Bearer", "expires_in": env.expires_in}),
    );
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The items of a bulk body, leniently, for the record.
fn received_items(body: &Value) -> Vec<ReceivedItem> {
    let Value::Array(items) = body else {
        return Vec::new();
    };
    let field = |item: &Value, k: &str| match item.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    items
        .iter()
        .map(|i| ReceivedItem {
            mac_id: field(i, "mac_id"),
            ble_packet: field(i, "ble_packet"),
            product_id: field(i, "product_id"),
            scan_time: field(i, "scan_time"),
        })
        .collect()
}

/// What one packet decodes to, or the item error text.
fn decode_item(
    item: &ReceivedItem,
    associated: bool,
    registry: &Registry,
) -> Result<(Mac, TapeReading, Value), &'static str> {
    let mac = parse_mac_id(&item.mac_id)
        .filter(|m| associated && registry.is_registered(&m.plain()))
        .ok_or(NOT_FOUND_ITEM)?;
    let payload = decode_packet(&item.ble_packet).ok_or(INVALID_PACKET_ITEM)?;
    let ts = scan_time_number(&item.scan_time).ok_or("invalid scan_time")?;
    Ok((mac, payload, ts))
}

/// `scan_time` as a JSON number (integer when it is one).
fn scan_time_number(s: &str) -> Option<Value> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Some(Value::from(n));
    }
    let f = s
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)?;
    serde_json::Number::from_f64(f).map(Value::Number)
}

/// The decoded packet. `full`: every field of spec 2.3 (single decode); otherwise the
/// fields the bulk answer lists.
fn decoded_fields(mac: Mac, p: &TapeReading, ts: Value, full: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("qr_code".into(), Value::from(format!("TT{}", mac.plain())));
    m.insert("cts".into(), Value::from(p.counter));
    m.insert("ts".into(), ts);
    m.insert("bat".into(), Value::from(p.battery));
    m.insert("temp".into(), Value::from(p.temp_c()));
    if full {
        for k in ["over_temp", "over_temp_ts", "shock", "shock_ts"] {
            m.insert(k.into(), Value::from(0));
        }
        m.insert("shock_count".into(), Value::from(p.shock_count));
        m.insert("fw_ver".into(), Value::from(FW_VER));
    }
    m
}

/// Both decode endpoints: fault, auth, headers, body checks, then the answer.
async fn decode(
    shared: &Shared,
    env: &MockEnvironment,
    kind: DecodeKind,
    path_mac: Option<String>,
    parts: Parts,
    path: String,
    body: Option<Bytes>,
) -> Result<Answer, CloseConnection> {
    let (fault, rules) = shared.with(|s| {
        s.stats.decode_requests += 1;
        let rules = Rules {
            registry: s.registry.clone(),
            max_items: s.max_items,
            poison: s.poison.clone(),
            drop_items: 0,
        };
        (s.next_fault(), rules)
    });
    let mut rules = rules;
    let parsed_body: Option<Value> = match (&body, kind) {
        (Some(b), DecodeKind::Bulk) => serde_json::from_slice(b).ok(),
        _ => None,
    };
    let items = match (kind, &path_mac) {
        (DecodeKind::Single, Some(mac)) => vec![ReceivedItem {
            mac_id: mac.clone(),
            ble_packet: header(&parts, "ble_packet").unwrap_or_default(),
            product_id: header(&parts, "product_id").unwrap_or_default(),
            scan_time: header(&parts, "scan_time").unwrap_or_default(),
        }],
        _ => parsed_body.as_ref().map(received_items).unwrap_or_default(),
    };
    let mut rec = Received {
        at: SystemTime::now(),
        kind,
        environment: env.name.clone(),
        path,
        correlation_id: header(&parts, "correlation_id"),
        customer_id: header(&parts, "customer_id"),
        authorized_groups: header(&parts, "authorized_groups"),
        items,
        status: None,
        fault: fault.clone(),
        decoded: 0,
    };
    match fault {
        Some(Fault::Close) => {
            tracing::debug!(path = %rec.path, "mock fault: closing the connection");
            shared.with(|s| s.record(rec));
            return Err(CloseConnection);
        }
        Some(Fault::Status {
            status,
            retry_after,
        }) => {
            let answer = fault_answer(status, retry_after.as_deref());
            rec.status = Some(answer.status().as_u16());
            shared.with(|s| s.record(rec));
            return Ok(answer);
        }
        // Processed now, answered late: a client that gives up first has still had its
        // items decoded, as with a real service whose answer is lost on the way.
        Some(Fault::Delay(_)) => {}
        Some(Fault::DropItems(n)) => rules.drop_items = n,
        None => {}
    }

    let (answer, decoded) = answer_decode(
        shared,
        env,
        &parts,
        &rec,
        body.is_some(),
        parsed_body,
        &rules,
    );
    rec.status = Some(answer.status().as_u16());
    rec.decoded = decoded;
    tracing::debug!(
        path = %rec.path,
        correlation_id = rec.correlation_id.as_deref().unwrap_or(""),
        items = rec.items.len(),
        status = answer.status().as_u16(),
        decoded,
        "mock answered a decode request"
    );
    shared.with(|s| s.record(rec));
    if let Some(Fault::Delay(d)) = fault {
        tokio::time::sleep(d).await;
    }
    Ok(answer)
}

/// The per-request copy of the runtime settings that shape a decode answer.
struct Rules {
    registry: Registry,
    max_items: usize,
    /// Plain form of the poison MAC.
    poison: Option<String>,
    /// Items to leave out of a bulk answer (`Fault::DropItems`).
    drop_items: usize,
}

/// The answer to a decode request without fault, and how many items it decoded.
fn answer_decode(
    shared: &Shared,
    env: &MockEnvironment,
    parts: &Parts,
    rec: &Received,
    body_in_limit: bool,
    parsed_body: Option<Value>,
    rules: &Rules,
) -> (Answer, usize) {
    let token_ok = header(parts, AUTHORIZATION.as_str())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        })
        .is_some_and(|token| {
            let now = Instant::now();
            shared.with(|s| {
                s.tokens
                    .get(&token)
                    .is_some_and(|t| t.env == env.name && t.expires_at > now)
            })
        });
    if !token_ok || !body_in_limit {
        return (unauthorized(), 0);
    }
    let non_empty = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
    if !non_empty(&rec.customer_id) || !non_empty(&rec.authorized_groups) {
        return (
            error_answer(
                400,
                "Missing required headers: customer_id or authorized_groups",
            ),
            0,
        );
    }
    let associated = rec.customer_id.as_deref() == Some(env.customer_id.as_str())
        && rec.authorized_groups.as_deref() == Some(env.authorized_groups.as_str());
    match rec.kind {
        DecodeKind::Single => answer_single(parts, rec, associated, rules),
        DecodeKind::Bulk => answer_bulk(shared, parsed_body, associated, rules),
    }
}

fn answer_single(
    parts: &Parts,
    rec: &Received,
    associated: bool,
    rules: &Rules,
) -> (Answer, usize) {
    let missing: Vec<&str> = ["product_id", "ble_packet", "scan_time"]
        .into_iter()
        .filter(|k| header(parts, k).is_none_or(|v| v.trim().is_empty()))
        .collect();
    if !missing.is_empty() {
        let msg = format!("Missing required parameters: {}", missing.join(", "));
        return (error_answer(400, &msg), 0);
    }
    let Some(item) = rec.items.first() else {
        return (error_answer(400, "Missing required parameters: mac_id"), 0);
    };
    if rules.poison.as_deref() == Some(mac_key(&item.mac_id).as_str()) {
        let msg = format!("Invalid ble_packet for {}", item.mac_id);
        return (error_answer(400, &msg), 0);
    }
    match decode_item(item, associated, &rules.registry) {
        Ok((mac, payload, ts)) => (
            json_answer(
                StatusCode::OK,
                &Value::Object(decoded_fields(mac, &payload, ts, true)),
            ),
            1,
        ),
        Err(NOT_FOUND_ITEM) => (
            error_answer(404, "Device not found or not associated with the customer"),
            0,
        ),
        Err(INVALID_PACKET_ITEM) => (error_answer(400, "Invalid ble_packet"), 0),
        Err(other) => (error_answer(400, &format!("Invalid parameter: {other}")), 0),
    }
}

fn answer_bulk(
    shared: &Shared,
    parsed_body: Option<Value>,
    associated: bool,
    rules: &Rules,
) -> (Answer, usize) {
    let max_items = rules.max_items;
    // Spec section 7 lists "body not valid JSON" under 401.
    let Some(body) = parsed_body else {
        return (unauthorized(), 0);
    };
    let Value::Array(raw_items) = body else {
        return (
            error_answer(400, "Request body must be a JSON array of items"),
            0,
        );
    };
    if raw_items.len() > max_items {
        let msg = format!(
            "Request body has {} items; at most {max_items} are allowed",
            raw_items.len()
        );
        return (error_answer(413, &msg), 0);
    }
    let mut items = Vec::with_capacity(raw_items.len());
    for (index, raw) in raw_items.iter().enumerate() {
        let mut fields = Vec::with_capacity(4);
        for k in REQUIRED_FIELDS {
            match raw.get(k) {
                Some(Value::String(s)) => fields.push(s.clone()),
                _ => {
                    let msg = format!(
                        "Validation failed: item {index}: {k} is required and must be a string"
                    );
                    return (error_answer(400, &msg), 0);
                }
            }
        }
        let [mac_id, ble_packet, product_id, scan_time]: [String; 4] = match fields.try_into() {
            Ok(f) => f,
            Err(_) => return (error_answer(400, "Validation failed"), 0),
        };
        items.push(ReceivedItem {
            mac_id,
            ble_packet,
            product_id,
            scan_time,
        });
    }
    let mut first_index: HashMap<String, usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        if let Some(first) = first_index.insert(mac_key(&item.mac_id), index) {
            let msg = format!(
                "Duplicate mac_id {} (items {first} and {index})",
                item.mac_id
            );
            return (error_answer(400, &msg), 0);
        }
    }
    let poisoned = rules
        .poison
        .as_deref()
        .and_then(|p| items.iter().find(|i| mac_key(&i.mac_id) == p));
    if let Some(bad) = poisoned {
        let msg = format!("Invalid ble_packet for {}", bad.mac_id);
        return (error_answer(400, &msg), 0);
    }

    let keep = items.len().saturating_sub(rules.drop_items);
    let mut answer = Vec::with_capacity(keep);
    let (mut decoded, mut errors) = (0usize, 0u64);
    for item in items.iter().take(keep) {
        let mut m = Map::new();
        m.insert("mac_id".into(), Value::from(item.mac_id.clone()));
        match decode_item(item, associated, &rules.registry) {
            Ok((mac, payload, ts)) => {
                m.extend(decoded_fields(mac, &payload, ts, false));
                decoded += 1;
            }
            Err(e) => {
                m.insert("error".into(), Value::from(e));
                errors += 1;
            }
        }
        answer.push(Value::Object(m));
    }
    shared.with(|s| s.stats.item_errors += errors);
    (json_answer(StatusCode::OK, &Value::Array(answer)), decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_ids_are_accepted_plain_or_with_colons_in_any_case() {
        let want = "AABBCCDDEEFF".parse::<Mac>().ok();
        assert_eq!(parse_mac_id("AABBCCDDEEFF"), want);
        assert_eq!(parse_mac_id("aa:bb:cc:dd:ee:ff"), want);
        assert_eq!(parse_mac_id("AA-BB-CC-DD-EE-FF"), None);
        assert_eq!(parse_mac_id("AABBCCDDEE"), None);
        assert_eq!(parse_mac_id("AA:BBCCDDEEFF"), None);
    }

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

    #[test]
    fn the_storm_is_reproducible_from_its_seed() {
        let roll = || {
            let mut s = Shared::new(MockConfig::demo()).state.into_inner().unwrap();
            s.storm = Some((Storm::new(0.5, 42), fastrand::Rng::with_seed(42)));
            (0..50).map(|_| s.next_fault()).collect::<Vec<_>>()
        };
        let a = roll();
        assert_eq!(a, roll());
        let hits = a.iter().filter(|f| f.is_some()).count();
        assert!((10..=40).contains(&hits), "{hits} faults in 50 at p=0.5");
    }

    #[test]
    fn queued_faults_come_before_the_storm_and_in_order() {
        let mut s = Shared::new(MockConfig::demo()).state.into_inner().unwrap();
        s.storm = Some((
            Storm {
                probability: 1.0,
                seed: 1,
                mix: vec![Fault::Close],
            },
            fastrand::Rng::with_seed(1),
        ));
        s.faults.push_back(Fault::DropItems(1));
        s.faults.push_back(Fault::DropItems(2));
        assert_eq!(s.next_fault(), Some(Fault::DropItems(1)));
        assert_eq!(s.next_fault(), Some(Fault::DropItems(2)));
        assert_eq!(s.next_fault(), Some(Fault::Close));
    }
}
