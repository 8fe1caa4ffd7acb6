//! The tasks a reload restarts besides delivery, the HTTP server and the telemetry
//! pusher, each with the token that stops it; the daemon's shutdown stops them too.
//! Touches the HTTP server and the pusher.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::http::{self, HttpState};
use crate::outbox::Reader;
use crate::telemetry::Pusher;

/// A server or pusher task and the token that stops it.
struct Task<T> {
    stop: CancellationToken,
    handle: JoinHandle<T>,
}

/// The tasks a reload restarts besides delivery: the HTTP server and the telemetry
/// pusher. Shared by the reload and the daemon's shutdown, which stops what runs then.
pub struct Services {
    /// Cancelled at shutdown; every task here stops with it.
    parent: CancellationToken,
    http_state: Arc<HttpState>,
    http: Option<(SocketAddr, Task<()>)>,
    telemetry: Option<Task<Pusher>>,
    outbox: Reader,
}

impl Services {
    pub fn new(parent: CancellationToken, http_state: Arc<HttpState>, outbox: Reader) -> Services {
        Services {
            parent,
            http_state,
            http: None,
            telemetry: None,
            outbox,
        }
    }

    /// Serves on `listener` (replacing the server running, if any).
    pub async fn serve(&mut self, listener: TcpListener) {
        self.stop_http().await;
        let Ok(addr) = listener.local_addr() else {
            return;
        };
        let stop = self.parent.child_token();
        let handle = tokio::spawn(
            http::serve(listener, self.http_state.clone(), stop.clone()).in_current_span(),
        );
        self.http = Some((addr, Task { stop, handle }));
    }

    pub(super) async fn stop_http(&mut self) {
        if let Some((_, t)) = self.http.take() {
            t.stop.cancel();
            let _ = t.handle.await;
        }
    }

    /// Pushes with `pusher` (replacing the one running, whose unsent pushes it takes).
    pub async fn push(&mut self, mut pusher: Option<Pusher>) {
        if let Some(old) = self.stop_telemetry().await {
            if let Some(p) = pusher.as_mut() {
                p.take_buffer_from(old);
            }
        }
        if let Some(p) = pusher {
            let stop = self.parent.child_token();
            let handle = tokio::spawn(p.run(self.outbox.clone(), stop.clone()).in_current_span());
            self.telemetry = Some(Task { stop, handle });
        }
    }

    async fn stop_telemetry(&mut self) -> Option<Pusher> {
        let t = self.telemetry.take()?;
        t.stop.cancel();
        t.handle.await.ok()
    }

    /// Stops every task (shutdown).
    pub async fn stop_all(&mut self) {
        self.stop_http().await;
        self.stop_telemetry().await;
    }

    pub(super) fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|(a, _)| *a)
    }
}
