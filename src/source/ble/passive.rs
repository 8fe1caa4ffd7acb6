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
It touches the products and what the kernel says of its version.

What the research behind this found (docs/ble.md, "Passive scanning"):
- the kernel disables the controller's duplicate filter for passive scans of an
  advertisement monitor only in some releases: since c32d624640fd ("disable filter dup
  when scan for adv monitor", 5.14); the move of scanning to hci_sync (abfeea476c68,
  5.16) lost it, and b5431dc2803a ("avoid dup filtering when passive scanning with adv
  monitor", 6.11, backported to 6.10.5, 6.6.46 and 6.1.105) restored it. On the others
  the controller reports a tape once per scan and its changed data goes unheard.
  [`duplicate_filter_kept`] tells them by their upstream version ([`kernel_version`]:
  distributions name their kernels by ABI, `6.1.0-56-amd64`), and the source warns.
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

/// Whether a kernel of this upstream version (`6.1.192`; see [`kernel_version`]) may
/// keep the controller's duplicate filter on in passive monitor scans (see the module
/// doc): `false` only for versions known to turn it off.
pub(super) fn duplicate_filter_kept(version: &str) -> bool {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
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
        (5, 14 | 15) => return false,
        _ => return true,
    };
    patch < fixed_from
}

/// The running kernel's upstream version, if it can be told (see [`version_from`]).
pub(super) fn kernel_version() -> Option<String> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    version_from(
        read("/proc/version_signature").as_deref(),
        read("/proc/sys/kernel/version").as_deref(),
        read("/proc/sys/kernel/osrelease").as_deref(),
    )
}

/// A kernel's upstream version from what it says of itself. The release (`uname -r`)
/// is an ABI name on Debian and Ubuntu (`6.1.0-56-amd64`, `6.8.0-45-generic`, whose
/// third number is not the patch level), so first: Ubuntu's `/proc/version_signature`
/// (`Ubuntu 6.8.0-45.45-generic 6.8.12`: its last word); then the package version a
/// Debian kernel puts in `/proc/sys/kernel/version` (`#1 SMP PREEMPT_DYNAMIC Debian
/// 6.1.192-2 (2025-11-16)`; Raspberry Pi OS: `Debian 1:6.6.51-1+rpt3`); then the
/// release, which is the version elsewhere (`6.6.51+rpt-rpi-v8`, `6.12.1-arch1-1`).
pub(super) fn version_from(
    signature: Option<&str>,
    version: Option<&str>,
    release: Option<&str>,
) -> Option<String> {
    let upstream = |s: &str| {
        let s = s.split_once(':').map_or(s, |(_, v)| v);
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let v = &s[..end];
        (v.split('.').filter(|p| !p.is_empty()).count() >= 2).then(|| v.to_string())
    };
    signature
        .and_then(|s| s.split_whitespace().last())
        .and_then(upstream)
        .or_else(|| {
            let words: Vec<&str> = version?.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "Debian")?;
            upstream(words.get(at + 1)?)
        })
        .or_else(|| release.map(|r| r.trim().to_string()))
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
    fn kernels_that_keep_the_duplicate_filter_are_told_by_their_upstream_version() {
        for (version, kept) in [
            ("6.12.25", false),
            ("6.11.0", false),
            ("7.0.1", false),
            ("6.10.5", false),
            ("6.10.4", true),
            ("6.6.46", false),
            ("6.6.31", true),
            ("6.1.105", false),
            ("6.1.192", false),
            ("6.1.21", true),
            ("6.8.12", true),
            ("5.16.0", true),
            ("5.15.167", false),
            ("5.14.21", false),
            ("5.13.19", true),
            ("5.10.226", true),
            ("garbage", true),
        ] {
            assert_eq!(duplicate_filter_kept(version), kept, "{version}");
        }
    }

    #[test]
    fn a_distributions_kernel_is_told_by_its_package_version_not_its_abi_name() {
        let v = |sig, version, release| version_from(sig, version, release);
        // Debian: the release is the ABI; the package version is in `version`.
        assert_eq!(
            v(
                None,
                Some("#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-2 (2025-11-16)\n"),
                Some("6.1.0-56-amd64\n")
            )
            .as_deref(),
            Some("6.1.192")
        );
        // Raspberry Pi OS: an epoch, a suffix.
        assert_eq!(
            v(
                None,
                Some("#1 SMP PREEMPT Debian 1:6.6.51-1+rpt3 (2024-10-08)"),
                Some("6.6.51+rpt-rpi-v8")
            )
            .as_deref(),
            Some("6.6.51")
        );
        // Ubuntu: the signature's last word.
        assert_eq!(
            v(
                Some("Ubuntu 6.8.0-45.45-generic 6.8.12\n"),
                Some("#45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024"),
                Some("6.8.0-45-generic")
            )
            .as_deref(),
            Some("6.8.12")
        );
        // Elsewhere the release is the version.
        assert_eq!(
            v(
                None,
                Some("#1642 SMP PREEMPT Mon Apr  3 17:24:16 BST 2023"),
                Some("6.1.21-v8+")
            )
            .as_deref(),
            Some("6.1.21-v8+")
        );
        assert_eq!(v(None, None, None), None);
        // What the warning is about: Debian's 6.1.192 carries the fix, although its
        // release reads 6.1.0.
        assert!(!duplicate_filter_kept("6.1.192"));
        assert!(duplicate_filter_kept("6.1.0-56-amd64"));
    }
}
