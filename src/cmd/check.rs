/*!
`tapegate check`: for installers. Validates the config (already done by loading it),
fetches a token, and reaches the bulk decode endpoint with one harmless item, saying in
one line each what worked and what did not, and what to do about it.
*/

use std::io::Write;

use crate::api::{ApiError, BulkItem, ServiceClient, TransportKind};
use crate::clock::{
    clock, decide, now_ms, ClockPolicy, ClockSettings, Facts, Reading, Trust, Verdict,
};
use crate::config::Config;
use crate::record::Mac;

/// A MAC no tape has: the service answers it with an item error, which proves the
/// endpoint, the headers and the permission without decoding anything real.
const PROBE_MAC: Mac = Mac::new([0, 0, 0, 0, 0, 0]);

/// How far the clocks may differ before `check` fails (tokens carry validity times).
const MAX_SKEW_SECS: i64 = 300;

/// The observed tape advert (company 0x0EF7, as on air).
const PROBE_PACKET: &str = "F70E4956E29F84211E44FFB51E";

/// Runs the checks; true when all passed.
pub async fn run(config: &Config, config_path: &str, out: &mut dyn Write) -> bool {
    let mut ok = true;
    let mut line = |good: bool, what: &str, detail: String| {
        ok &= good;
        let _ = writeln!(
            out,
            "{} {what:<16} {detail}",
            if good { "ok  " } else { "FAIL" }
        );
    };
    line(
        true,
        "config",
        format!(
            "{config_path} is valid (gateway {}, {} product(s))",
            config.gateway.id,
            config.products.0.len()
        ),
    );
    let c = clock();
    line(
        true,
        "time sync",
        time_sync(config.gateway.clock, &c.read(), c.time_service().as_deref()),
    );
    let Some(service) = &config.service else {
        line(
            false,
            "service",
            "no [service] section: captures would only accumulate in the outbox".into(),
        );
        return false;
    };
    let client = match ServiceClient::new(service) {
        Ok(c) => c,
        Err(e) => {
            line(false, "client", e.to_string());
            return false;
        }
    };
    let env = &service.endpoint;
    match client.fetch_token().await {
        Ok(expires) => line(
            true,
            "token",
            format!(
                "granted by {} (environment {}, valid {} s)",
                env.auth_url,
                service.environment,
                expires.as_secs()
            ),
        ),
        Err(e) => {
            line(false, "token", token_advice(&e, env.auth_url.as_ref()));
            return false;
        }
    }
    match client.clock_skew_secs() {
        Some(skew) if skew.abs() > MAX_SKEW_SECS => line(
            false,
            "clock",
            format!(
                "this gateway's clock is {} s {} the service's: fix NTP (timedatectl status)",
                skew.abs(),
                if skew > 0 { "behind" } else { "ahead of" }
            ),
        ),
        Some(skew) => line(
            true,
            "clock",
            format!("within {} s of the service's", skew.abs().max(1)),
        ),
        None => line(
            true,
            "clock",
            "not checked (the token endpoint sent no Date header)".into(),
        ),
    }
    let product = config
        .products
        .0
        .first()
        .map(|p| p.id.clone())
        .unwrap_or_else(|| "tape".into());
    let probe = BulkItem {
        mac_id: service.mac_format.format(PROBE_MAC),
        ble_packet: PROBE_PACKET.into(),
        product_id: product,
        scan_time: (now_ms() / 1000).to_string(),
    };
    let correlation_id = format!("{}-check-{}", config.gateway.id, now_ms());
    match client.decode_bulk(&[probe], &correlation_id).await {
        Ok(_) => line(
            true,
            "decode endpoint",
            format!(
                "{} answered (customer {}, correlation_id {correlation_id})",
                client.decode_bulk_url(),
                env.customer_id
            ),
        ),
        Err(e) => line(
            false,
            "decode endpoint",
            decode_advice(&e, client.decode_bulk_url().as_ref()),
        ),
    }
    ok
}

fn transport_advice(e: &ApiError, url: &str) -> Option<String> {
    Some(match e.transport_kind()? {
        TransportKind::Dns => format!("unknown host in {url}: check the URL and DNS"),
        TransportKind::ConnectionRefused => {
            format!("{url}: connection refused (nothing listens there)")
        }
        TransportKind::Tls => {
            format!("{url}: TLS failure (certificate, or the clock is far off): {e}")
        }
        TransportKind::Timeout => format!("{url}: timed out (network, firewall or proxy)"),
        TransportKind::Connect | TransportKind::Closed | TransportKind::Other => {
            format!("{url}: {e}")
        }
    })
}

fn token_advice(e: &ApiError, url: &str) -> String {
    if let Some(t) = transport_advice(e, url) {
        return t;
    }
    match e {
        ApiError::AuthRejected {
            status: 401,
            message,
        } => {
            format!("wrong username or password (the token endpoint said: {message})")
        }
        ApiError::AuthRejected {
            status: 403,
            message,
        } => {
            format!("wrong audience or client_id for this environment (the token endpoint said: {message})")
        }
        ApiError::AuthRejected { status, message } => {
            format!("the token endpoint refused the grant (HTTP {status}): {message}")
        }
        other => other.to_string(),
    }
}

fn decode_advice(e: &ApiError, url: &str) -> String {
    if let Some(t) = transport_advice(e, url) {
        return t;
    }
    match e {
        ApiError::Unauthorized { .. } => {
            "the service refuses a fresh token: the API identity lacks the decode permission, or the token is for another environment".into()
        }
        ApiError::UnexpectedStatus { status, .. } => {
            format!("{url} answered HTTP {status}: is base_url right?")
        }
        ApiError::Rejected { message, .. } => format!("the request was refused (check customer_id and authorized_groups): {message}"),
        other => other.to_string(),
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
        Verdict::Synced => "the kernel reports the clock synchronised".into(),
        Verdict::Hold(_) if settings.policy == ClockPolicy::Wait => {
            "unsynchronised: captures are held until it syncs, however long (gateway.clock = \"wait\")".into()
        }
        Verdict::Hold(_) => format!(
            "unsynchronised; {} runs to sync it: captures are held until it does (at most {max_hold} s)",
            service.unwrap_or("a time service")
        ),
        Verdict::Trusted(Trust::NoTimeService) => "unsynchronised and no time service runs (systemd-timesyncd, chrony, ntpd): the clock is trusted as it is; a gateway without a real-time clock needs one".into(),
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
}
