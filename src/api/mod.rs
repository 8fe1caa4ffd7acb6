/*!
The transport shared by the daemon and the operator room: the password-grant token
(spec section 5), bulk decode (4.4) and single decode (4.3), and the one request every
operator call is sent as, with answers mapped to errors that say what to do (section 7,
[`ApiError`]). It may touch the configuration's service settings and nothing above it;
the operator's calls, their retry policy and the rate window are `crate::operator`'s.

This file is the client itself: its setup, the password grant, and the plumbing every
call shares (the request headers, the one retry after a 401 of a decode, reading an
answer with a cap, `call` for the operator room). `auth` is the token
cache, `decode` the decode calls, `pause` the service's `Retry-After` held for every
decode request, and `error` what can go wrong, by kind.

Why it is built this way:
- One [`ServiceClient`] is shared (it is an `Arc` inside) so that the flusher and
  `tapegate check` use one connection pool and one token cache; the cache asks the token
  endpoint one caller at a time and backs off after a failed grant (see `auth`).
- A 401 drops the refused token, fetches one new token and retries once (spec 5.5);
  a second 401 with a fresh token means the identity lacks the permission (5.7), which
  no retry fixes, so it becomes [`ApiError::Unauthorized`].
- Paths are appended to `base_url` exactly as written (spec section 1), so a base URL
  with a path prefix, with or without a trailing slash, works.
- The password and token are [`Secret`]s: they are in no log line, error or `Debug`
  output, and answer text is scrubbed of both before it goes into an error.
*/

mod auth;
mod decode;
mod error;
mod pause;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::Value;
use url::Url;

use crate::config::{EnvironmentSettings, ServiceSettings};
use crate::secret::{scrub, Secret};

pub use decode::{BulkAnswerItem, BulkItem, Decoded};
pub use error::{parse_retry_after, ApiError, Endpoint, TransientKind, Transport, TransportKind};

use auth::{Grant, TokenCache};
use error::{answer_message, carries_errors};
use pause::DecodeGate;

/// Largest success answer read; a bigger one is [`ApiError::BadAnswer`]. 250 decoded
/// items are a few tens of KiB, so this only stops a broken or hostile server.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Largest error answer read (only its message is kept).
const MAX_ERROR_BYTES: usize = 64 * 1024;
/// Used when the token answer has no usable `expires_in` (the spec requires it).
const FALLBACK_TOKEN_LIFETIME: Duration = Duration::from_secs(300);

/// The tracking service client. Cheap to clone; clones share the connection pool and
/// the token cache.
#[derive(Clone)]
pub struct ServiceClient {
    inner: Arc<Inner>,
    /// Counts token grants for `/metrics` (the daemon's client only).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

struct Inner {
    http: reqwest::Client,
    environment: String,
    endpoint: EnvironmentSettings,
    bulk_url: Url,
    customer_id: HeaderValue,
    authorized_groups: HeaderValue,
    tokens: TokenCache,
    /// The service's `Retry-After`, for every decode request (see `pause`).
    decode_gate: DecodeGate,
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

/// Where an operator call's account comes from (spec 5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Account {
    /// The `customer_id` and `authorized_groups` headers: decode, locations, messages,
    /// history, add-device.
    Headers,
    /// The token alone: label, status, config.
    Token,
}

/// An HTTP answer, read (capped) into memory.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) retry_after: Option<Duration>,
    /// The body of a success answer; of an error answer, its first
    /// [`MAX_ERROR_BYTES`] (the operator calls read 207-shaped and validation bodies
    /// from it; it is never logged or shown whole).
    pub(crate) body: Bytes,
    /// The message of an error answer, scrubbed of the token and password (empty on
    /// success). For people: no decision reads it.
    pub(crate) message: String,
}

impl Answer {
    /// Whether this error answer's body carries the spec's `errors` array (a validation
    /// failure, spec 2.6 and 7): its structure, for callers that must not read `message`.
    fn carries_errors(&self) -> bool {
        !self.status.is_success() && carries_errors(&self.body)
    }
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
pub(crate) fn join(base: &Url, segments: &[&str]) -> Result<Url, ApiError> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| ApiError::Setup("base_url cannot have a path".into()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
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
        let mut builder = reqwest::Client::builder();
        if let Some(ca) = &settings.ca_file {
            // Checked when the config was loaded; a failure here is a file changed since.
            let certs = reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(|e| {
                ApiError::Setup(format!("ca_file {} cannot be used: {e}", ca.path.display()))
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        // HTTPS_PROXY, HTTP_PROXY and NO_PROXY are honoured (reqwest reads them).
        let http = builder
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
                decode_gate: DecodeGate::new(),
                clock_skew: std::sync::Mutex::new(None),
            }),
            metrics: None,
        })
    }

    /// This client, counting its token grants in `metrics`.
    pub fn with_metrics(self, metrics: Arc<crate::metrics::Metrics>) -> ServiceClient {
        ServiceClient {
            metrics: Some(metrics),
            ..self
        }
    }

    /// Name of the environment this client talks to.
    pub fn environment(&self) -> &str {
        &self.inner.environment
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

    /// `text` from a server answer (an item's `error`, an error body) with the password
    /// and the current token taken out, for anything that stores or shows it.
    pub fn scrub(&self, text: &str) -> String {
        let token = self.inner.tokens.current();
        let token = token.as_ref().map_or("", Secret::expose);
        scrub(text, &[token, self.inner.endpoint.password.expose()])
    }

    /// Drops the cached token; the next request fetches a new one.
    pub fn invalidate(&self) {
        self.inner.tokens.invalidate();
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

    /// The token for an operator call: the cached one, or a new grant. A failure here
    /// means nothing was sent to the service.
    pub(crate) async fn operator_token(&self) -> Result<Secret, ApiError> {
        self.inner.tokens.get(|| self.grant()).await
    }

    /// The service refused `token` (401): drop it if it is still the cached one.
    pub(crate) fn token_refused(&self, token: &Secret) {
        self.inner.tokens.invalidate_if(token);
    }

    /// One operator request (spec 4.1, 4.2, 4.5-4.7): `method` to `url` with `token`,
    /// `correlation_id` (5.9), the account headers when `account` says so, the
    /// `headers` given, and `body` as JSON. No retry of any kind, not even after a 401:
    /// the operator's send decides, by the policy of each call (`send.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call(
        &self,
        token: &Secret,
        method: reqwest::Method,
        url: &Url,
        account: Account,
        headers: &[(&str, String)],
        body: Option<Bytes>,
        correlation_id: &str,
    ) -> Result<Answer, ApiError> {
        let mut r = self
            .inner
            .http
            .request(method, url.clone())
            .bearer_auth(token.expose())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header("correlation_id", correlation_id);
        if account == Account::Headers {
            r = r
                .header("customer_id", self.inner.customer_id.clone())
                .header("authorized_groups", self.inner.authorized_groups.clone());
        }
        for (name, value) in headers {
            r = r.header(*name, value.as_str());
        }
        if let Some(b) = body {
            r = r.body(b);
        }
        self.execute(r, token, None).await
    }

    /// `{base_url}` with `segments` appended.
    pub(crate) fn url(&self, segments: &[&str]) -> Result<Url, ApiError> {
        join(&self.inner.endpoint.base_url, segments)
    }

    /// The account the client's configuration names, for bodies that carry it (4.2).
    pub(crate) fn account_ids(&self) -> (&str, &str) {
        let e = &self.inner.endpoint;
        (&e.customer_id, &e.authorized_groups)
    }

    /// Until when decode requests wait for the service's `Retry-After`, if they do.
    pub fn decode_paused_until(&self) -> Option<tokio::time::Instant> {
        self.inner.decode_gate.closed_until()
    }

    /// Sends a decode request built by `build` with the cached token; on 401 drops that
    /// token, gets one new token and sends once more. Each time it goes on the wire it
    /// first passes the decode gate, and an answer with `Retry-After` closes the gate
    /// (see `pause`).
    async fn send_decode<F>(&self, correlation_id: &str, build: F) -> Result<Answer, ApiError>
    where
        F: Fn(&Secret) -> RequestBuilder,
    {
        let gate = &self.inner.decode_gate;
        // Before the token is taken, so that a long pause does not leave it stale.
        gate.wait_open().await;
        let gate = Some((gate, correlation_id));
        let tokens = &self.inner.tokens;
        let token = tokens.get(|| self.grant()).await?;
        let answer = self.execute(build(&token), &token, gate).await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        tracing::debug!(
            correlation_id,
            "the service refused the token; retrying once with a new one"
        );
        tokens.invalidate_if(&token);
        let token = tokens.get(|| self.grant()).await?;
        let answer = self.execute(build(&token), &token, gate).await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            return Err(ApiError::Unauthorized {
                message: answer.message,
            });
        }
        Ok(answer)
    }

    /// Sends and reads the answer (success bodies capped at [`MAX_ANSWER_BYTES`]; of an
    /// error answer only the message is kept).
    /// With `gate`, the request passes it right before it goes on the wire, and an
    /// answer that asks for a pause (429 or 5xx with `Retry-After`) closes it at once.
    async fn execute(
        &self,
        req: RequestBuilder,
        token: &Secret,
        gate: Option<(&DecodeGate, &str)>,
    ) -> Result<Answer, ApiError> {
        let transport = |e: reqwest::Error| ApiError::from_transport(&e, Endpoint::Service);
        if let Some((g, correlation_id)) = gate {
            g.pass(correlation_id).await;
        }
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let retry_after = retry_after_of(&resp);
        if let (Some((g, correlation_id)), Some(pause)) = (gate, retry_after) {
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                g.hold(pause, correlation_id);
            }
        }
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
        let (body, message) = match read_capped(resp, MAX_ERROR_BYTES)
            .await
            .map_err(transport)?
        {
            Some(body) => {
                // Scrubbed whole before anything is taken from it: a message cut to
                // length could otherwise keep the start of a secret cut in half.
                let secrets = [token.expose(), self.inner.endpoint.password.expose()];
                let raw = String::from_utf8_lossy(&body);
                let clean = scrub(&raw, &secrets);
                let body = if clean.as_str() == raw.as_ref() {
                    body
                } else {
                    Bytes::from(clean)
                };
                let message = scrub(&answer_message(&body), &secrets);
                (body, message)
            }
            None => (Bytes::new(), "(error body too large)".to_string()),
        };
        Ok(Answer {
            status,
            retry_after,
            body,
            message,
        })
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
        let transport = |err: reqwest::Error| ApiError::from_transport(&err, Endpoint::Token);
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
            // A success that is no token is the token endpoint's trouble, never the
            // service's answer to a batch.
            let grant = parse_token_answer(&body).map_err(|e| match e {
                ApiError::BadAnswer(m) => ApiError::Transient {
                    endpoint: Endpoint::Token,
                    kind: TransientKind::Unreadable(m),
                    retry_after: None,
                },
                other => other,
            })?;
            if let Some(m) = &self.metrics {
                m.token_granted();
            }
            tracing::debug!(
                environment = %self.inner.environment,
                expires_in_secs = grant.expires_in.as_secs(),
                "token granted"
            );
            return Ok(grant);
        }
        match code {
            429 | 500..=599 => Err(ApiError::status(Endpoint::Token, code, retry_after)),
            _ => Err(ApiError::AuthRejected {
                status: code,
                message: auth::refusal(&body, e.password.expose()),
            }),
        }
    }
}

/// Reads the token answer: `access_token` required (and able to travel in a header),
/// `expires_in` as a number (or a numeric string) clamped to a sane lifetime,
/// `token_type` expected to be Bearer.
fn parse_token_answer(body: &[u8]) -> Result<Grant, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadAnswer(format!("token answer is not JSON: {e}")))?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::BadAnswer("token answer has no access_token".into()))?;
    // A token that cannot go into `Authorization` would fail every request for its whole
    // life; refused here, it is not cached and the grant backs off like any failure.
    if HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
        return Err(ApiError::BadAnswer(
            "token answer's access_token holds characters an HTTP header cannot carry".into(),
        ));
    }
    if let Some(t) = v.get("token_type").and_then(Value::as_str) {
        if !t.eq_ignore_ascii_case("bearer") {
            tracing::warn!(
                token_type = t,
                "token endpoint granted a non-Bearer token; using it as Bearer"
            );
        }
    }
    let secs = match v.get("expires_in") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let expires_in = match secs.and_then(auth::clamp_lifetime) {
        Some(d) => {
            if secs != Some(d.as_secs_f64()) {
                tracing::warn!(
                    expires_in = secs.unwrap_or_default(),
                    used_secs = d.as_secs(),
                    "token answer's expires_in is out of range; using the nearest sane lifetime"
                );
            }
            d
        }
        None => {
            tracing::warn!(
                fallback_secs = FALLBACK_TOKEN_LIFETIME.as_secs(),
                "token answer has no usable expires_in"
            );
            FALLBACK_TOKEN_LIFETIME
        }
    };
    Ok(Grant {
        token: Secret::new(token),
        expires_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_hostile_expires_in_is_clamped_not_a_panic() {
        for (body, want) in [
            (
                r#"{"access_token":"t","expires_in":1e19}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":1e20}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":"1e400"}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":-5}"#,
                auth::MIN_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":"NaN"}"#,
                FALLBACK_TOKEN_LIFETIME,
            ),
        ] {
            assert_eq!(
                parse_token_answer(body.as_bytes()).unwrap().expires_in,
                want,
                "{body}"
            );
        }
    }

    #[test]
    fn a_token_a_header_cannot_carry_is_refused_without_echoing_it() {
        let err =
            parse_token_answer(br#"{"access_token":"abc\ndef","expires_in":60}"#).unwrap_err();
        assert!(matches!(err, ApiError::BadAnswer(_)), "{err:?}");
        assert!(!err.to_string().contains("abc"), "{err}");
    }
}
