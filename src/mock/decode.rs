/*!
The decode endpoints: bulk (spec 4.4) and single (4.3). A request is checked in the
order the mock's module doc lists (fault, bearer token, headers, body, items), then each
item is answered on its own from the packet it carries.
*/

use std::collections::HashMap;
use std::time::SystemTime;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{Map, Value};

use super::fault::{self, Fault};
use super::packet::decode_packet;
use super::service::{
    error_answer, header, json_answer, mac_key, unauthorized, validation_failed, Answer,
    CloseConnection, Shared,
};
use super::token::bearer_ok;
use super::{DecodeKind, MockEnvironment, Received, ReceivedItem, Registry, WireRules, FW_VER};
use crate::config::MacFormat;
use crate::record::Mac;
use crate::tape::TapeReading;

const NOT_FOUND_ITEM: &str = "device not found or not associated with the customer";
const INVALID_PACKET_ITEM: &str = "invalid ble_packet";
const MAC_FORMAT_ITEM: &str = "invalid mac_id format";
const PACKET_ENCODING_ITEM: &str = "invalid ble_packet encoding";
const PRODUCT_ITEM: &str = "unknown product_id";
const REQUIRED_FIELDS: [&str; 4] = ["mac_id", "ble_packet", "product_id", "scan_time"];

/// The MAC of a `mac_id` written in `format` exactly: `AABBCCDDEEFF` or
/// `AA:BB:CC:DD:EE:FF`, upper case.
fn parse_mac_id(mac_id: &str, format: MacFormat) -> Option<Mac> {
    let upper_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    };
    let shaped = match format {
        MacFormat::Plain => mac_id.len() == 12 && upper_hex(mac_id),
        MacFormat::Colon => {
            mac_id.len() == 17
                && mac_id.split(':').count() == 6
                && mac_id.split(':').all(|o| o.len() == 2 && upper_hex(o))
        }
    };
    shaped.then(|| mac_id.parse().ok()).flatten()
}

/// Whether the item is in a form `wire` accepts; the item error when not.
fn check_wire(item: &ReceivedItem, wire: &WireRules) -> Result<Mac, &'static str> {
    let mac = wire
        .mac_formats
        .iter()
        .find_map(|f| parse_mac_id(&item.mac_id, *f))
        .ok_or(MAC_FORMAT_ITEM)?;
    let upper_hex = item
        .ble_packet
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
    if !upper_hex && !wire.any_packet_encoding {
        return Err(PACKET_ENCODING_ITEM);
    }
    if !wire.product_ids.is_empty() && !wire.product_ids.contains(&item.product_id) {
        return Err(PRODUCT_ITEM);
    }
    Ok(mac)
}

/// The items of a bulk body, leniently, for the record.
fn received_items(body: &Value) -> Vec<ReceivedItem> {
    let Value::Array(items) = body else {
        return Vec::new();
    };
    let field = |item: &Value, k: &str| match item.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    items
        .iter()
        .map(|i| ReceivedItem {
            mac_id: field(i, "mac_id"),
            ble_packet: field(i, "ble_packet"),
            product_id: field(i, "product_id"),
            scan_time: field(i, "scan_time"),
        })
        .collect()
}

/// What one packet decodes to, or the item error text.
fn decode_item(
    item: &ReceivedItem,
    associated: bool,
    rules: &Rules,
) -> Result<(Mac, TapeReading, Value), &'static str> {
    let mac = check_wire(item, &rules.wire)?;
    if !associated || !rules.registry.is_registered(&mac.plain()) {
        return Err(NOT_FOUND_ITEM);
    }
    let payload = decode_packet(&item.ble_packet).ok_or(INVALID_PACKET_ITEM)?;
    let ts = scan_time_number(&item.scan_time).ok_or("invalid scan_time")?;
    Ok((mac, payload, ts))
}

/// `scan_time` as a JSON number (integer when it is one).
fn scan_time_number(s: &str) -> Option<Value> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Some(Value::from(n));
    }
    let f = s
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)?;
    serde_json::Number::from_f64(f).map(Value::Number)
}

/// The decoded packet. `full`: every field of spec 2.3 (single decode); otherwise the
/// fields the bulk answer lists.
fn decoded_fields(mac: Mac, p: &TapeReading, ts: Value, full: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("qr_code".into(), Value::from(format!("TT{}", mac.plain())));
    m.insert("cts".into(), Value::from(p.counter));
    m.insert("ts".into(), ts);
    m.insert("bat".into(), Value::from(p.battery));
    m.insert("temp".into(), Value::from(p.temp_c()));
    if full {
        for k in ["over_temp", "over_temp_ts", "shock", "shock_ts"] {
            m.insert(k.into(), Value::from(0));
        }
        m.insert("shock_count".into(), Value::from(p.shock_count));
        m.insert("fw_ver".into(), Value::from(FW_VER));
    }
    m
}
/// Both decode endpoints: fault, auth, headers, body checks, then the answer.
pub(super) async fn decode(
    shared: &Shared,
    env: &MockEnvironment,
    kind: DecodeKind,
    path_mac: Option<String>,
    parts: Parts,
    path: String,
    body: Option<Bytes>,
) -> Result<Answer, CloseConnection> {
    let (fault, rules) = shared.with(|s| {
        s.stats.decode_requests += 1;
        let rules = Rules {
            registry: s.registry.clone(),
            wire: s.wire.clone(),
            permission_denied: s.permission_denied,
            echo_token: s
                .echo_token_in_errors
                .then(|| header(&parts, "authorization"))
                .flatten(),
            max_items: s.max_items,
            poison: s.poison.clone(),
            drop_items: 0,
            shaping: fault::Shaping::default(),
        };
        (s.next_fault(), rules)
    });
    let mut rules = rules;
    let parsed_body: Option<Value> = match (&body, kind) {
        (Some(b), DecodeKind::Bulk) => serde_json::from_slice(b).ok(),
        _ => None,
    };
    let items = match (kind, &path_mac) {
        (DecodeKind::Single, Some(mac)) => vec![ReceivedItem {
            mac_id: mac.clone(),
            ble_packet: header(&parts, "ble_packet").unwrap_or_default(),
            product_id: header(&parts, "product_id").unwrap_or_default(),
            scan_time: header(&parts, "scan_time").unwrap_or_default(),
        }],
        _ => parsed_body.as_ref().map(received_items).unwrap_or_default(),
    };
    // Standing faults (per MAC, every answer delayed) and the record of overlaps; the
    // guard keeps this request's MACs in progress until it is answered or dropped.
    let (fault, shaping, _in_progress) = fault::standing(shared, &items, fault);
    let mut rec = Received {
        at: SystemTime::now(),
        kind,
        environment: env.name.clone(),
        path,
        correlation_id: header(&parts, "correlation_id"),
        customer_id: header(&parts, "customer_id"),
        authorized_groups: header(&parts, "authorized_groups"),
        items,
        status: None,
        fault: fault.clone(),
        decoded: 0,
    };
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

    let (answer, decoded) = answer_decode(
        shared,
        env,
        &parts,
        &rec,
        body.is_some(),
        parsed_body,
        &rules,
    );
    rec.status = Some(answer.status().as_u16());
    rec.decoded = decoded;
    tracing::debug!(
        path = %rec.path,
        correlation_id = rec.correlation_id.as_deref().unwrap_or(""),
        items = rec.items.len(),
        status = answer.status().as_u16(),
        decoded,
        "mock answered a decode request"
    );
    shared.with(|s| s.record(rec));
    if let Some(Fault::Delay(d)) = fault {
        tokio::time::sleep(d).await;
    }
    if let Some(d) = rules.shaping.delay {
        tokio::time::sleep(d).await;
    }
    Ok(answer)
}

/// The per-request copy of the runtime settings that shape a decode answer.
struct Rules {
    registry: Registry,
    wire: WireRules,
    /// The identity lacks the permission: 401 whatever the token.
    permission_denied: bool,
    /// The `Authorization` header, quoted in every item error (a careless server).
    echo_token: Option<String>,
    max_items: usize,
    /// Plain form of the poison MAC.
    poison: Option<String>,
    /// Items to leave out of a bulk answer (`Fault::DropItems`).
    drop_items: usize,
    /// Standing faults that shape the answer.
    shaping: fault::Shaping,
}

/// The answer to a decode request without fault, and how many items it decoded.
fn answer_decode(
    shared: &Shared,
    env: &MockEnvironment,
    parts: &Parts,
    rec: &Received,
    body_in_limit: bool,
    parsed_body: Option<Value>,
    rules: &Rules,
) -> (Answer, usize) {
    let token_ok = bearer_ok(shared, env, parts) && !rules.permission_denied;
    if !token_ok || !body_in_limit {
        return (unauthorized(), 0);
    }
    let non_empty = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
    if !non_empty(&rec.customer_id) || !non_empty(&rec.authorized_groups) {
        return (
            error_answer(
                400,
                "Missing required headers: customer_id or authorized_groups",
            ),
            0,
        );
    }
    let associated = rec.customer_id.as_deref() == Some(env.customer_id.as_str())
        && rec.authorized_groups.as_deref() == Some(env.authorized_groups.as_str());
    let json_body = header(parts, "content-type")
        .is_some_and(|c| c.to_ascii_lowercase().starts_with("application/json"));
    if rec.kind == DecodeKind::Bulk && !json_body {
        return (
            error_answer(400, "Content-Type must be application/json"),
            0,
        );
    }
    match rec.kind {
        DecodeKind::Single => answer_single(parts, rec, associated, rules),
        DecodeKind::Bulk => answer_bulk(shared, parsed_body, associated, rules),
    }
}

fn answer_single(
    parts: &Parts,
    rec: &Received,
    associated: bool,
    rules: &Rules,
) -> (Answer, usize) {
    let missing: Vec<&str> = ["product_id", "ble_packet", "scan_time"]
        .into_iter()
        .filter(|k| header(parts, k).is_none_or(|v| v.trim().is_empty()))
        .collect();
    if !missing.is_empty() {
        let msg = format!("Missing required parameters: {}", missing.join(", "));
        return (error_answer(400, &msg), 0);
    }
    let Some(item) = rec.items.first() else {
        return (error_answer(400, "Missing required parameters: mac_id"), 0);
    };
    if rules.poison.as_deref() == Some(mac_key(&item.mac_id).as_str()) {
        let msg = format!("Invalid ble_packet for {}", item.mac_id);
        return (error_answer(400, &msg), 0);
    }
    match decode_item(item, associated, rules) {
        Ok((mac, payload, ts)) => (
            json_answer(
                StatusCode::OK,
                &Value::Object(decoded_fields(mac, &payload, ts, true)),
            ),
            1,
        ),
        Err(NOT_FOUND_ITEM) => (
            error_answer(404, "Device not found or not associated with the customer"),
            0,
        ),
        Err(INVALID_PACKET_ITEM) => (error_answer(400, "Invalid ble_packet"), 0),
        Err(other) => (error_answer(400, &format!("Invalid parameter: {other}")), 0),
    }
}

fn answer_bulk(
    shared: &Shared,
    parsed_body: Option<Value>,
    associated: bool,
    rules: &Rules,
) -> (Answer, usize) {
    let max_items = rules.max_items;
    // Spec section 7 lists "body not valid JSON" under 401.
    let Some(body) = parsed_body else {
        return (unauthorized(), 0);
    };
    let Value::Array(raw_items) = body else {
        return (
            error_answer(400, "Request body must be a JSON array of items"),
            0,
        );
    };
    if raw_items.len() > max_items {
        let msg = format!(
            "Request body has {} items; at most {max_items} are allowed",
            raw_items.len()
        );
        return (error_answer(413, &msg), 0);
    }
    let mut items = Vec::with_capacity(raw_items.len());
    let mut errors = Vec::new();
    for (index, raw) in raw_items.iter().enumerate() {
        let mut fields = Vec::with_capacity(4);
        for k in REQUIRED_FIELDS {
            match raw.get(k) {
                Some(Value::String(s)) => fields.push(s.clone()),
                _ => errors.push(format!(
                    "item {index}: {k} is required and must be a string"
                )),
            }
        }
        if let Ok([mac_id, ble_packet, product_id, scan_time]) = <[String; 4]>::try_from(fields) {
            items.push(ReceivedItem {
                mac_id,
                ble_packet,
                product_id,
                scan_time,
            });
        }
    }
    let mut first_index: HashMap<String, usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        if let Some(first) = first_index.insert(mac_key(&item.mac_id), index) {
            errors.push(format!(
                "Duplicate mac_id {} (items {first} and {index})",
                item.mac_id
            ));
        }
    }
    if !errors.is_empty() {
        return (validation_failed(&errors), 0);
    }
    let poisoned = rules
        .poison
        .as_deref()
        .and_then(|p| items.iter().find(|i| mac_key(&i.mac_id) == p));
    if let Some(bad) = poisoned {
        let msg = format!("Invalid ble_packet for {}", bad.mac_id);
        return (error_answer(400, &msg), 0);
    }

    let keep = items.len().saturating_sub(rules.drop_items);
    let mut answer = Vec::with_capacity(keep);
    let (mut decoded, mut item_errors) = (0usize, 0u64);
    for item in items.iter().take(keep) {
        let key = mac_key(&item.mac_id);
        if rules.shaping.leave_out.contains(&key) {
            continue;
        }
        let mut m = Map::new();
        m.insert("mac_id".into(), Value::from(item.mac_id.clone()));
        if rules.shaping.only_mac_id.contains(&key) {
            answer.push(Value::Object(m));
            continue;
        }
        if let Some(text) = rules.shaping.item_error.get(&key) {
            m.insert("error".into(), Value::from(text.clone()));
            item_errors += 1;
            answer.push(Value::Object(m));
            continue;
        }
        match decode_item(item, associated, rules) {
            Ok((mac, payload, ts)) => {
                m.extend(decoded_fields(mac, &payload, ts, false));
                decoded += 1;
            }
            Err(e) => {
                let text = match &rules.echo_token {
                    Some(auth) => format!("{e} (request {auth})"),
                    None => e.to_string(),
                };
                m.insert("error".into(), Value::from(text));
                item_errors += 1;
            }
        }
        answer.push(Value::Object(m));
    }
    shared.with(|s| s.stats.item_errors += item_errors);
    (json_answer(StatusCode::OK, &Value::Array(answer)), decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_id_is_accepted_only_in_the_form_asked_for() {
        let want = "AABBCCDDEEFF".parse::<Mac>().ok();
        assert_eq!(parse_mac_id("AABBCCDDEEFF", MacFormat::Plain), want);
        assert_eq!(parse_mac_id("AA:BB:CC:DD:EE:FF", MacFormat::Colon), want);
        for (mac, format) in [
            ("aabbccddeeff", MacFormat::Plain),
            ("AA:BB:CC:DD:EE:FF", MacFormat::Plain),
            ("aa:bb:cc:dd:ee:ff", MacFormat::Colon),
            ("AABBCCDDEEFF", MacFormat::Colon),
            ("AA-BB-CC-DD-EE-FF", MacFormat::Colon),
            ("AABBCCDDEE", MacFormat::Plain),
            ("AA:BBCCDDEEFF", MacFormat::Colon),
        ] {
            assert_eq!(parse_mac_id(mac, format), None, "{mac} as {format:?}");
        }
    }

    #[test]
    fn by_default_an_item_in_another_form_is_an_item_error_naming_the_mistake() {
        let item = |mac: &str, packet: &str, product: &str| ReceivedItem {
            mac_id: mac.into(),
            ble_packet: packet.into(),
            product_id: product.into(),
            scan_time: "1".into(),
        };
        let strict = WireRules::default();
        let good = item("C0FFEE000001", "F70E4956", "tape");
        assert!(check_wire(&good, &strict).is_ok());
        for (bad, why) in [
            (
                item("C0:FF:EE:00:00:01", "F70E4956", "tape"),
                MAC_FORMAT_ITEM,
            ),
            (
                item("C0FFEE000001", "f70e4956", "tape"),
                PACKET_ENCODING_ITEM,
            ),
            (
                item("C0FFEE000001", "9w5JVuKfhCEeRP+1Hg==", "tape"),
                PACKET_ENCODING_ITEM,
            ),
            (item("C0FFEE000001", "F70E4956", "tag"), PRODUCT_ITEM),
        ] {
            assert_eq!(check_wire(&bad, &strict), Err(why), "{bad:?}");
            assert!(check_wire(&bad, &WireRules::lenient()).is_ok(), "{bad:?}");
        }
        let lower = item("c0ffee000001", "F70E4956", "tape");
        assert_eq!(check_wire(&lower, &strict), Err(MAC_FORMAT_ITEM));
    }
}
