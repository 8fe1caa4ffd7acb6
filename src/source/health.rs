//! What a live source has been through (the BLE ladder's steps, drops, where adverts are
//! read), counted by the source and read by the pipeline and `status`. Shared state
//! only: a trouble's time is the source's to give.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::record::EpochMillis;

/// What a live source has been through, shared with the pipeline, which keeps it in
/// the state database for `tapegate status` (the BLE liveness ladder's steps).
#[derive(Debug, Default)]
pub struct SourceHealth {
    /// Scans restarted (ladder step 1).
    pub restarts: AtomicU64,
    /// Adapters re-acquired with a new BlueZ connection (ladder step 2).
    pub reacquires: AtomicU64,
    /// Adverts dropped because the pipeline did not keep up with the radio.
    pub dropped: AtomicU64,
    /// Devices forgotten to bound memory (rotating MACs).
    pub forgotten: AtomicU64,
    /// Why the ladder last started, and when.
    pub last_trouble: Mutex<Option<(String, EpochMillis)>>,
    /// Where the BLE source reads adverts: `"mgmt"` (the kernel's management socket) or
    /// `"dbus"`; `None` before it started.
    pub adverts_path: Mutex<Option<&'static str>>,
    /// Advertising reports heard (every advert, before the products filter).
    pub reports: AtomicU64,
    /// Reports per second, as last measured by the health keeper.
    pub reports_per_sec: Mutex<Option<f64>>,
    /// Notified once the source is up (the BLE source: adapter found, discovery
    /// started), for READY.
    pub started: tokio::sync::Notify,
}

impl SourceHealth {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Where adverts are read now (see [`SourceHealth::adverts_path`]).
    pub fn set_adverts_path(&self, path: &'static str) {
        if let Ok(mut p) = self.adverts_path.lock() {
            *p = Some(path);
        }
    }

    pub fn adverts_path(&self) -> Option<&'static str> {
        self.adverts_path.lock().ok().and_then(|p| *p)
    }

    pub fn reports_per_sec(&self) -> Option<f64> {
        self.reports_per_sec.lock().ok().and_then(|r| *r)
    }

    /// Why the ladder started, at `at` (the source's clock).
    pub fn trouble(&self, reason: &str, at: EpochMillis) {
        if let Ok(mut t) = self.last_trouble.lock() {
            *t = Some((reason.to_string(), at));
        }
    }
}
