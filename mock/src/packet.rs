/*!
The simulated tape's packet as the service reads it: `ble_packet` text (hex or base64)
to bytes, and the bytes to a [`Packet`]. The layout is the one the gateway's simulated
fleet writes (`tapegate::source::sim::tape`), read here by code of the mock's own: a second
implementation, so that a slip in the gateway's encoder shows as a test failure
instead of being read back by the same code. A leaf: it touches only `mac.rs`.

The bytes are either the 13-byte manufacturer data (`F7 0E`, the company identifier
0x0EF7 little-endian, then the payload) or the 11-byte payload alone:

| payload bytes | meaning |
|---|---|
| `[0..2]` | marker `49 56` |
| `[2..4]` | packet counter, u16 little-endian |
| `[4..6]` | temperature in 0.01 °C, i16 little-endian |
| `[6]` | battery percent |
| `[7]` | shock count |
| `[8..11]` | low 24 bits of the tape serial, little-endian |
*/

use base64::Engine as _;

use super::mac::decode_hex;

/// The company identifier 0x0EF7 as it is on air (little-endian).
const COMPANY_ID: [u8; 2] = [0xF7, 0x0E];
/// The first two bytes of every payload.
const MARKER: [u8; 2] = [0x49, 0x56];
/// Bytes of a payload, after the company identifier.
const PAYLOAD_LEN: usize = 11;

/// What one packet says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub counter: u16,
    /// Temperature in 0.01 °C.
    pub temp_centi: i16,
    /// Battery percent.
    pub battery: u8,
    pub shock_count: u8,
    /// Low 24 bits of the tape serial.
    pub serial: u32,
}

impl Packet {
    /// Temperature in °C.
    pub fn temp_c(&self) -> f64 {
        f64::from(self.temp_centi) / 100.0
    }

    /// The manufacturer data (with the company identifier) or the payload alone.
    fn from_bytes(bytes: &[u8]) -> Option<Packet> {
        let p = match bytes.len() {
            PAYLOAD_LEN => bytes,
            13 if bytes[..2] == COMPANY_ID => &bytes[2..],
            _ => return None,
        };
        if p[..2] != MARKER {
            return None;
        }
        Some(Packet {
            counter: u16::from(p[2]) | u16::from(p[3]) << 8,
            temp_centi: i16::from_le_bytes([p[4], p[5]]),
            battery: p[6],
            shock_count: p[7],
            serial: u32::from(p[8]) | u32::from(p[9]) << 8 | u32::from(p[10]) << 16,
        })
    }
}

/// Decodes a `ble_packet` as the mock service does: hex (any case) or base64 (standard
/// or URL-safe, padded or not) of the manufacturer data or of the payload alone.
/// Hex is tried first; the two cannot be confused because the lengths differ (an
/// 11- or 13-byte packet is 22 or 26 hex digits, 15 to 20 base64 characters).
pub fn decode_packet(ble_packet: &str) -> Option<Packet> {
    let s = ble_packet.trim();
    if let Some(p) = decode_hex(s).as_deref().and_then(Packet::from_bytes) {
        return Some(p);
    }
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    engines
        .iter()
        .find_map(|e| e.decode(s).ok().as_deref().and_then(Packet::from_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::hex_upper;

    /// A payload with every field in use (and a temperature below zero), written out
    /// by hand from the table above.
    const PAYLOAD: [u8; 11] = [0x49, 0x56, 0x34, 0x12, 0x1E, 0xFB, 87, 3, 0xEF, 0xCD, 0xAB];
    const SAMPLE: Packet = Packet {
        counter: 0x1234,
        temp_centi: -1250,
        battery: 87,
        shock_count: 3,
        serial: 0x00AB_CDEF,
    };

    fn full() -> Vec<u8> {
        [&COMPANY_ID[..], &PAYLOAD[..]].concat()
    }

    #[test]
    fn the_observed_advert_decodes() {
        let p = decode_packet("F70E4956E29F84211E44FFB51E").unwrap();
        assert_eq!(p.counter, 0x9FE2);
        assert_eq!(p.temp_centi, 0x2184);
        assert_eq!(p.battery, 0x1E);
        assert_eq!(p.shock_count, 0x44);
        assert_eq!(p.serial, 0x1E_B5FF);
    }

    #[test]
    fn a_payload_round_trips_through_hex_and_base64_with_or_without_company_id() {
        assert_eq!(SAMPLE.temp_c(), -12.5);
        let b64 = base64::engine::general_purpose::STANDARD;
        for packet in [
            hex_upper(&full()),
            hex_upper(&full()).to_lowercase(),
            hex_upper(&PAYLOAD),
            b64.encode(full()),
            b64.encode(PAYLOAD),
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(PAYLOAD),
        ] {
            assert_eq!(decode_packet(&packet), Some(SAMPLE), "{packet}");
        }
    }

    #[test]
    fn packets_without_the_marker_or_of_another_length_are_invalid() {
        let mut no_marker = PAYLOAD;
        no_marker[0] = 0x00;
        let mut other_company = full();
        other_company[0] = 0x4C;
        for packet in [
            hex_upper(&no_marker),
            hex_upper(&other_company),
            hex_upper(&PAYLOAD[..10]),
            "not a packet".to_string(),
            String::new(),
            "F70E4956E29F84211E44FFB51".to_string(),
        ] {
            assert_eq!(decode_packet(&packet), None, "{packet}");
        }
    }
}
