/*!
Advertising data (AD structures, Core Specification Supplement part A) parsed into what
an [`Advertisement`] holds, the way BlueZ fills a device's properties from the same
bytes (`src/eir.c`): each structure is a length octet, a type octet and `length - 1`
data octets; a zero length ends the data (padding). A structure whose length runs past
the end is dropped with everything after it, and the report is marked truncated; what
came before it is kept. Pure: it touches the records only.

- Manufacturer Specific Data (0xFF): company identifier (u16 LE), then the data; a
  company seen twice (advertising data and scan response) keeps the later bytes, as
  BlueZ's `ManufacturerData` map does. Sorted by company identifier, as the D-Bus path.
- Service Data, 16-, 32- and 128-bit UUID (0x16, 0x20, 0x21): keyed by the UUID in its
  128-bit lower-case form (`0000feaa-0000-1000-8000-00805f9b34fb`), sorted.
- Complete or Shortened Local Name (0x09, 0x08): the complete name wins; trailing NUL
  bytes (some vendors end the name with one) are dropped and invalid UTF-8 is replaced,
  as BlueZ does (`eir_parse`, src/eir.c).
- Everything else (flags, UUID lists, TX power...) is skipped: no product criterion or
  record field reads it.
*/

use crate::record::{Advertisement, EpochMillis, Mac};

const SHORT_NAME: u8 = 0x08;
const COMPLETE_NAME: u8 = 0x09;
const SERVICE_DATA_16: u8 = 0x16;
const SERVICE_DATA_32: u8 = 0x20;
const SERVICE_DATA_128: u8 = 0x21;
const MANUFACTURER_DATA: u8 = 0xFF;

/// What one report's advertising data says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pub name: Option<String>,
    /// Whether `name` is the complete name (a shortened one gives way to it).
    pub complete_name: bool,
    pub manufacturer_data: Vec<(u16, Vec<u8>)>,
    pub service_data: Vec<(String, Vec<u8>)>,
    /// A structure ran past the end of the data.
    pub truncated: bool,
}

impl Fields {
    /// The advertisement of `mac` heard at `ts_ms` with `rssi`.
    pub fn into_advert(self, ts_ms: EpochMillis, mac: Mac, rssi: Option<i16>) -> Advertisement {
        Advertisement {
            ts_ms,
            mac,
            rssi,
            name: self.name,
            manufacturer_data: self.manufacturer_data,
            service_data: self.service_data,
        }
    }
}

/// Parses the AD structures of `data`.
pub fn parse(data: &[u8]) -> Fields {
    let mut f = Fields::default();
    let mut at = 0;
    while let Some(&len) = data.get(at) {
        let len = usize::from(len);
        if len == 0 {
            break;
        }
        let Some(s) = data.get(at + 1..at + 1 + len) else {
            f.truncated = true;
            break;
        };
        at += 1 + len;
        let (ad_type, body) = (s[0], &s[1..]);
        match ad_type {
            MANUFACTURER_DATA => {
                if let [lo, hi, rest @ ..] = body {
                    put(
                        &mut f.manufacturer_data,
                        u16::from_le_bytes([*lo, *hi]),
                        rest,
                    );
                }
            }
            SERVICE_DATA_16 if body.len() >= 2 => {
                let uuid = u32::from(u16::from_le_bytes([body[0], body[1]]));
                put(&mut f.service_data, short_uuid(uuid), &body[2..]);
            }
            SERVICE_DATA_32 if body.len() >= 4 => {
                let uuid = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                put(&mut f.service_data, short_uuid(uuid), &body[4..]);
            }
            SERVICE_DATA_128 if body.len() >= 16 => {
                put(&mut f.service_data, long_uuid(&body[..16]), &body[16..]);
            }
            COMPLETE_NAME => {
                f.name = Some(name(body));
                f.complete_name = true;
            }
            SHORT_NAME if !f.complete_name => f.name = Some(name(body)),
            _ => {}
        }
    }
    f
}

/// A name's text without the NUL bytes that end it.
fn name(body: &[u8]) -> String {
    let end = body.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&body[..end]).into_owned()
}

/// Puts `data` under `key`, replacing what an earlier structure put there, keeping
/// `list` sorted by key.
fn put<K: Ord>(list: &mut Vec<(K, Vec<u8>)>, key: K, data: &[u8]) {
    match list.binary_search_by(|(k, _)| k.cmp(&key)) {
        Ok(i) => data.clone_into(&mut list[i].1),
        Err(i) => list.insert(i, (key, data.to_vec())),
    }
}

/// A 16- or 32-bit UUID in its 128-bit form on the Bluetooth base UUID.
fn short_uuid(uuid: u32) -> String {
    format!("{uuid:08x}-0000-1000-8000-00805f9b34fb")
}

/// A 128-bit UUID from its little-endian bytes, written lower case.
fn long_uuid(le: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, b) in le.iter().rev().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0x0F)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::wire::build::ad;
    use super::*;

    #[test]
    fn the_observed_tape_advert_parses_to_its_manufacturer_data() {
        // Flags, then the tape's manufacturer data as observed (DESIGN.md, Products).
        let mut data = ad(0x01, &[0x06]);
        data.extend(ad(
            0xFF,
            &hex::decode("F70E4956E29F84211E44FFB51E").unwrap(),
        ));
        let f = parse(&data);
        assert!(!f.truncated);
        assert_eq!(
            f.manufacturer_data,
            vec![(0x0EF7, hex::decode("4956E29F84211E44FFB51E").unwrap())]
        );
        assert_eq!(f.name, None);
        assert!(f.service_data.is_empty());
    }

    #[test]
    fn an_eddystone_and_ibeacon_advert_from_public_captures() {
        // Eddystone-UID (16-bit service data 0xFEAA, frame type 0x00) with its UUID list.
        let mut data = ad(0x01, &[0x06]);
        data.extend(ad(0x03, &[0xAA, 0xFE]));
        data.extend(ad(0x16, &[0xAA, 0xFE, 0x00, 0xEB, 0x01, 0x02]));
        // iBeacon: Apple (0x004C), type 0x02, length 0x15.
        data.extend(ad(0xFF, &[0x4C, 0x00, 0x02, 0x15, 0xAB]));
        data.extend(ad(0x09, b"TT-0001"));
        let f = parse(&data);
        assert_eq!(
            f.service_data,
            vec![(
                "0000feaa-0000-1000-8000-00805f9b34fb".to_string(),
                vec![0x00, 0xEB, 0x01, 0x02]
            )]
        );
        assert_eq!(f.manufacturer_data, vec![(0x004C, vec![0x02, 0x15, 0xAB])]);
        assert_eq!(f.name.as_deref(), Some("TT-0001"));
    }

    #[test]
    fn uuids_are_written_as_bluez_writes_them() {
        let mut data = ad(0x20, &[0x78, 0x56, 0x34, 0x12, 9]);
        let le: Vec<u8> = (0u8..16).collect();
        let mut s = le.clone();
        s.push(7);
        data.extend(ad(0x21, &s));
        let f = parse(&data);
        assert_eq!(
            f.service_data,
            vec![
                ("0f0e0d0c-0b0a-0908-0706-050403020100".to_string(), vec![7]),
                ("12345678-0000-1000-8000-00805f9b34fb".to_string(), vec![9]),
            ]
        );
    }

    #[test]
    fn a_scan_responses_data_for_the_same_company_replaces_the_adverts() {
        let mut data = ad(0xFF, &[0xF7, 0x0E, 1]);
        data.extend(ad(0xFF, &[0x4C, 0x00, 2]));
        data.extend(ad(0x08, b"TT"));
        data.extend(ad(0xFF, &[0xF7, 0x0E, 3]));
        data.extend(ad(0x09, b"TT-0001"));
        data.extend(ad(0x08, b"TT"));
        let f = parse(&data);
        assert_eq!(
            f.manufacturer_data,
            vec![(0x004C, vec![2]), (0x0EF7, vec![3])]
        );
        assert_eq!(f.name.as_deref(), Some("TT-0001"), "complete name wins");
    }

    #[test]
    fn a_truncated_structure_keeps_what_came_before_it() {
        let mut data = ad(0xFF, &[0xF7, 0x0E, 1, 2]);
        data.extend([9, 0x09, b'T']);
        let f = parse(&data);
        assert!(f.truncated);
        assert_eq!(f.manufacturer_data, vec![(0x0EF7, vec![1, 2])]);
        assert_eq!(f.name, None);
    }

    #[test]
    fn zero_length_ends_the_data_and_short_bodies_are_skipped() {
        let mut data = ad(0xFF, &[0xF7]);
        data.extend(ad(0x16, &[0xAA]));
        data.extend([0, 0, 0]);
        data.extend(ad(0x09, b"after padding"));
        let f = parse(&data);
        assert_eq!(f, Fields::default());
    }

    #[test]
    fn a_255_byte_extended_report_parses_whole() {
        // Extended advertising: one structure of 254 bytes (type + 253 data).
        let body: Vec<u8> = [0xF7, 0x0E]
            .into_iter()
            .chain((0..251).map(|i| i as u8))
            .collect();
        let data = ad(0xFF, &body);
        assert_eq!(data.len(), 255);
        let f = parse(&data);
        assert!(!f.truncated);
        assert_eq!(f.manufacturer_data[0].1.len(), 251);
    }

    #[test]
    fn invalid_utf8_in_a_name_is_replaced_not_refused() {
        let f = parse(&ad(0x09, &[b'T', 0xFF, b'T']));
        assert_eq!(f.name.as_deref(), Some("T\u{FFFD}T"));
    }
}
