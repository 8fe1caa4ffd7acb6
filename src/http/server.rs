//! The server: binding the listen address, serving connections under the cap (a new one
//! takes the place of the one waiting longest for its request), and stopping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, HttpService};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::answer::HttpState;
use super::routes::answer;

/// Connections served at once; past it, a new one takes the place of the one that has
/// waited longest for its request.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on http.listen = {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

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
