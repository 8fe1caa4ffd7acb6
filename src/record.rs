/*!
The shared domain types: [`Mac`], [`Advertisement`] (what a source hears), [`Capture`]
(what dedup admits into the outbox), and the JSON Lines advertisement record that the
`replay` source reads and `tapegate scan --record` writes.
A leaf: it imports nothing of the crate.

Record format (one advertisement per line, see DESIGN.md):

```json
{"ts": 1763719200.125, "mac": "C0:FF:EE:00:00:01", "rssi": -61, "name": "TT-0001",
 "manufacturer_data": {"3831": "4956e29f84211e44ffb51e"}}
```

Times are kept as whole epoch milliseconds ([`EpochMillis`]) so that capture times
compare exactly and replays are deterministic.
*/

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod hex;

use hex::hex_value;
pub use hex::{decode_hex, hex_lower, hex_upper};

/// Epoch time in whole milliseconds.
pub type EpochMillis = i64;

/// A Bluetooth device address. Parsed from any case with `:`, `-` or no separator;
/// displayed upper case with colons (`AA:BB:CC:DD:EE:FF`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac([u8; 6]);

impl Mac {
    pub const fn new(octets: [u8; 6]) -> Self {
        Mac(octets)
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// Twelve upper-case hex digits without separators (`AABBCCDDEEFF`), as the tapes'
    /// maker writes MACs.
    pub fn plain(&self) -> String {
        hex_upper(&self.0)
    }

    /// Upper case with colons (`AA:BB:CC:DD:EE:FF`).
    pub fn colon(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a string is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (expected 12 hex digits, optionally separated by ':' or '-')")]
pub struct BadMac(pub String);

impl FromStr for Mac {
    type Err = BadMac;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Every replayed line is parsed here: no allocation but the error's, and the
        // usual form (`AA:BB:CC:DD:EE:FF`) read pair by pair.
        let bad = || BadMac(s.to_string());
        let b = s.as_bytes();
        let mut out = [0u8; 6];
        if b.len() == 17 && (2..17).step_by(3).all(|i| b[i] == b':') {
            for (i, octet) in out.iter_mut().enumerate() {
                *octet = hex_value(b[i * 3]).ok_or_else(bad)? << 4
                    | hex_value(b[i * 3 + 1]).ok_or_else(bad)?;
            }
            return Ok(Mac(out));
        }
        let (mut digits, mut separators) = (0usize, 0usize);
        for &c in b {
            if c == b':' || c == b'-' {
                separators += 1;
                continue;
            }
            let nibble = hex_value(c).ok_or_else(bad)?;
            let octet = out.get_mut(digits / 2).ok_or_else(bad)?;
            *octet = *octet << 4 | nibble;
            digits += 1;
        }
        if digits != 12 || (separators != 0 && separators != 5) {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One BLE advertisement as a source heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertisement {
    /// Capture time.
    pub ts_ms: EpochMillis,
    pub mac: Mac,
    pub rssi: Option<i16>,
    pub name: Option<String>,
    /// Company identifier and the bytes after it, in the order heard.
    pub manufacturer_data: Vec<(u16, Vec<u8>)>,
    /// Service UUID (lower case, 128-bit form) and its data.
    pub service_data: Vec<(String, Vec<u8>)>,
}

/// An advertisement admitted by products and dedup: one row of the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub mac: Mac,
    /// Capture time.
    pub ts_ms: EpochMillis,
    /// `product_id` as sent to the service: shared with its product's settings (every
    /// capture of a product names the same id; a copy each was an allocation each).
    pub product_id: std::sync::Arc<str>,
    /// `ble_packet` exactly as sent to the service (already encoded).
    pub packet: String,
    pub rssi: Option<i16>,
    /// `CLOCK_BOOTTIME` at capture, for a live capture (BLE, real-time simulation):
    /// it orders captures when the wall clock steps, and re-times them when the clock
    /// syncs. `None`: a recorded time (replay), taken as it is.
    pub boot_ms: Option<i64>,
}

impl Capture {
    /// The time that orders this capture among others of the same run: boot time when
    /// live (it never steps back), else the recorded capture time.
    pub fn order_ms(&self) -> EpochMillis {
        self.boot_ms.unwrap_or(self.ts_ms)
    }
}

/// Why a record line was not read. The caller adds the line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not a JSON advertisement record: {0}")]
    Json(String),
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
}

/// The wire shape of a record line, as written.
#[derive(Serialize)]
struct RecordLine {
    ts: f64,
    mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rssi: Option<i16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default)]
    manufacturer_data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    service_data: BTreeMap<String, String>,
}

/// The wire shape of a record line, as read: the same fields, the strings borrowed from
/// the line where they hold no escape (a replay reads millions of lines; each owned
/// string was an allocation and a free).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn<'a> {
    ts: f64,
    #[serde(borrow)]
    mac: Cow<'a, str>,
    #[serde(default)]
    rssi: Option<i16>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, borrow)]
    manufacturer_data: Entries<'a>,
    #[serde(default, borrow)]
    service_data: Entries<'a>,
}

/// A JSON object of strings, read as a map would be (in key order, the last of a
/// repeated key winning) into a vector.
#[derive(Default)]
struct Entries<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Entries<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut entries: Vec<(Cow<'a, str>, Cow<'a, str>)> =
                    Vec::with_capacity(m.size_hint().unwrap_or(1));
                while let Some((Text(k), Text(v))) = m.next_entry::<Text<'a>, Text<'a>>()? {
                    match entries.iter_mut().find(|(key, _)| *key == k) {
                        Some(entry) => entry.1 = v,
                        None => entries.push((k, v)),
                    }
                }
                entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON string, borrowed from the input when it holds no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(Visit(std::marker::PhantomData))
    }
}

impl Advertisement {
    /// Parses one JSON Lines record.
    pub fn from_record(line: &str) -> Result<Self, RecordError> {
        let raw: RecordIn<'_> =
            serde_json::from_str(line).map_err(|e| RecordError::Json(e.to_string()))?;
        Self::from_raw(raw)
    }

    /// Parses one JSON Lines record from its bytes, or `None` if they are not one
    /// (the caller then reads them with [`Advertisement::from_record`] for the reason):
    /// the replay's path, where the JSON reader checks the text it reads instead of a
    /// pass over the whole line first.
    pub fn from_record_bytes(line: &[u8]) -> Option<Self> {
        let raw: RecordIn<'_> = serde_json::from_slice(line.trim_ascii()).ok()?;
        Self::from_raw(raw).ok()
    }

    fn from_raw(raw: RecordIn<'_>) -> Result<Self, RecordError> {
        if !raw.ts.is_finite() || raw.ts < 0.0 {
            return Err(RecordError::Field {
                field: "ts",
                reason: format!("{} is not an epoch time in seconds", raw.ts),
            });
        }
        let mac = raw.mac.parse().map_err(|e: BadMac| RecordError::Field {
            field: "mac",
            reason: e.to_string(),
        })?;
        let mut manufacturer_data = Vec::with_capacity(raw.manufacturer_data.0.len());
        for (k, v) in raw.manufacturer_data.0 {
            let id = k.parse::<u16>().map_err(|_| RecordError::Field {
                field: "manufacturer_data",
                reason: format!("key {k:?} is not a decimal company identifier (0-65535)"),
            })?;
            let bytes = decode_hex(&v).ok_or_else(|| RecordError::Field {
                field: "manufacturer_data",
                reason: format!("value of {k} is not hex bytes: {v:?}"),
            })?;
            manufacturer_data.push((id, bytes));
        }
        let mut service_data = Vec::with_capacity(raw.service_data.0.len());
        for (k, v) in raw.service_data.0 {
            let bytes = decode_hex(&v).ok_or_else(|| RecordError::Field {
                field: "service_data",
                reason: format!("value of {k} is not hex bytes: {v:?}"),
            })?;
            service_data.push((k.to_ascii_lowercase(), bytes));
        }
        Ok(Advertisement {
            ts_ms: (raw.ts * 1000.0).round() as EpochMillis,
            mac,
            rssi: raw.rssi,
            name: raw.name,
            manufacturer_data,
            service_data,
        })
    }

    /// Writes the advertisement as one JSON Lines record (without the newline).
    pub fn to_record(&self) -> String {
        let raw = RecordLine {
            ts: self.ts_ms as f64 / 1000.0,
            mac: self.mac.to_string(),
            rssi: self.rssi,
            name: self.name.clone(),
            manufacturer_data: self
                .manufacturer_data
                .iter()
                .map(|(id, d)| (id.to_string(), hex_lower(d)))
                .collect(),
            service_data: self
                .service_data
                .iter()
                .map(|(u, d)| (u.clone(), hex_lower(d)))
                .collect(),
        };
        // A struct of strings and numbers always serialises.
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// The data after company identifier `id`, if the advertisement carries it.
    pub fn manufacturer(&self, id: u16) -> Option<&[u8]> {
        self.manufacturer_data
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, d)| d.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_accepts_any_case_and_separator() {
        let want = Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01]);
        for s in ["C0:FF:EE:00:00:01", "c0-ff-ee-00-00-01", "c0ffee000001"] {
            assert_eq!(s.parse::<Mac>().unwrap(), want, "{s}");
        }
        assert_eq!(want.to_string(), "C0:FF:EE:00:00:01");
        assert_eq!(want.plain(), "C0FFEE000001");
    }

    #[test]
    fn mac_rejects_wrong_length_digits_and_separators() {
        for s in [
            "C0:FF:EE:00:00",
            "C0:FF:EE:00:00:0G",
            "C0:FFEE:00:00:01",
            "",
        ] {
            assert!(s.parse::<Mac>().is_err(), "{s}");
        }
    }

    #[test]
    fn record_round_trips() {
        let line = r#"{"ts": 1763719200.125, "mac": "c0-ff-ee-00-00-01", "rssi": -61, "name": "TT-0001", "manufacturer_data": {"3831": "4956E29F84211E44FFB51E"}, "service_data": {"0000FEAA-0000-1000-8000-00805F9B34FB": "10"}}"#;
        let adv = Advertisement::from_record(line).unwrap();
        assert_eq!(adv.ts_ms, 1_763_719_200_125);
        assert_eq!(adv.rssi, Some(-61));
        assert_eq!(
            adv.manufacturer(3831).unwrap(),
            decode_hex("4956e29f84211e44ffb51e").unwrap()
        );
        assert_eq!(
            adv.service_data[0].0,
            "0000feaa-0000-1000-8000-00805f9b34fb"
        );
        let again = Advertisement::from_record(&adv.to_record()).unwrap();
        assert_eq!(again, adv);
    }

    #[test]
    fn record_errors_name_the_field() {
        let e = Advertisement::from_record(r#"{"ts": 1, "mac": "nope"}"#).unwrap_err();
        assert!(e.to_string().starts_with("mac:"), "{e}");
        let e = Advertisement::from_record(
            r#"{"ts": 1, "mac": "C0FFEE000001", "manufacturer_data": {"x": "00"}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("company identifier"), "{e}");
        let e = Advertisement::from_record(
            r#"{"ts": 1, "mac": "C0FFEE000001", "manufacturer_data": {"1": "0"}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not hex"), "{e}");
        assert!(Advertisement::from_record("{not json").is_err());
    }

    /// The reader before it borrowed: owned strings and maps, the same checks.
    fn read_as_before(line: &str) -> Result<Advertisement, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Owned {
            ts: f64,
            mac: String,
            #[serde(default)]
            rssi: Option<i16>,
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            manufacturer_data: BTreeMap<String, String>,
            #[serde(default)]
            service_data: BTreeMap<String, String>,
        }
        let raw: Owned = serde_json::from_str(line).map_err(|e| e.to_string())?;
        Ok(Advertisement {
            ts_ms: (raw.ts * 1000.0).round() as EpochMillis,
            mac: raw.mac.parse().map_err(|e: BadMac| e.to_string())?,
            rssi: raw.rssi,
            name: raw.name,
            manufacturer_data: raw
                .manufacturer_data
                .iter()
                .map(|(k, v)| (k.parse().unwrap(), ::hex::decode(v).unwrap()))
                .collect(),
            service_data: raw
                .service_data
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), ::hex::decode(v).unwrap()))
                .collect(),
        })
    }

    #[test]
    fn the_borrowing_reader_reads_every_line_as_the_owning_one_did() {
        let lines = [
            // Escapes in every string (the reader's owned path).
            r#"{"ts": 1763719200.5, "mac": "C0:FF:EE:00:00:\u0030\u0031", "name": "T\"1", "manufacturer_data": {"\u0033831": "49\u0035600"}}"#,
            // A repeated key: the last wins; keys in order whatever the line's.
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "manufacturer_data": {"3831": "00", "76": "aa", "3831": "0102"}}"#,
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "service_data": {"fff0": "01", "0000FEAA-0000-1000-8000-00805F9B34FB": "10", "abcd": ""}}"#,
            r#"{"mac": "c0-ff-ee-00-00-02", "ts": 1763719200, "rssi": null, "manufacturer_data": {}}"#,
            // Refused alike: wrong types, unknown fields, a missing field.
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "manufacturer_data": null}"#,
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "manufacturer_data": ["00"]}"#,
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "manufacturer_data": {"3831": 5}}"#,
            r#"{"ts": 1763719200.5, "mac": 5}"#,
            r#"{"ts": 1763719200.5, "mac": "C0FFEE000001", "extra": 1}"#,
            r#"{"ts": 1763719200.5}"#,
        ];
        for line in lines {
            // The replay's path reads a good record as the text path does, and leaves
            // everything else to it.
            for framed in [
                line.to_string(),
                format!(" \t{line}\r\n"),
                format!("\u{a0}{line}"),
                format!("\u{b}{line}"),
            ] {
                if let Some(fast) = Advertisement::from_record_bytes(framed.as_bytes()) {
                    assert_eq!(
                        Ok(fast),
                        Advertisement::from_record(framed.trim()),
                        "{framed:?}"
                    );
                }
            }
            let now = Advertisement::from_record(line).map_err(|e| match e {
                RecordError::Json(e) => e,
                other => other.to_string(),
            });
            assert_eq!(now, read_as_before(line), "{line}");
        }
    }
}
