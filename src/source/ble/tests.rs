//! Tests of the `ble` source's settings and errors (the source itself runs against the
//! BlueZ stand-in in tests/ble.rs).

use std::time::Duration;

use super::BleSettings;
use crate::config::{AdvertsPath, ScanMode};
use crate::source::SourceError;

#[test]
fn the_scanner_keys_have_defaults_and_are_validated() {
    let path = std::path::Path::new("test.toml");
    let c = crate::config::from_toml("", path, []).unwrap();
    let s = BleSettings::from_scanner(&c.scanner);
    assert_eq!(s.silence, Some(Duration::from_secs(60)));
    assert_eq!(s.give_up, Duration::from_secs(300));
    assert_eq!(s.max_devices, 4096);
    let c = crate::config::from_toml(
        "[scanner]\nsilence_secs = 0\ngive_up_secs = 5\nmax_devices = 100\n",
        path,
        [],
    )
    .unwrap();
    let s = BleSettings::from_scanner(&c.scanner);
    assert_eq!(s.silence, None);
    assert_eq!(s.give_up, Duration::from_secs(5));
    assert_eq!(s.max_devices, 100);
    let e = crate::config::from_toml(
        "[scanner]\nsilence_secs = -1\ngive_up_secs = 0\nmax_devices = 1\n",
        path,
        [],
    )
    .unwrap_err()
    .to_string();
    for key in [
        "scanner.silence_secs",
        "scanner.give_up_secs",
        "scanner.max_devices",
    ] {
        assert!(e.contains(key), "{key}: {e}");
    }
}

/// Where adverts are read and how the radio scans are validated naming key and value.
#[test]
fn the_advert_path_and_scan_mode_are_validated_naming_key_and_value() {
    let path = std::path::Path::new("test.toml");
    let c = crate::config::from_toml("", path, []).unwrap();
    let s = BleSettings::from_scanner(&c.scanner);
    assert_eq!((s.adverts, s.scan), (AdvertsPath::Auto, ScanMode::Active));
    let c = crate::config::from_toml(
        "[scanner]\nadverts = \"mgmt\"\nscan = \"passive\"\n",
        path,
        [],
    )
    .unwrap();
    let s = BleSettings::from_scanner(&c.scanner);
    assert_eq!((s.adverts, s.scan), (AdvertsPath::Mgmt, ScanMode::Passive));
    let e = crate::config::from_toml("[scanner]\nadverts = \"hci\"\nscan = \"quiet\"\n", path, [])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scanner.adverts = \"hci\": expected one of auto | mgmt | dbus"),
        "{e}"
    );
    assert!(
        e.contains("scanner.scan = \"quiet\": expected one of active | passive"),
        "{e}"
    );
    // Passive scanning is the kernel's monitor: it needs the management socket, and
    // a company identifier for each product.
    let e = crate::config::from_toml(
        "[scanner]\nadverts = \"dbus\"\nscan = \"passive\"\n",
        path,
        [],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("scanner.scan"), "{e}");
    assert!(
        e.contains("set scanner.adverts = \"auto\" or \"mgmt\""),
        "{e}"
    );
    let e = crate::config::from_toml(
        "[scanner]\nscan = \"passive\"\n[[products]]\nid = \"beacon\"\nservice_uuid = \"feaa\"\n",
        path,
        [],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("scanner.scan"), "{e}");
    assert!(e.contains("products[0] names no manufacturer_id"), "{e}");
}

#[test]
fn errors_say_what_to_do() {
    let e = SourceError::NoAdapter {
        wanted: Some("hci1".into()),
        found: vec!["hci0".into()],
    };
    assert!(e
        .to_string()
        .starts_with("no Bluetooth adapter named \"hci1\": BlueZ reports hci0;"));
    assert!(SourceError::BluezNotRunning
        .to_string()
        .contains("systemctl start bluetooth"));
    assert!(SourceError::AccessDenied("x".into())
        .to_string()
        .contains("`bluetooth` group"));
}
