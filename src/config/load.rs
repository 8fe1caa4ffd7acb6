//! The shell of loading: read the file, layer the environment onto it, read the files it
//! points to, and hand everything to the one pure validation. The only file of the
//! config that does I/O (through `host.rs`); no side effect besides reading.

use std::path::Path;

use super::env;
use super::files::{Files, Password, TelemetryFiles};
use super::host::{CaFileRead, Host, PasswordFile};
use super::problem::ConfigError;
use super::raw::RawConfig;
use super::validate::{self, Config};

/// The default config path (`--config` and `TAPEGATE_CONFIG` override it).
pub const DEFAULT_PATH: &str = "/etc/tapegate/config.toml";

/// Reads `path`, applies `TAPEGATE_<SECTION>__<KEY>` overrides from `env`, and validates,
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
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    from_toml_on(&text, path, env, &Host::from_system(), password)
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
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: syntax_message(text, &e),
            })?;
    let mut problems = Vec::new();
    env::apply(&mut table, env, &mut problems);
    let raw = RawConfig::from_table(table, &mut problems);
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
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

/// Where a TOML syntax error is and what is wrong, without the text of the line: the
/// parser's own message quotes the line, and that line may hold the password. The key
/// of the line is named when there is one; the parser's words are left out too when
/// that key holds a secret (they can quote a character of the value).
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return "a syntax error (position unknown)".into();
    };
    let before = text.get(..at).unwrap_or("");
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').trim())
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        });
    let what = e.message().lines().next().unwrap_or("").trim();
    match key {
        Some(k) if crate::secret::is_secret_key(k) => {
            format!("line {line_no}, column {column}, in the value of `{k}` (not shown: it is a secret)")
        }
        Some(k) => format!("line {line_no}, column {column}, key `{k}`: {what}"),
        None => format!("line {line_no}, column {column}: {what}"),
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
