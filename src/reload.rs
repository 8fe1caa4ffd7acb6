/*!
Reload (SIGHUP, `systemctl reload`) that applies what changed, and the stages it can
restart in-process. Kept apart from [`crate::pipeline`], which creates the stages: this
module says what a new config changes in a running daemon and how.

| what changed | how it is applied |
|---|---|
| `[[products]]`, `[dedup]`, `log.level`, `outbox.max_pending`, `outbox.max_age_secs`, `outbox.max_bytes`, `outbox.durability` | at once (the stages take them from a channel; the outbox's owner sets them; a tighter bound evicts at the next commit or look) |
| `[service]` (any key, the password too), `[flush]`, `readings.retention_hours` | the delivery stage restarts in-process: the running flusher sends nothing new, its batches in flight are answered (or, past `gateway.shutdown_grace_secs`, abandoned: their rows stay pending), then a new flusher starts with the new client and settings. No row leaves `pending` but through an answer, so nothing is lost or given two fates |
| `[http]` | the server restarts on the new address (bound first: a port that cannot be had refuses the reload) |
| `[telemetry]` | the pusher restarts with the new settings, keeping the pushes not yet sent |
| anything else (`[gateway]`, `[scanner]`, `outbox.commit_interval_ms`, adding or removing `[service]`) | needs a restart of the daemon; the running value stays |

Everything that can fail (reading the config, the password, building the service or
telemetry client, binding the new address) is done before anything is applied: a
refused config changes nothing. One log line says what was applied and what needs a
restart (WARN when something does, so that it shows in `journalctl -p warning`).
*/

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::ServiceClient;
use crate::config::{self, effective, Config, FlushSettings, MacFormat, Password};
use crate::dedup::DedupSettings;
use crate::flush::{FlushControl, FlushReport, Flusher};
use crate::http::{self, HttpState};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::products::Products;
use crate::systemd::Beat;
use crate::telemetry::Pusher;

/// What the delivery stage runs with; a new one restarts it.
pub struct FlushSetup {
    pub client: ServiceClient,
    pub settings: FlushSettings,
    pub mac_format: MacFormat,
    pub retention: Duration,
}

impl FlushSetup {
    /// The setup of `config`; `None` without a `[service]`.
    pub fn of(config: &Config, metrics: &Arc<Metrics>) -> Result<Option<FlushSetup>, String> {
        let Some(service) = &config.service else {
            return Ok(None);
        };
        let client = ServiceClient::new(service)
            .map_err(|e| e.to_string())?
            .with_metrics(metrics.clone());
        Ok(Some(FlushSetup {
            client,
            settings: config.flush.clone(),
            mac_format: service.mac_format,
            retention: config.readings.retention,
        }))
    }
}

/// The delivery stage's fixed parts.
pub struct FlushStage {
    pub outbox: Outbox,
    pub gateway_id: String,
    pub beat: Beat,
    pub metrics: Arc<Metrics>,
    /// How long a flusher being replaced may take to have its batches answered.
    pub grace: Duration,
}

/// The delivery stage: a flusher, replaced by a new one for each setup `next` brings.
/// Ends as a flusher does (stopped, or drained with `until_drained`), with the reports
/// of every flusher it ran added up.
pub async fn flush_stage(
    stage: FlushStage,
    first: FlushSetup,
    mut next: mpsc::UnboundedReceiver<FlushSetup>,
    control: FlushControl,
) -> FlushReport {
    let mut total = FlushReport::default();
    let mut setup = first;
    loop {
        let stop = control.stop.child_token();
        let abandon = control.abandon.child_token();
        let flusher = Flusher {
            client: setup.client,
            outbox: stage.outbox.clone(),
            settings: setup.settings,
            mac_format: setup.mac_format,
            gateway_id: stage.gateway_id.clone(),
            retention: setup.retention,
            beat: stage.beat.clone(),
            metrics: stage.metrics.clone(),
        }
        .run(FlushControl {
            committed: control.committed.clone(),
            stop: stop.clone(),
            abandon: abandon.clone(),
            until_drained: control.until_drained,
        });
        tokio::pin!(flusher);
        let mut replacement: Option<FlushSetup> = None;
        let mut grace_ends: Option<tokio::time::Instant> = None;
        let report = loop {
            let grace = async {
                match grace_ends {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                report = &mut flusher => break report,
                new = next.recv(), if replacement.is_none() && !control.stop.is_cancelled() => {
                    let Some(mut new) = new else { continue };
                    // Only the newest of several quick reloads matters.
                    while let Ok(newer) = next.try_recv() {
                        new = newer;
                    }
                    replacement = Some(new);
                    stop.cancel();
                    grace_ends = Some(tokio::time::Instant::now() + stage.grace);
                }
                () = grace => {
                    tracing::warn!(
                        grace_secs = stage.grace.as_secs(),
                        "reload: the batches in flight were not answered in time; abandoned (their captures stay pending)"
                    );
                    abandon.cancel();
                    grace_ends = None;
                }
            }
        };
        total.batches += report.batches;
        total.delivered += report.delivered;
        total.dead_letters += report.dead_letters;
        total.failures += report.failures;
        match replacement {
            Some(new) if !control.stop.is_cancelled() => {
                tracing::info!("reload: delivery restarted with the new settings");
                setup = new;
            }
            _ => return total,
        }
    }
}

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
    outbox: Outbox,
}

impl Services {
    pub fn new(parent: CancellationToken, http_state: Arc<HttpState>, outbox: Outbox) -> Services {
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

    async fn stop_http(&mut self) {
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

    fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|(a, _)| *a)
    }
}

/// What SIGHUP applies, and to what.
pub struct Reloader {
    pub path: std::path::PathBuf,
    pub set_log_level: crate::pipeline::SetLogLevel,
    pub products: watch::Sender<Products>,
    pub dedup: watch::Sender<DedupSettings>,
    /// `None` without a `[service]` at start.
    pub flush: Option<mpsc::UnboundedSender<FlushSetup>>,
    pub services: Arc<Mutex<Services>>,
    pub outbox: Outbox,
    pub metrics: Arc<Metrics>,
    /// The config in force, and what the daemon recorded of itself.
    pub running: Config,
    pub inventory: Option<Inventory>,
}

/// How a changed key is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Apply {
    Now,
    Delivery,
    Http,
    Telemetry,
    Restart,
}

/// The keys (dotted, as in the file) whose value differs between `old` and `new`;
/// secrets compared by value, named only.
pub fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (
        flat(&effective::document(old)),
        flat(&effective::document(new)),
    );
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    let secret = |c: &Config| {
        c.service
            .as_ref()
            .map(|s| s.endpoint.password.expose().to_string())
    };
    if secret(old) != secret(new) {
        if let Some(s) = new.service.as_ref().or(old.service.as_ref()) {
            keys.push(format!("service.environments.{}.password", s.environment));
        }
    }
    let telemetry_auth = |c: &Config| {
        c.telemetry
            .as_ref()
            .map(|t| t.auth.clone())
            .filter(|a| *a != crate::config::TelemetryAuth::None)
    };
    if telemetry_auth(old) != telemetry_auth(new) {
        keys.push("telemetry.credential".into());
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The document's leaves by dotted key; `products` as one value.
fn flat(doc: &Value) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(m) if prefix != "products" => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", doc, &mut out);
    out
}

fn how(key: &str, service_presence_changed: bool) -> Apply {
    let now = [
        "outbox.max_pending",
        "outbox.max_age_secs",
        "outbox.max_bytes",
        "outbox.durability",
        "log.level",
    ];
    if key == "products" || key.starts_with("dedup.") || now.contains(&key) {
        Apply::Now
    } else if key.starts_with("service")
        || key.starts_with("flush.")
        || key == "readings.retention_hours"
    {
        if service_presence_changed {
            Apply::Restart
        } else {
            Apply::Delivery
        }
    } else if key.starts_with("http") {
        Apply::Http
    } else if key.starts_with("telemetry") {
        Apply::Telemetry
    } else {
        Apply::Restart
    }
}

/// `new` with what needs a restart kept as it runs in `old`: the config in force after
/// a reload.
fn in_force(old: &Config, new: &Config) -> Config {
    let mut c = new.clone();
    c.gateway = old.gateway.clone();
    c.scanner = old.scanner.clone();
    c.outbox.commit_interval = old.outbox.commit_interval;
    if old.service.is_some() != new.service.is_some() {
        c.service = old.service.clone();
        c.operator = old.operator.clone();
        c.flush = old.flush.clone();
        c.readings = old.readings.clone();
    }
    c
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
        let keys = changed_keys(&self.running, &new);
        let presence = self.running.service.is_some() != new.service.is_some();
        let mut by: BTreeMap<Apply, Vec<String>> = BTreeMap::new();
        for k in &keys {
            by.entry(how(k, presence)).or_default().push(k.clone());
        }
        let running = in_force(&self.running, &new);

        // Everything that can fail, before anything is applied.
        let refuse = |why: String| {
            tracing::error!(path = %path.display(), "SIGHUP: new config refused ({why}); the running one stays in force");
        };
        let flush = if by.contains_key(&Apply::Delivery) && self.flush.is_some() {
            match FlushSetup::of(&running, &self.metrics) {
                Ok(s) => s,
                Err(e) => return refuse(format!("the service client: {e}")),
            }
        } else {
            None
        };
        let mut services = self.services.lock().await;
        let listener = if by.contains_key(&Apply::Http) {
            match running.http.listen {
                None => None,
                Some(addr) => match http::bind(addr).await {
                    Ok(l) => Some(l),
                    // The same port on another address of ours: let it go first.
                    Err(_)
                        if services
                            .http_addr()
                            .is_some_and(|old| old.port() == addr.port()) =>
                    {
                        services.stop_http().await;
                        match http::bind(addr).await {
                            Ok(l) => Some(l),
                            Err(e) => {
                                // Back on the old address, as if nothing happened.
                                if let Some(old) = self.running.http.listen {
                                    if let Ok(l) = http::bind(old).await {
                                        services.serve(l).await;
                                    }
                                }
                                return refuse(e.to_string());
                            }
                        }
                    }
                    Err(e) => return refuse(e.to_string()),
                },
            }
        } else {
            None
        };
        let pusher = if by.contains_key(&Apply::Telemetry) {
            match running
                .telemetry
                .clone()
                .map(|t| Pusher::new(t, &running.gateway.id, self.metrics.clone()))
            {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => return refuse(e.to_string()),
            }
        } else {
            None
        };

        // Apply.
        if by.contains_key(&Apply::Now) {
            if let Err(e) = (self.set_log_level)(&running.log.level) {
                tracing::warn!(error = %e, "log level not changed");
            }
            self.products.send_replace(running.products.clone());
            self.dedup.send_replace(running.dedup);
            let (max_pending, durability) = (running.outbox.max_pending, running.outbox.durability);
            let retention = running.outbox.retention();
            let set = self
                .outbox
                .call(move |s| {
                    s.set_max_pending(max_pending);
                    s.set_retention(retention);
                    s.set_durability(durability)
                })
                .await;
            if let Err(e) = set {
                tracing::warn!(error = %e, "reload: outbox settings not changed");
            }
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
        if let Some(inv) = self.inventory.as_mut() {
            let hash = effective::hash(&self.running);
            if inv.config_hash != hash {
                inv.config_hash = hash;
                self.metrics.set_inventory(inv);
                let record = inv.clone();
                if let Err(e) = self.outbox.call(move |s| s.note_inventory(&record)).await {
                    tracing::warn!(error = %e, "cannot record the inventory");
                }
            }
        }

        let named = |which: &[Apply], note: &str| -> Vec<String> {
            which
                .iter()
                .filter_map(|a| by.get(a))
                .flatten()
                .map(|k| format!("{k}{note}"))
                .collect()
        };
        let mut applied = named(&[Apply::Now], "");
        applied.extend(named(&[Apply::Delivery], " (delivery restarted)"));
        applied.extend(named(&[Apply::Http], " (server restarted)"));
        applied.extend(named(&[Apply::Telemetry], " (telemetry restarted)"));
        let restart = named(&[Apply::Restart], "");
        let list = |v: &[String]| {
            if v.is_empty() {
                "nothing".to_string()
            } else {
                v.join(", ")
            }
        };
        if restart.is_empty() {
            tracing::info!(
                path = %path.display(),
                "SIGHUP: config reloaded: applied {}; needs a restart: nothing",
                list(&applied)
            );
        } else {
            tracing::warn!(
                path = %path.display(),
                "SIGHUP: config reloaded: applied {}; needs a restart: {} (the running values stay until then)",
                list(&applied),
                list(&restart)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::{parse, SERVICE};

    #[test]
    fn changes_are_named_by_key_and_sorted_by_how_they_apply() {
        let old = parse(&format!("{SERVICE}\n[flush]\nmax_batch = 10\n"), &[]).unwrap();
        let new = parse(
            &format!(
                "{}\n[flush]\nmax_batch = 20\n[http]\nlisten = \"127.0.0.1:9464\"\n[gateway]\nid = \"other\"\n[dedup]\nwindow_secs = 1\n",
                SERVICE.replace("s3cr3t-value", "new-pw")
            ),
            &[],
        )
        .unwrap();
        let keys = changed_keys(&old, &new);
        assert_eq!(
            keys,
            [
                "dedup.window_secs",
                "flush.max_batch",
                "gateway.id",
                "http.listen",
                "service.environments.ppe.password"
            ]
        );
        let hows: Vec<Apply> = keys.iter().map(|k| how(k, false)).collect();
        assert_eq!(
            hows,
            [
                Apply::Now,
                Apply::Delivery,
                Apply::Restart,
                Apply::Http,
                Apply::Delivery
            ]
        );
        // No password value in the keys.
        assert!(!format!("{keys:?}").contains("new-pw"));
        // What needs a restart keeps its running value.
        let running = in_force(&old, &new);
        assert_eq!(running.gateway.id, old.gateway.id);
        assert_eq!(running.flush.max_batch, 20);
    }

    #[test]
    fn adding_or_removing_the_service_needs_a_restart() {
        let without = parse("", &[]).unwrap();
        let with = parse(SERVICE, &[]).unwrap();
        let keys = changed_keys(&without, &with);
        assert!(
            keys.iter().all(|k| how(k, true) == Apply::Restart),
            "{keys:?}"
        );
        assert!(in_force(&without, &with).service.is_none());
    }
}
