//! The running scan: the one loop that waits for the path (the side channel or the
//! D-Bus signals), the watcher and the ladder's deadline, and reads what came. What an
//! advert does is `adverts.rs`; the ladder's steps are `steps.rs`. Touches the source's
//! own rooms, the channel out and the shared health.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bluez_async::BluetoothSession;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::bluez;
use super::devices::Devices;
use super::ladder::{Ladder, Scan};
use super::mgmt;
use super::session::{Adapter, Session};
use super::settings::{BleSettings, Filter, EVENTS_PER_TURN, READ_EVERY};
use super::side::{Monitor, Side};
use crate::clock::SharedClock;
use crate::source::{Heard, SourceError, SourceHealth};

/// What the source did, logged when it ends.
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Adverts sent on.
    pub(super) adverts: u64,
    /// Reports heard (before the products filter).
    pub(super) reports: u64,
    pub(super) not_matching: u64,
    pub(super) dropped: u64,
    pub(super) dropped_logged: u64,
    pub(super) restarts: u64,
    pub(super) reacquires: u64,
    pub(super) forgotten: u64,
}

pub(super) struct Scanner {
    pub(super) settings: BleSettings,
    pub(super) filter: Option<Filter>,
    pub(super) out: mpsc::Sender<Heard>,
    pub(super) watcher: bluez::Watcher,
    pub(super) adapter_name: String,
    pub(super) session: Option<Session>,
    pub(super) side: Option<Side>,
    /// The passive scan's monitor patterns; `None`: discovery.
    pub(super) patterns: Option<Vec<mgmt::wire::Pattern>>,
    pub(super) devices: Devices,
    pub(super) ladder: Ladder,
    pub(super) stats: Stats,
    pub(super) last_drop_log: Option<Instant>,
    /// The counts `status` shows, shared with the pipeline.
    pub(super) health: Arc<SourceHealth>,
    /// Stamps each advert heard.
    pub(super) clock: SharedClock,
    /// While adverts flow: when the path is read next.
    pub(super) next_read: Option<Instant>,
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

impl Scanner {
    /// The adapter being scanned (cloned: a session holds a connection that is not
    /// `Sync`).
    pub(super) fn adapter(&self) -> Option<Adapter> {
        self.session.as_ref().map(|s| s.adapter.clone())
    }

    /// The scan as the ladder sees it.
    pub(super) fn scan(&self) -> Scan {
        let Some(s) = &self.session else {
            return Scan::Missing;
        };
        if s.how.subscribe && s.signals.is_none() {
            return Scan::Ended;
        }
        match self.side.as_ref().and_then(|side| side.monitor) {
            Some(Monitor::Missing) => Scan::MonitorGone,
            _ => Scan::Since(s.started),
        }
    }

    pub(super) async fn run(
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
            arm(self.ladder.next_check(), deadline.as_mut(), &mut armed);
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
                    if !self.after_read(read).await {
                        return Ok(());
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

    /// Schedules the next read after one, or hands a failed path over; `false` once
    /// nobody reads the adverts any more.
    async fn after_read(&mut self, read: Result<Read, String>) -> bool {
        match read {
            Ok(Read::Closed) => return false,
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
        true
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
        let clock = self.clock.clone();
        let Some(side) = &mut self.side else {
            unreachable!("read_side without a side channel")
        };
        let mut adverts = Vec::new();
        let mut controls = Vec::new();
        let drained = side
            .channel
            .drain(
                EVENTS_PER_TURN,
                || clock.wall_ms(),
                |a| adverts.push(a),
                |c| controls.push(c),
            )
            .map_err(|e| format!("reading the kernel's management socket failed: {e}"))?;
        if drained.closed {
            return Err("the kernel's management socket closed".into());
        }
        if let Some(side) = &mut self.side {
            for c in &controls {
                side.control(c);
            }
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
}

/// Arms the ladder's one deadline for `next`. A later deadline than the one armed (the
/// silence moved on with each advert) waits for that one to fire: no timer is reset per
/// advert.
fn arm(next: Option<Instant>, deadline: Pin<&mut Sleep>, armed: &mut Option<Instant>) {
    match next {
        None => *armed = None,
        Some(at) => {
            if armed.is_none_or(|a| at < a) {
                deadline.reset(at);
                *armed = Some(at);
            }
        }
    }
}
