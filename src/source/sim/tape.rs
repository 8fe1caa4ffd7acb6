/*!
The simulated tape's packet: one layout, written by the `sim` source. The mock service
(`mock/`) reads it with a decoder of its own, a second implementation: a slip here
shows as items the mock cannot decode, never read back by the same code
(`tests/api_mock.rs` checks the two agree).

The real tapes' packet format is not public, so the simulated fleet and the mock agree
on this one. It is shaped like the one observed advert (DESIGN.md:
`F70E4956E29F84211E44FFB51E`, which decodes here too): the company identifier
[`TAPE_COMPANY_ID`] little-endian, then an 11-byte payload:

| bytes | meaning |
|---|---|
| `[0..2]` | marker `49 56` |
| `[2..4]` | packet counter, u16 little-endian |
| `[4..6]` | temperature in 0.01 °C, i16 little-endian |
| `[6]` | battery percent |
| `[7]` | shock count |
| `[8..11]` | low 24 bits of the tape serial, little-endian |

The simulated fleet's unregistered tapes have MACs starting with
[`UNREGISTERED_PREFIX`], which the mock service's default registry does not know.
*/

/// Company identifier of the tapes' maker.
pub const TAPE_COMPANY_ID: u16 = 0x0EF7;
/// First octets of the MACs of the simulated fleet's unregistered tapes.
pub const UNREGISTERED_PREFIX: [u8; 3] = [0xC0, 0xDE, 0xAD];
/// First two bytes of every tape payload.
pub const PAYLOAD_MARKER: [u8; 2] = [0x49, 0x56];
/// Length of a tape payload (after the company identifier).
pub const PAYLOAD_LEN: usize = 11;

/// What one tape payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapeReading {
    pub counter: u16,
    /// Temperature in 0.01 °C.
    pub temp_centi: i16,
    /// Battery percent.
    pub battery: u8,
    pub shock_count: u8,
    /// Low 24 bits of the tape serial (higher bits are not sent).
    pub serial: u32,
}

impl TapeReading {
    /// Reads a tape payload; `None` without the marker or with another length.
    pub fn from_payload(b: &[u8]) -> Option<TapeReading> {
        if b.len() != PAYLOAD_LEN || b[..2] != PAYLOAD_MARKER {
            return None;
        }
        Some(TapeReading {
            counter: u16::from_le_bytes([b[2], b[3]]),
            temp_centi: i16::from_le_bytes([b[4], b[5]]),
            battery: b[6],
            shock_count: b[7],
            serial: u32::from_le_bytes([b[8], b[9], b[10], 0]),
        })
    }

    /// Reads bytes that are either the 13-byte manufacturer data (starting `F7 0E`) or
    /// the 11-byte payload alone.
    pub fn from_packet(bytes: &[u8]) -> Option<TapeReading> {
        match bytes.len() {
            PAYLOAD_LEN => TapeReading::from_payload(bytes),
            n if n == PAYLOAD_LEN + 2 && bytes[..2] == TAPE_COMPANY_ID.to_le_bytes() => {
                TapeReading::from_payload(&bytes[2..])
            }
            _ => None,
        }
    }

    /// The 11-byte payload (after the company identifier) of a tape advert.
    pub fn payload(&self) -> [u8; PAYLOAD_LEN] {
        let c = self.counter.to_le_bytes();
        let t = self.temp_centi.to_le_bytes();
        let s = self.serial.to_le_bytes();
        [
            PAYLOAD_MARKER[0],
            PAYLOAD_MARKER[1],
            c[0],
            c[1],
            t[0],
            t[1],
            self.battery,
            self.shock_count,
            s[0],
            s[1],
            s[2],
        ]
    }

    /// The 13 bytes of the manufacturer data as on air: company identifier
    /// little-endian, then the payload.
    pub fn manufacturer_data(&self) -> [u8; PAYLOAD_LEN + 2] {
        let mut out = [0u8; PAYLOAD_LEN + 2];
        out[..2].copy_from_slice(&TAPE_COMPANY_ID.to_le_bytes());
        out[2..].copy_from_slice(&self.payload());
        out
    }

    /// Temperature in °C.
    pub fn temp_c(&self) -> f64 {
        f64::from(self.temp_centi) / 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading with every field in use (and a temperature below zero).
    const SAMPLE: TapeReading = TapeReading {
        counter: 0x1234,
        temp_centi: -1250,
        battery: 87,
        shock_count: 3,
        serial: 0x00AB_CDEF,
    };

    #[test]
    fn a_payload_decodes_back_to_its_reading() {
        let payload = SAMPLE.payload();
        assert_eq!(
            payload,
            [0x49, 0x56, 0x34, 0x12, 0x1E, 0xFB, 87, 3, 0xEF, 0xCD, 0xAB]
        );
        assert_eq!(TapeReading::from_payload(&payload), Some(SAMPLE));
        assert_eq!(SAMPLE.temp_c(), -12.5);
        assert_eq!(TapeReading::from_payload(&payload[..10]), None);
        let mut no_marker = payload;
        no_marker[1] = 0;
        assert_eq!(TapeReading::from_payload(&no_marker), None);
    }

    #[test]
    fn manufacturer_data_is_the_company_id_little_endian_then_the_payload() {
        let full = SAMPLE.manufacturer_data();
        assert_eq!(full[..2], [0xF7, 0x0E]);
        assert_eq!(full[2..], SAMPLE.payload());
        assert_eq!(TapeReading::from_packet(&full), Some(SAMPLE));
        assert_eq!(TapeReading::from_packet(&SAMPLE.payload()), Some(SAMPLE));
        let mut other_company = full;
        other_company[0] = 0x4C;
        assert_eq!(TapeReading::from_packet(&other_company), None);
        assert_eq!(TapeReading::from_packet(&full[..12]), None);
    }
}
