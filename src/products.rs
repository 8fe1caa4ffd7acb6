/*!
Which advertisements are tapes, and what is sent for them.

A `[[products]]` entry both filters and labels: an advertisement matches a product when
every criterion the product names matches; the first matching product wins; an
advertisement that matches none is dropped (and counted by the caller). The matched
product gives the capture its `product_id` and the bytes of its `ble_packet`.

A product whose packet part is absent from an advertisement (it names
`packet = "service_data"` but the advert carries none) does not match it: the next
product is tried, because a capture without a packet could not be decoded anyway.

This runs for every advertisement heard (the goal is 200,000 a second), so matching
borrows from the advertisement and allocates nothing; only a match builds the
[`Capture`] (its `product_id` and encoded packet).

Decisions where DESIGN.md is silent:
- `name_prefix` is compared case-sensitively (BLE local names are exact strings).
- An advertisement's service UUID may be in any case and in 16-, 32- or 128-bit form;
  it is compared with the product's 128-bit form by value.
*/

use base64::Engine as _;
use uuid::Uuid;

use crate::record::{hex_lower, hex_upper, Advertisement, Capture};

/// Which bytes of the advertisement become `ble_packet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PacketSource {
    /// Company identifier little-endian, then the data, as on air (default).
    #[default]
    ManufacturerData,
    /// The data after the company identifier.
    ManufacturerPayload,
    /// The service data of `service_uuid` (or the first service data).
    ServiceData,
}

/// How `ble_packet` bytes are written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PacketEncoding {
    /// Upper-case hex (default).
    #[default]
    Hex,
    HexLower,
    /// Standard alphabet, padded.
    Base64,
}

impl PacketEncoding {
    /// `bytes` written in this encoding.
    pub fn encode(self, bytes: &[u8]) -> String {
        match self {
            PacketEncoding::Hex => hex_upper(bytes),
            PacketEncoding::HexLower => hex_lower(bytes),
            PacketEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

/// One validated `[[products]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Product {
    /// Sent as `product_id`.
    pub id: String,
    pub manufacturer_id: Option<u16>,
    /// Lower case, 128-bit form (`0000feaa-0000-1000-8000-00805f9b34fb`).
    pub service_uuid: Option<String>,
    pub name_prefix: Option<String>,
    /// Leading octets of the MAC.
    pub mac_prefix: Option<Vec<u8>>,
    pub min_rssi: Option<i16>,
    pub packet: PacketSource,
    pub packet_encoding: PacketEncoding,
}

/// The packet bytes of a matched advertisement, borrowed from it.
enum PacketBytes<'a> {
    /// The bytes as they are in the advertisement.
    Whole(&'a [u8]),
    /// A company identifier (written little-endian) followed by its data.
    Prefixed(u16, &'a [u8]),
}

impl PacketBytes<'_> {
    fn encode(&self, encoding: PacketEncoding) -> String {
        match *self {
            PacketBytes::Whole(bytes) => encoding.encode(bytes),
            PacketBytes::Prefixed(id, data) => {
                // Legacy adverts carry at most 31 bytes: the stack buffer always fits
                // them; extended adverts take the heap.
                let mut stack = [0u8; 64];
                let len = data.len() + 2;
                if len <= stack.len() {
                    stack[..2].copy_from_slice(&id.to_le_bytes());
                    stack[2..len].copy_from_slice(data);
                    encoding.encode(&stack[..len])
                } else {
                    let mut heap = Vec::with_capacity(len);
                    heap.extend_from_slice(&id.to_le_bytes());
                    heap.extend_from_slice(data);
                    encoding.encode(&heap)
                }
            }
        }
    }
}

impl Product {
    /// The asset-tracking tape: manufacturer data of company 0x0EF7 as on air, hex,
    /// `product_id` "tape". The default when the config names no product.
    pub fn tape() -> Product {
        Product {
            id: "tape".into(),
            manufacturer_id: Some(0x0EF7),
            service_uuid: None,
            name_prefix: None,
            mac_prefix: None,
            min_rssi: None,
            packet: PacketSource::ManufacturerData,
            packet_encoding: PacketEncoding::Hex,
        }
    }

    /// The capture of `adv` under this product, or `None` if `adv` does not match it.
    pub fn capture(&self, adv: &Advertisement) -> Option<Capture> {
        let bytes = self.packet_bytes(adv)?;
        Some(Capture {
            mac: adv.mac,
            ts_ms: adv.ts_ms,
            product_id: self.id.clone(),
            packet: bytes.encode(self.packet_encoding),
            rssi: adv.rssi,
            boot_ms: None,
        })
    }

    /// Whether `adv` matches this product: every named criterion holds and the packet
    /// part is present.
    pub fn matches(&self, adv: &Advertisement) -> bool {
        self.packet_bytes(adv).is_some()
    }

    /// The packet of `adv` if it matches this product.
    fn packet_bytes<'a>(&self, adv: &'a Advertisement) -> Option<PacketBytes<'a>> {
        if !self.criteria_hold(adv) {
            return None;
        }
        match self.packet {
            PacketSource::ManufacturerData => {
                let (id, data) = self.manufacturer(adv)?;
                Some(PacketBytes::Prefixed(id, data))
            }
            PacketSource::ManufacturerPayload => {
                let (_, data) = self.manufacturer(adv)?;
                Some(PacketBytes::Whole(data))
            }
            PacketSource::ServiceData => self.service(adv).map(PacketBytes::Whole),
        }
    }

    fn criteria_hold(&self, adv: &Advertisement) -> bool {
        if let Some(min) = self.min_rssi {
            if adv.rssi.is_none_or(|rssi| rssi < min) {
                return false;
            }
        }
        if let Some(prefix) = &self.mac_prefix {
            if !adv.mac.octets().starts_with(prefix) {
                return false;
            }
        }
        if let Some(prefix) = &self.name_prefix {
            if !adv
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(prefix.as_str()))
            {
                return false;
            }
        }
        if self.manufacturer_id.is_some() && self.manufacturer(adv).is_none() {
            return false;
        }
        if self.service_uuid.is_some() && self.service(adv).is_none() {
            return false;
        }
        true
    }

    /// The manufacturer data of `manufacturer_id`, or the first one if none is named.
    fn manufacturer<'a>(&self, adv: &'a Advertisement) -> Option<(u16, &'a [u8])> {
        let mut all = adv.manufacturer_data.iter();
        let found = match self.manufacturer_id {
            Some(want) => all.find(|(id, _)| *id == want),
            None => all.next(),
        };
        found.map(|(id, data)| (*id, data.as_slice()))
    }

    /// The service data of `service_uuid`, or the first one if none is named.
    fn service<'a>(&self, adv: &'a Advertisement) -> Option<&'a [u8]> {
        let mut all = adv.service_data.iter();
        let found = match &self.service_uuid {
            Some(want) => all.find(|(uuid, _)| uuid_eq(want, uuid)),
            None => all.next(),
        };
        found.map(|(_, data)| data.as_slice())
    }
}

/// The ordered product list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Products(pub Vec<Product>);

impl Products {
    /// The capture of `adv` under the first product it matches, or `None` when it
    /// matches no product (or the matched product's packet is absent from it).
    pub fn capture(&self, adv: &Advertisement) -> Option<Capture> {
        self.0.iter().find_map(|p| p.capture(adv))
    }

    /// The first product `adv` matches (the one [`Products::capture`] would use).
    pub fn matches(&self, adv: &Advertisement) -> Option<&Product> {
        self.0.iter().find(|p| p.matches(adv))
    }
}

/// The Bluetooth base UUID `00000000-0000-1000-8000-00805f9b34fb`: 16- and 32-bit UUIDs
/// are its top 32 bits.
const BASE_UUID: u128 = 0x0000_0000_0000_1000_8000_0080_5f9b_34fb;

/// A 16-bit (`feaa`, `0xFEAA`), 32-bit (`0000feaa`) or 128-bit UUID (with or without
/// hyphens), in any case, in its lower-case 128-bit form
/// (`0000feaa-0000-1000-8000-00805f9b34fb`); `None` if `s` is none of these.
pub fn expand_uuid(s: &str) -> Option<String> {
    Some(parse_uuid(s)?.hyphenated().to_string())
}

/// The forms [`expand_uuid`] accepts. The `uuid` crate reads the 128-bit ones (only
/// the plain and hyphenated forms: no braces, no `urn:uuid:`); the short Bluetooth
/// forms, optionally with `0x`, are ours.
fn parse_uuid(s: &str) -> Option<Uuid> {
    let short = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    match short.len() {
        4 | 8 => {
            let mut be = [0u8; 4];
            hex::decode_to_slice(short, &mut be[4 - short.len() / 2..]).ok()?;
            let value = u128::from(u32::from_be_bytes(be));
            Some(Uuid::from_u128((value << 96) | BASE_UUID))
        }
        32 | 36 if short.len() == s.len() => Uuid::try_parse(s).ok(),
        _ => None,
    }
}

/// Whether the advertisement's service UUID `key` is the product's `want` (128-bit,
/// lower case). The usual case, the same 128-bit form, is compared without parsing.
fn uuid_eq(want: &str, key: &str) -> bool {
    key.eq_ignore_ascii_case(want)
        || (key.len() != want.len() && parse_uuid(key).is_some_and(|k| parse_uuid(want) == Some(k)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{decode_hex, Mac};

    const EDDYSTONE: &str = "0000feaa-0000-1000-8000-00805f9b34fb";

    fn product(id: &str) -> Product {
        Product {
            id: id.to_string(),
            manufacturer_id: None,
            service_uuid: None,
            name_prefix: None,
            mac_prefix: None,
            min_rssi: None,
            packet: PacketSource::ManufacturerData,
            packet_encoding: PacketEncoding::Hex,
        }
    }

    fn tape() -> Product {
        Product::tape()
    }

    /// The observed advert: company 0x0EF7, 11 bytes of payload.
    fn observed() -> Advertisement {
        Advertisement {
            ts_ms: 1_763_719_200_125,
            mac: "C0:FF:EE:00:00:01".parse().unwrap(),
            rssi: Some(-61),
            name: Some("TT-0001".to_string()),
            manufacturer_data: vec![(0x0EF7, decode_hex("4956E29F84211E44FFB51E").unwrap())],
            service_data: vec![(EDDYSTONE.to_string(), vec![0x10, 0x00, 0xAB])],
        }
    }

    fn with_mac(mac: &str) -> Advertisement {
        Advertisement {
            mac: mac.parse().unwrap(),
            ..observed()
        }
    }

    #[test]
    fn the_observed_advert_gives_the_observed_packet_in_hex() {
        let products = Products(vec![tape()]);
        let capture = products.capture(&observed()).unwrap();
        assert_eq!(
            capture,
            Capture {
                mac: Mac::new([0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01]),
                ts_ms: 1_763_719_200_125,
                product_id: "tape".to_string(),
                packet: "F70E4956E29F84211E44FFB51E".to_string(),
                rssi: Some(-61),
                boot_ms: None,
            }
        );
    }

    #[test]
    fn manufacturer_id_must_be_carried_by_the_advert() {
        let other = Product {
            manufacturer_id: Some(0x004C),
            ..product("apple")
        };
        assert!(!other.matches(&observed()));
        assert!(tape().matches(&observed()));
    }

    #[test]
    fn manufacturer_data_packet_takes_the_named_company_not_the_first() {
        let mut adv = observed();
        adv.manufacturer_data.insert(0, (0x004C, vec![0x01, 0x02]));
        let capture = tape().capture(&adv).unwrap();
        assert_eq!(capture.packet, "F70E4956E29F84211E44FFB51E");
    }

    #[test]
    fn manufacturer_data_packet_takes_the_first_company_when_none_is_named() {
        let mut adv = observed();
        adv.manufacturer_data.insert(0, (0x004C, vec![0x01, 0x02]));
        assert_eq!(product("any").capture(&adv).unwrap().packet, "4C000102");
    }

    #[test]
    fn manufacturer_payload_packet_leaves_out_the_company_id() {
        let p = Product {
            packet: PacketSource::ManufacturerPayload,
            ..tape()
        };
        assert_eq!(
            p.capture(&observed()).unwrap().packet,
            "4956E29F84211E44FFB51E"
        );
    }

    #[test]
    fn service_data_packet_takes_the_data_of_the_named_uuid() {
        let mut adv = observed();
        adv.service_data.insert(
            0,
            (
                "0000fe9f-0000-1000-8000-00805f9b34fb".to_string(),
                vec![0xFF],
            ),
        );
        let named = Product {
            service_uuid: Some(EDDYSTONE.to_string()),
            packet: PacketSource::ServiceData,
            ..product("beacon")
        };
        assert_eq!(named.capture(&adv).unwrap().packet, "1000AB");
        let first = Product {
            packet: PacketSource::ServiceData,
            ..product("beacon")
        };
        assert_eq!(first.capture(&adv).unwrap().packet, "FF");
    }

    #[test]
    fn service_uuid_must_be_carried_by_the_advert_in_any_form() {
        let p = Product {
            service_uuid: Some(EDDYSTONE.to_string()),
            ..product("beacon")
        };
        assert!(p.matches(&observed()));
        for key in ["FEAA", "0000FEAA-0000-1000-8000-00805F9B34FB", "0000feaa"] {
            let mut adv = observed();
            adv.service_data[0].0 = key.to_string();
            assert!(p.matches(&adv), "{key}");
        }
        let mut adv = observed();
        adv.service_data[0].0 = "0000fe9f-0000-1000-8000-00805f9b34fb".to_string();
        assert!(!p.matches(&adv));
        adv.service_data.clear();
        assert!(!p.matches(&adv));
    }

    #[test]
    fn name_prefix_must_start_the_advertised_name() {
        let p = Product {
            name_prefix: Some("TT-".to_string()),
            ..tape()
        };
        assert!(p.matches(&observed()));
        let mut adv = observed();
        adv.name = Some("tt-0001".to_string());
        assert!(!p.matches(&adv), "the prefix is case-sensitive");
        adv.name = None;
        assert!(!p.matches(&adv), "an advert without a name has no prefix");
    }

    #[test]
    fn mac_prefix_must_lead_the_mac() {
        let p = Product {
            mac_prefix: Some(vec![0xC0, 0xFF]),
            ..tape()
        };
        assert!(p.matches(&observed()));
        assert!(!p.matches(&with_mac("C0:FE:EE:00:00:01")));
        assert!(!p.matches(&with_mac("00:C0:FF:00:00:01")));
    }

    #[test]
    fn min_rssi_needs_a_present_rssi_at_least_as_strong() {
        let p = Product {
            min_rssi: Some(-70),
            ..tape()
        };
        let mut adv = observed();
        for (rssi, want) in [
            (Some(-61), true),
            (Some(-70), true),
            (Some(-71), false),
            (None, false),
        ] {
            adv.rssi = rssi;
            assert_eq!(p.matches(&adv), want, "{rssi:?}");
        }
    }

    #[test]
    fn every_named_criterion_must_hold() {
        let p = Product {
            name_prefix: Some("TT-".to_string()),
            mac_prefix: Some(vec![0xC0]),
            min_rssi: Some(-80),
            ..tape()
        };
        assert!(p.matches(&observed()));
        assert!(!p.matches(&with_mac("D0:FF:EE:00:00:01")));
    }

    #[test]
    fn first_matching_product_wins() {
        let products = Products(vec![
            Product {
                mac_prefix: Some(vec![0xAA]),
                ..product("first")
            },
            Product {
                packet_encoding: PacketEncoding::HexLower,
                ..product("second")
            },
            product("third"),
        ]);
        assert_eq!(products.matches(&observed()).unwrap().id, "second");
        let capture = products.capture(&observed()).unwrap();
        assert_eq!(capture.product_id, "second");
        assert_eq!(capture.packet, "f70e4956e29f84211e44ffb51e");
    }

    #[test]
    fn a_product_whose_packet_part_is_absent_gives_way_to_the_next() {
        let products = Products(vec![
            Product {
                packet: PacketSource::ServiceData,
                ..product("beacon")
            },
            tape(),
        ]);
        let mut adv = observed();
        adv.service_data.clear();
        assert_eq!(products.capture(&adv).unwrap().product_id, "tape");
        adv.manufacturer_data.clear();
        assert_eq!(products.capture(&adv), None);
        assert_eq!(products.matches(&adv), None);
    }

    #[test]
    fn an_advert_matching_no_product_gives_no_capture() {
        let mut adv = observed();
        adv.manufacturer_data = vec![(0x004C, vec![0x02, 0x15])];
        assert_eq!(Products(vec![tape()]).capture(&adv), None);
        assert_eq!(Products::default().capture(&observed()), None);
    }

    #[test]
    fn packets_are_encoded_as_the_product_says() {
        let bytes = [0xF7, 0x0E, 0x49, 0xAB];
        assert_eq!(PacketEncoding::Hex.encode(&bytes), "F70E49AB");
        assert_eq!(PacketEncoding::HexLower.encode(&bytes), "f70e49ab");
        assert_eq!(PacketEncoding::Base64.encode(&bytes), "9w5Jqw==");
        let p = Product {
            packet_encoding: PacketEncoding::Base64,
            ..tape()
        };
        assert_eq!(
            p.capture(&observed()).unwrap().packet,
            "9w5JVuKfhCEeRP+1Hg=="
        );
    }

    #[test]
    fn long_manufacturer_data_is_encoded_whole() {
        let mut adv = observed();
        adv.manufacturer_data[0].1 = vec![0x5A; 200];
        let packet = tape().capture(&adv).unwrap().packet;
        assert_eq!(packet.len(), 2 * 202);
        assert!(packet.starts_with("F70E5A5A"));
    }

    #[test]
    fn uuids_expand_to_lower_case_128_bit_form() {
        for s in [
            "feaa",
            "FEAA",
            "0xFEAA",
            "0xfeaa",
            "0000feaa",
            "0X0000FEAA",
            "0000FEAA-0000-1000-8000-00805F9B34FB",
            "0000feaa00001000800000805f9b34fb",
        ] {
            assert_eq!(expand_uuid(s).as_deref(), Some(EDDYSTONE), "{s}");
        }
        assert_eq!(
            expand_uuid("12345678").as_deref(),
            Some("12345678-0000-1000-8000-00805f9b34fb")
        );
        assert_eq!(
            expand_uuid("6E400001-B5A3-F393-E0A9-E50E24DCCA9E").as_deref(),
            Some("6e400001-b5a3-f393-e0a9-e50e24dcca9e")
        );
    }

    #[test]
    fn malformed_uuids_are_refused() {
        for s in [
            "",
            "fea",
            "feaag",
            "+eaa",
            "0x",
            "0xfeaa0",
            "0x0000feaa-0000-1000-8000-00805f9b34fb",
            "0000feaa+0000-1000-8000-00805f9b34fb",
            "0000feaa-0000-1000-8000-00805f9b34f",
            "0000feaa-0000-1000-8000-00805f9b34fbb",
            "0000fe-a-0000-1000-8000-00805f9b34fb",
            "g000feaa00001000800000805f9b34fb",
        ] {
            assert_eq!(expand_uuid(s), None, "{s:?}");
        }
    }
}
