/*!
Validation: the raw layer to the typed [`Config`], every check run and every failure
recorded as a [`Problem`] naming the key, the value (never a secret's) and what was
expected. Defaults come from [`DEFAULTS`]. Pure: what it needs from the machine (the
host name, the credentials directory, the password file's contents) is passed in, read
beforehand by `load`.
*/

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

use super::host::{Host, PasswordFile};
use super::raw::{RawConfig, RawProduct, RawService};
use super::{
    Config, EnvironmentSettings, FlushSettings, GatewaySettings, LogSettings, MacFormat,
    OutboxSettings, Problem, ReadingsSettings, ScannerSettings, ServiceSettings, SourceKind,
    DEFAULTS,
};
use crate::dedup::DedupSettings;
use crate::outbox::Durability;
use crate::products::{expand_uuid, PacketEncoding, PacketSource, Product, Products};
use crate::secret::Secret;
use crate::source::sim::SimSettings;

/// Collects problems while reading raw values with their defaults.
struct Check<'a> {
    problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    fn bad(&mut self, key: impl Into<String>, value: impl fmt::Display, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: Some(value.to_string()),
            message: format!("expected {expected}"),
        });
    }

    fn missing(&mut self, key: impl Into<String>, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: format!("missing: expected {expected}"),
        });
    }

    fn other(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: message.into(),
        });
    }

    /// An integer in `lo..=hi`, or `default` when absent.
    fn int(&mut self, key: &str, v: Option<u64>, default: u64, lo: u64, hi: u64) -> u64 {
        match v {
            None => default,
            Some(v) if (lo..=hi).contains(&v) => v,
            Some(v) => {
                self.bad(key, v, &format!("a whole number from {lo} to {hi}"));
                default
            }
        }
    }

    /// Seconds (fractions allowed) in `lo..=hi` as a duration.
    fn secs(&mut self, key: &str, v: Option<f64>, default: f64, lo: f64, hi: f64) -> Duration {
        match v {
            None => Duration::from_secs_f64(default),
            Some(v) if v.is_finite() && v >= lo && v <= hi => Duration::from_secs_f64(v),
            Some(v) => {
                self.bad(key, v, &format!("seconds from {lo} to {hi}"));
                Duration::from_secs_f64(default)
            }
        }
    }

    /// One of `choices` (by name), or the one named `default` when absent or refused.
    /// A default that names no choice is reported like a bad value, so that a slip in
    /// [`DEFAULTS`] shows on the first run instead of silently meaning something else.
    fn choice<T: Copy>(
        &mut self,
        key: &str,
        v: Option<&str>,
        default: &str,
        choices: &[(&str, T)],
    ) -> T {
        let find = |name: &str| choices.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        let name = v.unwrap_or(default);
        if let Some(t) = find(name) {
            return t;
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        self.bad(
            key,
            format!("{name:?}"),
            &format!("one of {}", names.join(" | ")),
        );
        find(default).unwrap_or(choices[0].1)
    }

    /// A non-empty string without control characters.
    fn text(&mut self, key: &str, v: Option<String>, what: &str) -> Option<String> {
        match v {
            None => {
                self.missing(key, what);
                None
            }
            Some(s) if s.trim().is_empty() || s.chars().any(char::is_control) => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    &format!("{what}, non-empty, without control characters"),
                );
                None
            }
            Some(s) => Some(s),
        }
    }

    fn url(&mut self, key: &str, v: Option<String>) -> Option<Url> {
        let s = self.text(key, v, "an http(s) URL")?;
        match Url::parse(&s) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
            _ => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    "an http(s) URL such as https://api.example.com/",
                );
                None
            }
        }
    }
}

/// Turns `raw` into a [`Config`], adding a problem for each thing wrong; `None` when
/// something is too wrong to build one (the problems say what). `password_file` is the
/// file [`RawConfig::password_file`] names, as the caller read it.
pub fn validate(
    raw: RawConfig,
    host: &Host,
    password_file: Option<&PasswordFile>,
    problems: &mut Vec<Problem>,
) -> Option<Config> {
    let mut c = Check { problems };

    let gateway = GatewaySettings {
        id: match raw.gateway.id {
            None => host.hostname.clone(),
            Some(id) => {
                let ok = !id.is_empty()
                    && id.len() <= 64
                    && id
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch));
                if !ok {
                    c.bad(
                        "gateway.id",
                        format!("{id:?}"),
                        "1 to 64 letters, digits, '-', '_' or '.'",
                    );
                }
                id
            }
        },
        state_dir: match raw.gateway.state_dir {
            None => PathBuf::from(DEFAULTS.gateway.state_dir),
            Some(p) if p.as_os_str().is_empty() => {
                c.bad("gateway.state_dir", "\"\"", "a directory path");
                p
            }
            Some(p) => p,
        },
        shutdown_grace: Duration::from_secs(c.int(
            "gateway.shutdown_grace_secs",
            raw.gateway.shutdown_grace_secs,
            DEFAULTS.gateway.shutdown_grace_secs,
            1,
            600,
        )),
    };

    let service = raw
        .service
        .map(|s| validate_service(s, host, password_file, &mut c));

    let products = match raw.products {
        None => Products(vec![Product::tape()]),
        Some(list) if list.is_empty() => {
            c.other("products", "expected at least one [[products]] entry");
            Products::default()
        }
        Some(list) => Products(
            list.into_iter()
                .enumerate()
                .filter_map(|(i, p)| validate_product(p, &format!("products[{i}]"), &mut c))
                .collect(),
        ),
    };

    let sc = raw.scanner;
    let source = c.choice(
        "scanner.source",
        sc.source.as_deref(),
        DEFAULTS.scanner.source,
        &[
            ("ble", SourceKind::Ble),
            ("replay", SourceKind::Replay),
            ("sim", SourceKind::Sim),
        ],
    );
    if source == SourceKind::Replay && sc.replay_path.is_none() {
        c.missing(
            "scanner.replay_path",
            "a JSON Lines file (or \"-\" for stdin) when source = \"replay\"",
        );
    }
    let tapes = c.int(
        "scanner.sim_tapes",
        sc.sim_tapes,
        DEFAULTS.scanner.sim_tapes,
        1,
        1_000_000,
    ) as usize;
    let sim = SimSettings {
        tapes,
        interval_ms: c.int(
            "scanner.sim_interval_ms",
            sc.sim_interval_ms,
            DEFAULTS.scanner.sim_interval_ms,
            1,
            3_600_000,
        ),
        change_every: c.int(
            "scanner.sim_change_every",
            sc.sim_change_every,
            DEFAULTS.scanner.sim_change_every,
            1,
            1_000_000,
        ) as u32,
        unregistered: c.int(
            "scanner.sim_unregistered",
            sc.sim_unregistered,
            DEFAULTS.scanner.sim_unregistered,
            0,
            tapes as u64,
        ) as usize,
        others_ratio: match sc.sim_others_ratio {
            None => DEFAULTS.scanner.sim_others_ratio,
            Some(r) if r.is_finite() && (0.0..=100.0).contains(&r) => r,
            Some(r) => {
                c.bad("scanner.sim_others_ratio", r, "a number from 0 to 100");
                DEFAULTS.scanner.sim_others_ratio
            }
        },
        seed: sc.sim_seed.unwrap_or(DEFAULTS.scanner.sim_seed),
        duration_ms: sc.sim_duration_secs.map(|_| {
            c.secs(
                "scanner.sim_duration_secs",
                sc.sim_duration_secs,
                0.0,
                0.001,
                1e9,
            )
            .as_millis() as u64
        }),
        realtime: sc.sim_realtime.unwrap_or(DEFAULTS.scanner.sim_realtime),
        start_ms: match sc.sim_start.unwrap_or(DEFAULTS.scanner.sim_start) {
            s if s.is_finite() && s >= 0.0 => (s * 1000.0).round() as i64,
            s => {
                c.bad("scanner.sim_start", s, "epoch seconds");
                0
            }
        },
    };
    let silence = c.secs(
        "scanner.silence_secs",
        sc.silence_secs,
        DEFAULTS.scanner.silence_secs,
        0.0,
        86_400.0,
    );
    let scanner = ScannerSettings {
        source,
        adapter: sc.adapter,
        silence: (!silence.is_zero()).then_some(silence),
        give_up: c.secs(
            "scanner.give_up_secs",
            sc.give_up_secs,
            DEFAULTS.scanner.give_up_secs,
            1.0,
            86_400.0,
        ),
        max_devices: c.int(
            "scanner.max_devices",
            sc.max_devices,
            DEFAULTS.scanner.max_devices,
            16,
            1_000_000,
        ) as usize,
        replay_path: sc.replay_path,
        sim,
    };

    let d = raw.dedup;
    let dedup = DedupSettings {
        window_ms: c
            .secs(
                "dedup.window_secs",
                d.window_secs,
                DEFAULTS.dedup.window_secs,
                0.0,
                86_400.0,
            )
            .as_millis() as i64,
        min_interval_ms: c
            .secs(
                "dedup.min_interval_secs",
                d.min_interval_secs,
                DEFAULTS.dedup.min_interval_secs,
                0.0,
                86_400.0,
            )
            .as_millis() as i64,
        max_tracked: c.int(
            "dedup.max_tracked",
            d.max_tracked,
            DEFAULTS.dedup.max_tracked,
            1,
            10_000_000,
        ) as usize,
    };

    let o = raw.outbox;
    let outbox = OutboxSettings {
        max_pending: c.int(
            "outbox.max_pending",
            o.max_pending,
            DEFAULTS.outbox.max_pending,
            1,
            1_000_000_000,
        ),
        durability: c.choice(
            "outbox.durability",
            o.durability.as_deref(),
            DEFAULTS.outbox.durability,
            &[("full", Durability::Full), ("normal", Durability::Normal)],
        ),
        commit_interval: Duration::from_millis(c.int(
            "outbox.commit_interval_ms",
            o.commit_interval_ms,
            DEFAULTS.outbox.commit_interval_ms,
            1,
            10_000,
        )),
    };

    let f = raw.flush;
    let backoff_initial = Duration::from_millis(c.int(
        "flush.backoff_initial_ms",
        f.backoff_initial_ms,
        DEFAULTS.flush.backoff_initial_ms,
        1,
        3_600_000,
    ));
    let backoff_max = Duration::from_secs(c.int(
        "flush.backoff_max_secs",
        f.backoff_max_secs,
        DEFAULTS.flush.backoff_max_secs,
        1,
        86_400,
    ));
    if backoff_max < backoff_initial {
        c.bad(
            "flush.backoff_max_secs",
            backoff_max.as_secs(),
            "at least flush.backoff_initial_ms",
        );
    }
    let flush = FlushSettings {
        max_batch: c.int(
            "flush.max_batch",
            f.max_batch,
            DEFAULTS.flush.max_batch,
            1,
            250,
        ) as usize,
        max_delay: c.secs(
            "flush.max_delay_secs",
            f.max_delay_secs,
            DEFAULTS.flush.max_delay_secs,
            0.0,
            3600.0,
        ),
        backoff_initial,
        backoff_max,
        max_in_flight: c.int(
            "flush.max_in_flight",
            f.max_in_flight,
            DEFAULTS.flush.max_in_flight,
            1,
            64,
        ) as usize,
        max_attempts: c.int(
            "flush.max_attempts",
            f.max_attempts,
            DEFAULTS.flush.max_attempts,
            1,
            100,
        ) as u32,
    };

    let readings = ReadingsSettings {
        retention: Duration::from_secs(
            3600 * c.int(
                "readings.retention_hours",
                raw.readings.retention_hours,
                DEFAULTS.readings.retention_hours,
                1,
                24 * 3650,
            ),
        ),
    };

    let level = raw.log.level.unwrap_or_else(|| DEFAULTS.log.level.into());
    if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
        c.bad(
            "log.level",
            format!("{level:?}"),
            "a level (error, warn, info, debug, trace) or a tracing filter",
        );
    }

    let service = match service {
        Some(Some(s)) => Some(s),
        Some(None) => return None,
        None => None,
    };
    Some(Config {
        gateway,
        service,
        products,
        scanner,
        dedup,
        outbox,
        flush,
        readings,
        log: LogSettings { level },
    })
}

fn validate_service(
    s: RawService,
    host: &Host,
    password_file: Option<&PasswordFile>,
    c: &mut Check,
) -> Option<ServiceSettings> {
    let environment = s.environment().to_string();
    let mac_format = c.choice(
        "service.mac_format",
        s.mac_format.as_deref(),
        DEFAULTS.service.mac_format,
        &[("plain", MacFormat::Plain), ("colon", MacFormat::Colon)],
    );
    let request_timeout = Duration::from_secs(c.int(
        "service.request_timeout_secs",
        s.request_timeout_secs,
        DEFAULTS.service.request_timeout_secs,
        1,
        600,
    ));
    let mut envs = s.environments.unwrap_or_default();
    let Some(e) = envs.remove(&environment) else {
        let known: Vec<&String> = envs.keys().collect();
        c.bad(
            "service.environment",
            format!("{environment:?}"),
            &if known.is_empty() {
                "the name of a [service.environments.<name>] table (there is none)".to_string()
            } else {
                format!("the name of a [service.environments.<name>] table: {known:?}")
            },
        );
        return None;
    };
    let k = |f: &str| format!("service.environments.{environment}.{f}");
    let base_url = c.url(&k("base_url"), e.base_url);
    let auth_url = c.url(&k("auth_url"), e.auth_url);
    let client_id = c.text(
        &k("client_id"),
        e.client_id,
        "the client id from onboarding",
    );
    let audience = c.text(&k("audience"), e.audience, "the audience from onboarding");
    let username = c.text(&k("username"), e.username, "the API user name");
    let customer_id = c.text(
        &k("customer_id"),
        e.customer_id,
        "the customer id from onboarding",
    );
    let authorized_groups = c.text(
        &k("authorized_groups"),
        e.authorized_groups,
        "the authorized groups from onboarding",
    );
    // The password's value never appears in a problem.
    let password = match (e.password, e.password_file) {
        (Some(_), Some(_)) => {
            c.other(
                k("password"),
                "set either password or password_file, not both",
            );
            None
        }
        (None, None) => {
            c.missing(k("password_file"), "password_file (or password)");
            None
        }
        (Some(p), None) if p.is_empty() => {
            c.other(k("password"), "is empty");
            None
        }
        (Some(p), None) => Some(Secret::new(p)),
        (None, Some(file)) => match password_file {
            Some(read) => password_from_file(read, &k("password_file"), c),
            // Only a caller that skipped reading the file gets here.
            None => {
                c.bad(
                    k("password_file"),
                    host.credential_path(&file).display(),
                    "a readable file holding the password (it was not read)",
                );
                None
            }
        },
    };
    Some(ServiceSettings {
        environment: environment.clone(),
        mac_format,
        request_timeout,
        endpoint: EnvironmentSettings {
            base_url: base_url?,
            auth_url: auth_url?,
            client_id: client_id?,
            audience: audience?,
            username: username?,
            password: password?,
            customer_id: customer_id?,
            authorized_groups: authorized_groups?,
        },
    })
}

/// The password a password file holds; one trailing newline is dropped.
fn password_from_file(read: &PasswordFile, key: &str, c: &mut Check) -> Option<Secret> {
    let path = &read.path;
    match &read.contents {
        Ok(text) => {
            let text = text.expose();
            let p = text.strip_suffix('\n').unwrap_or(text);
            let p = p.strip_suffix('\r').unwrap_or(p);
            if p.is_empty() {
                c.bad(
                    key,
                    path.display(),
                    "a file holding the password (it is empty)",
                );
                None
            } else {
                Some(Secret::new(p))
            }
        }
        Err(e) => {
            c.bad(
                key,
                path.display(),
                &format!("a readable file holding the password ({e})"),
            );
            None
        }
    }
}

fn validate_product(p: RawProduct, key: &str, c: &mut Check) -> Option<Product> {
    let k = |f: &str| format!("{key}.{f}");
    let id = c.text(&k("id"), p.id, "the product id sent as product_id");
    let manufacturer_id = p.manufacturer_id.as_ref().and_then(|m| match m.value() {
        Some(v) if (0..=0xFFFF).contains(&v) => Some(v as u16),
        _ => {
            c.bad(
                k("manufacturer_id"),
                m.shown(),
                "a company identifier from 0 to 0xFFFF",
            );
            None
        }
    });
    let service_uuid = p.service_uuid.as_ref().and_then(|u| {
        let e = expand_uuid(u);
        if e.is_none() {
            c.bad(
                k("service_uuid"),
                format!("{u:?}"),
                "a 16-, 32- or 128-bit UUID (\"feaa\" or \"0000feaa-0000-1000-8000-00805f9b34fb\")",
            );
        }
        e
    });
    let mac_prefix = p.mac_prefix.as_ref().and_then(|m| {
        let digits: String = m.chars().filter(|ch| *ch != ':' && *ch != '-').collect();
        match crate::record::decode_hex(&digits) {
            Some(b) if !b.is_empty() && b.len() <= 6 => Some(b),
            _ => {
                c.bad(
                    k("mac_prefix"),
                    format!("{m:?}"),
                    "1 to 6 leading octets of a MAC, such as \"C0:FF:EE\"",
                );
                None
            }
        }
    });
    let min_rssi = p.min_rssi.and_then(|r| {
        if (-127..=20).contains(&r) {
            Some(r as i16)
        } else {
            c.bad(k("min_rssi"), r, "dBm from -127 to 20");
            None
        }
    });
    let packet = c.choice(
        &k("packet"),
        p.packet.as_deref(),
        DEFAULTS.products.packet,
        &[
            ("manufacturer_data", PacketSource::ManufacturerData),
            ("manufacturer_payload", PacketSource::ManufacturerPayload),
            ("service_data", PacketSource::ServiceData),
        ],
    );
    let packet_encoding = c.choice(
        &k("packet_encoding"),
        p.packet_encoding.as_deref(),
        DEFAULTS.products.packet_encoding,
        &[
            ("hex", PacketEncoding::Hex),
            ("hex_lower", PacketEncoding::HexLower),
            ("base64", PacketEncoding::Base64),
        ],
    );
    if p.manufacturer_id.is_none()
        && p.service_uuid.is_none()
        && p.name_prefix.is_none()
        && p.mac_prefix.is_none()
        && p.min_rssi.is_none()
    {
        c.other(
            key,
            "names no criterion (manufacturer_id, service_uuid, name_prefix, mac_prefix, min_rssi): it would match every advertisement",
        );
    }
    Some(Product {
        id: id?,
        manufacturer_id,
        service_uuid,
        name_prefix: p.name_prefix,
        mac_prefix,
        min_rssi,
        packet,
        packet_encoding,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::raw::RawConfig;
    use crate::config::test_support::{parse, parse_on, problems, test_host, SERVICE};

    #[test]
    fn a_password_never_appears_in_a_config_error() {
        let text = SERVICE.replace("https://api.example.com/", "not a url");
        let err = parse(&format!("{text}\n[flush]\nmax_batch = 0\n"), &[]).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("base_url"), "{shown}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        // A valid config's Debug output hides it too.
        let c = parse(SERVICE, &[]).unwrap();
        assert!(!format!("{c:?}").contains("s3cr3t-value"));
    }

    #[test]
    fn the_selected_environment_must_exist() {
        let text = SERVICE.replace("environment = \"ppe\"", "environment = \"production\"");
        let p = problems(&text, &[]);
        assert_eq!(p[0].key, "service.environment");
        assert!(p[0].message.contains("ppe"), "{:?}", p[0]);
    }

    #[test]
    fn products_need_a_criterion_and_valid_values() {
        let p = problems("[[products]]\nid = \"x\"\n", &[]);
        assert!(p[0].message.contains("names no criterion"), "{p:?}");
        let c = parse(
            "[[products]]\nid = \"x\"\nservice_uuid = \"FEAA\"\nmac_prefix = \"c0:ff\"\nmin_rssi = -80\npacket = \"service_data\"\npacket_encoding = \"base64\"\n",
            &[],
        )
        .unwrap();
        let p = &c.products.0[0];
        assert_eq!(
            p.service_uuid.as_deref(),
            Some("0000feaa-0000-1000-8000-00805f9b34fb")
        );
        assert_eq!(p.mac_prefix, Some(vec![0xC0, 0xFF]));
        assert_eq!(p.packet, PacketSource::ServiceData);
        assert_eq!(p.packet_encoding, PacketEncoding::Base64);
    }

    #[test]
    fn replay_needs_a_path() {
        let p = problems("[scanner]\nsource = \"replay\"\n", &[]);
        assert_eq!(p[0].key, "scanner.replay_path");
    }

    #[test]
    fn the_gateway_id_defaults_to_the_host_name_it_is_given() {
        let host = Host {
            hostname: "dock-42".into(),
            credentials_dir: None,
        };
        assert_eq!(parse_on("", &[], &host).unwrap().gateway.id, "dock-42");
        let named = parse_on("[gateway]\nid = \"dock-7\"\n", &[], &host).unwrap();
        assert_eq!(named.gateway.id, "dock-7");
    }

    /// Validation takes the password file as read: it opens nothing itself.
    #[test]
    fn validation_takes_the_password_file_as_it_was_read() {
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            "password_file = \"/nonexistent/pw\"",
        );
        let raw =
            |problems: &mut Vec<Problem>| RawConfig::from_table(text.parse().unwrap(), problems);
        let read = PasswordFile {
            path: PathBuf::from("/nonexistent/pw"),
            contents: Ok(Secret::new("from-memory\n")),
        };
        let mut p = Vec::new();
        let c = validate(raw(&mut p), &test_host(), Some(&read), &mut p).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.service.unwrap().endpoint.password.expose(), "from-memory");

        let empty = PasswordFile {
            path: PathBuf::from("/nonexistent/pw"),
            contents: Ok(Secret::new("\n")),
        };
        let mut p = Vec::new();
        assert!(validate(raw(&mut p), &test_host(), Some(&empty), &mut p).is_none());
        assert_eq!(
            p[0].to_string(),
            "service.environments.ppe.password_file = /nonexistent/pw: expected a file holding the password (it is empty)"
        );
    }
}
