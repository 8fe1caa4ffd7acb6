/*!
tapegate: the dock-gateway daemon that turns the BLE advertisements of asset-tracking
tapes into decoded readings in the tracking service.

```text
 source ──► products ──► dedup ──► outbox (SQLite) ──► flusher ──► bulk decode API
```

# Layout
One line a module, in the order a capture meets them; each module's own doc says what
is inside. `tests/layout.rs` holds the floors (a module imports its own floor and those
below, never in a circle).

- [`config`]: the file, its drop-ins and the environment, validated in one step.
- [`source`]: where adverts come from: BlueZ or the kernel's management socket, replay, sim.
- [`products`]: which adverts are tapes, and the packet sent for them.
- [`dedup`]: per-MAC deduplication on capture time (pure, time passed in).
- [`ingest`]: adverts to captures committed in the outbox.
- [`clock`]: wall and boot time, the sync state, the hold policy and its keeper.
- `db`: the state database, the one SQLite file: opened, checked, migrated; reached only
  by the outbox and the side tables.
- [`outbox`]: the durable, bounded SQLite store and the narrow handles over it.
- `side_tables`: what the file keeps beside the outbox: the rate window, the tapes heard
  that the service does not know, the inventory.
- [`heard_now`]: the tapes heard lately, shared by ingest and the status page.
- [`flush`]: delivery to the bulk decode endpoint: the pure planner and its loop.
- [`api`]: the service's transport: token, decode, answers, trust, `Retry-After`.
- [`operator`]: the rest of the service for the dock's people, through the rate window.
- [`health`]: `STATUS=`, the scanner's counts and the verdict of `/healthz`.
- [`metrics`], [`inventory`], [`telemetry`]: what a fleet reads, scraped or pushed.
- [`pipeline`]: the daemon: stages spawned, watched, reloaded on SIGHUP, stopped.
- [`http`]: `/metrics`, `/healthz` and the status page.
- [`cmd`]: the command line and one file per command; `main.rs` starts them.
- Leaves: [`record`] (the domain's words) and [`util`]: text and secrets made safe, the
  one retry delay, systemd's notify and watchdog, a debug build's test hooks as a value.
- The mock tracking service is a crate of its own (`mock/`), used by `tapegate demo`.
*/

pub mod api;
pub mod clock;
pub mod cmd;
pub mod config;
pub(crate) mod db;
pub mod dedup;
pub mod flush;
pub mod health;
pub mod heard_now;
pub mod http;
pub mod ingest;
pub mod inventory;
pub mod metrics;
pub mod operator;
pub mod outbox;
pub mod pipeline;
pub mod products;
pub mod record;
pub(crate) mod side_tables;
pub mod source;
pub mod telemetry;
pub mod util;
