/*!
The packet format of the simulated tapes, and the mock's deterministic decoder.

The real tapes' packet format is not public, so the simulated fleet (`source::sim`) and
the mock agree on this one (module doc of [`crate::mock`] has the table). It is shaped
like the one observed advert (DESIGN.md: `F70E4956E29F84211E44FFB51E`, which decodes
here too): company identifier 0x0EF7 little-endian, then an 11-byte payload starting
with the marker `49 56`.
*/

use base64::Engine as _;

use crate::record::decode_hex;

/// Company identifier of the tapes' maker (Bluetooth SIG assigned).
pub const COMPANY_ID: u16 = 0x0EF7;
/// First two payload bytes of every simulated tape packet.
pub const MARKER: [u8; 2] = [0x49, 0x56];
/// Payload length (after the company identifier).
pub const PAYLOAD_LEN: usize = 11;

/// What one simulated tape packet says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapePayload {
    /// Packet counter (`cts`).
    pub counter: u16,
    /// Temperature in 0.01 °C.
    pub temp_centi: i16,
    /// Battery percent (`bat`).
    pub battery: u8,
    /// Shocks counted (`shock_count`).
    pub shock_count: u8,
    /// Low 24 bits of the tape serial.
    pub serial: u32,
}

impl TapePayload {
    /// The 11 payload bytes.
    pub fn to_bytes(&self) -> [u8; PAYLOAD_LEN] {
        let c = self.counter.to_le_bytes();
        let t = self.temp_centi.to_le_bytes();
        let s = self.serial.to_le_bytes();
        [
            MARKER[0],
            MARKER[1],
            c[0],
            c[1],
            t[0],
            t[1],
            self.battery,
            self.shock_count,
            s[0],
            s[1],
            s[2],
        ]
    }

    /// The 13 bytes of the manufacturer data as on air: company identifier
    /// little-endian, then the payload.
    pub fn to_manufacturer_data(&self) -> [u8; PAYLOAD_LEN + 2] {
        let mut out = [0u8; PAYLOAD_LEN + 2];
        out[..2].copy_from_slice(&COMPANY_ID.to_le_bytes());
        out[2..].copy_from_slice(&self.to_bytes());
        out
    }

    /// Reads an 11-byte payload; `None` without the marker or with another length.
    pub fn from_bytes(b: &[u8]) -> Option<TapePayload> {
        if b.len() != PAYLOAD_LEN || b[..2] != MARKER {
            return None;
        }
        Some(TapePayload {
            counter: u16::from_le_bytes([b[2], b[3]]),
            temp_centi: i16::from_le_bytes([b[4], b[5]]),
            battery: b[6],
            shock_count: b[7],
            serial: u32::from_le_bytes([b[8], b[9], b[10], 0]),
        })
    }

    /// Temperature in °C.
    pub fn temp_c(&self) -> f64 {
        f64::from(self.temp_centi) / 100.0
    }
}

/// Reads bytes that are either the 13-byte manufacturer data (starting `F7 0E`) or the
/// 11-byte payload alone.
fn payload_of(bytes: &[u8]) -> Option<TapePayload> {
    match bytes.len() {
        PAYLOAD_LEN => TapePayload::from_bytes(bytes),
        n if n == PAYLOAD_LEN + 2 && bytes[..2] == COMPANY_ID.to_le_bytes() => {
            TapePayload::from_bytes(&bytes[2..])
        }
        _ => None,
    }
}

/// Decodes a `ble_packet` as the mock service does: hex (any case) or base64 (standard
/// or URL-safe, padded or not) of the manufacturer data or of the payload alone.
/// Hex is tried first; the two cannot be confused because the lengths differ (an
/// 11- or 13-byte packet is 22 or 26 hex digits, 15 to 20 base64 characters).
pub fn decode_packet(ble_packet: &str) -> Option<TapePayload> {
    let s = ble_packet.trim();
    if let Some(p) = decode_hex(s).as_deref().and_then(payload_of) {
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
        .find_map(|e| e.decode(s).ok().as_deref().and_then(payload_of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::hex_upper;

    const SAMPLE: TapePayload = TapePayload {
        counter: 0x1234,
        temp_centi: -1250,
        battery: 87,
        shock_count: 3,
        serial: 0x00AB_CDEF,
    };

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
        let full = SAMPLE.to_manufacturer_data();
        let payload = SAMPLE.to_bytes();
        let b64 = base64::engine::general_purpose::STANDARD;
        for packet in [
            hex_upper(&full),
            hex_upper(&full).to_lowercase(),
            hex_upper(&payload),
            b64.encode(full),
            b64.encode(payload),
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(payload),
        ] {
            assert_eq!(decode_packet(&packet), Some(SAMPLE), "{packet}");
        }
        assert_eq!(SAMPLE.temp_c(), -12.5);
    }

    #[test]
    fn packets_without_the_marker_or_of_another_length_are_invalid() {
        let mut no_marker = SAMPLE.to_bytes();
        no_marker[0] = 0x00;
        let mut other_company = SAMPLE.to_manufacturer_data();
        other_company[0] = 0x4C;
        for packet in [
            hex_upper(&no_marker),
            hex_upper(&other_company),
            hex_upper(&SAMPLE.to_bytes()[..10]),
            "not a packet".to_string(),
            String::new(),
            "F70E4956E29F84211E44FFB51".to_string(),
        ] {
            assert_eq!(decode_packet(&packet), None, "{packet}");
        }
    }
}
