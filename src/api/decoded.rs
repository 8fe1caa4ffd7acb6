/*!
The decoded BLE packet (spec 2.3), the one value both decode answers fill: the single
decode (`decode.rs`, through [`Decoded::from_json`]) and the streaming bulk reader
(`bulk_answer.rs`, field by field). A leaf: it imports nothing of the crate.
*/

use serde_json::Value;

/// A decoded BLE packet (spec 2.3). Every field is optional because the bulk answer
/// carries fewer fields than the single decode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    pub qr_code: Option<String>,
    pub cts: Option<f64>,
    pub ts: Option<f64>,
    pub bat: Option<f64>,
    pub temp: Option<f64>,
    pub over_temp: Option<f64>,
    pub over_temp_ts: Option<f64>,
    pub shock: Option<f64>,
    pub shock_ts: Option<f64>,
    pub shock_count: Option<f64>,
    pub fw_ver: Option<String>,
    /// The single decode's answer as received (`tapegate decode` shows it); `None` for
    /// a bulk item, whose fields are read as they stream by and not kept whole.
    pub raw: Option<Value>,
}

impl Decoded {
    /// Reads the known fields of a decoded packet object, leniently: a number may come
    /// as a numeric string, a string field as a number, and anything else is `None`.
    pub fn from_json(value: &Value) -> Decoded {
        let num = |k: &str| match value.get(k)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
            _ => None,
        };
        let text = |k: &str| match value.get(k)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        Decoded {
            qr_code: text("qr_code"),
            cts: num("cts"),
            ts: num("ts"),
            bat: num("bat"),
            temp: num("temp"),
            over_temp: num("over_temp"),
            over_temp_ts: num("over_temp_ts"),
            shock: num("shock"),
            shock_ts: num("shock_ts"),
            shock_count: num("shock_count"),
            fw_ver: text("fw_ver"),
            raw: Some(value.clone()),
        }
    }
}
