//! What the bundle must not carry: every secret the config file and the environment
//! hold or point to, in every form it could take in text, scrubbed from every file; and
//! the config file and environment written with secret values redacted. Touches the
//! config file, the files its `*_file` keys name and the shared scrubber.

use std::path::{Path, PathBuf};

use crate::config::effective;
use crate::util::secret::{is_secret_key, scrub};

/// The secrets found, and every form of them to take out of text.
pub(super) struct Secrets {
    raw: Vec<String>,
    forms: Vec<String>,
}

impl Secrets {
    /// The secrets of the config file (`table`, as read from `config_path`) and `env`.
    pub(super) fn find(
        config_path: &Path,
        table: Option<&toml::Table>,
        env: &[(String, String)],
    ) -> Secrets {
        let found = collect_secrets(config_path, table, env);
        Secrets {
            raw: found.iter().map(|(s, _)| s.clone()).collect(),
            forms: secret_forms(&found),
        }
    }

    /// The last line of defence: no file leaves with a secret in any form. The shared
    /// scrubber finds each secret in every encoding (JSON, form, percent, HTML); then
    /// every form computed here goes as a plain substring, however short or wherever it
    /// sits, since a bundle is better garbled than leaking.
    pub(super) fn scrub(&self, files: &mut [(String, Vec<u8>)]) {
        let raw: Vec<&str> = self.raw.iter().map(String::as_str).collect();
        let mut forms: Vec<&str> = self.forms.iter().map(String::as_str).collect();
        forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
        for (_, contents) in files.iter_mut() {
            let text = String::from_utf8_lossy(contents);
            let mut clean = scrub(&text, &raw);
            for f in &forms {
                if clean.contains(f) {
                    clean = clean.replace(f, effective::REDACTED);
                }
            }
            if clean != text {
                *contents = clean.into_bytes();
            }
        }
    }
}

/// Replaces the value of every secret key (and of everything under one) with
/// `<redacted>`.
pub(super) fn redact(v: &mut toml::Value, key: &str) {
    if is_secret_key(key) {
        *v = toml::Value::String(effective::REDACTED.into());
        return;
    }
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                redact(v, k);
            }
        }
        toml::Value::Array(a) => {
            for v in a {
                redact(v, key);
            }
        }
        _ => {}
    }
}

/// The `TAPEGATE_*` variables, secret values redacted.
pub(super) fn environment(env: &[(String, String)]) -> String {
    let mut lines: Vec<String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TAPEGATE_"))
        .map(|(k, v)| {
            let last = k.rsplit("__").next().unwrap_or(k);
            if is_secret_key(last) || is_secret_key(k) {
                format!("{k}={}", effective::REDACTED)
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    lines.sort();
    if lines.is_empty() {
        return "(no TAPEGATE_* variables in this command's environment; the unit's own, if any, are in `systemctl show tapegate -p Environment`)\n".into();
    }
    lines.join("\n") + "\n"
}

/// Every secret value the config file and the environment hold or point to: values of
/// secret keys, and the contents of the files their `*_file` keys name (looked up as
/// the daemon would: absolute, in `$CREDENTIALS_DIRECTORY`, or beside the config).
fn collect_secrets(
    config_path: &Path,
    table: Option<&toml::Table>,
    env: &[(String, String)],
) -> Vec<(String, Vec<String>)> {
    let mut secrets = Vec::new();
    let mut usernames = Vec::new();
    fn walk(
        v: &toml::Value,
        key: &str,
        config_path: &Path,
        secrets: &mut Vec<String>,
        usernames: &mut Vec<String>,
    ) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    walk(v, k, config_path, secrets, usernames);
                }
            }
            toml::Value::Array(a) => {
                for v in a {
                    walk(v, key, config_path, secrets, usernames);
                }
            }
            toml::Value::String(s) if key == "username" => usernames.push(s.clone()),
            other if is_secret_key(key) => {
                let s = match other {
                    toml::Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                if key.ends_with("_file") {
                    secrets.extend(read_secret_file(Path::new(&s), config_path));
                } else {
                    secrets.push(s);
                }
            }
            _ => {}
        }
    }
    if let Some(t) = table {
        for (k, v) in t {
            walk(v, k, config_path, &mut secrets, &mut usernames);
        }
    }
    for (k, v) in env {
        if !k.starts_with("TAPEGATE_") {
            continue;
        }
        let last = k.rsplit("__").next().unwrap_or(k).to_ascii_lowercase();
        if last == "username" {
            usernames.push(v.clone());
        } else if is_secret_key(&last) {
            if last.ends_with("_file") {
                secrets.extend(read_secret_file(Path::new(v), config_path));
            } else {
                secrets.push(v.clone());
            }
        }
    }
    secrets
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| (s, usernames.clone()))
        .collect()
}

/// The secret a file holds (one trailing newline dropped), wherever the daemon or a
/// command would find it; every candidate that can be read.
fn read_secret_file(file: &Path, config_path: &Path) -> Vec<String> {
    let mut candidates = vec![file.to_path_buf()];
    if file.is_relative() {
        if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
            candidates.push(PathBuf::from(dir).join(file));
        }
        if let Some(dir) = config_path.parent() {
            candidates.push(dir.join(file));
        }
    }
    candidates
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| {
            let t = t.strip_suffix('\n').unwrap_or(&t);
            t.strip_suffix('\r').unwrap_or(t).to_string()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// Each secret in every form it could take in text.
fn secret_forms(secrets: &[(String, Vec<String>)]) -> Vec<String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut forms = Vec::new();
    for (s, usernames) in secrets {
        forms.push(s.clone());
        let json = serde_json::to_string(s).unwrap_or_default();
        forms.push(json[1..json.len().saturating_sub(1)].to_string());
        forms.push(url::form_urlencoded::byte_serialize(s.as_bytes()).collect());
        forms.push(
            percent_encoding::utf8_percent_encode(s, crate::util::text::UNRESERVED).to_string(),
        );
        forms.push(b64.encode(s));
        for u in usernames {
            forms.push(b64.encode(format!("{u}:{s}")));
        }
    }
    forms.retain(|f| !f.is_empty());
    forms.sort();
    forms.dedup();
    forms
}

/// For tests: the forms a secret is scrubbed in.
#[cfg(test)]
pub(super) fn forms_of(secret: &str, username: &str) -> Vec<String> {
    secret_forms(&[(secret.to_string(), vec![username.to_string()])])
}
