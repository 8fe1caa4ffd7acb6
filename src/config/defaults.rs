/*!
The one table of defaults: the value a key takes when neither the file nor the
environment sets it. Validation reads its defaults from here and nowhere else; the raw
structs say what each key means, not its default; and a test holds
`config.example.toml` to this table (every key below appears there, commented out or
not, with exactly this value). It touches nothing: a table of constants.

The table is shaped like the file: `DEFAULTS.flush.max_batch` is `flush.max_batch`, in
the unit its key names. Keys without a default are not in it: the onboarding values of
`[service.environments.<name>]`, `gateway.id` (the host name: it comes from the
machine, not from a table), and keys whose absence means "none" (`scanner.adapter`,
`scanner.replay_path`, `scanner.sim_duration_secs`, the criteria of a product).
*/

/// Every default of the config file.
pub const DEFAULTS: Defaults = Defaults {
    gateway: Gateway {
        state_dir: "/var/lib/tapegate",
        shutdown_grace_secs: 10,
        clock: "auto",
        clock_max_hold_secs: 3600,
    },
    service: Service {
        environment: "ppe",
        mac_format: "plain",
        request_timeout_secs: 30,
        rate_window_secs: 60,
    },
    environment: Environment {
        default_tape_type: "Green",
    },
    products: Product {
        packet: "manufacturer_data",
        packet_encoding: "hex",
    },
    scanner: Scanner {
        source: "ble",
        silence_secs: 60.0,
        give_up_secs: 300.0,
        max_devices: 4096,
        adverts: "auto",
        scan: "active",
        sim_tapes: 200,
        sim_interval_ms: 1000,
        sim_change_every: 5,
        sim_unregistered: 0,
        sim_others_ratio: 0.2,
        sim_seed: 1,
        sim_realtime: true,
        sim_start: 1_763_719_200.0,
    },
    dedup: Dedup {
        window_secs: 60.0,
        min_interval_secs: 5.0,
        max_tracked: 100_000,
    },
    outbox: Outbox {
        max_pending: 1_000_000,
        durability: "full",
        commit_interval_ms: 200,
        // No age bound: an old capture is still worth sending.
        max_age_secs: 0,
        // 256 MiB: a million pending captures fit (~100 MB), and a small SD card is
        // never filled by the outbox.
        max_bytes: 268_435_456,
    },
    flush: Flush {
        // The most the bulk decode endpoint takes (spec section 8).
        max_batch: 250,
        max_delay_secs: 5.0,
        backoff_initial_ms: 500,
        backoff_max_secs: 300,
        // The window adapts below it (one more per fast, clean answer, half on trouble),
        // so this is reached only while answers are slow and clean: a long round trip
        // (0.2 s: 32 x 250 captures, 40,000/s at most; 8 was 10,000/s). The service sets
        // no per-identity limit on decode (spec 8). Memory: a batch in flight holds its
        // rows and its request, about 100 KB (250 captures); 32 of them about 3 MB.
        max_in_flight: 32,
        max_attempts: 5,
    },
    readings: Readings {
        retention_hours: 168,
    },
    log: Log { level: "info" },
    // No listener unless one is asked for: a gateway opens no port by surprise.
    http: Http { listen: None },
    // Nothing is pushed unless a receiver is named.
    telemetry: Telemetry {
        url: None,
        interval_secs: 60,
        timeout_secs: 10,
        // With a push a minute, six hours of a receiver's outage (a few KiB each).
        max_buffered: 360,
    },
};

// The shapes of the table: one struct per section, a field per key with the type of
// its raw field. `Serialize` lets the tests walk the table like a parsed file.

/// The table, one field per section.
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Defaults {
    pub gateway: Gateway,
    pub service: Service,
    /// Of each `[service.environments.<name>]` table.
    pub environment: Environment,
    /// Of each `[[products]]` entry.
    pub products: Product,
    pub scanner: Scanner,
    pub dedup: Dedup,
    pub outbox: Outbox,
    pub flush: Flush,
    pub readings: Readings,
    pub log: Log,
    pub http: Http,
    pub telemetry: Telemetry,
}

/// `[gateway]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Gateway {
    pub state_dir: &'static str,
    pub shutdown_grace_secs: u64,
    pub clock: &'static str,
    pub clock_max_hold_secs: u64,
}

/// `[service]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Service {
    pub environment: &'static str,
    pub mac_format: &'static str,
    pub request_timeout_secs: u64,
    /// The service's shared rate window (spec 8).
    pub rate_window_secs: u64,
}

/// Of each `[service.environments.<name>]`.
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Environment {
    pub default_tape_type: &'static str,
}

/// `[[products]]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Product {
    pub packet: &'static str,
    pub packet_encoding: &'static str,
}

/// `[scanner]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Scanner {
    pub source: &'static str,
    pub silence_secs: f64,
    pub give_up_secs: f64,
    pub max_devices: u64,
    pub adverts: &'static str,
    pub scan: &'static str,
    pub sim_tapes: u64,
    pub sim_interval_ms: u64,
    pub sim_change_every: u64,
    pub sim_unregistered: u64,
    pub sim_others_ratio: f64,
    pub sim_seed: u64,
    pub sim_realtime: bool,
    pub sim_start: f64,
}

/// `[dedup]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Dedup {
    pub window_secs: f64,
    pub min_interval_secs: f64,
    pub max_tracked: u64,
}

/// `[outbox]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Outbox {
    pub max_pending: u64,
    pub durability: &'static str,
    pub commit_interval_ms: u64,
    pub max_age_secs: u64,
    pub max_bytes: u64,
}

/// `[flush]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Flush {
    pub max_batch: u64,
    pub max_delay_secs: f64,
    pub backoff_initial_ms: u64,
    pub backoff_max_secs: u64,
    pub max_in_flight: u64,
    pub max_attempts: u64,
}

/// `[readings]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Readings {
    pub retention_hours: u64,
}

/// `[log]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Log {
    pub level: &'static str,
}

/// `[http]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Http {
    /// `None`: no listener (the key is absent from the file).
    pub listen: Option<&'static str>,
}

/// `[telemetry]`
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Telemetry {
    /// `None`: nothing is pushed (the key is absent from the file).
    pub url: Option<&'static str>,
    pub interval_secs: u64,
    pub timeout_secs: u64,
    pub max_buffered: u64,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::config::raw::RawConfig;
    use crate::config::test_support::{parse, SERVICE};
    use crate::config::Durability;
    use crate::config::{MacFormat, SourceKind};

    const EXAMPLE: &str = include_str!("../../config.example.toml");

    fn table() -> toml::Table {
        match toml::Value::try_from(&DEFAULTS) {
            Ok(toml::Value::Table(t)) => t,
            other => panic!("the table of defaults is not a TOML table: {other:?}"),
        }
    }

    /// The example with its commented-out keys and tables (`# max_devices = 4096  # ...`)
    /// uncommented: every key it shows a reader.
    fn example_with_every_key() -> toml::Table {
        let lines: Vec<&str> = EXAMPLE
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if rest.parse::<toml::Table>().is_ok() => rest,
                _ => line,
            })
            .collect();
        lines.join("\n").parse().unwrap()
    }

    /// Equal as TOML values, a whole number equal to the same float (`60` and `60.0`).
    fn same(a: &toml::Value, b: &toml::Value) -> bool {
        let number = |v: &toml::Value| v.as_float().or(v.as_integer().map(|i| i as f64));
        match (number(a), number(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        }
    }

    #[test]
    fn an_empty_file_gives_the_documented_defaults() {
        let c = parse("", &[]).unwrap();
        assert_eq!(c.gateway.state_dir, PathBuf::from("/var/lib/tapegate"));
        assert_eq!(c.gateway.shutdown_grace, Duration::from_secs(10));
        assert!(c.service.is_none());
        assert_eq!(c.products.0.len(), 1);
        assert_eq!(c.products.0[0].manufacturer_id, Some(0x0EF7));
        assert_eq!(c.scanner.source, SourceKind::Ble);
        assert_eq!(
            (c.dedup.window_ms, c.dedup.min_interval_ms),
            (60_000, 5_000)
        );
        assert_eq!(c.outbox.max_pending, 1_000_000);
        assert_eq!(c.outbox.durability, Durability::Full);
        assert_eq!(c.outbox.commit_interval, Duration::from_millis(200));
        assert_eq!(c.flush.max_batch, 250);
        assert_eq!(c.flush.max_delay, Duration::from_secs(5));
    }

    /// As installed: the password is the file `password` beside the config (the unit's
    /// credential of that name under systemd), and is not needed to validate.
    #[test]
    fn the_shipped_example_is_valid_and_finds_the_password_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let local = crate::config::load_with(&path, [], crate::config::Password::Skip);
        assert!(local.unwrap().service.is_none());
        let e = crate::config::load(&path, []).unwrap_err().to_string();
        assert!(
            e.contains(&dir.path().join("password").display().to_string()),
            "{e}"
        );
        std::fs::write(dir.path().join("password"), "pw\n").unwrap();
        let c = crate::config::load(&path, []).unwrap();
        let s = c.service.unwrap();
        assert_eq!(s.endpoint.password.expose(), "pw");
        assert_eq!(s.environment, "ppe");
        assert_eq!(s.mac_format, MacFormat::Plain);
        assert_eq!(&*c.products.0[0].id, "tape");
    }

    #[test]
    fn the_example_shows_every_default_of_the_table_with_its_value() {
        let example = example_with_every_key();
        let (mut missing, mut differ) = (Vec::new(), Vec::new());
        for (section, keys) in table() {
            let shown = match example.get(&section) {
                // [[products]]: the example's product shows the defaults of an entry.
                Some(toml::Value::Array(entries)) => entries.first(),
                // An environment's defaults are shown in the example's first one.
                None if section == "environment" => example["service"]["environments"]
                    .as_table()
                    .and_then(|t| t.values().next()),
                other => other,
            };
            for (key, default) in keys.as_table().into_iter().flatten() {
                match shown.and_then(|s| s.get(key)) {
                    None => missing.push(format!("{section}.{key}")),
                    Some(v) if !same(v, default) => {
                        differ.push(format!("{section}.{key} = {v}, the table says {default}"))
                    }
                    Some(_) => {}
                }
            }
        }
        assert!(
            missing.is_empty() && differ.is_empty(),
            "config.example.toml lacks {missing:?} and differs from DEFAULTS in {differ:#?}"
        );
    }

    #[test]
    fn the_example_names_no_key_the_raw_structs_do_not_know() {
        let example = example_with_every_key();
        // The uncommenting found the commented-out keys, or this test proves nothing.
        assert!(example["scanner"].get("sim_seed").is_some());
        let mut problems = Vec::new();
        RawConfig::from_table(example, &mut problems);
        assert!(problems.is_empty(), "{problems:#?}");
    }

    /// Every default is one validation accepts, and validation applies each one as given.
    #[test]
    fn the_table_written_as_a_file_gives_what_an_empty_file_gives() {
        let mut file = table();
        // [[products]] is a list; the default list is the tape product.
        let Some(toml::Value::Table(mut tape)) = file.remove("products") else {
            panic!("no products in the table");
        };
        tape.insert("id".into(), "tape".into());
        tape.insert("manufacturer_id".into(), 0x0EF7.into());
        file.insert("products".into(), vec![toml::Value::Table(tape)].into());
        // [service] needs its environment, which has no defaults but these.
        let service: toml::Table = SERVICE.parse().unwrap();
        let mut environments = service["service"]["environments"].clone();
        let Some(toml::Value::Table(env_defaults)) = file.remove("environment") else {
            panic!("no environment in the table");
        };
        if let Some(toml::Value::Table(ppe)) = environments.get_mut("ppe") {
            ppe.extend(env_defaults);
        }
        if let Some(toml::Value::Table(s)) = file.get_mut("service") {
            s.insert("environments".into(), environments);
        }
        // A deprecated key written out is warned of: that is its one difference.
        file.remove("readings");
        let written = parse(&file.to_string(), &[]).unwrap();
        let only_service = parse(SERVICE, &[]).unwrap();
        assert_eq!(format!("{written:?}"), format!("{only_service:?}"));
    }
}
