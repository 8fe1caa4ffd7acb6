//! What the fleet's tools read from the state database beside the outbox: the
//! inventory the daemon recorded at start ([`crate::inventory`]), kept in `meta` under
//! `inventory` as JSON (no schema change; nothing secret is in it).

use rusqlite::OptionalExtension;

use super::{OutboxError, Store};
use crate::inventory::Inventory;

impl Store {
    /// Records the running daemon's inventory.
    pub fn note_inventory(&mut self, inventory: &Inventory) -> Result<(), OutboxError> {
        let json = serde_json::to_string(inventory).unwrap_or_default();
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES ('inventory', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [json],
        )?;
        Ok(())
    }

    /// The inventory the daemon last recorded, if any (and if this version can read it).
    pub fn inventory(&self) -> Result<Option<Inventory>, OutboxError> {
        let text: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'inventory'", [], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }
}
