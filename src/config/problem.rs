//! What is wrong with a config: the one error [`ConfigError`], its [`Problem`]s (key,
//! value, what was expected), and [`Check`], the collector every section reports into
//! while it reads its raw values. Touches nothing but text.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

/// Why a configuration was refused. Its `Display` lists every problem, one per line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source} (pass --config PATH or set TAPEGATE_CONFIG)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config {path} has {} problem(s):\n{}", .problems.len(), Problems(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// One problem: the key (dotted path), the value found (never for a secret), and what
/// was expected; with drop-ins, also the file (or variable) that set the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub value: Option<String>,
    pub message: String,
    /// The file or `TAPEGATE_*` variable that set the key, named when the config has
    /// drop-ins (`config.d/`).
    pub origin: Option<String>,
}

impl Problem {
    /// A problem with `key`, set where the config does not say.
    pub fn new(
        key: impl Into<String>,
        value: Option<String>,
        message: impl Into<String>,
    ) -> Problem {
        Problem {
            key: key.into(),
            value,
            message: message.into(),
            origin: None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(origin) = &self.origin {
            write!(f, "{origin}: ")?;
        }
        match &self.value {
            Some(v) => write!(f, "{} = {}: {}", self.key, v, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {p}")?;
        }
        Ok(())
    }
}

/// Collects problems while reading raw values with their defaults.
pub(super) struct Check<'a> {
    pub(super) problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    pub(super) fn bad(&mut self, key: impl Into<String>, value: impl fmt::Display, expected: &str) {
        self.problems.push(Problem::new(
            key,
            Some(value.to_string()),
            format!("expected {expected}"),
        ));
    }

    pub(super) fn missing(&mut self, key: impl Into<String>, expected: &str) {
        self.problems.push(Problem::new(
            key,
            None,
            format!("missing: expected {expected}"),
        ));
    }

    pub(super) fn other(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(key, None, message));
    }

    /// An integer in `lo..=hi`, or `default` when absent.
    pub(super) fn int(&mut self, key: &str, v: Option<u64>, default: u64, lo: u64, hi: u64) -> u64 {
        match v {
            None => default,
            Some(v) if (lo..=hi).contains(&v) => v,
            Some(v) => {
                self.bad(key, v, &format!("a whole number from {lo} to {hi}"));
                default
            }
        }
    }

    /// Seconds (fractions allowed) in `lo..=hi` as a duration.
    pub(super) fn secs(
        &mut self,
        key: &str,
        v: Option<f64>,
        default: f64,
        lo: f64,
        hi: f64,
    ) -> Duration {
        match v {
            None => Duration::from_secs_f64(default),
            Some(v) if v.is_finite() && v >= lo && v <= hi => Duration::from_secs_f64(v),
            Some(v) => {
                self.bad(key, v, &format!("seconds from {lo} to {hi}"));
                Duration::from_secs_f64(default)
            }
        }
    }

    /// One of `choices` (by name), or the one named `default` when absent or refused.
    /// A default that names no choice is reported like a bad value, so that a slip in
    /// [`DEFAULTS`](super::DEFAULTS) shows on the first run instead of silently meaning something else.
    pub(super) fn choice<T: Copy>(
        &mut self,
        key: &str,
        v: Option<&str>,
        default: &str,
        choices: &[(&str, T)],
    ) -> T {
        let find = |name: &str| choices.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        let name = v.unwrap_or(default);
        if let Some(t) = find(name) {
            return t;
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        self.bad(
            key,
            format!("{name:?}"),
            &format!("one of {}", names.join(" | ")),
        );
        find(default).unwrap_or(choices[0].1)
    }

    /// A non-empty string without control characters.
    pub(super) fn text(&mut self, key: &str, v: Option<String>, what: &str) -> Option<String> {
        match v {
            None => {
                self.missing(key, what);
                None
            }
            Some(s) if s.trim().is_empty() || s.chars().any(char::is_control) => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    &format!("{what}, non-empty, without control characters"),
                );
                None
            }
            Some(s) => Some(s),
        }
    }

    pub(super) fn url(&mut self, key: &str, v: Option<String>) -> Option<Url> {
        let s = self.text(key, v, "an http(s) URL")?;
        match Url::parse(&s) {
            // Credentials in a URL end up in logs, `check` and proxies' records; the value
            // shown has them taken out.
            Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
                let _ = u.set_username("");
                let _ = u.set_password(None);
                self.bad(
                    key,
                    format!("{:?} (its user name and password not shown)", u.as_str()),
                    "a URL without credentials in it: they go in username and password",
                );
                None
            }
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
            _ => {
                self.bad(
                    key,
                    format!("{s:?}"),
                    "an http(s) URL such as https://api.example.com/",
                );
                None
            }
        }
    }
}
