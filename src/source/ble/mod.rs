/*!
The `ble` source: BLE advertisements heard on one adapter, which BlueZ owns and scans
with (discovery over D-Bus, `Transport: le`, kept alive by the liveness ladder), read
on one of two paths (`scanner.adverts`):

- **mgmt**, the side channel (`mgmt/`): every advertising report straight from the
  kernel's Bluetooth management socket, beside bluetoothd, each with its own RSSI and
  raw advertising data, parsed here. It needs `CAP_NET_ADMIN`; `auto` (the default)
  uses it when it can be opened and the kernel trusts it, and says once at INFO why not
  otherwise; `mgmt` insists (the source cannot work without it: exit 3).
- **dbus**: BlueZ's signals for the adapter's devices (`signals.rs`), on a connection
  the source reads itself: `InterfacesAdded` (a device object, new or made again after
  BlueZ forgot it: its data is in the signal), `PropertiesChanged` (one advert per
  signal, RSSI and data together), `InterfacesRemoved`. Each advert is completed from
  what this source remembers of the device (`devices.rs`); a device BlueZ knew before
  the scan is read once at the start (and counts as heard only with an RSSI), and one
  first met in a `PropertiesChanged` is read once from BlueZ.

Both paths give the same [`Advertisement`]s, stamped with the wall clock when read.
While adverts flow, the source reads its path at most every [`READ_EVERY`] and takes
everything queued then (up to [`EVENTS_PER_TURN`] reads a turn): a handful of adverts
per wake-up at dock rates instead of one, a delay of at most [`READ_EVERY`], which no
capture time or batch notices. With nothing to read it waits for the socket, and an idle
dock costs no wake-up.

Adverts that match no product are dropped here when a filter is given (the daemon gives
its products, and those of every SIGHUP reload), and the capture built by that match is
sent on with the advert, so that ingest does not match it again. A radio cannot be
back-pressured: when the channel is full the advert is dropped and counted (logged at
most every 10 s).

`scanner.scan = "passive"` (`passive.rs`) replaces discovery with an advertisement
monitor of the kernel, on the side channel.

A `bluez::Watcher` keeps the health of BlueZ and the adapter current beside the scan,
told by signals, and the liveness ladder (`ladder.rs`) turns what it knows, the adverts
heard and the state of the scan into steps: restart the scan, re-acquire the adapter,
give up ([`SourceError::GaveUp`]: the daemon exits 1 and systemd restarts it). This file
takes them, each logged once at WARN with the reason; the scanner being back is logged
once at INFO. Counts of restarts and re-acquisitions are logged when the source ends.

Nothing here ticks. The source wakes for its path (see above), for something the
watcher learned, or at the one deadline the ladder asks for (the end of the silence
allowed, the next step of a trouble): on a dock where all is well and nothing is heard,
it sleeps.
*/

use std::sync::Arc;
use std::time::Duration;

use bluez_async::{
    AdapterId, BluetoothError, BluetoothSession, DeviceId, DiscoveryFilter, Transport,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Heard, Source, SourceError, SourceHealth, SourceReport};
use crate::clock::now_ms;
use crate::config::{AdvertsPath, ScanMode, ScannerSettings};
use crate::products::Products;
use crate::record::{Advertisement, Capture, Mac};
use devices::{Device, Devices};
use ladder::{Ladder, Scan, Step};
use signals::{Change, Signals};

mod bluez;
mod devices;
mod ladder;
pub mod mgmt;
mod passive;
mod signals;

/// Reads of the path (D-Bus messages, management frames) at most per turn before the
/// source looks at its other inputs again (stop, the watcher, the ladder's deadline).
const EVENTS_PER_TURN: usize = 256;
/// While adverts flow, the path is read at most this often (see the module doc).
pub const READ_EVERY: Duration = Duration::from_millis(100);
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
    pub adverts: AdvertsPath,
    pub scan: ScanMode,
}

impl BleSettings {
    pub fn from_scanner(s: &ScannerSettings) -> BleSettings {
        BleSettings {
            adapter: s.adapter.clone(),
            silence: s.silence,
            give_up: s.give_up,
            max_devices: s.max_devices.max(1),
            adverts: s.adverts,
            scan: s.scan,
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

    /// The side channel for `adapter`, as `scanner.adverts` asks; `None`: D-Bus.
    async fn side_channel(&self, adapter: &str) -> Result<Option<Side>, SourceError> {
        if self.settings.adverts == AdvertsPath::Dbus {
            return Ok(None);
        }
        let origin = mgmt::Origin::from_env();
        match &origin {
            mgmt::Origin::Unix(path) => {
                tracing::warn!(path = %path.display(), "reading management frames from {} instead of the kernel", mgmt::SOCKET_ENV)
            }
            mgmt::Origin::Systemd(_) => {
                tracing::debug!("the kernel's management socket came from the unit's start step")
            }
            mgmt::Origin::Kernel => {}
        }
        let opened = match mgmt::index_of(adapter) {
            Ok(index) => {
                let reports = mgmt::Reports::new(index, self.settings.max_devices);
                mgmt::Channel::open(origin, reports)
                    .await
                    .map(|channel| Side {
                        channel,
                        index,
                        monitor: None,
                    })
            }
            Err(e) => Err(e),
        };
        match opened {
            Ok(side) => Ok(Some(side)),
            Err(why) if self.settings.adverts == AdvertsPath::Mgmt => {
                Err(SourceError::Mgmt(why.to_string()))
            }
            Err(why) => {
                tracing::info!(reason = %why, "reading adverts over D-Bus: the kernel's management socket cannot be used here");
                Ok(None)
            }
        }
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
        let mut side = self.side_channel(&adapter_name).await?;
        let patterns = match (&side, self.settings.scan) {
            (Some(_), ScanMode::Passive) => {
                let patterns = self
                    .filter
                    .as_ref()
                    .and_then(|f| passive::patterns(&f.products));
                if patterns.is_none() {
                    tracing::info!("scanning actively: passive scanning needs every product's company identifier");
                }
                patterns
            }
            (None, ScanMode::Passive) => {
                tracing::warn!("scanning actively: passive scanning needs the kernel's management socket (see above)");
                None
            }
            (_, ScanMode::Active) => None,
        };
        if let (Some(s), Some(_)) = (&mut side, &patterns) {
            s.monitor = Some(Monitor::Missing);
            if let Some(release) = passive::kernel_release() {
                if passive::duplicate_filter_kept(&release) {
                    tracing::warn!(kernel = %release, "this kernel may keep the controller's duplicate filter on in passive scans (fixed in 6.11, 6.10.5, 6.6.46, 6.1.105): a tape's changed data may go unheard until the scan restarts; use scanner.scan = \"active\" if captures stall");
                }
            }
        }
        let how = How {
            subscribe: side.is_none(),
            discovery: patterns.is_none(),
        };
        let watcher = bluez::Watcher::new(adapter_name.clone());
        let mut manager = Some(
            connect()
                .await
                .map_err(|e| SourceError::Bluez(e.to_string()))?,
        );
        let (session, known) = open(manager.as_ref(), &adapter_name, how)
            .await
            .map_err(SourceError::Bluez)?;
        let path = if side.is_some() { "mgmt" } else { "dbus" };
        self.health.set_adverts_path(path);
        let mut scanner = Scanner {
            filter: self.filter,
            out,
            watcher,
            adapter_name,
            session: Some(session),
            side,
            patterns,
            devices: Devices::new(self.settings.max_devices),
            ladder: Ladder::new(
                self.settings.silence,
                self.settings.give_up,
                owner,
                Instant::now(),
                how.discovery,
            ),
            settings: self.settings,
            stats: Stats::default(),
            last_drop_log: None,
            health: self.health,
            next_read: None,
        };
        if let Err(why) = scanner.start_monitor().await {
            // A kernel without advertisement monitors (before 5.10), or one that has no
            // room for another: discovery after all.
            scanner.fall_back_to_discovery(&why).await;
        }
        let scan = if scanner.patterns.is_some() {
            "passive"
        } else {
            "active"
        };
        tracing::info!(
            adapter = %scanner.adapter_name,
            adverts = %path,
            scan = %scan,
            "scanning for BLE advertisements"
        );
        // Read after the scan started: the ladder judges the scan by it.
        scanner.watcher.probe().await;
        scanner.health.started.notify_one();
        let mut result = Ok(());
        for info in known {
            if !scanner.known(info) {
                result = Err(());
                break;
            }
        }
        let result = match result {
            Ok(()) => scanner.run(&mut manager, stop).await,
            Err(()) => Ok(()),
        };
        scanner.stop_scan().await;
        let st = &scanner.stats;
        let side = scanner
            .side
            .as_ref()
            .map(|s| s.channel.counts())
            .unwrap_or_default();
        tracing::info!(
            adverts = st.adverts,
            reports = st.reports,
            not_matching = st.not_matching,
            dropped = st.dropped,
            restarts = st.restarts,
            reacquires = st.reacquires,
            forgotten = st.forgotten,
            malformed_frames = side.malformed,
            "BLE scan ended"
        );
        result.map(|()| SourceReport {
            adverts: st.adverts,
            malformed: side.malformed,
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

/// An adapter on a BlueZ session.
#[derive(Clone)]
struct Adapter {
    session: BluetoothSession,
    id: AdapterId,
}

impl Adapter {
    /// Powers the adapter on and starts LE discovery with `DuplicateData`, so that
    /// BlueZ signals every advert whose data changed, not only new devices. LE only:
    /// on a dual-mode controller without simultaneous discovery, `auto` would spend
    /// about half the time on classic inquiry, hearing no tape.
    async fn start_scan(&self) -> Result<(), BluetoothError> {
        let filter = DiscoveryFilter {
            duplicate_data: Some(true),
            transport: Some(Transport::Le),
            ..Default::default()
        };
        self.session
            .start_discovery_on_adapter_with_filter(&self.id, &filter)
            .await
    }

    async fn stop_scan(&self) -> Result<(), BluetoothError> {
        self.session.stop_discovery_on_adapter(&self.id).await
    }

    async fn power_on(&self) -> Result<(), BluetoothError> {
        self.session.set_powered(&self.id, true).await
    }
}

/// How a session scans.
#[derive(Debug, Clone, Copy)]
struct How {
    /// Adverts come from D-Bus signals (no side channel).
    subscribe: bool,
    /// Discovery runs (active); otherwise the adapter is only powered on (passive).
    discovery: bool,
}

/// One adapter with its advert signals (D-Bus path) and a running scan.
struct Session {
    adapter: Adapter,
    /// `Some` while subscribed; `None` after the connection was lost (D-Bus path).
    signals: Option<Signals>,
    how: How,
    started: Instant,
}

/// Finds `name` on `bluez`, subscribes to its devices' signals (D-Bus path), starts the
/// scan. Returns the devices BlueZ knew (D-Bus path), listed after subscribing: a device
/// found in between is seen twice rather than never.
async fn open(
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

/// The kernel's advertisement monitor of a passive scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Monitor {
    /// Not registered (never, or removed): the scan is in trouble.
    Missing,
    /// Asked for at this instant; the answer is awaited.
    Adding(Instant),
    Active(u16),
}

/// The side channel and what the source keeps on it.
struct Side {
    channel: mgmt::Channel,
    index: u16,
    /// `Some` in a passive scan.
    monitor: Option<Monitor>,
}

/// What the source did, logged when it ends.
#[derive(Debug, Default)]
struct Stats {
    /// Adverts sent on.
    adverts: u64,
    /// Reports heard (before the products filter).
    reports: u64,
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
    side: Option<Side>,
    /// The passive scan's monitor patterns; `None`: discovery.
    patterns: Option<Vec<mgmt::wire::Pattern>>,
    devices: Devices,
    ladder: Ladder,
    stats: Stats,
    last_drop_log: Option<Instant>,
    /// The counts `status` shows, shared with the pipeline.
    health: Arc<SourceHealth>,
    /// While adverts flow: when the path is read next.
    next_read: Option<Instant>,
}

/// What woke the source.
enum Wake {
    /// The path has something to read (or it is time to read it); `Err`: it failed.
    Path(std::io::Result<()>),
    /// The watcher learned something of BlueZ or the adapter.
    Learned,
    /// The ladder's deadline.
    Due,
}

/// Resolves when the path should be read: at `next_read` while adverts flow (the path
/// parked meanwhile), else when its socket is readable. Pends forever without a path.
async fn path_ready(
    side: &mut Option<Side>,
    session: &mut Option<Session>,
    next_read: Option<Instant>,
) -> std::io::Result<()> {
    if let Some(at) = next_read {
        tokio::time::sleep_until(at).await;
        return Ok(());
    }
    if let Some(s) = side {
        return s.channel.readable().await;
    }
    match session.as_mut().and_then(|s| s.signals.as_mut()) {
        Some(signals) => signals.readable().await,
        None => std::future::pending().await,
    }
}

impl Scanner {
    /// The adapter being scanned (cloned: a session holds a connection that is not
    /// `Sync`).
    fn adapter(&self) -> Option<Adapter> {
        self.session.as_ref().map(|s| s.adapter.clone())
    }

    /// The scan as the ladder sees it.
    fn scan(&self) -> Scan {
        let Some(s) = &self.session else {
            return Scan::Missing;
        };
        if s.how.subscribe && s.signals.is_none() {
            return Scan::Ended;
        }
        match self.side.as_ref().and_then(|side| side.monitor) {
            Some(Monitor::Missing) => Scan::MonitorGone,
            Some(Monitor::Adding(at)) => Scan::Since(at.max(s.started)),
            _ => Scan::Since(s.started),
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
                ready = path_ready(&mut self.side, &mut self.session, self.next_read) => Wake::Path(ready),
                () = self.watcher.changed() => Wake::Learned,
                () = &mut deadline, if armed.is_some() => Wake::Due,
            };
            match wake {
                Wake::Path(ready) => {
                    let read = match ready {
                        Ok(()) => {
                            tokio::select! {
                                biased;
                                () = &mut stopped => return Ok(()),
                                read = self.read_path() => read,
                            }
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    match read {
                        Ok(Read::Closed) => return Ok(()),
                        Ok(Read::Got { any, more }) => {
                            let now = Instant::now();
                            self.next_read = if more {
                                Some(now)
                            } else {
                                any.then_some(now + READ_EVERY)
                            };
                            if self.next_read.is_some() {
                                self.park_path();
                            }
                        }
                        Err(why) => {
                            self.next_read = None;
                            self.path_lost(&why).await;
                        }
                    }
                    // An advert may end a trouble (silence); a lost path or monitor
                    // is one.
                    check = self.ladder.troubled() || !matches!(self.scan(), Scan::Since(_));
                }
                Wake::Learned => check = true,
                Wake::Due => {
                    armed = None;
                    check = true;
                }
            }
        }
    }

    /// Stops the path's socket from waking the source until it waits for it again.
    fn park_path(&mut self) {
        if let Some(side) = &mut self.side {
            side.channel.park();
        } else if let Some(signals) = self.session.as_mut().and_then(|s| s.signals.as_mut()) {
            signals.park();
        }
    }

    /// Reads the path once (up to [`EVENTS_PER_TURN`] reads) and handles what came.
    async fn read_path(&mut self) -> Result<Read, String> {
        if self.side.is_some() {
            return self.read_side();
        }
        let Some(signals) = self.session.as_mut().and_then(|s| s.signals.as_mut()) else {
            return Ok(Read::Got {
                any: false,
                more: false,
            });
        };
        let mut changes = Vec::new();
        let drained = signals
            .drain(EVENTS_PER_TURN, |c| changes.push(c))
            .map_err(|_| "the D-Bus connection of the advert signals was lost".to_string());
        let drained = match drained {
            Ok(d) => d,
            Err(e) => {
                if let Some(s) = &mut self.session {
                    s.signals = None;
                }
                return Err(e);
            }
        };
        let now = Instant::now();
        let mut heard = false;
        for change in changes {
            match self.change(change).await {
                Some(true) => heard = true,
                Some(false) => {}
                None => return Ok(Read::Closed),
            }
        }
        if heard {
            self.ladder.heard(now);
        }
        Ok(Read::Got {
            any: drained.messages > 0,
            more: drained.more,
        })
    }

    /// Reads the side channel once and handles what came.
    fn read_side(&mut self) -> Result<Read, String> {
        let Some(side) = &mut self.side else {
            unreachable!("read_side without a side channel")
        };
        let mut adverts = Vec::new();
        let mut controls = Vec::new();
        let drained = side
            .channel
            .drain(
                EVENTS_PER_TURN,
                now_ms,
                |a| adverts.push(a),
                |c| controls.push(c),
            )
            .map_err(|e| format!("reading the kernel's management socket failed: {e}"))?;
        if drained.closed {
            return Err("the kernel's management socket closed".into());
        }
        for c in controls {
            self.control(c);
        }
        let now = Instant::now();
        if !adverts.is_empty() {
            self.ladder.heard(now);
        }
        for advert in adverts {
            if !self.emit(advert, now) {
                return Ok(Read::Closed);
            }
        }
        Ok(Read::Got {
            any: drained.reads > 0,
            more: drained.more,
        })
    }

    /// Acts on what the side channel says beside adverts.
    fn control(&mut self, c: mgmt::Control) {
        let Some(side) = &mut self.side else { return };
        let Some(monitor) = &mut side.monitor else {
            return;
        };
        match c {
            mgmt::Control::CommandDone {
                opcode: mgmt::wire::OP_ADD_ADV_PATTERNS_MONITOR,
                status,
                params,
            } => {
                *monitor = match (status, params.as_slice()) {
                    (mgmt::wire::STATUS_SUCCESS, [a, b, ..]) => {
                        Monitor::Active(u16::from_le_bytes([*a, *b]))
                    }
                    _ => {
                        tracing::warn!(status, "the kernel refused the advertisement monitor");
                        Monitor::Missing
                    }
                };
            }
            mgmt::Control::MonitorRemoved(h) if *monitor == Monitor::Active(h) => {
                *monitor = Monitor::Missing;
            }
            mgmt::Control::AdapterGone => *monitor = Monitor::Missing,
            _ => {}
        }
    }

    /// Adds the passive scan's monitor when the scan starts, waiting for the kernel's
    /// answer (reports before it are dropped: the scan has not started).
    async fn start_monitor(&mut self) -> Result<(), String> {
        let (Some(side), Some(patterns)) = (&mut self.side, &self.patterns) else {
            return Ok(());
        };
        let params = mgmt::wire::monitor_patterns(patterns)
            .ok_or("the products' patterns do not fit an advertisement monitor")?;
        let (status, ret) = side
            .channel
            .call(
                mgmt::wire::OP_ADD_ADV_PATTERNS_MONITOR,
                side.index,
                &params,
                Duration::from_secs(5),
            )
            .await
            .map_err(|e| format!("adding the advertisement monitor failed: {e}"))?;
        match (status, ret.as_slice()) {
            (mgmt::wire::STATUS_SUCCESS, [a, b, ..]) => {
                side.monitor = Some(Monitor::Active(u16::from_le_bytes([*a, *b])));
                Ok(())
            }
            _ => Err(format!(
                "the kernel refused the advertisement monitor (status 0x{status:02x})"
            )),
        }
    }

    /// Adds the passive scan's monitor, if this scan has one and it is missing; `false`
    /// when it could not even be asked for.
    fn add_monitor(&mut self) -> bool {
        let (Some(side), Some(patterns)) = (&mut self.side, &self.patterns) else {
            return true;
        };
        if side.monitor != Some(Monitor::Missing) {
            return true;
        }
        let sent = mgmt::wire::monitor_patterns(patterns)
            .ok_or_else(|| "the products' patterns do not fit a monitor".to_string())
            .and_then(|params| {
                side.channel
                    .send(mgmt::wire::OP_ADD_ADV_PATTERNS_MONITOR, side.index, &params)
                    .map_err(|e| e.to_string())
            });
        match sent {
            Ok(()) => {
                side.monitor = Some(Monitor::Adding(Instant::now()));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot add the advertisement monitor");
                false
            }
        }
    }

    /// Removes the passive scan's monitor (without waiting for the answer).
    fn remove_monitor(&mut self) {
        if let Some(side) = &mut self.side {
            if let Some(Monitor::Active(h)) = side.monitor {
                let _ = side.channel.send(
                    mgmt::wire::OP_REMOVE_ADV_MONITOR,
                    side.index,
                    &h.to_le_bytes(),
                );
                side.monitor = Some(Monitor::Missing);
            }
        }
    }

    /// Scans with discovery from now on (passive scanning could not be had).
    async fn fall_back_to_discovery(&mut self, why: &str) {
        tracing::warn!(
            reason = why,
            "scanning actively (discovery) instead of passively"
        );
        self.patterns = None;
        if let Some(side) = &mut self.side {
            side.monitor = None;
        }
        self.ladder.set_discovery(true);
        if let Some(s) = &mut self.session {
            s.how.discovery = true;
            if let Err(e) = s.adapter.start_scan().await {
                tracing::debug!(error = %e, "starting discovery failed");
            }
        }
    }

    /// The path failed: the side channel gives way to D-Bus; lost D-Bus signals are
    /// the ladder's trouble ("BlueZ's event stream ended").
    async fn path_lost(&mut self, why: &str) {
        if self.side.take().is_none() {
            tracing::debug!(reason = why, "the advert signals were lost");
            return;
        }
        tracing::warn!(
            reason = why,
            "the side channel failed: reading adverts over D-Bus from now on"
        );
        self.health.set_adverts_path("dbus");
        if self.patterns.is_some() {
            self.fall_back_to_discovery("the side channel failed").await;
        }
        if let Some(s) = &mut self.session {
            s.how.subscribe = true;
            s.signals = Signals::connect(&self.adapter_name)
                .await
                .inspect_err(
                    |e| tracing::debug!(error = %e, "cannot subscribe to the advert signals"),
                )
                .ok();
        }
    }

    /// Handles a device BlueZ knew when the scan started; `false` once nobody reads
    /// the adverts any more.
    fn known(&mut self, info: bluez_async::DeviceInfo) -> bool {
        let device = Device::from_info(info);
        let (mac, heard) = (device.mac(), device.heard());
        self.remember(device);
        if !heard {
            return true;
        }
        let now = Instant::now();
        self.ladder.heard(now);
        self.send_device(mac, now)
    }

    /// Handles one change of a device; `Some(heard)`, or `None` once nobody reads the
    /// adverts any more.
    async fn change(&mut self, change: Change) -> Option<bool> {
        let now = Instant::now();
        let mac = match change {
            Change::Removed { mac } => {
                // BlueZ forgot it (30 s unseen): its next advert is a new object.
                self.devices.forget(&mac);
                return Some(false);
            }
            Change::Added { mac, props } => {
                // Its properties are all in the signal: nothing to read from BlueZ.
                let heard = props.rssi.is_some();
                self.remember(Device::from_props(mac, props));
                if !heard {
                    return Some(false);
                }
                mac
            }
            Change::Changed { mac, props } => {
                let advert = props.is_advert();
                if !self.device(&mac).await {
                    return Some(false);
                }
                if let Some(d) = self.devices.get_mut(&mac) {
                    d.apply(props);
                }
                if !advert {
                    return Some(false);
                }
                mac
            }
        };
        self.send_device(mac, now).then_some(true)
    }

    /// Sends on the advert of a remembered device; `false` once nobody reads them.
    fn send_device(&mut self, mac: Mac, now: Instant) -> bool {
        match self.devices.get(&mac) {
            Some(d) => {
                let advert = d.advert(now_ms());
                self.emit(advert, now)
            }
            None => true,
        }
    }

    /// Sends on one advert heard at `now` if it matches a product; `false` once nobody
    /// reads the adverts any more.
    fn emit(&mut self, advert: Advertisement, now: Instant) -> bool {
        self.stats.reports += 1;
        SourceHealth::count(&self.health.reports);
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

    /// Makes sure `mac` is remembered (reading its properties from BlueZ if not);
    /// `false` if it cannot be.
    async fn device(&mut self, mac: &Mac) -> bool {
        if self.devices.get(mac).is_some() {
            return true;
        }
        let Some(adapter) = self.adapter() else {
            return false;
        };
        let id = device_id(&self.adapter_name, mac);
        let Ok(id) = id.parse::<DeviceId>() else {
            return false;
        };
        match adapter.session.get_device_info(&id).await {
            Ok(info) => {
                self.remember(Device::from_info(info));
                true
            }
            Err(e) => {
                tracing::debug!(device = %id, error = %e, "cannot read a device's properties");
                false
            }
        }
    }

    /// Remembers a device; the one forgotten to make room is removed from BlueZ too.
    fn remember(&mut self, device: Device) {
        if let Some(old) = self.devices.remember(device) {
            self.stats.forgotten += 1;
            SourceHealth::count(&self.health.forgotten);
            self.watcher.remove(&device_id(&self.adapter_name, &old));
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

    /// Ladder step 1: restart the scan (discovery, or the passive scan's monitor).
    async fn restart_scan(&mut self, reason: String) {
        tracing::warn!(reason = %reason, "BLE scanner in trouble: restarting the scan");
        self.stats.restarts += 1;
        SourceHealth::count(&self.health.restarts);
        self.health.trouble(&reason);
        if let Some(adapter) = self.adapter() {
            if self.patterns.is_some() {
                if let Err(e) = adapter.power_on().await {
                    tracing::debug!(error = %e, "powering the adapter on failed");
                }
                self.remove_monitor();
                self.add_monitor();
            } else {
                let _ = adapter.stop_scan().await;
                if let Err(e) = adapter.start_scan().await {
                    tracing::debug!(error = %e, "restarting the scan failed");
                }
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
        let how = match self.session.take() {
            Some(old) => {
                if old.how.discovery {
                    let _ = old.adapter.stop_scan().await;
                }
                old.how
            }
            None => How {
                subscribe: self.side.is_none(),
                discovery: self.patterns.is_none(),
            },
        };
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
            if let Some(side) = &mut self.side {
                match mgmt::index_of(&self.adapter_name) {
                    Ok(i) => {
                        side.index = i;
                        side.channel.reports_mut().set_index(i);
                        if side.monitor.is_some() {
                            side.monitor = Some(Monitor::Missing);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the side channel cannot follow the new adapter")
                    }
                }
            }
        }
        match open(manager.as_ref(), &self.adapter_name, how).await {
            Ok((s, known)) => {
                self.devices.clear();
                self.session = Some(s);
                self.add_monitor();
                for info in known {
                    if !self.known(info) {
                        break;
                    }
                }
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

    /// Stops the scan when the source ends: discovery, or the passive scan's monitor
    /// (which the kernel would otherwise keep scanning with).
    async fn stop_scan(&mut self) {
        self.remove_monitor();
        if let Some(s) = &self.session {
            if s.how.discovery {
                let _ = tokio::time::timeout(STOP_SCAN_WAIT, s.adapter.stop_scan()).await;
            }
        }
    }
}

/// What reading the path gave.
enum Read {
    Got {
        /// Something was read.
        any: bool,
        /// More is queued (the turn's budget ran out).
        more: bool,
    },
    /// Nobody reads the adverts any more.
    Closed,
}

/// BlueZ's name of a device of `adapter` (`hci0/dev_AA_BB_CC_DD_EE_FF`).
fn device_id(adapter: &str, mac: &Mac) -> String {
    format!("{adapter}/dev_{}", mac.to_string().replace(':', "_"))
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
    fn where_adverts_are_read_and_how_the_radio_scans_are_validated_naming_key_and_value() {
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
        let e =
            crate::config::from_toml("[scanner]\nadverts = \"hci\"\nscan = \"quiet\"\n", path, [])
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
}
