/*!
tapegate: the dock-gateway daemon that turns the BLE advertisements of asset-tracking
tapes into decoded readings in the tracking service.

```text
 source ──► products ──► dedup ──► outbox (SQLite) ──► flusher ──► bulk decode API
```

# Layout
The floors of the house, bottom first; a room may import its own floor and those below,
never above, and no import goes round in a circle (`tests/layout.rs` holds both, and no
file in `src/` over 500 lines nor function over 80): leaves ([`record`], [`text`],
[`secret`], [`backoff`], [`tape`], [`systemd`], the clock's readings) < the pure core
([`products`], [`dedup`], the clock's hold policy) < [`config`] < stores, shared state
and clients ([`outbox`], [`inventory`], [`metrics`], [`heard_now`], [`api`],
[`operator`]) < stages
([`source`], [`ingest`], the clock keeper, [`flush`], [`telemetry`], [`health`]) < the
daemon ([`pipeline`], [`reload`], [`http`]) < commands ([`cmd`], [`cli`]) <
`main.rs`.

- [`config`]: raw (serde) config layered from file and `TAPEGATE_*` environment
  (`config/raw.rs`, `config/env.rs`), validated purely into typed [`config::Config`]
  in one step that reports every problem (`config/validate.rs`), each section read by
  its own file with its typed settings (`gateway.rs`, `service.rs`, `products.rs`,
  `scanner.rs`, `dedup.rs`, `outbox.rs`, `flush.rs`, `readings.rs`, `log.rs`,
  `http.rs`, `telemetry.rs`); `load.rs` the shell that reads, `problem.rs` the one
  error, `files.rs` the files a config points to as read, defaults in one table
  (`config/defaults.rs`), the machine's facts read by the shell (`config/host.rs`), the
  effective config and its hash (`effective.rs`).
- [`record`]: the shared domain types ([`record::Mac`], [`record::Advertisement`],
  [`record::Capture`]) and the JSON Lines advertisement record.
- [`source`]: the [`source::Source`] trait and what it sends (`stream.rs`), one factory
  ([`source::from_settings`], `configured.rs`), what a live source shares of its
  trouble (`health.rs`), and the `ble` (BlueZ: `ble/start.rs` the source,
  `ble/scanner.rs` its one loop, `ble/adverts.rs` what an advert does, `ble/steps.rs`
  the ladder's steps taken, `ble/session.rs` the D-Bus session, `ble/side.rs` the side
  channel and a passive scan's monitor, `ble/signals.rs` the D-Bus path's advert
  signals, `ble/mgmt/` the kernel's management socket, its pure frame and AD parsers
  and the socket opener, `ble/passive.rs` passive scanning, `ble/devices.rs` the
  bounded device memory, `ble/ladder.rs` the pure liveness ladder, `ble/bluez.rs` the
  watcher), `replay` and `sim` sources.
- [`products`]: which advertisements are tapes, and the `ble_packet` sent for them.
- [`dedup`]: per-MAC deduplication on capture time (pure, time passed in).
- [`ingest`]: the stage from advertisements to committed groups in the outbox
  (`ingest/commit.rs` the commit with its retry).
- [`outbox`]: the durable, bounded SQLite store (`db/` the leaf under it: connection,
  schema and migrations, counters, column codecs, the error; `words.rs` its vocabulary,
  which `heard_now` speaks too; `store.rs` open and quarantine, `existing.rs` the CLI's
  opens, `reopen.rs` a file deleted under the daemon; `enqueue.rs`, `fetch.rs` with
  `scan.rs`, `settle.rs` the daemon's path; `operator.rs` the reads and changes of `status`, `tapes`, `dead-letters`; `clock.rs`
  boots and held rows; `dock.rs` the rate window and the tapes heard; `lock.rs` one
  daemon per state directory; `access.rs` who may create and write the state, and why
  a database cannot be written (`storage.rs`: its file system read-only, or turned so
  after an error); `retention.rs` the count, age and size bounds and the
  one eviction; `fleet.rs` the inventory, dead-letter summary and boots for the fleet's
  tools); `users/` the one small handle each user gets over the owner thread
  (`IngestWriter`, `FlusherOutbox`, `ClockOutbox`, `Reader`, `ScannerNotes`,
  `StageOutbox`, made by `Handles`; the flusher's state published in memory on their
  board); its module doc is the design document.
- [`flush`]: delivery to the bulk decode endpoint: `plan/` the pure planner (batches,
  splits, isolation, attempt bounds, backoff, the concurrency window: `verdict.rs` what
  an answer does to its captures, `queue.rs` the parked parts, `window.rs` and
  `pause.rs` pure state), `answer.rs` what an answer means, `mod.rs` the loop with
  several batches in flight (`send.rs` a request, `claims.rs` the claims it takes on
  its rows as it goes on the wire, `notes.rs` what a note logs,
  `state.rs` the flusher's state and its write bound, `shell.rs` and `inputs.rs` its
  data); [`backoff`] is the one retry delay (flusher, token cache, ingest).
- [`api`]: the transport shared by the daemon and the operator room (`grant.rs` the
  password grant, `auth.rs` the token cache and its lifetime bounds, `decode.rs` bulk
  and single decode, `bulk_answer.rs` the bulk answer read as it streams, `decoded.rs`
  the decoded packet both fill, `pause.rs` the service's `Retry-After` held for every
  decode request from the instant it is read, `wire.rs` a decode request sent once it
  can go, taking what it carries only then, `address.rs` the service's URLs and
  account headers checked, `trust.rs` the certificate authorities trusted, `error.rs`
  answers and transport
  failures mapped to typed kinds that say what to do; `error/transport.rs` and
  `error/answer.rs` read them). [`secret`] keeps the password and token out of every
  text.
- [`operator`]: the operator room, the client of the rest of the service, one file per
  capability (`add.rs`, `label.rs` label and relabel, `show.rs`, `deactivate.rs`,
  `configure.rs`, with `devices.rs` the multi-device run they share and
  `device_op.rs` its words; `locate.rs`, `history.rs`, `messages.rs`), `send.rs` the
  one send every call goes through with its retry policy declared per call, `rate.rs`
  the shared, sliding rate window kept in the state database, `assumed.rs` the request
  shapes the spec does not show and how both readings of its open points are read;
  `client.rs`, under them all, the client, its error and the check of an identifier.
- [`pipeline`]: the only place that creates channels, spawns stages, watches them all
  at once (a stage that dies ends the daemon non-zero), wires SIGHUP and orders
  shutdown; `run` is a sequence of named steps, one file each (`open.rs`, `parts.rs`,
  `capture.rs`, `delivery.rs`, `services.rs`, `supervise.rs`). [`health`] keeps `STATUS=` and the scanner's counts current and gives
  `/healthz` its verdict (stages turning, commits succeeding, requests answered);
  [`systemd`] is sd_notify, the watchdog that pings only while every stage makes
  progress, and the stop signals.
- [`reload`]: SIGHUP applies what changed (`reload/changes.rs`, pure), restarting the
  delivery stage (`reload/delivery.rs`), the HTTP server or the pusher
  (`reload/services.rs`) in-process where needed, and names what needs a restart.
- [`http`]: the read-only HTTP server of `[http] listen` (`http/server.rs`): `/metrics`
  (every metric defined in [`metrics`]: `registry.rs` the live ones, `stored.rs` those
  read from the state database, `render.rs` the exposition), `/healthz`
  ([`health::verdict`]) (`http/routes.rs`) and the status page (`http/page.rs`), which joins the tapes the ingest stage heard ([`heard_now`]) with
  what the state database knows of them.
- [`inventory`]: version, commit, config hash, boot, kernel, BlueZ, adapter: recorded by
  the daemon for `status --json`, `/metrics` and the pushed telemetry.
- [`telemetry`]: `[telemetry]`, the metrics of `/metrics` pushed to a Prometheus
  remote-write receiver (`remote_write.rs` the protobuf by hand), kept through outages.
- [`cmd`]: one file per command, each thin over the library: `run` (the daemon),
  `status`, `tapes`, `dead-letters` (`state.rs`), `decode`, `check` (for installers),
  `scan` (the live view and recorder), `side-channel`, `demo`, and the operator's
  `device` (`device/`: `add.rs`, `nearest.rs`, `many.rs` the multi-device calls,
  `input.rs` and `manifest.rs` the checks of `--qr` and the strict CSV of `--csv`,
  `shared.rs` what they print with),
  `locate`, `history` and `message`, over `client.rs`, the operator's client as every
  operator command makes it (waits told on stderr, Ctrl-C); and `support-bundle`
  (`support_bundle.rs`; its secrets found and scrubbed by `support_bundle/secrets.rs`,
  the journal by `support_bundle/journal.rs`, its tar.gz by `archive.rs`);
  `cmd::block_on` and `cmd::until_stopped` give a command its runtime. [`cli`] is the
  command line; `main.rs` only starts logging, loads the config a command needs, picks
  the command and maps errors to exit codes.
- [`clock`]: time on a gateway without a real-time clock: wall and boot time and the
  kernel's sync state behind one trait, a value (`SharedClock`) that `main.rs` makes once
  and every stage and command is handed (`source.rs`; in debug builds a test clock driven
  by a file, `fake.rs`, which `main.rs` may choose, with the fixed days the tests of
  what depends on the date run on), the pure hold policy and repair
  arithmetic (`policy.rs`), and the keeper that holds and releases captures in the
  outbox (`keeper.rs`, run by the ingest stage); also time formatting.
- The mock tracking service is a crate of its own (`mock/`, `tapegate-mock`), which
  depends on nothing here; the gateway uses it only in `tapegate demo` and `tapegate
  mock` (`cmd/demo.rs`, cargo feature `mock`, on by default; the package is built
  without it), and the tests and benchmarks start it on loopback.
- [`tape`]: the simulated tape's packet layout, written by the `sim` source (the mock
  reads it with a decoder of its own).
- [`text`]: text from elsewhere (the service, CSV, arguments) bounded and made inert
  before it is stored or shown.
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
pub mod reload;
pub mod secret;
pub mod source;
pub mod systemd;
pub mod tape;
pub mod telemetry;
pub mod text;
