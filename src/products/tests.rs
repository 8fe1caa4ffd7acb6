//! Tests of `products.rs`: which adverts match and the `ble_packet` sent for them.

use super::*;
use crate::record::{decode_hex, Mac};

const EDDYSTONE: &str = "0000feaa-0000-1000-8000-00805f9b34fb";

fn product(id: &str) -> Product {
    Product {
        id: id.into(),
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
            product_id: "tape".into(),
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
    assert_eq!(&*products.matches(&observed()).unwrap().id, "second");
    let capture = products.capture(&observed()).unwrap();
    assert_eq!(&*capture.product_id, "second");
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
    assert_eq!(&*products.capture(&adv).unwrap().product_id, "tape");
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
