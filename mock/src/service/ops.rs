/*!
The steps of an operator request (spec 4.1, 4.2, 4.5, 4.6, 4.7) around the rules of its
endpoint: its route, the steps every one of them takes, and the record of what it
received.

Every operator request goes through the same steps, in this order:
1. a fault queued for its endpoint (`MockHandle::push_operator_fault`): `Close` and
   `Status` answer before anything is applied (a 5xx on a location read is answered
   the way spec 4.1 says the service reports it: 404 `AWB not found`, or `assets: []`
   in sensor mode); `Delay` applies the request and then holds the answer (the service
   did the work, the client's answer is lost);
2. the bearer token (401, not counted in the rate window: the identity is unknown);
3. for label, relabel, show, deactivate and configure, the shared rate window (429 with
   only `message`; every request with a valid token counts, refused ones included, and
   so does a request answered with an injected 401: a token the service has just
   stopped taking);
4. a permission the identity lacks (`MockHandle::set_permission`): 401;
5. the endpoint itself (`parcel`, `labels`, `deactivate`, `configure`, `locations`,
   `history`, `messages`: each given its own piece of the state), under the state's
   lock, then the record.

History is served only under the environment's historical prefix
(`/{env}/historical/`), and nothing else is: a client that mixes up `base_url` and
`historical_base_url` gets 404.
*/

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::Method;
use serde_json::json;

use super::state::{Shared, State};
use crate::answer::{error_answer, header, Answer, CloseConnection};
use crate::config::MockEnvironment;
use crate::devices::Account;
use crate::fault::{outcome_now, Fault};
use crate::history::HISTORICAL_PREFIX;
use crate::record::{Endpoint, OperatorReceived};
use crate::request::{OpRequest, Reply};
use crate::{configure, deactivate, history, labels, locations, messages, parcel};

/// The route of an operator request: environment, endpoint, path argument. `Err` is the
/// answer for a known path with the wrong method.
pub(crate) fn route(
    method: &Method,
    path: &str,
) -> Option<Result<(String, Endpoint, String), Answer>> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (env, endpoint, arg, allowed): (&str, Endpoint, &str, &[Method]) = match segs.as_slice() {
        [env, "devices", "v1", "parcel"] => (env, Endpoint::AddDevice, "", &[Method::POST]),
        [env, "external", "v1", "devices", "label"] => {
            let endpoint = match *method {
                Method::PUT => Endpoint::Relabel,
                Method::GET => Endpoint::ShowLabels,
                _ => Endpoint::Label,
            };
            (env, endpoint, "", &[Method::POST, Method::PUT, Method::GET])
        }
        [env, "external", "v1", "devices", "status"] => {
            (env, Endpoint::Deactivate, "", &[Method::POST])
        }
        [env, "external", "v1", "devices", "config"] => {
            (env, Endpoint::Configure, "", &[Method::POST])
        }
        [env, "external", "locations", asset] if !asset.is_empty() => {
            (env, Endpoint::Locate, asset, &[Method::GET])
        }
        [env, "external", "messages"] => (env, Endpoint::Message, "", &[Method::POST]),
        [env, HISTORICAL_PREFIX, "agent-service", "v1", "agent", "exec", uuid] => {
            (env, Endpoint::History, uuid, &[Method::POST])
        }
        _ => return None,
    };
    if !allowed.contains(method) {
        return Some(Err(error_answer(405, "Method not allowed")));
    }
    let arg = percent_encoding::percent_decode_str(arg)
        .decode_utf8_lossy()
        .into_owned();
    Some(Ok((env.to_string(), endpoint, arg)))
}

/// Serves one operator request (the steps in the module doc); `body` is `None` when
/// it was over the limit.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    env: MockEnvironment,
    endpoint: Endpoint,
    arg: String,
    parts: Parts,
    body: Option<Bytes>,
) -> Result<Answer, CloseConnection> {
    let fault = shared.with(|s| {
        let n = s.ops.arrivals.entry(endpoint).or_default();
        *n += 1;
        let nth = *n;
        s.ops.scheduled.remove(&(endpoint, nth)).or_else(|| {
            s.ops
                .faults
                .get_mut(&endpoint)
                .and_then(VecDeque::pop_front)
        })
    });
    let mut record = received(
        shared.now(),
        &env,
        endpoint,
        &parts,
        body.as_ref(),
        fault.clone(),
    );
    if let Some(outcome) = faulted(&shared, &env, endpoint, &parts, fault.as_ref()) {
        record.status = outcome.as_ref().ok().map(|a| a.status().as_u16());
        shared.with(|s| s.ops.record(record));
        return outcome;
    }
    let reply = if !shared.with(|s| s.tokens.bearer_ok(&env, &parts)) {
        Reply::unauthorized()
    } else {
        match body {
            // Spec section 7: a body over 50 MB is 401.
            None => Reply::unauthorized(),
            Some(body) => shared.with(|s| {
                let req = OpRequest {
                    env: &env,
                    parts: &parts,
                    body: &body,
                    arg: &arg,
                    now: shared.now(),
                };
                serve(s, endpoint, &req)
            }),
        }
    };
    record.status = Some(reply.status);
    shared.with(|s| s.ops.record(record));
    let mut answer = reply.render();
    if endpoint == Endpoint::AddDevice {
        // Spec 4.6: `X-Correlation-Id` is generated when absent; the answer carries it.
        let id = header(&parts, "x-correlation-id")
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("mock-{:016x}", fastrand::u64(..)));
        if let Ok(v) = hyper::header::HeaderValue::from_str(&id) {
            answer.headers_mut().insert("x-correlation-id", v);
        }
    }
    if let Some(Fault::Delay(d)) = fault {
        tokio::time::sleep(d).await;
    }
    Ok(answer)
}

/// Step 1: what a fault does before anything is applied (`None`: nothing, or a
/// `Delay` that holds the answer later).
fn faulted(
    shared: &Shared,
    env: &MockEnvironment,
    endpoint: Endpoint,
    parts: &Parts,
    fault: Option<&Fault>,
) -> Option<Result<Answer, CloseConnection>> {
    if let (Some(Fault::Status { status, .. }), Endpoint::Locate) = (fault, endpoint) {
        if *status >= 500 {
            // Spec 4.1: the service itself reports a temporary fault of the location
            // read as "nothing found" (404 in AWB mode, `assets: []` in sensor mode).
            return Some(Ok(locations::temporary_fault(parts).render()));
        }
    }
    let outcome = outcome_now(fault)?;
    let status = outcome.as_ref().ok().map(|a| a.status().as_u16());
    if status == Some(401) && endpoint.rate_limited() {
        // A token the service has just stopped taking (expired, revoked): whether such
        // a request counts in the window is not shown; counting it is the strict
        // reading.
        shared.with(|s| s.ops.admit(&env.name));
    }
    Some(outcome)
}

/// The record of an operator request, before its answer.
fn received(
    at: SystemTime,
    env: &MockEnvironment,
    endpoint: Endpoint,
    parts: &Parts,
    body: Option<&Bytes>,
    fault: Option<Fault>,
) -> OperatorReceived {
    OperatorReceived {
        at,
        endpoint,
        environment: env.name.clone(),
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts
            .headers
            .iter()
            .filter(|(k, _)| *k != hyper::header::AUTHORIZATION)
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default(),
        status: None,
        fault,
    }
}

/// Steps 3 to 5: the rate window, the permission, then the endpoint, each given its
/// piece of the state.
fn serve(s: &mut State, endpoint: Endpoint, req: &OpRequest<'_>) -> Reply {
    if endpoint.rate_limited() {
        if !s.ops.admit(&req.env.name) {
            return Reply::json(429, &json!({"message": "Too many requests"}));
        }
        if let Err(answer) = token_account(req) {
            return answer;
        }
    }
    if s.ops.denied.contains(&endpoint) {
        // A permission the identity lacks: 401 even with a fresh token (spec 5.7),
        // and it has counted in the window above (spec 8).
        return Reply::unauthorized();
    }
    let account = Account {
        devices: &mut s.ops.devices,
        registry: &mut s.registry,
        readings: s.ops.readings,
    };
    match endpoint {
        Endpoint::AddDevice => parcel::add(account, req),
        Endpoint::Label => labels::label(account, req),
        Endpoint::Relabel => labels::relabel(account, req),
        Endpoint::ShowLabels => labels::show(account, req),
        Endpoint::Deactivate => deactivate::deactivate(account, req),
        Endpoint::Configure => configure::configure(account, req),
        Endpoint::Locate => locations::locate(&s.ops.devices, &s.ops.locations, req),
        Endpoint::History => history::history(&s.ops.history, s.ops.readings, req),
        Endpoint::Message => messages::message(req),
    }
}

/// The optional account choice of the token-account calls (spec 4.7): `customer_id`
/// and `authorized_group` (singular), both or neither, naming an account of the
/// identity (here: the environment's one).
fn token_account(req: &OpRequest<'_>) -> Result<(), Reply> {
    match (req.header("customer_id"), req.header("authorized_group")) {
        (None, None) => Ok(()),
        (Some(c), Some(g)) if c == req.env.customer_id && g == req.env.authorized_groups => Ok(()),
        (Some(_), Some(_)) => Err(Reply::unauthorized()),
        _ => Err(Reply::error(
            400,
            "Missing required headers: customer_id and authorized_group",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(method: Method, path: &str) -> (String, Endpoint, String) {
        match route(&method, path) {
            Some(Ok(r)) => r,
            _ => panic!("{method} {path} not routed"),
        }
    }

    #[test]
    fn the_label_path_is_three_endpoints_by_method() {
        assert_eq!(
            ok(Method::POST, "/ppe/external/v1/devices/label").1,
            Endpoint::Label
        );
        assert_eq!(
            ok(Method::PUT, "/ppe/external/v1/devices/label").1,
            Endpoint::Relabel
        );
        assert_eq!(
            ok(Method::GET, "/ppe/external/v1/devices/label").1,
            Endpoint::ShowLabels
        );
        assert!(matches!(
            route(&Method::DELETE, "/ppe/external/v1/devices/label"),
            Some(Err(_))
        ));
    }

    #[test]
    fn history_is_routed_only_under_the_historical_prefix() {
        let (env, e, uuid) = ok(
            Method::POST,
            "/ppe/historical/agent-service/v1/agent/exec/abc",
        );
        assert_eq!(
            (env.as_str(), e, uuid.as_str()),
            ("ppe", Endpoint::History, "abc")
        );
        assert!(route(&Method::POST, "/ppe/agent-service/v1/agent/exec/abc").is_none());
        assert!(route(&Method::POST, "/ppe/historical/external/messages").is_none());
    }

    #[test]
    fn the_asset_id_of_a_location_read_is_percent_decoded() {
        let (_, e, asset) = ok(Method::GET, "/ppe/external/locations/020%2012345675");
        assert_eq!((e, asset.as_str()), (Endpoint::Locate, "020 12345675"));
    }
}
