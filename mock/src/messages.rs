/*!
Integration messages (spec 4.5). The `message_type` header and the body's
`message_type` must agree, and `data` must have the shape the spec's table gives for
the type. The spec does not show which fields are required, so the mock requires every
field the table lists (for AIRCARGO: `bookingDetails` with its `awb`, and
`eventMetadata` with `id`, `timestamp`, `type`), which is the strict reading. It
touches only the request.
*/

use serde_json::{json, Value};

use super::request::{OpRequest, Reply};

/// The message types of spec 4.5.
pub const MESSAGE_TYPES: [&str; 3] = ["DEVICE_DATA", "MANIFEST_DATA", "AIRCARGO"];

#[derive(Debug, Clone, Copy)]
enum Want {
    Str,
    Int,
    Num,
    Obj,
}

/// `path` (dotted) inside `data` is present with the wanted type; the problem if not.
fn check(data: &Value, path: &str, want: Want) -> Result<(), String> {
    let v = path
        .split('.')
        .try_fold(data, |v, key| v.get(key))
        .ok_or_else(|| format!("data.{path} is required"))?;
    let ok = match want {
        Want::Str => v.is_string(),
        Want::Int => v.is_i64() || v.is_u64(),
        Want::Num => v.is_number(),
        Want::Obj => v.is_object(),
    };
    if ok {
        Ok(())
    } else {
        let name = match want {
            Want::Str => "a string",
            Want::Int => "an integer (epoch seconds)",
            Want::Num => "a number",
            Want::Obj => "an object",
        };
        Err(format!("data.{path} must be {name}"))
    }
}

fn shape(message_type: &str) -> &'static [(&'static str, Want)] {
    match message_type {
        "MANIFEST_DATA" => &[
            ("asset_barcode", Want::Str),
            ("shipped_date", Want::Int),
            ("shipment_id", Want::Str),
            ("container_id", Want::Str),
        ],
        "DEVICE_DATA" => &[
            ("device_id", Want::Str),
            ("sensor_data", Want::Obj),
            ("sensor_data.temperature", Want::Num),
            ("sensor_data.humidity", Want::Num),
            ("timestamp", Want::Int),
        ],
        _ => &[
            ("bookingPublishEvent", Want::Obj),
            ("bookingPublishEvent.bookingDetails", Want::Obj),
            ("bookingPublishEvent.bookingDetails.awb", Want::Str),
            ("bookingPublishEvent.eventMetadata", Want::Obj),
            ("bookingPublishEvent.eventMetadata.id", Want::Str),
            ("bookingPublishEvent.eventMetadata.timestamp", Want::Str),
            ("bookingPublishEvent.eventMetadata.type", Want::Str),
        ],
    }
}

/// `POST /external/messages`.
pub(crate) fn message(req: &OpRequest<'_>) -> Reply {
    if let Err(answer) = req.account_headers() {
        return answer;
    }
    let Some(header_type) = req.header("message_type") else {
        return Reply::error(400, "Missing required header: message_type");
    };
    let body = match req.json_body() {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let Some(body_type) = body.get("message_type").and_then(Value::as_str) else {
        return Reply::error(400, "Invalid payload: message_type is required");
    };
    if !MESSAGE_TYPES.contains(&header_type.as_str()) || !MESSAGE_TYPES.contains(&body_type) {
        return Reply::error(400, "Invalid message type");
    }
    if header_type != body_type {
        return Reply::error(400, "message_type header and body disagree");
    }
    let Some(data) = body.get("data").filter(|d| d.is_object()) else {
        return Reply::error(400, "Invalid payload: data must be an object");
    };
    if let Some(key) = body
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "message_type" && *k != "data"))
    {
        return Reply::error(400, &format!("Invalid payload: unknown field {key}"));
    }
    for (path, want) in shape(body_type) {
        if let Err(problem) = check(data, path, *want) {
            return Reply::error(400, &format!("Invalid payload: {problem}"));
        }
    }
    if !req.is_account() {
        return Reply::error(404, "Customer not found");
    }
    Reply::json(201, &json!({"message": "Message accepted", "code": 201}))
}
