/*!
MACs and hex as the service reads them: a MAC in any common spelling to its plain key
(12 upper-case hex digits), the two `mac_id` forms a client may be configured to send,
and hex to bytes. The mock's own, so that it never shares a parser with the client it
tests. A leaf: it touches nothing.
*/

/// How a client writes `mac_id` (the spec fixes no form): `AABBCCDDEEFF` or
/// `AA:BB:CC:DD:EE:FF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacFormat {
    Plain,
    Colon,
}

/// The plain form (12 upper-case hex digits) of a MAC written with `:` or `-` between
/// its octets (five of them, any mix) or none, in any case; `None` when it is no MAC.
pub fn plain(s: &str) -> Option<String> {
    let digits: Vec<u8> = s.bytes().filter(|b| *b != b':' && *b != b'-').collect();
    let separators = s.len() - digits.len();
    if digits.len() != 12 || (separators != 0 && separators != 5) {
        return None;
    }
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    Some(String::from_utf8_lossy(&digits).to_ascii_uppercase())
}

/// The MAC of a `mac_id` written in `format` exactly (upper case), in plain form.
pub fn parse_mac_id(mac_id: &str, format: MacFormat) -> Option<String> {
    let upper_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    };
    let shaped = match format {
        MacFormat::Plain => mac_id.len() == 12 && upper_hex(mac_id),
        MacFormat::Colon => {
            mac_id.len() == 17
                && mac_id.split(':').count() == 6
                && mac_id.split(':').all(|o| o.len() == 2 && upper_hex(o))
        }
    };
    shaped.then(|| plain(mac_id)).flatten()
}

/// The key the service keeps a MAC under: its plain form, or (no MAC) the text upper
/// case.
pub fn key(mac: &str) -> String {
    plain(mac).unwrap_or_else(|| mac.to_ascii_uppercase())
}

/// Upper-case hex digits of `bytes` (the tests write packets with it).
#[cfg(test)]
pub fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The bytes of hex digits (either case); `None` for an odd length or a non-digit.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_in_any_common_spelling_has_one_plain_form() {
        for s in [
            "C0:FF:EE:00:00:01",
            "c0-ff-ee-00-00-01",
            "c0ffee000001",
            "C0:ff-EE:00:00:01",
        ] {
            assert_eq!(plain(s).as_deref(), Some("C0FFEE000001"), "{s}");
        }
        for s in [
            "C0:FF:EE:00:00",
            "C0FFEE0000011",
            "C0:FFEE000001",
            "g0ffee000001",
            "",
        ] {
            assert_eq!(plain(s), None, "{s}");
        }
        assert_eq!(key("C0:FF:EE:00:00:01"), "C0FFEE000001");
        assert_eq!(key("not-a-mac"), "NOT-A-MAC");
    }

    #[test]
    fn a_mac_id_is_accepted_only_in_the_form_asked_for() {
        let want = Some("AABBCCDDEEFF".to_string());
        assert_eq!(parse_mac_id("AABBCCDDEEFF", MacFormat::Plain), want);
        assert_eq!(parse_mac_id("AA:BB:CC:DD:EE:FF", MacFormat::Colon), want);
        for (mac, format) in [
            ("aabbccddeeff", MacFormat::Plain),
            ("AA:BB:CC:DD:EE:FF", MacFormat::Plain),
            ("aa:bb:cc:dd:ee:ff", MacFormat::Colon),
            ("AABBCCDDEEFF", MacFormat::Colon),
            ("AA-BB-CC-DD-EE-FF", MacFormat::Colon),
            ("AABBCCDDEE", MacFormat::Plain),
            ("AA:BBCCDDEEFF", MacFormat::Colon),
        ] {
            assert_eq!(parse_mac_id(mac, format), None, "{mac} as {format:?}");
        }
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(hex_upper(&[0xF7, 0x0E, 0x00]), "F70E00");
        assert_eq!(decode_hex("f70E00"), Some(vec![0xF7, 0x0E, 0x00]));
        for bad in ["F70", "F7G0", "+F"] {
            assert_eq!(decode_hex(bad), None, "{bad}");
        }
        assert_eq!(decode_hex(""), Some(vec![]));
    }
}
