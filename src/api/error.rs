/*!
What can go wrong talking to the tracking service, sorted by what the caller should do
about it. The flusher maps these variants to actions (DESIGN.md, "Delivery"); `tapegate
check` maps them to a sentence for the installer. No variant ever carries the password
or the token: messages taken from answer bodies are truncated and scrubbed of both.

This file holds the variants and the decisions read from them; `error/transport.rs`
sorts a failure with no answer (DNS, refused, TLS, timeout), `error/answer.rs` reads an
error answer's body and `Retry-After`. The room is a leaf of the client: it touches
nothing of the crate but its text helpers.
*/

use std::time::Duration;

mod answer;
mod transport;

pub use answer::parse_retry_after;
pub(crate) use answer::{answer_message, carries_errors, truncate};
pub(crate) use transport::tls_reason;
pub use transport::TransportKind;
use transport::{chain_text, classify};

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

    /// The service refused the whole request (400). For bulk decode the spec gives two
    /// bodies no structure tells apart (an invalid packet and missing headers both answer
    /// `{message, code}`), so what it means is decided by evidence, not by `message`: the
    /// flusher splits the batch, and a capture refused alone while the service takes
    /// other requests of ours is a dead letter; halves that are all refused the same way
    /// are the request's fault (see `flush::plan`). `errors`: the body carries an
    /// `errors` array (spec 2.6, a validation failure). The message is for people.
    #[error("the service refused the request (HTTP {status}): {message}")]
    Rejected {
        status: u16,
        message: String,
        errors: bool,
    },

    /// The service refused the request itself, not anything it holds, where the answer's
    /// structure says so: back off and report; nothing is refused, but someone has to
    /// look. (Bulk decode never gives such structure; see [`ApiError::Rejected`].)
    #[error("the service refused the request itself (HTTP {status}): {message}")]
    RequestRefused { status: u16, message: String },

    /// The batch has more items than the service takes (413): send smaller batches.
    #[error("the batch is larger than the service takes: {message}")]
    TooLarge { message: String },

    /// Single decode: the device is unknown or not associated with the customer (404).
    #[error("device not found or not associated with the customer: {message}")]
    NotFound { message: String },

    /// Rate limited, server error, timeout, or the service (or its token endpoint) could
    /// not be reached. Retry with backoff, not before `retry_after` when given. What
    /// happened is `kind`, at `endpoint`; the operator's words are derived from both
    /// ([`ApiError::operator_cause`]), never the other way round.
    #[error("{}{}", transient_cause(*.endpoint, .kind), transport_suffix(.kind))]
    Transient {
        /// Which endpoint failed: the token endpoint or the service's own.
        endpoint: Endpoint,
        kind: TransientKind,
        /// The endpoint's `Retry-After`, or (token endpoint) how long the token cache
        /// still holds back after a failed grant.
        retry_after: Option<Duration>,
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

/// Which endpoint a request went to, for decisions that depend on it: a failing token
/// endpoint says nothing about the captures of a batch, nor asks the service to pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The token endpoint (`auth_url`).
    Token,
    /// The service's own endpoint (decode, the operator calls).
    Service,
}

/// What went wrong, in a way that may pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransientKind {
    /// 429: too many requests.
    RateLimited,
    /// A 5xx, or a 408 (the endpoint gave up waiting for the request).
    Status(u16),
    /// No HTTP answer came (see [`Transport`]).
    NoAnswer(Transport),
    /// The token endpoint answered success with something that is not a token.
    Unreadable(String),
}

/// The operator's words for a transient failure (`status`, `last_error`, the log).
fn transient_cause(endpoint: Endpoint, kind: &TransientKind) -> String {
    let token = endpoint == Endpoint::Token;
    match kind {
        TransientKind::RateLimited if token => "token endpoint rate limited".into(),
        TransientKind::RateLimited => "rate limited".into(),
        TransientKind::Status(408) if token => "token endpoint timeout".into(),
        TransientKind::Status(408) => "timeout".into(),
        TransientKind::Status(s) if token => format!("token endpoint error {s}"),
        TransientKind::Status(s) => format!("server error {s}"),
        TransientKind::Unreadable(m) => format!("token endpoint answer unreadable: {m}"),
        TransientKind::NoAnswer(t) => {
            let unreachable = if token {
                "token endpoint unreachable"
            } else {
                "service unreachable"
            };
            match t.kind {
                TransportKind::Timeout if token => "token endpoint timeout".into(),
                TransportKind::Timeout => "timeout".into(),
                TransportKind::Closed => "connection closed".into(),
                TransportKind::Other => "transport error".into(),
                TransportKind::Tls => {
                    format!("{unreachable}: TLS failure, {}", tls_reason(&t.detail))
                }
                TransportKind::Dns | TransportKind::ConnectionRefused | TransportKind::Connect => {
                    format!("{unreachable}: {}", t.kind.describe())
                }
            }
        }
    }
}

/// Why no HTTP answer came, for `tapegate check` to tell an installer what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    pub kind: TransportKind,
    /// The error chain of the HTTP stack (never holds the URL, the token or the password).
    pub detail: String,
}

fn transport_suffix(kind: &TransientKind) -> String {
    match kind {
        TransientKind::NoAnswer(t) if t.detail.is_empty() => format!(" ({})", t.kind.describe()),
        TransientKind::NoAnswer(t) => format!(" ({}: {})", t.kind.describe(), t.detail),
        _ => String::new(),
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
                kind: TransientKind::NoAnswer(t),
                ..
            } => Some(t.kind),
            _ => None,
        }
    }

    /// Whether the service itself asked for a pause: a `Retry-After` on an answer of
    /// the service's endpoint (429, 503...). Not the token endpoint's, not the token
    /// cache's own backoff.
    pub fn service_retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Transient {
                endpoint: Endpoint::Service,
                kind: TransientKind::RateLimited | TransientKind::Status(_),
                retry_after,
            } => *retry_after,
            _ => None,
        }
    }

    /// Whether the failure may be caused by what a batch of the service's endpoint held
    /// (the service choking on a capture): a 5xx or 408 of that endpoint, no answer in
    /// time or a connection closed after the request went out, or an answer that cannot
    /// be read. Never a rate limit, a refused token, the token endpoint, or a connection
    /// that never opened: retrying those alone would only blame a capture for the
    /// service's state.
    pub fn may_be_caused_by_the_request(&self) -> bool {
        match self {
            ApiError::BadAnswer(_) => true,
            ApiError::Transient {
                endpoint: Endpoint::Service,
                kind,
                ..
            } => match kind {
                TransientKind::Status(s) => *s == 408 || (500..=599).contains(s),
                TransientKind::NoAnswer(t) => {
                    matches!(t.kind, TransportKind::Timeout | TransportKind::Closed)
                }
                TransientKind::RateLimited | TransientKind::Unreadable(_) => false,
            },
            _ => false,
        }
    }

    /// The failure as one of a small fixed set of words, for metric labels and the
    /// health verdict: `http_400`, `http_401`, `http_404`, `http_413`, `http_429`,
    /// `http_5xx`, `http_other`, `timeout`, `unreachable`, `connection_closed`,
    /// `token_refused`, `bad_answer`, `invalid_request`, `http_400_request`.
    pub fn label(&self) -> &'static str {
        match self {
            ApiError::Rejected { .. } => "http_400",
            ApiError::RequestRefused { .. } => "http_400_request",
            ApiError::Unauthorized { .. } => "http_401",
            ApiError::NotFound { .. } => "http_404",
            ApiError::TooLarge { .. } => "http_413",
            ApiError::UnexpectedStatus { .. } => "http_other",
            ApiError::AuthRejected { .. } => "token_refused",
            ApiError::BadAnswer(_) => "bad_answer",
            ApiError::Setup(_) | ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::Transient { kind, .. } => match kind {
                TransientKind::RateLimited => "http_429",
                TransientKind::Status(408) => "timeout",
                TransientKind::Status(_) => "http_5xx",
                TransientKind::Unreadable(_) => "bad_answer",
                TransientKind::NoAnswer(t) => match t.kind {
                    TransportKind::Timeout => "timeout",
                    TransportKind::Closed => "connection_closed",
                    _ => "unreachable",
                },
            },
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
            ApiError::Transient { endpoint, kind, .. } => transient_cause(*endpoint, kind),
            ApiError::UnexpectedStatus { status, .. } => format!("unexpected answer {status}"),
            ApiError::BadAnswer(_) => "unreadable answer".to_string(),
        }
    }

    /// A transient failure of `endpoint` answered with an HTTP status (429, 5xx, 408).
    pub(crate) fn status(endpoint: Endpoint, status: u16, retry_after: Option<Duration>) -> Self {
        let kind = if status == 429 {
            TransientKind::RateLimited
        } else {
            TransientKind::Status(status)
        };
        ApiError::Transient {
            endpoint,
            kind,
            retry_after,
        }
    }

    /// Maps an error of the HTTP stack (no answer came from `endpoint`) to a transient
    /// error, so that `status`, the log and `check` tell a DNS failure from a refused
    /// connection, a TLS failure (and why) or a timeout.
    pub(crate) fn from_transport(err: &reqwest::Error, endpoint: Endpoint) -> Self {
        if err.is_builder() {
            // A value cannot go on the wire; retrying the same request cannot help.
            return ApiError::InvalidRequest(chain_text(err));
        }
        let kind = classify(err);
        let detail = chain_text(err);
        ApiError::Transient {
            endpoint,
            kind: TransientKind::NoAnswer(Transport { kind, detail }),
            retry_after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_labels_follow_the_kind_whatever_the_words() {
        let service = |s, ra| ApiError::status(Endpoint::Service, s, ra);
        let token = |s| ApiError::status(Endpoint::Token, s, None);
        let no_answer = |endpoint, kind| ApiError::Transient {
            endpoint,
            kind: TransientKind::NoAnswer(Transport {
                kind,
                detail: String::new(),
            }),
            retry_after: None,
        };
        for (e, blame, label) in [
            (service(503, None), true, "http_5xx"),
            (service(500, None), true, "http_5xx"),
            (service(408, None), true, "timeout"),
            (service(429, None), false, "http_429"),
            (token(500), false, "http_5xx"),
            (token(429), false, "http_429"),
            (
                no_answer(Endpoint::Service, TransportKind::Timeout),
                true,
                "timeout",
            ),
            (
                no_answer(Endpoint::Service, TransportKind::Closed),
                true,
                "connection_closed",
            ),
            (
                no_answer(Endpoint::Service, TransportKind::ConnectionRefused),
                false,
                "unreachable",
            ),
            (
                no_answer(Endpoint::Token, TransportKind::Timeout),
                false,
                "timeout",
            ),
            (ApiError::BadAnswer("x".into()), true, "bad_answer"),
            (
                ApiError::Transient {
                    endpoint: Endpoint::Token,
                    kind: TransientKind::Unreadable("not JSON".into()),
                    retry_after: None,
                },
                false,
                "bad_answer",
            ),
            (
                ApiError::Unauthorized {
                    message: "server error 503".into(),
                },
                false,
                "http_401",
            ),
            (
                ApiError::Rejected {
                    status: 400,
                    message: "rate limited".into(),
                    errors: false,
                },
                false,
                "http_400",
            ),
        ] {
            assert_eq!(e.may_be_caused_by_the_request(), blame, "{e:?}");
            assert_eq!(e.label(), label, "{e:?}");
        }
        let ra = Some(Duration::from_secs(2));
        assert_eq!(service(429, ra).service_retry_after(), ra);
        assert_eq!(service(503, ra).service_retry_after(), ra);
        let held_back = ApiError::status(Endpoint::Token, 503, ra);
        assert_eq!(
            held_back.service_retry_after(),
            None,
            "the token endpoint's own"
        );
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
            ApiError::status(Endpoint::Service, 503, Some(Duration::from_secs(7))).operator_cause(),
            "server error 503"
        );
        assert_eq!(
            ApiError::status(Endpoint::Token, 502, None).operator_cause(),
            "token endpoint error 502"
        );
        assert_eq!(
            ApiError::status(Endpoint::Token, 429, None).to_string(),
            "token endpoint rate limited"
        );
        let refused = ApiError::Transient {
            endpoint: Endpoint::Service,
            kind: TransientKind::NoAnswer(Transport {
                kind: TransportKind::ConnectionRefused,
                detail: "tcp connect error".into(),
            }),
            retry_after: None,
        };
        assert_eq!(
            refused.operator_cause(),
            "service unreachable: connection refused"
        );
        assert_eq!(
            refused.to_string(),
            "service unreachable: connection refused (connection refused: tcp connect error)"
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
