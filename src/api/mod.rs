/*!
The transport shared by the daemon and the operator room: the password-grant token
(spec section 5), bulk decode (4.4) and single decode (4.3), and the one request every
operator call is sent as, with answers mapped to errors that say what to do (section 7,
[`ApiError`]). It may touch the configuration's service settings and nothing above it;
the operator's calls, their retry policy and the rate window are `crate::operator`'s.

This file is the client itself: its setup and the plumbing every call shares (the
request headers, reading an answer with a cap, `call` for the operator room). `grant` is
the password grant, `auth` the token cache, `decode` the decode calls, `pause` the
service's `Retry-After` held for every decode request, `wire` how a decode request goes
on the wire (once it can, taking what it holds only then; the one retry after a 401),
`trust` the certificate authorities every HTTPS client trusts, `address` the service's
URLs and account headers checked, and `error` what can go wrong, by kind.

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

mod address;
mod auth;
mod bulk_answer;
mod decode;
mod decoded;
mod error;
mod grant;
mod pause;
pub mod trust;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{RequestBuilder, Response, StatusCode};

use url::Url;

use crate::clock::SharedClock;
use crate::config::{EnvironmentSettings, ServiceSettings};
use crate::util::secret::{scrub, Secret};
pub(crate) use address::join;
use address::{check_http_url, header_value};

pub use decode::{BulkAnswerItem, BulkItem, BulkRequest};
pub use decoded::Decoded;
pub use error::{parse_retry_after, ApiError, Endpoint, TransientKind, Transport, TransportKind};
pub use wire::Outgoing;

use auth::TokenCache;
use error::{answer_message, carries_errors};
use pause::DecodeGate;

/// Largest success answer read; a bigger one is [`ApiError::BadAnswer`]. 250 decoded
/// items are a few tens of KiB, so this only stops a broken or hostile server.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Largest error answer read (only its message is kept).
const MAX_ERROR_BYTES: usize = 64 * 1024;

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
    /// Ours: what a `Retry-After` date and the server's `Date` are read against.
    clock: SharedClock,
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

/// Reads at most `limit` bytes of the body. `Ok(None)` when it is longer.
async fn read_capped(mut resp: Response, limit: usize) -> Result<Option<Bytes>, reqwest::Error> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(None);
    }
    // Sized once when the length is given (at most `limit`), not grown by doubling.
    let mut buf = BytesMut::with_capacity(resp.content_length().map_or(0, |n| n as usize));
    while let Some(chunk) = resp.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Some(buf.freeze()))
}

impl ServiceClient {
    /// The answer's `Retry-After`: seconds, or a date read against our clock.
    fn retry_after_of(&self, resp: &Response) -> Option<Duration> {
        let v = resp.headers().get(RETRY_AFTER)?.to_str().ok()?;
        parse_retry_after(v, self.now())
    }

    /// Now by our clock.
    fn now(&self) -> SystemTime {
        crate::clock::system_time(self.inner.clock.wall_ms())
    }
}

impl ServiceClient {
    /// A client for the selected environment of `settings`, reading the time by
    /// `clock`. Fails only on settings that cannot work (a URL that is not http(s), an
    /// empty `customer_id`...).
    pub fn new(settings: &ServiceSettings, clock: SharedClock) -> Result<ServiceClient, ApiError> {
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
        let mut builder = trust::trusting(reqwest::Client::builder(), trust::system());
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
                clock,
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

    /// The bulk decode URL (`{base_url}/external/v1/devices/decode`).
    pub fn decode_bulk_url(&self) -> &Url {
        &self.inner.bulk_url
    }

    /// Decodes up to 250 packets in one request (spec 4.4). The answer holds one item
    /// per `mac_id` the server answered for, decoded or with its error; items the
    /// server left out are simply absent (the caller retries them). `decode.rs`.
    pub async fn decode_bulk(
        &self,
        items: &[BulkItem],
        correlation_id: &str,
    ) -> Result<Vec<BulkAnswerItem>, ApiError> {
        self.bulk(items, correlation_id).await
    }

    /// [`ServiceClient::decode_bulk`] of the request `out` builds as it goes on the
    /// wire (`wire.rs`): what was sent with its answer, or `None` when `out` had
    /// nothing left to send.
    pub async fn decode_bulk_when_ready<O>(
        &self,
        out: &mut O,
        correlation_id: &str,
    ) -> Result<Option<(BulkRequest, Vec<BulkAnswerItem>)>, ApiError>
    where
        O: Outgoing<Request = BulkRequest>,
    {
        self.bulk_when_ready(out, correlation_id).await
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
        self.one(mac_id, product_id, ble_packet, scan_time, correlation_id)
            .await
    }

    /// Sends and reads the answer (success bodies capped at [`MAX_ANSWER_BYTES`]; of an
    /// error answer only the message is kept). With `gate` (a decode request, which has
    /// passed it: `wire.rs`), an answer that asks for a pause (429 or 5xx with
    /// `Retry-After`) closes it at once.
    async fn execute(
        &self,
        req: RequestBuilder,
        token: &Secret,
        gate: Option<(&DecodeGate, &str)>,
    ) -> Result<Answer, ApiError> {
        let transport = |e: reqwest::Error| ApiError::from_transport(&e, Endpoint::Service);
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let retry_after = self.retry_after_of(&resp);
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
}
