//! How the domain's values are kept in columns: a MAC as a 48-bit integer, a packet of
//! upper-case hex digits as its bytes. A leaf of the state database's layer (`db`): it
//! touches only the domain's words (`record`).

use crate::record::Mac;

/// The `packet` column (of `pending` and `dead_letters`): a packet written as upper-case
/// hex digits (the default `ble_packet` encoding) is kept as its bytes, half the bytes on
/// the card; any other text as it is. [`packet_text`] reads back the same text.
pub(crate) fn packet_value(text: &str) -> rusqlite::types::ToSqlOutput<'_> {
    use rusqlite::types::{ToSqlOutput, Value, ValueRef};
    let digits = text.as_bytes();
    let mut bytes = vec![0u8; digits.len() / 2];
    if upper_hex_into(digits, &mut bytes) {
        ToSqlOutput::Owned(Value::Blob(bytes))
    } else {
        ToSqlOutput::Borrowed(ValueRef::Text(digits))
    }
}

/// Bytes of a packet [`packet_value_in`] decodes on the stack (a legacy advert's 31 and
/// more); a longer one takes the heap.
pub(crate) const PACKET_STACK: usize = 128;

/// [`packet_value`] decoded into `stack` when it fits: what every capture's insert
/// binds (SQLite copies a bound value), without an allocation.
pub(crate) fn packet_value_in<'a>(
    text: &'a str,
    stack: &'a mut [u8; PACKET_STACK],
) -> rusqlite::types::ToSqlOutput<'a> {
    use rusqlite::types::{ToSqlOutput, ValueRef};
    let digits = text.as_bytes();
    let Some(bytes) = stack.get_mut(..digits.len() / 2) else {
        return packet_value(text);
    };
    if upper_hex_into(digits, bytes) {
        ToSqlOutput::Borrowed(ValueRef::Blob(bytes))
    } else {
        ToSqlOutput::Borrowed(ValueRef::Text(digits))
    }
}

/// Decodes `digits` (upper-case hex, at least one pair) into `out` (half as long); false
/// if they are anything else.
fn upper_hex_into(digits: &[u8], out: &mut [u8]) -> bool {
    if digits.is_empty() || digits.len() % 2 != 0 {
        return false;
    }
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let (hi, lo) = (
            UPPER_HEX[usize::from(pair[0])],
            UPPER_HEX[usize::from(pair[1])],
        );
        if (hi | lo) & 0xF0 != 0 {
            return false;
        }
        *byte = hi << 4 | lo;
    }
    true
}

/// The value of each upper-case hex digit; 0xFF for every other byte.
const UPPER_HEX: [u8; 256] = {
    let mut table = [0xFFu8; 256];
    let mut d = 0;
    while d < 10 {
        table[b'0' as usize + d] = d as u8;
        d += 1;
    }
    let mut d = 0;
    while d < 6 {
        table[b'A' as usize + d] = 10 + d as u8;
        d += 1;
    }
    table
};

/// The text of a `packet` column written by [`packet_value`].
pub(crate) fn packet_text(
    v: rusqlite::types::ValueRef<'_>,
) -> rusqlite::types::FromSqlResult<String> {
    use rusqlite::types::{FromSql, ValueRef};
    match v {
        ValueRef::Blob(b) => Ok(crate::record::hex_upper(b)),
        other => String::column_result(other),
    }
}

/// The `mac` column holds the 48-bit address as an integer.
pub(crate) fn mac_to_int(mac: Mac) -> i64 {
    let o = mac.octets();
    o.iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b))
}

pub(crate) fn int_to_mac(v: i64) -> Mac {
    let mut o = [0u8; 6];
    for (i, b) in o.iter_mut().enumerate() {
        *b = (v >> (8 * (5 - i))) as u8;
    }
    Mac::new(o)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;

    #[test]
    fn a_packet_reads_back_as_the_text_it_was_whatever_it_is_kept_as() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (packet TEXT NOT NULL)")
            .unwrap();
        for text in [
            "F70E4956E29F84211E44FFB51E",
            "f70e4956",
            "F70e",
            "F70",
            "",
            "9w5WQw==",
            "0G",
            "00",
            "é0",
            &"AB".repeat(PACKET_STACK),
            &"AB".repeat(PACKET_STACK + 1),
            &format!("{}G0", "AB".repeat(PACKET_STACK)),
        ] {
            let upper_hex = !text.is_empty()
                && text.len() % 2 == 0
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
            let mut stack = [0u8; PACKET_STACK];
            for value in [packet_value(text), packet_value_in(text, &mut stack)] {
                conn.execute("DELETE FROM t", []).unwrap();
                conn.execute("INSERT INTO t VALUES (?1)", [value]).unwrap();
                let (back, kind): (String, String) = conn
                    .query_row("SELECT packet, typeof(packet) FROM t", [], |r| {
                        Ok((packet_text(r.get_ref(0)?)?, r.get(1)?))
                    })
                    .unwrap();
                assert_eq!(back, text);
                assert_eq!(kind, if upper_hex { "blob" } else { "text" }, "{text}");
            }
        }
    }

    #[test]
    fn mac_survives_the_integer_column() {
        let m: Mac = "C0:FF:EE:00:00:01".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
        let m: Mac = "FF:FF:FF:FF:FF:FF".parse().unwrap();
        assert_eq!(int_to_mac(mac_to_int(m)), m);
    }
}
