/*!
tapegate: the dock-gateway daemon that turns the BLE advertisements of asset-tracking
tapes into decoded readings in the tracking service.

```text
 source ──► products ──► dedup ──► outbox (SQLite) ──► flusher ──► bulk decode API
```

# Layout
- [`config`]: raw (serde) config layered from file and `TAPEGATE_*` environment, then
  validated into typed [`config::Config`] in one step that reports every problem.
- [`record`]: the shared domain types ([`record::Mac`], [`record::Advertisement`],
  [`record::Capture`]) and the JSON Lines advertisement record.
- [`source`]: the [`source::Source`] trait and the `ble` (BlueZ, with its liveness
  ladder), `replay` and `sim` sources.
- [`products`]: which advertisements are tapes, and the `ble_packet` sent for them.
- [`dedup`]: per-MAC deduplication on capture time (pure, time passed in).
- [`outbox`]: the durable, bounded SQLite store; its module doc is the design document.
- [`ingest`]: the stage from advertisements to committed groups in the outbox.
- [`pipeline`]: the only place that creates channels, spawns stages and orders shutdown.
- [`flush`]: batching, answer handling and backoff towards the bulk decode endpoint.
- [`api`]: the tracking service client (token cache, bulk and single decode).
- [`cmd`]: the commands a person runs beside the daemon: `status`, `tapes`,
  `dead-letters`, `decode` (reading the state database or the service), `check` (for
  installers), `scan` (the live view and recorder) and `demo`. [`cli`] is the command
  line; [`clock`] is wall-clock time and its formatting.
- [`health`]: what the running daemon keeps of its health for operators (`STATUS=`,
  the scanner's counts in the state database).
- [`systemd`]: sd_notify (READY, STATUS, STOPPING) and the watchdog that pings only
  while every stage makes progress.
- `mock` (cargo feature `mock`, on by default): the spec-faithful mock tracking service
  used by tests, `tapegate demo` and `tapegate mock`; not part of the gateway's API.
- [`tape`]: the simulated tape's packet layout, written by the `sim` source and read by
  the mock.
*/

pub mod api;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod config;
pub mod dedup;
pub mod flush;
pub mod health;
pub mod ingest;
#[cfg(feature = "mock")]
pub mod mock;
pub mod outbox;
pub mod pipeline;
pub mod products;
pub mod record;
pub mod secret;
pub mod source;
pub mod systemd;
pub mod tape;
