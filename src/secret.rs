//! Secrets (password, token) behind a newtype that never prints its value, and the
//! helpers that keep them out of text from elsewhere: [`scrub`] for what a server
//! answered, [`is_secret_key`] for what a config file or the environment holds.

use std::fmt;

/// A secret string. `Debug` and `Display` print `<redacted>`; the value is reachable
/// only through [`Secret::expose`], so it cannot slip into a log line or an error.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `text` with every occurrence of each non-empty secret replaced by `<redacted>`.
/// Longer secrets go first, so that one holding another is not left half shown.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut secrets: Vec<&str> = secrets.iter().copied().filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for s in secrets {
        out = out.replace(s, "<redacted>");
    }
    out
}

/// Whether a config key holds a secret whose value must never be echoed (and never be
/// reinterpreted: an override of it is taken as the exact string).
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|s| key.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_every_secret_longest_first() {
        assert_eq!(
            scrub("pw hunter2 tok abc hunter2", &["hunter2", "abc", ""]),
            "pw <redacted> tok <redacted> <redacted>"
        );
        assert_eq!(scrub("t=abcdef", &["abc", "abcdef"]), "t=<redacted>");
    }

    #[test]
    fn secret_keys_are_recognised_by_name() {
        for k in [
            "password",
            "PASSWORD",
            "password_file",
            "client_secret",
            "token",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["username", "base_url", "customer_id"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }

    #[test]
    fn secret_never_formats_its_value() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?} {s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }
}
