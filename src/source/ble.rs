/*!
The `ble` source: BLE advertisements heard from BlueZ over D-Bus (bluez-async, the
library under btleplug, used directly).

Each device event of bluez-async becomes one [`Advertisement`] stamped with the wall
clock: `Discovered` (the device's first advert: its properties are read once, because
no data event comes for it; a device without RSSI was not heard in this scan and gives
none; the devices BlueZ already knows when the scan starts count as discovered),
`ManufacturerData`, `ServiceData` and `Rssi`, which carry the new values (from BlueZ's
`PropertiesChanged`), completed from what this source remembers of the device. No D-Bus
call is made per advert (btleplug reads all of a device's properties for each one).
One BlueZ signal that changes both RSSI and data gives two adverts (dedup drops the
repeated packet). Adverts that match no product are dropped here when a filter is given
(the daemon gives its products, and those of every SIGHUP reload), so that a crowded
dock costs little further on. A radio cannot be back-pressured: when the channel is
full the advert is dropped and counted (logged at most every 10 s).

# The liveness ladder
Field gateways stop hearing adverts while looking alive (btleplug #332), adapters get
powered off or vanish, bluetoothd restarts. A [`bluez::Watcher`] polls BlueZ beside
the scan; trouble is one of: the system bus or `org.bluez` gone, `org.bluez` with a new
owner (bluetoothd restarted), the adapter gone, powered off or no longer discovering,
the event stream ended, or no advert for `scanner.silence_secs` once any was heard.
Then, each step logged once at WARN with the reason:
1. restart the scan (stop and start discovery on the same adapter);
2. if that has not helped after [`STEP_WAIT`]: re-acquire the adapter on a new BlueZ
   session (a new D-Bus connection), retried every [`STEP_WAIT`];
3. if the scanner is still not back after `scanner.give_up_secs`:
   [`SourceError::GaveUp`], the daemon exits 1 and systemd restarts it.

The scanner is back when BlueZ, the adapter and discovery are all there again (for
silence: when an advert arrives); that is logged once at INFO. Counts of restarts and
re-acquisitions are logged when the source ends.

bluez-async offers no way to close a session's D-Bus connection (the task that owns it
runs on), so step 2 makes one session per episode and its retries reuse it while it
answers; after [`MAX_MANAGERS`] the source gives up so that a fresh process starts.

# Bounded memory
This source remembers devices (for RSSI and data events) and BlueZ keeps a D-Bus object
per device. At most `scanner.max_devices` are remembered; the least recently heard one
past it is forgotten here and removed from BlueZ (`Adapter1.RemoveDevice`), so rotating
MACs cannot grow either side.
*/

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bluez_async::{
    AdapterEvent, AdapterId, BluetoothError, BluetoothEvent, BluetoothSession, DeviceEvent,
    DeviceId, DeviceInfo, DiscoveryFilter, Transport,
};
use futures::{stream, Stream, StreamExt};
use hashlink::LruCache;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Source, SourceError, SourceHealth, SourceReport};
use crate::clock::now_ms;
use crate::config::{Config, ScannerSettings};
use crate::products::Products;
use crate::record::{Advertisement, Mac};

mod bluez;

/// How long a ladder step is given before the next one.
pub const STEP_WAIT: Duration = Duration::from_secs(2);
/// How often the source looks at the watcher's findings and the silence.
const TICK: Duration = Duration::from_millis(250);
/// BlueZ connections (bluez-async sessions) made at most before the process gives up, so
/// that systemd starts it afresh: bluez-async never closes a session's connection.
const MAX_MANAGERS: u32 = 32;
/// How long stopping waits for BlueZ to stop the scan.
const STOP_SCAN_WAIT: Duration = Duration::from_secs(2);
/// Drops are logged at most this often.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// What the `ble` source needs from `[scanner]`.
#[derive(Debug, Clone)]
pub struct BleSettings {
    /// `hci0`; `None`: the first adapter.
    pub adapter: Option<String>,
    /// `None`: silence never restarts the scan.
    pub silence: Option<Duration>,
    pub give_up: Duration,
    pub max_devices: usize,
}

impl BleSettings {
    pub fn from_scanner(s: &ScannerSettings) -> BleSettings {
        BleSettings {
            adapter: s.adapter.clone(),
            silence: s.silence,
            give_up: s.give_up,
            max_devices: s.max_devices.max(1),
        }
    }
}

/// The BLE source.
pub struct Ble {
    settings: BleSettings,
    filter: Option<Filter>,
    health: Arc<SourceHealth>,
}

/// The products an advert must match to be sent on.
struct Filter {
    products: Products,
    reload: Option<watch::Receiver<Arc<Config>>>,
}

impl Filter {
    fn matches(&mut self, adv: &Advertisement) -> bool {
        if let Some(r) = &mut self.reload {
            if r.has_changed().unwrap_or(false) {
                self.products = r.borrow_and_update().products.clone();
            }
        }
        self.products.matches(adv).is_some()
    }
}

impl Ble {
    pub fn new(settings: BleSettings) -> Ble {
        Ble {
            settings,
            filter: None,
            health: Arc::default(),
        }
    }

    /// Shares the ladder's counts (for `tapegate status`).
    pub fn with_health(mut self, health: Arc<SourceHealth>) -> Ble {
        self.health = health;
        self
    }

    /// Sends on only the adverts that match one of `products` (taken from each config
    /// that `reload` delivers, when given).
    pub fn with_filter(
        mut self,
        products: Products,
        reload: Option<watch::Receiver<Arc<Config>>>,
    ) -> Ble {
        self.filter = Some(Filter { products, reload });
        self
    }
}

impl Source for Ble {
    async fn run(
        self,
        out: mpsc::Sender<Advertisement>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        let wanted = self.settings.adapter.clone();
        let (adapter_name, owner) =
            tokio::task::spawn_blocking(move || bluez::preflight(wanted.as_deref()))
                .await
                .map_err(|e| SourceError::Bluez(format!("preflight task failed: {e}")))??;
        let watcher = bluez::Watcher::spawn(adapter_name.clone())
            .map_err(|e| SourceError::Bluez(format!("cannot start the BlueZ watcher: {e}")))?;
        let mut manager = Some(
            connect()
                .await
                .map_err(|e| SourceError::Bluez(e.to_string()))?,
        );
        let session = open(manager.as_ref(), &adapter_name)
            .await
            .map_err(SourceError::Bluez)?;
        tracing::info!(adapter = %adapter_name, "scanning for BLE advertisements");
        let mut scanner = Scanner {
            settings: self.settings,
            filter: self.filter,
            out,
            watcher,
            adapter_name,
            session: Some(session),
            devices: LruCache::new_unbounded(),
            owner: Some(owner),
            heard_any: false,
            last_heard: Instant::now(),
            recovery: None,
            managers: 1,
            stats: Stats::default(),
            last_drop_log: None,
            health: self.health,
        };
        let result = scanner.run(&mut manager, stop).await;
        if let Some(adapter) = scanner.adapter() {
            let _ = tokio::time::timeout(STOP_SCAN_WAIT, adapter.stop_scan()).await;
        }
        let st = &scanner.stats;
        tracing::info!(
            adverts = st.adverts,
            not_matching = st.not_matching,
            dropped = st.dropped,
            restarts = st.restarts,
            reacquires = st.reacquires,
            forgotten = st.forgotten,
            "BLE scan ended"
        );
        result.map(|()| SourceReport {
            adverts: st.adverts,
            malformed: 0,
        })
    }
}

/// A new D-Bus connection to BlueZ. The task that owns it is left running: bluez-async
/// offers no way to end it.
async fn connect() -> Result<BluetoothSession, BluetoothError> {
    BluetoothSession::new()
        .await
        .map(|(_connection_task, session)| session)
}

/// What the event stream of a session gives.
enum Event {
    /// A device BlueZ knew when the stream started.
    Known(Box<DeviceInfo>),
    Bluez(BluetoothEvent),
}

type Events = Pin<Box<dyn Stream<Item = Event> + Send>>;

/// An adapter on a BlueZ session.
#[derive(Clone)]
struct Adapter {
    session: BluetoothSession,
    id: AdapterId,
}

impl Adapter {
    /// Powers the adapter on and starts discovery with btleplug's filter: `DuplicateData`,
    /// so that BlueZ signals every advert whose data changed, not only new devices.
    async fn start_scan(&self) -> Result<(), BluetoothError> {
        let filter = DiscoveryFilter {
            duplicate_data: Some(true),
            transport: Some(Transport::Auto),
            ..Default::default()
        };
        self.session
            .start_discovery_on_adapter_with_filter(&self.id, &filter)
            .await
    }

    async fn stop_scan(&self) -> Result<(), BluetoothError> {
        self.session.stop_discovery_on_adapter(&self.id).await
    }
}

/// One adapter with its event stream and a running scan.
struct Session {
    adapter: Adapter,
    events: Option<Events>,
    started: std::time::Instant,
}

/// Finds `name` on `bluez`, subscribes to its events, starts the scan.
async fn open(bluez: Option<&BluetoothSession>, name: &str) -> Result<Session, String> {
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
    let subscribing = |e: BluetoothError| format!("cannot subscribe to the events of {name}: {e}");
    // Subscribed before the devices are listed: a device found in between is seen twice
    // rather than never.
    let events = bluez
        .adapter_event_stream(&adapter.id)
        .await
        .map_err(subscribing)?;
    let known = bluez
        .get_devices_on_adapter(&adapter.id)
        .await
        .map_err(subscribing)?;
    let events: Events = Box::pin(
        stream::iter(known.into_iter().map(|d| Event::Known(Box::new(d))))
            .chain(events.map(Event::Bluez)),
    );
    // Starting discovery powers the adapter on first.
    adapter.start_scan().await.map_err(|e| {
        format!("cannot power on {name} and scan: {e} (blocked? try `rfkill unblock bluetooth`)")
    })?;
    Ok(Session {
        adapter,
        events: Some(events),
        started: std::time::Instant::now(),
    })
}

/// What the source did, logged when it ends.
#[derive(Debug, Default)]
struct Stats {
    adverts: u64,
    not_matching: u64,
    dropped: u64,
    dropped_logged: u64,
    restarts: u64,
    reacquires: u64,
    forgotten: u64,
}

/// What is remembered of a device between its adverts.
struct Device {
    mac: Mac,
    name: Option<String>,
    rssi: Option<i16>,
    manufacturer_data: Vec<(u16, Vec<u8>)>,
    service_data: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    RestartScan,
    Reacquire,
}

/// The ladder in progress.
struct Recovery {
    reason: String,
    silence: bool,
    since: Instant,
    step: Step,
    /// When the last step was taken: only later polls judge it.
    acted: std::time::Instant,
    next: Instant,
    failures_logged: bool,
}

struct Scanner {
    settings: BleSettings,
    filter: Option<Filter>,
    out: mpsc::Sender<Advertisement>,
    watcher: bluez::Watcher,
    adapter_name: String,
    session: Option<Session>,
    devices: LruCache<DeviceId, Device>,
    /// `org.bluez`'s owner when the scan (re)started.
    owner: Option<String>,
    heard_any: bool,
    last_heard: Instant,
    recovery: Option<Recovery>,
    /// Sessions (connections to BlueZ) made so far.
    managers: u32,
    stats: Stats,
    last_drop_log: Option<Instant>,
    /// The counts `status` shows, shared with the pipeline.
    health: Arc<SourceHealth>,
}

/// Pends forever without a stream, so that `select!` can wait on it.
async fn next_event(session: &mut Option<Session>) -> Option<Event> {
    match session.as_mut().and_then(|s| s.events.as_mut()) {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

impl Scanner {
    /// The adapter being scanned (cloned: a session holds a stream that is not `Sync`).
    fn adapter(&self) -> Option<Adapter> {
        self.session.as_ref().map(|s| s.adapter.clone())
    }

    async fn run(
        &mut self,
        manager: &mut Option<BluetoothSession>,
        stop: CancellationToken,
    ) -> Result<(), SourceError> {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                event = next_event(&mut self.session) => match event {
                    // A D-Bus call to a hung BlueZ can take long: stopping does not wait.
                    Some(event) => tokio::select! {
                        biased;
                        _ = stop.cancelled() => return Ok(()),
                        more = self.handle(event) => if !more {
                            return Ok(());
                        },
                    },
                    None => {
                        if let Some(s) = &mut self.session {
                            s.events = None;
                        }
                    }
                },
                _ = tick.tick() => tokio::select! {
                    biased;
                    _ = stop.cancelled() => return Ok(()),
                    checked = self.check(manager) => checked?,
                },
            }
        }
    }

    /// Handles one event; `false` once nobody reads the adverts any more.
    async fn handle(&mut self, event: Event) -> bool {
        let id = match event {
            Event::Known(info) => {
                let id = info.id.clone();
                self.remember(*info);
                // A device BlueZ remembers but has not heard in this scan (paired, or
                // cached from before) has no RSSI: its data is old, not an advert.
                if self.devices.get(&id).is_some_and(|d| d.rssi.is_none()) {
                    return true;
                }
                id
            }
            Event::Bluez(BluetoothEvent::Device { id, event }) => match event {
                DeviceEvent::Discovered => {
                    // Devices of other adapters are announced too.
                    if self
                        .session
                        .as_ref()
                        .is_none_or(|s| s.adapter.id != id.adapter())
                    {
                        return true;
                    }
                    // Rediscovery refreshes from BlueZ.
                    self.devices.remove(&id);
                    if !self.device(&id).await {
                        return true;
                    }
                    if self.devices.get(&id).is_some_and(|d| d.rssi.is_none()) {
                        return true;
                    }
                    id
                }
                DeviceEvent::ManufacturerData { manufacturer_data } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.manufacturer_data = sorted(manufacturer_data.into_iter().collect());
                    }
                    id
                }
                DeviceEvent::ServiceData { service_data } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.service_data = sorted(
                            service_data
                                .into_iter()
                                .map(|(u, v)| (u.to_string(), v))
                                .collect(),
                        );
                    }
                    id
                }
                DeviceEvent::Rssi { rssi } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.rssi = Some(rssi);
                    }
                    id
                }
                _ => return true,
            },
            Event::Bluez(BluetoothEvent::Adapter {
                id,
                event: AdapterEvent::Powered { powered },
            }) => {
                tracing::debug!(powered, "adapter power");
                let ours = self.session.as_ref().is_some_and(|s| s.adapter.id == id);
                if ours && !powered && self.recovery.is_none() {
                    let reason = format!("adapter {} was powered off", self.adapter_name);
                    self.start_recovery(reason, false).await;
                }
                return true;
            }
            Event::Bluez(_) => return true,
        };
        let Some(d) = self.devices.get(&id) else {
            return true;
        };
        let adv = Advertisement {
            ts_ms: now_ms(),
            mac: d.mac,
            rssi: d.rssi,
            name: d.name.clone(),
            manufacturer_data: d.manufacturer_data.clone(),
            service_data: d.service_data.clone(),
        };
        self.heard_any = true;
        self.last_heard = Instant::now();
        if let Some(f) = &mut self.filter {
            if !f.matches(&adv) {
                self.stats.not_matching += 1;
                return true;
            }
        }
        match self.out.try_send(adv) {
            Ok(()) => self.stats.adverts += 1,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.dropped += 1;
                SourceHealth::count(&self.health.dropped);
                let now = Instant::now();
                if self
                    .last_drop_log
                    .is_none_or(|t| now.duration_since(t) >= DROP_LOG_EVERY)
                {
                    tracing::warn!(
                        dropped = self.stats.dropped - self.stats.dropped_logged,
                        "adverts dropped: the pipeline is not keeping up with the radio"
                    );
                    self.stats.dropped_logged = self.stats.dropped;
                    self.last_drop_log = Some(now);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
        }
        true
    }

    /// Makes sure `id` is remembered (reading its properties from BlueZ if not);
    /// `false` if it cannot be.
    async fn device(&mut self, id: &DeviceId) -> bool {
        if self.devices.get(id).is_some() {
            return true;
        }
        let Some(adapter) = self.adapter() else {
            return false;
        };
        match adapter.session.get_device_info(id).await {
            Ok(info) => {
                self.remember(info);
                true
            }
            Err(e) => {
                tracing::debug!(device = %id, error = %e, "cannot read a device's properties");
                false
            }
        }
    }

    /// Remembers a device as BlueZ describes it, forgetting the least recently heard
    /// ones past `max_devices` (here and in BlueZ).
    fn remember(&mut self, info: DeviceInfo) {
        self.devices.remove(&info.id);
        let device = Device {
            mac: Mac::new(info.mac_address.into()),
            name: info.name,
            rssi: info.rssi,
            manufacturer_data: sorted(info.manufacturer_data.into_iter().collect()),
            service_data: sorted(
                info.service_data
                    .into_iter()
                    .map(|(u, v)| (u.to_string(), v))
                    .collect(),
            ),
        };
        while self.devices.len() >= self.settings.max_devices {
            let Some((old, _)) = self.devices.remove_lru() else {
                break;
            };
            self.stats.forgotten += 1;
            SourceHealth::count(&self.health.forgotten);
            self.watcher.remove(old.to_string());
        }
        self.devices.insert(info.id, device);
    }

    /// Looks at the watcher's last poll and the silence; walks the ladder.
    async fn check(&mut self, manager: &mut Option<BluetoothSession>) -> Result<(), SourceError> {
        let health = self.watcher.health.borrow().clone();
        let now = Instant::now();
        let Some(r) = &mut self.recovery else {
            let started = self.session.as_ref().map(|s| s.started);
            if let Some((reason, silence)) = self.trouble(&health, started) {
                self.start_recovery(reason, silence).await;
            }
            return Ok(());
        };
        let back = if r.silence {
            self.last_heard > r.since
        } else {
            health.at > r.acted && health.scanning()
        };
        if back {
            tracing::info!(
                reason = %r.reason,
                after_secs = now.duration_since(r.since).as_secs_f64(),
                "scanning again"
            );
            self.owner = health.owner.clone();
            self.last_heard = now;
            self.recovery = None;
            return Ok(());
        }
        if now.duration_since(r.since) >= self.settings.give_up {
            tracing::error!(reason = %r.reason, give_up_secs = self.settings.give_up.as_secs(), "giving up on the BLE scanner");
            return Err(SourceError::GaveUp {
                reason: r.reason.clone(),
                secs: self.settings.give_up.as_secs(),
            });
        }
        if now < r.next {
            return Ok(());
        }
        let first_attempt = r.step == Step::RestartScan;
        if first_attempt {
            tracing::warn!(reason = %r.reason, "restarting the scan did not help: re-acquiring the adapter (a new BlueZ connection)");
            r.step = Step::Reacquire;
            self.stats.reacquires += 1;
            SourceHealth::count(&self.health.reacquires);
        }
        r.acted = std::time::Instant::now();
        r.next = now + STEP_WAIT;
        let failures_logged = r.failures_logged;
        // Each step 2 starts on a new session; its retries reuse it while it answers.
        if !first_attempt {
            if let Some(m) = manager.as_ref() {
                if m.get_adapters().await.is_err() {
                    *manager = None;
                }
            }
        }
        if first_attempt || manager.is_none() {
            if self.managers >= MAX_MANAGERS {
                let reason = format!(
                    "{} (and {MAX_MANAGERS} BlueZ connections made, which bluez-async never closes)",
                    r.reason
                );
                tracing::error!(reason = %reason, "giving up on the BLE scanner");
                return Err(SourceError::GaveUp {
                    reason,
                    secs: now.duration_since(r.since).as_secs(),
                });
            }
            self.managers += 1;
            *manager = connect().await.ok();
        }
        if let Some(old) = self.session.take() {
            let _ = old.adapter.stop_scan().await;
        }
        // A new bluetoothd may have another first adapter.
        let name = match &self.settings.adapter {
            Some(n) => n.clone(),
            None => {
                let n = tokio::task::spawn_blocking(|| bluez::preflight(None)).await;
                match n {
                    Ok(Ok((n, _))) => n,
                    _ => self.adapter_name.clone(),
                }
            }
        };
        if name != self.adapter_name {
            tracing::info!(old = %self.adapter_name, new = %name, "scanning on another adapter");
            self.adapter_name = name;
            self.watcher.set_adapter(&self.adapter_name);
        }
        match open(manager.as_ref(), &self.adapter_name).await {
            Ok(s) => {
                self.devices.clear();
                self.session = Some(s);
            }
            Err(e) => {
                if let Some(r) = &mut self.recovery {
                    if !failures_logged {
                        tracing::warn!(reason = %r.reason, error = %e, "cannot re-acquire the adapter yet; retrying");
                        r.failures_logged = true;
                    } else {
                        tracing::debug!(error = %e, "cannot re-acquire the adapter yet");
                    }
                }
            }
        }
        Ok(())
    }

    /// What is wrong (and whether it is silence), judged by a poll taken after the scan
    /// (re)started.
    fn trouble(
        &mut self,
        h: &bluez::Health,
        started: Option<std::time::Instant>,
    ) -> Option<(String, bool)> {
        self.health_trouble(h, started)
            .map(|r| (r, false))
            .or_else(|| self.silence_trouble().map(|r| (r, true)))
    }

    fn silence_trouble(&self) -> Option<String> {
        let silence = self.settings.silence?;
        let quiet = self.last_heard.elapsed();
        (self.heard_any && quiet >= silence).then(|| format!("no advert for {} s", quiet.as_secs()))
    }

    fn health_trouble(
        &mut self,
        h: &bluez::Health,
        started: Option<std::time::Instant>,
    ) -> Option<String> {
        let Some(started) = started else {
            return Some("there is no scan".into());
        };
        if self.session.as_ref().is_some_and(|s| s.events.is_none()) {
            return Some("BlueZ's event stream ended".into());
        }
        if h.at <= started {
            return None;
        }
        if self.owner.is_none() {
            self.owner.clone_from(&h.owner);
        }
        judge(h, &self.adapter_name, self.owner.as_deref())
    }

    /// Ladder step 1: restart the scan.
    async fn start_recovery(&mut self, reason: String, silence: bool) {
        tracing::warn!(reason = %reason, "BLE scanner in trouble: restarting the scan");
        self.stats.restarts += 1;
        SourceHealth::count(&self.health.restarts);
        self.health.trouble(&reason);
        let now = Instant::now();
        if let Some(adapter) = self.adapter() {
            let _ = adapter.stop_scan().await;
            if let Err(e) = adapter.start_scan().await {
                tracing::debug!(error = %e, "restarting the scan failed");
            }
        }
        self.recovery = Some(Recovery {
            reason,
            silence,
            since: now,
            step: Step::RestartScan,
            acted: std::time::Instant::now(),
            next: now + STEP_WAIT,
            failures_logged: false,
        });
    }
}

/// What is wrong with a scan on `adapter` according to `h`, with `owner` the unique
/// name that owned `org.bluez` when the scan started.
fn judge(h: &bluez::Health, adapter: &str, owner: Option<&str>) -> Option<String> {
    if !h.bus {
        return Some("the D-Bus system bus does not answer".into());
    }
    let Some(now_owner) = &h.owner else {
        return Some("BlueZ (org.bluez) left the system bus".into());
    };
    if owner.is_some_and(|o| o != now_owner) {
        return Some("bluetoothd restarted (org.bluez has a new owner)".into());
    }
    match (h.powered, h.discovering) {
        (None, _) => Some(format!("adapter {adapter} disappeared")),
        (Some(false), _) => Some(format!("adapter {adapter} was powered off")),
        (_, Some(false)) => Some(format!("discovery stopped on adapter {adapter}")),
        _ => None,
    }
}

fn sorted<K: Ord, V>(mut v: Vec<(K, V)>) -> Vec<(K, V)> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> bluez::Health {
        bluez::Health {
            at: std::time::Instant::now(),
            bus: true,
            owner: Some(":1.7".into()),
            powered: Some(true),
            discovering: Some(true),
        }
    }

    #[test]
    fn a_healthy_scan_is_left_alone() {
        assert!(healthy().scanning());
        assert_eq!(judge(&healthy(), "hci0", Some(":1.7")), None);
    }

    #[test]
    fn each_trouble_is_named_with_its_reason() {
        type Change = fn(&mut bluez::Health);
        let cases: [(Change, &str); 6] = [
            (|h| h.bus = false, "the D-Bus system bus does not answer"),
            (|h| h.owner = None, "BlueZ (org.bluez) left the system bus"),
            (
                |h| h.owner = Some(":1.9".into()),
                "bluetoothd restarted (org.bluez has a new owner)",
            ),
            (|h| h.powered = None, "adapter hci0 disappeared"),
            (|h| h.powered = Some(false), "adapter hci0 was powered off"),
            (
                |h| h.discovering = Some(false),
                "discovery stopped on adapter hci0",
            ),
        ];
        for (change, reason) in cases {
            let mut h = healthy();
            change(&mut h);
            assert!(!h.scanning() || reason.contains("restarted"), "{reason}");
            assert_eq!(judge(&h, "hci0", Some(":1.7")).as_deref(), Some(reason));
        }
    }

    #[test]
    fn powered_off_is_named_before_the_discovery_it_stops() {
        let mut h = healthy();
        h.powered = Some(false);
        h.discovering = Some(false);
        assert_eq!(
            judge(&h, "hci1", Some(":1.7")).as_deref(),
            Some("adapter hci1 was powered off")
        );
    }

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
}
