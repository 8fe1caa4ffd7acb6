/*!
The tracking service client: password-grant token (spec section 5), bulk decode (4.4)
and single decode (4.3), with answers mapped to errors that say what to do (section 7,
[`ApiError`]).

Why it is built this way:
- One [`ServiceClient`] is shared (it is an `Arc` inside) so that the flusher and
  `tapegate check` use one connection pool and one token cache; the cache asks the token
  endpoint one caller at a time and backs off after a failed grant (see `auth`).
- A 401 drops the refused token, fetches one new token and retries once (spec 5.5);
  a second 401 with a fresh token means the identity lacks the permission (5.7), which
  no retry fixes, so it becomes [`ApiError::Unauthorized`].
- The bulk answer is parsed leniently: every field is optional, numbers may come as
  strings, and the raw JSON of each item is kept, so a server that adds or drops a
  field does not make us lose readings. Items are matched to the request by `mac_id`
  (separators and case ignored); an item we cannot match is skipped, and the caller
  retries whatever is missing.
- Paths are appended to `base_url` exactly as written (spec section 1), so a base URL
  with a path prefix, with or without a trailing slash, works.
- The password and token are [`Secret`]s: they are in no log line, error or `Debug`
  output, and answer text is scrubbed of both before it goes into an error.
*/

mod auth;
mod error;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use url::Url;

use crate::config::{EnvironmentSettings, ServiceSettings};
use crate::secret::Secret;

pub use error::{parse_retry_after, ApiError, Transport, TransportKind};

use auth::{Grant, TokenCache};
use error::{answer_message, scrub, truncate};

/// Largest success answer read; a bigger one is [`ApiError::BadAnswer`]. 250 decoded
/// items are a few tens of KiB, so this only stops a broken or hostile server.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Largest error answer read (only its message is kept).
const MAX_ERROR_BYTES: usize = 64 * 1024;
/// Used when the token answer has no usable `expires_in` (the spec requires it).
const FALLBACK_TOKEN_LIFETIME: Duration = Duration::from_secs(300);

/// One packet to decode, as sent in the bulk request body. The caller has already
/// formatted `mac_id` (`mac_format`) and `scan_time` (epoch seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BulkItem {
    pub mac_id: String,
    pub ble_packet: String,
    pub product_id: String,
    pub scan_time: String,
}

/// One item of the bulk answer. `mac_id` is the request's `mac_id` exactly as it was
/// sent (the answer's may differ in case or separators).
#[derive(Debug, Clone, PartialEq)]
pub struct BulkAnswerItem {
    pub mac_id: String,
    /// The decoded packet, or the server's error text for this item.
    pub result: Result<Decoded, String>,
}

/// A decoded BLE packet (spec 2.3). Every field is optional because the bulk answer
/// carries fewer fields than the single decode, and `raw` keeps everything the server
/// sent for this item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    pub qr_code: Option<String>,
    pub cts: Option<f64>,
    pub ts: Option<f64>,
    pub bat: Option<f64>,
    pub temp: Option<f64>,
    pub over_temp: Option<f64>,
    pub over_temp_ts: Option<f64>,
    pub shock: Option<f64>,
    pub shock_ts: Option<f64>,
    pub shock_count: Option<f64>,
    pub fw_ver: Option<String>,
    /// The item's JSON object as received.
    pub raw: Value,
}

impl Decoded {
    /// Reads the known fields of a decoded packet object, leniently: a number may come
    /// as a numeric string, a string field as a number, and anything else is `None`.
    pub fn from_json(value: &Value) -> Decoded {
        let num = |k: &str| match value.get(k)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
            _ => None,
        };
        let text = |k: &str| match value.get(k)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        Decoded {
            qr_code: text("qr_code"),
            cts: num("cts"),
            ts: num("ts"),
            bat: num("bat"),
            temp: num("temp"),
            over_temp: num("over_temp"),
            over_temp_ts: num("over_temp_ts"),
            shock: num("shock"),
            shock_ts: num("shock_ts"),
            shock_count: num("shock_count"),
            fw_ver: text("fw_ver"),
            raw: value.clone(),
        }
    }
}

/// The tracking service client. Cheap to clone; clones share the connection pool and
/// the token cache.
#[derive(Clone)]
pub struct ServiceClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    environment: String,
    endpoint: EnvironmentSettings,
    bulk_url: Url,
    customer_id: HeaderValue,
    authorized_groups: HeaderValue,
    tokens: TokenCache,
    /// Server clock minus ours, in seconds, from the `Date` of the last token answer.
    clock_skew: std::sync::Mutex<Option<i64>>,
}

impl fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.inner.endpoint;
        f.debug_struct("ServiceClient")
            .field("environment", &self.inner.environment)
            .field("base_url", &e.base_url.as_str())
            .field("auth_url", &e.auth_url.as_str())
            .field("client_id", &e.client_id)
            .field("username", &e.username)
            .field("customer_id", &e.customer_id)
            .finish_non_exhaustive()
    }
}

/// An HTTP answer, read (capped) into memory.
struct Answer {
    status: StatusCode,
    retry_after: Option<Duration>,
    /// The body of a success answer (empty otherwise).
    body: Bytes,
    /// The message of an error answer, scrubbed of the token and password (empty on
    /// success).
    message: String,
}

/// Whether a URL's scheme is one we can talk to.
fn check_http_url(name: &str, url: &Url) -> Result<(), ApiError> {
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() || url.host().is_none() {
        return Err(ApiError::Setup(format!(
            "{name} must be an http(s) URL with a host, got {:?}",
            url.scheme()
        )));
    }
    if url.scheme() == "http" && !is_loopback(url) {
        tracing::warn!(
            url = %url.origin().ascii_serialization(),
            "{name} is plain http: the password and token travel unencrypted"
        );
    }
    Ok(())
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::Setup(format!("{name} is empty")));
    }
    HeaderValue::from_str(value)
        .map_err(|_| ApiError::Setup(format!("{name} holds characters HTTP headers cannot carry")))
}

/// `base` with `segments` appended to its path (a trailing slash of `base` is not
/// doubled; segments are percent-encoded as needed).
fn join(base: &Url, segments: &[&str]) -> Result<Url, ApiError> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| ApiError::Setup("base_url cannot have a path".into()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// Upper case without separators, to match answer `mac_id`s to request `mac_id`s.
fn mac_key(mac: &str) -> String {
    mac.chars()
        .filter(|c| !matches!(c, ':' | '-'))
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// Reads at most `limit` bytes of the body. `Ok(None)` when it is longer.
async fn read_capped(mut resp: Response, limit: usize) -> Result<Option<Bytes>, reqwest::Error> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(None);
    }
    let mut buf = BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Some(buf.freeze()))
}

fn retry_after_of(resp: &Response) -> Option<Duration> {
    let v = resp.headers().get(RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, SystemTime::now())
}

impl ServiceClient {
    /// A client for the selected environment of `settings`. Fails only on settings
    /// that cannot work (a URL that is not http(s), an empty `customer_id`...).
    pub fn new(settings: &ServiceSettings) -> Result<ServiceClient, ApiError> {
        let e = &settings.endpoint;
        check_http_url("base_url", &e.base_url)?;
        check_http_url("auth_url", &e.auth_url)?;
        let customer_id = header_value("customer_id", &e.customer_id)?;
        let authorized_groups = header_value("authorized_groups", &e.authorized_groups)?;
        if settings.request_timeout.is_zero() {
            return Err(ApiError::Setup(
                "request_timeout must be more than zero".into(),
            ));
        }
        let bulk_url = join(&e.base_url, &["external", "v1", "devices", "decode"])?;
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(settings.request_timeout)
            .connect_timeout(settings.request_timeout)
            // A redirect of a POST would silently become a GET elsewhere; surface it.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tapegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| ApiError::Setup(format!("cannot build the HTTP client: {err}")))?;
        Ok(ServiceClient {
            inner: Arc::new(Inner {
                http,
                environment: settings.environment.clone(),
                endpoint: e.clone(),
                bulk_url,
                customer_id,
                authorized_groups,
                tokens: TokenCache::new(),
                clock_skew: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Name of the environment this client talks to.
    pub fn environment(&self) -> &str {
        &self.inner.environment
    }

    /// The bulk decode URL (`{base_url}/external/v1/devices/decode`).
    pub fn decode_bulk_url(&self) -> &Url {
        &self.inner.bulk_url
    }

    /// Asks the token endpoint for a fresh token now, ignoring the cache and its
    /// backoff, and caches it. Returns the granted lifetime. For `tapegate check`.
    pub async fn fetch_token(&self) -> Result<Duration, ApiError> {
        let grant = self.inner.tokens.force(|| self.grant()).await?;
        Ok(grant.expires_in)
    }

    /// How far the token endpoint's clock is ahead of ours (negative: behind), in
    /// seconds, from the `Date` header of its last answer. A clock far off breaks TLS
    /// and token validity; `tapegate check` reports it.
    pub fn clock_skew_secs(&self) -> Option<i64> {
        self.inner.clock_skew.lock().ok().and_then(|g| *g)
    }

    /// Drops the cached token; the next request fetches a new one.
    pub fn invalidate(&self) {
        self.inner.tokens.invalidate();
    }

    /// Decodes up to 250 packets in one request (spec 4.4). The answer holds one item
    /// per `mac_id` the server answered for, decoded or with its error; items the
    /// server left out are simply absent (the caller retries them).
    pub async fn decode_bulk(
        &self,
        items: &[BulkItem],
        correlation_id: &str,
    ) -> Result<Vec<BulkAnswerItem>, ApiError> {
        let body = Bytes::from(
            serde_json::to_vec(items).map_err(|e| ApiError::InvalidRequest(e.to_string()))?,
        );
        let started = Instant::now();
        let url = &self.inner.bulk_url;
        let answer = self
            .send(correlation_id, |token| {
                self.request(url, token, correlation_id).body(body.clone())
            })
            .await;
        let answer = match answer {
            Ok(a) => a,
            Err(err) => {
                tracing::debug!(
                    correlation_id,
                    items = items.len(),
                    cause = %err.operator_cause(),
                    "bulk decode failed"
                );
                return Err(err);
            }
        };
        tracing::debug!(
            correlation_id,
            items = items.len(),
            status = answer.status.as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "bulk decode answered"
        );
        if !answer.status.is_success() {
            return Err(Self::decode_error(&answer, false));
        }
        parse_bulk_answer(&answer.body, items, correlation_id)
    }

    /// Decodes one packet (spec 4.3): the values go in headers, there is no body.
    pub async fn decode_one(
        &self,
        mac_id: &str,
        product_id: &str,
        ble_packet: &str,
        scan_time: &str,
        correlation_id: &str,
    ) -> Result<Decoded, ApiError> {
        let url = join(
            &self.inner.endpoint.base_url,
            &["external", "v1", "devices", mac_id, "decode"],
        )?;
        let answer = self
            .send(correlation_id, |token| {
                self.request(&url, token, correlation_id)
                    .header("product_id", product_id)
                    .header("ble_packet", ble_packet)
                    .header("scan_time", scan_time)
            })
            .await?;
        tracing::debug!(
            correlation_id,
            status = answer.status.as_u16(),
            "single decode answered"
        );
        if !answer.status.is_success() {
            return Err(Self::decode_error(&answer, true));
        }
        match serde_json::from_slice::<Value>(&answer.body) {
            Ok(v @ Value::Object(_)) => Ok(Decoded::from_json(&v)),
            Ok(_) => Err(ApiError::BadAnswer(
                "single decode answer is not a JSON object".into(),
            )),
            Err(e) => Err(ApiError::BadAnswer(format!(
                "single decode answer is not JSON: {e}"
            ))),
        }
    }

    /// A decode request with the headers every decode call carries.
    fn request(&self, url: &Url, token: &Secret, correlation_id: &str) -> RequestBuilder {
        self.inner
            .http
            .post(url.clone())
            .bearer_auth(token.expose())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header("customer_id", self.inner.customer_id.clone())
            .header("authorized_groups", self.inner.authorized_groups.clone())
            .header("correlation_id", correlation_id)
    }

    /// Sends a request built by `build` with the cached token; on 401 drops that
    /// token, gets one new token and sends once more.
    async fn send<F>(&self, correlation_id: &str, build: F) -> Result<Answer, ApiError>
    where
        F: Fn(&Secret) -> RequestBuilder,
    {
        let tokens = &self.inner.tokens;
        let token = tokens.get(|| self.grant()).await?;
        let answer = self.execute(build(&token), &token).await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        tracing::debug!(
            correlation_id,
            "the service refused the token; retrying once with a new one"
        );
        tokens.invalidate_if(&token);
        let token = tokens.get(|| self.grant()).await?;
        let answer = self.execute(build(&token), &token).await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            return Err(ApiError::Unauthorized {
                message: answer.message,
            });
        }
        Ok(answer)
    }

    /// Sends and reads the answer (success bodies capped at [`MAX_ANSWER_BYTES`]; of an
    /// error answer only the message is kept).
    async fn execute(&self, req: RequestBuilder, token: &Secret) -> Result<Answer, ApiError> {
        let transport =
            |e: reqwest::Error| ApiError::from_transport(&e, "service unreachable", "timeout");
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let retry_after = retry_after_of(&resp);
        if status.is_success() {
            let body = read_capped(resp, MAX_ANSWER_BYTES)
                .await
                .map_err(transport)?
                .ok_or_else(|| {
                    ApiError::BadAnswer(format!(
                        "answer larger than {} MiB",
                        MAX_ANSWER_BYTES / (1024 * 1024)
                    ))
                })?;
            return Ok(Answer {
                status,
                retry_after,
                body,
                message: String::new(),
            });
        }
        let message = match read_capped(resp, MAX_ERROR_BYTES)
            .await
            .map_err(transport)?
        {
            Some(body) => scrub(
                &answer_message(&body),
                &[token.expose(), self.inner.endpoint.password.expose()],
            ),
            None => "(error body too large)".to_string(),
        };
        Ok(Answer {
            status,
            retry_after,
            body: Bytes::new(),
            message,
        })
    }

    /// Maps a non-success decode answer to what the caller should do (spec 7).
    fn decode_error(answer: &Answer, single: bool) -> ApiError {
        let status = answer.status.as_u16();
        let message = answer.message.clone();
        match status {
            400 => ApiError::Rejected { status, message },
            404 if single => ApiError::NotFound { message },
            413 => ApiError::TooLarge { message },
            429 => ApiError::transient("rate limited", answer.retry_after),
            408 => ApiError::transient("timeout", answer.retry_after),
            500..=599 => ApiError::transient(format!("server error {status}"), answer.retry_after),
            _ => ApiError::UnexpectedStatus { status, message },
        }
    }

    /// One password grant (spec 5.3, 5.4).
    async fn grant(&self) -> Result<Grant, ApiError> {
        let e = &self.inner.endpoint;
        let form = [
            ("grant_type", "password"),
            ("username", e.username.as_str()),
            ("password", e.password.expose()),
            ("client_id", e.client_id.as_str()),
            ("audience", e.audience.as_str()),
        ];
        let transport = |err: reqwest::Error| {
            ApiError::from_transport(&err, "token endpoint unreachable", "token endpoint timeout")
        };
        let resp = self
            .inner
            .http
            .post(e.auth_url.clone())
            .header(ACCEPT, "application/json")
            .form(&form)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status();
        let retry_after = retry_after_of(&resp);
        if let Some(server) = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
        {
            let skew = match server.duration_since(SystemTime::now()) {
                Ok(ahead) => ahead.as_secs() as i64,
                Err(behind) => -(behind.duration().as_secs() as i64),
            };
            if let Ok(mut g) = self.inner.clock_skew.lock() {
                *g = Some(skew);
            }
        }
        let body = read_capped(resp, MAX_ERROR_BYTES)
            .await
            .map_err(transport)?
            .unwrap_or_else(|| Bytes::from_static(b"(body too large)"));
        let code = status.as_u16();
        if status.is_success() {
            let grant = parse_token_answer(&body)?;
            tracing::debug!(
                environment = %self.inner.environment,
                expires_in_secs = grant.expires_in.as_secs(),
                "token granted"
            );
            return Ok(grant);
        }
        match code {
            429 => Err(ApiError::transient(
                "token endpoint rate limited",
                retry_after,
            )),
            500..=599 => Err(ApiError::transient(
                format!("token endpoint error {code}"),
                retry_after,
            )),
            _ => Err(ApiError::AuthRejected {
                status: code,
                message: scrub(&answer_message(&body), &[e.password.expose()]),
            }),
        }
    }
}

/// Reads the token answer: `access_token` required, `expires_in` as an integer (or a
/// numeric string), `token_type` expected to be Bearer.
fn parse_token_answer(body: &[u8]) -> Result<Grant, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadAnswer(format!("token answer is not JSON: {e}")))?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::BadAnswer("token answer has no access_token".into()))?;
    if let Some(t) = v.get("token_type").and_then(Value::as_str) {
        if !t.eq_ignore_ascii_case("bearer") {
            tracing::warn!(
                token_type = t,
                "token endpoint granted a non-Bearer token; using it as Bearer"
            );
        }
    }
    let expires_in = match v.get("expires_in") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|s| s.is_finite() && *s >= 0.0)
    .map(Duration::from_secs_f64);
    let expires_in = expires_in.unwrap_or_else(|| {
        tracing::warn!(
            fallback_secs = FALLBACK_TOKEN_LIFETIME.as_secs(),
            "token answer has no usable expires_in"
        );
        FALLBACK_TOKEN_LIFETIME
    });
    Ok(Grant {
        token: Secret::new(token),
        expires_in,
    })
}

/// Reads the bulk answer: a JSON array of items matched to the request by `mac_id`.
fn parse_bulk_answer(
    body: &[u8],
    sent: &[BulkItem],
    correlation_id: &str,
) -> Result<Vec<BulkAnswerItem>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::BadAnswer(format!(
            "bulk answer is not JSON ({e}): {}",
            truncate(&String::from_utf8_lossy(body), 80)
        ))
    })?;
    let Value::Array(items) = value else {
        return Err(ApiError::BadAnswer(
            "bulk answer is not a JSON array".into(),
        ));
    };
    let by_key: HashMap<String, &str> = sent
        .iter()
        .map(|i| (mac_key(&i.mac_id), i.mac_id.as_str()))
        .collect();
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let Some(answered) = item.get("mac_id").and_then(Value::as_str) else {
            tracing::warn!(
                correlation_id,
                index,
                "bulk answer item without a mac_id skipped; its capture will be retried"
            );
            continue;
        };
        let Some(&mac_id) = by_key.get(&mac_key(answered)) else {
            tracing::warn!(
                correlation_id,
                index,
                mac_id = answered,
                "bulk answer item for a MAC that was not sent skipped"
            );
            continue;
        };
        if !seen.insert(mac_id) {
            tracing::warn!(
                correlation_id,
                index,
                mac_id,
                "bulk answer holds a MAC twice; the first item is used"
            );
            continue;
        }
        let result = match item.get("error") {
            None | Some(Value::Null) => Ok(Decoded::from_json(&item)),
            Some(Value::String(s)) if s.is_empty() => Err("(no error text)".to_string()),
            Some(Value::String(s)) => Err(s.clone()),
            Some(other) => Err(truncate(&other.to_string(), 300)),
        };
        out.push(BulkAnswerItem {
            mac_id: mac_id.to_string(),
            result,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(mac: &str) -> BulkItem {
        BulkItem {
            mac_id: mac.into(),
            ble_packet: "00".into(),
            product_id: "tape".into(),
            scan_time: "1".into(),
        }
    }

    #[test]
    fn paths_are_appended_to_the_base_url_as_written() {
        for (base, want) in [
            ("https://h/", "https://h/external/v1/devices/decode"),
            ("https://h", "https://h/external/v1/devices/decode"),
            ("https://h/ppe", "https://h/ppe/external/v1/devices/decode"),
            ("https://h/ppe/", "https://h/ppe/external/v1/devices/decode"),
            ("https://h/a/b/", "https://h/a/b/external/v1/devices/decode"),
        ] {
            let url = join(
                &Url::parse(base).unwrap(),
                &["external", "v1", "devices", "decode"],
            )
            .unwrap();
            assert_eq!(url.as_str(), want, "{base}");
        }
        let one = join(
            &Url::parse("https://h/ppe/").unwrap(),
            &["external", "v1", "devices", "AA:BB:CC:DD:EE:FF", "decode"],
        )
        .unwrap();
        assert_eq!(
            one.as_str(),
            "https://h/ppe/external/v1/devices/AA:BB:CC:DD:EE:FF/decode"
        );
    }

    #[test]
    fn bulk_answer_items_are_matched_to_the_request_by_mac() {
        let sent = [
            item("AABBCCDDEEFF"),
            item("C0:DE:AD:00:00:01"),
            item("112233445566"),
        ];
        let body = br#"[
            {"mac_id":"aa:bb:cc:dd:ee:ff","qr_code":"TTAABBCCDDEEFF","cts":"12","ts":1700000000,
             "bat":80,"temp":21.5,"shock_count":3,"fw_ver":"1.4.2","extra":"kept"},
            {"mac_id":"C0DEAD000001","error":"device not found or not associated with the customer"},
            {"qr_code":"no mac"},
            "not an object",
            {"mac_id":"FFFFFFFFFFFF","qr_code":"not sent"}
        ]"#;
        let got = parse_bulk_answer(body, &sent, "c1").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].mac_id, "AABBCCDDEEFF");
        let d = got[0].result.as_ref().unwrap();
        assert_eq!(d.qr_code.as_deref(), Some("TTAABBCCDDEEFF"));
        assert_eq!(d.cts, Some(12.0));
        assert_eq!(d.temp, Some(21.5));
        assert_eq!(d.shock_count, Some(3.0));
        assert_eq!(d.over_temp, None);
        assert_eq!(d.fw_ver.as_deref(), Some("1.4.2"));
        assert_eq!(d.raw["extra"], "kept");
        assert_eq!(got[1].mac_id, "C0:DE:AD:00:00:01");
        assert_eq!(
            got[1].result,
            Err("device not found or not associated with the customer".to_string())
        );
    }

    #[test]
    fn a_bulk_answer_that_is_not_a_json_array_is_a_bad_answer() {
        for body in [&b"<html>"[..], b"{\"mac_id\":\"x\"}", b""] {
            assert!(matches!(
                parse_bulk_answer(body, &[item("AABBCCDDEEFF")], "c"),
                Err(ApiError::BadAnswer(_))
            ));
        }
    }

    #[test]
    fn a_mac_answered_twice_counts_once() {
        let body = br#"[{"mac_id":"AABBCCDDEEFF","bat":1},{"mac_id":"AABBCCDDEEFF","error":"x"}]"#;
        let got = parse_bulk_answer(body, &[item("AABBCCDDEEFF")], "c").unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].result.is_ok());
    }

    #[test]
    fn token_answer_needs_an_access_token_and_reads_expires_in() {
        let g =
            parse_token_answer(br#"{"access_token":"t","token_type":"Bearer","expires_in":86400}"#)
                .unwrap();
        assert_eq!(g.token.expose(), "t");
        assert_eq!(g.expires_in, Duration::from_secs(86400));
        let g = parse_token_answer(br#"{"access_token":"t","expires_in":"60"}"#).unwrap();
        assert_eq!(g.expires_in, Duration::from_secs(60));
        let g = parse_token_answer(br#"{"access_token":"t"}"#).unwrap();
        assert_eq!(g.expires_in, FALLBACK_TOKEN_LIFETIME);
        assert!(matches!(
            parse_token_answer(br#"{"token_type":"Bearer"}"#),
            Err(ApiError::BadAnswer(_))
        ));
        assert!(matches!(
            parse_token_answer(b"nope"),
            Err(ApiError::BadAnswer(_))
        ));
    }
}
