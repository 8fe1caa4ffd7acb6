//! Tests of the BlueZ watcher: its health followed from the signals it is given.

use super::*;
use dbus::arg::Variant;
use std::collections::HashMap;

const HCI0: &str = "/org/bluez/hci0";

/// A watcher of hci0 that knows BlueZ (`:1.7`) and a scanning adapter.
fn watcher() -> Watcher {
    let mut w = Watcher::new("hci0".into());
    w.health = Health {
        at: Instant::now(),
        bus: true,
        owner: Some(":1.7".into()),
        powered: Some(true),
        discovering: Some(true),
    };
    w
}

fn signal(sender: &str, path: &str, iface: &str, member: &str) -> Message {
    let mut m = Message::new_signal(path, iface, member).unwrap();
    m.set_sender(Some(sender.into()));
    m
}

fn adapter_props(powered: Option<bool>, discovering: bool) -> PropMap {
    let mut props: PropMap = HashMap::new();
    if let Some(p) = powered {
        props.insert("Powered".into(), Variant(Box::new(p)));
    }
    props.insert("Discovering".into(), Variant(Box::new(discovering)));
    props
}

fn discovering(sender: &str, path: &str, on: bool) -> Message {
    signal(sender, path, PROPERTIES, "PropertiesChanged").append3(
        ADAPTER,
        adapter_props(None, on),
        Vec::<String>::new(),
    )
}

fn owner_changed(sender: &str, old: &str, new: &str) -> Message {
    signal(
        sender,
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "NameOwnerChanged",
    )
    .append3(BLUEZ, old, new)
}

#[test]
fn the_adapters_own_signals_keep_its_health_current() {
    let mut w = watcher();
    assert!(!w.apply(&discovering(":1.7", HCI0, false), HCI0));
    assert_eq!(w.health.discovering, Some(false));
    assert!(!w.health.scanning(true));
    w.apply(&discovering(":1.7", HCI0, true), HCI0);
    assert!(w.health.scanning(true));
}

#[test]
fn only_bluezs_owner_and_the_bus_are_believed() {
    let mut w = watcher();
    let before = w.health.clone();
    w.apply(&discovering(":1.99", HCI0, false), HCI0);
    w.apply(&discovering(":1.7", "/org/bluez/hci1", false), HCI0);
    w.apply(&owner_changed(":1.99", ":1.7", ""), HCI0);
    assert_eq!(w.health, before);
}

#[test]
fn bluez_leaving_and_back_under_a_new_owner_asks_for_a_fresh_read() {
    let mut w = watcher();
    assert!(!w.apply(&owner_changed("org.freedesktop.DBus", ":1.7", ""), HCI0));
    assert_eq!(w.health.owner, None);
    assert_eq!(w.health.powered, None, "no BlueZ, no adapter");
    assert!(w.apply(&owner_changed("org.freedesktop.DBus", "", ":1.9"), HCI0));
    assert_eq!(w.health.owner.as_deref(), Some(":1.9"));
    // The old owner is not believed any more; the new one is.
    w.apply(&discovering(":1.7", HCI0, true), HCI0);
    assert_eq!(w.health.discovering, None);
    w.apply(&discovering(":1.9", HCI0, true), HCI0);
    assert_eq!(w.health.discovering, Some(true));
}

#[test]
fn the_adapter_object_removed_and_added_back_is_followed() {
    let mut w = watcher();
    let removed = signal(":1.7", "/", OBJECT_MANAGER, "InterfacesRemoved")
        .append2(dbus::Path::from(HCI0), vec![ADAPTER.to_string()]);
    w.apply(&removed, HCI0);
    assert_eq!((w.health.powered, w.health.discovering), (None, None));
    let mut interfaces: HashMap<String, PropMap> = HashMap::new();
    interfaces.insert(ADAPTER.into(), adapter_props(Some(true), false));
    let added = signal(":1.7", "/", OBJECT_MANAGER, "InterfacesAdded")
        .append2(dbus::Path::from(HCI0), interfaces);
    w.apply(&added, HCI0);
    assert_eq!(
        (w.health.powered, w.health.discovering),
        (Some(true), Some(false))
    );
}
