/*!
`tapegate demo`: everything on loopback, no hardware and no credentials. It starts the
mock tracking service, a simulated fleet of tapes (a few of them unknown to the
service) and the real daemon on a temporary state directory, prints once a second what
is happening, injects a short outage of the service and shows the catch-up after it.
Then it does what a person at the dock does next: activates the tapes the service did
not know (`device add`), re-queues their dead letters and shows them delivered, and
reads one asset's latest location and history (`locate`, `history`).

It may touch everything a gateway has, and it is, with `tapegate mock` ([`mock`]) and
`demo/dock.rs` (the dock's work), the gateway's only user of the mock service (the
`tapegate-mock` crate, behind the `mock` feature); the package's binary is built without
them. The demo gives the mock its fleet's MACs ([`mock_config`]) and writes the gateway's
`[service]` section from the mock's URLs and credentials.
*/

mod dock;
mod recorded;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use tapegate_mock::{self as mock, MockConfig, MockHandle, Storm};

use crate::clock::{age, rfc3339, SharedClock};
use crate::config;
use crate::outbox::StateReader;
use crate::pipeline::{self, RunError, RunOptions};
use crate::record::Mac;
use crate::source::sim::{Sim, SimSettings};

use super::CmdError;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Stop after this long (None: until Ctrl-C).
    pub duration: Option<Duration>,
    pub tapes: usize,
    /// Keep the state directory here instead of a temporary one.
    pub state_dir: Option<PathBuf>,
    /// Serve /metrics, /healthz and the status page here.
    pub http: Option<std::net::SocketAddr>,
    /// The clock the daemon, the operator's calls and the progress lines read.
    pub clock: SharedClock,
}

/// Runs the demo until `stop` resolves or the duration ends.
pub async fn run(
    options: DemoOptions,
    stop: impl std::future::Future<Output = ()>,
    out: &mut (dyn Write + Send),
) -> Result<(), CmdError> {
    let service = mock::start(mock_config()).await.map_err(CmdError::Mock)?;
    let (state_dir, temporary) = match &options.state_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("tapegate-demo-{}", std::process::id())),
            true,
        ),
    };
    let unregistered = (options.tapes / 60).clamp(1, 10);
    let mut text = demo_config(&service, &state_dir, options.tapes, unregistered);
    if let Some(addr) = options.http {
        text.push_str(&format!("\n[http]\nlisten = \"{addr}\"\n"));
    }
    let config = config::from_toml(&text, Path::new("(demo)"), std::iter::empty())?;
    let operator_config = config.clone();

    let _ = writeln!(
        out,
        "tapegate demo: {} simulated tapes ({} unknown to the service), mock service at {}\nstate: {}\n",
        options.tapes,
        unregistered,
        service.base_url("ppe"),
        state_dir.display()
    );
    if let Some(addr) = options.http {
        let _ = writeln!(
            out,
            "status page: http://{addr}/ (also /metrics and /healthz)\n"
        );
    }

    let daemon_stop = tokio_util::sync::CancellationToken::new();
    let daemon = {
        let stop = daemon_stop.clone();
        tokio::spawn(pipeline::run(
            config,
            async move { stop.cancelled().await },
            RunOptions {
                clock: options.clock.clone(),
                ..RunOptions::default()
            },
        ))
    };
    let show = Show {
        service: &service,
        config: &operator_config,
        state_dir: &state_dir,
        clock: &options.clock,
    };
    let activated = show.watch(&options, stop, out).await?;

    let _ = writeln!(
        out,
        "\nstopping: committing what is held and finishing the batch in flight ..."
    );
    daemon_stop.cancel();
    let report = daemon.await.map_err(|source| RunError::Stage {
        stage: "daemon",
        source,
    })??;
    if let Ok(Some(store)) = StateReader::open(&state_dir) {
        show.summary(&store, &report, &activated, out)?;
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&state_dir);
    }
    Ok(())
}

/// What the demo shows, and where from.
struct Show<'a> {
    service: &'a MockHandle,
    config: &'a config::Config,
    state_dir: &'a Path,
    clock: &'a SharedClock,
}

impl Show<'_> {
    /// A line a second until `stop` or the duration's end; the outage on the way, and
    /// the dock's work after it. Returns the MACs activated at the dock.
    async fn watch(
        &self,
        options: &DemoOptions,
        stop: impl std::future::Future<Output = ()>,
        out: &mut (dyn Write + Send),
    ) -> Result<Vec<Mac>, CmdError> {
        let mut activated = Vec::new();
        let started = Instant::now();
        let outage_at = options
            .duration
            .map(|d| d / 3)
            .unwrap_or(Duration::from_secs(15))
            .min(Duration::from_secs(15));
        let outage_len = Duration::from_secs(8);
        let mut outage = Phase::Before;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => {}
            }
            let elapsed = started.elapsed();
            if options.duration.is_some_and(|d| elapsed >= d) {
                break;
            }
            match outage {
                Phase::Before if elapsed >= outage_at => {
                    let _ = writeln!(
                        out,
                        "--- injecting a {}s outage: the service answers 503 to everything ---",
                        outage_len.as_secs()
                    );
                    self.service.set_storm(Some(Storm {
                        probability: 1.0,
                        seed: 7,
                        mix: vec![mock::Fault::Status {
                            status: 503,
                            retry_after: None,
                        }],
                    }));
                    outage = Phase::During;
                }
                Phase::During if elapsed >= outage_at + outage_len => {
                    let _ = writeln!(out, "--- outage over: catching up ---");
                    self.service.set_storm(None);
                    outage = Phase::After;
                }
                // Once the catch-up has settled the unknown tapes' captures as dead letters.
                Phase::After if elapsed >= outage_at + outage_len + ACTIVATE_AFTER => {
                    activated =
                        dock::at_the_dock(self.config, self.clock, self.state_dir, out).await?;
                    outage = Phase::Activated;
                }
                _ => {}
            }
            self.progress(elapsed, outage == Phase::During, out);
        }
        Ok(activated)
    }

    /// The line of the second `elapsed`, from the state database.
    fn progress(&self, elapsed: Duration, down: bool, out: &mut (dyn Write + Send)) {
        let Ok(Some(store)) = StateReader::open(self.state_dir) else {
            return;
        };
        let Ok(s) = store.stats() else {
            return;
        };
        let oldest = s
            .oldest_pending_at
            .map(|t| {
                format!(
                    " (oldest {})",
                    age(((self.clock.wall_ms() - t).max(0) / 1000) as u64)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:>4}s  captured {:>6}  delivered {:>6}  dead letters {:>3}  pending {:>5}{oldest}  tapes {:>4}  service: {}",
            elapsed.as_secs(),
            s.admitted,
            s.delivered,
            s.dead_letters,
            s.pending,
            s.tapes,
            if down { "DOWN" } else { "ok" }
        );
    }

    /// What the run did: the counts, some decoded tapes, the tapes activated at the
    /// dock, a dead letter.
    fn summary(
        &self,
        store: &StateReader,
        report: &pipeline::RunReport,
        activated: &[Mac],
        out: &mut (dyn Write + Send),
    ) -> Result<(), CmdError> {
        let s = store.stats()?;
        let _ = writeln!(
            out,
            "\ncaptured {} (adverts heard {}, not tapes {}, deduplicated {}), delivered {}, dead letters {}, pending {} (a real gateway delivers these at its next start)",
            s.admitted,
            report.ingest.adverts,
            report.ingest.unmatched,
            report.ingest.deduplicated,
            s.delivered,
            s.dead_letters,
            s.pending
        );
        let _ = writeln!(
            out,
            "mock service: {} decode requests, {} items decoded",
            self.service.decode_requests(),
            self.service.decoded_items()
        );
        let tapes = store.tapes(5)?;
        if !tapes.is_empty() {
            let _ = writeln!(
                out,
                "\nsome decoded tapes (`tapegate tapes` shows them all):"
            );
            for t in tapes {
                let _ = writeln!(
                    out,
                    "  {:<16} {}  {:>6.2} °C  battery {:>3}%",
                    t.qr_code.as_deref().unwrap_or("-"),
                    t.mac,
                    t.temp.unwrap_or(f64::NAN),
                    t.bat.map(|b| b.round() as i64).unwrap_or(-1)
                );
            }
        }
        if !activated.is_empty() {
            let tapes = store.tapes(usize::MAX)?;
            let _ = writeln!(out, "\nthe tapes activated at the dock, now delivered:");
            for mac in activated {
                match tapes.iter().find(|t| t.mac == *mac) {
                    Some(t) => writeln!(
                        out,
                        "  {:<16} {}  {:>6.2} °C  decoded {}",
                        t.qr_code.as_deref().unwrap_or("-"),
                        t.mac,
                        t.temp.unwrap_or(f64::NAN),
                        rfc3339(t.decoded_at)
                    ),
                    None => writeln!(out, "  {mac}  not decoded yet"),
                }?;
            }
        }
        let dead = store.dead_letters(3)?;
        if let Some(d) = dead.first() {
            let _ = writeln!(
                out,
                "\na dead letter (`tapegate dead-letters list`): {} refused: {}",
                d.mac, d.error
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Before,
    During,
    After,
    Activated,
}

/// How long after the outage the tapes are activated (the catch-up has run by then).
const ACTIVATE_AFTER: Duration = Duration::from_secs(2);

/// The seed of the demo's simulated fleet (the default `sim_seed`).
pub const DEMO_SIM_SEED: u64 = 1;

/// The mock as the demo and `tapegate mock` run it: the demo account, with labels on
/// tapes of the demo's fleet (whose MACs only the gateway's simulator knows).
pub fn mock_config() -> MockConfig {
    let fleet = Sim::fleet(&SimSettings {
        tapes: mock::seed::DEMO_LABELLED.end,
        interval_ms: 1000,
        change_every: 1,
        unregistered: 0,
        others_ratio: 0.0,
        seed: DEMO_SIM_SEED,
        duration_ms: None,
        realtime: false,
        start_ms: 0,
    });
    MockConfig {
        demo_fleet: fleet.iter().map(Mac::plain).collect(),
        ..MockConfig::demo()
    }
}

/// `tapegate mock`: the demo's mock on `listen` until Ctrl-C; with `record`, every
/// decode item it receives is written to that file as it comes (`recorded.rs`).
pub async fn mock(listen: std::net::SocketAddr, record: Option<&Path>) -> std::io::Result<()> {
    match record {
        Some(path) => recorded::serve(listen, mock_config(), path).await,
        None => mock::serve_forever(listen, mock_config()).await,
    }
}

/// The `[service]` section of a gateway that delivers to environment `env` of
/// `service`, with the keys the operator commands need; `None` when it does not serve
/// `env`.
pub fn service_toml(service: &MockHandle, env: &str, request_timeout_secs: u64) -> Option<String> {
    let e = service.environment(env)?;
    Some(format!(
        r#"
[service]
environment = "{env}"
request_timeout_secs = {request_timeout_secs}

[service.environments.{env}]
base_url = "{base}"
auth_url = "{auth}"
client_id = "{client}"
audience = "{audience}"
username = "{user}"
password = "{password}"
customer_id = "{customer}"
authorized_groups = "{groups}"
historical_base_url = "{historical}"
history_operation_id = "{operation}"
default_app_id = "{app}"
"#,
        base = service.base_url(env),
        auth = service.auth_url(env),
        historical = service.historical_base_url(env),
        operation = mock::HISTORY_OPERATION_ID,
        app = mock::seed::SEED_APP,
        client = e.client_id,
        audience = e.audience,
        user = e.username,
        password = e.password,
        customer = e.customer_id,
        groups = e.authorized_groups,
    ))
}

/// The demo's config, through the same validation as a user's file.
fn demo_config(
    service: &MockHandle,
    state_dir: &Path,
    tapes: usize,
    unregistered: usize,
) -> String {
    // The demo mock always serves "ppe"; were it not so, the demo would only collect.
    let service_toml = service_toml(service, "ppe", 5).unwrap_or_default();
    format!(
        r#"
[gateway]
id = "demo"
state_dir = "{state}"
shutdown_grace_secs = 5
{service_toml}
[scanner]
source = "sim"
sim_tapes = {tapes}
sim_interval_ms = 1000
sim_change_every = 3
sim_unregistered = {unregistered}
sim_others_ratio = 0.3

[dedup]
window_secs = 60
min_interval_secs = 5

[flush]
max_delay_secs = 1
backoff_initial_ms = 250
backoff_max_secs = 4

[log]
level = "warn"
"#,
        state = state_dir.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::DEFAULTS;

    /// The labelled demo tapes are tapes of the demo fleet whatever it leaves unregistered.
    #[test]
    fn the_labelled_demo_tapes_are_tapes_of_the_demo_fleet() {
        assert_eq!(DEFAULTS.scanner.sim_seed, DEMO_SIM_SEED);
        let fleet = Sim::fleet(&SimSettings {
            tapes: 200,
            interval_ms: 1000,
            change_every: 3,
            unregistered: 10,
            others_ratio: 0.3,
            seed: DEMO_SIM_SEED,
            duration_ms: None,
            realtime: true,
            start_ms: 0,
        });
        let seeded = mock_config().demo_fleet;
        for i in mock::seed::DEMO_LABELLED {
            assert_eq!(fleet[i].plain(), seeded[i], "tape {i}");
        }
    }
}
