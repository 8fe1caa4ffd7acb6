/*!
Which advertisements are tapes, and what is sent for them.
Pure: it touches the records only.

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
    /// Sent as `product_id` (shared with its captures).
    pub id: std::sync::Arc<str>,
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
mod tests;
