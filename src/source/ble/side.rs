//! The side channel as the scan keeps it: the kernel's management socket for one
//! adapter, the advertisement monitor a passive scan registers on it, and the adapter's
//! power cycle through it. Touches the management socket, and the record of the monitor
//! in the state directory.
//!
//! What the kernel does with monitors, which this follows (net/bluetooth/mgmt.c, seen on
//! Debian's 6.1 in the VM tests):
//! - a monitor belongs to the adapter, not to the socket that added it: one left by a
//!   process killed before it removed it scans on, and after 32 of them Add answers No
//!   Resources. So the handle of the monitor registered is recorded (with the boot and
//!   the adapter), and the next start removes the one recorded if the kernel still
//!   holds it;
//! - Add and Remove are answered Busy while another of them is pending: a Remove is
//!   waited for before the Add that replaces it, and Busy is asked again, not taken for
//!   a refusal;
//! - "Advertisement Monitor Removed" with handle 0 means every monitor (bluetoothd
//!   removes them all so when an adapter appears);
//! - an Add on a powered-off adapter (bluetoothd powers it off when it stops) is
//!   answered Failed and leaves the command pending: every monitor command after it is
//!   answered Busy, bluetoothd's own too, until the adapter is powered off and on
//!   again. So no Add goes to an adapter that is off, and a kernel that answers Busy
//!   gets [`Side::power_cycle`], the step the liveness ladder takes before re-acquiring
//!   the adapter.

use std::path::PathBuf;
use std::time::Duration;

use super::mgmt::wire::{self, Pattern};
use super::mgmt::{self, Meanwhile};
use crate::record::EpochMillis;

/// How long a command waits for the kernel's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(5);
/// Powering on runs the controller's whole initialisation.
const POWER_WAIT: Duration = Duration::from_secs(10);
/// An Add answered Busy is asked again this often, at most [`BUSY_TRIES`] times.
const BUSY_WAIT: Duration = Duration::from_millis(200);
const BUSY_TRIES: u32 = 10;

/// The kernel's advertisement monitor of a passive scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Monitor {
    /// Not registered (never, or removed): the scan is in trouble.
    Missing,
    Active(u16),
}

/// Why the monitor is not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refused {
    #[error("the kernel answered Busy to every try")]
    Busy,
    #[error("the adapter is powered off")]
    NotPowered,
    #[error("the kernel refused the advertisement monitor (status 0x{0:02x})")]
    Status(u8),
    #[error("{0}")]
    Socket(String),
}

/// The side channel and what the source keeps on it.
pub(super) struct Side {
    pub(super) channel: mgmt::Channel,
    pub(super) index: u16,
    /// `Some` in a passive scan.
    pub(super) monitor: Option<Monitor>,
    /// Where the handle of the monitor registered is kept (the daemon's state
    /// directory); `None`: nowhere.
    pub(super) record: Option<PathBuf>,
    /// The last registration ended Busy (the kernel may need a power cycle).
    pub(super) busy: bool,
    /// The record was read (at the first registration: later, a handle the kernel
    /// holds may be another's, given out again).
    pub(super) record_read: bool,
    /// Our monitor's handle when a "remove all" (handle 0) said it was gone: the kernel
    /// may send that event for a removal that came before our Add (bluetoothd's reset
    /// racing our registration, seen on a re-plugged controller), so the next
    /// registration removes this handle first rather than leave two monitors.
    pub(super) maybe_left: Option<u16>,
}

impl Side {
    /// Acts on what the side channel says beside adverts.
    pub(super) fn control(&mut self, c: &mgmt::Control) {
        let Some(monitor) = &mut self.monitor else {
            return;
        };
        match c {
            mgmt::Control::MonitorRemoved(h) => {
                if let Monitor::Active(ours) = *monitor {
                    if *h == ours || *h == 0 {
                        *monitor = Monitor::Missing;
                        self.maybe_left = (*h == 0).then_some(ours);
                    }
                }
            }
            mgmt::Control::AdapterGone => {
                *monitor = Monitor::Missing;
                self.maybe_left = None;
            }
            mgmt::Control::CommandDone { .. } => {}
        }
    }

    /// Sends a command to the adapter and waits for its answer.
    async fn call(
        &mut self,
        opcode: u16,
        params: &[u8],
        wait: Duration,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) -> Result<(u8, Vec<u8>), Refused> {
        let index = self.index;
        self.channel
            .call(opcode, index, params, wait, now, meanwhile)
            .await
            .map_err(|e| Refused::Socket(e.to_string()))
    }

    /// Registers the passive scan's monitor for `patterns`: the one registered before
    /// (by this process, or recorded by one that could not remove it) is removed
    /// first, its answer awaited; Busy is asked again. What the socket brings
    /// meanwhile is left in `meanwhile`.
    pub(super) async fn register(
        &mut self,
        patterns: &[Pattern],
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) -> Result<u16, Refused> {
        let params = wire::monitor_patterns(patterns).ok_or_else(|| {
            Refused::Socket("the products' patterns do not fit an advertisement monitor".into())
        })?;
        let old = match (self.monitor, self.maybe_left.take()) {
            (Some(Monitor::Active(h)), _) | (_, Some(h)) => Some(h),
            _ => self.recorded_stale(now, meanwhile).await,
        };
        if let Some(h) = old {
            self.remove(h, now, meanwhile).await;
        }
        self.monitor = Some(Monitor::Missing);
        self.busy = false;
        // An Add on a powered-off adapter is answered Failed and leaves the kernel
        // answering Busy to every monitor command after it (Debian's 6.1, when
        // bluetoothd stops): it waits until the adapter is on.
        let (status, info) = self
            .call(wire::OP_READ_INFO, &[], ANSWER_WAIT, now, meanwhile)
            .await?;
        if status == wire::STATUS_SUCCESS
            && wire::current_settings(&info).is_some_and(|s| s & wire::SETTING_POWERED == 0)
        {
            return Err(Refused::NotPowered);
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let (status, ret) = self
                .call(
                    wire::OP_ADD_ADV_PATTERNS_MONITOR,
                    &params,
                    ANSWER_WAIT,
                    now,
                    meanwhile,
                )
                .await?;
            match (status, ret.as_slice()) {
                (wire::STATUS_SUCCESS, [a, b, ..]) => {
                    let handle = u16::from_le_bytes([*a, *b]);
                    self.monitor = Some(Monitor::Active(handle));
                    self.write_record(handle);
                    return Ok(handle);
                }
                (wire::STATUS_BUSY, _) if tries < BUSY_TRIES => {
                    tokio::time::sleep(BUSY_WAIT).await;
                }
                (wire::STATUS_BUSY, _) => {
                    self.busy = true;
                    return Err(Refused::Busy);
                }
                _ => return Err(Refused::Status(status)),
            }
        }
    }

    /// Removes the passive scan's monitor, waiting (briefly) for the answer: the
    /// kernel would otherwise scan on for nobody.
    pub(super) async fn unregister(
        &mut self,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) {
        if let Some(Monitor::Active(h)) = self.monitor {
            self.remove(h, now, meanwhile).await;
            self.monitor = Some(Monitor::Missing);
        }
    }

    /// Removes monitor `h` and forgets the record of it.
    async fn remove(
        &mut self,
        h: u16,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) {
        for _ in 0..BUSY_TRIES {
            match self
                .call(
                    wire::OP_REMOVE_ADV_MONITOR,
                    &h.to_le_bytes(),
                    ANSWER_WAIT,
                    now,
                    meanwhile,
                )
                .await
            {
                Ok((wire::STATUS_BUSY, _)) => tokio::time::sleep(BUSY_WAIT).await,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(error = %e, handle = h, "removing the advertisement monitor failed");
                    break;
                }
            }
        }
        if let Some(path) = &self.record {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Powers the adapter off and on again through the management socket (Set
    /// Powered), each answer awaited: the kernel drops its pending commands, and the
    /// controller is reset.
    pub(super) async fn power_cycle(
        &mut self,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) -> Result<(), String> {
        let (off, _) = self
            .call(wire::OP_SET_POWERED, &[0], POWER_WAIT, now, meanwhile)
            .await
            .map_err(|e| e.to_string())?;
        let (on, _) = self
            .call(wire::OP_SET_POWERED, &[1], POWER_WAIT, now, meanwhile)
            .await
            .map_err(|e| e.to_string())?;
        // Monitors stay registered across a power cycle: the kernel scans with them
        // again once the adapter is on.
        match on {
            wire::STATUS_SUCCESS => Ok(()),
            s => Err(format!(
                "the kernel did not power the adapter on (status 0x{s:02x}; off: 0x{off:02x})"
            )),
        }
    }

    /// The monitor a process killed before it removed it left on this adapter in this
    /// boot, as recorded, if the kernel still holds it.
    async fn recorded_stale(
        &mut self,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
    ) -> Option<u16> {
        if std::mem::replace(&mut self.record_read, true) {
            return None;
        }
        let text = std::fs::read_to_string(self.record.as_ref()?).ok()?;
        let handle = parse_record(&text, &boot_id()?, self.index)?;
        let (status, ret) = self
            .call(
                wire::OP_READ_ADV_MONITOR_FEATURES,
                &[],
                ANSWER_WAIT,
                now,
                meanwhile,
            )
            .await
            .ok()?;
        let held = status == wire::STATUS_SUCCESS && wire::monitor_handles(&ret).contains(&handle);
        if held {
            tracing::info!(
                handle,
                "removing the advertisement monitor an earlier run left in the kernel"
            );
            Some(handle)
        } else {
            if let Some(path) = &self.record {
                let _ = std::fs::remove_file(path);
            }
            None
        }
    }

    /// Records the monitor registered (its handle, the boot and the adapter).
    fn write_record(&self, handle: u16) {
        let (Some(path), Some(boot)) = (&self.record, boot_id()) else {
            return;
        };
        if let Err(e) = std::fs::write(path, format!("{boot} {} {handle}\n", self.index)) {
            tracing::debug!(error = %e, path = %path.display(), "cannot record the advertisement monitor");
        }
    }
}

/// This boot's id.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The handle in a record of `boot` and adapter `index` (`BOOT INDEX HANDLE`).
fn parse_record(text: &str, boot: &str, index: u16) -> Option<u16> {
    let mut words = text.split_whitespace();
    let (b, i, h) = (words.next()?, words.next()?, words.next()?);
    (b == boot && i.parse::<u16>().ok()? == index)
        .then(|| h.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_another_boot_or_adapter_names_no_monitor() {
        let record = "0b6f3c1e 0 7\n";
        assert_eq!(parse_record(record, "0b6f3c1e", 0), Some(7));
        assert_eq!(parse_record(record, "another", 0), None);
        assert_eq!(parse_record(record, "0b6f3c1e", 1), None);
        assert_eq!(parse_record("garbage", "0b6f3c1e", 0), None);
    }
}
