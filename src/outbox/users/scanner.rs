//! The health keeper's handle: the BLE scanner's counts and rate, moved into the
//! database for `tapegate status` (another process). Nothing else.

use crate::outbox::{Outbox, OutboxError, ScannerCounts};
use crate::record::EpochMillis;

/// What the health keeper may do to the outbox.
#[derive(Clone)]
pub struct ScannerNotes {
    outbox: Outbox,
}

impl ScannerNotes {
    pub(super) fn new(outbox: Outbox) -> ScannerNotes {
        ScannerNotes { outbox }
    }

    /// Adds `delta` to the counts kept across restarts, with the last trouble.
    pub async fn add_counts(
        &self,
        delta: ScannerCounts,
        trouble: Option<(String, EpochMillis)>,
    ) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| {
                s.add_scanner_counts(&delta, trouble.as_ref().map(|(r, at)| (r.as_str(), *at)))
            })
            .await
    }

    /// Records where the source reads adverts and its reports per second.
    pub async fn note_rate(
        &self,
        path: &'static str,
        per_sec: Option<f64>,
        at: EpochMillis,
    ) -> Result<(), OutboxError> {
        self.outbox
            .call(move |s| s.note_scanner_rate(Some(path), per_sec, at))
            .await
    }
}
