/*!
The `ble` source: BLE advertisements heard from BlueZ over D-Bus (bluez-async, the
library under btleplug, used directly).

Each device event of bluez-async becomes one [`Advertisement`] stamped with the wall
clock: `Discovered` (the device's first advert: its properties are read once, because
no data event comes for it; a device without RSSI was not heard in this scan and gives
none; the devices BlueZ already knows when the scan starts count as discovered),
`ManufacturerData`, `ServiceData` and `Rssi`, which carry the new values (from BlueZ's
`PropertiesChanged`), completed from what this source remembers of the device
(`devices.rs`). No D-Bus call is made per advert (btleplug reads all of a device's
properties for each one). One BlueZ signal that changes both RSSI and data gives two
adverts (dedup drops the repeated packet). Adverts that match no product are dropped
here when a filter is given (the daemon gives its products, and those of every SIGHUP
reload), so that a crowded dock costs little further on; the capture built by that
match is sent on with the advert, so that ingest does not match it again. A radio
cannot be back-pressured: when the channel is full the advert is dropped and counted
(logged at most every 10 s).

A `bluez::Watcher` keeps the health of BlueZ and the adapter current beside the scan,
told by signals, and the liveness ladder (`ladder.rs`) turns what it knows, the adverts
heard and the state of the scan into steps: restart the scan, re-acquire the adapter,
give up ([`SourceError::GaveUp`]: the daemon exits 1 and systemd restarts it). This file
takes them, each logged once at WARN with the reason; the scanner being back is logged
once at INFO. Counts of restarts and re-acquisitions are logged when the source ends.

Nothing here ticks. The source wakes for an event of the scan (and then takes every
event already queued, up to [`EVENTS_PER_TURN`]), for something the watcher learned,
or at the one deadline the ladder asks for (the end of the silence allowed, the next
step of a trouble): on a dock where all is well and nothing is heard, it sleeps.
*/

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bluez_async::{
    AdapterId, BluetoothError, BluetoothEvent, BluetoothSession, DeviceEvent, DeviceId, DeviceInfo,
    DiscoveryFilter, Transport,
};
use futures::{stream, FutureExt, Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Heard, Source, SourceError, SourceHealth, SourceReport};
use crate::clock::now_ms;
use crate::config::ScannerSettings;
use crate::products::Products;
use crate::record::{Advertisement, Capture};
use devices::Devices;
use ladder::{Ladder, Scan, Step};

mod bluez;
mod devices;
mod ladder;

/// Events of the scan handled at most per wake-up before the source looks at its other
/// inputs again (stop, the watcher, the ladder's deadline).
const EVENTS_PER_TURN: usize = 256;
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
    reload: Option<watch::Receiver<Products>>,
}

impl Filter {
    /// The capture of `adv` under the first product it matches, `None` if it matches none.
    fn capture(&mut self, adv: &Advertisement) -> Option<Capture> {
        if let Some(r) = &mut self.reload {
            if r.has_changed().unwrap_or(false) {
                self.products = r.borrow_and_update().clone();
            }
        }
        self.products.capture(adv)
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

    /// Sends on only the adverts that match one of `products` (and of each new set
    /// that `reload` delivers, when given), each with the capture that match built.
    pub fn with_filter(
        mut self,
        products: Products,
        reload: Option<watch::Receiver<Products>>,
    ) -> Ble {
        self.filter = Some(Filter { products, reload });
        self
    }
}

impl Source for Ble {
    async fn run(
        self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        let wanted = self.settings.adapter.clone();
        let (adapter_name, owner) =
            tokio::task::spawn_blocking(move || bluez::preflight(wanted.as_deref()))
                .await
                .map_err(|e| SourceError::Bluez(format!("preflight task failed: {e}")))??;
        let mut watcher = bluez::Watcher::new(adapter_name.clone());
        let mut manager = Some(
            connect()
                .await
                .map_err(|e| SourceError::Bluez(e.to_string()))?,
        );
        let session = open(manager.as_ref(), &adapter_name)
            .await
            .map_err(SourceError::Bluez)?;
        tracing::info!(adapter = %adapter_name, "scanning for BLE advertisements");
        // Read after the scan started: the ladder judges the scan by it.
        watcher.probe().await;
        self.health.started.notify_one();
        let mut scanner = Scanner {
            filter: self.filter,
            out,
            watcher,
            adapter_name,
            session: Some(session),
            devices: Devices::new(self.settings.max_devices),
            ladder: Ladder::new(
                self.settings.silence,
                self.settings.give_up,
                owner,
                Instant::now(),
            ),
            settings: self.settings,
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
    started: Instant,
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
        started: Instant::now(),
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

struct Scanner {
    settings: BleSettings,
    filter: Option<Filter>,
    out: mpsc::Sender<Heard>,
    watcher: bluez::Watcher,
    adapter_name: String,
    session: Option<Session>,
    devices: Devices,
    ladder: Ladder,
    stats: Stats,
    last_drop_log: Option<Instant>,
    /// The counts `status` shows, shared with the pipeline.
    health: Arc<SourceHealth>,
}

/// What woke the source.
enum Wake {
    /// An event of the scan; `None`: its stream ended.
    Event(Option<Event>),
    /// The watcher learned something of BlueZ or the adapter.
    Learned,
    /// The ladder's deadline.
    Due,
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

    /// The scan as the ladder sees it.
    fn scan(&self) -> Scan {
        match &self.session {
            None => Scan::Missing,
            Some(s) if s.events.is_none() => Scan::Ended,
            Some(s) => Scan::Since(s.started),
        }
    }

    async fn run(
        &mut self,
        manager: &mut Option<BluetoothSession>,
        stop: CancellationToken,
    ) -> Result<(), SourceError> {
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        // The ladder's one deadline, armed only when it asks for one.
        let deadline = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(deadline);
        let mut armed: Option<Instant> = None;
        let mut check = true;
        loop {
            if std::mem::take(&mut check) {
                // A D-Bus call to a hung BlueZ can take long: stopping does not wait.
                tokio::select! {
                    biased;
                    () = &mut stopped => return Ok(()),
                    checked = self.check(manager) => checked?,
                }
            }
            match self.ladder.next_check() {
                None => armed = None,
                // A later deadline than the one armed (the silence moved on with each
                // advert) waits for that one to fire: no timer is reset per advert.
                Some(at) => {
                    if armed.is_none_or(|a| at < a) {
                        deadline.as_mut().reset(at);
                        armed = Some(at);
                    }
                }
            }
            let wake = tokio::select! {
                biased;
                () = &mut stopped => return Ok(()),
                event = next_event(&mut self.session) => Wake::Event(event),
                () = self.watcher.changed() => Wake::Learned,
                () = &mut deadline, if armed.is_some() => Wake::Due,
            };
            match wake {
                Wake::Event(Some(event)) => {
                    let mut next = Some(event);
                    let mut handled = 0;
                    while let Some(event) = next.take() {
                        let more = tokio::select! {
                            biased;
                            () = &mut stopped => return Ok(()),
                            more = self.handle(event) => more,
                        };
                        if !more {
                            return Ok(());
                        }
                        handled += 1;
                        if handled < EVENTS_PER_TURN {
                            // Whatever is already queued, without waiting.
                            match next_event(&mut self.session).now_or_never() {
                                Some(Some(event)) => next = Some(event),
                                Some(None) => self.stream_ended(),
                                None => {}
                            }
                        }
                    }
                    // An advert may end a trouble (silence); an ended stream is one.
                    check = self.ladder.troubled() || self.scan() == Scan::Ended;
                }
                Wake::Event(None) => {
                    self.stream_ended();
                    check = true;
                }
                Wake::Learned => check = true,
                Wake::Due => {
                    armed = None;
                    check = true;
                }
            }
        }
    }

    /// BlueZ's event stream ended: the ladder sees it as trouble.
    fn stream_ended(&mut self) {
        if let Some(s) = &mut self.session {
            s.events = None;
        }
    }

    /// Handles one event; `false` once nobody reads the adverts any more.
    async fn handle(&mut self, event: Event) -> bool {
        let id = match event {
            Event::Known(info) => {
                let id = info.id.clone();
                self.remember(*info);
                if self.devices.get(&id).is_some_and(|d| !d.heard()) {
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
                    self.devices.forget(&id);
                    if !self.device(&id).await {
                        return true;
                    }
                    if self.devices.get(&id).is_some_and(|d| !d.heard()) {
                        return true;
                    }
                    id
                }
                DeviceEvent::ManufacturerData { manufacturer_data } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.set_manufacturer_data(manufacturer_data);
                    }
                    id
                }
                DeviceEvent::ServiceData { service_data } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.set_service_data(service_data);
                    }
                    id
                }
                DeviceEvent::Rssi { rssi } => {
                    if !self.device(&id).await {
                        return true;
                    }
                    if let Some(d) = self.devices.get_mut(&id) {
                        d.set_rssi(rssi);
                    }
                    id
                }
                _ => return true,
            },
            // The adapter's own changes (powered, discovering) reach the ladder through
            // the watcher alone: taken from this stream as well, one that arrives after
            // the watcher's news has been dealt with would start the ladder again.
            Event::Bluez(_) => return true,
        };
        let Some(d) = self.devices.get(&id) else {
            return true;
        };
        let advert = d.advert(now_ms());
        let now = Instant::now();
        self.ladder.heard(now);
        let capture = match &mut self.filter {
            Some(f) => match f.capture(&advert) {
                Some(capture) => Some(Box::new(capture)),
                None => {
                    self.stats.not_matching += 1;
                    return true;
                }
            },
            None => None,
        };
        match self.out.try_send(Heard { advert, capture }) {
            Ok(()) => self.stats.adverts += 1,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.dropped += 1;
                SourceHealth::count(&self.health.dropped);
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

    /// Remembers a device as BlueZ describes it; the one forgotten to make room is
    /// removed from BlueZ too.
    fn remember(&mut self, info: DeviceInfo) {
        if let Some(old) = self.devices.remember(info) {
            self.stats.forgotten += 1;
            SourceHealth::count(&self.health.forgotten);
            self.watcher.remove(&old.to_string());
        }
    }

    /// Takes the ladder's step for what the watcher knows, the scan and the silence;
    /// after a step (which reads BlueZ again), asks the ladder once more, so that a
    /// scanner already back is seen at once.
    async fn check(&mut self, manager: &mut Option<BluetoothSession>) -> Result<(), SourceError> {
        self.watcher.refresh().await;
        for _ in 0..2 {
            let now = Instant::now();
            let scan = self.scan();
            let step = self
                .ladder
                .poll(now, self.watcher.health(), scan, &self.adapter_name);
            match step {
                Step::Nothing => return Ok(()),
                Step::RestartScan { reason } => self.restart_scan(reason).await,
                Step::Back { reason, after } => {
                    tracing::info!(
                        reason = %reason,
                        after_secs = after.as_secs_f64(),
                        "scanning again"
                    );
                    return Ok(());
                }
                Step::Reacquire { reason, first } => {
                    self.reacquire(manager, now, &reason, first).await?;
                }
                Step::GiveUp(g) => {
                    tracing::error!(reason = %g.reason, give_up_secs = g.secs, "giving up on the BLE scanner");
                    return Err(SourceError::GaveUp {
                        reason: g.reason,
                        secs: g.secs,
                    });
                }
            }
        }
        Ok(())
    }

    /// Ladder step 1: restart the scan.
    async fn restart_scan(&mut self, reason: String) {
        tracing::warn!(reason = %reason, "BLE scanner in trouble: restarting the scan");
        self.stats.restarts += 1;
        SourceHealth::count(&self.health.restarts);
        self.health.trouble(&reason);
        if let Some(adapter) = self.adapter() {
            let _ = adapter.stop_scan().await;
            if let Err(e) = adapter.start_scan().await {
                tracing::debug!(error = %e, "restarting the scan failed");
            }
        }
        self.ladder.restarted(Instant::now());
        self.watcher.probe().await;
    }

    /// Ladder step 2: re-acquire the adapter on a BlueZ session, a new one when the
    /// step is `first` in this trouble or the last one no longer answers.
    async fn reacquire(
        &mut self,
        manager: &mut Option<BluetoothSession>,
        now: Instant,
        reason: &str,
        first: bool,
    ) -> Result<(), SourceError> {
        if first {
            tracing::warn!(reason = %reason, "restarting the scan did not help: re-acquiring the adapter (a new BlueZ connection)");
            self.stats.reacquires += 1;
            SourceHealth::count(&self.health.reacquires);
        } else if let Some(m) = manager.as_ref() {
            if m.get_adapters().await.is_err() {
                *manager = None;
            }
        }
        if first || manager.is_none() {
            if let Err(g) = self.ladder.connecting(now) {
                tracing::error!(reason = %g.reason, "giving up on the BLE scanner");
                return Err(SourceError::GaveUp {
                    reason: g.reason,
                    secs: g.secs,
                });
            }
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
                if self.ladder.reacquire_failed() {
                    tracing::warn!(reason = %reason, error = %e, "cannot re-acquire the adapter yet; retrying");
                } else {
                    tracing::debug!(error = %e, "cannot re-acquire the adapter yet");
                }
            }
        }
        self.watcher.probe().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
