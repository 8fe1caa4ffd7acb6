//! The bulk decode answer read as it streams by: each item's fields straight into
//! [`Decoded`], leniently (every field optional, numbers as strings and strings as
//! numbers, unknown fields skipped), without building a JSON tree per item. The same
//! rules as [`Decoded::from_json`], which reads the single decode's answer; the tests
//! below hold the two to one another. (A tree per item, then the item written back as
//! text, cost a gateway draining a backlog more than anything else it did per capture.)

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::decoded::Decoded;

/// The answer's top level.
pub(super) enum Top {
    /// A JSON array: its elements.
    Array(Vec<Element>),
    /// Valid JSON, but not an array.
    NotArray,
}

/// Reads `body`: `Err` when it is not JSON.
pub(super) fn read(body: &[u8]) -> Result<Top, serde_json::Error> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        Ok(Top::Array(serde_json::from_slice(body)?))
    } else {
        serde_json::from_slice::<IgnoredAny>(body).map(|_| Top::NotArray)
    }
}

/// One element of the answer's array: an item, or `None` for anything but a JSON
/// object.
pub(super) struct Element(pub Option<Item>);

/// An item's fields, as far as the gateway reads them.
#[derive(Default)]
pub(super) struct Item {
    /// `mac_id` when it is a string.
    pub mac_id: Option<String>,
    /// `error` when present (`null` included).
    pub error: Option<Value>,
    /// `qr_code` is present and not `null`.
    pub qr_present: bool,
    pub decoded: Decoded,
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementVisitor)
    }
}

/// Visits any JSON value: an object is read as an item, anything else is skipped.
struct ElementVisitor;

macro_rules! not_an_object {
    ($($name:ident: $t:ty),*) => {
        $(fn $name<E: de::Error>(self, _: $t) -> Result<Element, E> {
            Ok(Element(None))
        })*
    };
}

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Element;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    not_an_object!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: de::Error>(self) -> Result<Element, E> {
        Ok(Element(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Element(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Element, A::Error> {
        let mut item = Item::default();
        let d = &mut item.decoded;
        // A field given twice: the last one counts (as in a parsed JSON object).
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::MacId => item.mac_id = map.next_value::<StrOnly>()?.0,
                Key::Error => item.error = Some(map.next_value()?),
                Key::QrCode => {
                    let t: Text = map.next_value()?;
                    item.qr_present = !matches!(t, Text::Null);
                    d.qr_code = t.text();
                }
                Key::FwVer => d.fw_ver = map.next_value::<Text>()?.text(),
                Key::Cts => d.cts = map.next_value::<Num>()?.0,
                Key::Ts => d.ts = map.next_value::<Num>()?.0,
                Key::Bat => d.bat = map.next_value::<Num>()?.0,
                Key::Temp => d.temp = map.next_value::<Num>()?.0,
                Key::OverTemp => d.over_temp = map.next_value::<Num>()?.0,
                Key::OverTempTs => d.over_temp_ts = map.next_value::<Num>()?.0,
                Key::Shock => d.shock = map.next_value::<Num>()?.0,
                Key::ShockTs => d.shock_ts = map.next_value::<Num>()?.0,
                Key::ShockCount => d.shock_count = map.next_value::<Num>()?.0,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Element(Some(item)))
    }
}

/// The fields read; any other is skipped.
enum Key {
    MacId,
    Error,
    QrCode,
    FwVer,
    Cts,
    Ts,
    Bat,
    Temp,
    OverTemp,
    OverTempTs,
    Shock,
    ShockTs,
    ShockCount,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(match k {
                    "mac_id" => Key::MacId,
                    "error" => Key::Error,
                    "qr_code" => Key::QrCode,
                    "fw_ver" => Key::FwVer,
                    "cts" => Key::Cts,
                    "ts" => Key::Ts,
                    "bat" => Key::Bat,
                    "temp" => Key::Temp,
                    "over_temp" => Key::OverTemp,
                    "over_temp_ts" => Key::OverTempTs,
                    "shock" => Key::Shock,
                    "shock_ts" => Key::ShockTs,
                    "shock_count" => Key::ShockCount,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// Skips a JSON value of any type, for the visitors below: what they do not read.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A string, or `None` for any other value.
struct StrOnly(Option<String>);

impl<'de> Deserialize<'de> for StrOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrOnly;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StrOnly, E> {
                Ok(StrOnly(Some(s.to_string())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<StrOnly, E> {
                Ok(StrOnly(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<StrOnly, E> {
                Ok(StrOnly(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<StrOnly, E> {
                Ok(StrOnly(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<StrOnly, E> {
                Ok(StrOnly(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrOnly, E> {
                Ok(StrOnly(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StrOnly, A::Error> {
                skip_seq(seq).map(|_| StrOnly(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StrOnly, A::Error> {
                skip_map(map).map(|_| StrOnly(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A text field: a string, or a number written as text (as [`Decoded::from_json`]).
enum Text {
    Null,
    Str(String),
    /// Present, but neither text nor a number.
    Other,
}

impl Text {
    fn text(self) -> Option<String> {
        match self {
            Text::Str(s) => Some(s),
            Text::Null | Text::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(Text::Str(s.to_string()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Text, E> {
                Ok(Text::Str(n.to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Text, E> {
                Ok(Text::Str(n.to_string()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Text, E> {
                // Written as a parsed JSON number is.
                Ok(serde_json::Number::from_f64(n)
                    .map_or(Text::Other, |n| Text::Str(n.to_string())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Text, E> {
                Ok(Text::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Text, A::Error> {
                skip_seq(seq).map(|_| Text::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text, A::Error> {
                skip_map(map).map(|_| Text::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A number field: a number, or a string holding a finite one (trimmed).
struct Num(Option<f64>);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Num, E> {
                Ok(Num(Some(n as f64)))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Num, E> {
                Ok(Num(Some(n as f64)))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Num, E> {
                Ok(Num(Some(n)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Num, E> {
                Ok(Num(s.trim().parse::<f64>().ok().filter(|f| f.is_finite())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Num, A::Error> {
                skip_seq(seq).map(|_| Num(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Num, A::Error> {
                skip_map(map).map(|_| Num(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of an item, in every type JSON can give it: read as the single
    /// decode's reader reads the same object.
    #[test]
    fn items_read_as_they_stream_by_read_as_the_parsed_object_does() {
        let fields = [
            "qr_code",
            "fw_ver",
            "cts",
            "ts",
            "bat",
            "temp",
            "over_temp",
            "over_temp_ts",
            "shock",
            "shock_ts",
            "shock_count",
        ];
        let values = [
            "null",
            "true",
            "0",
            "-7",
            "18446744073709551615",
            "21.5",
            "1e3",
            "\"\"",
            "\" 4.25 \"",
            "\"NaN\"",
            "\"inf\"",
            "\"TT\\u0041\"",
            "[1, {\"a\": [2]}]",
            "{\"qr_code\": \"nested\"}",
        ];
        for field in fields {
            for value in values {
                let text = format!(
                    r#"{{"mac_id": "AABBCCDDEEFF", "extra": {{"x": [1]}}, "{field}": {value}}}"#
                );
                let parsed: Value = serde_json::from_str(&text).unwrap();
                let Top::Array(elements) = read(format!("[{text}]").as_bytes()).unwrap() else {
                    panic!("an array")
                };
                let [Element(Some(item))] = &elements[..] else {
                    panic!("one item")
                };
                let mut want = Decoded::from_json(&parsed);
                want.raw = None;
                assert_eq!(item.decoded, want, "{text}");
                assert_eq!(
                    item.qr_present,
                    parsed.get("qr_code").is_some_and(|v| !v.is_null()),
                    "{text}"
                );
                assert_eq!(item.mac_id.as_deref(), Some("AABBCCDDEEFF"));
            }
        }
    }

    #[test]
    fn anything_but_an_object_is_an_element_skipped_and_the_top_must_be_an_array() {
        let Top::Array(e) =
            read(br#" [1, "x", null, true, [2, [3]], {"k": {}}, {"mac_id": 5}] "#).unwrap()
        else {
            panic!("an array")
        };
        assert_eq!(e.len(), 7);
        assert!(e[..5].iter().all(|e| e.0.is_none()));
        assert!(matches!(&e[5], Element(Some(i)) if i.mac_id.is_none() && i.error.is_none()));
        assert!(matches!(&e[6], Element(Some(i)) if i.mac_id.is_none()));
        assert!(matches!(read(br#"{"items": []}"#), Ok(Top::NotArray)));
        assert!(matches!(read(b"\"text\""), Ok(Top::NotArray)));
        assert!(read(b"<html>").is_err());
        assert!(read(b"[1, ").is_err());
        assert!(read(b"").is_err());
        // A field given twice: the last counts.
        let Top::Array(e) =
            read(br#"[{"error": "a", "error": null, "temp": 1, "temp": "2"}]"#).unwrap()
        else {
            panic!("an array")
        };
        let Element(Some(i)) = &e[0] else { panic!() };
        assert_eq!(
            (i.error.clone(), i.decoded.temp),
            (Some(Value::Null), Some(2.0))
        );
    }
}
