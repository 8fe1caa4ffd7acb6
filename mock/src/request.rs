/*!
An operator request as the parts of the spec see it ([`OpRequest`]: the environment, the
request's head and body, the path argument, the time) and their answer before it is
rendered ([`Reply`]). A leaf below the parts: it touches only the answer helpers and the
environment's type.
*/

use std::time::SystemTime;

use hyper::http::request::Parts;
use serde_json::{json, Value};

use super::answer::{header, json_answer, status_of, Answer};
use super::config::MockEnvironment;

/// An endpoint's answer before it is rendered: small enough to travel in a `Result`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Self {
        Reply {
            status,
            body: body.clone(),
        }
    }

    /// The spec's error body `{message, code}`.
    pub fn error(code: u16, message: &str) -> Self {
        Reply {
            status: code,
            body: json!({"message": message, "code": code}),
        }
    }

    pub fn unauthorized() -> Self {
        Reply::error(401, "Unauthorized access")
    }

    pub fn render(&self) -> Answer {
        json_answer(status_of(self.status), &self.body)
    }
}

/// A request as the endpoints see it.
pub(crate) struct OpRequest<'a> {
    pub env: &'a MockEnvironment,
    pub parts: &'a Parts,
    pub body: &'a [u8],
    /// The path argument: the asset id of a location read, the uuid of history.
    pub arg: &'a str,
    pub now: SystemTime,
}

impl OpRequest<'_> {
    /// The body as JSON; a body that is not JSON is 401 (spec section 7).
    pub fn json_body(&self) -> Result<Value, Reply> {
        serde_json::from_slice(self.body).map_err(|_| Reply::unauthorized())
    }

    pub fn query_pairs(&self) -> Vec<(String, String)> {
        self.parts
            .uri
            .query()
            .map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .into_owned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header(self.parts, name).filter(|v| !v.is_empty())
    }

    /// Whether `customer_id` and `authorized_groups` (plural) are both present.
    pub fn has_account_headers(&self) -> bool {
        self.header("customer_id").is_some() && self.header("authorized_groups").is_some()
    }

    /// 400 unless `customer_id` and `authorized_groups` are present (spec 4.1).
    pub fn account_headers(&self) -> Result<(), Reply> {
        if self.has_account_headers() {
            Ok(())
        } else {
            Err(Reply::error(400, MISSING_HEADERS))
        }
    }

    /// Whether the account headers name this environment's account: another account
    /// holds nothing of this one's.
    pub fn is_account(&self) -> bool {
        self.header("customer_id").as_deref() == Some(self.env.customer_id.as_str())
            && self.header("authorized_groups").as_deref()
                == Some(self.env.authorized_groups.as_str())
    }
}

/// The message of a 400 for missing account headers (spec 4.1).
pub(crate) const MISSING_HEADERS: &str =
    "Missing required headers: customer_id or authorized_groups";

/// 400 `Validation failed` with its `errors` (spec section 7): nothing was changed.
pub(crate) fn validation_failed(errors: Vec<Value>) -> Reply {
    Reply::json(
        400,
        &json!({"message": "Validation failed", "code": 400, "errors": errors}),
    )
}
