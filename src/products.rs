/*!
Which advertisements are tapes, and what is sent for them.

A `[[products]]` entry both filters and labels: an advertisement matches a product when
every criterion the product names matches; the first matching product wins; an
advertisement that matches none is dropped (and counted by the caller). The matched
product gives the capture its `product_id` and the bytes of its `ble_packet`.
*/

use crate::record::{Advertisement, Capture};

/// Which bytes of the advertisement become `ble_packet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketSource {
    /// Company identifier little-endian, then the data, as on air (default).
    ManufacturerData,
    /// The data after the company identifier.
    ManufacturerPayload,
    /// The service data of `service_uuid` (or the first service data).
    ServiceData,
}

/// How `ble_packet` bytes are written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketEncoding {
    /// Upper-case hex (default).
    Hex,
    HexLower,
    Base64,
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

/// The ordered product list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Products(pub Vec<Product>);

impl Products {
    /// The capture of `adv` under the first product it matches, or `None` when it
    /// matches no product (or the matched product's packet is absent from it).
    pub fn capture(&self, adv: &Advertisement) -> Option<Capture> {
        let _ = adv;
        None
    }
}
