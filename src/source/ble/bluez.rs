/*!
Plain D-Bus calls to BlueZ beside the scan's session: whether BlueZ runs and who owns its
name, whether the adapter is powered and discovering, and forgetting a device.
It touches BlueZ over D-Bus only.

- [`preflight`] runs once before the scan and turns every way of not being able to scan
  into a [`SourceError`] that says what to do.
- [`Watcher`] keeps the health of BlueZ and the adapter current on its own connection,
  told by signals, not by polling: `NameOwnerChanged` for `org.bluez` (bluetoothd
  leaving, or restarting under a new owner, even between two reads), the adapter's
  `PropertiesChanged` (`Powered`, `Discovering`) and `InterfacesAdded`/`Removed` of the
  adapter object. Its match rules name the adapter's own path, so the adverts (each a
  `PropertiesChanged` of a device) never reach it. It reads the state itself
  ([`Watcher::probe`]) only when the scan starts and after each step of the ladder, so
  that a step is judged by what BlueZ says after it; with nothing happening it costs no
  wake-up at all. It also sends the removals of the devices the source forgets.
*/

use std::sync::Arc;
use std::time::Duration;

use dbus::arg::{prop_cast, PropMap};
use dbus::blocking::stdintf::org_freedesktop_dbus::ObjectManager;
use dbus::blocking::Connection;
use dbus::channel::{MatchingReceiver, Sender};
use dbus::message::{MatchRule, MessageType, SignalArgs};
use dbus::nonblock::stdintf::org_freedesktop_dbus::{
    ObjectManagerInterfacesAdded, ObjectManagerInterfacesRemoved, Properties,
    PropertiesPropertiesChanged,
};
use dbus::nonblock::{Proxy, SyncConnection};
use dbus::Message;
use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::source::SourceError;

const BLUEZ: &str = "org.bluez";
const ADAPTER: &str = "org.bluez.Adapter1";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const OBJECT_MANAGER: &str = "org.freedesktop.DBus.ObjectManager";
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Signals applied at most per wake-up of the watcher (more wait for the next turn).
const SIGNALS_PER_TURN: usize = 64;

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

/// What the watcher knows of BlueZ and the adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Health {
    /// When this was last learned (a signal, or a read): a ladder step taken later is
    /// judged only by what is learned after it.
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

    /// Everything a scan needs: a `discovery` also needs BlueZ discovering (a passive
    /// scan is the kernel's monitor, which BlueZ does not show).
    pub fn scanning(&self, discovery: bool) -> bool {
        self.bus
            && self.owner.is_some()
            && self.powered == Some(true)
            && (!discovery || self.discovering == Some(true))
    }

    /// Takes `Powered` and `Discovering` from an adapter's properties, as far as given.
    fn adapter(&mut self, props: &PropMap) {
        if let Some(p) = prop_cast::<bool>(props, "Powered") {
            self.powered = Some(*p);
        }
        if let Some(d) = prop_cast::<bool>(props, "Discovering") {
            self.discovering = Some(*d);
        }
    }
}

/// The watcher's connection to the system bus.
struct Link {
    conn: Arc<SyncConnection>,
    /// Drives the connection; ends when the bus connection is lost.
    io: JoinHandle<()>,
    signals: UnboundedReceiver<Message>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.io.abort();
    }
}

/// The health of BlueZ and the adapter, kept current by signals (see the module doc).
pub(super) struct Watcher {
    adapter: String,
    link: Option<Link>,
    health: Health,
    /// `org.bluez` has a new owner, whose adapter is read at the next [`refresh`](Self::refresh).
    stale: bool,
}

impl Watcher {
    /// A watcher of `adapter` (`hci0`); it connects at its first [`probe`](Self::probe).
    pub fn new(adapter: String) -> Watcher {
        Watcher {
            adapter,
            link: None,
            health: Health::unknown(),
            stale: false,
        }
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    fn adapter_path(&self) -> String {
        format!("/org/bluez/{}", self.adapter)
    }

    /// Reads the state now (connecting first if needed): after a ladder step, so that
    /// the step is judged by what BlueZ says after it.
    pub async fn probe(&mut self) {
        self.stale = false;
        // Stamped before asking: a step taken after this instant is not judged by it.
        let mut h = Health::unknown();
        if self.link.is_none() {
            self.link = self.connect().await;
        }
        let Some(link) = &self.link else {
            self.health = h;
            return;
        };
        let bus = Proxy::new(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            CALL_TIMEOUT,
            link.conn.clone(),
        );
        let owner: Result<(String,), dbus::Error> = bus
            .method_call("org.freedesktop.DBus", "GetNameOwner", (BLUEZ,))
            .await;
        match owner {
            Ok((o,)) => h.owner = Some(o),
            Err(e) if e.name() == Some("org.freedesktop.DBus.Error.NameHasNoOwner") => {}
            Err(_) => {
                self.link = None;
                self.health = h;
                return;
            }
        }
        h.bus = true;
        if h.owner.is_some() {
            let adapter = Proxy::new(BLUEZ, self.adapter_path(), CALL_TIMEOUT, link.conn.clone());
            if let Ok(props) = adapter.get_all(ADAPTER).await {
                h.powered = Some(false);
                h.discovering = Some(false);
                h.adapter(&props);
            }
        }
        self.health = h;
    }

    /// A new connection with the match rules of this adapter; `None` when the bus
    /// cannot be reached.
    async fn connect(&self) -> Option<Link> {
        // Connecting blocks (a hung bus could hold it for long): not on the runtime.
        let connected = tokio::task::spawn_blocking(dbus_tokio::connection::new_system_sync).await;
        let (resource, conn) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!(error = %describe(&e), "the BlueZ watcher cannot connect to the system bus");
                return None;
            }
            Err(e) => {
                tracing::debug!(error = %e, "the BlueZ watcher's connecting task failed");
                return None;
            }
        };
        let io = tokio::spawn(async move {
            let _lost = resource.await;
        });
        let (tx, signals) = unbounded();
        // The bus sends only what the rules below select; everything it sends is taken.
        let mut any_signal = MatchRule::new();
        any_signal.msg_type = Some(MessageType::Signal);
        conn.start_receive(
            any_signal,
            Box::new(move |msg, _| tx.unbounded_send(msg).is_ok()),
        );
        let path = self.adapter_path();
        let rules = [
            format!(
                "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='{BLUEZ}'"
            ),
            format!(
                "type='signal',sender='{BLUEZ}',path='{path}',interface='{PROPERTIES}',member='PropertiesChanged',arg0='{ADAPTER}'"
            ),
            format!(
                "type='signal',sender='{BLUEZ}',interface='{OBJECT_MANAGER}',member='InterfacesAdded',arg0path='{path}'"
            ),
            format!(
                "type='signal',sender='{BLUEZ}',interface='{OBJECT_MANAGER}',member='InterfacesRemoved',arg0path='{path}'"
            ),
        ];
        for rule in &rules {
            if let Err(e) = conn.add_match_no_cb(rule).await {
                tracing::debug!(error = %describe(&e), "the BlueZ watcher cannot subscribe to a signal");
                io.abort();
                return None;
            }
        }
        Some(Link { conn, io, signals })
    }

    /// Reads the state again if a signal said it should (a new bluetoothd).
    pub async fn refresh(&mut self) {
        if self.stale {
            self.probe().await;
        }
    }

    /// Waits until something is learned (signals, or the bus connection lost), and
    /// applies everything already queued. Pends forever without a connection (the
    /// ladder's next step probes, which reconnects). Cancel-safe: nothing is awaited
    /// once a signal is taken.
    pub async fn changed(&mut self) {
        let Some(link) = &mut self.link else {
            return std::future::pending().await;
        };
        let first = tokio::select! {
            msg = link.signals.next() => msg,
            _ = &mut link.io => None,
        };
        let Some(first) = first else {
            tracing::debug!("the BlueZ watcher lost its system bus connection");
            self.link = None;
            self.health = Health::unknown();
            return;
        };
        let mut batch = vec![first];
        while batch.len() < SIGNALS_PER_TURN {
            match link.signals.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(_) => break,
            }
        }
        let path = self.adapter_path();
        for msg in &batch {
            // A new bluetoothd: what it says of the adapter is read at the next refresh.
            self.stale |= self.apply(msg, &path);
        }
        self.health.at = Instant::now();
    }

    /// Applies one signal; `true` when `org.bluez` has a new owner. Only the bus itself
    /// and BlueZ's owner are believed (anyone may send a signal to this connection).
    fn apply(&mut self, msg: &Message, path: &str) -> bool {
        let h = &mut self.health;
        let sender = msg.sender();
        if sender.as_deref() == Some("org.freedesktop.DBus") {
            if msg.member().is_some_and(|m| &*m == "NameOwnerChanged") {
                if let Ok((BLUEZ, _old, new)) = msg.read3::<&str, &str, &str>() {
                    h.powered = None;
                    h.discovering = None;
                    if new.is_empty() {
                        h.owner = None;
                    } else {
                        h.owner = Some(new.to_string());
                        return true;
                    }
                }
            }
            return false;
        }
        if sender.is_none() || sender.as_deref() != h.owner.as_deref() {
            return false;
        }
        let from_path = msg.path().is_some_and(|p| &*p == path);
        if let Some(pc) = PropertiesPropertiesChanged::from_message(msg) {
            if from_path && pc.interface_name == ADAPTER {
                h.adapter(&pc.changed_properties);
            }
        } else if let Some(added) = ObjectManagerInterfacesAdded::from_message(msg) {
            if &*added.object == path {
                if let Some(props) = added.interfaces.get(ADAPTER) {
                    h.powered = Some(false);
                    h.discovering = Some(false);
                    h.adapter(props);
                }
            }
        } else if let Some(removed) = ObjectManagerInterfacesRemoved::from_message(msg) {
            if &*removed.object == path && removed.interfaces.iter().any(|i| i == ADAPTER) {
                h.powered = None;
                h.discovering = None;
            }
        }
        false
    }

    /// Asks BlueZ to forget a device (`hci0/dev_AA_BB_...`), without waiting for the
    /// answer (BlueZ forgets temporary devices by itself too: this only keeps it lean).
    pub fn remove(&self, device: &str) {
        let Some(link) = &self.link else { return };
        let Some((adapter, _)) = device.split_once('/') else {
            return;
        };
        let Ok(path) = dbus::Path::new(format!("/org/bluez/{device}")) else {
            return;
        };
        let Ok(msg) = Message::new_method_call(
            BLUEZ,
            format!("/org/bluez/{adapter}"),
            ADAPTER,
            "RemoveDevice",
        ) else {
            return;
        };
        let mut msg = msg.append1(path);
        msg.set_no_reply(true);
        if link.conn.send(msg).is_err() {
            tracing::debug!(device, "BlueZ was not asked to remove a forgotten device");
        }
    }

    /// Watches another adapter from now on (its rules are made at the next probe).
    pub fn set_adapter(&mut self, name: &str) {
        if self.adapter != name {
            self.adapter = name.to_string();
            self.link = None;
        }
    }
}

#[cfg(test)]
mod tests;
