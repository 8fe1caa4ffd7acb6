/*!
The config file and its drop-ins: the `*.toml` files of `config.d/` beside it, read in
name order (`10-fleet.toml` before `20-site.toml`) and merged over it key by key, as a
fleet's tools write them (Ansible a file per role, a site's file last). A table merges
with the table of the same name; any other value (a number, a string, a list, the
`[[products]]` list as a whole) replaces what came before. The environment's
`TAPEGATE_<SECTION>__<KEY>` overrides come after every file.

Where each key came from is kept, so that a problem names the file (or the variable)
that set the key, not only the key. It reads the files and the directory, nothing else.
*/

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::problem::{ConfigError, Problem};

/// The directory of drop-ins for the config file at `path`: `config.d/` beside it.
pub fn drop_in_dir(path: &Path) -> PathBuf {
    path.parent()
        .map_or_else(|| PathBuf::from("config.d"), |dir| dir.join("config.d"))
}

/// The config file's table with its drop-ins merged in, and where each key came from.
#[derive(Debug, Default)]
pub(super) struct Layers {
    pub table: toml::Table,
    /// The main file, then each drop-in, in the order merged.
    pub files: Vec<PathBuf>,
    /// A dotted key (`flush.max_batch`, `products.0.id`) and what set it last.
    origins: BTreeMap<String, String>,
}

impl Layers {
    /// One file, parsed from `text` (no drop-ins).
    pub fn of_text(text: &str, path: &Path) -> Result<Layers, ConfigError> {
        let mut layers = Layers::default();
        layers.add(text, path)?;
        Ok(layers)
    }

    /// The file at `path` and the drop-ins beside it.
    pub fn read(path: &Path) -> Result<Layers, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut layers = Layers::of_text(&read(path)?, path)?;
        for drop_in in drop_ins(&drop_in_dir(path))? {
            layers.add(&read(&drop_in)?, &drop_in)?;
        }
        Ok(layers)
    }

    /// Whether drop-ins were merged (problems then name their file).
    pub fn has_drop_ins(&self) -> bool {
        self.files.len() > 1
    }

    /// Notes that the environment variable `name` set `key` (dotted).
    pub fn set_by_environment(&mut self, key: &str, name: &str) {
        self.origins.insert(key.to_string(), name.to_string());
    }

    /// `problem`, naming where its key was set: the file (or variable) that set the key
    /// itself or, for a key missing from a table, the table.
    pub fn locate(&self, mut problem: Problem) -> Problem {
        let mut key = normal(&problem.key);
        problem.origin = loop {
            if let Some(origin) = self.origins.get(&key) {
                break Some(origin.clone());
            }
            match key.rfind('.') {
                Some(i) => key.truncate(i),
                None => break self.files.first().map(|f| f.display().to_string()),
            }
        };
        problem
    }

    fn add(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    path: path.to_path_buf(),
                    message: syntax_message(text, &e),
                })?;
        let origin = path.display().to_string();
        merge(&mut self.table, table, "", &origin, &mut self.origins);
        self.files.push(path.to_path_buf());
        Ok(())
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
        Some(k) if crate::util::secret::is_secret_key(k) => {
            format!("line {line_no}, column {column}, in the value of `{k}` (not shown: it is a secret)")
        }
        Some(k) => format!("line {line_no}, column {column}, key `{k}`: {what}"),
        None => format!("line {line_no}, column {column}: {what}"),
    }
}

/// The drop-ins in `dir`, in name order: regular `*.toml` files, not hidden (an editor's
/// or dpkg's leftovers, `x.toml~`, `x.toml.dpkg-old`, `.x.toml.swp`, are not read). A
/// missing directory has none.
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".toml") && !name.starts_with('.')
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Merges `from` into `into`: tables key by key, anything else replaced; each key set
/// is noted as `origin`'s.
fn merge(
    into: &mut toml::Table,
    from: toml::Table,
    prefix: &str,
    origin: &str,
    origins: &mut BTreeMap<String, String>,
) {
    for (key, value) in from {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new)) => {
                origins.insert(path.clone(), origin.to_string());
                merge(old, new, &path, origin, origins);
            }
            (_, value) => {
                // What was set under the key before is replaced with it.
                let inside = format!("{path}.");
                origins.retain(|k, _| !k.starts_with(&inside));
                note(&value, &path, origin, origins);
                into.insert(key, value);
            }
        }
    }
}

/// Notes `value` and everything in it as set by `origin`.
fn note(value: &toml::Value, path: &str, origin: &str, origins: &mut BTreeMap<String, String>) {
    origins.insert(path.to_string(), origin.to_string());
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                note(v, &format!("{path}.{k}"), origin, origins);
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                note(v, &format!("{path}.{i}"), origin, origins);
            }
        }
        _ => {}
    }
}

/// A problem's key in the dotted form of the origins: `products[1].id` is
/// `products.1.id`.
fn normal(key: &str) -> String {
    key.replace('[', ".").replace(']', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(files: &[(&str, &str)]) -> Layers {
        let mut l = Layers::default();
        for (name, text) in files {
            l.add(text, Path::new(name)).unwrap();
        }
        l
    }

    fn problem(key: &str) -> Problem {
        Problem {
            key: key.into(),
            value: None,
            message: "m".into(),
            origin: None,
        }
    }

    #[test]
    fn tables_merge_key_by_key_and_anything_else_is_replaced() {
        let l = layers(&[
            (
                "main.toml",
                "[flush]\nmax_batch = 100\nmax_delay_secs = 5\n[[products]]\nid = \"a\"\n[[products]]\nid = \"b\"\n",
            ),
            ("config.d/10.toml", "[flush]\nmax_batch = 50\n[[products]]\nid = \"c\"\n"),
        ]);
        let flush = l.table["flush"].as_table().unwrap();
        assert_eq!(flush["max_batch"].as_integer(), Some(50));
        assert_eq!(flush["max_delay_secs"].as_integer(), Some(5));
        let products = l.table["products"].as_array().unwrap();
        assert_eq!(products.len(), 1, "a list is replaced whole");
        assert_eq!(products[0]["id"].as_str(), Some("c"));
    }

    #[test]
    fn a_problem_names_the_file_that_set_its_key_or_its_table() {
        let mut l = layers(&[
            (
                "main.toml",
                "[flush]\nmax_batch = 100\nmax_delay_secs = 5\n[service.environments.ppe]\nusername = \"u\"\n[[products]]\nid = \"a\"\n",
            ),
            ("config.d/10.toml", "[flush]\nmax_batch = 900\n[[products]]\nid = \"c\"\n"),
            ("config.d/20.toml", "[service.environments.ppe]\nbase_url = \"x\"\n"),
        ]);
        let origin = |l: &Layers, key: &str| l.locate(problem(key)).origin.unwrap();
        assert_eq!(origin(&l, "flush.max_batch"), "config.d/10.toml");
        assert_eq!(origin(&l, "flush.max_delay_secs"), "main.toml");
        assert_eq!(origin(&l, "products[0].id"), "config.d/10.toml");
        assert_eq!(
            origin(&l, "service.environments.ppe.base_url"),
            "config.d/20.toml"
        );
        assert_eq!(origin(&l, "service.environments.ppe.username"), "main.toml");
        // A key missing from a table: the last file that wrote the table.
        assert_eq!(
            origin(&l, "service.environments.ppe.auth_url"),
            "config.d/20.toml"
        );
        assert_eq!(origin(&l, "http.listen"), "main.toml");
        l.set_by_environment("flush.max_batch", "TAPEGATE_FLUSH__MAX_BATCH");
        assert_eq!(origin(&l, "flush.max_batch"), "TAPEGATE_FLUSH__MAX_BATCH");
    }

    #[test]
    fn the_config_and_its_hash_are_the_merged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "[flush]\nmax_batch = 100\n").unwrap();
        let load = || crate::config::load_with(&path, [], crate::config::Password::Skip).unwrap();
        let alone = load();
        std::fs::create_dir(drop_in_dir(&path)).unwrap();
        std::fs::write(
            drop_in_dir(&path).join("10.toml"),
            "[flush]\nmax_batch = 50\n",
        )
        .unwrap();
        let merged = load();
        assert_eq!((alone.flush.max_batch, merged.flush.max_batch), (100, 50));
        assert_ne!(
            crate::config::effective::hash(&alone),
            crate::config::effective::hash(&merged)
        );
    }

    #[test]
    fn drop_ins_are_the_toml_files_of_the_directory_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        assert!(drop_ins(&dir.path().join("config.d")).unwrap().is_empty());
        for name in [
            "20-site.toml",
            "10-fleet.toml",
            "10-fleet.toml~",
            "30-x.toml.dpkg-old",
            ".10-fleet.toml.swp",
            ".hidden.toml",
            "README",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("40-dir.toml")).unwrap();
        let names: Vec<String> = drop_ins(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["10-fleet.toml", "20-site.toml"]);
    }
}
