/*!
The password grant (spec 5.3, 5.4): the form sent to the token endpoint, the token
answer read (an `access_token` a header can carry, `expires_in` clamped to a sane
lifetime) and what a refusal or a failure means. It may touch the client's settings,
the token cache's bounds (`auth.rs`) and the metrics' grant count.
*/

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderValue, ACCEPT};
use serde_json::Value;

use super::auth::{self, Grant};
use super::{read_capped, ApiError, Endpoint, ServiceClient, TransientKind, MAX_ERROR_BYTES};
use crate::util::secret::Secret;

/// Used when the token answer has no usable `expires_in` (the spec requires it).
const FALLBACK_TOKEN_LIFETIME: Duration = Duration::from_secs(300);

impl ServiceClient {
    /// One password grant (spec 5.3, 5.4).
    pub(super) async fn grant(&self) -> Result<Grant, ApiError> {
        let e = &self.inner.endpoint;
        let form = [
            ("grant_type", "password"),
            ("username", e.username.as_str()),
            ("password", e.password.expose()),
            ("client_id", e.client_id.as_str()),
            ("audience", e.audience.as_str()),
        ];
        let transport = |err: reqwest::Error| ApiError::from_transport(&err, Endpoint::Token);
        let resp = self
            .inner
            .http
            .post(e.auth_url.clone())
            .header(ACCEPT, "application/json")
            .form(&form)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status();
        let retry_after = self.retry_after_of(&resp);
        if let Some(server) = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
        {
            let skew = match server.duration_since(self.now()) {
                Ok(ahead) => ahead.as_secs() as i64,
                Err(behind) => -(behind.duration().as_secs() as i64),
            };
            if let Ok(mut g) = self.inner.clock_skew.lock() {
                *g = Some(skew);
            }
        }
        let body = read_capped(resp, MAX_ERROR_BYTES)
            .await
            .map_err(transport)?
            .unwrap_or_else(|| Bytes::from_static(b"(body too large)"));
        let code = status.as_u16();
        if status.is_success() {
            // A success that is no token is the token endpoint's trouble, never the
            // service's answer to a batch.
            let grant = parse_token_answer(&body).map_err(|e| match e {
                ApiError::BadAnswer(m) => ApiError::Transient {
                    endpoint: Endpoint::Token,
                    kind: TransientKind::Unreadable(m),
                    retry_after: None,
                },
                other => other,
            })?;
            if let Some(m) = &self.metrics {
                m.token_granted();
            }
            tracing::debug!(
                environment = %self.inner.environment,
                expires_in_secs = grant.expires_in.as_secs(),
                "token granted"
            );
            return Ok(grant);
        }
        match code {
            429 | 500..=599 => Err(ApiError::status(Endpoint::Token, code, retry_after)),
            _ => Err(ApiError::AuthRejected {
                status: code,
                message: auth::refusal(&body, e.password.expose()),
            }),
        }
    }
}

/// Reads the token answer: `access_token` required (and able to travel in a header),
/// `expires_in` as a number (or a numeric string) clamped to a sane lifetime,
/// `token_type` expected to be Bearer.
fn parse_token_answer(body: &[u8]) -> Result<Grant, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadAnswer(format!("token answer is not JSON: {e}")))?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::BadAnswer("token answer has no access_token".into()))?;
    // A token that cannot go into `Authorization` would fail every request for its whole
    // life; refused here, it is not cached and the grant backs off like any failure.
    if HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
        return Err(ApiError::BadAnswer(
            "token answer's access_token holds characters an HTTP header cannot carry".into(),
        ));
    }
    if let Some(t) = v.get("token_type").and_then(Value::as_str) {
        if !t.eq_ignore_ascii_case("bearer") {
            tracing::warn!(
                token_type = t,
                "token endpoint granted a non-Bearer token; using it as Bearer"
            );
        }
    }
    let secs = match v.get("expires_in") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let expires_in = match secs.and_then(auth::clamp_lifetime) {
        Some(d) => {
            if secs != Some(d.as_secs_f64()) {
                tracing::warn!(
                    expires_in = secs.unwrap_or_default(),
                    used_secs = d.as_secs(),
                    "token answer's expires_in is out of range; using the nearest sane lifetime"
                );
            }
            d
        }
        None => {
            tracing::warn!(
                fallback_secs = FALLBACK_TOKEN_LIFETIME.as_secs(),
                "token answer has no usable expires_in"
            );
            FALLBACK_TOKEN_LIFETIME
        }
    };
    Ok(Grant {
        token: Secret::new(token),
        expires_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answer_needs_an_access_token_and_reads_expires_in() {
        let g =
            parse_token_answer(br#"{"access_token":"t","token_type":"Bearer","expires_in":86400}"#)
                .unwrap();
        assert_eq!(g.token.expose(), "t");
        assert_eq!(g.expires_in, Duration::from_secs(86400));
        let g = parse_token_answer(br#"{"access_token":"t","expires_in":"60"}"#).unwrap();
        assert_eq!(g.expires_in, Duration::from_secs(60));
        let g = parse_token_answer(br#"{"access_token":"t"}"#).unwrap();
        assert_eq!(g.expires_in, FALLBACK_TOKEN_LIFETIME);
        assert!(matches!(
            parse_token_answer(br#"{"token_type":"Bearer"}"#),
            Err(ApiError::BadAnswer(_))
        ));
        assert!(matches!(
            parse_token_answer(b"nope"),
            Err(ApiError::BadAnswer(_))
        ));
    }

    #[test]
    fn a_hostile_expires_in_is_clamped_not_a_panic() {
        for (body, want) in [
            (
                r#"{"access_token":"t","expires_in":1e19}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":1e20}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":"1e400"}"#,
                auth::MAX_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":-5}"#,
                auth::MIN_LIFETIME,
            ),
            (
                r#"{"access_token":"t","expires_in":"NaN"}"#,
                FALLBACK_TOKEN_LIFETIME,
            ),
        ] {
            assert_eq!(
                parse_token_answer(body.as_bytes()).unwrap().expires_in,
                want,
                "{body}"
            );
        }
    }

    #[test]
    fn a_token_a_header_cannot_carry_is_refused_without_echoing_it() {
        let err =
            parse_token_answer(br#"{"access_token":"abc\ndef","expires_in":60}"#).unwrap_err();
        assert!(matches!(err, ApiError::BadAnswer(_)), "{err:?}");
        assert!(!err.to_string().contains("abc"), "{err}");
    }
}
