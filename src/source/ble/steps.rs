//! The liveness ladder's steps as the running scan takes them: restart the scan,
//! re-acquire the adapter (a new BlueZ connection), give up; a passive scan's monitor
//! added and removed; the fall back from the side channel to D-Bus and from a passive
//! scan to discovery; the scan stopped when the source ends. Touches the scanner's
//! session, side channel and ladder.

use bluez_async::BluetoothSession;
use tokio::time::Instant;

use super::bluez;
use super::ladder::Step;
use super::mgmt;
use super::mgmt::Meanwhile;
use super::scanner::Scanner;
use super::session::{connect, open, How};
use super::settings::STOP_SCAN_WAIT;
use super::side::{Monitor, Refused};
use super::signals::Signals;
use crate::source::{SourceError, SourceHealth};

impl Scanner {
    /// Takes the ladder's step for what the watcher knows, the scan and the silence;
    /// after a step (which reads BlueZ again), asks the ladder once more, so that a
    /// scanner already back is seen at once.
    pub(super) async fn check(
        &mut self,
        manager: &mut Option<BluetoothSession>,
    ) -> Result<(), SourceError> {
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
        self.health.trouble(&reason, self.clock.wall_ms());
        if let Some(adapter) = self.adapter() {
            if self.patterns.is_some() {
                if let Err(e) = adapter.power_on().await {
                    tracing::debug!(error = %e, "powering the adapter on failed");
                }
                if let Err(e) = self.register_monitor().await {
                    tracing::warn!(error = %e, "the advertisement monitor could not be registered again");
                }
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
        self.reconnect(manager, now, reason, first).await?;
        // A controller that stopped reporting, or a kernel that answers Busy to every
        // monitor, needs the adapter powered off and on (as Home Assistant's recovery
        // does): once per trouble, and again while the kernel answers Busy.
        if first || self.side.as_ref().is_some_and(|s| s.busy) {
            self.power_cycle().await;
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
        self.follow_adapter().await;
        match open(manager.as_ref(), &self.adapter_name, how).await {
            Ok((s, known)) => {
                self.devices.clear();
                self.session = Some(s);
                if self.side.as_ref().and_then(|s| s.monitor) == Some(Monitor::Missing) {
                    if let Err(e) = self.register_monitor().await {
                        tracing::debug!(error = %e, "the advertisement monitor could not be registered yet");
                    }
                }
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

    /// Counts a first re-acquisition, and makes a new BlueZ connection when this one is
    /// the first of the trouble or the last one no longer answers; gives up when the
    /// ladder says so.
    async fn reconnect(
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
        Ok(())
    }

    /// Follows the adapter named (or a new bluetoothd's first one), moving the watcher and
    /// the side channel to it.
    async fn follow_adapter(&mut self) {
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
    }

    /// Stops the scan when the source ends: discovery, or the passive scan's monitor
    /// (which the kernel would otherwise keep scanning with).
    pub(super) async fn stop_scan(&mut self) {
        if let Some(side) = &mut self.side {
            let clock = self.clock.clone();
            let now = move || clock.wall_ms();
            let mut meanwhile = Meanwhile::default();
            let removed = side.unregister(&now, &mut meanwhile);
            let _ = tokio::time::timeout(STOP_SCAN_WAIT, removed).await;
        }
        if let Some(s) = &self.session {
            if s.how.discovery {
                let _ = tokio::time::timeout(STOP_SCAN_WAIT, s.adapter.stop_scan()).await;
            }
        }
    }

    /// Scans with discovery from now on (passive scanning could not be had).
    pub(super) async fn fall_back_to_discovery(&mut self, why: &str) {
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
    pub(super) async fn path_lost(&mut self, why: &str) {
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

    /// Registers the passive scan's monitor when the scan starts; a kernel that answers
    /// Busy to every try gets the adapter power-cycled, and one more try.
    pub(super) async fn start_monitor(&mut self) -> Result<(), String> {
        match self.register_monitor().await {
            Err(Refused::Busy) => {
                tracing::warn!("the kernel answers Busy to the advertisement monitor");
                self.power_cycle().await;
                self.register_monitor().await.map_err(|e| e.to_string())
            }
            r => r.map_err(|e| e.to_string()),
        }
    }

    /// Registers the passive scan's monitor, if this scan has one (see
    /// [`Side::register`](super::side::Side::register)), and handles what the socket
    /// brought meanwhile.
    pub(super) async fn register_monitor(&mut self) -> Result<(), Refused> {
        let (Some(side), Some(patterns)) = (&mut self.side, &self.patterns) else {
            return Ok(());
        };
        let clock = self.clock.clone();
        let now = move || clock.wall_ms();
        let mut meanwhile = Meanwhile::default();
        let registered = side.register(patterns, &now, &mut meanwhile).await;
        self.meanwhile(meanwhile);
        let handle = registered?;
        tracing::debug!(handle, "advertisement monitor registered");
        Ok(())
    }

    /// Powers the adapter off and on: through the management socket when there is
    /// one, else through BlueZ (its `Powered` property).
    pub(super) async fn power_cycle(&mut self) {
        tracing::warn!(adapter = %self.adapter_name, "power-cycling the adapter (off, then on)");
        let cycled = if let Some(side) = &mut self.side {
            let clock = self.clock.clone();
            let now = move || clock.wall_ms();
            let mut meanwhile = Meanwhile::default();
            let cycled = side.power_cycle(&now, &mut meanwhile).await;
            self.meanwhile(meanwhile);
            cycled
        } else if let Some(adapter) = self.adapter() {
            let off = adapter.power_off().await.map_err(|e| e.to_string());
            let on = adapter.power_on().await.map_err(|e| e.to_string());
            off.and(on)
        } else {
            Ok(())
        };
        if let Err(e) = cycled {
            tracing::warn!(error = %e, "power-cycling the adapter failed");
        }
    }

    /// Handles what the side channel brought while the source waited for an answer.
    fn meanwhile(&mut self, m: Meanwhile) {
        if let Some(side) = &mut self.side {
            for c in &m.controls {
                side.control(c);
            }
        }
        let now = Instant::now();
        if !m.adverts.is_empty() {
            self.ladder.heard(now);
        }
        for advert in m.adverts {
            if !self.emit(advert, now) {
                break;
            }
        }
    }
}
