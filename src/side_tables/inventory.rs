//! The inventory the daemon recorded at start ([`crate::inventory`]), kept in `meta`
//! under `inventory` as JSON (no schema change; nothing secret is in it), for the fleet's
//! tools (`support-bundle`). It touches the database layer and the inventory's type.

use rusqlite::{Connection, OptionalExtension};

use crate::db::{set_meta, OutboxError};
use crate::inventory::Inventory;

/// The `meta` key the inventory is kept under.
const KEY: &str = "inventory";

/// Records the running daemon's inventory.
pub(crate) fn note(conn: &Connection, inventory: &Inventory) -> Result<(), OutboxError> {
    let json = serde_json::to_string(inventory).unwrap_or_default();
    set_meta(conn, KEY, &json)?;
    Ok(())
}

/// The inventory the daemon last recorded, if any (and if this version can read it).
pub(crate) fn read(conn: &Connection) -> Result<Option<Inventory>, OutboxError> {
    let text: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [KEY], |r| r.get(0))
        .optional()?;
    Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
}
