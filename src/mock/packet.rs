/*!
The mock's reading of a `ble_packet`: the text (hex or base64) to bytes, and the bytes
to a [`TapeReading`] with the one layout the simulated fleet also writes
([`crate::tape`]).
*/

use base64::Engine as _;

use crate::record::decode_hex;
use crate::tape::TapeReading;

/// Decodes a `ble_packet` as the mock service does: hex (any case) or base64 (standard
/// or URL-safe, padded or not) of the manufacturer data or of the payload alone.
/// Hex is tried first; the two cannot be confused because the lengths differ (an
/// 11- or 13-byte packet is 22 or 26 hex digits, 15 to 20 base64 characters).
pub fn decode_packet(ble_packet: &str) -> Option<TapeReading> {
    let s = ble_packet.trim();
    if let Some(p) = decode_hex(s).as_deref().and_then(TapeReading::from_packet) {
        return Some(p);
    }
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    engines.iter().find_map(|e| {
        e.decode(s)
            .ok()
            .as_deref()
            .and_then(TapeReading::from_packet)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::hex_upper;
    use crate::tape::tests::SAMPLE;

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
        let full = SAMPLE.manufacturer_data();
        let payload = SAMPLE.payload();
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
        let mut no_marker = SAMPLE.payload();
        no_marker[0] = 0x00;
        let mut other_company = SAMPLE.manufacturer_data();
        other_company[0] = 0x4C;
        for packet in [
            hex_upper(&no_marker),
            hex_upper(&other_company),
            hex_upper(&SAMPLE.payload()[..10]),
            "not a packet".to_string(),
            String::new(),
            "F70E4956E29F84211E44FFB51".to_string(),
        ] {
            assert_eq!(decode_packet(&packet), None, "{packet}");
        }
    }
}
