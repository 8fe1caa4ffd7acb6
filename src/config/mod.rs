/*!
Configuration in two phases: a raw serde layer (file, then `TAPEGATE_<SECTION>__<KEY>`
environment overrides), then one validation step that turns it into the typed
[`Config`] and reports every problem at once, each naming the key, the value and what
was expected. Loading has no side effects. Config may touch the leaves and the pure
core (the product table, dedup's and the clock's settings), nothing that runs.

The rooms, by seam:
- `load.rs`: [`load`] / [`from_toml`], the shell that reads the file and the files it
  points to and calls the rest; `layers.rs` the drop-ins of `config.d/` merged over the
  file, and where each key came from; `host.rs` the machine's side (host name, credentials
  directory, the reads); `files.rs` what was read, checked (password, CA files).
- `raw.rs`: the serde structs, one per section, unknown keys refused; each section is
  read on its own so one bad section does not hide the problems of the others.
- `env.rs`: the `TAPEGATE_<SECTION>__<KEY>` overrides, layered onto the file's table.
- [`defaults`]: the one table of defaults, [`DEFAULTS`]; `config.example.toml` is held to
  it by a test.
- `validate.rs`: the typed [`Config`] and the one pure step from raw to it, which reads
  each section with its own file: `gateway.rs`, `service.rs` (with the operator's keys),
  `products.rs`, `scanner.rs` (with the simulated fleet's), `dedup.rs`, `outbox.rs`
  (with the retention bounds), `flush.rs`, `readings.rs`, `log.rs`, `http.rs`,
  `telemetry.rs`; each holds its section's typed settings. `problem.rs`: the error, its
  problems and the collector they are written into.
- [`effective`]: the validated config written back as a document, and its hash.
*/

mod dedup;
pub mod defaults;
pub mod effective;
mod env;
mod files;
mod flush;
mod gateway;
mod host;
mod http;
mod layers;
mod load;
mod log;
mod outbox;
mod problem;
mod products;
mod raw;
mod readings;
mod scanner;
mod service;
mod telemetry;
#[cfg(test)]
pub(crate) mod test_support;
mod validate;

pub use defaults::DEFAULTS;
pub use files::{CaFile, Password};
pub use flush::FlushSettings;
pub use gateway::GatewaySettings;
pub use host::world_readable_password;
pub use http::HttpSettings;
pub use layers::drop_in_dir;
pub use load::{from_toml, load, load_with, merged_table, DEFAULT_PATH};
pub use log::LogSettings;
pub use outbox::{Durability, OutboxSettings, Retention};
pub use problem::{ConfigError, Problem};
pub use readings::ReadingsSettings;
pub use scanner::{AdvertsPath, ScanMode, ScannerSettings, SimSettings, SourceKind};
pub use service::{EnvironmentSettings, MacFormat, OperatorSettings, ServiceSettings};
pub use telemetry::{TelemetryAuth, TelemetrySettings};
pub use validate::Config;
