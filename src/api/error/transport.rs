//! Why no HTTP answer came: a reqwest error sorted into a [`TransportKind`] from its
//! inspection methods and its source chain, and a TLS failure's reason in an
//! installer's words. Never keeps the URL (a base_url with user info would carry a secret).

use std::error::Error as _;
use std::fmt;

use super::answer::{truncate, MESSAGE_MAX_CHARS};

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
pub(super) fn classify(err: &reqwest::Error) -> TransportKind {
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
pub(super) fn chain_text(err: &reqwest::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
