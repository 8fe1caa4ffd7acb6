/*!
The daemon's read-only HTTP server (`[http] listen`), on the daemon's own runtime:

| path | answers |
|---|---|
| `/metrics` | the Prometheus (OpenMetrics text) exposition of [`crate::metrics`] |
| `/healthz` | 200 `ok` while every stage makes progress; 503 `<stage>: <reason>` otherwise ([`crate::health::verdict`]) |
| `/` | the status page for an installer at the dock (`page.rs`) |

Everything is read-only and answers `GET` (and `HEAD`) only. Nothing it serves comes
from the service settings, so no password or token can reach an answer; what comes
from the service (its error texts) was scrubbed of both by the client.

A gateway's port may face a whole dock network, and a few slow clients must not blind
the monitor that asks `/healthz`. Connections are capped at [`MAX_CONNECTIONS`]; a
client gets [`HEADER_TIMEOUT`] to send its request; and when every connection is taken,
a new one takes the place of the connection that has waited longest for its request
(a client trickling a header byte a second, an idle keep-alive), which is closed. A
client whose request is complete is answered at once, so slow clients can only evict
each other, never keep a prompt one out. A connection being answered is never cut.
*/

mod page;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE,
    X_CONTENT_TYPE_OPTIONS,
};
use hyper::server::conn::http1;
use hyper::service::{service_fn, HttpService};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::SharedClock;
use crate::health;
use crate::heard_now::HeardNow;
use crate::metrics::{self, Metrics};
use crate::outbox::Outbox;
use crate::source::SourceHealth;
use crate::systemd::Liveness;

/// Connections served at once; past it, a new one takes the place of the one that has
/// waited longest for its request.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server reads to answer; shared by every connection.
pub struct HttpState {
    pub gateway_id: String,
    /// The source `[scanner]` names, for the page (`ble`, `replay`, `sim`).
    pub source: String,
    pub outbox: Outbox,
    pub liveness: Liveness,
    /// Whether captures can be committed (the ingest stage's word).
    pub admission: Arc<health::Admission>,
    pub metrics: Arc<Metrics>,
    pub heard: Arc<HeardNow>,
    pub source_health: Arc<SourceHealth>,
    /// The daemon's clock (ages on the page, capture ages in `/metrics`).
    pub clock: SharedClock,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on http.listen = {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// What every answer says about itself: nothing on the page may run a script, load
/// anything or be framed (its style is inline), and no answer is to be sniffed as
/// another type than it says.
const CONTENT_SECURITY_POLICY_VALUE: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The warning for a listen address beyond loopback (logged at start, a `warn` line of
/// `tapegate check`), or `None` for a loopback one.
pub fn exposure_warning(addr: SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback()).then(|| {
        format!(
            "http.listen = {addr} answers anyone who can reach it: /metrics, /healthz and the status page need no password (none shows a secret); open the port to the monitoring network only, or listen on 127.0.0.1"
        )
    })
}

/// Binds `addr` (at start, so that a port in use stops the daemon with a clear error).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until `stop` is cancelled; connections in progress get a second to finish.
pub async fn serve(listener: TcpListener, state: Arc<HttpState>, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz and the status page");
        if let Some(warning) = exposure_warning(addr) {
            tracing::warn!("{warning}");
        }
    }
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let open = Arc::new(OpenConnections::default());
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::debug!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // Every slot is taken: the connection that has waited longest for its
                // request gives up its slot (if every one is being answered, the next
                // answer frees one soon).
                if open.evict_longest_waiting() {
                    tracing::debug!("http: all connections taken; closed the one waiting longest for its request");
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        connections.spawn(connection(
            stream,
            slot,
            state.clone(),
            open.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection in its slot, until it ends, `stop`, or its eviction.
async fn connection(
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    state: Arc<HttpState>,
    open: Arc<OpenConnections>,
    stop: CancellationToken,
) {
    let (id, evicted) = open.add();
    let svc = {
        let open = open.clone();
        service_fn(move |req| {
            let state = state.clone();
            let open = open.clone();
            async move {
                open.set_waiting(id, false);
                let answer = answer(state, req).await;
                open.set_waiting(id, true);
                answer
            }
        })
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        () = serve_connection(conn, &stop) => {}
        // Dropping the connection closes its socket.
        _ = evicted.cancelled() => {}
    }
    open.remove(id);
}

/// The open connections, and since when each has been waiting for a request (`None`
/// while one is being answered), so that the longest waiting can be evicted.
#[derive(Default)]
struct OpenConnections {
    inner: Mutex<(u64, HashMap<u64, Open>)>,
}

/// Since when a connection waits for a request (`None`: being answered); its eviction.
type Open = (Option<Instant>, CancellationToken);

impl OpenConnections {
    fn with<R>(&self, f: impl FnOnce(&mut (u64, HashMap<u64, Open>)) -> R) -> R {
        // No lock is held across an await; a poisoned map is still consistent.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// A new connection, waiting for its first request: its id and its eviction.
    fn add(&self) -> (u64, CancellationToken) {
        let evicted = CancellationToken::new();
        let id = self.with(|(next, open)| {
            *next += 1;
            open.insert(*next, (Some(Instant::now()), evicted.clone()));
            *next
        });
        (id, evicted)
    }

    fn set_waiting(&self, id: u64, waiting: bool) {
        self.with(|(_, open)| {
            if let Some((since, _)) = open.get_mut(&id) {
                *since = waiting.then(Instant::now);
            }
        });
    }

    fn remove(&self, id: u64) {
        self.with(|(_, open)| open.remove(&id));
    }

    /// Evicts the connection waiting longest for a request; false if none is waiting.
    fn evict_longest_waiting(&self) -> bool {
        self.with(|(_, open)| {
            let longest = open
                .iter()
                .filter_map(|(id, (since, _))| since.map(|s| (s, *id)))
                .min();
            match longest.and_then(|(_, id)| open.remove(&id)) {
                Some((_, evicted)) => {
                    evicted.cancel();
                    true
                }
                None => false,
            }
        })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves one connection until it ends, or until `stop`: then the request in progress
/// gets a second to finish. (The mock service serves its connections the same way.)
async fn serve_connection<S>(
    conn: http1::Connection<TokioIo<TcpStream>, S>,
    stop: &CancellationToken,
) where
    S: HttpService<Incoming>,
    S::Error: Into<BoxError>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<BoxError>,
{
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

type Answer = Response<Full<Bytes>>;

fn text(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

const PLAIN: &str = "text/plain; charset=utf-8";

async fn answer(state: Arc<HttpState>, req: Request<Incoming>) -> Result<Answer, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "read-only: GET only\n".into(),
        );
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(resp);
    }
    Ok(match req.uri().path() {
        "/metrics" => scrape(&state).await,
        "/healthz" => match health::verdict(&state.liveness, &state.admission, &state.metrics) {
            Ok(()) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Err(u) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("{}: {}\n", u.stage, u.reason),
            ),
        },
        "/" => page::render(&state).await,
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /, /metrics or /healthz\n".into(),
        ),
    })
}

async fn scrape(state: &HttpState) -> Answer {
    let stats = match state.outbox.call(|s| s.stats()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "/metrics: cannot read the state database");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("cannot read the state database: {e}\n"),
            );
        }
    };
    match state.metrics.encode(&stats, state.clock.wall_ms()) {
        Ok(body) => text(StatusCode::OK, metrics::CONTENT_TYPE, body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            PLAIN,
            "cannot encode the metrics\n".into(),
        ),
    }
}
