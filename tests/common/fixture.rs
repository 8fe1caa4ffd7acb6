//! The data the tests are built on: adverts as a radio hears them and captures as the
//! outbox stores them, of the default tape product.

use tapegate::record::{hex_upper, Advertisement, Capture, Mac};

/// A capture of the default tape product (`product_id` "tape") at `ts_ms` with a
/// recorded time (no boot time) and RSSI -60. A test that needs another field says so
/// with struct update: `Capture { rssi: Some(-61), ..capture(mac, ts_ms, packet) }`.
pub fn capture(mac: Mac, ts_ms: i64, packet: impl Into<String>) -> Capture {
    Capture {
        mac,
        ts_ms,
        product_id: "tape".into(),
        packet: packet.into(),
        rssi: Some(-60),
        boot_ms: None,
    }
}

/// A tape advert: company 0x0EF7, an 11-byte payload carrying `counter`.
pub fn tape_advert(mac: Mac, ts_ms: i64, counter: u16) -> Advertisement {
    let mut payload = vec![0x49, 0x56];
    payload.extend_from_slice(&counter.to_le_bytes());
    payload.extend_from_slice(&[0x10, 0x01, 90, 0, 0x01, 0x02, 0x03]);
    Advertisement {
        ts_ms,
        mac,
        rssi: Some(-60),
        name: Some("TT".into()),
        manufacturer_data: vec![(0x0EF7, payload)],
        service_data: vec![],
    }
}

/// An advert of something that is not a tape.
pub fn other_advert(mac: Mac, ts_ms: i64) -> Advertisement {
    Advertisement {
        ts_ms,
        mac,
        rssi: Some(-70),
        name: None,
        manufacturer_data: vec![(0x004C, vec![0x02, 0x15, 0x01])],
        service_data: vec![],
    }
}

pub fn tape_mac(i: u32) -> Mac {
    let b = i.to_be_bytes();
    Mac::new([0xC0, 0xFF, 0xEE, b[1], b[2], b[3]])
}

/// The packet the default tape product sends for `tape_advert(_, _, counter)`.
pub fn tape_packet(counter: u16) -> String {
    let a = tape_advert(tape_mac(0), 0, counter);
    let mut bytes = vec![0xF7, 0x0E];
    bytes.extend_from_slice(&a.manufacturer_data[0].1);
    hex_upper(&bytes)
}

/// Advert `i` of a synthetic trace over `tapes` tapes, each advert's packet new for its
/// tape: tape `i % tapes` (its MAC, [`tape_mac`], ends in its serial), counter
/// `i / tapes`, no name, RSSI -60.
pub fn trace_advert(i: u64, tapes: u64, ts_ms: i64) -> Advertisement {
    let mac = tape_mac((i % tapes) as u32);
    let [.., s0, s1, s2] = mac.octets();
    let counter = ((i / tapes) as u16).to_le_bytes();
    let payload = vec![
        0x49, 0x56, counter[0], counter[1], 0x10, 0x01, 90, 0, s0, s1, s2,
    ];
    Advertisement {
        ts_ms,
        mac,
        rssi: Some(-60),
        name: None,
        manufacturer_data: vec![(0x0EF7, payload)],
        service_data: vec![],
    }
}
