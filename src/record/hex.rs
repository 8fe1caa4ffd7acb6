//! One hex codec, under the names the rest of tapegate uses. Not the `hex` crate's: its
//! decoder goes through an iterator adapter per byte and its encoder needs a second pass
//! for upper case, about a thousand instructions of every replayed capture.

/// The value of one hex digit (any case).
pub(super) fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes hex digits (any case, even length); `None` if they are not.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let digits = s.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks_exact(2) {
        out.push(hex_value(pair[0])? << 4 | hex_value(pair[1])?);
    }
    Some(out)
}

/// `bytes` as hex digits, from a table of digits: every capture's packet is written so.
fn hex_string(bytes: &[u8], upper: bool) -> String {
    let table: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut digits = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        digits.extend_from_slice(&[table[usize::from(b >> 4)], table[usize::from(b & 0xF)]]);
    }
    // Cannot fail: every byte is an ASCII digit.
    String::from_utf8(digits).unwrap_or_default()
}

/// Upper-case hex digits, no separators.
pub fn hex_upper(bytes: &[u8]) -> String {
    hex_string(bytes, true)
}

/// Lower-case hex digits, no separators.
pub fn hex_lower(bytes: &[u8]) -> String {
    hex_string(bytes, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_decode_in_any_case_and_nothing_else_does() {
        assert_eq!(decode_hex("f70E00"), Some(vec![0xF7, 0x0E, 0x00]));
        assert_eq!(decode_hex(""), Some(vec![]));
        for bad in ["0", "0g", "+1", " 01", "\u{e9}0"] {
            assert_eq!(decode_hex(bad), None, "{bad}");
        }
        for b in 0..=255u8 {
            assert_eq!(decode_hex(&format!("{b:02x}")), Some(vec![b]));
            assert_eq!(decode_hex(&format!("{b:02X}")), Some(vec![b]));
        }
    }
}
