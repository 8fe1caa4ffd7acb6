//! The rows every part of the outbox keeps exact: the `counters` table ([`Counters`],
//! read afresh in each write transaction and written where they changed) and the
//! `meta` table's keys. A leaf of the state database's layer (`db`): it touches only
//! the connection.

use rusqlite::{params, Connection, Transaction};

/// The `counters` table. Write transactions read it afresh (the CLI may have changed
/// it); the copy in the store (`Store`) is the state after our last commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) admitted: u64,
    pub(crate) delivered: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) evicted: u64,
    pub(crate) dead_letters_dropped: u64,
}

impl Counters {
    pub(crate) fn pending(&self) -> u64 {
        self.admitted - self.delivered - self.dead_lettered - self.evicted
    }
}

pub(crate) fn read_counters(conn: &Connection) -> rusqlite::Result<Counters> {
    let mut c = Counters::default();
    let mut stmt = conn.prepare_cached("SELECT name, value FROM counters")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let name: String = r.get(0)?;
        let v: i64 = r.get(1)?;
        let v = v.max(0) as u64;
        match name.as_str() {
            "admitted" => c.admitted = v,
            "delivered" => c.delivered = v,
            "dead_lettered" => c.dead_lettered = v,
            "evicted" => c.evicted = v,
            "dead_letters_dropped" => c.dead_letters_dropped = v,
            _ => {}
        }
    }
    Ok(c)
}

/// Writes the counters that changed from `old` to `new`.
pub(crate) fn write_counters(
    tx: &Transaction<'_>,
    old: &Counters,
    new: &Counters,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached("UPDATE counters SET value = ?2 WHERE name = ?1")?;
    for (name, o, n) in [
        ("admitted", old.admitted, new.admitted),
        ("delivered", old.delivered, new.delivered),
        ("dead_lettered", old.dead_lettered, new.dead_lettered),
        ("evicted", old.evicted, new.evicted),
        (
            "dead_letters_dropped",
            old.dead_letters_dropped,
            new.dead_letters_dropped,
        ),
    ] {
        if o != n {
            stmt.execute(params![name, n as i64])?;
        }
    }
    Ok(())
}

/// Adds `n` to the counter `name`, in `tx`.
pub(crate) fn add_counter(tx: &Transaction<'_>, name: &str, n: u64) -> rusqlite::Result<()> {
    if n > 0 {
        tx.execute(
            "UPDATE counters SET value = value + ?2 WHERE name = ?1",
            params![name, n as i64],
        )?;
    }
    Ok(())
}

/// Sets the `meta` row `key`.
pub(crate) fn set_meta(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [key, value],
    )?;
    Ok(())
}
