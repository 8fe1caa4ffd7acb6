//! The D-Bus side of a scan: a connection to BlueZ, the adapter on it, and a session
//! that scans (discovery, or the adapter only powered on for a passive scan) with the
//! devices' signals subscribed when adverts come over D-Bus. Touches BlueZ only.

use bluez_async::{AdapterId, BluetoothError, BluetoothSession, DiscoveryFilter, Transport};
use tokio::time::Instant;

use super::signals::Signals;
use crate::record::Mac;

/// A new D-Bus connection to BlueZ. The task that owns it is left running: bluez-async
/// offers no way to end it.
pub(super) async fn connect() -> Result<BluetoothSession, BluetoothError> {
    BluetoothSession::new()
        .await
        .map(|(_connection_task, session)| session)
}

/// An adapter on a BlueZ session.
#[derive(Clone)]
pub(super) struct Adapter {
    pub(super) session: BluetoothSession,
    id: AdapterId,
}

impl Adapter {
    /// Powers the adapter on and starts LE discovery with `DuplicateData`, so that
    /// BlueZ signals every advert whose data changed, not only new devices. LE only:
    /// on a dual-mode controller without simultaneous discovery, `auto` would spend
    /// about half the time on classic inquiry, hearing no tape.
    pub(super) async fn start_scan(&self) -> Result<(), BluetoothError> {
        let filter = DiscoveryFilter {
            duplicate_data: Some(true),
            transport: Some(Transport::Le),
            ..Default::default()
        };
        self.session
            .start_discovery_on_adapter_with_filter(&self.id, &filter)
            .await
    }

    pub(super) async fn stop_scan(&self) -> Result<(), BluetoothError> {
        self.session.stop_discovery_on_adapter(&self.id).await
    }

    pub(super) async fn power_on(&self) -> Result<(), BluetoothError> {
        self.session.set_powered(&self.id, true).await
    }

    pub(super) async fn power_off(&self) -> Result<(), BluetoothError> {
        self.session.set_powered(&self.id, false).await
    }
}

/// How a session scans.
#[derive(Debug, Clone, Copy)]
pub(super) struct How {
    /// Adverts come from D-Bus signals (no side channel).
    pub(super) subscribe: bool,
    /// Discovery runs (active); otherwise the adapter is only powered on (passive).
    pub(super) discovery: bool,
}

/// One adapter with its advert signals (D-Bus path) and a running scan.
pub(super) struct Session {
    pub(super) adapter: Adapter,
    /// `Some` while subscribed; `None` after the connection was lost (D-Bus path).
    pub(super) signals: Option<Signals>,
    pub(super) how: How,
    pub(super) started: Instant,
}

/// Finds `name` on `bluez`, subscribes to its devices' signals (D-Bus path), starts the
/// scan. Returns the devices BlueZ knew (D-Bus path), listed after subscribing: a device
/// found in between is seen twice rather than never.
pub(super) async fn open(
    bluez: Option<&BluetoothSession>,
    name: &str,
    how: How,
) -> Result<(Session, Vec<bluez_async::DeviceInfo>), String> {
    let bluez = bluez.ok_or("no connection to BlueZ")?;
    let path = format!("/org/bluez/{name}");
    let id = bluez
        .get_adapters()
        .await
        .map_err(|e| format!("cannot list the adapters: {e}"))?
        .into_iter()
        .map(|a| a.id)
        .find(|id| *dbus::Path::from(id.clone()) == *path)
        .ok_or_else(|| format!("adapter {name} is not there"))?;
    let adapter = Adapter {
        session: bluez.clone(),
        id,
    };
    let (signals, known) = if how.subscribe {
        let signals = Signals::connect(name)
            .await
            .map_err(|e| format!("cannot subscribe to the devices of {name}: {e}"))?;
        let known = bluez
            .get_devices_on_adapter(&adapter.id)
            .await
            .map_err(|e| format!("cannot list the devices of {name}: {e}"))?;
        (Some(signals), known)
    } else {
        (None, Vec::new())
    };
    let started = if how.discovery {
        // Starting discovery powers the adapter on first.
        adapter.start_scan().await
    } else {
        adapter.power_on().await
    };
    started.map_err(|e| {
        format!("cannot power on {name} and scan: {e} (blocked? try `rfkill unblock bluetooth`)")
    })?;
    Ok((
        Session {
            adapter,
            signals,
            how,
            started: Instant::now(),
        },
        known,
    ))
}

/// BlueZ's name of a device of `adapter` (`hci0/dev_AA_BB_CC_DD_EE_FF`).
pub(super) fn device_id(adapter: &str, mac: &Mac) -> String {
    format!("{adapter}/dev_{}", mac.to_string().replace(':', "_"))
}
