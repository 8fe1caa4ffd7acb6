//! Frames the way the kernel writes them, for tests here and in `tests/`, `benches/`.

use super::*;

/// A frame: header, then `params`.
pub fn frame(code: u16, index: u16, params: &[u8]) -> Vec<u8> {
    command(code, index, params)
}

/// Device Found parameters for `address` (as written, `AA:..` first), `rssi` and
/// advertising `data`.
pub fn found_params(address: [u8; 6], address_type: u8, rssi: i8, data: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(FOUND_FIXED + data.len());
    let a = address;
    p.extend_from_slice(&[a[5], a[4], a[3], a[2], a[1], a[0], address_type]);
    p.push(rssi as u8);
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&(data.len() as u16).to_le_bytes());
    p.extend_from_slice(data);
    p
}

/// A Device Found frame on controller `index`.
pub fn device_found(index: u16, address: [u8; 6], rssi: i8, data: &[u8]) -> Vec<u8> {
    frame(
        EV_DEVICE_FOUND,
        index,
        &found_params(address, 2, rssi, data),
    )
}

/// An Advertisement Monitor Device Found frame on controller `index`.
pub fn monitor_found(index: u16, handle: u16, address: [u8; 6], rssi: i8, data: &[u8]) -> Vec<u8> {
    let mut p = handle.to_le_bytes().to_vec();
    p.extend_from_slice(&found_params(address, 2, rssi, data));
    frame(EV_ADV_MONITOR_DEVICE_FOUND, index, &p)
}

/// The kernel's Command Complete for `opcode` with `status` and return parameters.
pub fn command_complete(index: u16, opcode: u16, status: u8, ret: &[u8]) -> Vec<u8> {
    let mut p = opcode.to_le_bytes().to_vec();
    p.push(status);
    p.extend_from_slice(ret);
    frame(EV_CMD_COMPLETE, index, &p)
}

/// One AD structure: length, type, data.
pub fn ad(ad_type: u8, data: &[u8]) -> Vec<u8> {
    let mut s = vec![data.len() as u8 + 1, ad_type];
    s.extend_from_slice(data);
    s
}
