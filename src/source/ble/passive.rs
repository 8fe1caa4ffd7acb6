/*!
Passive scanning (`scanner.scan = "passive"`): instead of discovery (which makes the
radio send a scan request to every advertiser, and every tape answer it, at a cost to
its coin cell), the source adds an advertisement monitor over the management socket
(Add Advertisement Patterns Monitor, BlueZ's doc/mgmt-api.txt) whose patterns are the
products' company identifiers. While a monitor is registered and no discovery runs, the
kernel scans passively and sends `Advertisement Monitor Device Found` for the reports,
each with its RSSI: with the controller's pattern offload (MSFT extension) only the
matching ones; without it (the Raspberry Pi's Broadcom/Cypress parts) every report,
with handle 0, and the products filter does the rest.
It touches the products and the kernel's release.

What the research behind this found (README, "Passive scanning"):
- the kernel disables the controller's duplicate filter for passive scans of an
  advertisement monitor (`hci_passive_scan_sync`, net/bluetooth/hci_sync.c) only since
  b5431dc2803a ("avoid dup filtering when passive scanning with adv monitor", v6.11,
  backported to 6.10.5, 6.6.46 and 6.1.105); before it, the controller reports a tape
  once per scan and its changed data goes unheard. [`duplicate_filter_kept`] tells such
  kernels by their release, and the source warns.
- a passive scan sends no scan request, so data a tape puts only in its scan response
  is never heard.
*/

use super::mgmt::wire::Pattern;
use crate::products::Products;

/// AD type of Manufacturer Specific Data.
const MANUFACTURER_DATA: u8 = 0xFF;

/// The monitor's patterns: each product's company identifier at the start of its
/// manufacturer data (little-endian, as on air). `None` if a product names none (the
/// config refuses passive scanning then).
pub(super) fn patterns(products: &Products) -> Option<Vec<Pattern>> {
    let mut ids: Vec<u16> = products
        .0
        .iter()
        .map(|p| p.manufacturer_id)
        .collect::<Option<_>>()?;
    ids.sort_unstable();
    ids.dedup();
    Some(
        ids.into_iter()
            .map(|id| Pattern {
                ad_type: MANUFACTURER_DATA,
                offset: 0,
                value: id.to_le_bytes().to_vec(),
            })
            .collect(),
    )
}

/// Whether a kernel of this release (`uname -r`, e.g. `6.6.31+rpt-rpi-v8`) may keep the
/// controller's duplicate filter on in passive monitor scans (see the module doc):
/// `false` only for releases known to carry the fix.
pub(super) fn duplicate_filter_kept(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    let (Some(major), Some(minor)) = (next(), next()) else {
        return true;
    };
    let patch = next().unwrap_or(0);
    let fixed_from = match (major, minor) {
        (m, _) if m > 6 => return false,
        (6, m) if m >= 11 => return false,
        (6, 10) => 5,
        (6, 6) => 46,
        (6, 1) => 105,
        _ => return true,
    };
    patch < fixed_from
}

/// The running kernel's release, if it can be read.
pub(super) fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::products::Product;

    #[test]
    fn the_patterns_are_the_products_company_identifiers_as_on_air() {
        let mut other = Product::tape();
        other.manufacturer_id = Some(0x004C);
        let products = Products(vec![Product::tape(), other, Product::tape()]);
        assert_eq!(
            patterns(&products),
            Some(vec![
                Pattern {
                    ad_type: 0xFF,
                    offset: 0,
                    value: vec![0x4C, 0x00]
                },
                Pattern {
                    ad_type: 0xFF,
                    offset: 0,
                    value: vec![0xF7, 0x0E]
                },
            ])
        );
        let mut any = Product::tape();
        any.manufacturer_id = None;
        assert_eq!(patterns(&Products(vec![Product::tape(), any])), None);
    }

    #[test]
    fn kernels_without_the_duplicate_filter_fix_are_told_by_their_release() {
        for (release, kept) in [
            ("6.12.25+rpt-rpi-v8", false),
            ("6.11.0", false),
            ("7.0.1", false),
            ("6.10.5", false),
            ("6.10.4", true),
            ("6.6.46-v8+", false),
            ("6.6.31+rpt-rpi-v8", true),
            ("6.1.105", false),
            ("6.1.21-v8+", true),
            ("5.15.0-1034-raspi", true),
            ("6.8.0-45-generic", true),
            ("garbage", true),
        ] {
            assert_eq!(duplicate_filter_kept(release), kept, "{release}");
        }
    }
}
