//! A batch's claims on its captures, taken as its request goes on the wire and not
//! before ([`Outgoing`]: once no `Retry-After` holds and its token is in hand). While it
//! waits for either, it holds none, and the outbox may evict its rows as any others; as
//! it goes, it claims those still pending and the request carries only them (the rest
//! are [`Claims::gone`], never sent). It lets go if it must wait after all, and the
//! request task lets go at once of an answer that settles nothing (`send.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use crate::api::{BulkItem, BulkRequest, Outgoing};
use crate::config::MacFormat;
use crate::outbox::{FlusherOutbox, PendingCapture, RowKey, Seen};

pub(super) struct Claims {
    outbox: FlusherOutbox,
    rows: Arc<Vec<PendingCapture>>,
    seen: Seen,
    mac_format: MacFormat,
    /// The rows of the request last built, by index in `rows`: claimed while `held`.
    taken: Vec<usize>,
    held: bool,
    /// Rows the outbox no longer held as the request went: never sent.
    gone: Vec<i64>,
    /// Why nothing could be sent, when the outbox could not be read or the request
    /// not built.
    failed: Option<String>,
}

impl Claims {
    pub(super) fn new(
        outbox: FlusherOutbox,
        rows: Arc<Vec<PendingCapture>>,
        seen: Seen,
        mac_format: MacFormat,
    ) -> Claims {
        Claims {
            outbox,
            rows,
            seen,
            mac_format,
            taken: Vec::new(),
            held: false,
            gone: Vec::new(),
            failed: None,
        }
    }

    /// The rows the outbox no longer held.
    pub(super) fn gone(&self) -> &[i64] {
        &self.gone
    }

    /// Why nothing could be sent, if something other than eviction stopped it.
    pub(super) fn failed(&mut self) -> Option<String> {
        self.failed.take()
    }

    /// The capture times of the rows sent (of every row still held, before a request
    /// was built), for the metrics.
    pub(super) fn captured_at(&self) -> Vec<crate::record::EpochMillis> {
        if self.taken.is_empty() {
            let gone: HashSet<i64> = self.gone.iter().copied().collect();
            let held = self.rows.iter().filter(|r| !gone.contains(&r.id));
            return held.map(|r| r.capture.ts_ms).collect();
        }
        self.taken
            .iter()
            .map(|&i| self.rows[i].capture.ts_ms)
            .collect()
    }

    /// Lets go of the claims, if any are held (an answer that settles nothing).
    pub(super) async fn release(&mut self) {
        if !self.held {
            return;
        }
        self.held = false;
        let ids = self.taken.iter().map(|&i| self.rows[i].id).collect();
        if let Err(e) = self.outbox.let_go(ids).await {
            tracing::debug!(error = %e, "could not let go of a batch's claims");
        }
    }

    /// The request of the rows taken.
    fn request(&self) -> Result<BulkRequest, String> {
        let items: Vec<BulkItem> = self
            .taken
            .iter()
            .map(|&i| {
                let c = &self.rows[i].capture;
                BulkItem {
                    mac_id: self.mac_format.format(c.mac),
                    ble_packet: c.packet.clone(),
                    product_id: c.product_id.to_string(),
                    scan_time: c.ts_ms.div_euclid(1000).to_string(),
                }
            })
            .collect();
        BulkRequest::encode(&items).map_err(|e| e.to_string())
    }
}

impl Outgoing for Claims {
    type Request = BulkRequest;

    async fn take(&mut self) -> Option<BulkRequest> {
        let gone: HashSet<i64> = self.gone.iter().copied().collect();
        let keys: Vec<RowKey> = self
            .rows
            .iter()
            .filter(|r| !gone.contains(&r.id))
            .map(PendingCapture::key)
            .collect();
        let asked = keys.len();
        let present = match self.outbox.claim(keys, self.seen).await {
            Ok(present) => present,
            Err(e) => {
                self.failed = Some(format!("cannot read the outbox: {e}"));
                return None;
            }
        };
        self.taken.clear();
        if gone.is_empty() && present.len() == asked {
            // Every row is still there (the usual case): nothing to look up.
            self.taken.extend(0..self.rows.len());
        } else {
            let present: HashSet<i64> = present.into_iter().collect();
            for (i, r) in self.rows.iter().enumerate() {
                if present.contains(&r.id) {
                    self.taken.push(i);
                } else if !gone.contains(&r.id) {
                    self.gone.push(r.id);
                }
            }
        }
        self.held = !self.taken.is_empty();
        if !self.held {
            return None;
        }
        match self.request() {
            Ok(request) => Some(request),
            Err(e) => {
                self.failed = Some(format!("cannot encode the request: {e}"));
                self.release().await;
                None
            }
        }
    }

    async fn let_go(&mut self) {
        self.release().await;
    }
}
