/*!
`tapegate check`: for installers. Validates the config (already done by loading it),
fetches a token, and sends the bulk decode endpoint one real item (the oldest capture
waiting in the outbox, or else a probe that no tape has), saying in one line each what
worked, what did not and what to do about it. It proves what it says: the answer must
be a per-item array holding an item for the MAC sent, or the endpoint is not the bulk
decode the spec describes and the check fails. Warnings (`warn`) do not fail the check: a `base_url` that looks doubled
(`/external/external`), a password readable by every user, an `[http] listen` beyond
loopback (the page and `/metrics` have no password).
It touches the config, the service client, the clock and the state database
(read-only); `check/advice.rs` says what to do about each failure.
*/

use std::io::Write;

mod advice;

use super::CmdError;
use crate::api::{ApiError, BulkAnswerItem, BulkItem, ServiceClient};
use crate::clock::{
    decide, Clock, ClockPolicy, ClockSettings, Facts, Reading, SharedClock, Trust,
    Verdict as ClockVerdict,
};
use crate::config::{Config, MacFormat, ServiceSettings};
use crate::outbox::StateReader;
use crate::record::Mac;
use advice::{decode_advice, doubled_path, token_advice};

/// A MAC no tape has: the service answers it with an item error, which proves the
/// endpoint, the headers and the permission without decoding anything real.
const PROBE_MAC: Mac = Mac::new([0, 0, 0, 0, 0, 0]);

/// How far the clocks may differ before `check` fails (tokens carry validity times).
const MAX_SKEW_SECS: i64 = 300;

/// The observed tape advert (company 0x0EF7, as on air).
const PROBE_PACKET: &str = "F70E4956E29F84211E44FFB51E";

/// How a line of the report went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// The report: one line a check, and whether every check passed so far.
struct Report<'a> {
    out: &'a mut dyn Write,
    ok: bool,
    /// The clock the daemon would read.
    clock: &'a dyn Clock,
}

impl Report<'_> {
    fn say(&mut self, verdict: Verdict, what: &str, detail: String) {
        self.ok &= verdict != Verdict::Fail;
        let mark = match verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        let _ = writeln!(self.out, "{mark} {what:<16} {detail}");
    }
}

/// `tapegate check`: [`run`], the command failing when a check failed.
pub async fn command(
    config: &Config,
    clock: &SharedClock,
    config_path: &std::path::Path,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    match run(config, clock, &config_path.display().to_string(), out).await {
        true => Ok(()),
        false => Err(CmdError::Failed("check failed".into())),
    }
}

/// Runs the checks; true when all passed (warnings do not fail it).
pub async fn run(
    config: &Config,
    clock: &SharedClock,
    config_path: &str,
    out: &mut dyn Write,
) -> bool {
    let mut r = Report {
        out,
        ok: true,
        clock: &**clock,
    };
    local(&mut r, config, config_path);
    let Some(service) = &config.service else {
        r.say(
            Verdict::Fail,
            "service",
            "no [service] section: captures would only accumulate in the outbox".into(),
        );
        return false;
    };
    let client = match ServiceClient::new(service, clock.clone()) {
        Ok(c) => c,
        Err(e) => {
            r.say(Verdict::Fail, "client", e.to_string());
            return false;
        }
    };
    warnings(&mut r, &client, service);
    let roots = crate::api::trust::system().describe();
    let trust = match &service.ca_file {
        Some(ca) => format!("{roots}, and ca_file {}", ca.path.display()),
        None => roots,
    };
    r.say(Verdict::Ok, "trust", trust);
    if !token(&mut r, &client, service).await {
        return false;
    }
    clock_skew(&mut r, &client);
    decode(&mut r, &client, config, service).await;
    r.ok
}

/// What is checked without the service: the config, the time sync, who may read the
/// password, who may reach the HTTP server.
fn local(r: &mut Report, config: &Config, config_path: &str) {
    r.say(
        Verdict::Ok,
        "config",
        format!(
            "{config_path} is valid (gateway {}, {} product(s))",
            config.gateway.id,
            config.products.0.len()
        ),
    );
    let c = r.clock;
    let sync = time_sync(config.gateway.clock, &c.read(), c.time_service().as_deref());
    r.say(Verdict::Ok, "time sync", sync);
    let path = std::path::Path::new(config_path);
    let password = crate::config::world_readable_password(path).map(|w| ("password", w));
    let http = config.http.listen.and_then(crate::http::exposure_warning);
    let deprecated = config.deprecations().into_iter().map(|w| ("config", w));
    let warned = password.into_iter().chain(deprecated);
    for (what, warning) in warned.chain(http.map(|w| ("http", w))) {
        r.say(Verdict::Warn, what, warning);
    }
}

/// A `base_url` that looks doubled, a password too short to scrub.
fn warnings(r: &mut Report, client: &ServiceClient, service: &ServiceSettings) {
    if let Some(doubled) = doubled_path(client.decode_bulk_url().path()) {
        r.say(
            Verdict::Warn,
            "base_url",
            format!(
                "requests go to {} ({doubled} twice): base_url should end before /external (paths are appended to it as written)",
                client.decode_bulk_url()
            ),
        );
    }
    if service.endpoint.password.expose().chars().count() < crate::util::secret::SCRUB_MIN_CHARS {
        r.say(
            Verdict::Warn,
            "password",
            format!(
                "shorter than {} characters: too short to tell from ordinary text, so it is not looked for in what the service answers (the token endpoint's answers are never shown); ask for a longer one",
                crate::util::secret::SCRUB_MIN_CHARS
            ),
        );
    }
}

/// A token fetched; `false` when none could be (nothing else can be checked then).
async fn token(r: &mut Report<'_>, client: &ServiceClient, service: &ServiceSettings) -> bool {
    let env = &service.endpoint;
    match client.fetch_token().await {
        Ok(expires) => {
            r.say(
                Verdict::Ok,
                "token",
                format!(
                    "granted by {} (environment {}, valid {} s)",
                    env.auth_url,
                    service.environment,
                    expires.as_secs()
                ),
            );
            true
        }
        Err(e) => {
            r.say(
                Verdict::Fail,
                "token",
                token_advice(&e, env.auth_url.as_ref()),
            );
            false
        }
    }
}

/// This gateway's clock against the service's (tokens carry validity times).
fn clock_skew(r: &mut Report, client: &ServiceClient) {
    match client.clock_skew_secs() {
        Some(skew) if skew.abs() > MAX_SKEW_SECS => r.say(
            Verdict::Fail,
            "clock",
            format!(
                "this gateway's clock is {} s {} the service's: fix NTP (timedatectl status)",
                skew.abs(),
                if skew > 0 { "behind" } else { "ahead of" }
            ),
        ),
        Some(skew) => r.say(
            Verdict::Ok,
            "clock",
            format!("within {} s of the service's", skew.abs().max(1)),
        ),
        None => r.say(
            Verdict::Ok,
            "clock",
            "not checked (the token endpoint sent no Date header)".into(),
        ),
    }
}

/// One real item sent to the bulk decode endpoint, and its answer judged.
async fn decode(
    r: &mut Report<'_>,
    client: &ServiceClient,
    config: &Config,
    service: &ServiceSettings,
) {
    let now = r.clock.wall_ms();
    let (probe, what) = test_item(config, service.mac_format, now);
    let correlation_id = format!("{}-check-{}", config.gateway.id, now);
    let url = client.decode_bulk_url().to_string();
    match client.decode_bulk(std::slice::from_ref(&probe), &correlation_id).await {
        Ok(answer) => {
            let (verdict, detail) = judge_answer(&answer, &probe.mac_id, &what);
            r.say(
                verdict,
                "decode endpoint",
                format!(
                    "{url} {detail} (customer {}, correlation_id {correlation_id})",
                    service.endpoint.customer_id
                ),
            );
        }
        Err(ApiError::BadAnswer(m)) => r.say(
            Verdict::Fail,
            "decode endpoint",
            format!("{url} answered 200, but not with a per-item array as spec 4.4 describes ({m}): is base_url right?"),
        ),
        Err(e) => r.say(Verdict::Fail, "decode endpoint", decode_advice(&e, &url)),
    }
}

/// `tapegate check --config-only`: the config is valid (loading it checked that),
/// without the password; and the HTTP server's reach, when it is wider than loopback.
pub fn config_only(
    config_path: &std::path::Path,
    config: &Config,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "ok   config           {} is valid (gateway {}, {} product(s), source {:?}; the password is not read here, `tapegate check` reads it)",
        config_path.display(),
        config.gateway.id,
        config.products.0.len(),
        config.scanner.source
    )?;
    if let Some(warning) = config.http.listen.and_then(crate::http::exposure_warning) {
        writeln!(out, "warn http             {warning}")?;
    }
    Ok(())
}

/// The item `check` sends: the oldest capture waiting in the outbox (a real packet of a
/// real tape, as the daemon would send it), or else the probe MAC no tape has. With a
/// sentence saying which.
fn test_item(config: &Config, mac_format: MacFormat, now: i64) -> (BulkItem, String) {
    let pending = StateReader::open_read_only(&config.gateway.state_dir)
        .ok()
        .flatten()
        .and_then(|store| store.oldest_pending().ok())
        .flatten();
    match pending {
        Some(p) => {
            let c = p.capture;
            let item = BulkItem {
                mac_id: mac_format.format(c.mac),
                ble_packet: c.packet,
                product_id: c.product_id.to_string(),
                scan_time: (c.ts_ms / 1000).to_string(),
            };
            (
                item,
                format!("the oldest capture waiting in the outbox (tape {})", c.mac),
            )
        }
        None => {
            let product = config
                .products
                .0
                .first()
                .map(|p| p.id.to_string())
                .unwrap_or_else(|| "tape".into());
            let item = BulkItem {
                mac_id: mac_format.format(PROBE_MAC),
                ble_packet: PROBE_PACKET.into(),
                product_id: product,
                scan_time: (now / 1000).to_string(),
            };
            (item, "a probe (no capture is waiting in the outbox)".into())
        }
    }
}

/// What the answer to the one item says: decoded, refused by the service for a reason
/// of its own (the endpoint works), or no item for the MAC sent (not the endpoint the
/// spec describes).
fn judge_answer(answer: &[BulkAnswerItem], mac_id: &str, what: &str) -> (Verdict, String) {
    match answer.iter().find(|a| a.mac_id == mac_id) {
        Some(BulkAnswerItem { result: Ok(d), .. }) => (
            Verdict::Ok,
            format!(
                "decoded {what}: QR code {}",
                d.qr_code.as_deref().unwrap_or("(none given)")
            ),
        ),
        Some(BulkAnswerItem {
            result: Err(error), ..
        }) => (
            Verdict::Ok,
            format!(
                "answered {what} with the item error \"{}\"",
                crate::util::text::shown(error, crate::util::text::SHOWN_MAX_CHARS)
            ),
        ),
        None => (
            Verdict::Fail,
            format!(
                "answered, but with no item for mac_id {mac_id} ({} item(s)): not a per-item answer as spec 4.4 describes; is base_url right?",
                answer.len()
            ),
        ),
    }
}

/// What the daemon would make of the clock now (the database's newest time aside), in
/// words for the installer.
fn time_sync(settings: ClockSettings, now: &Reading, service: Option<&str>) -> String {
    let facts = Facts {
        time_service: service.is_some(),
        ..Facts::default()
    };
    let max_hold = settings.max_hold.as_secs();
    match decide(settings.policy, max_hold as i64 * 1000, now, &facts) {
        ClockVerdict::Synced => "the kernel reports the clock synchronised".into(),
        ClockVerdict::Hold(_) if settings.policy == ClockPolicy::Wait => {
            "unsynchronised: captures are held until it syncs, however long (gateway.clock = \"wait\")".into()
        }
        ClockVerdict::Hold(_) => format!(
            "unsynchronised; {} runs to sync it: captures are held until it does (at most {max_hold} s)",
            service.unwrap_or("a time service")
        ),
        ClockVerdict::Trusted(Trust::NoTimeService) => "unsynchronised and no time service runs (systemd-timesyncd, chrony, ntpd): the clock is trusted as it is; a gateway without a real-time clock needs one".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn unsynced() -> Reading {
        Reading {
            wall_ms: 1_795_392_000_000,
            boot_ms: 5_000,
            kernel_synced: false,
        }
    }

    fn settings(policy: ClockPolicy) -> ClockSettings {
        ClockSettings {
            policy,
            max_hold: Duration::from_secs(3600),
        }
    }

    #[test]
    fn the_time_sync_line_says_what_the_daemon_would_do_with_the_clock() {
        let auto = settings(ClockPolicy::Auto);
        let held = time_sync(auto, &unsynced(), Some("chronyd"));
        assert!(
            held.contains("chronyd runs to sync it") && held.contains("3600 s"),
            "{held}"
        );
        let trusted = time_sync(auto, &unsynced(), None);
        assert!(trusted.contains("no time service runs"), "{trusted}");
        let synced = Reading {
            kernel_synced: true,
            ..unsynced()
        };
        assert_eq!(
            time_sync(auto, &synced, None),
            "the kernel reports the clock synchronised"
        );
        let wait = time_sync(settings(ClockPolicy::Wait), &unsynced(), None);
        assert!(wait.contains("however long"), "{wait}");
        let trust = time_sync(settings(ClockPolicy::Trust), &unsynced(), Some("ntpd"));
        assert!(trust.contains("gateway.clock = \"trust\""), "{trust}");
    }

    #[test]
    fn an_answer_without_the_item_sent_fails_the_check() {
        let item = |mac: &str, result| BulkAnswerItem {
            mac_id: mac.into(),
            result,
        };
        let (v, said) = judge_answer(&[item("AA", Err("no".into()))], "BB", "a probe");
        assert!(
            v == Verdict::Fail && said.contains("no item for mac_id BB"),
            "{said}"
        );
        let (v, said) = judge_answer(
            &[item("BB", Err("device not found".into()))],
            "BB",
            "a probe",
        );
        assert!(
            v == Verdict::Ok && said.contains("device not found"),
            "{said}"
        );
    }

    #[test]
    fn a_doubled_path_is_named() {
        assert_eq!(
            doubled_path("/external/external/v1/devices/decode").as_deref(),
            Some("/external")
        );
        assert_eq!(
            doubled_path("/ppe/external/v1/external/v1/devices/decode").as_deref(),
            Some("/external/v1")
        );
        assert_eq!(doubled_path("/ppe/external/v1/devices/decode"), None);
    }
}
