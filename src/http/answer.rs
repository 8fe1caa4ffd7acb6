//! The server's shared vocabulary, a leaf under the routes, the page and the server: the
//! state every answer reads, and how an answer is made (with the headers every answer
//! carries).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use hyper::{Response, StatusCode};

use crate::health;
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::Reader;
use crate::source::SourceHealth;
use crate::util::systemd::Liveness;

/// What the server reads to answer; shared by every connection.
pub struct HttpState {
    pub gateway_id: String,
    /// The source `[scanner]` names, for the page (`ble`, `replay`, `sim`).
    pub source: String,
    /// The outbox's readers' handle (the flusher's state from memory).
    pub outbox: Reader,
    pub liveness: Liveness,
    /// Whether captures can be committed (the ingest stage's word).
    pub admission: Arc<health::Admission>,
    pub metrics: Arc<Metrics>,
    pub heard: Arc<HeardNow>,
    pub source_health: Arc<SourceHealth>,
    /// The daemon's clock (ages on the page, capture ages in `/metrics`).
    pub clock: crate::clock::SharedClock,
}

/// What every answer says about itself: nothing on the page may run a script, load
/// anything or be framed (its style is inline), and no answer is to be sniffed as
/// another type than it says.
const CONTENT_SECURITY_POLICY_VALUE: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

pub(super) type Answer = Response<Full<Bytes>>;

pub(super) fn text(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

pub(super) const PLAIN: &str = "text/plain; charset=utf-8";
