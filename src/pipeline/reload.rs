/*!
Reload (SIGHUP, `systemctl reload`) that applies what changed, and the stages it can
restart in-process. Kept apart from [`crate::pipeline`], which creates the stages: this
module says what a new config changes in a running daemon and how. It touches the
config, the stages it restarts (delivery, the HTTP server, the pusher) and the outbox's
settings.

| what changed | how it is applied |
|---|---|
| `[[products]]`, `[dedup]`, `log.level`, `outbox.max_pending`, `outbox.max_age_secs`, `outbox.max_bytes`, `outbox.durability` | at once (the stages take them from a channel; the outbox's owner sets them; a tighter bound evicts at the next commit or look); `readings.retention_hours` has no effect (deprecated: no reading history is kept) and is warned of |
| `[service]` (any key, the password too), `[flush]` | the delivery stage restarts in-process: the running flusher sends nothing new, its batches in flight are answered (or, past `gateway.shutdown_grace_secs`, abandoned: their rows stay pending), then a new flusher starts with the new client and settings. No row leaves `pending` but through an answer, so nothing is lost or given two fates |
| `[http]` | the server restarts on the new address (bound first: a port that cannot be had refuses the reload) |
| `[telemetry]` | the pusher restarts with the new settings, keeping the pushes not yet sent |
| anything else (`[gateway]`, `[scanner]`, `outbox.commit_interval_ms`, adding or removing `[service]`) | needs a restart of the daemon; the running value stays |

Everything that can fail (reading the config, the password, building the service or
telemetry client, binding the new address) is done before anything is applied: a
refused config changes nothing. One log line says what was applied and what needs a
restart (WARN when something does, so that it shows in `journalctl -p warning`).
*/

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Mutex};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{self, effective, Config, Password};
use crate::dedup::DedupSettings;
use crate::http;
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::outbox::StageOutbox;
use crate::products::Products;
use crate::telemetry::Pusher;
use changes::{by_how, in_force, log_summary, Apply};

mod changes;
mod delivery;
mod services;

pub use changes::changed_keys;
pub use delivery::{flush_stage, FlushSetup, FlushStage};
pub use services::Services;

/// Applies a log filter (`info`, `tapegate=debug`); the error says why it was not.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What SIGHUP applies, and to what.
pub struct Reloader {
    pub path: std::path::PathBuf,
    pub set_log_level: SetLogLevel,
    pub products: watch::Sender<Products>,
    pub dedup: watch::Sender<DedupSettings>,
    /// `None` without a `[service]` at start.
    pub flush: Option<mpsc::UnboundedSender<FlushSetup>>,
    pub services: Arc<Mutex<Services>>,
    pub outbox: StageOutbox,
    pub metrics: Arc<Metrics>,
    /// The daemon's clock, for what a reload restarts.
    pub clock: SharedClock,
    /// The config in force, and what the daemon recorded of itself.
    pub running: Config,
    pub inventory: Option<Inventory>,
}

impl Reloader {
    /// On each SIGHUP, reads the config and applies it (see the module doc), until
    /// `stop` (shutdown: it holds handles to the outbox, which must all be gone for the
    /// database to close).
    pub async fn run(mut self, mut hangup: tokio::signal::unix::Signal, stop: CancellationToken) {
        loop {
            tokio::select! {
                signal = hangup.recv() => match signal {
                    Some(()) => self.reload().await,
                    None => break,
                },
                () = stop.cancelled() => break,
            }
        }
    }

    /// Reads the config again and applies what changed; a config refused (or one whose
    /// new parts cannot be set up) changes nothing.
    pub async fn reload(&mut self) {
        let path = self.path.clone();
        // With the password: a changed one is applied (the daemon can read its
        // credential, where `ExecReload=` cannot).
        let new = match config::load_with(&path, std::env::vars(), Password::Read) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "SIGHUP: new config refused; the running one stays in force");
                return;
            }
        };
        for warning in new.deprecations() {
            tracing::warn!("{warning}");
        }
        let by = by_how(&self.running, &new);
        let running = in_force(&self.running, &new);

        // Everything that can fail, before anything is applied.
        let refuse = |why: String| {
            tracing::error!(path = %path.display(), "SIGHUP: new config refused ({why}); the running one stays in force");
        };
        let flush = if by.contains_key(&Apply::Delivery) && self.flush.is_some() {
            match FlushSetup::of(&running, &self.metrics, self.clock.clone()) {
                Ok(s) => s,
                Err(e) => return refuse(format!("the service client: {e}")),
            }
        } else {
            None
        };
        let mut services = self.services.lock().await;
        let listener = if by.contains_key(&Apply::Http) {
            match listener(&running, self.running.http.listen, &mut services).await {
                Ok(l) => l,
                Err(e) => return refuse(e),
            }
        } else {
            None
        };
        let pusher = if by.contains_key(&Apply::Telemetry) {
            match running.telemetry.clone().map(|t| {
                Pusher::new(
                    t,
                    &running.gateway.id,
                    self.metrics.clone(),
                    self.clock.clone(),
                )
            }) {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => return refuse(e.to_string()),
            }
        } else {
            None
        };

        // Apply.
        if by.contains_key(&Apply::Now) {
            self.apply_now(&running).await;
        }
        if let (Some(setup), Some(tx)) = (flush, &self.flush) {
            let _ = tx.send(setup);
        }
        if by.contains_key(&Apply::Http) {
            match listener {
                Some(l) => services.serve(l).await,
                None => services.stop_http().await,
            }
        }
        if by.contains_key(&Apply::Telemetry) {
            services.push(pusher).await;
        }
        drop(services);
        self.running = running;
        self.note_config_hash().await;
        log_summary(&path, &by);
    }

    /// What applies at once: the log level, the products, dedup, the outbox's bounds
    /// and durability.
    async fn apply_now(&self, running: &Config) {
        if let Err(e) = (self.set_log_level)(&running.log.level) {
            tracing::warn!(error = %e, "log level not changed");
        }
        self.products.send_replace(running.products.clone());
        self.dedup.send_replace(running.dedup);
        let (max_pending, durability) = (running.outbox.max_pending, running.outbox.durability);
        let retention = running.outbox.retention();
        let set = self
            .outbox
            .set_bounds(max_pending, retention, durability)
            .await;
        if let Err(e) = set {
            tracing::warn!(error = %e, "reload: outbox settings not changed");
        }
    }

    /// Records the hash of the config now in force, when it changed (the inventory).
    async fn note_config_hash(&mut self) {
        let Some(inv) = self.inventory.as_mut() else {
            return;
        };
        let hash = effective::hash(&self.running);
        if inv.config_hash != hash {
            inv.config_hash = hash;
            self.metrics.set_inventory(inv);
            let record = inv.clone();
            if let Err(e) = self.outbox.note_inventory(record).await {
                tracing::warn!(error = %e, "cannot record the inventory");
            }
        }
    }
}

/// The listener for the new `[http] listen` (`None`: no server), bound before anything
/// is applied; `Err` when the address cannot be had (the old one is served again).
async fn listener(
    running: &Config,
    old: Option<SocketAddr>,
    services: &mut Services,
) -> Result<Option<TcpListener>, String> {
    let Some(addr) = running.http.listen else {
        return Ok(None);
    };
    match http::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        // The same port on another address of ours: let it go first.
        Err(_)
            if services
                .http_addr()
                .is_some_and(|old| old.port() == addr.port()) =>
        {
            services.stop_http().await;
            match http::bind(addr).await {
                Ok(l) => Ok(Some(l)),
                Err(e) => {
                    // Back on the old address, as if nothing happened.
                    if let Some(old) = old {
                        if let Ok(l) = http::bind(old).await {
                            services.serve(l).await;
                        }
                    }
                    Err(e.to_string())
                }
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
