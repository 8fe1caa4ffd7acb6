/*!
The token endpoint (spec section 5): the password grant of one environment, every
field checked, with Auth0-like errors; and the bearer check that every other endpoint
makes with the tokens it granted.
*/

use std::collections::HashMap;
use std::time::Duration;

use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL};
use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::service::{header, json_answer, status_of, Answer, Shared};
use super::{MockEnvironment, MockHandle};

/// A granted token: the environment it is good for, until when.
pub(super) struct IssuedToken {
    pub(super) env: String,
    pub(super) expires_at: Instant,
}

pub(super) fn oauth_error(code: u16, error: &str, description: &str) -> Answer {
    json_answer(
        status_of(code),
        &json!({"error": error, "error_description": description}),
    )
}

/// The password grant of one environment (spec section 5), Auth0-like errors.
pub(super) fn token(shared: &Shared, env: &MockEnvironment, parts: &Parts, body: &[u8]) -> Answer {
    shared.with(|s| s.stats.token_requests += 1);
    let form_encoded = header(parts, "content-type").is_some_and(|c| {
        c.to_ascii_lowercase()
            .starts_with("application/x-www-form-urlencoded")
    });
    if !form_encoded {
        return oauth_error(
            400,
            "invalid_request",
            "Content-Type must be application/x-www-form-urlencoded",
        );
    }
    let form: HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    if shared.with(|s| s.echo_grant_refusals) {
        return json_answer(
            status_of(401),
            &json!({
                "error": "invalid_grant",
                "error_description": format!("Wrong email or password in {}", String::from_utf8_lossy(body)),
                "message": "refused",
                "request": form,
            }),
        );
    }
    let field = |k: &str| form.get(k).map(String::as_str).filter(|v| !v.is_empty());
    for k in [
        "grant_type",
        "username",
        "password",
        "client_id",
        "audience",
    ] {
        if field(k).is_none() {
            return oauth_error(
                400,
                "invalid_request",
                &format!("Missing required parameter: {k}"),
            );
        }
    }
    if field("grant_type") != Some("password") {
        return oauth_error(
            400,
            "unsupported_grant_type",
            "Unsupported grant type; use password",
        );
    }
    if field("client_id") != Some(env.client_id.as_str()) {
        return oauth_error(403, "access_denied", "Unknown or unauthorized client");
    }
    if let Some(aud) = field("audience").filter(|a| *a != env.audience) {
        return oauth_error(403, "access_denied", &format!("Service not found: {aud}"));
    }
    if field("username") != Some(env.username.as_str())
        || field("password") != Some(env.password.expose())
    {
        return oauth_error(401, "invalid_grant", "Wrong email or password.");
    }
    let generated = format!(
        "mock-{}-{}",
        env.name,
        (0..40)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>()
    );
    let now = Instant::now();
    let (token, expires_in) = shared.with(|s| {
        let token = s.token_text.clone().unwrap_or(generated);
        let answered = s
            .answered_expires_in
            .clone()
            .unwrap_or_else(|| json!(env.expires_in));
        s.tokens.retain(|_, t| t.expires_at > now);
        s.tokens.insert(
            token.clone(),
            IssuedToken {
                env: env.name.clone(),
                expires_at: now + Duration::from_secs(env.expires_in),
            },
        );
        s.stats.token_grants += 1;
        (token, answered)
    });
    let mut resp = json_answer(
        StatusCode::OK,
        &json!({"access_token": token, "token_type": "Bearer", "expires_in": expires_in}),
    );
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Whether the request carries a bearer token granted for `env` and not yet expired.
pub(super) fn bearer_ok(shared: &Shared, env: &MockEnvironment, parts: &Parts) -> bool {
    header(parts, AUTHORIZATION.as_str())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        })
        .is_some_and(|token| {
            let now = Instant::now();
            shared.with(|s| {
                s.tokens
                    .get(&token)
                    .is_some_and(|t| t.env == env.name && t.expires_at > now)
            })
        })
}

impl MockHandle {
    /// Lifetime of tokens granted from now on in `env`; `false` if there is no such
    /// environment.
    pub fn set_expires_in(&self, env: &str, secs: u64) -> bool {
        self.shared
            .with(|s| match s.envs.iter_mut().find(|e| e.name == env) {
                Some(e) => {
                    e.expires_in = secs;
                    true
                }
                None => false,
            })
    }

    /// What token answers say in `expires_in` from now on: any JSON (1e20, -5, "soon").
    /// Granted tokens stay valid for the environment's own lifetime; `None` restores it.
    pub fn set_answered_expires_in(&self, value: Option<serde_json::Value>) {
        self.shared.with(|s| s.answered_expires_in = value);
    }

    /// The `access_token` text of every grant from now on (such as one holding a line
    /// break, which no header can carry); `None` restores generated tokens.
    pub fn set_token_text(&self, token: Option<String>) {
        self.shared.with(|s| s.token_text = token);
    }

    /// Whether the token endpoint refuses every grant quoting the request it refuses
    /// (the form as sent, password included, and as JSON).
    pub fn set_echo_grant_refusals(&self, on: bool) {
        self.shared.with(|s| s.echo_grant_refusals = on);
    }

    /// Every granted token becomes invalid (the next decode gets 401).
    pub fn revoke_all_tokens(&self) {
        self.shared.with(|s| s.tokens.clear());
    }

    /// Tokens granted for `env` that the service would still take now: a test waits
    /// for this to reach 0 instead of sleeping through a token's lifetime.
    pub fn live_tokens(&self, env: &str) -> usize {
        let now = Instant::now();
        self.shared.with(|s| {
            s.tokens
                .values()
                .filter(|t| t.env == env && t.expires_at > now)
                .count()
        })
    }
}
