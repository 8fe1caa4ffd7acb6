/*!
The effective configuration: the validated [`Config`] written back as a document in the
file's own sections and key names, every default filled in and every secret replaced
by `<redacted>`, and its hash. It touches the typed config only.

Built from the typed values, not from the file's text, so that two files that mean the
same (keys in another order, other formatting, `0x0EF7` or `3831`, a default written out
or left out, a value set from the environment) give the same document and the same
hash, and a change of meaning changes both. What it is for: `tapegate support-bundle`
(what the daemon really runs with) and the inventory's `config_hash` (drift across a
fleet in one query).

The hash leaves out `gateway.id` (every gateway has its own; two docks configured alike
should hash alike) and the secrets (they are not in the document at all). It is the
first 16 hex digits of the SHA-256 of the document's compact JSON.
*/

use serde_json::{json, Map, Value};

use super::Durability;
use super::{
    AdvertsPath, Config, FlushSettings, GatewaySettings, MacFormat, OperatorSettings,
    OutboxSettings, ScanMode, ScannerSettings, ServiceSettings, SourceKind, TelemetryAuth,
    TelemetrySettings,
};
use crate::clock::ClockPolicy;
use crate::products::{PacketEncoding, PacketSource, Products};

/// What stands for a secret's value.
pub const REDACTED: &str = "<redacted>";

/// The effective configuration as a document (see the module doc).
pub fn document(c: &Config) -> Value {
    let mut doc = Map::new();
    doc.insert("gateway".into(), gateway(&c.gateway));
    if let Some(s) = &c.service {
        doc.insert("service".into(), service(s, c.operator.as_ref()));
    }
    doc.insert("products".into(), products(&c.products));
    doc.insert("scanner".into(), scanner(&c.scanner));
    doc.insert(
        "dedup".into(),
        json!({
            "window_secs": c.dedup.window_ms as f64 / 1000.0,
            "min_interval_secs": c.dedup.min_interval_ms as f64 / 1000.0,
            "max_tracked": c.dedup.max_tracked,
        }),
    );
    doc.insert("outbox".into(), outbox(&c.outbox));
    doc.insert("flush".into(), flush(&c.flush));
    doc.insert(
        "readings".into(),
        json!({ "retention_hours": c.readings.retention.as_secs() / 3600 }),
    );
    doc.insert("log".into(), json!({ "level": c.log.level }));
    let mut http = Map::new();
    if let Some(addr) = c.http.listen {
        http.insert("listen".into(), addr.to_string().into());
    }
    doc.insert("http".into(), http.into());
    doc.insert("telemetry".into(), telemetry(c.telemetry.as_ref()).into());
    Value::Object(doc)
}

fn gateway(g: &GatewaySettings) -> Value {
    json!({
        "id": g.id,
        "state_dir": g.state_dir,
        "shutdown_grace_secs": g.shutdown_grace.as_secs(),
        "clock": match g.clock.policy {
            ClockPolicy::Auto => "auto",
            ClockPolicy::Wait => "wait",
            ClockPolicy::Trust => "trust",
        },
        "clock_max_hold_secs": g.clock.max_hold.as_secs(),
    })
}

/// `[service]` with the selected environment, its password redacted.
fn service(s: &ServiceSettings, operator: Option<&OperatorSettings>) -> Value {
    let e = &s.endpoint;
    let mut env = json!({
        "base_url": e.base_url.as_str(),
        "auth_url": e.auth_url.as_str(),
        "client_id": e.client_id,
        "audience": e.audience,
        "username": e.username,
        "password": REDACTED,
        "customer_id": e.customer_id,
        "authorized_groups": e.authorized_groups,
    });
    if let Some(o) = operator {
        let fields = [
            (
                "historical_base_url",
                o.historical_base_url.as_ref().map(|u| u.to_string()),
            ),
            ("history_operation_id", o.history_operation_id.clone()),
            ("default_app_id", o.default_app_id.clone()),
            ("default_tape_type", Some(o.default_tape_type.clone())),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                env[k] = v.into();
            }
        }
    }
    let mut service = json!({
        "environment": s.environment,
        "mac_format": match s.mac_format {
            MacFormat::Plain => "plain",
            MacFormat::Colon => "colon",
        },
        "request_timeout_secs": s.request_timeout.as_secs(),
        "environments": { s.environment.clone(): env },
    });
    if let Some(o) = operator {
        service["rate_window_secs"] = o.rate_window.as_secs().into();
    }
    if let Some(ca) = &s.ca_file {
        service["ca_file"] = json!(ca.path);
    }
    service
}

fn products(products: &Products) -> Value {
    let products: Vec<Value> = products
        .0
        .iter()
        .map(|p| {
            let mut v = json!({
                "id": &*p.id,
                "packet": match p.packet {
                    PacketSource::ManufacturerData => "manufacturer_data",
                    PacketSource::ManufacturerPayload => "manufacturer_payload",
                    PacketSource::ServiceData => "service_data",
                },
                "packet_encoding": match p.packet_encoding {
                    PacketEncoding::Hex => "hex",
                    PacketEncoding::HexLower => "hex_lower",
                    PacketEncoding::Base64 => "base64",
                },
            });
            let criteria = [
                ("manufacturer_id", p.manufacturer_id.map(Value::from)),
                ("service_uuid", p.service_uuid.clone().map(Value::from)),
                ("name_prefix", p.name_prefix.clone().map(Value::from)),
                (
                    "mac_prefix",
                    p.mac_prefix.as_ref().map(|o| {
                        let octets: Vec<String> = o.iter().map(|b| format!("{b:02X}")).collect();
                        Value::from(octets.join(":"))
                    }),
                ),
                ("min_rssi", p.min_rssi.map(Value::from)),
            ];
            for (k, val) in criteria {
                if let Some(val) = val {
                    v[k] = val;
                }
            }
            v
        })
        .collect();
    products.into()
}

fn scanner(sc: &ScannerSettings) -> Value {
    let mut scanner = json!({
        "source": match sc.source {
            SourceKind::Ble => "ble",
            SourceKind::Replay => "replay",
            SourceKind::Sim => "sim",
        },
        "adverts": match sc.adverts {
            AdvertsPath::Auto => "auto",
            AdvertsPath::Mgmt => "mgmt",
            AdvertsPath::Dbus => "dbus",
        },
        "scan": match sc.scan {
            ScanMode::Active => "active",
            ScanMode::Passive => "passive",
        },
        "silence_secs": sc.silence.map_or(0.0, |d| d.as_secs_f64()),
        "give_up_secs": sc.give_up.as_secs_f64(),
        "max_devices": sc.max_devices,
        "sim_tapes": sc.sim.tapes,
        "sim_interval_ms": sc.sim.interval_ms,
        "sim_change_every": sc.sim.change_every,
        "sim_unregistered": sc.sim.unregistered,
        "sim_others_ratio": sc.sim.others_ratio,
        "sim_seed": sc.sim.seed,
        "sim_realtime": sc.sim.realtime,
        "sim_start": sc.sim.start_ms as f64 / 1000.0,
    });
    if let Some(a) = &sc.adapter {
        scanner["adapter"] = a.as_str().into();
    }
    if let Some(p) = &sc.replay_path {
        scanner["replay_path"] = json!(p);
    }
    if let Some(d) = sc.sim.duration_ms {
        scanner["sim_duration_secs"] = (d as f64 / 1000.0).into();
    }
    scanner
}

fn outbox(o: &OutboxSettings) -> Value {
    json!({
        "max_pending": o.max_pending,
        "durability": match o.durability {
            Durability::Full => "full",
            Durability::Normal => "normal",
        },
        "commit_interval_ms": o.commit_interval.as_millis() as u64,
        "max_age_secs": o.max_age.map_or(0, |d| d.as_secs()),
        "max_bytes": o.max_bytes.unwrap_or(0),
    })
}

fn flush(f: &FlushSettings) -> Value {
    json!({
        "max_batch": f.max_batch,
        "max_delay_secs": f.max_delay.as_secs_f64(),
        "backoff_initial_ms": f.backoff_initial.as_millis() as u64,
        "backoff_max_secs": f.backoff_max.as_secs(),
        "max_in_flight": f.max_in_flight,
        "max_attempts": f.max_attempts,
    })
}

/// `[telemetry]`, its credential redacted; empty when off.
fn telemetry(t: Option<&TelemetrySettings>) -> Map<String, Value> {
    let mut telemetry = Map::new();
    let Some(t) = t else {
        return telemetry;
    };
    telemetry.insert("url".into(), t.url.as_str().into());
    telemetry.insert("interval_secs".into(), t.interval.as_secs().into());
    telemetry.insert("timeout_secs".into(), t.timeout.as_secs().into());
    telemetry.insert("max_buffered".into(), t.max_buffered.into());
    if let Some(ca) = &t.ca_file {
        telemetry.insert("ca_file".into(), json!(ca.path));
    }
    match &t.auth {
        TelemetryAuth::None => {}
        TelemetryAuth::Basic { username, .. } => {
            telemetry.insert("username".into(), username.as_str().into());
            telemetry.insert("password".into(), REDACTED.into());
        }
        TelemetryAuth::Bearer(_) => {
            telemetry.insert("bearer_token".into(), REDACTED.into());
        }
    }
    telemetry
}

/// The hash of the effective configuration (see the module doc): equal for configs that
/// mean the same, whatever their text, and for gateways that differ only in their id.
pub fn hash(c: &Config) -> String {
    let mut doc = document(c);
    if let Some(g) = doc.get_mut("gateway").and_then(Value::as_object_mut) {
        g.remove("id");
    }
    let text = canonical(&doc);
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    hex::encode(&digest.as_ref()[..8])
}

/// Compact JSON with every object's keys sorted, whatever order the map keeps.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::from(k.as_str()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(canonical).collect();
            format!("[{}]", parts.join(","))
        }
        other => other.to_string(),
    }
}

/// The document as TOML text, for a person (the support bundle).
pub fn toml_text(c: &Config) -> String {
    let doc = document(c);
    match toml::Value::try_from(&doc) {
        Ok(v) => toml::to_string_pretty(&v).unwrap_or_else(|_| doc.to_string()),
        Err(_) => serde_json::to_string_pretty(&doc).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::{parse, SERVICE};
    use crate::config::DEFAULTS;

    #[test]
    fn equal_meaning_gives_an_equal_hash_whatever_the_text() {
        let a = format!(
            "{SERVICE}\n[flush]\nmax_batch = 100\nmax_delay_secs = 5\n[[products]]\nid = \"tape\"\nmanufacturer_id = 0x0EF7\n"
        );
        // Other order, other formatting, a default written out, a hex id as a number,
        // the batch from the environment.
        let b = format!(
            "[[products]]\nmanufacturer_id = 3831\nid = \"tape\"\npacket = \"manufacturer_data\"\n\n[flush]\nmax_delay_secs = 5.0\n{SERVICE}"
        );
        let ca = parse(&a, &[]).unwrap();
        let cb = parse(&b, &[("TAPEGATE_FLUSH__MAX_BATCH", "100")]).unwrap();
        assert_eq!(hash(&ca), hash(&cb));
        assert_eq!(hash(&ca).len(), 16);
        // Another gateway id, the same hash; another meaning, another hash.
        let other_id = parse(&a, &[("TAPEGATE_GATEWAY__ID", "dock-99")]).unwrap();
        assert_eq!(hash(&ca), hash(&other_id));
        let changed = parse(&a, &[("TAPEGATE_FLUSH__MAX_BATCH", "101")]).unwrap();
        assert_ne!(hash(&ca), hash(&changed));
        // A different password is not in the document, so not in the hash either.
        let pw = parse(&a.replace("s3cr3t-value", "other-pw"), &[]).unwrap();
        assert_eq!(hash(&ca), hash(&pw));
    }

    #[test]
    fn the_document_holds_no_secret() {
        let text = format!(
            "{SERVICE}\n[telemetry]\nurl = \"https://r.example/push\"\nusername = \"u\"\npassword = \"tele-pw-99\"\n"
        );
        let c = parse(&text, &[]).unwrap();
        let shown = format!("{} {}", document(&c), toml_text(&c));
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        assert!(!shown.contains("tele-pw-99"), "{shown}");
        assert!(shown.contains(REDACTED), "{shown}");
    }

    /// Every key of the table of defaults is in the document, so that a new key cannot
    /// be left out of the bundle and the hash.
    #[test]
    fn the_document_names_every_key_of_the_defaults() {
        let text = format!("{SERVICE}\n[telemetry]\nurl = \"https://r.example/push\"\n");
        let doc = document(&parse(&text, &[]).unwrap());
        let defaults = serde_json::to_value(&DEFAULTS).unwrap();
        let mut missing = Vec::new();
        for (section, keys) in defaults.as_object().unwrap() {
            let shown = match section.as_str() {
                "products" => doc["products"][0].clone(),
                "environment" => doc["service"]["environments"]["ppe"].clone(),
                s => doc[s].clone(),
            };
            for key in keys.as_object().unwrap().keys() {
                let absent_when_none = keys[key].is_null();
                if shown.get(key).is_none() && !absent_when_none {
                    missing.push(format!("{section}.{key}"));
                }
            }
        }
        assert!(missing.is_empty(), "not in the document: {missing:?}");
        assert!(doc["http"].as_object().unwrap().is_empty());
        assert_eq!(doc["telemetry"]["url"], "https://r.example/push");
    }
}
