//! What a new config changes, pure: the keys whose meaning differs (secrets compared,
//! never shown), how each is applied (at once, by restarting delivery, the server or
//! the pusher, or only by a restart of the daemon), and the config in force after.
//! Touches the config and its effective document only.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::{effective, Config};

/// How a changed key is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Apply {
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

pub(super) fn how(key: &str, service_presence_changed: bool) -> Apply {
    let now = [
        "outbox.max_pending",
        "outbox.max_age_secs",
        "outbox.max_bytes",
        "outbox.durability",
        "log.level",
    ];
    // readings.retention_hours: nothing to apply (deprecated; warned of).
    if key == "products"
        || key.starts_with("dedup.")
        || now.contains(&key)
        || key == "readings.retention_hours"
    {
        Apply::Now
    } else if key.starts_with("service") || key.starts_with("flush.") {
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
pub(super) fn in_force(old: &Config, new: &Config) -> Config {
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

/// The changed keys grouped by how they are applied.
pub(super) fn by_how(old: &Config, new: &Config) -> BTreeMap<Apply, Vec<String>> {
    let presence = old.service.is_some() != new.service.is_some();
    let mut by: BTreeMap<Apply, Vec<String>> = BTreeMap::new();
    for k in changed_keys(old, new) {
        let apply = how(&k, presence);
        by.entry(apply).or_default().push(k);
    }
    by
}

/// Says what a reload applied and what needs a restart: at WARN when something does,
/// so that it shows in `journalctl -p warning`.
pub(super) fn log_summary(path: &std::path::Path, by: &BTreeMap<Apply, Vec<String>>) {
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
