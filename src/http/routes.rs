//! What each path answers: `/metrics`, `/healthz`, the status page, and the refusals
//! (a method other than GET and HEAD, an unknown path).

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW};
use hyper::{Method, Request, StatusCode};

use super::answer::{text, Answer, HttpState, PLAIN};
use super::page;
use crate::health;
use crate::metrics;

pub(super) async fn answer(
    state: Arc<HttpState>,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "read-only: GET only\n".into(),
        );
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(resp);
    }
    Ok(match req.uri().path() {
        "/metrics" => scrape(&state).await,
        "/healthz" => match health::verdict(&state.liveness, &state.admission, &state.metrics) {
            Ok(()) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Err(u) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("{}: {}\n", u.stage, u.reason),
            ),
        },
        "/" => page::render(&state).await,
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /, /metrics or /healthz\n".into(),
        ),
    })
}

async fn scrape(state: &HttpState) -> Answer {
    let stats = match state.outbox.stats().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "/metrics: cannot read the state database");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("cannot read the state database: {e}\n"),
            );
        }
    };
    match state.metrics.encode(&stats, state.clock.wall_ms()) {
        Ok(body) => text(StatusCode::OK, metrics::CONTENT_TYPE, body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            PLAIN,
            "cannot encode the metrics\n".into(),
        ),
    }
}
