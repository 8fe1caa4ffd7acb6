/*!
The mock's deterministic decoder of the simulated tape packet.

The real tapes' packet format is not public, so the simulated fleet and the mock agree
on one: the simulated fleet ([`crate::source::sim`]) defines it and produces it
([`TapeReading`], [`tape_payload`]); the mock reads it back with
[`TapeReading::from_payload`], so the two cannot drift apart. It is shaped like the one
observed advert (DESIGN.md: `F70E4956E29F84211E44FFB51E`, which decodes here too):
company identifier 0x0EF7 little-endian, then an 11-byte payload starting with the
marker `49 56`.
*/

use base64::Engine as _;

use crate::record::decode_hex;
pub use crate::source::sim::{tape_payload, TapeReading, PAYLOAD_LEN, TAPE_COMPANY_ID};

/// The 13 bytes of the manufacturer data as on air: company identifier little-endian,
/// then the payload.
pub fn manufacturer_data(r: &TapeReading) -> [u8; PAYLOAD_LEN + 2] {
    let mut out = [0u8; PAYLOAD_LEN + 2];
    out[..2].copy_from_slice(&TAPE_COMPANY_ID.to_le_bytes());
    out[2..].copy_from_slice(&tape_payload(r));
    out
}

/// Reads bytes that are either the 13-byte manufacturer data (starting `F7 0E`) or the
/// 11-byte payload alone.
fn payload_of(bytes: &[u8]) -> Option<TapeReading> {
    match bytes.len() {
        PAYLOAD_LEN => TapeReading::from_payload(bytes),
        n if n == PAYLOAD_LEN + 2 && bytes[..2] == TAPE_COMPANY_ID.to_le_bytes() => {
            TapeReading::from_payload(&bytes[2..])
        }
        _ => None,
    }
}

/// Decodes a `ble_packet` as the mock service does: hex (any case) or base64 (standard
/// or URL-safe, padded or not) of the manufacturer data or of the payload alone.
/// Hex is tried first; the two cannot be confused because the lengths differ (an
/// 11- or 13-byte packet is 22 or 26 hex digits, 15 to 20 base64 characters).
pub fn decode_packet(ble_packet: &str) -> Option<TapeReading> {
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

    const SAMPLE: TapeReading = TapeReading {
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
        let full = manufacturer_data(&SAMPLE);
        let payload = tape_payload(&SAMPLE);
        assert_eq!(full[..2], [0xF7, 0x0E]);
        assert_eq!(full[2..], payload);
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
    }

    #[test]
    fn packets_without_the_marker_or_of_another_length_are_invalid() {
        let mut no_marker = tape_payload(&SAMPLE);
        no_marker[0] = 0x00;
        let mut other_company = manufacturer_data(&SAMPLE);
        other_company[0] = 0x4C;
        for packet in [
            hex_upper(&no_marker),
            hex_upper(&other_company),
            hex_upper(&tape_payload(&SAMPLE)[..10]),
            "not a packet".to_string(),
            String::new(),
            "F70E4956E29F84211E44FFB51".to_string(),
        ] {
            assert_eq!(decode_packet(&packet), None, "{packet}");
        }
    }
}
