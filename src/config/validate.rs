/*!
Validation: the raw layer to the typed [`Config`] in one pure step, each section read by
its own file (`gateway.rs`, `service.rs`, `products.rs`, `scanner.rs`, `dedup.rs`,
`outbox.rs`, `flush.rs`, `readings.rs`, `log.rs`, `http.rs`, `telemetry.rs`) into one
list of [`Problem`]s, each naming the key, the value (never a secret's) and what was
expected. What it needs from the machine (the host name, the files the config points
to) is passed in, read beforehand by `load.rs`.
*/

use super::files::Files;
use super::host::Host;
use super::problem::{Check, Problem};
use super::raw::RawConfig;
use super::{
    dedup, flush, gateway, http, log, outbox, products, readings, scanner, service, telemetry,
};
use super::{
    FlushSettings, GatewaySettings, HttpSettings, LogSettings, OperatorSettings, OutboxSettings,
    ReadingsSettings, ScannerSettings, ServiceSettings, TelemetrySettings,
};
use crate::dedup::DedupSettings;
use crate::products::Products;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: GatewaySettings,
    /// `None`: no `[service]` section (captures accumulate in the outbox), or loaded
    /// with [`Password::Skip`](super::Password::Skip).
    pub service: Option<ServiceSettings>,
    pub products: Products,
    pub scanner: ScannerSettings,
    pub dedup: DedupSettings,
    pub outbox: OutboxSettings,
    pub flush: FlushSettings,
    pub readings: ReadingsSettings,
    pub log: LogSettings,
    pub http: HttpSettings,
    /// `[telemetry]`: where the metrics are pushed; `None`: nowhere (the default).
    pub telemetry: Option<TelemetrySettings>,
    /// The operator commands' settings (`device`, `locate`, `history`); `None` without
    /// a `[service]` section.
    pub operator: Option<OperatorSettings>,
}

impl Config {
    /// Keys that are accepted but no longer do anything, each with a sentence saying
    /// why: `run` logs them at WARN at start, `check` shows them, a reload warns of them.
    pub fn deprecations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.readings.retention_set {
            out.push("readings.retention_hours has no effect any more: the gateway keeps no history of readings (the service keeps them; nothing here read them), only each tape's latest (`tapegate tapes`); remove the key".to_string());
        }
        out
    }
}

/// Turns `raw` into a [`Config`], adding a problem for each thing wrong; `None` when
/// something is too wrong to build one (the problems say what). The sections are read in
/// the file's order, so the problems are listed in it.
pub fn validate(
    raw: RawConfig,
    host: &Host,
    files: Files<'_>,
    problems: &mut Vec<Problem>,
) -> Option<Config> {
    let c = &mut Check { problems };
    let gateway = gateway::validate(raw.gateway, host, c);
    let service = raw.service.map(|s| service::validate(s, files, c));
    let products = products::validate(raw.products, c);
    let scanner = scanner::validate(raw.scanner, &products, c);
    let dedup = dedup::validate(raw.dedup, c);
    let outbox = outbox::validate(raw.outbox, c);
    let flush = flush::validate(raw.flush, c);
    let readings = readings::validate(raw.readings, c);
    let log = log::validate(raw.log, c);
    let http = http::validate(raw.http, c);
    let telemetry = telemetry::validate(raw.telemetry, files, c);
    let (service, operator) = match service {
        Some(Ok(Some((s, o)))) => (Some(s), Some(o)),
        Some(Ok(None)) | None => (None, None),
        Some(Err(service::Invalid)) => return None,
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
        log,
        http,
        telemetry,
        operator,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::files::Password;
    use crate::config::host::PasswordFile;
    use crate::config::test_support::{problems, test_host, SERVICE};
    use crate::util::secret::Secret;

    #[test]
    fn every_problem_is_reported_at_once_naming_key_value_and_expectation() {
        let text = format!(
            "{SERVICE}\n[flush]\nmax_batch = 300\n[outbox]\ndurability = \"maybe\"\n[scanner]\nsource = \"radio\"\n[dedup]\nwindow = 5\n[[products]]\nid = \"tape\"\nmanufacturer_id = 70000\n"
        );
        let p = problems(&text, &[]);
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
        assert!(
            has("flush.max_batch = 300: expected a whole number from 1 to 250"),
            "{shown:#?}"
        );
        assert!(
            has("outbox.durability = \"maybe\": expected one of full | normal"),
            "{shown:#?}"
        );
        assert!(
            has("scanner.source = \"radio\": expected one of ble | replay | sim"),
            "{shown:#?}"
        );
        assert!(has("dedup") && has("unknown field `window`"), "{shown:#?}");
        assert!(has("products[0].manufacturer_id = 70000"), "{shown:#?}");
        assert_eq!(p.len(), 5, "{shown:#?}");
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
