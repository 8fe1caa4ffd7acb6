/*!
The HTTP answers every part of the mock gives: a JSON body with its status, the spec's
error body `{message, code}` (section 7), the validation failure with its `errors`, the
401, and the closed connection of a fault. A leaf: it touches only hyper.
*/

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

pub(crate) type Answer = Response<Full<Bytes>>;

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
pub(crate) struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed on purpose (fault injection)")
    }
}

impl std::error::Error for CloseConnection {}

pub(crate) fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn status_of(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The spec's error body `{message, code}`.
pub(crate) fn error_answer(code: u16, message: &str) -> Answer {
    json_answer(status_of(code), &json!({"message": message, "code": code}))
}

/// The spec's validation failure (section 7): `Validation failed`, code 400, and one
/// entry in `errors` per problem.
pub(crate) fn validation_failed(errors: &[String]) -> Answer {
    json_answer(
        StatusCode::BAD_REQUEST,
        &json!({"message": "Validation failed", "code": 400, "errors": errors}),
    )
}

pub(crate) fn unauthorized() -> Answer {
    error_answer(401, "Unauthorized access")
}

pub(crate) fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
