//! The shell of loading: read the file and its drop-ins (`layers.rs`), layer the
//! environment onto them, read the files they point to, and hand everything to the one
//! pure validation. The only file of the config that does I/O (through `host.rs` and
//! `layers.rs`); no side effect besides reading.

use std::path::Path;

use super::env;
use super::files::{Files, Password, TelemetryFiles};
use super::host::{CaFileRead, Host, PasswordFile};
use super::layers::Layers;
use super::problem::ConfigError;
use super::raw::RawConfig;
use super::validate::{self, Config};

/// The default config path (`--config` and `TAPEGATE_CONFIG` override it).
pub const DEFAULT_PATH: &str = "/etc/tapegate/config.toml";

/// Reads `path` and the drop-ins of `config.d/` beside it (merged over it in name
/// order), applies `TAPEGATE_<SECTION>__<KEY>` overrides from `env`, and validates,
/// reading the password.
pub fn load(
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    load_with(path, env, Password::Read)
}

/// [`load`] with the password read or not.
pub fn load_with(
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    password: Password,
) -> Result<Config, ConfigError> {
    from_layers_on(
        Layers::read(path)?,
        path,
        env,
        &Host::from_system(),
        password,
    )
}

/// The config file at `path` with its drop-ins merged, as one table (before the
/// environment's overrides), and the files it was read from: what a support bundle
/// shows.
pub fn merged_table(path: &Path) -> Result<(toml::Table, Vec<std::path::PathBuf>), ConfigError> {
    let layers = Layers::read(path)?;
    Ok((layers.table, layers.files))
}

/// Like [`load`], from the text of a config file (`path` names it in errors, and a
/// relative `password_file` is looked up beside it).
pub fn from_toml(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    from_toml_on(text, path, env, &Host::from_system(), Password::Read)
}

/// [`from_toml`] on a given host: everything but reading the host itself. The password
/// file is read here, before validation, so that validation stays pure and still reports
/// its problem in the same place as any other.
pub(super) fn from_toml_on(
    text: &str,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    host: &Host,
    password: Password,
) -> Result<Config, ConfigError> {
    from_layers_on(Layers::of_text(text, path)?, path, env, host, password)
}

/// [`from_toml_on`] of a file read with its drop-ins.
fn from_layers_on(
    mut layers: Layers,
    path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
    host: &Host,
    password: Password,
) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    for (key, variable) in env::apply(&mut layers.table, env, &mut problems) {
        layers.set_by_environment(&key, &variable);
    }
    let raw = RawConfig::from_table(std::mem::take(&mut layers.table), &mut problems);
    let password_file = raw
        .password_file()
        .filter(|_| password == Password::Read)
        .map(|file| PasswordFile::read(host.password_path(file, path)));
    let ca_file = raw.ca_file().map(CaFileRead::read);
    let telemetry_secret = raw
        .telemetry
        .secret_file()
        .filter(|_| password == Password::Read)
        .map(|file| PasswordFile::read(host.password_path(file, path)));
    let telemetry_ca = raw.telemetry.ca_file.as_deref().map(CaFileRead::read);
    let files = Files {
        password_file: password_file.as_ref(),
        ca_file: ca_file.as_ref(),
        telemetry: TelemetryFiles {
            secret: telemetry_secret.as_ref(),
            ca_file: telemetry_ca.as_ref(),
        },
        password,
    };
    let config = validate::validate(raw, host, files, &mut problems);
    if layers.has_drop_ins() {
        problems = problems.into_iter().map(|p| layers.locate(p)).collect();
    }
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::{test_host, SERVICE};

    /// `status`, `tapes`, `dead-letters`, `scan`, `check --config-only` and a reload work
    /// where the password cannot be read (the unit stopped, `ExecReload=`), and still
    /// refuse a config that is wrong elsewhere, in `[service]` too.
    #[test]
    fn what_does_not_talk_to_the_service_never_reads_the_password() {
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            "password_file = \"/nonexistent/pw\"",
        );
        let path = Path::new("test.toml");
        let local = |text: &str| from_toml_on(text, path, [], &test_host(), Password::Skip);
        let c = local(&text).unwrap();
        assert!(c.service.is_none());
        let read = from_toml_on(&text, path, [], &test_host(), Password::Read).unwrap_err();
        assert!(
            read.to_string().contains("password_file = /nonexistent/pw"),
            "{read}"
        );

        let bad_url = text.replace("https://api.example.com/", "not a url");
        let e = local(&bad_url).unwrap_err();
        assert!(e.to_string().contains("base_url = \"not a url\""), "{e}");
        let both = text.replace(
            "[service.environments.ppe]",
            "[service.environments.ppe]\npassword = \"x\"",
        );
        let e = local(&both).unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
    }

    #[test]
    fn a_syntax_error_on_the_password_line_names_the_place_but_never_the_value() {
        let text = SERVICE.replace("password = \"s3cr3t-value\"", "password = \"s3cr3t-value");
        let err = crate::config::test_support::parse(&text, &[]).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(
            shown.contains("line 10") && shown.contains("`password`"),
            "{shown}"
        );
        // Elsewhere the parser's words help and are kept.
        let err =
            crate::config::test_support::parse("[flush]\nmax_batch = = 3\n", &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("line 2, column 13, key `max_batch`: "),
            "{err}"
        );
    }
}
