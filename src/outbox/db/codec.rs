//! How the domain's values are kept in columns: a MAC as a 48-bit integer, a packet of
//! upper-case hex digits as its bytes. A leaf of the outbox's `db`: it touches only
//! the domain's words (`record`).

use crate::record::Mac;

/// The `packet` column (of `pending` and `dead_letters`): a packet written as upper-case
/// hex digits (the default `ble_packet` encoding) is kept as its bytes, half the bytes on
/// the card; any other text as it is. [`packet_text`] reads back the same text.
pub fn packet_value(text: &str) -> rusqlite::types::ToSqlOutput<'_> {
    use rusqlite::types::{ToSqlOutput, Value, ValueRef};
    let digits = text.as_bytes();
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    };
    if digits.is_empty() || digits.len() % 2 != 0 {
        return ToSqlOutput::Borrowed(ValueRef::Text(digits));
    }
    let mut bytes = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks_exact(2) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => bytes.push(hi << 4 | lo),
            _ => return ToSqlOutput::Borrowed(ValueRef::Text(digits)),
        }
    }
    ToSqlOutput::Owned(Value::Blob(bytes))
}

/// The text of a `packet` column written by [`packet_value`].
pub fn packet_text(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<String> {
    use rusqlite::types::{FromSql, ValueRef};
    match v {
        ValueRef::Blob(b) => Ok(crate::record::hex_upper(b)),
        other => String::column_result(other),
    }
}

/// The `mac` column holds the 48-bit address as an integer.
pub fn mac_to_int(mac: Mac) -> i64 {
    let o = mac.octets();
    o.iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b))
}

pub fn int_to_mac(v: i64) -> Mac {
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
        ] {
            conn.execute("DELETE FROM t", []).unwrap();
            conn.execute("INSERT INTO t VALUES (?1)", [packet_value(text)])
                .unwrap();
            let (back, kind): (String, String) = conn
                .query_row("SELECT packet, typeof(packet) FROM t", [], |r| {
                    Ok((packet_text(r.get_ref(0)?)?, r.get(1)?))
                })
                .unwrap();
            assert_eq!(back, text);
            let upper_hex = !text.is_empty()
                && text.len() % 2 == 0
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
            assert_eq!(kind, if upper_hex { "blob" } else { "text" }, "{text}");
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
