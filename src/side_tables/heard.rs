//! The tapes heard lately that the service refused as unknown (`heard`), kept in the
//! state database for `device add --nearest` to choose from. The daemon keeps the tapes
//! it hears in memory ([`crate::heard_now`]) and writes here only those refusals (and
//! their end), inside the outbox's transaction that records them ([`record`]); a device
//! command reads them ([`since`]). It touches the database layer and the domain's words.

use rusqlite::{params, Connection, Transaction};

use crate::db::{int_to_mac, mac_to_int, OutboxError};
use crate::record::{EpochMillis, Mac};

/// Tapes not heard for this long are forgotten.
pub(crate) const HEARD_KEEP_MS: EpochMillis = 10 * 60_000;

/// A tape heard lately, as the daemon recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeardTape {
    pub mac: Mac,
    /// When it was last heard (wall time).
    pub last_at: EpochMillis,
    /// Its strongest RSSI in the last half minute or so, and when.
    pub best_rssi: Option<i16>,
    pub best_at: EpochMillis,
    /// `Some(true)`: the service decoded it; `Some(false)`: refused as not found;
    /// `None`: no answer about it yet.
    pub known: Option<bool>,
}

/// What the state database must learn of the tapes heard, with an answer being
/// recorded ([`crate::heard_now::HeardNow::changes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeardChanges {
    /// Tapes refused as unknown: their rows, written (`known` false).
    pub unknown: Vec<HeardTape>,
    /// Tapes the database holds as unknown that the service has now decoded.
    pub known: Vec<Mac>,
}

impl HeardChanges {
    pub fn is_empty(&self) -> bool {
        self.unknown.is_empty() && self.known.is_empty()
    }
}

/// Tapes heard at or after `since` (capture time), loudest first.
pub(crate) fn since(conn: &Connection, since: EpochMillis) -> Result<Vec<HeardTape>, OutboxError> {
    let mut stmt = conn.prepare(
        "SELECT mac, last_at, best_rssi, best_at, known FROM heard WHERE last_at >= ?1
         ORDER BY best_rssi IS NULL, best_rssi DESC, mac",
    )?;
    let rows = stmt
        .query_map([since], |r| {
            Ok(HeardTape {
                mac: int_to_mac(r.get(0)?),
                last_at: r.get(1)?,
                best_rssi: r.get(2)?,
                best_at: r.get(3)?,
                known: r.get::<_, Option<i64>>(4)?.map(|k| k != 0),
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Records, inside the transaction that records the answers, the tapes heard that the
/// service refused as unknown (their rows) and those it now knows again; forgets rows
/// not heard for [`HEARD_KEEP_MS`]. Nothing to record: nothing written.
pub(crate) fn record(
    tx: &Transaction<'_>,
    changes: &HeardChanges,
    now: EpochMillis,
) -> rusqlite::Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO heard(mac, last_at, best_rssi, best_at, known) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(mac) DO UPDATE SET last_at = excluded.last_at, best_rssi = excluded.best_rssi,
           best_at = excluded.best_at, known = excluded.known",
    )?;
    for t in &changes.unknown {
        upsert.execute(params![
            mac_to_int(t.mac),
            t.last_at,
            t.best_rssi,
            t.best_at,
            t.known
        ])?;
    }
    let mut known = tx.prepare_cached("UPDATE heard SET known = 1 WHERE mac = ?1")?;
    for mac in &changes.known {
        known.execute([mac_to_int(*mac)])?;
    }
    tx.prepare_cached("DELETE FROM heard WHERE last_at < ?1")?
        .execute([now.saturating_sub(HEARD_KEEP_MS)])?;
    Ok(())
}
