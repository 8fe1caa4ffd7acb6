/*!
The decode endpoints' rules: bulk (spec 4.4) and single (4.3). A request is checked in
the order the crate doc lists (headers, body, items), then each item is answered on its
own from the packet it carries (`packet.rs`). Pure: the router (`service/decode.rs`)
takes the fault and the token check under its lock and hands the rest here. It touches
the packet reader, the MAC helpers, the answer helpers, the config's types and the
records.
*/

use std::collections::HashMap;

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{Map, Value};

use super::answer::{error_answer, header, json_answer, unauthorized, validation_failed, Answer};
use super::config::{MockEnvironment, Registry, WireRules, FW_VER};
use super::fault::Shaping;
use super::mac::{self, parse_mac_id};
use super::packet::{decode_packet, Packet};
use super::record::{DecodeKind, Received, ReceivedItem};

const NOT_FOUND_ITEM: &str = "device not found or not associated with the customer";
const INVALID_PACKET_ITEM: &str = "invalid ble_packet";
const MAC_FORMAT_ITEM: &str = "invalid mac_id format";
const PACKET_ENCODING_ITEM: &str = "invalid ble_packet encoding";
const PRODUCT_ITEM: &str = "unknown product_id";
const REQUIRED_FIELDS: [&str; 4] = ["mac_id", "ble_packet", "product_id", "scan_time"];

/// Whether the item is in a form `wire` accepts; the item error when not.
fn check_wire(item: &ReceivedItem, wire: &WireRules) -> Result<String, &'static str> {
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
pub(crate) fn received_items(body: &Value) -> Vec<ReceivedItem> {
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

/// The one item of a single decode: the MAC of the path, the rest from headers.
pub(crate) fn single_item(parts: &Parts, mac: &str) -> ReceivedItem {
    ReceivedItem {
        mac_id: mac.to_string(),
        ble_packet: header(parts, "ble_packet").unwrap_or_default(),
        product_id: header(parts, "product_id").unwrap_or_default(),
        scan_time: header(parts, "scan_time").unwrap_or_default(),
    }
}

/// What one packet decodes to, or the item error text.
fn decode_item(
    item: &ReceivedItem,
    associated: bool,
    rules: &Rules,
) -> Result<(String, Packet, Value), &'static str> {
    let mac = check_wire(item, &rules.wire)?;
    if !associated || !rules.registry.is_registered(&mac) {
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
fn decoded_fields(mac: &str, p: &Packet, ts: Value, full: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("qr_code".into(), Value::from(format!("TT{mac}")));
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
/// The per-request copy of the runtime settings that shape a decode answer.
pub(crate) struct Rules {
    pub registry: Registry,
    pub wire: WireRules,
    /// The identity lacks the permission: 401 whatever the token.
    pub permission_denied: bool,
    /// The `Authorization` header, quoted in every item error (a careless server).
    pub echo_token: Option<String>,
    pub max_items: usize,
    /// Plain form of the poison MAC.
    pub poison: Option<String>,
    /// Items to leave out of a bulk answer (`Fault::DropItems`).
    pub drop_items: usize,
    /// Standing faults that shape the answer.
    pub shaping: Shaping,
}

/// A decode answer, with what it counts.
pub(crate) struct Answered {
    pub answer: Answer,
    /// Items answered with a decoded value.
    pub decoded: usize,
    /// Items answered with an item error.
    pub item_errors: u64,
}

impl Answered {
    fn refused(answer: Answer) -> Answered {
        Answered {
            answer,
            decoded: 0,
            item_errors: 0,
        }
    }
}

/// The answer to a decode request without fault. `bearer_ok`: the request carries a
/// token granted for `env`.
pub(crate) fn answer(
    bearer_ok: bool,
    env: &MockEnvironment,
    parts: &Parts,
    rec: &Received,
    body_in_limit: bool,
    parsed_body: Option<Value>,
    rules: &Rules,
) -> Answered {
    let token_ok = bearer_ok && !rules.permission_denied;
    if !token_ok || !body_in_limit {
        return Answered::refused(unauthorized());
    }
    let non_empty = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
    if !non_empty(&rec.customer_id) || !non_empty(&rec.authorized_groups) {
        return Answered::refused(error_answer(
            400,
            "Missing required headers: customer_id or authorized_groups",
        ));
    }
    let associated = rec.customer_id.as_deref() == Some(env.customer_id.as_str())
        && rec.authorized_groups.as_deref() == Some(env.authorized_groups.as_str());
    let json_body = header(parts, "content-type")
        .is_some_and(|c| c.to_ascii_lowercase().starts_with("application/json"));
    if rec.kind == DecodeKind::Bulk && !json_body {
        return Answered::refused(error_answer(400, "Content-Type must be application/json"));
    }
    match rec.kind {
        DecodeKind::Single => answer_single(parts, rec, associated, rules),
        DecodeKind::Bulk => answer_bulk(parsed_body, associated, rules),
    }
}

fn answer_single(parts: &Parts, rec: &Received, associated: bool, rules: &Rules) -> Answered {
    let missing: Vec<&str> = ["product_id", "ble_packet", "scan_time"]
        .into_iter()
        .filter(|k| header(parts, k).is_none_or(|v| v.trim().is_empty()))
        .collect();
    if !missing.is_empty() {
        let msg = format!("Missing required parameters: {}", missing.join(", "));
        return Answered::refused(error_answer(400, &msg));
    }
    let Some(item) = rec.items.first() else {
        return Answered::refused(error_answer(400, "Missing required parameters: mac_id"));
    };
    if rules.poison.as_deref() == Some(mac::key(&item.mac_id).as_str()) {
        let msg = format!("Invalid ble_packet for {}", item.mac_id);
        return Answered::refused(error_answer(400, &msg));
    }
    match decode_item(item, associated, rules) {
        Ok((mac, payload, ts)) => Answered {
            answer: json_answer(
                StatusCode::OK,
                &Value::Object(decoded_fields(&mac, &payload, ts, true)),
            ),
            decoded: 1,
            item_errors: 0,
        },
        Err(NOT_FOUND_ITEM) => Answered::refused(error_answer(
            404,
            "Device not found or not associated with the customer",
        )),
        Err(INVALID_PACKET_ITEM) => Answered::refused(error_answer(400, "Invalid ble_packet")),
        Err(other) => Answered::refused(error_answer(400, &format!("Invalid parameter: {other}"))),
    }
}

fn answer_bulk(parsed_body: Option<Value>, associated: bool, rules: &Rules) -> Answered {
    let items = match bulk_items(parsed_body, rules) {
        Ok(items) => items,
        Err(refused) => return Answered::refused(*refused),
    };
    let keep = items.len().saturating_sub(rules.drop_items);
    let mut answer = Vec::with_capacity(keep);
    let (mut decoded, mut item_errors) = (0usize, 0u64);
    for item in items.iter().take(keep) {
        let key = mac::key(&item.mac_id);
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
                m.extend(decoded_fields(&mac, &payload, ts, false));
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
    Answered {
        answer: json_answer(StatusCode::OK, &Value::Array(answer)),
        decoded,
        item_errors,
    }
}

/// The items of a bulk body, every rule of the whole request checked (JSON, an array,
/// the item count, the four string fields, no `mac_id` twice, the poison MAC); the
/// answer refusing the request when one is broken.
fn bulk_items(parsed_body: Option<Value>, rules: &Rules) -> Result<Vec<ReceivedItem>, Box<Answer>> {
    let max_items = rules.max_items;
    // Spec section 7 lists "body not valid JSON" under 401.
    let Some(body) = parsed_body else {
        return Err(Box::new(unauthorized()));
    };
    let Value::Array(raw_items) = body else {
        return Err(Box::new(error_answer(
            400,
            "Request body must be a JSON array of items",
        )));
    };
    if raw_items.len() > max_items {
        let msg = format!(
            "Request body has {} items; at most {max_items} are allowed",
            raw_items.len()
        );
        return Err(Box::new(error_answer(413, &msg)));
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
        if let Some(first) = first_index.insert(mac::key(&item.mac_id), index) {
            errors.push(format!(
                "Duplicate mac_id {} (items {first} and {index})",
                item.mac_id
            ));
        }
    }
    if !errors.is_empty() {
        return Err(Box::new(validation_failed(&errors)));
    }
    let poisoned = rules
        .poison
        .as_deref()
        .and_then(|p| items.iter().find(|i| mac::key(&i.mac_id) == p));
    if let Some(bad) = poisoned {
        let msg = format!("Invalid ble_packet for {}", bad.mac_id);
        return Err(Box::new(error_answer(400, &msg)));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

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
