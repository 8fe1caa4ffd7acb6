/*!
The D-Bus advert feed: BlueZ's signals about the devices of one adapter, on a
connection of the source's own that the source task reads itself (no I/O task between
the socket and the source, no per-advert hop), and parsed straight from the message
(no property maps built): `PropertiesChanged` of `org.bluez.Device1` (one advert per
signal, whatever it changed together: RSSI and data arrive in one signal from BlueZ,
whose property changes of one main-loop turn are sent as one), `InterfacesAdded` (a new
device object with all its properties: BlueZ forgets a device 30 s after it was last
seen, and its next advert comes as a new object, whose data is read from this signal)
and `InterfacesRemoved`. It touches D-Bus and the records only.

The match rules name the adapter's path, so the bus sends nothing of other adapters
and nothing of the adapter itself (the watcher's business, `bluez.rs`).
*/

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use dbus::arg::{ArgType, Iter};
use dbus::channel::{BusType, Channel};
use dbus::Message;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::record::Mac;

const DEVICE: &str = "org.bluez.Device1";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const OBJECT_MANAGER: &str = "org.freedesktop.DBus.ObjectManager";
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The properties of a device that adverts are made of, as far as a signal carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Props {
    pub rssi: Option<i16>,
    pub name: Option<String>,
    pub manufacturer_data: Option<Vec<(u16, Vec<u8>)>>,
    pub service_data: Option<Vec<(String, Vec<u8>)>>,
}

impl Props {
    /// Whether the signal was an advert (RSSI or data), not another change (a name
    /// alone, a connection...).
    pub fn is_advert(&self) -> bool {
        self.rssi.is_some() || self.manufacturer_data.is_some() || self.service_data.is_some()
    }
}

/// What a signal says of a device of the adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change {
    /// Some properties changed (an advert, usually).
    Changed { mac: Mac, props: Props },
    /// A new device object, with all its properties.
    Added { mac: Mac, props: Props },
    /// The device object is gone.
    Removed { mac: Mac },
}

/// The MAC of a device object of `adapter_path` (`/org/bluez/hci0/dev_AA_BB_..`).
fn device_mac(adapter_path: &str, path: &str) -> Option<Mac> {
    let dev = path.strip_prefix(adapter_path)?.strip_prefix("/dev_")?;
    let b = dev.as_bytes();
    if b.len() != 17 {
        return None;
    }
    let mut octets = [0u8; 6];
    for (i, o) in octets.iter_mut().enumerate() {
        if i > 0 && b[i * 3 - 1] != b'_' {
            return None;
        }
        let pair = std::str::from_utf8(&b[i * 3..i * 3 + 2]).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(Mac::new(octets))
}

/// The change a signal says, if it is one of a device of `adapter_path`.
pub(super) fn parse(msg: &Message, adapter_path: &str) -> Option<Change> {
    let member = msg.member()?;
    let mut args = msg.iter_init();
    match (msg.interface()?.as_ref(), member.as_ref()) {
        (PROPERTIES, "PropertiesChanged") => {
            let mac = device_mac(adapter_path, msg.path()?.as_ref())?;
            let iface: &str = args.read().ok()?;
            if iface != DEVICE {
                return None;
            }
            let props = props(args.recurse(ArgType::Array)?);
            Some(Change::Changed { mac, props })
        }
        (OBJECT_MANAGER, "InterfacesAdded") => {
            let path: dbus::Path = args.read().ok()?;
            let mac = device_mac(adapter_path, &path)?;
            let mut ifaces = args.recurse(ArgType::Array)?;
            loop {
                let mut entry = ifaces.recurse(ArgType::DictEntry)?;
                let name: &str = entry.read().ok()?;
                if name == DEVICE {
                    let props = props(entry.recurse(ArgType::Array)?);
                    return Some(Change::Added { mac, props });
                }
                if !ifaces.next() {
                    return None;
                }
            }
        }
        (OBJECT_MANAGER, "InterfacesRemoved") => {
            let path: dbus::Path = args.read().ok()?;
            let mac = device_mac(adapter_path, &path)?;
            let mut names = args.recurse(ArgType::Array)?;
            loop {
                if names.get::<&str>() == Some(DEVICE) {
                    return Some(Change::Removed { mac });
                }
                if !names.next() {
                    return None;
                }
            }
        }
        _ => None,
    }
}

/// Reads an `a{sv}` of device properties; what does not have BlueZ's type is skipped.
fn props(mut dict: Iter<'_>) -> Props {
    let mut p = Props::default();
    while dict.arg_type() == ArgType::DictEntry {
        if let Some(mut entry) = dict.recurse(ArgType::DictEntry) {
            let key: Option<&str> = entry.get();
            entry.next();
            if let (Some(key), Some(mut value)) = (key, entry.recurse(ArgType::Variant)) {
                match key {
                    "RSSI" => p.rssi = value.get::<i16>().or(p.rssi),
                    "Name" => p.name = value.get::<&str>().map(str::to_string).or(p.name),
                    "ManufacturerData" => {
                        if let Some(d) = value.recurse(ArgType::Array) {
                            p.manufacturer_data = Some(data_map(d, |k: &mut Iter| k.get::<u16>()));
                        }
                    }
                    "ServiceData" => {
                        if let Some(d) = value.recurse(ArgType::Array) {
                            p.service_data = Some(data_map(d, |k: &mut Iter| {
                                k.get::<&str>().map(str::to_ascii_lowercase)
                            }));
                        }
                    }
                    _ => {}
                }
            }
        }
        if !dict.next() {
            break;
        }
    }
    p
}

/// Reads an `a{Kv}` whose values are `ay`, sorted by key (as the D-Bus path has always
/// ordered them, so that equal data gives equal adverts).
fn data_map<K: Ord>(
    mut dict: Iter<'_>,
    key: impl Fn(&mut Iter<'_>) -> Option<K>,
) -> Vec<(K, Vec<u8>)> {
    let mut out = Vec::new();
    while dict.arg_type() == ArgType::DictEntry {
        if let Some(mut entry) = dict.recurse(ArgType::DictEntry) {
            let k = key(&mut entry);
            entry.next();
            let bytes = entry
                .recurse(ArgType::Variant)
                .and_then(|mut v| v.get::<&[u8]>());
            if let (Some(k), Some(bytes)) = (k, bytes) {
                out.push((k, bytes.to_vec()));
            }
        }
        if !dict.next() {
            break;
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The descriptor libdbus reads, borrowed for the runtime's readiness.
struct BusFd(RawFd);

impl AsRawFd for BusFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// What a read found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Drained {
    /// Messages read.
    pub messages: usize,
    /// More wait (the budget ran out).
    pub more: bool,
}

/// The connection lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lost;

/// The advert signals of one adapter on a connection of their own.
pub(super) struct Signals {
    // Declared first: deregistered from the runtime before libdbus closes the descriptor.
    /// `Some` while the source waits for the connection; parked (`None`) while it reads
    /// on a timer, so that a message arriving meanwhile wakes nobody.
    fd: Option<AsyncFd<BusFd>>,
    raw: RawFd,
    channel: Channel,
    adapter_path: String,
}

impl Signals {
    /// A new connection to the system bus subscribed to the signals of `adapter`'s
    /// devices (`hci0`).
    pub async fn connect(adapter: &str) -> Result<Signals, String> {
        let adapter_path = format!("/org/bluez/{adapter}");
        let path = adapter_path.clone();
        // Connecting and subscribing block (a hung bus could hold them): not on the
        // runtime.
        let channel = tokio::task::spawn_blocking(move || subscribe(&path))
            .await
            .map_err(|e| format!("the subscribing task failed: {e}"))??;
        let raw = channel.watch().fd;
        Ok(Signals {
            fd: None,
            raw,
            channel,
            adapter_path,
        })
    }

    /// Waits until the connection may have something to read (registering it with the
    /// runtime: what is already queued makes it ready at once). Cancel-safe.
    pub async fn readable(&mut self) -> io::Result<()> {
        if self.fd.is_none() {
            // SAFETY: the descriptor is libdbus's, open as long as `channel`, which is
            // dropped after `fd` (field order).
            let fd =
                unsafe { AsyncFd::register_with_interest(BusFd(self.raw), Interest::READABLE) }
                    .map_err(io::Error::from)?;
            self.fd = Some(fd);
        }
        let Some(fd) = &self.fd else {
            return Ok(());
        };
        let mut guard = fd.readable().await?;
        guard.retain_ready();
        Ok(())
    }

    /// Reads will be made on a timer for a while (see [`Signals::fd`]).
    pub fn park(&mut self) {
        self.fd = None;
    }

    /// Reads what is there, at most `budget` messages, and gives each change of a
    /// device to `each`.
    pub fn drain(&mut self, budget: usize, mut each: impl FnMut(Change)) -> Result<Drained, Lost> {
        // Readiness is cleared before reading: what arrives after the read wakes the
        // next wait.
        if let Some(fd) = &self.fd {
            if let Some(Ok(mut guard)) = futures::FutureExt::now_or_never(fd.readable()) {
                guard.clear_ready();
            }
        }
        let mut d = Drained::default();
        loop {
            // libdbus reads a limited number of bytes per call: read until a call
            // brings nothing new.
            self.channel
                .read_write(Some(Duration::ZERO))
                .map_err(|()| Lost)?;
            let mut got = false;
            while let Some(msg) = self.channel.pop_message() {
                got = true;
                d.messages += 1;
                if let Some(change) = parse(&msg, &self.adapter_path) {
                    each(change);
                }
                if d.messages >= budget {
                    d.more = true;
                    return Ok(d);
                }
            }
            if !got {
                break;
            }
        }
        if !self.channel.is_connected() {
            return Err(Lost);
        }
        Ok(d)
    }
}

/// A private connection with the match rules of `adapter_path`'s devices.
fn subscribe(adapter_path: &str) -> Result<Channel, String> {
    let describe = |e: dbus::Error| e.message().unwrap_or("unknown D-Bus error").to_string();
    let mut channel = Channel::get_private(BusType::System).map_err(describe)?;
    channel.set_watch_enabled(true);
    let rules = [
        format!(
            "type='signal',sender='org.bluez',interface='{PROPERTIES}',member='PropertiesChanged',path_namespace='{adapter_path}',arg0='{DEVICE}'"
        ),
        format!(
            "type='signal',sender='org.bluez',interface='{OBJECT_MANAGER}',member='InterfacesAdded',arg0path='{adapter_path}/'"
        ),
        format!(
            "type='signal',sender='org.bluez',interface='{OBJECT_MANAGER}',member='InterfacesRemoved',arg0path='{adapter_path}/'"
        ),
    ];
    for rule in rules {
        let call = Message::new_method_call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "AddMatch",
        )
        .map_err(|e| e.to_string())?
        .append1(rule);
        channel
            .send_with_reply_and_block(call, CALL_TIMEOUT)
            .map_err(describe)?;
    }
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use dbus::arg::{PropMap, Variant};

    use super::*;

    const HCI0: &str = "/org/bluez/hci0";
    const DEV: &str = "/org/bluez/hci0/dev_C0_FF_EE_00_00_01";
    const MAC: Mac = Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]);

    fn signal(path: &str, iface: &str, member: &str) -> Message {
        let mut m = Message::new_signal(path, iface, member).unwrap();
        m.set_sender(Some(":1.7".into()));
        m
    }

    fn advert_props() -> PropMap {
        let mut props: PropMap = HashMap::new();
        props.insert("RSSI".into(), Variant(Box::new(-61i16)));
        let mfg: HashMap<u16, Variant<Box<dyn dbus::arg::RefArg>>> = HashMap::from([
            (
                0x0EF7u16,
                Variant(Box::new(vec![0x49u8, 0x56]) as Box<dyn dbus::arg::RefArg>),
            ),
            (
                0x004Cu16,
                Variant(Box::new(vec![2u8]) as Box<dyn dbus::arg::RefArg>),
            ),
        ]);
        props.insert("ManufacturerData".into(), Variant(Box::new(mfg)));
        let svc: HashMap<String, Variant<Box<dyn dbus::arg::RefArg>>> = HashMap::from([(
            "0000FEAA-0000-1000-8000-00805F9B34FB".to_string(),
            Variant(Box::new(vec![0x10u8]) as Box<dyn dbus::arg::RefArg>),
        )]);
        props.insert("ServiceData".into(), Variant(Box::new(svc)));
        props.insert("Name".into(), Variant(Box::new("TT-0001".to_string())));
        props.insert("Connected".into(), Variant(Box::new(false)));
        props
    }

    fn expected() -> Props {
        Props {
            rssi: Some(-61),
            name: Some("TT-0001".into()),
            manufacturer_data: Some(vec![(0x004C, vec![2]), (0x0EF7, vec![0x49, 0x56])]),
            service_data: Some(vec![(
                "0000feaa-0000-1000-8000-00805f9b34fb".into(),
                vec![0x10],
            )]),
        }
    }

    #[test]
    fn one_properties_changed_with_rssi_and_data_is_one_change_with_both() {
        let msg = signal(DEV, PROPERTIES, "PropertiesChanged").append3(
            DEVICE,
            advert_props(),
            Vec::<String>::new(),
        );
        assert_eq!(
            parse(&msg, HCI0),
            Some(Change::Changed {
                mac: MAC,
                props: expected()
            })
        );
    }

    #[test]
    fn a_new_device_object_brings_all_its_properties() {
        let mut ifaces: HashMap<String, PropMap> = HashMap::new();
        ifaces.insert("org.freedesktop.DBus.Introspectable".into(), HashMap::new());
        ifaces.insert(DEVICE.into(), advert_props());
        let msg =
            signal("/", OBJECT_MANAGER, "InterfacesAdded").append2(dbus::Path::from(DEV), ifaces);
        assert_eq!(
            parse(&msg, HCI0),
            Some(Change::Added {
                mac: MAC,
                props: expected()
            })
        );
        let gone = signal("/", OBJECT_MANAGER, "InterfacesRemoved").append2(
            dbus::Path::from(DEV),
            vec![
                "org.freedesktop.DBus.Properties".to_string(),
                DEVICE.to_string(),
            ],
        );
        assert_eq!(parse(&gone, HCI0), Some(Change::Removed { mac: MAC }));
    }

    #[test]
    fn signals_of_other_adapters_objects_and_interfaces_are_not_changes() {
        let other = signal(
            "/org/bluez/hci1/dev_C0_FF_EE_00_00_01",
            PROPERTIES,
            "PropertiesChanged",
        )
        .append3(DEVICE, advert_props(), Vec::<String>::new());
        assert_eq!(parse(&other, HCI0), None);
        let adapter = signal(HCI0, PROPERTIES, "PropertiesChanged").append3(
            "org.bluez.Adapter1",
            advert_props(),
            Vec::<String>::new(),
        );
        assert_eq!(parse(&adapter, HCI0), None);
        let gatt = signal(
            "/org/bluez/hci0/dev_C0_FF_EE_00_00_01/service0001",
            PROPERTIES,
            "PropertiesChanged",
        )
        .append3(
            "org.bluez.GattService1",
            advert_props(),
            Vec::<String>::new(),
        );
        assert_eq!(parse(&gatt, HCI0), None);
    }

    #[test]
    fn a_name_alone_is_a_change_but_not_an_advert() {
        let mut props: PropMap = HashMap::new();
        props.insert("Name".into(), Variant(Box::new("TT-2".to_string())));
        let msg = signal(DEV, PROPERTIES, "PropertiesChanged").append3(
            DEVICE,
            props,
            Vec::<String>::new(),
        );
        let Some(Change::Changed { props, .. }) = parse(&msg, HCI0) else {
            panic!()
        };
        assert!(!props.is_advert());
        assert_eq!(props.name.as_deref(), Some("TT-2"));
    }

    #[test]
    fn device_paths_give_their_macs() {
        assert_eq!(device_mac(HCI0, DEV), Some(MAC));
        for bad in [
            "/org/bluez/hci0",
            "/org/bluez/hci0/dev_C0_FF_EE_00_00",
            "/org/bluez/hci0/dev_C0_FF_EE_00_00_0G",
            "/org/bluez/hci0/dev_C0-FF-EE-00-00-01",
            "/org/bluez/hci10/dev_C0_FF_EE_00_00_01",
        ] {
            assert_eq!(device_mac(HCI0, bad), None, "{bad}");
        }
    }
}
