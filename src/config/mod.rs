/*!
Configuration in two phases: a raw serde layer (file, then `TAPEGATE_<SECTION>__<KEY>`
environment overrides), then one validation step that turns it into the typed
[`Config`] and reports every problem at once, each naming the key, the value and what
was expected. Loading has no side effects. Config may touch the leaves and the pure
core (the product table, dedup's and the clock's settings), nothing that runs.

The rooms, by seam, each file's doc saying what it holds: loading, the shell that reads
the file, the drop-ins of `config.d/` merged over it (and where each key came from), the
machine's side and the files the config points to, then calls the rest ([`load`],
[`from_toml`]); the raw serde layer, one struct per section, unknown keys refused, each
section read on its own so one bad section does not hide the problems of the others;
the `TAPEGATE_<SECTION>__<KEY>` overrides, layered onto the file's table; the one table
of defaults ([`DEFAULTS`], which `config.example.toml` is held to by a test);
validation, the typed [`Config`] and the one pure step from raw to it, a file per
section holding that section's typed settings; the problems and the collector they are
written into; and [`effective`], the validated config written back as a document, and
its hash.
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
