//! What `tapegate check` tells an installer to do about a failure: the advice for a
//! transport, token or decode error, and the segment a doubled `base_url` repeats. Pure
//! words over the transport's typed errors (`crate::api`); nothing of `check.rs`.

use crate::api::{ApiError, TransportKind};

/// The segment that repeats in a request path (`/external/external/...`), if one does.
pub(super) fn doubled_path(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    segments
        .windows(2)
        .find(|w| w[0] == w[1])
        .map(|w| format!("/{}", w[0]))
        .or_else(|| {
            // `/external/v1/external/v1/...`: the versioned prefix given twice.
            segments
                .windows(4)
                .find(|w| w[0] == w[2] && w[1] == w[3])
                .map(|w| format!("/{}/{}", w[0], w[1]))
        })
}

fn transport_advice(e: &ApiError, url: &str) -> Option<String> {
    Some(match e.transport_kind()? {
        TransportKind::Dns => format!("unknown host in {url}: check the URL and DNS"),
        TransportKind::ConnectionRefused => {
            format!("{url}: connection refused (nothing listens there)")
        }
        TransportKind::Tls => format!("{url}: {}", e.operator_cause()),
        TransportKind::Timeout => format!("{url}: timed out (network, firewall or proxy)"),
        TransportKind::Connect | TransportKind::Closed | TransportKind::Other => {
            format!("{url}: {e}")
        }
    })
}

pub(super) fn token_advice(e: &ApiError, url: &str) -> String {
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

pub(super) fn decode_advice(e: &ApiError, url: &str) -> String {
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
