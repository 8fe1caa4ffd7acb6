/*!
The router and the shared state, in one place: each request is routed to its part of
the spec (`token`, `decode`, the operator endpoints), with the steps every request of
that kind takes (decode's, and the operator endpoints': the fault, the token, the
record) around the part's rules, over the state every part shares. The parts of the spec
import nothing from here; this is the one room that imports them all.
*/

mod decode;
mod ops;
mod state;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Request};

pub(crate) use state::Shared;

use crate::answer::{error_answer, Answer, CloseConnection};
use crate::config::MockEnvironment;
use crate::fault;
use crate::record::DecodeKind;
use crate::token;

/// Bodies over this get 401 (spec section 7: "body over 50 MB").
const MAX_BODY_BYTES: usize = 50 * 1024 * 1024;

/// Decodes `%XX` escapes of a path segment (other bytes as they are).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

enum Route {
    Token(String),
    Bulk(String),
    Single(String, String),
}

fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        [env, "oauth", "token"] => Some(Route::Token(env.to_string())),
        [env, "external", "v1", "devices", "decode"] => Some(Route::Bulk(env.to_string())),
        [env, "external", "v1", "devices", mac, "decode"] => {
            Some(Route::Single(env.to_string(), percent_decode(mac)))
        }
        _ => None,
    }
}

/// The body, or `None` when it is over [`MAX_BODY_BYTES`]; `Err` when it cannot be
/// read (the connection is closed).
async fn read_body(body: Incoming) -> Result<Option<Bytes>, CloseConnection> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(Some(collected.to_bytes())),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Ok(None),
        Err(err) => {
            tracing::debug!(error = %err, "mock could not read a request body");
            Err(CloseConnection)
        }
    }
}

/// The hyper service: one request in, one answer out (or the connection closed).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Answer, CloseConnection> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if let Some(op) = ops::route(&parts.method, &path) {
        let (env_name, endpoint, arg) = match op {
            Ok(r) => r,
            Err(answer) => return Ok(answer),
        };
        let Some(env) = shared.environment(&env_name) else {
            return Ok(error_answer(404, "Not found"));
        };
        let body = read_body(body).await?;
        return ops::handle(shared, env, endpoint, arg, parts, body).await;
    }
    let Some(route) = route(&path) else {
        return Ok(error_answer(404, "Not found"));
    };
    let env_name = match &route {
        Route::Token(e) | Route::Bulk(e) | Route::Single(e, _) => e.clone(),
    };
    let Some(env) = shared.environment(&env_name) else {
        return Ok(error_answer(404, "Not found"));
    };
    if parts.method != Method::POST {
        return Ok(error_answer(405, "Method not allowed"));
    }
    let body = read_body(body).await?;
    match route {
        Route::Token(_) => {
            let fault = shared.with(|s| s.ops.token_faults.pop_front());
            if let Some(outcome) = fault::outcome_now(fault.as_ref()) {
                shared.with(|s| s.stats.token_requests += 1);
                return outcome;
            }
            Ok(token_answer(&shared, &env, &parts, body))
        }
        Route::Bulk(_) => {
            decode::decode(&shared, &env, DecodeKind::Bulk, None, parts, path, body).await
        }
        Route::Single(_, mac) => {
            let kind = DecodeKind::Single;
            decode::decode(&shared, &env, kind, Some(mac), parts, path, body).await
        }
    }
}

fn token_answer(
    shared: &Shared,
    env: &MockEnvironment,
    parts: &Parts,
    body: Option<Bytes>,
) -> Answer {
    match body {
        Some(body) => shared.with(|s| s.tokens.grant(&mut s.stats, env, parts, &body)),
        None => token::oauth_error(413, "invalid_request", "Request body too large"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_the_environment_and_the_endpoint() {
        assert!(matches!(route("/ppe/oauth/token"), Some(Route::Token(e)) if e == "ppe"));
        assert!(
            matches!(route("/ppe/external/v1/devices/decode"), Some(Route::Bulk(e)) if e == "ppe")
        );
        assert!(matches!(
            route("/prod/external/v1/devices/AA%3ABB%3ACC%3ADD%3AEE%3AFF/decode"),
            Some(Route::Single(e, m)) if e == "prod" && m == "AA:BB:CC:DD:EE:FF"
        ));
        assert!(route("/ppe/external/v1/devices").is_none());
        assert!(route("/").is_none());
    }

    #[test]
    fn percent_decoding_leaves_broken_escapes_alone() {
        assert_eq!(percent_decode("a%3Ab"), "a:b");
        assert_eq!(percent_decode("a%3"), "a%3");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
