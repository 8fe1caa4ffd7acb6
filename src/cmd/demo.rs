/*!
`tapegate demo`: everything on loopback, no hardware and no credentials. It starts the
mock tracking service, a simulated fleet of tapes (a few of them unknown to the
service) and the real daemon on a temporary state directory, prints once a second what
is happening, injects a short outage of the service and shows the catch-up after it.
Then it does what a person at the dock does next: activates the tapes the service did
not know (`device add`), re-queues their dead letters and shows them delivered, and
reads one asset's latest location and history (`locate`, `history`).

This file and `tapegate mock` ([`mock`]) are the gateway's only users of the mock service
(the `tapegate-mock` crate, behind the `mock` feature); the package's binary is built
without them. The demo gives the mock its fleet's MACs ([`mock_config`]) and writes the
gateway's `[service]` section from the mock's URLs and credentials.
*/

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use tapegate_mock::{self as mock, MockConfig, MockHandle, Storm};

use crate::clock::{age, now_ms, rfc3339};
use crate::config;
use crate::operator::{AddDevice, HistoryFilter, HistoryQuery};
use crate::outbox::Store;
use crate::pipeline::{self, RunError, RunOptions};
use crate::record::Mac;
use crate::source::sim::{Sim, SimSettings};

use super::{client, CmdError};

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
    let mut activated: Vec<Mac> = Vec::new();

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
            RunOptions::default(),
        ))
    };

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
                service.set_storm(Some(Storm {
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
                service.set_storm(None);
                outage = Phase::After;
            }
            // Once the catch-up has settled the unknown tapes' captures as dead letters.
            Phase::After if elapsed >= outage_at + outage_len + ACTIVATE_AFTER => {
                activated = at_the_dock(&operator_config, &state_dir, out).await?;
                outage = Phase::Activated;
            }
            _ => {}
        }
        if let Ok(Some(store)) = Store::open_existing(&state_dir) {
            if let Ok(s) = store.stats() {
                let oldest = s
                    .oldest_pending_at
                    .map(|t| format!(" (oldest {})", age(((now_ms() - t).max(0) / 1000) as u64)))
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
                    if outage == Phase::During { "DOWN" } else { "ok" }
                );
            }
        }
    }

    let _ = writeln!(
        out,
        "\nstopping: committing what is held and finishing the batch in flight ..."
    );
    daemon_stop.cancel();
    let report = daemon.await.map_err(|source| RunError::Stage {
        stage: "daemon",
        source,
    })??;
    if let Ok(Some(store)) = Store::open_existing(&state_dir) {
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
            service.decode_requests(),
            service.decoded_items()
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
            for mac in &activated {
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
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&state_dir);
    }
    Ok(())
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

/// What a person at the dock does after the outage: `device add` for each tape the
/// service refused as unknown, its dead letters re-queued; then `locate` and `history`
/// of one asset. Returns the MACs activated.
async fn at_the_dock(
    config: &config::Config,
    state_dir: &Path,
    out: &mut (dyn Write + Send),
) -> Result<Vec<Mac>, CmdError> {
    let operator = client::operator(config)?;
    // The tapes the daemon heard and the service refused as unknown, as `--nearest`
    // sees them (the demo activates them all rather than the nearest).
    let unknown: BTreeSet<Mac> = match Store::open_existing(state_dir)? {
        Some(store) => store
            .heard_since(0)?
            .into_iter()
            .filter(|h| h.known == Some(false))
            .map(|h| h.mac)
            .collect(),
        None => BTreeSet::new(),
    };
    let _ = writeln!(
        out,
        "--- at the dock: activating the {} tape(s) the service did not know ---",
        unknown.len()
    );
    let mut activated = Vec::new();
    for mac in unknown {
        let add = AddDevice {
            qrcode: mock::fleet_qrcode(&mac.plain()),
            tape_id: mac.plain(),
            asset: Some(format!("DOCK-{}", mac.plain())),
            ..AddDevice::default()
        };
        match operator.add_device(&add).await {
            Ok(o) if !o.ok => {
                let _ = writeln!(
                    out,
                    "  device add {}: HTTP {}: {}",
                    add.qrcode,
                    o.status.unwrap_or_default(),
                    o.note.as_deref().unwrap_or(&o.message)
                );
            }
            Ok(o) => {
                let requeued = client::state(config)?.retry_dead_letters(Some(mac))?;
                let _ = writeln!(
                    out,
                    "  tapegate device add --qr {} --tape-id {}: HTTP {} {}; {requeued} dead letter(s) re-queued",
                    o.qrcode,
                    o.tape_id,
                    o.status.unwrap_or_default(),
                    o.message
                );
                activated.push(mac);
            }
            Err(e) => {
                let _ = writeln!(out, "  device add {}: {e}", add.qrcode);
            }
        }
    }
    let asset = mock::seed::SENSOR_ASSET;
    let _ = writeln!(out, "--- tapegate locate {asset} --sensor ---");
    match operator.locate(asset, true).await {
        Ok(Some(event)) => {
            for a in &event.assets {
                let readings: Vec<String> = a
                    .sensors
                    .iter()
                    .flatten()
                    .map(|r| format!("{} {} {}", r.kind, r.data, r.units))
                    .collect();
                let _ = writeln!(
                    out,
                    "  {} at {} {}: {}, {} — {}",
                    a.trk_asset_id.as_deref().unwrap_or(asset),
                    a.timestamp,
                    a.time_zone,
                    a.location_detailed,
                    a.location,
                    readings.join(", ")
                );
            }
        }
        Ok(None) => {
            let _ = writeln!(out, "  no current reading");
        }
        Err(e) => {
            let _ = writeln!(out, "  locate: {e}");
        }
    }
    let tape = mock::seed::SENSOR_TAPE;
    let now = jiff::Timestamp::now();
    let query = HistoryQuery {
        filter: HistoryFilter::Tape(tape.to_string()),
        event_type: Some("environment".into()),
        from: Some(now - jiff::SignedDuration::from_hours(24)),
        to: None,
    };
    let _ = writeln!(out, "--- tapegate history --qr {tape} (the last day) ---");
    match operator.history(&query, now).await {
        Ok(crate::operator::HistoryRead {
            events, requests, ..
        }) => {
            let temps: Vec<f64> = events
                .iter()
                .filter_map(|e| e.sensors.iter().find(|s| s.kind == "ambient_temp"))
                .map(|s| s.data)
                .collect();
            let range = temps
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| {
                    (lo.min(*t), hi.max(*t))
                });
            let _ = writeln!(
                out,
                "  {} event(s) in {requests} request(s); ambient {:.1}..{:.1} °C; latest {}",
                events.len(),
                range.0,
                range.1,
                events
                    .last()
                    .map(|e| format!("{} at {}", e.timestamp, e.location_detailed))
                    .unwrap_or_else(|| "-".into())
            );
        }
        Err(e) => {
            let _ = writeln!(out, "  history: {e}");
        }
    }
    Ok(activated)
}

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

/// `tapegate mock`: the demo's mock on `listen` until Ctrl-C.
pub async fn mock(listen: std::net::SocketAddr) -> std::io::Result<()> {
    mock::serve_forever(listen, mock_config()).await
}

/// The `[service]` section of a gateway that delivers to environment `env` of
/// `service`, with the keys the operator commands need; `None` when it does not serve
/// `env`.
fn service_toml(service: &MockHandle, env: &str, request_timeout_secs: u64) -> Option<String> {
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

    #[test]
    fn the_labelled_demo_tapes_are_tapes_of_the_demo_fleet_whatever_it_leaves_unregistered() {
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
