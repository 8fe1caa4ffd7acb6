//! Rendering the exposition: the live registry, then the stored metrics read from the
//! state database, the process's own series, then what the gateway is and runs, as
//! OpenMetrics text.

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::stored::stored;
use super::Metrics;
use crate::outbox::Stats;
use crate::record::EpochMillis;

/// The media type of what [`Metrics::encode`] writes (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Metrics {
    /// The exposition of [`Metrics::encode`]: the live registry, the stored metrics of
    /// `stats` as of `now`, the process's series, then the inventory once known.
    pub(super) fn exposition(
        &self,
        stats: &Stats,
        now: EpochMillis,
    ) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)?;
        encode_registry(&mut out, &stored(stats, now))?;
        encode_registry(&mut out, &super::process::registry())?;
        let inventory = self.inventory.lock().ok().and_then(|i| i.clone());
        if let Some((labels, started_at)) = inventory {
            encode_registry(&mut out, &inventory_registry(labels, started_at))?;
        }
        encode_eof(&mut out)?;
        Ok(out)
    }
}

/// `tapegate_inventory_info` and `tapegate_start_time_seconds`.
fn inventory_registry(labels: Vec<(String, String)>, started_at: EpochMillis) -> Registry {
    let mut r = Registry::with_prefix("tapegate");
    // What a gateway is and runs, so that drift across a fleet shows in one query.
    r.register(
        "inventory",
        "What this gateway runs: version, commit, config_hash, gateway_id, boot_id, kernel, os, arch, bluez, adapter, source (always 1)",
        Info::new(labels),
    );
    r.register_with_unit(
        "start_time",
        "When the daemon started, epoch seconds (uptime: time() - this)",
        Unit::Seconds,
        ConstGauge::new(started_at as f64 / 1000.0),
    );
    r
}
