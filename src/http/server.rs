//! The server: binding the listen address, serving connections under the cap (a new one
//! takes the place of the one waiting longest for its request, once that one has had
//! [`EVICTABLE_AFTER`] to send it), and stopping.

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

/// How long a connection is safe from eviction while it waits for its request: a
/// prompt client (a monitor's probe) is read well within it, however fast slow clients
/// reconnect. Without it, slow clients reconnecting as fast as they are closed evict
/// every connection within milliseconds, the probe's too, on a busy machine. With it,
/// a new connection at the cap waits for a slot: at most `MAX_CONNECTIONS` a second are
/// taken over, which also bounds the work such a storm costs.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

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
        let Some(slot) = take_slot(&slots, &open, &stop).await else {
            break;
        };
        // Known to `open` before the next accept looks for one to evict (its task may
        // not have run yet).
        let (id, evicted) = open.add();
        connections.spawn(connection(
            stream,
            slot,
            (id, evicted),
            state.clone(),
            open.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// A slot for a new connection: a free one, or else the one of the connection that has
/// waited longest for its request, once it has waited [`EVICTABLE_AFTER`]; `None` at
/// `stop`.
async fn take_slot(
    slots: &Arc<Semaphore>,
    open: &OpenConnections,
    stop: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        // Every slot is taken: an evicted connection frees its own as its task ends, a
        // connection that ends frees its own, and else the longest waiting may be
        // evicted later.
        let evictable_at = match open.evict_longest_waiting(Instant::now()) {
            Eviction::Evicted => {
                tracing::debug!(
                    "http: all connections taken; closed the one waiting longest for its request"
                );
                None
            }
            Eviction::NotBefore(at) => Some(at),
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            slot = slots.clone().acquire_owned() => return slot.ok(),
            () = sleep_until_some(evictable_at) => {}
        }
    }
}

/// Sleeps until `at`, or forever if `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Serves one connection in its slot, until it ends, `stop`, or its eviction.
async fn connection(
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    (id, evicted): (u64, CancellationToken),
    state: Arc<HttpState>,
    open: Arc<OpenConnections>,
    stop: CancellationToken,
) {
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

    /// Evicts the connection waiting longest for a request if it has waited at least
    /// [`EVICTABLE_AFTER`] at `now`; else says when it will have.
    fn evict_longest_waiting(&self, now: Instant) -> Eviction {
        self.with(|(_, open)| {
            let longest = open
                .iter()
                .filter_map(|(id, (since, _))| since.map(|s| (s, *id)))
                .min();
            let since = longest.map_or(now, |(since, _)| since);
            let evictable_at = since + EVICTABLE_AFTER;
            if evictable_at > now {
                return Eviction::NotBefore(evictable_at);
            }
            if let Some((_, evicted)) = longest.and_then(|(_, id)| open.remove(&id)) {
                evicted.cancel();
            }
            Eviction::Evicted
        })
    }
}

/// What [`OpenConnections::evict_longest_waiting`] did.
#[derive(Debug, PartialEq, Eq)]
enum Eviction {
    Evicted,
    /// Nothing may be evicted before then (when the longest waiting will have waited
    /// long enough; if every connection is being answered, when one that starts to wait
    /// now would have).
    NotBefore(Instant),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_that_has_waited_its_grace_is_evicted_the_longest_waiting_first() {
        let open = OpenConnections::default();
        let t0 = Instant::now();
        // Nothing open: nothing before a connection that starts waiting now could be.
        assert_eq!(
            open.evict_longest_waiting(t0),
            Eviction::NotBefore(t0 + EVICTABLE_AFTER)
        );
        let (first, first_evicted) = open.add();
        let (_, second_evicted) = open.add();
        let since = open.with(|(_, o)| o[&first].0).unwrap();
        // Young: safe until its grace has passed.
        assert_eq!(
            open.evict_longest_waiting(since),
            Eviction::NotBefore(since + EVICTABLE_AFTER)
        );
        assert!(!first_evicted.is_cancelled());
        // One being answered is never evicted; the one waiting is, once old enough.
        open.set_waiting(first, false);
        let later = since + EVICTABLE_AFTER * 3;
        assert_eq!(open.evict_longest_waiting(later), Eviction::Evicted);
        assert!(second_evicted.is_cancelled() && !first_evicted.is_cancelled());
        assert_eq!(
            open.evict_longest_waiting(later),
            Eviction::NotBefore(later + EVICTABLE_AFTER)
        );
    }
}
