/*!
`tapegate support-bundle [--output FILE]`: one `.tar.gz` an installer can mail, with
what support asks for first, and no secret in it:

| file | holds |
|---|---|
| `README.txt` | when and where it was made, the versions, whether the daemon runs the config on disk (config hashes), what could not be gathered and why |
| `status.json` | `tapegate status --json` (with the daemon's inventory) |
| `config/effective.toml` | the effective configuration, every default filled in, every secret `<redacted>` |
| `config/file.toml` | the config file as parsed (comments dropped), secret values `<redacted>` |
| `config/environment.txt` | the `TAPEGATE_*` overrides this command saw, secret values `<redacted>` |
| `config/problems.txt` | why the config is refused, when it is |
| `journal.json` | the unit's journal records of the last 24 h at WARN and above (`journalctl -u tapegate -p warning --since -24h -o json`); `journal.txt` says why when there are none to read |
| `scanner.json` | the BLE scanner's counts and last trouble |
| `versions.json` | this command's version and commit, the running daemon's inventory, this machine's kernel, OS and BlueZ |
| `dead-letters.json` | stored dead letters in summary: by error, by tape, the newest few |
| `clock.json` | the clock's state, held/repaired/estimated counts, and the last boots with when each one's clock synced (its held captures repaired then) |

Secrets are kept out twice. Nothing secret is put in: the effective config and the
parsed file have every secret key's value replaced. And everything is scrubbed before
it is written: every secret this command can find (the values of secret keys in the
file and the environment, the files their `*_file` keys name) is removed from every
file of the bundle in each form it could take in text (as is, JSON-escaped,
percent-encoded, base64, and base64 of `user:secret` as in a basic-auth header), so
that a secret that ever reached a log or the state database does not leave the box.
*/

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use super::archive::write_tar_gz;
use super::state::{InventoryStatus, StatusJson};
use super::CmdError;
use crate::clock::{now_ms, rfc3339};
use crate::config::{self, effective, Password, DEFAULTS};
use crate::outbox::Store;
use crate::secret::{is_secret_key, scrub};

/// The journal read at most (bytes); the newest records are what matters.
const MAX_JOURNAL_BYTES: usize = 16 * 1024 * 1024;
/// The systemd unit whose journal is read.
const UNIT: &str = "tapegate";

/// Writes the bundle (to `output`, or `tapegate-support-<id>-<time>.tar.gz` here) and
/// says where and what on `out`. Works with a refused config and without a database:
/// what cannot be gathered is said in `README.txt`.
pub fn run(
    config_path: &Path,
    output: Option<&Path>,
    out: &mut dyn Write,
) -> Result<PathBuf, CmdError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let now = now_ms();
    let mut notes: Vec<String> = Vec::new();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();

    let table: Option<toml::Table> = std::fs::read_to_string(config_path)
        .ok()
        .and_then(|t| t.parse().ok());
    let found = collect_secrets(config_path, table.as_ref(), &env);
    let secrets = Secrets {
        raw: found.iter().map(|(s, _)| s.clone()).collect(),
        forms: secret_forms(&found),
    };

    // The config: with the secrets read where they can be (so that [service] is
    // validated and in the effective config), without otherwise.
    let loaded = config::load_with(config_path, env.clone(), Password::Read).or_else(|_| {
        let c = config::load_with(config_path, env.clone(), Password::Skip);
        if c.is_ok() {
            notes.push("the service password could not be read (run as root for [service] in config/effective.toml and its hash)".into());
        }
        c
    });
    let config = match loaded {
        Ok(c) => Some(c),
        Err(e) => {
            notes.push("the config is refused: see config/problems.txt".into());
            files.push(("config/problems.txt".into(), format!("{e}\n").into_bytes()));
            None
        }
    };
    let file_hash = config
        .as_ref()
        .filter(|c| c.service.is_some() || !has_service(table.as_ref()))
        .map(effective::hash);
    if let Some(c) = &config {
        files.push((
            "config/effective.toml".into(),
            effective::toml_text(c).into_bytes(),
        ));
    }
    if let Some(t) = &table {
        let mut t = toml::Value::Table(t.clone());
        redact(&mut t, "");
        files.push((
            "config/file.toml".into(),
            toml::to_string_pretty(&t).unwrap_or_default().into_bytes(),
        ));
    } else {
        notes.push(format!(
            "{} cannot be read or parsed: no config/file.toml",
            config_path.display()
        ));
    }
    files.push((
        "config/environment.txt".into(),
        environment(&env).into_bytes(),
    ));

    let gateway_id = config
        .as_ref()
        .map(|c| c.gateway.id.clone())
        .unwrap_or_else(|| "unknown".into());
    let state_dir = config
        .as_ref()
        .map(|c| c.gateway.state_dir.clone())
        .or_else(|| {
            let t = table.as_ref()?;
            t.get("gateway")?
                .get("state_dir")?
                .as_str()
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULTS.gateway.state_dir));

    let mut daemon_inventory = None;
    match Store::open_existing(&state_dir) {
        Ok(Some(store)) => {
            let stats = store.stats()?;
            let inventory = store.inventory()?;
            daemon_inventory = inventory.clone();
            if let Some(c) = &config {
                let mut s = StatusJson::new(c, Some(&stats), now);
                s.inventory = inventory.map(|i| InventoryStatus::new(i, now));
                files.push(("status.json".into(), pretty(&s)));
            } else {
                files.push(("status.json".into(), pretty(&stats)));
            }
            files.push((
                "scanner.json".into(),
                pretty(&json!({
                    "counts": stats.scanner,
                    "last_trouble": stats.scanner_last_trouble,
                    "last_trouble_at": stats.scanner_last_trouble_at.map(rfc3339),
                    "source": config.as_ref().map(|c| c.scanner.source.name()),
                })),
            ));
            let summary = store.dead_letter_summary(20)?;
            let newest = store.dead_letters(20)?;
            files.push((
                "dead-letters.json".into(),
                pretty(&json!({
                    "stored": summary.stored,
                    "total": summary.total,
                    "oldest_dead_at": summary.oldest_dead_at.map(rfc3339),
                    "newest_dead_at": summary.newest_dead_at.map(rfc3339),
                    "by_error": summary.by_error,
                    "by_mac": summary.by_mac,
                    "newest": newest,
                })),
            ));
            let boots: Vec<Value> = store
                .boots(20)?
                .into_iter()
                .map(|b| json!({"boot_id": b.boot_id, "synced_at": b.synced_at.map(rfc3339)}))
                .collect();
            files.push((
                "clock.json".into(),
                pretty(&json!({
                    "state": stats.clock.state,
                    "held": stats.clock.held,
                    "repaired": stats.clock.repaired,
                    "estimated": stats.clock.estimated,
                    "boots": boots,
                })),
            ));
        }
        Ok(None) => notes.push(format!(
            "no state database in {} (the daemon has not run there)",
            state_dir.display()
        )),
        Err(e) => notes.push(format!("the state database cannot be read: {e}")),
    }

    match journal() {
        Ok(records) => files.push(("journal.json".into(), records)),
        Err(why) => {
            notes.push(format!("no journal records: {why}"));
            files.push(("journal.txt".into(), format!("{why}\n").into_bytes()));
        }
    }

    let machine = config
        .as_ref()
        .map(|c| crate::inventory::Inventory::gather(c, now));
    files.push((
        "versions.json".into(),
        pretty(&json!({
            "this_command": {
                "version": env!("CARGO_PKG_VERSION"),
                "commit": crate::inventory::COMMIT,
            },
            "daemon": daemon_inventory,
            "machine": machine.as_ref().map(|m| json!({
                "kernel": m.kernel, "os": m.os, "arch": m.arch, "bluez": m.bluez,
                "adapter": m.adapter, "boot_id": m.boot_id,
            })),
        })),
    ));

    let running_hash = daemon_inventory.as_ref().map(|i| i.config_hash.clone());
    let hashes = match (&file_hash, &running_hash) {
        (Some(f), Some(r)) if f == r => format!("config hash {f}: the daemon runs the config on disk"),
        (Some(f), Some(r)) => format!(
            "config hash on disk {f}, the daemon recorded {r}: the file changed since it started (reload or restart to apply)"
        ),
        (Some(f), None) => format!("config hash on disk {f}; no daemon inventory recorded"),
        (None, Some(r)) => format!("the daemon recorded config hash {r}"),
        (None, None) => "no config hash".into(),
    };
    let mut readme = format!(
        "tapegate support bundle\n\
         gateway       {gateway_id}\n\
         made at       {}\n\
         by            tapegate {} ({})\n\
         config        {}\n\
         state dir     {}\n\
         {hashes}\n\n\
         Secrets (passwords, tokens) are not in this bundle: their values are <redacted>.\n",
        rfc3339(now),
        env!("CARGO_PKG_VERSION"),
        crate::inventory::COMMIT,
        config_path.display(),
        state_dir.display(),
    );
    if !notes.is_empty() {
        readme.push_str("\nNot gathered:\n");
        for n in &notes {
            readme.push_str(&format!("- {n}\n"));
        }
    }
    readme.push_str("\nFiles:\n");
    for (name, contents) in &files {
        readme.push_str(&format!("  {name} ({} bytes)\n", contents.len()));
    }
    files.insert(0, ("README.txt".into(), readme.into_bytes()));

    // The last line of defence: no file leaves with a secret in any form. The shared
    // scrubber finds each secret in every encoding (JSON, form, percent, HTML); then
    // every form computed here goes as a plain substring, however short or wherever it
    // sits, since a bundle is better garbled than leaking.
    let raw: Vec<&str> = secrets.raw.iter().map(String::as_str).collect();
    let mut forms: Vec<&str> = secrets.forms.iter().map(String::as_str).collect();
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    for (_, contents) in &mut files {
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

    let stamp = rfc3339(now).replace([':', '-'], "");
    let dir_name = format!("tapegate-support-{}-{stamp}", safe_name(&gateway_id));
    let path = output
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("{dir_name}.tar.gz")));
    let file = std::fs::File::create(&path)?;
    write_tar_gz(
        std::io::BufWriter::new(file),
        &dir_name,
        &files,
        (now / 1000).max(0) as u64,
    )?;
    writeln!(out, "wrote {} ({} files)", path.display(), files.len())?;
    for n in &notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(path)
}

/// The secrets found, and every form of them to take out of text.
struct Secrets {
    raw: Vec<String>,
    forms: Vec<String>,
}

fn pretty(v: &impl serde::Serialize) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

/// Whether the file has a `[service]` section (then a hash without it is not the
/// daemon's).
fn has_service(table: Option<&toml::Table>) -> bool {
    table.is_some_and(|t| t.contains_key("service"))
}

/// Letters, digits, `-`, `_` and `.` of a gateway id (it is one already when valid).
fn safe_name(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Replaces the value of every secret key (and of everything under one) with
/// `<redacted>`.
fn redact(v: &mut toml::Value, key: &str) {
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
fn environment(env: &[(String, String)]) -> String {
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
            s.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect(),
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

/// The unit's WARN-and-above journal records of the last 24 h, as JSON lines; or why
/// there are none.
fn journal() -> Result<Vec<u8>, String> {
    let mut child = Command::new("journalctl")
        .args([
            "-u",
            UNIT,
            "-p",
            "warning",
            "--since",
            "-24h",
            "-o",
            "json",
            "--no-pager",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("journalctl cannot be run ({e}): not a systemd machine?"))?;
    let mut records = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout
            .take(MAX_JOURNAL_BYTES as u64)
            .read_to_end(&mut records);
    }
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() && records.is_empty() {
        return Err(format!(
            "journalctl -u {UNIT} failed ({status}): {}",
            crate::text::shown(err.trim(), 500)
        ));
    }
    if records.iter().all(u8::is_ascii_whitespace) {
        return Err(format!(
            "journalctl -u {UNIT} -p warning --since -24h found no records{}",
            if err.trim().is_empty() {
                String::new()
            } else {
                format!(" ({})", crate::text::shown(err.trim(), 500))
            }
        ));
    }
    Ok(records)
}

/// For tests: the forms a secret is scrubbed in.
#[doc(hidden)]
pub fn forms_of(secret: &str, username: &str) -> Vec<String> {
    secret_forms(&[(secret.to_string(), vec![username.to_string()])])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_secret_is_scrubbed() {
        let forms = forms_of("p@ss w\"rd/1", "gw");
        for f in [
            "p@ss w\"rd/1",
            "p@ss w\\\"rd/1",
            "p%40ss+w%22rd%2F1",
            "p%40ss%20w%22rd%2F1",
        ] {
            assert!(forms.iter().any(|x| x == f), "{f} not in {forms:?}");
        }
        assert!(
            forms.iter().any(|x| x == "Z3c6cEBzcyB3InJkLzE="),
            "basic auth of gw"
        );
    }

    #[test]
    fn secret_keys_of_the_file_are_redacted_at_any_depth() {
        let mut v: toml::Value = toml::from_str(
            "[service.environments.ppe]\npassword = \"x1\"\nusername = \"u\"\n[telemetry]\nbearer_token_file = \"t\"\n",
        )
        .unwrap();
        redact(&mut v, "");
        let text = toml::to_string(&v).unwrap();
        assert!(!text.contains("x1") && !text.contains("\"t\""), "{text}");
        assert!(text.contains("username = \"u\""), "{text}");
    }
}
