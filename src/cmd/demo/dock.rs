//! What a person at the dock does in the demo once the outage is over: `device add` for
//! each tape the service refused as unknown, its dead letters re-queued; then `locate`
//! and `history` of one asset of the mock's seeded account. It may touch the operator's
//! client (`cmd::operator_run`), the state database and the mock's seed (which asset to ask).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use tapegate_mock as mock;

use crate::cmd::operator_run;
use crate::cmd::CmdError;
use crate::config;
use crate::operator::{AddDevice, HistoryFilter, HistoryQuery, HistoryRead, Operator};
use crate::outbox::DeviceState;
use crate::record::Mac;

/// What a person at the dock does after the outage: `device add` for each tape the
/// service refused as unknown, its dead letters re-queued; then `locate` and `history`
/// of one asset. Returns the MACs activated.
pub(super) async fn at_the_dock(
    config: &config::Config,
    clock: &crate::clock::SharedClock,
    state_dir: &Path,
    out: &mut (dyn Write + Send),
) -> Result<Vec<Mac>, CmdError> {
    let operator = operator_run::operator(config, clock)?;
    let activated = activate_unknown(&operator, config, state_dir, out).await?;
    locate(&operator, out).await;
    history(&operator, out).await;
    Ok(activated)
}

/// `device add` for each tape the daemon heard and the service refused as unknown, as
/// `--nearest` sees them (the demo activates them all rather than the nearest).
async fn activate_unknown(
    operator: &Operator,
    config: &config::Config,
    state_dir: &Path,
    out: &mut (dyn Write + Send),
) -> Result<Vec<Mac>, CmdError> {
    let unknown: BTreeSet<Mac> = match DeviceState::open_existing(state_dir)? {
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
                let requeued = operator_run::state(config)?.retry_dead_letters(mac)?;
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
    Ok(activated)
}

/// `tapegate locate` of the seeded sensor asset.
async fn locate(operator: &Operator, out: &mut (dyn Write + Send)) {
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
}

/// `tapegate history` of the seeded sensor tape's last day.
async fn history(operator: &Operator, out: &mut (dyn Write + Send)) {
    let tape = mock::seed::SENSOR_TAPE;
    let now = crate::clock::timestamp(operator.gate().clock().wall_ms());
    let query = HistoryQuery {
        filter: HistoryFilter::Tape(tape.to_string()),
        event_type: Some("environment".into()),
        from: Some(now - jiff::SignedDuration::from_hours(24)),
        to: None,
    };
    let _ = writeln!(out, "--- tapegate history --qr {tape} (the last day) ---");
    match operator.history(&query, now).await {
        Ok(HistoryRead {
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
}
