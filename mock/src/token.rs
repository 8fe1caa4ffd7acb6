/*!
The token endpoint (spec section 5): the password grant of one environment, every
field checked, with Auth0-like errors; and the bearer check that every other endpoint
makes with the tokens it granted ([`Tokens`]). It touches the answer helpers, the
environment's type and the counters.
*/

use std::collections::HashMap;
use std::time::Duration;

use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL};
use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::answer::{header, json_answer, status_of, Answer};
use super::config::MockEnvironment;
use super::record::MockStats;

/// A granted token: the environment it is good for, until when.
struct IssuedToken {
    env: String,
    expires_at: Instant,
}

/// The tokens granted, and how the token endpoint misbehaves when a test asks.
#[derive(Default)]
pub(crate) struct Tokens {
    issued: HashMap<String, IssuedToken>,
    /// What the token answer says in `expires_in` instead of the environment's lifetime
    /// (any JSON, such as 1e20); the tokens stay valid for the environment's lifetime.
    pub answered_expires_in: Option<Value>,
    /// The `access_token` text granted instead of a generated one.
    pub text: Option<String>,
    /// The token endpoint refuses every grant, quoting the request it refuses (the
    /// form, as sent and as JSON): a careless server or proxy.
    pub echo_grant_refusals: bool,
}

pub(crate) fn oauth_error(code: u16, error: &str, description: &str) -> Answer {
    json_answer(
        status_of(code),
        &json!({"error": error, "error_description": description}),
    )
}

impl Tokens {
    /// The password grant of one environment (spec section 5), Auth0-like errors.
    pub fn grant(
        &mut self,
        stats: &mut MockStats,
        env: &MockEnvironment,
        parts: &Parts,
        body: &[u8],
    ) -> Answer {
        stats.token_requests += 1;
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
        let form: HashMap<String, String> =
            url::form_urlencoded::parse(body).into_owned().collect();
        if self.echo_grant_refusals {
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
        if let Some(refused) = refusal(&form, env) {
            return refused;
        }
        let (token, expires_in) = self.issue(env);
        stats.token_grants += 1;
        let mut resp = json_answer(
            StatusCode::OK,
            &json!({"access_token": token, "token_type": "Bearer", "expires_in": expires_in}),
        );
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }

    /// A new token for `env` (expired ones forgotten), and the `expires_in` answered.
    fn issue(&mut self, env: &MockEnvironment) -> (String, Value) {
        let generated = format!(
            "mock-{}-{}",
            env.name,
            (0..40)
                .map(|_| fastrand::alphanumeric())
                .collect::<String>()
        );
        let now = Instant::now();
        let token = self.text.clone().unwrap_or(generated);
        let answered = self
            .answered_expires_in
            .clone()
            .unwrap_or_else(|| json!(env.expires_in));
        self.issued.retain(|_, t| t.expires_at > now);
        self.issued.insert(
            token.clone(),
            IssuedToken {
                env: env.name.clone(),
                expires_at: now + Duration::from_secs(env.expires_in),
            },
        );
        (token, answered)
    }

    /// Whether the request carries a bearer token granted for `env` and not yet expired.
    pub fn bearer_ok(&self, env: &MockEnvironment, parts: &Parts) -> bool {
        let now = Instant::now();
        header(parts, AUTHORIZATION.as_str())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| token.trim().to_string())
            })
            .is_some_and(|token| {
                self.issued
                    .get(&token)
                    .is_some_and(|t| t.env == env.name && t.expires_at > now)
            })
    }

    /// Every granted token becomes invalid.
    pub fn revoke_all(&mut self) {
        self.issued.clear();
    }

    /// Tokens granted for `env` that the service would still take now.
    pub fn live(&self, env: &str) -> usize {
        let now = Instant::now();
        self.issued
            .values()
            .filter(|t| t.env == env && t.expires_at > now)
            .count()
    }
}

/// The refusal of a grant whose fields are wrong (spec 5.3, checked in the order Auth0
/// does), or `None`.
fn refusal(form: &HashMap<String, String>, env: &MockEnvironment) -> Option<Answer> {
    let field = |k: &str| form.get(k).map(String::as_str).filter(|v| !v.is_empty());
    for k in [
        "grant_type",
        "username",
        "password",
        "client_id",
        "audience",
    ] {
        if field(k).is_none() {
            return Some(oauth_error(
                400,
                "invalid_request",
                &format!("Missing required parameter: {k}"),
            ));
        }
    }
    if field("grant_type") != Some("password") {
        return Some(oauth_error(
            400,
            "unsupported_grant_type",
            "Unsupported grant type; use password",
        ));
    }
    if field("client_id") != Some(env.client_id.as_str()) {
        return Some(oauth_error(
            403,
            "access_denied",
            "Unknown or unauthorized client",
        ));
    }
    if let Some(aud) = field("audience").filter(|a| *a != env.audience) {
        return Some(oauth_error(
            403,
            "access_denied",
            &format!("Service not found: {aud}"),
        ));
    }
    if field("username") != Some(env.username.as_str())
        || field("password") != Some(env.password.as_str())
    {
        return Some(oauth_error(
            401,
            "invalid_grant",
            "Wrong email or password.",
        ));
    }
    None
}
