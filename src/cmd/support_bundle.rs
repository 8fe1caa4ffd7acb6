/*!
`tapegate support-bundle [--output FILE]`: one `.tar.gz` an installer can mail, with
what support asks for first, and no secret in it:

| file | holds |
|---|---|
| `README.txt` | when and where it was made, the versions, whether the daemon runs the config on disk (config hashes), what could not be gathered and why |
| `status.json` | `tapegate status --json` (with the daemon's inventory) |
| `config/effective.toml` | the effective configuration, every default filled in, every secret `<redacted>` |
| `config/file.toml` | the config file as parsed, its drop-ins (the `.toml` files of `config.d/`) merged over it (comments dropped), secret values `<redacted>` |
| `config/files.txt` | the files read for it, in the order merged |
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

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::archive::write_tar_gz;
use super::status::{InventoryStatus, StatusJson};
use super::CmdError;
use crate::clock::{rfc3339, Clock};
use crate::config::{self, effective, Config, Password, DEFAULTS};
use crate::inventory::Inventory;
use crate::outbox::StateReader;
use journal::journal;
use secrets::{environment, redact, Secrets};

mod journal;
mod secrets;

/// Writes the bundle (to `output`, or `tapegate-support-<id>-<time>.tar.gz` here) and
/// says where and what on `out`. Works with a refused config and without a database:
/// what cannot be gathered is said in `README.txt`.
pub fn run(
    config_path: &Path,
    clock: &dyn Clock,
    output: Option<&Path>,
    out: &mut dyn Write,
) -> Result<PathBuf, CmdError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let now = clock.wall_ms();
    let mut b = Bundle::default();
    let (table, read) = match config::merged_table(config_path) {
        Ok((table, files)) => (Some(table), files),
        Err(_) => (None, Vec::new()),
    };
    if !read.is_empty() {
        let list: String = read.iter().map(|f| format!("{}\n", f.display())).collect();
        b.files.push(("config/files.txt".into(), list.into_bytes()));
    }
    let secrets = Secrets::find(config_path, table.as_ref(), &env);
    let config = b.config(config_path, table.as_ref(), &env);
    let file_hash = config
        .as_ref()
        .filter(|c| c.service.is_some() || !has_service(table.as_ref()))
        .map(effective::hash);
    let gateway_id = config
        .as_ref()
        .map(|c| c.gateway.id.clone())
        .unwrap_or_else(|| "unknown".into());
    let state_dir = state_dir(config.as_ref(), table.as_ref());
    let daemon = b.state(&state_dir, config.as_ref(), now)?;
    b.journal();
    b.versions(config.as_ref(), daemon.as_ref(), now);
    let running_hash = daemon.as_ref().map(|i| i.config_hash.clone());
    let about = About {
        gateway_id: &gateway_id,
        now,
        config_path,
        state_dir: &state_dir,
        hashes: hashes(file_hash.as_deref(), running_hash.as_deref()),
    };
    b.readme(&about);
    secrets.scrub(&mut b.files);
    let (files, notes) = (b.files, b.notes);
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

/// The files of the bundle, in order, and what could not be gathered.
#[derive(Default)]
struct Bundle {
    files: Vec<(String, Vec<u8>)>,
    notes: Vec<String>,
}

impl Bundle {
    /// The config: with the secrets read where they can be (so that [service] is
    /// validated and in the effective config), without otherwise; the file parsed and
    /// the environment, secrets redacted.
    fn config(
        &mut self,
        config_path: &Path,
        table: Option<&toml::Table>,
        env: &[(String, String)],
    ) -> Option<Config> {
        let notes = &mut self.notes;
        let loaded =
            config::load_with(config_path, env.to_vec(), Password::Read).or_else(|_| {
                let c = config::load_with(config_path, env.to_vec(), Password::Skip);
                if c.is_ok() {
                    notes.push("the service password could not be read (run as root for [service] in config/effective.toml and its hash)".into());
                }
                c
            });
        let config = match loaded {
            Ok(c) => Some(c),
            Err(e) => {
                self.notes
                    .push("the config is refused: see config/problems.txt".into());
                self.files
                    .push(("config/problems.txt".into(), format!("{e}\n").into_bytes()));
                None
            }
        };
        if let Some(c) = &config {
            self.files.push((
                "config/effective.toml".into(),
                effective::toml_text(c).into_bytes(),
            ));
        }
        if let Some(t) = table {
            let mut t = toml::Value::Table(t.clone());
            redact(&mut t, "");
            self.files.push((
                "config/file.toml".into(),
                toml::to_string_pretty(&t).unwrap_or_default().into_bytes(),
            ));
        } else {
            self.notes.push(format!(
                "{} cannot be read or parsed: no config/file.toml",
                config_path.display()
            ));
        }
        self.files.push((
            "config/environment.txt".into(),
            environment(env).into_bytes(),
        ));
        config
    }

    /// What the state database knows: status, the scanner's counts, dead letters, the
    /// clock; the daemon's inventory, returned.
    fn state(
        &mut self,
        state_dir: &Path,
        config: Option<&Config>,
        now: i64,
    ) -> Result<Option<Inventory>, CmdError> {
        let mut daemon = None;
        match StateReader::open(state_dir) {
            Ok(Some(store)) => {
                let stats = store.stats()?;
                let inventory = store.inventory()?;
                daemon = inventory.clone();
                if let Some(c) = config {
                    let mut s = StatusJson::new(c, Some(&stats), now);
                    s.inventory = inventory.map(|i| InventoryStatus::new(i, now));
                    self.files.push(("status.json".into(), pretty(&s)));
                } else {
                    self.files.push(("status.json".into(), pretty(&stats)));
                }
                self.files.push((
                    "scanner.json".into(),
                    pretty(&json!({
                        "counts": stats.scanner,
                        "last_trouble": stats.scanner_last_trouble,
                        "last_trouble_at": stats.scanner_last_trouble_at.map(rfc3339),
                        "source": config.map(|c| c.scanner.source.name()),
                    })),
                ));
                let summary = store.dead_letter_summary(20)?;
                let newest = store.dead_letters(20)?;
                self.files.push((
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
                self.files.push((
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
            Ok(None) => self.notes.push(format!(
                "no state database in {} (the daemon has not run there)",
                state_dir.display()
            )),
            Err(e) => self
                .notes
                .push(format!("the state database cannot be read: {e}")),
        }
        Ok(daemon)
    }

    fn journal(&mut self) {
        match journal() {
            Ok(records) => self.files.push(("journal.json".into(), records)),
            Err(why) => {
                self.notes.push(format!("no journal records: {why}"));
                self.files
                    .push(("journal.txt".into(), format!("{why}\n").into_bytes()));
            }
        }
    }

    /// This command's version, the daemon's inventory and this machine's.
    fn versions(&mut self, config: Option<&Config>, daemon: Option<&Inventory>, now: i64) {
        let machine = config.map(|c| crate::inventory::Inventory::gather(c, now));
        self.files.push((
            "versions.json".into(),
            pretty(&json!({
                "this_command": {
                    "version": env!("CARGO_PKG_VERSION"),
                    "commit": crate::inventory::COMMIT,
                },
                "daemon": daemon,
                "machine": machine.as_ref().map(|m| json!({
                    "kernel": m.kernel, "os": m.os, "arch": m.arch, "bluez": m.bluez,
                    "adapter": m.adapter, "boot_id": m.boot_id,
                })),
            })),
        ));
    }

    /// `README.txt`, first: what the bundle is, what could not be gathered, the files.
    fn readme(&mut self, about: &About) {
        let About {
            gateway_id,
            now,
            config_path,
            state_dir,
            hashes,
        } = about;
        let mut readme = format!(
            "tapegate support bundle\n\
             gateway       {gateway_id}\n\
             made at       {}\n\
             by            tapegate {} ({})\n\
             config        {}\n\
             state dir     {}\n\
             {hashes}\n\n\
             Secrets (passwords, tokens) are not in this bundle: their values are <redacted>.\n",
            rfc3339(*now),
            env!("CARGO_PKG_VERSION"),
            crate::inventory::COMMIT,
            config_path.display(),
            state_dir.display(),
        );
        if !self.notes.is_empty() {
            readme.push_str("\nNot gathered:\n");
            for n in &self.notes {
                readme.push_str(&format!("- {n}\n"));
            }
        }
        readme.push_str("\nFiles:\n");
        for (name, contents) in &self.files {
            readme.push_str(&format!("  {name} ({} bytes)\n", contents.len()));
        }
        self.files
            .insert(0, ("README.txt".into(), readme.into_bytes()));
    }
}

/// What `README.txt` says of the bundle.
struct About<'a> {
    gateway_id: &'a str,
    now: i64,
    config_path: &'a Path,
    state_dir: &'a Path,
    hashes: String,
}

/// Whether the daemon runs the config on disk, by the two hashes.
fn hashes(file_hash: Option<&str>, running_hash: Option<&str>) -> String {
    match (file_hash, running_hash) {
        (Some(f), Some(r)) if f == r => format!("config hash {f}: the daemon runs the config on disk"),
        (Some(f), Some(r)) => format!(
            "config hash on disk {f}, the daemon recorded {r}: the file changed since it started (reload or restart to apply)"
        ),
        (Some(f), None) => format!("config hash on disk {f}; no daemon inventory recorded"),
        (None, Some(r)) => format!("the daemon recorded config hash {r}"),
        (None, None) => "no config hash".into(),
    }
}

/// The state directory the config names (or the file, when the config is refused).
fn state_dir(config: Option<&Config>, table: Option<&toml::Table>) -> PathBuf {
    config
        .map(|c| c.gateway.state_dir.clone())
        .or_else(|| {
            let t = table?;
            t.get("gateway")?
                .get("state_dir")?
                .as_str()
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULTS.gateway.state_dir))
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

#[cfg(test)]
mod tests;
