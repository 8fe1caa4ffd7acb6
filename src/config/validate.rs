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

use super::host::{CaFileRead, Host, PasswordFile};
use super::raw::{RawConfig, RawProduct, RawService};
use super::{
    AdvertsPath, CaFile, Config, EnvironmentSettings, FlushSettings, GatewaySettings, HttpSettings,
    LogSettings, MacFormat, OperatorSettings, OutboxSettings, Password, Problem, ReadingsSettings,
    ScanMode, ScannerSettings, ServiceSettings, SourceKind, DEFAULTS,
};
use crate::clock::{ClockPolicy, ClockSettings};
use crate::dedup::DedupSettings;
use crate::outbox::Durability;
use crate::products::{expand_uuid, PacketEncoding, PacketSource, Product, Products};
use crate::secret::Secret;
use crate::source::sim::SimSettings;

/// Collects problems while reading raw values with their defaults.
pub(super) struct Check<'a> {
    pub(super) problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    pub(super) fn bad(&mut self, key: impl Into<String>, value: impl fmt::Display, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: Some(value.to_string()),
            message: format!("expected {expected}"),
        });
    }

    pub(super) fn missing(&mut self, key: impl Into<String>, expected: &str) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: format!("missing: expected {expected}"),
        });
    }

    pub(super) fn other(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            message: message.into(),
        });
    }

    /// An integer in `lo..=hi`, or `default` when absent.
    pub(super) fn int(&mut self, key: &str, v: Option<u64>, default: u64, lo: u64, hi: u64) -> u64 {
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
    pub(super) fn secs(
        &mut self,
        key: &str,
        v: Option<f64>,
        default: f64,
        lo: f64,
        hi: f64,
    ) -> Duration {
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
    pub(super) fn choice<T: Copy>(
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
    pub(super) fn text(&mut self, key: &str, v: Option<String>, what: &str) -> Option<String> {
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

    pub(super) fn url(&mut self, key: &str, v: Option<String>) -> Option<Url> {
        let s = self.text(key, v, "an http(s) URL")?;
        match Url::parse(&s) {
            // Credentials in a URL end up in logs, `check` and proxies' records; the value
            // shown has them taken out.
            Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
                let _ = u.set_username("");
                let _ = u.set_password(None);
                self.bad(
                    key,
                    format!("{:?} (its user name and password not shown)", u.as_str()),
                    "a URL without credentials in it: they go in username and password",
                );
                None
            }
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

/// The files a config points to, as the caller read them.
#[derive(Default, Clone, Copy)]
pub struct Files<'a> {
    /// The file [`RawConfig::password_file`] names.
    pub password_file: Option<&'a PasswordFile>,
    /// The file [`RawConfig::ca_file`] names.
    pub ca_file: Option<&'a CaFileRead>,
    /// `[telemetry]`'s credential file and CA file, as read.
    pub telemetry: super::telemetry::TelemetryFiles<'a>,
    /// Whether the password is wanted: with [`Password::Skip`] the `[service]` settings,
    /// validated but for the password, are left out of the result.
    pub password: Password,
}

/// Turns `raw` into a [`Config`], adding a problem for each thing wrong; `None` when
/// something is too wrong to build one (the problems say what).
pub fn validate(
    raw: RawConfig,
    host: &Host,
    files: Files<'_>,
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
        clock: ClockSettings {
            policy: c.choice(
                "gateway.clock",
                raw.gateway.clock.as_deref(),
                DEFAULTS.gateway.clock,
                &[
                    ("auto", ClockPolicy::Auto),
                    ("wait", ClockPolicy::Wait),
                    ("trust", ClockPolicy::Trust),
                ],
            ),
            max_hold: Duration::from_secs(c.int(
                "gateway.clock_max_hold_secs",
                raw.gateway.clock_max_hold_secs,
                DEFAULTS.gateway.clock_max_hold_secs,
                1,
                604_800,
            )),
        },
    };

    let service = raw.service.map(|s| validate_service(s, files, &mut c));

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
    let adverts = c.choice(
        "scanner.adverts",
        sc.adverts.as_deref(),
        DEFAULTS.scanner.adverts,
        &[
            ("auto", AdvertsPath::Auto),
            ("mgmt", AdvertsPath::Mgmt),
            ("dbus", AdvertsPath::Dbus),
        ],
    );
    let scan = c.choice(
        "scanner.scan",
        sc.scan.as_deref(),
        DEFAULTS.scanner.scan,
        &[("active", ScanMode::Active), ("passive", ScanMode::Passive)],
    );
    if scan == ScanMode::Passive {
        if adverts == AdvertsPath::Dbus {
            c.bad(
                "scanner.scan",
                "\"passive\" with scanner.adverts = \"dbus\"",
                "\"active\" (passive scanning is the kernel's advertisement monitor, read over the management socket: set scanner.adverts = \"auto\" or \"mgmt\")",
            );
        }
        if let Some(i) = products.0.iter().position(|p| p.manufacturer_id.is_none()) {
            c.bad(
                "scanner.scan",
                "\"passive\"",
                &format!("\"active\" while products[{i}] names no manufacturer_id (the kernel's monitor matches adverts by company identifier)"),
            );
        }
    }
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
        adverts,
        scan,
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
    let (max_age, max_bytes) = super::retention::bounds(o.max_age_secs, o.max_bytes, &mut c);
    let outbox = OutboxSettings {
        max_age,
        max_bytes,
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

    let http = HttpSettings {
        listen: raw
            .http
            .listen
            .or(DEFAULTS.http.listen.map(String::from))
            .and_then(|text| match text.trim().parse() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    c.bad(
                        "http.listen",
                        format!("{text:?}"),
                        "an IP address and port such as \"0.0.0.0:9464\", \"127.0.0.1:9464\" or \"[::]:9464\"",
                    );
                    None
                }
            }),
    };

    let telemetry = super::telemetry::validate(raw.telemetry, files, &mut c);

    let (service, operator) = match service {
        Some(Ok(Some((s, o)))) => (Some(s), Some(o)),
        Some(Ok(None)) | None => (None, None),
        Some(Err(Invalid)) => return None,
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
        http,
        telemetry,
        operator,
    })
}

/// A section found invalid; the problems say why.
struct Invalid;

/// The `[service]` settings and the operator's; `Ok(None)` when they are valid but left
/// out because the password was not to be read.
fn validate_service(
    s: RawService,
    files: Files<'_>,
    c: &mut Check,
) -> Result<Option<(ServiceSettings, OperatorSettings)>, Invalid> {
    let password_file = files.password_file;
    let ca_file = files
        .ca_file
        .and_then(|read| ca_file(read, "service.ca_file", c));
    let environment = s.environment().to_string();
    let rate_window = Duration::from_secs(c.int(
        "service.rate_window_secs",
        s.rate_window_secs,
        DEFAULTS.service.rate_window_secs,
        1,
        3600,
    ));
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
        return Err(Invalid);
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
    let historical_base_url = match e.historical_base_url {
        None => None,
        some => c.url(&k("historical_base_url"), some),
    };
    let operator_text = |c: &mut Check, key: &str, v: Option<String>, what: &str| match v {
        None => None,
        some => c.text(&k(key), some, what),
    };
    let history_operation_id = operator_text(
        c,
        "history_operation_id",
        e.history_operation_id,
        "the fixed UUID that ends the history path",
    );
    if let Some(id) = history_operation_id.as_deref() {
        if uuid::Uuid::parse_str(id).is_err() {
            c.bad(
                k("history_operation_id"),
                format!("{id:?}"),
                "a UUID such as \"3f2a9c4e-8b1d-4e6f-a7c2-5d9e0b1f6a38\"",
            );
        }
    }
    let default_app_id = operator_text(
        c,
        "default_app_id",
        e.default_app_id,
        "an application id from the operator",
    );
    let default_tape_type = operator_text(
        c,
        "default_tape_type",
        e.default_tape_type,
        "a tape type such as Green or Black",
    )
    .unwrap_or_else(|| DEFAULTS.environment.default_tape_type.to_string());
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
        (None, Some(_)) if files.password == Password::Skip => None,
        (None, Some(file)) => match password_file {
            Some(read) => password_from_file(read, &k("password_file"), c),
            // Only a caller that skipped reading the file gets here.
            None => {
                c.bad(
                    k("password_file"),
                    file.display(),
                    "a readable file holding the password (it was not read)",
                );
                None
            }
        },
    };
    let (
        Some(base_url),
        Some(auth_url),
        Some(client_id),
        Some(audience),
        Some(username),
        Some(customer_id),
        Some(authorized_groups),
    ) = (
        base_url,
        auth_url,
        client_id,
        audience,
        username,
        customer_id,
        authorized_groups,
    )
    else {
        return Err(Invalid);
    };
    if files.password == Password::Skip {
        return Ok(None);
    }
    let password = password.ok_or(Invalid)?;
    let service = ServiceSettings {
        environment: environment.clone(),
        mac_format,
        request_timeout,
        ca_file,
        endpoint: EnvironmentSettings {
            base_url,
            auth_url,
            client_id,
            audience,
            username,
            password,
            customer_id,
            authorized_groups,
        },
    };
    let operator = OperatorSettings {
        historical_base_url,
        history_operation_id,
        default_app_id,
        default_tape_type,
        rate_window,
    };
    Ok(Some((service, operator)))
}

/// The CA certificates of a `ca_file` (`key`): a readable PEM file holding at least one.
pub(super) fn ca_file(read: &CaFileRead, key: &str, c: &mut Check) -> Option<CaFile> {
    let path = read.path.display();
    let expected = "a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)";
    match &read.contents {
        Ok(pem) => match reqwest::Certificate::from_pem_bundle(pem) {
            Ok(certs) if !certs.is_empty() => Some(CaFile {
                path: read.path.clone(),
                pem: pem.clone(),
            }),
            _ => {
                c.bad(key, path, &format!("{expected}; it holds none"));
                None
            }
        },
        Err(e) => {
            c.bad(key, path, &format!("{expected} that can be read ({e})"));
            None
        }
    }
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
    fn a_url_with_credentials_is_refused_naming_the_key_without_the_secret() {
        let text = SERVICE.replace(
            "https://api.example.com/",
            "https://gw:hunter2@api.example.com/",
        );
        let p = problems(&text, &[]);
        assert_eq!(p[0].key, "service.environments.ppe.base_url");
        let shown = p[0].to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("gw:"),
            "{shown}"
        );
        assert!(shown.contains("without credentials"), "{shown}");
    }

    #[test]
    fn a_ca_file_must_be_a_readable_pem_file_of_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        for (path, why) in [
            (not_pem.display().to_string(), "it holds none"),
            ("/nonexistent/ca.pem".to_string(), "that can be read"),
        ] {
            let text = SERVICE.replace(
                "environment = \"ppe\"",
                &format!("environment = \"ppe\"\nca_file = \"{path}\""),
            );
            let p = problems(&text, &[]);
            let shown = p[0].to_string();
            assert!(
                shown.starts_with(&format!("service.ca_file = {path}: expected a PEM file")),
                "{shown}"
            );
            assert!(shown.contains(why), "{shown}");
        }
    }

    #[test]
    fn the_operator_keys_are_optional_and_a_bad_one_is_named_with_its_value() {
        let c = parse(SERVICE, &[]).unwrap();
        let o = c.operator.unwrap();
        assert_eq!(o.historical_base_url, None);
        assert_eq!(o.default_tape_type, "Green");
        assert_eq!(o.rate_window, Duration::from_secs(60));
        let text = format!(
            "{SERVICE}historical_base_url = \"ftp://h/\"\nhistory_operation_id = \"not-a-uuid\"\ndefault_app_id = \"\"\n"
        );
        let p = problems(
            &text.replace("[service]\n", "[service]\nrate_window_secs = 0\n"),
            &[],
        );
        let keys: Vec<(&str, Option<&str>)> = p
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_deref()))
            .collect();
        assert_eq!(
            keys,
            [
                ("service.rate_window_secs", Some("0")),
                (
                    "service.environments.ppe.historical_base_url",
                    Some("\"ftp://h/\"")
                ),
                (
                    "service.environments.ppe.history_operation_id",
                    Some("\"not-a-uuid\"")
                ),
                ("service.environments.ppe.default_app_id", Some("\"\"")),
            ]
        );
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
        let files = |pw| Files {
            password_file: Some(pw),
            password: Password::Read,
            ..Files::default()
        };
        let c = validate(raw(&mut p), &test_host(), files(&read), &mut p).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.service.unwrap().endpoint.password.expose(), "from-memory");

        let empty = PasswordFile {
            path: PathBuf::from("/nonexistent/pw"),
            contents: Ok(Secret::new("\n")),
        };
        let mut p = Vec::new();
        assert!(validate(raw(&mut p), &test_host(), files(&empty), &mut p).is_none());
        assert_eq!(
            p[0].to_string(),
            "service.environments.ppe.password_file = /nonexistent/pw: expected a file holding the password (it is empty)"
        );
    }
}

#[cfg(test)]
mod http_tests {
    use std::net::SocketAddr;

    use crate::config::test_support::{parse, problems};

    #[test]
    fn no_http_listener_unless_one_is_configured() {
        assert_eq!(parse("", &[]).unwrap().http.listen, None);
        let c = parse("[http]\nlisten = \"0.0.0.0:9464\"\n", &[]).unwrap();
        assert_eq!(c.http.listen, Some(SocketAddr::from(([0, 0, 0, 0], 9464))));
        let c = parse("", &[("TAPEGATE_HTTP__LISTEN", "[::1]:9000")]).unwrap();
        assert_eq!(c.http.listen, Some("[::1]:9000".parse().unwrap()));
    }

    #[test]
    fn a_listen_address_without_a_port_is_refused_naming_key_and_value() {
        for bad in ["9464", "localhost:9464", "0.0.0.0"] {
            let p = problems(&format!("[http]\nlisten = \"{bad}\"\n"), &[]);
            let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
            assert_eq!(p.len(), 1, "{shown:?}");
            assert!(
                shown[0].starts_with(&format!(
                    "http.listen = \"{bad}\": expected an IP address and port"
                )),
                "{shown:?}"
            );
        }
    }
}
