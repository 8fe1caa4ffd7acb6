//! Where the flusher's fetches resume ([`Cursor`]): the rows a walk of `pending` passed
//! over, per MAC in id order, and where it stopped; what moves it back and what starts
//! it over is said in `scan.rs`, which walks with it. A leaf: it touches only the
//! domain's words; the store holds it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::record::Mac;

/// Rows remembered at most (a few hundred kB); past it, fetches walk from the front
/// for [`PLAIN_FETCHES`] fetches before trying again.
pub const PASSED_MAX: usize = 16_384;

/// Fetches that walk from the front after the rows passed over grew past [`PASSED_MAX`].
pub(super) const PLAIN_FETCHES: u32 = 64;

/// Where the flusher's fetches resume; see `scan.rs`.
#[derive(Debug, Default)]
pub(super) struct Cursor {
    /// Rows below this id are claimed or in `passed`.
    pub(super) low: i64,
    /// The unclaimed pending rows below `low`, by id...
    pub(super) passed: BTreeMap<i64, Mac>,
    /// ...and by MAC, oldest first.
    pub(super) queues: HashMap<Mac, VecDeque<i64>>,
    /// `PRAGMA data_version` when the cursor was last used: another connection's
    /// commit changes it.
    pub(super) data_version: Option<i64>,
    /// Fetches left to walk from the front (after an overflow).
    pub(super) plain: u32,
}

impl Cursor {
    /// Every row may be anywhere: the next fetch starts from the front.
    pub(super) fn reset(&mut self) {
        self.low = 0;
        self.passed.clear();
        self.queues.clear();
        self.data_version = None;
    }

    /// Rows from `id` on may be pending and not claimed (handed back, or inserted).
    pub(super) fn lower(&mut self, id: i64) {
        if id >= self.low {
            return;
        }
        self.low = id;
        // Newest first: each is the last of its queue.
        for (id, mac) in self.passed.split_off(&id).into_iter().rev() {
            if let Some(q) = self.queues.get_mut(&mac) {
                if q.back() == Some(&id) {
                    q.pop_back();
                }
                if q.is_empty() {
                    self.queues.remove(&mac);
                }
            }
        }
    }

    /// No row is remembered.
    pub(super) fn is_empty(&self) -> bool {
        self.passed.is_empty()
    }

    /// Rows `ids` are claimed (or gone): no longer among those passed over.
    pub(super) fn claimed(&mut self, ids: &[i64]) {
        if self.passed.is_empty() {
            return;
        }
        for id in ids {
            let Some(mac) = self.passed.remove(id) else {
                continue;
            };
            if let Some(q) = self.queues.get_mut(&mac) {
                if let Some(at) = q.iter().position(|i| i == id) {
                    q.remove(at);
                }
                if q.is_empty() {
                    self.queues.remove(&mac);
                }
            }
        }
    }

    pub(super) fn pass(&mut self, mac: Mac, id: i64) {
        self.passed.insert(id, mac);
        self.queues.entry(mac).or_default().push_back(id);
    }
}
