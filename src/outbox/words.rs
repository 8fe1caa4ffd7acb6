//! The outbox's vocabulary: a pending capture and the fate the service's answer gives it
//! ([`Outcome`], [`Reading`]) and a tape's latest reading ([`TapeRow`]).
//! A leaf: the outbox, the flusher and the tapes heard now (`heard_now`) all speak it;
//! it touches only the domain's words (`record`).

use crate::record::{Capture, EpochMillis, Mac};

/// A pending capture as the flusher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCapture {
    pub id: i64,
    pub capture: Capture,
}

impl PendingCapture {
    /// What names this row when it is claimed ([`RowKey`]).
    pub fn key(&self) -> RowKey {
        RowKey {
            id: self.id,
            mac: self.capture.mac,
            captured_at: self.capture.ts_ms,
        }
    }
}

/// A pending row as the flusher claims it: its id, and what tells it from a row given
/// the same id later (SQLite gives an id freed at the end of the table again, and a row
/// the flusher holds may have been evicted meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowKey {
    pub id: i64,
    pub mac: Mac,
    pub captured_at: EpochMillis,
}

/// When the flusher read its rows, counted in what left `pending` other than by its
/// own answers (an eviction, a database replaced under the daemon): rows read at the
/// count the outbox still holds are all still there, so claiming them looks nothing up
/// ([`crate::outbox::FlusherOutbox::claim`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen(pub(super) u64);

/// What the service decoded, as far as the gateway keeps it: the tape's latest reading
/// (`tapegate tapes`, the status page). The readings themselves are the service's.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub qr_code: Option<String>,
    pub temp: Option<f64>,
    pub bat: Option<f64>,
}

/// What became of one pending capture.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered(Reading),
    /// Refused by the service; the text is the server's error.
    DeadLetter(String),
}

/// The latest reading of one tape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TapeRow {
    pub mac: Mac,
    pub qr_code: Option<String>,
    pub captured_at: EpochMillis,
    pub decoded_at: EpochMillis,
    pub rssi: Option<i16>,
    pub temp: Option<f64>,
    pub bat: Option<f64>,
}
