/*!
`tapegate check`: for installers. Validates the config (already done by loading it),
fetches a token, and reaches the bulk decode endpoint with one harmless item, saying in
one line each what worked and what did not, and what to do about it.
*/

use std::io::Write;

use crate::api::{ApiError, BulkItem, ServiceClient, TransportKind};
use crate::clock::now_ms;
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
        ApiError::Rejected { message, .. } | ApiError::RequestRefused { message, .. } => format!("the request was refused (check customer_id and authorized_groups): {message}"),
        other => other.to_string(),
    }
}
