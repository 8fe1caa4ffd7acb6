//! `[[products]]`: which advertisements are tapes, and how their `ble_packet` is cut and
//! written. Raw to typed [`Products`]; touches its raw entries and the product types.

use super::problem::Check;
use super::raw::{IntOrString, RawProduct};
use super::DEFAULTS;
use crate::products::{expand_uuid, PacketEncoding, PacketSource, Product, Products};

/// The product table: the tape alone when the file names none.
pub(super) fn validate(list: Option<Vec<RawProduct>>, c: &mut Check) -> Products {
    match list {
        None => Products(vec![Product::tape()]),
        Some(list) if list.is_empty() => {
            c.other("products", "expected at least one [[products]] entry");
            Products::default()
        }
        Some(list) => Products(
            list.into_iter()
                .enumerate()
                .filter_map(|(i, p)| product(p, &format!("products[{i}]"), c))
                .collect(),
        ),
    }
}

fn product(p: RawProduct, key: &str, c: &mut Check) -> Option<Product> {
    let k = |f: &str| format!("{key}.{f}");
    let id = c.text(&k("id"), p.id, "the product id sent as product_id");
    let manufacturer_id = manufacturer_id(p.manufacturer_id.as_ref(), &k("manufacturer_id"), c);
    let service_uuid = service_uuid(p.service_uuid.as_deref(), &k("service_uuid"), c);
    let mac_prefix = mac_prefix(p.mac_prefix.as_deref(), &k("mac_prefix"), c);
    let min_rssi = p.min_rssi.and_then(|r| {
        if (-127..=20).contains(&r) {
            Some(r as i16)
        } else {
            c.bad(k("min_rssi"), r, "dBm from -127 to 20");
            None
        }
    });
    let packet = c.choice(
        &k("packet"),
        p.packet.as_deref(),
        DEFAULTS.products.packet,
        &[
            ("manufacturer_data", PacketSource::ManufacturerData),
            ("manufacturer_payload", PacketSource::ManufacturerPayload),
            ("service_data", PacketSource::ServiceData),
        ],
    );
    let packet_encoding = c.choice(
        &k("packet_encoding"),
        p.packet_encoding.as_deref(),
        DEFAULTS.products.packet_encoding,
        &[
            ("hex", PacketEncoding::Hex),
            ("hex_lower", PacketEncoding::HexLower),
            ("base64", PacketEncoding::Base64),
        ],
    );
    if p.manufacturer_id.is_none()
        && p.service_uuid.is_none()
        && p.name_prefix.is_none()
        && p.mac_prefix.is_none()
        && p.min_rssi.is_none()
    {
        c.other(
            key,
            "names no criterion (manufacturer_id, service_uuid, name_prefix, mac_prefix, min_rssi): it would match every advertisement",
        );
    }
    Some(Product {
        id: id?.into(),
        manufacturer_id,
        service_uuid,
        name_prefix: p.name_prefix,
        mac_prefix,
        min_rssi,
        packet,
        packet_encoding,
    })
}

fn manufacturer_id(m: Option<&IntOrString>, key: &str, c: &mut Check) -> Option<u16> {
    m.and_then(|m| match m.value() {
        Some(v) if (0..=0xFFFF).contains(&v) => Some(v as u16),
        _ => {
            c.bad(key, m.shown(), "a company identifier from 0 to 0xFFFF");
            None
        }
    })
}

fn service_uuid(u: Option<&str>, key: &str, c: &mut Check) -> Option<String> {
    u.and_then(|u| {
        let e = expand_uuid(u);
        if e.is_none() {
            c.bad(
                key,
                format!("{u:?}"),
                "a 16-, 32- or 128-bit UUID (\"feaa\" or \"0000feaa-0000-1000-8000-00805f9b34fb\")",
            );
        }
        e
    })
}

fn mac_prefix(m: Option<&str>, key: &str, c: &mut Check) -> Option<Vec<u8>> {
    m.and_then(|m| {
        let digits: String = m.chars().filter(|ch| *ch != ':' && *ch != '-').collect();
        match crate::record::decode_hex(&digits) {
            Some(b) if !b.is_empty() && b.len() <= 6 => Some(b),
            _ => {
                c.bad(
                    key,
                    format!("{m:?}"),
                    "1 to 6 leading octets of a MAC, such as \"C0:FF:EE\"",
                );
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::{parse, problems};
    use crate::products::{PacketEncoding, PacketSource};

    #[test]
    fn products_need_a_criterion_and_valid_values() {
        let p = problems("[[products]]\nid = \"x\"\n", &[]);
        assert!(p[0].message.contains("names no criterion"), "{p:?}");
        let c = parse(
            "[[products]]\nid = \"x\"\nservice_uuid = \"FEAA\"\nmac_prefix = \"c0:ff\"\nmin_rssi = -80\npacket = \"service_data\"\npacket_encoding = \"base64\"\n",
            &[],
        )
        .unwrap();
        let p = &c.products.0[0];
        assert_eq!(
            p.service_uuid.as_deref(),
            Some("0000feaa-0000-1000-8000-00805f9b34fb")
        );
        assert_eq!(p.mac_prefix, Some(vec![0xC0, 0xFF]));
        assert_eq!(p.packet, PacketSource::ServiceData);
        assert_eq!(p.packet_encoding, PacketEncoding::Base64);
    }
}
