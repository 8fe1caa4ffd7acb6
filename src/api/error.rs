/*!
What can go wrong talking to the tracking service, sorted by what the caller should do
about it. The flusher maps these variants to actions (DESIGN.md, "Delivery"); `tapegate
check` maps them to a sentence for the installer. No variant ever carries the password
or the token: messages taken from answer bodies are truncated and scrubbed of both.
*/

use std::error::Error as _;
use std::fmt;
use std::time::{Duration, SystemTime};

/// Longest server message kept in an error (the rest is cut, with an ellipsis).
const MESSAGE_MAX_CHARS: usize = crate::text::SHOWN_MAX_CHARS;

/// An error of the service client. The variant says what to do next.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The settings cannot make a client (bad URL scheme, a header value that HTTP cannot
    /// carry). Fix the configuration; retrying will not help.
    #[error("the service settings cannot be used: {0}")]
    Setup(String),

    /// This request cannot be sent as written (a value HTTP cannot carry in a header).
    /// Do not retry it unchanged.
    #[error("the request cannot be sent: {0}")]
    InvalidRequest(String),

    /// The token endpoint refused the password grant (wrong password, client or audience,
    /// or a wrong `auth_url`). The client does not ask again before its backoff ends; an
    /// operator has to fix the credentials.
    #[error("the token endpoint refused the grant (HTTP {status}): {message}")]
    AuthRejected { status: u16, message: String },

    /// The service refused a fresh token too: the credentials lack the permission, or
    /// the token is for another environment. Back off; an operator has to look.
    #[error("the service refused a fresh token (credentials or permission): {message}")]
    Unauthorized { message: String },

    /// The service refused the whole request (400): split the batch to find the items
    /// it refuses; a single refused item is a dead letter.
    #[error("the service refused the request (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },

    /// The service refused the request itself (400: missing required headers, a
    /// validation failure not about the items), not anything it holds: back off and
    /// report; nothing is refused, but someone has to look (a proxy dropping headers).
    #[error("the service refused the request itself (HTTP {status}): {message}")]
    RequestRefused { status: u16, message: String },

    /// The batch has more items than the service takes (413): send smaller batches.
    #[error("the batch is larger than the service takes: {message}")]
    TooLarge { message: String },

    /// Single decode: the device is unknown or not associated with the customer (404).
    #[error("device not found or not associated with the customer: {message}")]
    NotFound { message: String },

    /// Rate limited, server error, timeout, or the service (or its token endpoint) could
    /// not be reached. Retry with backoff, not before `retry_after` when given.
    #[error("{cause}{}", transport_suffix(.transport))]
    Transient {
        /// Short operator text: "service unreachable", "rate limited", "server error 503",
        /// "timeout", "connection closed", "token endpoint unreachable", ...
        cause: String,
        /// What the service asked for (`Retry-After`), or how long the token cache still
        /// holds back.
        retry_after: Option<Duration>,
        /// Set when no HTTP answer came at all.
        transport: Option<Transport>,
    },

    /// An HTTP status the interface does not give for this call (a redirect, 403 or 404
    /// from a proxy, 405...). Usually a wrong `base_url`. Back off and retry; nothing is
    /// refused, but someone has to look.
    #[error("unexpected answer HTTP {status}: {message}")]
    UnexpectedStatus { status: u16, message: String },

    /// A success status with a body that is not the documented answer (not JSON, too
    /// large, wrong shape). Retry later; nothing in the batch was settled.
    #[error("unreadable answer from the service: {0}")]
    BadAnswer(String),
}

/// Why no HTTP answer came, for `tapegate check` to tell an installer what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    pub kind: TransportKind,
    /// The error chain of the HTTP stack (never holds the URL, the token or the password).
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The host name does not resolve.
    Dns,
    /// Nothing listens on the port.
    ConnectionRefused,
    /// The TLS handshake failed (certificate, protocol).
    Tls,
    /// Another connect failure (no route, network down).
    Connect,
    /// No answer within `request_timeout`.
    Timeout,
    /// The connection closed before the answer was complete.
    Closed,
    /// Anything else below HTTP.
    Other,
}

impl TransportKind {
    /// A few words for an installer.
    pub fn describe(self) -> &'static str {
        match self {
            TransportKind::Dns => "unknown host",
            TransportKind::ConnectionRefused => "connection refused",
            TransportKind::Tls => "TLS failure",
            TransportKind::Connect => "cannot connect",
            TransportKind::Timeout => "timeout",
            TransportKind::Closed => "connection closed",
            TransportKind::Other => "transport error",
        }
    }
}

fn transport_suffix(t: &Option<Transport>) -> String {
    match t {
        Some(t) if t.detail.is_empty() => format!(" ({})", t.kind.describe()),
        Some(t) => format!(" ({}: {})", t.kind.describe(), t.detail),
        None => String::new(),
    }
}

impl ApiError {
    /// How long the caller should wait before retrying, when the service (or the token
    /// cache's backoff) said so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Why no HTTP answer came, if that is what happened.
    pub fn transport_kind(&self) -> Option<TransportKind> {
        match self {
            ApiError::Transient {
                transport: Some(t), ..
            } => Some(t.kind),
            _ => None,
        }
    }

    /// A short cause for status output and logs: "service unreachable", "credentials or
    /// permission", "rate limited", "server error 503", "timeout", "token refused: ...".
    pub fn operator_cause(&self) -> String {
        match self {
            ApiError::Setup(m) => format!("bad settings: {}", truncate(m, 120)),
            ApiError::InvalidRequest(m) => format!("request cannot be sent: {}", truncate(m, 120)),
            ApiError::AuthRejected { message, .. } => {
                format!("token refused: {}", truncate(message, 120))
            }
            ApiError::Unauthorized { .. } => "credentials or permission".to_string(),
            ApiError::Rejected { message, .. } => format!("rejected: {}", truncate(message, 120)),
            ApiError::RequestRefused { message, .. } => {
                format!("request refused: {}", truncate(message, 120))
            }
            ApiError::TooLarge { .. } => "batch too large".to_string(),
            ApiError::NotFound { .. } => "device not found".to_string(),
            ApiError::Transient { cause, .. } => cause.clone(),
            ApiError::UnexpectedStatus { status, .. } => format!("unexpected answer {status}"),
            ApiError::BadAnswer(_) => "unreadable answer".to_string(),
        }
    }

    pub(crate) fn transient(cause: impl Into<String>, retry_after: Option<Duration>) -> Self {
        ApiError::Transient {
            cause: cause.into(),
            retry_after,
            transport: None,
        }
    }

    /// Maps an error of the HTTP stack (no answer came) to a transient error.
    /// `unreachable` is the cause used for connect failures.
    pub(crate) fn from_transport(err: &reqwest::Error, unreachable: &str, timeout: &str) -> Self {
        if err.is_builder() {
            // A value cannot go on the wire; retrying the same request cannot help.
            return ApiError::InvalidRequest(chain_text(err));
        }
        let kind = classify(err);
        let detail = chain_text(err);
        // The cause names what failed, so that `status`, the log and `check` tell a
        // DNS failure from a refused connection, a TLS failure (and why) or a timeout.
        let cause = match kind {
            TransportKind::Timeout => timeout.to_string(),
            TransportKind::Closed => "connection closed".to_string(),
            TransportKind::Other => "transport error".to_string(),
            TransportKind::Tls => format!("{unreachable}: TLS failure, {}", tls_reason(&detail)),
            TransportKind::Dns | TransportKind::ConnectionRefused | TransportKind::Connect => {
                format!("{unreachable}: {}", kind.describe())
            }
        };
        ApiError::Transient {
            cause,
            retry_after: None,
            transport: Some(Transport { kind, detail }),
        }
    }
}

/// Why a TLS handshake failed, in an installer's words, from the error chain's text
/// (rustls names its certificate errors there).
pub(crate) fn tls_reason(detail: &str) -> &'static str {
    let d = detail.to_ascii_lowercase();
    if d.contains("unknownissuer") || d.contains("unknown issuer") {
        "unknown issuer (a private CA or a TLS-inspecting proxy? see [service] ca_file)"
    } else if d.contains("expired") {
        "certificate expired (or this clock is far ahead)"
    } else if d.contains("notvalidyet") || d.contains("not valid yet") {
        "certificate not yet valid (or this clock is behind)"
    } else if d.contains("notvalidforname") || d.contains("not valid for name") {
        "name mismatch (the certificate is for another host)"
    } else if d.contains("corrupt message") {
        "the server does not speak TLS on this port"
    } else if d.contains("received fatal alert") {
        "the server refused the handshake"
    } else {
        "handshake failed"
    }
}

/// Which transport failure a reqwest error is, from its inspection methods and its
/// source chain (the chain is the only place DNS and TLS failures show).
fn classify(err: &reqwest::Error) -> TransportKind {
    if err.is_timeout() {
        return TransportKind::Timeout;
    }
    let text = chain_text(err).to_ascii_lowercase();
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return TransportKind::ConnectionRefused,
                std::io::ErrorKind::TimedOut => return TransportKind::Timeout,
                _ => {}
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return TransportKind::Closed;
            }
        }
        source = e.source();
    }
    if text.contains("dns error") || text.contains("failed to lookup address") {
        TransportKind::Dns
    } else if text.contains("certificate")
        || text.contains("tls")
        || text.contains("handshake")
        || text.contains("corrupt message")
    {
        TransportKind::Tls
    } else if err.is_connect() {
        TransportKind::Connect
    } else if text.contains("connection reset") || text.contains("connection closed") {
        TransportKind::Closed
    } else {
        TransportKind::Other
    }
}

/// The messages of the error's source chain, without the top level (which names the
/// URL). URLs carry no secret here, but a base_url with user info would.
fn chain_text(err: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = err.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        source = e.source();
    }
    if parts.is_empty() {
        // Only the top level: drop the URL it would print.
        let mut bare = String::new();
        let _ = fmt::write(&mut bare, format_args!("{}", WithoutUrl(err)));
        return truncate(&bare, MESSAGE_MAX_CHARS);
    }
    truncate(&parts.join(": "), MESSAGE_MAX_CHARS)
}

struct WithoutUrl<'a>(&'a reqwest::Error);

impl fmt::Display for WithoutUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_timeout() {
            f.write_str("timed out")
        } else if self.0.is_connect() {
            f.write_str("connect error")
        } else if self.0.is_body() {
            f.write_str("body error")
        } else if self.0.is_decode() {
            f.write_str("decode error")
        } else {
            f.write_str("request error")
        }
    }
}

pub(crate) use crate::text::bounded as truncate;

/// The operator-readable message of an error answer: `message` (and `errors`) of the
/// spec's error body, `error`/`error_description` of an OAuth answer, or else the body
/// text, truncated.
pub(crate) fn answer_message(body: &[u8]) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) {
        let text = |k: &str| map.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let msg = match (text("error"), text("error_description"), text("message")) {
            (Some(e), Some(d), _) => Some(format!("{e}: {d}")),
            (_, Some(d), _) => Some(d),
            (_, _, Some(m)) => Some(m),
            (Some(e), None, None) => Some(e),
            _ => None,
        };
        if let Some(mut msg) = msg {
            if let Some(errors) = map.get("errors").filter(|e| !e.is_null()) {
                msg.push_str(&format!(" {errors}"));
            }
            return truncate(&msg, MESSAGE_MAX_CHARS);
        }
    }
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        "(empty body)".to_string()
    } else {
        truncate(&text, MESSAGE_MAX_CHARS)
    }
}

/// Parses a `Retry-After` value: delay-seconds or an HTTP date (relative to `now`; a
/// past date is zero). Anything else is `None`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_delay_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_reads_an_http_date_relative_to_now() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn retry_after_in_the_past_is_zero() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn retry_after_garbage_is_none() {
        let now = SystemTime::now();
        for v in ["", "soon", "-5", "1.5", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            assert_eq!(parse_retry_after(v, now), None, "{v:?}");
        }
    }

    #[test]
    fn answer_message_prefers_the_error_body_fields() {
        assert_eq!(
            answer_message(br#"{"message":"Invalid ble_packet for X","code":400}"#),
            "Invalid ble_packet for X"
        );
        assert_eq!(
            answer_message(
                br#"{"error":"invalid_grant","error_description":"Wrong email or password."}"#
            ),
            "invalid_grant: Wrong email or password."
        );
        assert_eq!(
            answer_message(br#"{"message":"Validation failed","code":400,"errors":["a"]}"#),
            r#"Validation failed ["a"]"#
        );
        assert_eq!(
            answer_message(b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(answer_message(b""), "(empty body)");
        assert_eq!(
            answer_message("x".repeat(1000).as_bytes()).chars().count(),
            301
        );
    }

    #[test]
    fn tls_failures_say_why_in_an_installers_words() {
        for (detail, want) in [
            ("invalid peer certificate: UnknownIssuer", "unknown issuer"),
            ("invalid peer certificate: certificate expired: verification time 1 (UNIX)", "certificate expired"),
            ("invalid peer certificate: certificate not valid for name \"a\"; certificate is only valid for b", "name mismatch"),
            ("invalid peer certificate: NotValidForName", "name mismatch"),
            ("received corrupt message of type InvalidContentType", "does not speak TLS"),
            ("something else", "handshake failed"),
        ] {
            assert!(tls_reason(detail).starts_with(want) || tls_reason(detail).contains(want), "{detail}");
        }
    }

    #[test]
    fn operator_cause_is_short_and_names_the_problem() {
        assert_eq!(
            ApiError::Unauthorized {
                message: "Unauthorized access".into()
            }
            .operator_cause(),
            "credentials or permission"
        );
        assert_eq!(
            ApiError::transient("server error 503", Some(Duration::from_secs(7))).operator_cause(),
            "server error 503"
        );
        assert_eq!(
            ApiError::AuthRejected {
                status: 401,
                message: "invalid_grant: Wrong email or password.".into()
            }
            .operator_cause(),
            "token refused: invalid_grant: Wrong email or password."
        );
    }
}
