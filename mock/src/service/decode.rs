/*!
The steps of a decode request around its rules (`crate::decode`): the fault (queued, a
storm's, or standing for one of its MACs) taken out under the lock, the record, the
token check, the answer, and the waits a fault or a slow uplink asks for, outside the
lock.
*/

use std::time::SystemTime;

use bytes::Bytes;
use hyper::http::request::Parts;
use serde_json::Value;

use super::state::{InProgress, Shared};
use crate::answer::{header, Answer, CloseConnection};
use crate::config::MockEnvironment;
use crate::decode::{self, received_items, single_item, Rules};
use crate::fault::{self, Fault, Shaping};
use crate::mac;
use crate::record::{DecodeKind, Received, ReceivedItem};

/// Both decode endpoints: fault, auth, headers, body checks, then the answer.
pub(crate) async fn decode(
    shared: &Shared,
    env: &MockEnvironment,
    kind: DecodeKind,
    path_mac: Option<String>,
    parts: Parts,
    path: String,
    body: Option<Bytes>,
) -> Result<Answer, CloseConnection> {
    let (fault, mut rules) = fault_and_rules(shared, &parts);
    let parsed_body: Option<Value> = match (&body, kind) {
        (Some(b), DecodeKind::Bulk) => serde_json::from_slice(b).ok(),
        _ => None,
    };
    let items = match (kind, &path_mac) {
        (DecodeKind::Single, Some(mac)) => vec![single_item(&parts, mac)],
        _ => parsed_body.as_ref().map(received_items).unwrap_or_default(),
    };
    // Standing faults (per MAC, every answer delayed) and the record of overlaps; the
    // guard keeps this request's MACs in progress until it is answered or dropped.
    let macs = items.iter().map(|i| mac::key(&i.mac_id)).collect();
    let (fault, shaping, _in_progress) = InProgress::enter(shared, macs, fault);
    let mut rec = received(shared.now(), env, kind, &parts, path, items, fault.clone());
    if let Some(outcome) = fault::outcome_now(fault.as_ref()) {
        match &outcome {
            Ok(answer) => rec.status = Some(answer.status().as_u16()),
            Err(CloseConnection) => {
                tracing::debug!(path = %rec.path, "mock fault: closing the connection");
            }
        }
        shared.with(|s| s.record(rec));
        return outcome;
    }
    // A `Delay` is processed now and answered late: a client that gives up first has
    // still had its items decoded, as with a real service whose answer is lost on the
    // way.
    if let Some(Fault::DropItems(n)) = fault {
        rules.drop_items = n;
    }
    rules.shaping = shaping;
    let bearer_ok = shared.with(|s| s.tokens.bearer_ok(env, &parts));
    let answered = decode::answer(
        bearer_ok,
        env,
        &parts,
        &rec,
        body.is_some(),
        parsed_body,
        &rules,
    );
    rec.status = Some(answered.answer.status().as_u16());
    rec.decoded = answered.decoded;
    tracing::debug!(
        path = %rec.path,
        correlation_id = rec.correlation_id.as_deref().unwrap_or(""),
        items = rec.items.len(),
        status = answered.answer.status().as_u16(),
        decoded = answered.decoded,
        "mock answered a decode request"
    );
    shared.with(|s| {
        s.stats.item_errors += answered.item_errors;
        s.record(rec)
    });
    if let Some(Fault::Delay(d)) = fault {
        tokio::time::sleep(d).await;
    }
    if let Some(d) = rules.shaping.delay {
        tokio::time::sleep(d).await;
    }
    Ok(answered.answer)
}

/// Under one lock: the request counted, the next fault (the queue first, else a roll of
/// the storm), and a copy of the settings that shape the answer.
fn fault_and_rules(shared: &Shared, parts: &Parts) -> (Option<Fault>, Rules) {
    shared.with(|s| {
        s.stats.decode_requests += 1;
        let rules = Rules {
            registry: s.registry.clone(),
            wire: s.wire.clone(),
            permission_denied: s.permission_denied,
            echo_token: s
                .echo_token_in_errors
                .then(|| header(parts, "authorization"))
                .flatten(),
            max_items: s.max_items,
            poison: s.poison.clone(),
            drop_items: 0,
            shaping: Shaping::default(),
        };
        (fault::next_fault(&mut s.faults, &mut s.storm), rules)
    })
}

/// The record of a decode request, before its answer.
fn received(
    at: SystemTime,
    env: &MockEnvironment,
    kind: DecodeKind,
    parts: &Parts,
    path: String,
    items: Vec<ReceivedItem>,
    fault: Option<Fault>,
) -> Received {
    Received {
        at,
        kind,
        environment: env.name.clone(),
        path,
        correlation_id: header(parts, "correlation_id"),
        customer_id: header(parts, "customer_id"),
        authorized_groups: header(parts, "authorized_groups"),
        items,
        status: None,
        fault,
        decoded: 0,
    }
}
