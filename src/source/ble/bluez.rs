/*!
Plain D-Bus calls to BlueZ through the `dbus` crate's blocking API, beside the scan's
session: whether BlueZ runs and who owns its name, whether the adapter is powered and
discovering, and forgetting a device.

- [`preflight`] runs once before the scan and turns every way of not being able to scan
  into a [`SourceError`] that says what to do.
- [`Watcher`] is one thread with its own connection: it polls the health of BlueZ and
  the adapter every [`POLL`] and removes the devices the source forgets. Polling (a few
  small calls a second) adds no match rule and sees a bluetoothd restart even when it
  happens between two polls (the name's unique owner changes).
*/

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use dbus::arg::{prop_cast, PropMap};
use dbus::blocking::stdintf::org_freedesktop_dbus::{ObjectManager, Properties};
use dbus::blocking::Connection;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::source::SourceError;

const BLUEZ: &str = "org.bluez";
const ADAPTER: &str = "org.bluez.Adapter1";
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the watcher looks at BlueZ.
pub(super) const POLL: Duration = Duration::from_millis(500);
/// Device removals waiting for the watcher at most; more are skipped (BlueZ forgets
/// temporary devices by itself too, this only keeps it lean).
const REMOVALS_QUEUED: usize = 4096;

/// Checks that a scan can start: the system bus, BlueZ on it, access to it, and the
/// adapter (`wanted`, or the first). Returns the adapter's name (`hci0`) and the unique
/// name that owns `org.bluez` (to notice a restart of bluetoothd).
pub(super) fn preflight(wanted: Option<&str>) -> Result<(String, String), SourceError> {
    let conn = Connection::new_system().map_err(|e| SourceError::SystemBus(describe(&e)))?;
    let Some(bluez) = owner(&conn).map_err(|e| SourceError::SystemBus(describe(&e)))? else {
        return Err(SourceError::BluezNotRunning);
    };
    let objects = conn
        .with_proxy(BLUEZ, "/", CALL_TIMEOUT)
        .get_managed_objects()
        .map_err(|e| match e.name() {
            Some("org.freedesktop.DBus.Error.AccessDenied") => {
                SourceError::AccessDenied(describe(&e))
            }
            Some("org.freedesktop.DBus.Error.ServiceUnknown")
            | Some("org.freedesktop.DBus.Error.NameHasNoOwner") => SourceError::BluezNotRunning,
            _ => SourceError::Bluez(describe(&e)),
        })?;
    let mut found: Vec<String> = objects
        .iter()
        .filter(|(_, ifaces)| ifaces.contains_key(ADAPTER))
        .filter_map(|(path, _)| path.strip_prefix("/org/bluez/").map(str::to_string))
        .collect();
    found.sort();
    let chosen = match wanted {
        Some(w) => found.iter().find(|f| *f == w).cloned(),
        None => found.first().cloned(),
    };
    let chosen = chosen.ok_or(SourceError::NoAdapter {
        wanted: wanted.map(str::to_string),
        found,
    })?;
    Ok((chosen, bluez))
}

fn describe(e: &dbus::Error) -> String {
    match (e.name(), e.message()) {
        (Some(n), Some(m)) => format!("{n}: {m}"),
        (Some(n), None) => n.to_string(),
        (None, Some(m)) => m.to_string(),
        (None, None) => "unknown D-Bus error".to_string(),
    }
}

/// The unique name owning `org.bluez`, `None` when nobody does.
fn owner(conn: &Connection) -> Result<Option<String>, dbus::Error> {
    let bus = conn.with_proxy(
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        CALL_TIMEOUT,
    );
    match bus.method_call::<(String,), _, _, _>("org.freedesktop.DBus", "GetNameOwner", (BLUEZ,)) {
        Ok((o,)) => Ok(Some(o)),
        Err(e) if e.name() == Some("org.freedesktop.DBus.Error.NameHasNoOwner") => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the watcher saw at one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Health {
    /// When this was seen (a step taken later is judged by a later poll). The watcher
    /// thread has no runtime, so this is the real clock, as the source's is outside a
    /// paused test runtime.
    pub at: Instant,
    /// The system bus answered.
    pub bus: bool,
    /// The unique name owning `org.bluez`.
    pub owner: Option<String>,
    /// `None`: the adapter is not there.
    pub powered: Option<bool>,
    pub discovering: Option<bool>,
}

impl Health {
    fn unknown() -> Health {
        Health {
            at: Instant::now(),
            bus: false,
            owner: None,
            powered: None,
            discovering: None,
        }
    }

    /// Everything a scan needs.
    pub fn scanning(&self) -> bool {
        self.bus
            && self.owner.is_some()
            && self.powered == Some(true)
            && self.discovering == Some(true)
    }
}

/// The watcher thread's handle. The thread ends at its next poll once this is dropped.
pub(super) struct Watcher {
    pub health: watch::Receiver<Health>,
    removals: std_mpsc::SyncSender<String>,
    adapter: watch::Sender<String>,
}

impl Watcher {
    pub fn spawn(adapter: String) -> std::io::Result<Watcher> {
        let (health_tx, health) = watch::channel(Health::unknown());
        let (removals, removals_rx) = std_mpsc::sync_channel(REMOVALS_QUEUED);
        let (adapter_tx, adapter_rx) = watch::channel(adapter);
        std::thread::Builder::new()
            .name("bluez-watch".into())
            .spawn(move || watch_loop(health_tx, removals_rx, adapter_rx))?;
        Ok(Watcher {
            health,
            removals,
            adapter: adapter_tx,
        })
    }

    /// Asks BlueZ to forget a device (`hci0/dev_AA_BB_...`). `false` if the queue is full.
    pub fn remove(&self, device: String) -> bool {
        self.removals.try_send(device).is_ok()
    }

    /// Watches another adapter from now on.
    pub fn set_adapter(&self, name: &str) {
        self.adapter.send_if_modified(|a| {
            let changed = a != name;
            if changed {
                *a = name.to_string();
            }
            changed
        });
    }
}

fn watch_loop(
    health: watch::Sender<Health>,
    removals: std_mpsc::Receiver<String>,
    adapter: watch::Receiver<String>,
) {
    let mut conn: Option<Connection> = None;
    let mut next_poll = Instant::now();
    loop {
        if health.is_closed() {
            return;
        }
        let now = Instant::now();
        if now >= next_poll {
            if conn.is_none() {
                conn = Connection::new_system().ok();
            }
            let name = adapter.borrow().clone();
            let seen = match &conn {
                Some(c) => probe(c, &name),
                None => Health::unknown(),
            };
            if !seen.bus {
                conn = None;
            }
            health.send_replace(seen);
            next_poll = now + POLL;
        }
        match removals.recv_timeout(next_poll.saturating_duration_since(Instant::now())) {
            Ok(device) => {
                if let Some(c) = &conn {
                    remove_device(c, &device);
                }
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(next_poll.saturating_duration_since(Instant::now()));
            }
        }
    }
}

fn probe(conn: &Connection, adapter: &str) -> Health {
    // Stamped before asking: a step taken after this instant is not judged by it.
    let mut h = Health::unknown();
    let Ok(owner) = owner(conn) else { return h };
    h.bus = true;
    h.owner = owner;
    if h.owner.is_some() {
        let path = format!("/org/bluez/{adapter}");
        let props: Result<PropMap, _> = conn.with_proxy(BLUEZ, path, CALL_TIMEOUT).get_all(ADAPTER);
        if let Ok(props) = props {
            h.powered = Some(
                prop_cast::<bool>(&props, "Powered")
                    .copied()
                    .unwrap_or(false),
            );
            h.discovering = Some(
                prop_cast::<bool>(&props, "Discovering")
                    .copied()
                    .unwrap_or(false),
            );
        }
    }
    h
}

/// `device` is `hci0/dev_AA_BB_CC_DD_EE_FF` (a bluez-async `DeviceId` displayed).
fn remove_device(conn: &Connection, device: &str) {
    let Some((adapter, _)) = device.split_once('/') else {
        return;
    };
    let Ok(path) = dbus::Path::new(format!("/org/bluez/{device}")) else {
        return;
    };
    let result: Result<(), dbus::Error> = conn
        .with_proxy(BLUEZ, format!("/org/bluez/{adapter}"), CALL_TIMEOUT)
        .method_call(ADAPTER, "RemoveDevice", (path,));
    if let Err(e) = result {
        tracing::debug!(device, error = %describe(&e), "BlueZ did not remove a forgotten device");
    }
}
