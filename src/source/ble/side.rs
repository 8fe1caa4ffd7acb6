//! The side channel as the scan keeps it: the kernel's management socket for one
//! adapter and, in a passive scan, the advertisement monitor registered on it. Touches
//! the management socket only.

use std::time::Duration;

use tokio::time::Instant;

use super::mgmt;
use super::mgmt::wire::Pattern;

/// The kernel's advertisement monitor of a passive scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Monitor {
    /// Not registered (never, or removed): the scan is in trouble.
    Missing,
    /// Asked for at this instant; the answer is awaited.
    Adding(Instant),
    Active(u16),
}

/// The side channel and what the source keeps on it.
pub(super) struct Side {
    pub(super) channel: mgmt::Channel,
    pub(super) index: u16,
    /// `Some` in a passive scan.
    pub(super) monitor: Option<Monitor>,
}

impl Side {
    /// Acts on what the side channel says beside adverts.
    pub(super) fn control(&mut self, c: mgmt::Control) {
        let Some(monitor) = &mut self.monitor else {
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
    pub(super) async fn start_monitor(&mut self, patterns: &[Pattern]) -> Result<(), String> {
        let params = mgmt::wire::monitor_patterns(patterns)
            .ok_or("the products' patterns do not fit an advertisement monitor")?;
        let (status, ret) = self
            .channel
            .call(
                mgmt::wire::OP_ADD_ADV_PATTERNS_MONITOR,
                self.index,
                &params,
                Duration::from_secs(5),
            )
            .await
            .map_err(|e| format!("adding the advertisement monitor failed: {e}"))?;
        match (status, ret.as_slice()) {
            (mgmt::wire::STATUS_SUCCESS, [a, b, ..]) => {
                self.monitor = Some(Monitor::Active(u16::from_le_bytes([*a, *b])));
                Ok(())
            }
            _ => Err(format!(
                "the kernel refused the advertisement monitor (status 0x{status:02x})"
            )),
        }
    }

    /// Adds the passive scan's monitor, if this scan has one and it is missing; `false`
    /// when it could not even be asked for.
    pub(super) fn add_monitor(&mut self, patterns: &[Pattern]) -> bool {
        if self.monitor != Some(Monitor::Missing) {
            return true;
        }
        let sent = mgmt::wire::monitor_patterns(patterns)
            .ok_or_else(|| "the products' patterns do not fit a monitor".to_string())
            .and_then(|params| {
                self.channel
                    .send(mgmt::wire::OP_ADD_ADV_PATTERNS_MONITOR, self.index, &params)
                    .map_err(|e| e.to_string())
            });
        match sent {
            Ok(()) => {
                self.monitor = Some(Monitor::Adding(Instant::now()));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot add the advertisement monitor");
                false
            }
        }
    }

    /// Removes the passive scan's monitor (without waiting for the answer).
    pub(super) fn remove_monitor(&mut self) {
        if let Some(Monitor::Active(h)) = self.monitor {
            let _ = self.channel.send(
                mgmt::wire::OP_REMOVE_ADV_MONITOR,
                self.index,
                &h.to_le_bytes(),
            );
            self.monitor = Some(Monitor::Missing);
        }
    }
}
